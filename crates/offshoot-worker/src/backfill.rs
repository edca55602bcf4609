//! Fork backfill as apalis jobs.
//!
//! A job names a fork (and how many attempts in a row have failed); the fork row holds
//! everything else (status, cursor, counts). The handler copies pages until the fork is
//! finished, each page one transaction with its cursor that locks the fork row first, so a
//! duplicate job, a second worker or a crash at any point neither loses nor repeats a copy.
//! A page that fails ends the job and pushes a new one after an exponential back-off; after
//! the last attempt the fork becomes `failed` (`backfill_error`).

use crate::queue::BACKFILL_QUEUE;
use crate::Shared;
use apalis::prelude::{BoxDynError, Data};
use offshoot_store::BackfillStep;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackfillJob {
    pub fork_cid: String,
    /// Attempts that failed in a row before this one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl BackfillJob {
    pub fn new(fork_cid: &str) -> BackfillJob {
        BackfillJob { fork_cid: fork_cid.to_string(), failures: 0 }
    }
}

/// How backfills run and are retried.
#[derive(Debug, Clone)]
pub struct BackfillPolicy {
    /// Messages copied per transaction.
    pub page_size: i64,
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
    let policy = &shared.backfill;
    let cid = job.fork_cid.as_str();
    loop {
        if shared.shutdown.is_cancelled() {
            // Hand the rest to whichever worker runs next (this one after a restart).
            shared.pools.push_backfill(BackfillJob::new(cid), Duration::ZERO).await?;
            return Ok(());
        }
        let started = std::time::Instant::now();
        let step = shared.store.backfill_step(cid, policy.page_size).await;
        tracing::debug!(fork = cid, elapsed_ms = started.elapsed().as_secs_f64() * 1000.0, "backfill page");
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
                let delay = crate::backoff(policy.backoff_base, policy.backoff_max, failures);
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

/// Queues every backfilling fork that has no waiting or running job (a crash between a fork's
/// commit and its enqueue, a job lost by the queue). Returns how many were queued.
pub async fn reconcile(shared: &Shared) -> Result<usize, BoxDynError> {
    let live: HashSet<String> = shared.pools.live_jobs::<BackfillJob>(BACKFILL_QUEUE).await?.into_iter().map(|j| j.fork_cid).collect();
    let mut queued = 0;
    for cid in shared.store.backfilling_forks().await? {
        if !live.contains(&cid) {
            shared.pools.push_backfill(BackfillJob::new(&cid), Duration::ZERO).await?;
            queued += 1;
        }
    }
    Ok(queued)
}
