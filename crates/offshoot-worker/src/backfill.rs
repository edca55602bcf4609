//! Fork backfill as apalis jobs.
//!
//! A job names a fork (and how many attempts in a row have failed); the fork row holds
//! everything else (status, cursor, counts). The handler copies pages until the fork is
//! finished, each page one transaction with its cursor that locks the fork row first, so a
//! duplicate job, a second worker or a crash at any point neither loses nor repeats a copy.
//! A page that fails ends the job and pushes a new one after an exponential back-off; after
//! the last attempt the fork becomes `failed` (`backfill_error`).

pub use crate::jobs::BackfillJob;
use crate::queue::{LiveState, BACKFILL_QUEUE};
use crate::Shared;
use apalis::prelude::{BoxDynError, Data};
use offshoot_store::BackfillStep;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How backfills run and are retried.
#[derive(Debug, Clone)]
pub struct BackfillPolicy {
    /// Messages copied per transaction, at most.
    pub page_size: i64,
    /// On SQLite, the longest a page should take while requests wait: a page holds the one
    /// write lock, and a request arriving meanwhile waits for it (docs/performance.md, "SQLite writer and backfill pages"). A
    /// page that a request waited for and that took longer makes the next one smaller (down
    /// to [`MIN_PAGE`]); pages grow back to `page_size` when they are fast again or nobody
    /// waited, so an idle server copies in full pages (docs/performance.md, "Worker (apalis)"). On
    /// PostgreSQL a page locks only its fork's rows, so pages stay at `page_size`.
    pub page_budget: Duration,
    /// Pause between pages (0 in production; tests use it to stop a worker mid-backfill).
    pub page_delay: Duration,
    /// Attempts before the fork is marked failed.
    pub max_attempts: u32,
    /// Back-off before attempt 2; doubled for each further attempt, up to `backoff_max`.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Forks copied at once by one worker process.
    pub concurrency: usize,
}

impl Default for BackfillPolicy {
    fn default() -> Self {
        BackfillPolicy {
            page_size: offshoot_core::fork::BACKFILL_PAGE,
            // A send at 100/s waits for at most one page: 50 ms pages made the sends' p99 during
            // four backfills 50–130 ms, 2–4 ms pages 27–31 ms, at three to four times the backfills'
            // time (docs/performance.md, "SQLite writer and backfill pages"). An idle server still copies full pages.
            page_budget: Duration::from_millis(4),
            page_delay: Duration::ZERO,
            max_attempts: 8,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            concurrency: 4,
        }
    }
}

/// The apalis handler of [`BACKFILL_QUEUE`].
pub async fn run_job(job: BackfillJob, shared: Data<Arc<Shared>>) -> Result<(), BoxDynError> {
    crate::on_own_task(run(job, Arc::clone(&shared))).await
}

async fn run(job: BackfillJob, shared: Arc<Shared>) -> Result<(), BoxDynError> {
    let policy = &shared.backfill;
    let cid = job.fork_cid.as_str();
    let mut size = first_page_size(shared.store.since_last_request_write(), policy);
    loop {
        if shared.shutdown.is_cancelled() {
            // Hand the rest to whichever worker runs next (this one after a restart).
            shared.pools.push_backfill(BackfillJob::new(cid), Duration::ZERO).await?;
            return Ok(());
        }
        let started = std::time::Instant::now();
        let waits_before = shared.store.request_write_waits();
        let step = shared.store.backfill_step(cid, size).await;
        let took = started.elapsed();
        // Only SQLite has a write lock to wait for (None on PostgreSQL: full pages).
        let held_up = match (waits_before, shared.store.request_write_waits()) {
            (Some(before), Some(after)) => Some(after > before),
            _ => None,
        };
        tracing::debug!(fork = cid, size, elapsed_ms = took.as_secs_f64() * 1000.0, ?held_up, "backfill page");
        if let Some(held_up) = held_up {
            size = next_page_size(size, took, held_up, policy);
        }
        match step {
            Ok(BackfillStep::More) => {}
            Ok(BackfillStep::Done) | Ok(BackfillStep::Gone) => return Ok(()),
            Err(e) => {
                let failures = job.failures + 1;
                if failures >= policy.max_attempts {
                    tracing::error!(fork = cid, attempts = failures, error = %e, "backfill failed for good; the fork is marked failed");
                    shared.store.fail_backfill(cid, offshoot_core::fork::FAILED_BACKFILL_ERROR).await?;
                    return Ok(());
                }
                let delay = offshoot_store::backoff(policy.backoff_base, policy.backoff_max, failures);
                tracing::warn!(fork = cid, attempt = failures, retry_in_s = delay.as_secs(), error = %e, "backfill page failed; retrying later");
                shared.pools.push_backfill(BackfillJob { fork_cid: cid.to_string(), failures }, delay).await?;
                return Ok(());
            }
        }
        if !policy.page_delay.is_zero() {
            tokio::select! {
                _ = shared.shutdown.cancelled() => {}
                _ = tokio::time::sleep(policy.page_delay) => {}
            }
        }
    }
}

/// The smallest page, whatever the time: below it a page is mostly its fixed cost.
pub const MIN_PAGE: i64 = 20;

/// Requests that took SQLite's write lock this recently make a backfill start small.
const RECENT_TRAFFIC: Duration = Duration::from_secs(1);

/// The size of a backfill's first page: a full page on an idle server (and on PostgreSQL), but
/// the smallest one while requests are writing, since a larger first page holds the write lock
/// before the sizing below learns that requests wait for it: first pages of an eighth (125
/// rows) took 40–90 ms each when four forks started at once, and the sends right after the
/// fork requests were the slowest of figure c (docs/performance.md, "SQLite writer and backfill
/// pages"). From
/// there pages grow while nobody waits.
fn first_page_size(since_last_request: Option<Duration>, policy: &BackfillPolicy) -> i64 {
    match since_last_request {
        Some(since) if since < RECENT_TRAFFIC => MIN_PAGE.min(policy.page_size.max(1)),
        _ => policy.page_size,
    }
}

/// The size of the next page on SQLite: when a request waited during the last one (`held_up`),
/// the last one scaled to the budget, else doubled; at most halved or doubled at once, within
/// [`MIN_PAGE`]..=`page_size` (so a page within its budget, or one nobody waited for, is never
/// made smaller).
///
/// `took` is the whole step, its wait for the write lock included: with several backfills at
/// once that wait is behind the others' pages, so while requests keep arriving pages stay near
/// [`MIN_PAGE`] (about 2.5 ms of the lock each). Sized by the page's own hold of the lock
/// instead, pages are of 100–500 rows, the four backfills of figure c three times faster, and
/// the sends' p99 during them twice as long (docs/performance.md, "SQLite writer and backfill
/// pages"): the sends' tail is the goal.
fn next_page_size(size: i64, took: Duration, held_up: bool, policy: &BackfillPolicy) -> i64 {
    let scale = match held_up {
        true => policy.page_budget.as_secs_f64() / took.as_secs_f64().max(1e-4),
        false => 2.0,
    };
    let next = (size as f64 * scale.clamp(0.5, 2.0)).round() as i64;
    next.clamp(MIN_PAGE.min(policy.page_size), policy.page_size.max(1))
}

/// What the reconciler remembers between rounds: when each backfilling fork's row last moved.
#[derive(Debug, Default)]
pub struct Watch {
    seen: HashMap<String, (i64, Instant)>,
}

/// What one reconciler round queued.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reconciled {
    /// Backfilling forks that had no job at all (a crash between a fork's commit and its
    /// push, a job lost by the queue).
    pub orphaned: usize,
    /// Backfilling forks whose job says it is waiting, fetched or running but whose row has
    /// not moved for `stall_after` (a job the queue holds but no worker runs).
    pub stalled: usize,
}

/// Queues a backfill for every backfilling fork that has no live job, and for every fork whose
/// live job has not moved its row for `stall_after`, whatever apalis's table says about the job.
/// A job scheduled for later (a back-off) is left to run when due. A second job for a fork
/// whose first job turns out to be alive is harmless: each page locks the fork row and
/// continues from its cursor, so the two take turns and nothing is copied twice.
pub async fn reconcile(shared: &Shared, watch: &mut Watch, stall_after: Duration) -> Result<Reconciled, BoxDynError> {
    let mut live: HashMap<String, Vec<LiveState>> = HashMap::new();
    for job in shared.pools.live_jobs::<BackfillJob>(BACKFILL_QUEUE).await? {
        live.entry(job.args.fork_cid).or_default().push(job.state);
    }
    let now = Instant::now();
    let forks = shared.store.backfilling_progress().await?;
    let current: HashSet<&str> = forks.iter().map(|(cid, _)| cid.as_str()).collect();
    watch.seen.retain(|cid, _| current.contains(cid.as_str()));
    let mut done = Reconciled::default();
    for (cid, updated_at) in forks {
        let seen = watch.seen.entry(cid.clone()).or_insert((updated_at, now));
        if seen.0 != updated_at {
            *seen = (updated_at, now);
        }
        let states = live.get(&cid).map(Vec::as_slice).unwrap_or_default();
        if states.is_empty() {
            shared.pools.push_backfill(BackfillJob::new(&cid), Duration::ZERO).await?;
            *seen = (updated_at, now);
            done.orphaned += 1;
        } else if states.contains(&LiveState::Scheduled) {
            // Waiting out a back-off on purpose.
            *seen = (updated_at, now);
        } else if now.duration_since(seen.1) >= stall_after {
            tracing::warn!(fork = %cid, jobs = ?states, still_for_s = now.duration_since(seen.1).as_secs(), "a backfill made no progress while its job is live; queueing another");
            shared.pools.push_backfill(BackfillJob::new(&cid), Duration::ZERO).await?;
            *seen = (updated_at, now);
            done.stalled += 1;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_shrink_when_slow_and_waited_for_grow_otherwise_and_stay_within_bounds() {
        let policy = BackfillPolicy { page_size: 1_000, page_budget: Duration::from_millis(25), ..Default::default() };
        let ms = Duration::from_millis;
        let waited = |size, took| next_page_size(size, ms(took), true, &policy);
        assert_eq!(waited(1_000, 20), 1_000, "within budget at full size: kept");
        assert_eq!(waited(400, 100), 200, "four times too slow: halved, not quartered");
        assert_eq!(waited(400, 50), 200);
        assert_eq!(waited(400, 20), 500);
        assert_eq!(waited(400, 1), 800, "at most doubled");
        assert_eq!(waited(800, 1), 1_000, "never above page_size");
        assert_eq!(waited(30, 500), MIN_PAGE, "never below the minimum");
        let tiny = BackfillPolicy { page_size: 5, ..policy.clone() };
        assert_eq!(next_page_size(5, ms(500), true, &tiny), 5, "a page_size below the minimum is kept");
        let alone = |size, took| next_page_size(size, ms(took), false, &policy);
        assert_eq!(alone(1_000, 500), 1_000, "slow but nobody waited: kept at full size");
        assert_eq!(alone(100, 500), 200, "nobody waited: grows back");
        assert_eq!(alone(800, 500), 1_000);
    }

    #[test]
    fn a_backfill_starts_small_only_while_requests_are_writing() {
        let policy = BackfillPolicy { page_size: 1_000, ..Default::default() };
        let ms = Duration::from_millis;
        assert_eq!(first_page_size(None, &policy), 1_000, "no request has written (or PostgreSQL): a full page");
        assert_eq!(first_page_size(Some(ms(5_000)), &policy), 1_000, "idle for a while: a full page");
        assert_eq!(first_page_size(Some(ms(10)), &policy), MIN_PAGE, "requests writing: the smallest page");
        assert_eq!(first_page_size(Some(ms(999)), &policy), MIN_PAGE);
        let tiny = BackfillPolicy { page_size: 5, ..policy };
        assert_eq!(first_page_size(Some(ms(10)), &tiny), 5, "a page_size below the minimum is kept");
    }
}
