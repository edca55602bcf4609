//! The worker role: fork backfills and webhook deliveries as **apalis** jobs, on SQLite (the
//! embedded default) or PostgreSQL (scale-out), in the application's own database.
//!
//! The fork row stays the only truth about a backfill (status, cursor, counts); apalis decides
//! who runs what, when, and how often it is retried. A backfill job carries the fork's cid (and
//! its count of failed attempts in a row); the API pushes it right after the fork's transaction
//! commits, and a reconciler (at start-up and every [`WorkerConfig::reconcile_interval`])
//! pushes one for every backfilling fork without a waiting or running job, so a lost push
//! cannot strand a fork, and for every fork whose row has not moved for
//! [`WorkerConfig::stall_after`] while its job is said to be live, so a job the queue holds but
//! no worker runs cannot strand it either. Retries do not use apalis's own (immediate) retries: a job that fails
//! ends and pushes a new job `run_after` an exponential back-off. See [`backfill`] and
//! [`webhooks`].
//!
//! **Sharing the database with the store.** apalis needs typed pools (`SqlitePool`, `PgPool`),
//! so this crate opens a small pool of its own on the same database ([`queue::Pools`]); pushes
//! cannot join a store transaction, hence push-after-commit plus the reconciler. Migrations:
//! on PostgreSQL apalis keeps everything in schema `apalis` (tables `apalis.jobs` and
//! `apalis.workers`, bookkeeping in `apalis._sqlx_migrations`; a fresh database gets the
//! `hstore` and `pgcrypto` extensions, so the database user needs that right). On SQLite its
//! tables `Jobs` and `Workers` live beside the application's, and we run its migrations with
//! their own bookkeeping table `_apalis_migrations`, so the application's `_sqlx_migrations`
//! lists only the application's migrations and neither migrator sees the other's versions.
//! `SqliteStorage::setup` is not called (it sets `synchronous = OFF`).
//!
//! **Workers.** Each process start registers workers under unique names (a restarted process
//! must not reuse the name of its dead predecessor). A worker that dies (SIGKILL, power loss)
//! stops its heartbeat; after [`WorkerConfig::heartbeat`] × [`MISSED_HEARTBEATS`] a live
//! worker's heartbeat puts its jobs back in the queue (within [`WorkerConfig::takeover_bound`],
//! 9 s by default), and the backfill resumes from the fork's cursor. On SQLite, which one
//! process serves, a restarted process does not wait for that: [`prepare`] takes back every
//! job still marked fetched or running before its workers start
//! ([`queue::Pools::take_back_orphans`]). On PostgreSQL workers are woken by LISTEN/NOTIFY and poll every
//! [`WorkerConfig::poll_interval`] besides; on SQLite a push by this process wakes its workers
//! ([`queue::Wake`]) and they poll besides.
//!
//! Depends on `offshoot-core`, `offshoot-store`, `offshoot-files` (the files job removes freed
//! uploads from storage), apalis and sqlx (typed pools for apalis);
//! must not depend on axum, the API or the WebSocket crate.

pub mod backfill;
pub mod files;
pub mod jobs;
pub mod queue;
pub mod record;
pub mod webhooks;

use apalis::prelude::{BackendExt, Monitor, Strategy, WorkerBuilder, WorkerBuilderExt};
use apalis_postgres::{PostgresStorage, Pubsub};
use apalis_sqlite::SqliteStorage;
use backfill::{BackfillJob, BackfillPolicy};
use offshoot_core::jobs::{BoxFuture, DeadLetter, JobCounts, Jobs};
use offshoot_core::Error;
use offshoot_store::Store;
use queue::{Pools, QueueError, BACKFILL_QUEUE, WEBHOOK_QUEUE};
use secrecy::SecretString;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use webhooks::{Circuits, DeliveryJob, WebhookPolicy};

/// Heartbeats a worker may miss before its jobs are given to others.
pub const MISSED_HEARTBEATS: usize = 3;

#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub backfill: BackfillPolicy,
    pub webhooks: WebhookPolicy,
    /// How often a worker tells the database it is alive (and re-queues the jobs of workers
    /// that stopped doing so): a dead worker's jobs are started again within
    /// [`WorkerConfig::takeover_bound`].
    pub heartbeat: Duration,
    /// How often an idle worker looks for due jobs (besides LISTEN/NOTIFY on PostgreSQL).
    pub poll_interval: Duration,
    /// How often the reconciler looks for backfilling forks without a job.
    pub reconcile_interval: Duration,
    /// How long a backfilling fork whose job the queue calls live may go without a committed
    /// page before the reconciler queues another job for it (see [`backfill::reconcile`]).
    pub stall_after: Duration,
    /// Where uploads are stored, for the files job ([`files`]); `None`: nothing is freed.
    pub files: Option<offshoot_files::Files>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            backfill: BackfillPolicy::default(),
            webhooks: WebhookPolicy::default(),
            // A dead worker's jobs go to a live one within 2 s × (3 + 1) + 1 s = 9 s.
            heartbeat: Duration::from_secs(2),
            poll_interval: Duration::from_secs(1),
            reconcile_interval: Duration::from_secs(10),
            stall_after: Duration::from_secs(60),
            files: None,
        }
    }
}

impl WorkerConfig {
    /// The longest a dead worker's job waits before a live worker starts it: its heartbeat
    /// missed [`MISSED_HEARTBEATS`] times, plus one heartbeat of the live worker (which puts
    /// the job back in the queue), plus one poll (which fetches it).
    pub fn takeover_bound(&self) -> Duration {
        self.heartbeat * (MISSED_HEARTBEATS as u32 + 1) + self.poll_interval
    }
}

/// apalis's configuration of one SQLite queue: `n` jobs fetched at once, the heartbeat of
/// [`WorkerConfig::heartbeat`].
fn sqlite_queue(queue: &str, n: usize, heartbeat: Duration) -> apalis_sqlite::Config {
    apalis_sqlite::Config::default().queue(queue).batch_size(n).heartbeat_interval(heartbeat).missed_heartbeats(MISSED_HEARTBEATS)
}

/// apalis's configuration of one PostgreSQL queue: `n` jobs fetched at once, the heartbeat of
/// [`WorkerConfig::heartbeat`].
fn postgres_queue(queue: &str, n: usize, heartbeat: Duration) -> apalis_postgres::Config {
    apalis_postgres::Config::default().queue(queue).batch_size(n).heartbeat_interval(heartbeat).missed_heartbeats(MISSED_HEARTBEATS)
}

/// The job queue: pushing jobs and reading its state. Used by every role (the API pushes
/// backfills); cheap to clone.
#[derive(Clone)]
pub struct Queue {
    pub pools: Pools,
    pub store: Store,
}

impl Queue {
    /// Opens apalis's pool on the store's database and applies apalis's migrations.
    pub async fn connect(store: Store, database_url: &str) -> Result<Queue, QueueError> {
        Ok(Queue { pools: Pools::connect(database_url).await?, store })
    }

    pub async fn close(&self) {
        self.pools.close().await;
    }

    pub async fn dead_letters(&self, limit: i64, offset: i64) -> Result<Vec<DeadLetter>, QueueError> {
        Ok(self.store.dead_letters(limit, offset).await.map_err(|e| e.to_string())?.into_iter().map(|r| r.letter).collect())
    }

    /// Queues dead letters again (all when `ids` is `None`); returns how many.
    pub async fn replay_dead_letters(&self, ids: Option<&[String]>) -> Result<u64, QueueError> {
        let mut n = 0;
        match ids {
            Some(ids) => {
                let records = self.store.dead_letters_by_id(ids).await.map_err(|e| e.to_string())?;
                n += webhooks::replay(&self.pools, &self.store, records).await?;
            }
            None => loop {
                let records = self.store.dead_letters(500, 0).await.map_err(|e| e.to_string())?;
                if records.is_empty() {
                    break;
                }
                n += webhooks::replay(&self.pools, &self.store, records).await?;
            },
        }
        Ok(n)
    }

    pub async fn counts(&self) -> Result<Vec<JobCounts>, QueueError> {
        let mut backfill = self.pools.counts(BACKFILL_QUEUE).await?;
        backfill.dead_lettered = self.store.count_failed_forks().await.map_err(|e| e.to_string())?;
        let mut webhook = self.pools.counts(WEBHOOK_QUEUE).await?;
        webhook.dead_lettered = self.store.count_dead_letters().await.map_err(|e| e.to_string())?;
        Ok(vec![backfill, webhook])
    }
}

/// Runs a job handler's work on a tokio task of its own. apalis runs handlers inside the
/// worker's future, so every wake-up of a handler (each database reply of a backfill page) also
/// polled the worker's queue, which fetched again each time: hundreds of empty fetches a second
/// (`get_jobs` on PostgreSQL, an `UPDATE` of `Jobs` on SQLite) competing with the backfill for
/// the CPU (docs/performance.md, "Worker (apalis)"). On its own task the work wakes the worker once, when it ends.
pub(crate) async fn on_own_task<F>(work: F) -> Result<(), apalis::prelude::BoxDynError>
where
    F: std::future::Future<Output = Result<(), apalis::prelude::BoxDynError>> + Send + 'static,
{
    tokio::spawn(work).await.map_err(|e| Box::new(e) as apalis::prelude::BoxDynError)?
}

fn internal(what: &str, e: QueueError) -> Error {
    tracing::error!(error = %e, "{what}");
    Error::internal()
}

impl Jobs for Queue {
    fn enqueue_backfill<'a>(&'a self, fork_cid: &'a str) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            self.pools
                .push_backfill(BackfillJob::new(fork_cid), Duration::ZERO)
                .await
                .map_err(|e| internal("queueing a backfill failed", e))
        })
    }

    fn dead_letters(&self, limit: i64, offset: i64) -> BoxFuture<'_, Result<Vec<DeadLetter>, Error>> {
        Box::pin(async move { Queue::dead_letters(self, limit, offset).await.map_err(|e| internal("listing dead letters failed", e)) })
    }

    fn replay_dead_letters<'a>(&'a self, ids: Option<&'a [String]>) -> BoxFuture<'a, Result<u64, Error>> {
        Box::pin(async move { Queue::replay_dead_letters(self, ids).await.map_err(|e| internal("replaying dead letters failed", e)) })
    }

    fn counts(&self) -> BoxFuture<'_, Result<Vec<JobCounts>, Error>> {
        Box::pin(async move { Queue::counts(self).await.map_err(|e| internal("counting jobs failed", e)) })
    }

    fn enqueue_files(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move { self.pools.push_files().await.map_err(|e| internal("queueing the files job failed", e)) })
    }
}

/// What every job handler reaches.
pub struct Shared {
    pub store: Store,
    pub pools: Pools,
    pub backfill: BackfillPolicy,
    pub webhooks: WebhookPolicy,
    pub http: reqwest::Client,
    pub circuits: Circuits,
    pub api_key: Arc<str>,
    /// Signs deliveries (`X-Signature`); never logged.
    pub api_secret: SecretString,
    /// Cancelled at shutdown: a backfill stops at its next page boundary.
    pub shutdown: CancellationToken,
    /// Where uploads are stored (the files job).
    pub files: Option<offshoot_files::Files>,
}

/// Readies the worker role, once per process start; to be awaited before the process serves a
/// request and before [`run`]. The webhook relay's outbox cursor is created at the end of the
/// outbox on first use, so a relay that created it only once [`run`] got to it (late, on a
/// loaded machine) passed over the events this process's API had committed meanwhile, and their
/// webhooks were never sent. Creating it here, before the API takes a request, has every event
/// written from then on relayed.
///
/// On SQLite it also takes back the jobs a previous run left fetched or running
/// ([`queue::Pools::take_back_orphans`]), before this run's workers fetch: a fork whose process
/// was killed mid-backfill resumes as soon as the restarted process is up, not after the
/// heartbeat takeover.
pub async fn prepare(queue: &Queue) -> Result<(), QueueError> {
    queue.store.outbox_cursor(webhooks::CURSOR).await.map_err(|e| e.to_string())?;
    let taken = queue.pools.take_back_orphans().await?;
    if taken > 0 {
        tracing::info!(jobs = taken, "took back the jobs a previous run left running");
    }
    Ok(())
}

/// Runs the worker role until `shutdown`: the apalis workers of both queues, the webhook
/// queueing relay and the reconciler. In-flight jobs get a bounded time to finish. Call
/// [`prepare`] first.
pub async fn run(queue: Queue, config: WorkerConfig, api_key: String, api_secret: SecretString, shutdown: CancellationToken) {
    let http = match reqwest::Client::builder().timeout(config.webhooks.attempt_timeout).redirect(reqwest::redirect::Policy::none()).build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the webhook HTTP client; the worker is off");
            return;
        }
    };
    let shared = Arc::new(Shared {
        store: queue.store.clone(),
        pools: queue.pools.clone(),
        backfill: config.backfill.clone(),
        webhooks: config.webhooks.clone(),
        http,
        circuits: Circuits::default(),
        api_key: api_key.into(),
        api_secret,
        shutdown: shutdown.clone(),
        files: config.files.clone(),
    });
    if let Err(e) = shared.pools.push_files().await {
        tracing::warn!(error = %e, "queueing the start-up files job failed");
    }
    // Unique per process start: a restarted process must not take over its predecessor's name.
    let instance = format!("{}-{}", std::process::id(), ulid::Ulid::generate());
    let monitor = register(Monitor::new(), &shared, &config, &instance)
        .should_restart(|ctx, err| {
            tracing::warn!(worker = ctx.name(), error = %err, "apalis worker stopped with an error; restarting it");
            true
        })
        .shutdown_timeout(config.webhooks.attempt_timeout + Duration::from_secs(2));
    let relay = tokio::spawn(webhooks::relay(shared.clone(), shutdown.clone()));
    let reconciler = tokio::spawn(reconcile_loop(shared.clone(), config.reconcile_interval, config.stall_after, shutdown.clone()));
    tracing::info!(%instance, takeover_s = config.takeover_bound().as_secs(), "worker started (apalis)");
    let s = shutdown.clone();
    if let Err(e) = monitor
        .run_with_signal(async move {
            s.cancelled().await;
            Ok(())
        })
        .await
    {
        tracing::error!(error = %e, "the apalis monitor ended with an error");
    }
    let _ = relay.await;
    let _ = reconciler.await;
    tracing::info!("worker stopped");
}

/// Registers one worker per queue on one engine's storage type: `$storage::<$job>` configured
/// by `$config(queue, concurrency)` and polled with `$strategy(queue)`. A macro, because the two
/// engines' storages are distinct types with no trait over their constructors and configs.
macro_rules! register_workers {
    ($monitor:expr, $shared:expr, $instance:expr, $pool:expr, $storage:ident, $config:expr, $strategy:expr,
     $(($job:ty, $queue:expr, $n:expr, $name:literal, $handler:path)),+ $(,)?) => {{
        let monitor = $monitor;
        $(
            let monitor = {
                let (pool, shared, strategy) = ($pool.clone(), $shared.clone(), $strategy.clone());
                let (config, name) = ($config, format!("{}-{}", $name, $instance));
                monitor.register(move |restarts| {
                    let backend = $storage::<$job>::new(&pool).with_config(config($queue, $n)).poll_with_strategy(strategy($queue));
                    WorkerBuilder::new(format!("{name}-{restarts}")).backend(backend).data(shared.clone()).concurrency($n).build($handler)
                })
            };
        )+
        monitor
    }};
}

fn register(monitor: Monitor, shared: &Arc<Shared>, config: &WorkerConfig, instance: &str) -> Monitor {
    let hb = config.heartbeat;
    let poll = config.poll_interval;
    let (bf_n, wh_n) = (config.backfill.concurrency.max(1), config.webhooks.concurrency.max(1));
    match &shared.pools {
        Pools::Sqlite(pool, wake) => {
            let cfg = move |queue: &str, n: usize| sqlite_queue(queue, n, hb);
            // A push by this process wakes its worker at once; the interval catches the rest.
            let wake = wake.clone();
            let strategy = move |queue: &'static str| Strategy::new().stream(wake.stream(queue)).interval(poll);
            register_workers!(
                monitor,
                shared,
                instance,
                pool,
                SqliteStorage,
                cfg,
                strategy,
                (BackfillJob, BACKFILL_QUEUE, bf_n, "backfill", backfill::run_job),
                (DeliveryJob, WEBHOOK_QUEUE, wh_n, "webhook", webhooks::run_job),
                (files::FilesJob, files::FILES_QUEUE, 1, "files", files::run_job),
            )
        }
        Pools::Postgres(pool) => {
            let cfg = move |queue: &str, n: usize| postgres_queue(queue, n, hb);
            // LISTEN/NOTIFY wakes an idle worker at once; the interval catches what it missed.
            let listen = pool.clone();
            let strategy = move |queue: &'static str| Strategy::new().stream(Pubsub::new(listen.clone(), queue.to_string())).interval(poll);
            register_workers!(
                monitor,
                shared,
                instance,
                pool,
                PostgresStorage,
                cfg,
                strategy,
                (BackfillJob, BACKFILL_QUEUE, bf_n, "backfill", backfill::run_job),
                (DeliveryJob, WEBHOOK_QUEUE, wh_n, "webhook", webhooks::run_job),
                (files::FilesJob, files::FILES_QUEUE, 1, "files", files::run_job),
            )
        }
    }
}

async fn reconcile_loop(shared: Arc<Shared>, every: Duration, stall_after: Duration, shutdown: CancellationToken) {
    let mut watch = backfill::Watch::default();
    loop {
        match backfill::reconcile(&shared, &mut watch, stall_after).await {
            Ok(backfill::Reconciled { orphaned: 0, stalled: 0 }) => {}
            Ok(r) => tracing::info!(orphaned = r.orphaned, stalled = r.stalled, "reconciler queued backfills"),
            Err(e) => tracing::warn!(error = %e, "reconciling backfills failed"),
        }
        match shared.pools.remove_finished().await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(removed = n, "removed finished jobs"),
            Err(e) => tracing::warn!(error = %e, "removing finished jobs failed"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dead worker's forks resume on another worker within 10 s by default.
    #[test]
    fn by_default_a_dead_workers_jobs_are_started_elsewhere_within_ten_seconds() {
        let c = WorkerConfig::default();
        assert_eq!(c.takeover_bound(), Duration::from_secs(9));
        assert!(c.takeover_bound() <= Duration::from_secs(10), "{:?}", c.takeover_bound());
    }

    /// The heartbeat setting is what apalis is given on both engines: the time after which a
    /// silent worker's jobs are re-queued is the heartbeat × [`MISSED_HEARTBEATS`].
    #[test]
    fn the_heartbeat_reaches_apalis_on_both_engines() {
        for secs in [1, 2, 7] {
            let c = WorkerConfig { heartbeat: Duration::from_secs(secs), poll_interval: Duration::from_millis(250), ..Default::default() };
            let (sqlite, postgres) =
                (sqlite_queue(queue::BACKFILL_QUEUE, 4, c.heartbeat), postgres_queue(queue::BACKFILL_QUEUE, 4, c.heartbeat));
            assert_eq!(sqlite.heartbeat_interval, c.heartbeat);
            assert_eq!(postgres.heartbeat_interval, c.heartbeat);
            let silent_for = c.heartbeat * MISSED_HEARTBEATS as u32;
            assert_eq!(sqlite.orphaned_duration(), silent_for);
            assert_eq!(postgres.orphaned_duration(), silent_for);
            assert_eq!(c.takeover_bound(), silent_for + c.heartbeat + Duration::from_millis(250));
        }
    }
}
