//! The apalis side of the worker: typed pools on the application's database, apalis's
//! migrations, pushing jobs, and the few reads of apalis's tables that apalis has no API for
//! (live jobs of a queue for the reconciler, counts per state, removing finished jobs, taking
//! back at start-up the jobs a previous run of the process left running on SQLite).

use crate::jobs::{BackfillJob, DeliveryJob};
use apalis::prelude::{TaskBuilder, TaskId, TaskSink};
use apalis_postgres::PostgresStorage;
use apalis_sqlite::SqliteStorage;
use futures_util::task::AtomicWaker;
use futures_util::Stream;
use offshoot_core::jobs::JobCounts;
use offshoot_store::Backend;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;
use tokio::sync::Notify;
use ulid::Ulid;

/// The queue of fork backfills.
pub const BACKFILL_QUEUE: &str = "offshoot.backfill";
/// The queue of webhook deliveries.
pub const WEBHOOK_QUEUE: &str = "offshoot.webhook";
/// On SQLite apalis's migrations keep their own bookkeeping table, so the application's
/// `_sqlx_migrations` lists only the application's migrations (on PostgreSQL apalis keeps
/// `apalis._sqlx_migrations` in its own schema already).
pub const SQLITE_APALIS_MIGRATIONS_TABLE: &str = "_apalis_migrations";
/// Finished jobs are kept this long (apalis keeps them for ever), then removed.
const KEEP_DONE: Duration = Duration::from_secs(3600);

pub type QueueError = Box<dyn std::error::Error + Send + Sync>;

/// A job that is waiting or running, as apalis's table says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveJob<T> {
    pub args: T,
    pub state: LiveState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveState {
    /// Due, not yet taken by a worker.
    Waiting,
    /// Due later (a back-off before a retry).
    Scheduled,
    /// Taken by a worker that has not started it yet.
    Fetched,
    Running,
}

/// One read of apalis's tables, in each engine's text (apalis names its tables differently).
struct EngineSql {
    sqlite: &'static str,
    postgres: &'static str,
}

const LIVE_JOBS: EngineSql = EngineSql {
    sqlite: "SELECT job, status, COALESCE(run_at > CAST(strftime('%s', 'now') AS INTEGER), FALSE) FROM Jobs \
             WHERE job_type = $1 AND status IN ('Pending', 'Queued', 'Running')",
    postgres: "SELECT job, status, COALESCE(run_at > now(), FALSE) FROM apalis.jobs \
               WHERE job_type = $1 AND status IN ('Pending', 'Queued', 'Running')",
};

const COUNTS: EngineSql = EngineSql {
    sqlite: "SELECT status, COALESCE(run_at > CAST(strftime('%s', 'now') AS INTEGER), FALSE), COUNT(*) FROM Jobs \
             WHERE job_type = $1 GROUP BY 1, 2",
    postgres: "SELECT status, COALESCE(run_at > now(), FALSE), COUNT(*) FROM apalis.jobs WHERE job_type = $1 GROUP BY 1, 2",
};

const REMOVE_FINISHED: EngineSql = EngineSql {
    sqlite: "DELETE FROM Jobs WHERE job_type IN ($1, $2) AND status = 'Done' \
             AND done_at < CAST(strftime('%s', 'now') AS INTEGER) - $3",
    postgres: "DELETE FROM apalis.jobs WHERE job_type IN ($1, $2) AND status = 'Done' \
               AND done_at < now() - make_interval(secs => $3::float8)",
};

/// What apalis's table says about a job taken back by [`Pools::take_back_orphans`], in the
/// form of its own heartbeat re-enqueue (`{"Err": …}`).
pub const TAKEN_BACK: &str = r#"{"Err": "Taken back at start-up: the process that held it is gone."}"#;

/// The jobs of our queues that a previous run of this process left waiting in a worker's hands
/// (fetched or running), back to waiting: apalis's own re-enqueue statement (`status`,
/// `lock_by`, `lock_at`, `done_at`, one more attempt), for every such job whoever holds it.
const SQLITE_TAKE_BACK: &str = "UPDATE Jobs SET status = 'Pending', done_at = NULL, lock_by = NULL, lock_at = NULL, \
     attempts = attempts + 1, last_result = $4 WHERE job_type IN ($1, $2, $3) AND status IN ('Running', 'Queued')";

/// Runs `$body` on whichever typed pool `$pools` holds, with `$pool` bound to it and `$sql` to
/// that engine's text of `$statement`: the body is written once and type-checked against each
/// engine's pool.
macro_rules! on_pool {
    ($pools:expr, $statement:expr, |$pool:ident, $sql:ident| $body:expr) => {
        match $pools {
            Pools::Sqlite($pool, _) => {
                let $sql = $statement.sqlite;
                $body
            }
            Pools::Postgres($pool) => {
                let $sql = $statement.postgres;
                $body
            }
        }
    };
}

/// Typed pools on the application's database, which apalis needs (it cannot use the store's
/// `Any` pool). SQLite's carries the [`Wake`] of this process's workers.
#[derive(Clone, Debug)]
pub enum Pools {
    Sqlite(SqlitePool, Wake),
    Postgres(PgPool),
}

/// How long after the last push [`Wake::stream`] wakes its worker again, and again: see
/// [`Wake::stream`].
const WAKE_ECHOES: [Duration; 2] = [Duration::from_millis(100), Duration::from_secs(1)];

/// On SQLite, wakes this process's workers as soon as this process pushes a job to their
/// queue: apalis finds SQLite jobs by polling, and without it a fork's backfill (or a webhook)
/// would wait up to a whole poll interval to start. PostgreSQL workers are woken by
/// LISTEN/NOTIFY instead. A job pushed by another process on the same file (not a production
/// setup on SQLite) is still found by the poll.
#[derive(Clone, Debug, Default)]
pub struct Wake {
    backfill: Arc<Slot>,
    webhook: Arc<Slot>,
}

/// One queue's wake-up: a flag the worker's poll takes, the waker of the task that polled it
/// last, and the time of the last push, which the echoes count from.
#[derive(Debug, Default)]
struct Slot {
    pending: AtomicBool,
    waker: AtomicWaker,
    last_push: Mutex<Option<tokio::time::Instant>>,
    pushed: Notify,
    echoes_started: AtomicBool,
}

impl Slot {
    fn signal(&self) {
        self.pending.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// Signals [`WAKE_ECHOES`] after the last push, for ever (one task per queue and process).
    async fn echoes(self: Arc<Slot>) {
        loop {
            self.pushed.notified().await;
            for delay in WAKE_ECHOES {
                // A push during the wait moves the echo: it counts from the last push.
                loop {
                    let Some(last) = *self.last_push.lock().unwrap_or_else(|e| e.into_inner()) else { break };
                    if tokio::time::Instant::now() >= last + delay {
                        break;
                    }
                    tokio::time::sleep_until(last + delay).await;
                }
                tracing::trace!(echo_ms = delay.as_millis() as u64, "wake-up: echo");
                self.signal();
            }
        }
    }
}

impl Wake {
    fn slot(&self, queue: &str) -> Option<&Arc<Slot>> {
        match queue {
            BACKFILL_QUEUE => Some(&self.backfill),
            WEBHOOK_QUEUE => Some(&self.webhook),
            _ => None,
        }
    }

    fn pushed(&self, queue: &str) {
        let Some(slot) = self.slot(queue) else { return };
        *slot.last_push.lock().unwrap_or_else(|e| e.into_inner()) = Some(tokio::time::Instant::now());
        slot.pushed.notify_one();
        tracing::trace!(queue, "job pushed: waking this process's worker");
        // No worker has polled yet (or none runs here): the flag waits for its first poll.
        slot.signal();
    }

    /// Yields each time a job is pushed to `queue`, and again [`WAKE_ECHOES`] after the last
    /// push; never ends. apalis's poll gate only wakes the fetch loop: a wake-up taken while a
    /// fetch is already in flight (one that started before the job was committed) finds
    /// nothing and would be lost; an echo starts a fetch that surely began after the commit
    /// (the second one for a fetch that took longer than the first echo's wait).
    ///
    /// Every poll, also one that yields, keeps the polling task's waker: apalis may not poll
    /// the strategy again after it yielded (a fetch that completes within the same poll), and
    /// a wake-up that depended on a later poll to be armed was lost (a fork's backfill then
    /// waited for the next poll interval).
    pub fn stream(&self, queue: &'static str) -> Pin<Box<dyn Stream<Item = ()> + Send + Sync>> {
        let slot = self.slot(queue).cloned().unwrap_or_default();
        if !slot.echoes_started.swap(true, Ordering::AcqRel) {
            tokio::spawn(Arc::clone(&slot).echoes());
        }
        Box::pin(futures_util::stream::poll_fn(move |cx| {
            slot.waker.register(cx.waker());
            match slot.pending.swap(false, Ordering::AcqRel) {
                true => Poll::Ready(Some(())),
                false => Poll::Pending,
            }
        }))
    }
}

impl Pools {
    /// Opens a small pool on `url` and applies apalis's migrations.
    ///
    /// SQLite: WAL, `synchronous = NORMAL` and a busy timeout like the store's pool. Not
    /// `SqliteStorage::setup`, which would set `synchronous = OFF` on a pooled connection.
    pub async fn connect(url: &str) -> Result<Pools, QueueError> {
        match Backend::from_url(url).map_err(|e| e.to_string())? {
            Backend::Sqlite => {
                let options = SqliteConnectOptions::from_str(url)?
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(SqliteSynchronous::Normal)
                    .busy_timeout(Duration::from_secs(15))
                    // The store checkpoints the WAL in the background (its `sqlite_pool`); a job
                    // statement crossing the threshold would otherwise copy and flush it inline.
                    .pragma("wal_autocheckpoint", "0");
                let pool =
                    SqlitePoolOptions::new().max_connections(4).acquire_timeout(Duration::from_secs(30)).connect_with(options).await?;
                let mut migrator = SqliteStorage::<()>::migrations();
                migrator.dangerous_set_table_name(SQLITE_APALIS_MIGRATIONS_TABLE);
                migrator.run(&pool).await?;
                Ok(Pools::Sqlite(pool, Wake::default()))
            }
            Backend::Postgres => {
                // No JIT, as the store's connections (its `Store::connect`): the queue's
                // statements touch a few rows, and compiling one costs hundreds of ms.
                let options = PgConnectOptions::from_str(url)?.options([("jit", "off")]);
                let pool = PgPoolOptions::new().max_connections(8).acquire_timeout(Duration::from_secs(30)).connect_with(options).await?;
                // Everything in schema `apalis`, bookkept in `apalis._sqlx_migrations`. A fresh
                // database gets the `hstore` and `pgcrypto` extensions (the user needs that right).
                PostgresStorage::<()>::migrations().run(&pool).await?;
                Ok(Pools::Postgres(pool))
            }
        }
    }

    pub async fn close(&self) {
        match self {
            Pools::Sqlite(p, _) => p.close().await,
            Pools::Postgres(p) => p.close().await,
        }
    }

    /// Pushes jobs to `queue` in one transaction: all or none.
    pub async fn push<T>(&self, queue: &str, jobs: Vec<(T, TaskId, Duration)>) -> Result<(), QueueError>
    where
        T: Serialize + DeserializeOwned + Send + Sync + Unpin + 'static,
    {
        let tasks: Vec<_> = jobs
            .into_iter()
            .map(|(args, id, after)| {
                let task = TaskBuilder::new(args).task_id(id);
                // apalis schedules in whole seconds (and rounds down): round up, so a job never
                // runs before its delay is over.
                match after.is_zero() {
                    true => task.build(),
                    false => task.run_at_timestamp(ceil_secs(std::time::SystemTime::now() + after)).build(),
                }
            })
            .collect();
        let stream = futures_util::stream::iter(tasks);
        // A storage per push: cheap, and a failed flush cannot leave tasks buffered for the next.
        match self {
            Pools::Sqlite(pool, wake) => {
                let mut s = SqliteStorage::<T>::new(pool).with_config(apalis_sqlite::Config::default().queue(queue));
                s.push_all(stream).await.map_err(|e| format!("{e}"))?;
                wake.pushed(queue);
            }
            Pools::Postgres(pool) => {
                let mut s = PostgresStorage::<T>::new(pool).with_config(apalis_postgres::Config::default().queue(queue));
                s.push_all(stream).await.map_err(|e| format!("{e}"))?;
            }
        }
        Ok(())
    }

    /// Pushes one files job (`files.rs`).
    pub async fn push_files(&self) -> Result<(), QueueError> {
        self.push(crate::files::FILES_QUEUE, vec![(crate::files::FilesJob::default(), TaskId::from(Ulid::generate()), Duration::ZERO)])
            .await
    }

    /// Pushes one backfill job for `fork_cid`, due after `after`.
    pub async fn push_backfill(&self, job: BackfillJob, after: Duration) -> Result<(), QueueError> {
        self.push(BACKFILL_QUEUE, vec![(job, TaskId::from(Ulid::generate()), after)]).await
    }

    /// Pushes deliveries, each under the job id given. Ids already present (another worker
    /// queued the same events, or this one did before a crash) are skipped: the batch is
    /// tried whole first, then one by one.
    pub async fn push_deliveries(&self, jobs: Vec<(DeliveryJob, Ulid, Duration)>) -> Result<usize, QueueError> {
        if jobs.is_empty() {
            return Ok(0);
        }
        let n = jobs.len();
        let all: Vec<_> = jobs.iter().map(|(j, id, after)| (j.clone(), TaskId::from(*id), *after)).collect();
        match self.push(WEBHOOK_QUEUE, all).await {
            Ok(()) => Ok(n),
            Err(e) if is_duplicate(&*e) => {
                let mut pushed = 0;
                for (job, id, after) in jobs {
                    match self.push(WEBHOOK_QUEUE, vec![(job, TaskId::from(id), after)]).await {
                        Ok(()) => pushed += 1,
                        Err(e) if is_duplicate(&*e) => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(pushed)
            }
            Err(e) => Err(e),
        }
    }

    /// The jobs of `queue` that are waiting or running, with their state.
    pub async fn live_jobs<T: DeserializeOwned>(&self, queue: &str) -> Result<Vec<LiveJob<T>>, QueueError> {
        let rows: Vec<(Vec<u8>, String, bool)> =
            on_pool!(self, LIVE_JOBS, |pool, sql| sqlx::query_as(sql).bind(queue).fetch_all(pool).await?);
        Ok(rows
            .into_iter()
            .filter_map(|(job, status, later)| {
                let args = serde_json::from_slice(&job).ok()?;
                let state = match status.as_str() {
                    "Pending" if later => LiveState::Scheduled,
                    "Pending" => LiveState::Waiting,
                    "Queued" => LiveState::Fetched,
                    _ => LiveState::Running,
                };
                Some(LiveJob { args, state })
            })
            .collect())
    }

    /// Jobs of `queue` by state (`dead_lettered` is the caller's to fill in).
    pub async fn counts(&self, queue: &str) -> Result<JobCounts, QueueError> {
        let rows: Vec<(String, bool, i64)> = on_pool!(self, COUNTS, |pool, sql| sqlx::query_as(sql).bind(queue).fetch_all(pool).await?);
        let mut c = JobCounts { queue: queue.to_string(), ..Default::default() };
        for (status, later, n) in rows {
            match status.as_str() {
                "Pending" if later => c.retrying += n,
                "Pending" | "Queued" => c.queued += n,
                "Running" => c.running += n,
                "Failed" | "Killed" => c.failed += n,
                _ => {}
            }
        }
        Ok(c)
    }

    /// On SQLite, puts back in the queue every job of ours that is marked fetched or running;
    /// returns how many. For the start of a worker process only, before its workers fetch: one
    /// process serves a SQLite file (the crate doc of `offshoot-store`), so any job marked so
    /// at that moment was held by a worker of a previous run that is gone (killed, crashed),
    /// and waiting for apalis's heartbeat takeover ([`crate::WorkerConfig::takeover_bound`])
    /// would leave it idle for nothing. A backfill taken back resumes from its fork's cursor;
    /// a webhook delivery that was being sent is sent again, with the same `X-Webhook-Id`
    /// (deliveries are at least once). On PostgreSQL other live processes may hold jobs:
    /// nothing is done there, and a dead worker's jobs are taken over by heartbeat.
    pub async fn take_back_orphans(&self) -> Result<u64, QueueError> {
        match self {
            Pools::Sqlite(pool, _) => Ok(sqlx::query(SQLITE_TAKE_BACK)
                .bind(BACKFILL_QUEUE)
                .bind(WEBHOOK_QUEUE)
                .bind(crate::files::FILES_QUEUE)
                .bind(TAKEN_BACK)
                .execute(pool)
                .await?
                .rows_affected()),
            Pools::Postgres(_) => Ok(0),
        }
    }

    /// Removes our queues' jobs that finished more than an hour ago.
    pub async fn remove_finished(&self) -> Result<u64, QueueError> {
        let done = on_pool!(self, REMOVE_FINISHED, |pool, sql| sqlx::query(sql)
            .bind(BACKFILL_QUEUE)
            .bind(WEBHOOK_QUEUE)
            .bind(KEEP_DONE.as_secs() as i64)
            .execute(pool)
            .await?
            .rows_affected());
        Ok(done)
    }
}

fn ceil_secs(t: std::time::SystemTime) -> u64 {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

fn is_duplicate(e: &(dyn std::error::Error + Send + Sync)) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("unique") || text.contains("duplicate key")
}

/// The ULID with the same 128 bits as `id` (a delivery's `X-Webhook-Id`), so that queueing the
/// same delivery twice collides on apalis's unique job id.
pub fn ulid_of(id: uuid::Uuid) -> Ulid {
    Ulid::from(id.as_u128())
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use std::sync::atomic::AtomicUsize;
    use std::task::Waker;
    use tokio::time::Instant;

    /// On a paused clock: a push wakes at once, also while the previous push's echoes are
    /// still waiting; the echoes come [`WAKE_ECHOES`] after the last push; other queues'
    /// pushes do not wake.
    #[tokio::test(start_paused = true)]
    async fn a_push_wakes_at_once_and_the_echoes_follow_the_last_push() {
        let wake = Wake::default();
        let mut stream = wake.stream(BACKFILL_QUEUE);
        let t0 = Instant::now();
        wake.pushed(BACKFILL_QUEUE);
        stream.next().await.expect("a wake-up");
        assert_eq!(t0.elapsed(), Duration::ZERO, "the first push wakes at once");

        tokio::time::sleep(Duration::from_millis(30)).await;
        wake.pushed(WEBHOOK_QUEUE);
        wake.pushed(BACKFILL_QUEUE);
        let t1 = Instant::now();
        stream.next().await.expect("a wake-up");
        assert_eq!(t1.elapsed(), Duration::ZERO, "a push during the echo's wait wakes at once, not at the echo");

        stream.next().await.expect("the first echo");
        assert_eq!(t1.elapsed(), WAKE_ECHOES[0], "the first echo follows the last push");
        stream.next().await.expect("the second echo");
        assert_eq!(t1.elapsed(), WAKE_ECHOES[1], "the second echo follows the last push");
    }

    struct CountingWaker(AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The lost wake-up behind a fork that waited for the next poll (docs/performance.md,
    /// "Worker (apalis)"): apalis may not poll the strategy again after it yielded, so the push that
    /// follows must wake the task that polled last without another poll in between.
    #[tokio::test]
    async fn a_push_wakes_the_last_polling_task_without_another_poll_after_a_yield() {
        let wake = Wake::default();
        let mut stream = wake.stream(BACKFILL_QUEUE);
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&counter));
        let mut cx = std::task::Context::from_waker(&waker);
        wake.pushed(BACKFILL_QUEUE);
        assert_eq!(stream.poll_next_unpin(&mut cx), Poll::Ready(Some(())), "the push is there to take");
        let before = counter.0.load(Ordering::SeqCst);
        wake.pushed(BACKFILL_QUEUE);
        assert!(counter.0.load(Ordering::SeqCst) > before, "the second push woke the task that polled last");
        assert_eq!(stream.poll_next_unpin(&mut cx), Poll::Ready(Some(())), "and its wake-up is there to take");
        assert_eq!(stream.poll_next_unpin(&mut cx), Poll::Pending, "each push is taken once");
    }
}

// ---------------------------------------------------------------------------------------------
// Releasing waiting webhook deliveries (webhooks.rs, "Catching up")

/// A webhook delivery waiting in the queue for a later attempt (a back-off, or an open
/// circuit): its apalis job id, endpoint, `X-Webhook-Id` and event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitingDelivery {
    pub job_id: String,
    pub url: String,
    pub delivery_id: String,
    pub seq: i64,
}

const WAITING_DELIVERIES: EngineSql = EngineSql {
    sqlite: "SELECT id, url, delivery_id, seq FROM (SELECT id, json_extract(CAST(job AS TEXT), '$.url') AS url, \
             json_extract(CAST(job AS TEXT), '$.id') AS delivery_id, CAST(json_extract(CAST(job AS TEXT), '$.seq') AS INTEGER) AS seq \
             FROM Jobs WHERE job_type = $1 AND status = 'Pending' AND run_at > CAST(strftime('%s', 'now') AS INTEGER)) \
             WHERE $2 IS NULL OR url = $2 ORDER BY seq, id",
    postgres: "SELECT id, j->>'url', j->>'id', (j->>'seq')::bigint FROM (SELECT id, convert_from(job, 'UTF8')::json AS j \
               FROM apalis.jobs WHERE job_type = $1 AND status = 'Pending' AND run_at > now()) w \
               WHERE $2::text IS NULL OR j->>'url' = $2 ORDER BY 4, 1",
};

/// Makes waiting jobs due now and marks them `released` (a delivery the endpoint's circuit does
/// not hold back). Only jobs still waiting: one a worker took meanwhile is not touched, so a
/// job is never run twice (apalis's fetch locks what it takes).
const RELEASE: EngineSql = EngineSql {
    sqlite: "UPDATE Jobs SET run_at = CAST(strftime('%s', 'now') AS INTEGER) - 1, \
             job = CAST(json_set(CAST(job AS TEXT), '$.released', json('true')) AS BLOB) \
             WHERE job_type = $1 AND id IN (SELECT value FROM json_each($2)) AND status = 'Pending' \
             AND run_at > CAST(strftime('%s', 'now') AS INTEGER) RETURNING id",
    postgres: "UPDATE apalis.jobs SET run_at = now() - interval '1 second', \
               job = convert_to(jsonb_set(convert_from(job, 'UTF8')::jsonb, '{released}', 'true')::text, 'UTF8') \
               WHERE job_type = $1 AND id = ANY(string_to_array($2, ',')) AND status = 'Pending' AND run_at > now() RETURNING id",
};

const STILL_LIVE: EngineSql = EngineSql {
    sqlite: "SELECT id FROM Jobs WHERE job_type = $1 AND id IN (SELECT value FROM json_each($2)) \
             AND status IN ('Pending', 'Queued', 'Running')",
    postgres: "SELECT id FROM apalis.jobs WHERE job_type = $1 AND id = ANY(string_to_array($2, ',')) \
               AND status IN ('Pending', 'Queued', 'Running')",
};

/// A row of [`WAITING_DELIVERIES`]: job id, URL, delivery id, seq (none when a job's JSON
/// lacks them).
type WaitingRow = (String, Option<String>, Option<String>, Option<i64>);

/// The job ids as each engine's statement takes a list: a JSON array on SQLite, comma-separated
/// on PostgreSQL (ULIDs have no comma).
fn id_list(pools: &Pools, ids: &[String]) -> String {
    match pools {
        Pools::Sqlite(..) => serde_json::to_string(ids).unwrap_or_default(),
        Pools::Postgres(_) => ids.join(","),
    }
}

impl Pools {
    /// The webhook deliveries waiting for a later attempt (of `url`, or of every endpoint),
    /// oldest event first.
    pub async fn waiting_deliveries(&self, url: Option<&str>) -> Result<Vec<WaitingDelivery>, QueueError> {
        let rows: Vec<WaitingRow> =
            on_pool!(self, WAITING_DELIVERIES, |pool, sql| sqlx::query_as(sql).bind(WEBHOOK_QUEUE).bind(url).fetch_all(pool).await?);
        Ok(rows
            .into_iter()
            .filter_map(|(job_id, url, delivery_id, seq)| Some(WaitingDelivery { job_id, url: url?, delivery_id: delivery_id?, seq: seq? }))
            .collect())
    }

    /// Makes these waiting deliveries due now and wakes the workers; returns the ids of those
    /// released (a job no longer waiting is left alone).
    pub async fn release_deliveries(&self, job_ids: &[String]) -> Result<Vec<String>, QueueError> {
        if job_ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = id_list(self, job_ids);
        let released: Vec<String> =
            on_pool!(self, RELEASE, |pool, sql| sqlx::query_scalar(sql).bind(WEBHOOK_QUEUE).bind(&ids).fetch_all(pool).await?);
        if let Some(first) = released.first() {
            match self {
                Pools::Sqlite(_, wake) => wake.pushed(WEBHOOK_QUEUE),
                // apalis's trigger notifies inserts only: say it for the update.
                Pools::Postgres(pool) => {
                    let payload = serde_json::json!({"job_type": WEBHOOK_QUEUE, "id": first}).to_string();
                    sqlx::query("SELECT pg_notify('apalis::job::insert', $1)").bind(payload).execute(pool).await?;
                }
            }
        }
        Ok(released)
    }

    /// Which of these webhook jobs are still waiting or running.
    pub async fn live_deliveries(&self, job_ids: &[String]) -> Result<Vec<String>, QueueError> {
        if job_ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = id_list(self, job_ids);
        Ok(on_pool!(self, STILL_LIVE, |pool, sql| sqlx::query_scalar(sql).bind(WEBHOOK_QUEUE).bind(&ids).fetch_all(pool).await?))
    }
}
