//! Offshoot's storage: one [`Store`] over SQLite (the embedded default) or PostgreSQL (the
//! scale-out backend), chosen from the database URL at start-up, with the migrations of each
//! and the transactional event outbox.
//!
//! Both backends share one implementation: the two migration folders build the same tables,
//! columns, nullability, primary keys and indexes, with text, bigint and flag columns only, so
//! every statement is written once with `$n` placeholders, which both drivers accept. The few
//! places where the engines differ (row locks, outbox ordering, write serialisation on SQLite)
//! branch on [`Backend`]. Two copies of every query would drift; the conformance suite
//! (`tests/conformance.rs`) runs every method on both backends, and its `schema` test compares
//! the schemas the two folders build.
//!
//! Rows decode into one `FromRow` struct per table (`rows.rs`) and convert into the model field
//! by field; statements that differ by one column or condition (the rewind's updates, for one)
//! are written out rather than assembled from fragments, so that each reads as the SQL it runs.
//! These are what the `duplicates` tool still lists here: shape, not repeated logic.
//!
//! **Where the schemas differ, and why.** Flags are `BOOLEAN` on PostgreSQL and `INTEGER` 0/1
//! on SQLite: sqlx's `Any` driver maps a SQLite column by its declared type and has no mapping
//! for a declared `BOOLEAN` (every read of such a column fails), so SQLite keeps `INTEGER`
//! and one decoder (`rows::Flag`) reads both. The outbox's `seq` is `BIGSERIAL` on PostgreSQL
//! and `INTEGER PRIMARY KEY AUTOINCREMENT` on SQLite (its auto-increment form). JSON is text on
//! both (`Any` has no JSON type) and is decoded by `rows::Json`. Rows decode into named
//! `sqlx::FromRow` structs (`rows.rs`) through `Any`, which knows booleans, integers, floats,
//! text and blobs only.
//!
//! # Concurrent writers
//!
//! SQLite serialises write transactions (one process-wide lock plus `BEGIN IMMEDIATE` on one
//! writer connection that retries itself instead of sleeping in SQLite's busy handler;
//! requests take the lock before backfill pages, `writer.rs`);
//! PostgreSQL runs them concurrently at READ COMMITTED, so every read-modify-write here either
//! is one statement (`INSERT … ON CONFLICT DO UPDATE`, `UPDATE … SET n = n + 1`) or reads under
//! a row lock (`SELECT … FOR UPDATE`, `Tx::for_update`) what it writes back. Each public
//! write method is one transaction.
//!
//! **Lock order.** Every transaction takes its locks in this order, and only the prefix it needs:
//!
//! 1. the channel row (`lock_channel`, `lock_and_load`): the first step of every write that
//!    touches a channel, its members or its messages (a message's channel is looked up and
//!    locked in one statement, then the message is read under that lock; a send takes the lock
//!    with the channel's own update, `UPDATE … RETURNING`); a fork locks its source's row, a
//!    backfill page its fork's channel row;
//! 2. the fork row (backfill pages);
//! 3. member rows, in user id order;
//! 4. message rows (new messages, reply counts of parents, copies), then the member rows'
//!    unread counters of the same channel (`unread.rs`; written after the message, under the
//!    channel lock that every writer of those counters holds), then the upload rows the
//!    messages refer to (held shared; the files job locks one upload row alone, `files.rs`);
//! 5. user rows, in user id order (upserts and partial updates lock only these; the app row
//!    and channel type rows are, like them, locked alone); a user's WebSocket connection and
//!    watch rows are written only under that user's row lock (`presence.rs`);
//! 6. the outbox: events are collected in the transaction and written at commit under a
//!    transaction-scoped advisory lock held *shared* (writers do not wait for each other), so
//!    the outbox lock is always the last one. Readers take it exclusively for a moment, alone,
//!    to wait out writers still committing (`events.rs`).
//!
//! **Retry rule.** A transaction that still loses to a concurrent writer (SQLSTATE 40P01
//! deadlock, 40001 serialization failure) is rolled back and run again from the start by
//! `Store::retrying`, at most 5 attempts with a short random pause; if it keeps losing, the
//! caller gets [`StoreError::Retryable`], which the API answers with a 503 envelope. A lost or
//! refused connection is [`StoreError::Unavailable`] (503 too) and is not retried here: its
//! commit may or may not have happened.
//!
//! This crate may depend on `offshoot-core` and sqlx; it must not depend on axum, the API, the
//! worker or the WebSocket crates.

mod backoff;
mod batch;
mod cache;
mod channels;
mod counted;
mod deliveries;
mod directory;
mod events;
mod files;
mod forks;
pub mod lineage;
mod messages;
mod ops;
mod presence;
mod query;
mod ratelimits;
mod rows;
mod search;
mod sends;
mod sql;
mod sqlite;
mod state;
mod unread;
mod users;
mod visibility;
mod writer;

pub use backoff::{backoff, jittered};
pub use channels::{ChannelFilter, ChannelUpdate, MemberInput, NewChannel, ReadMark, ReadState};
pub use counted::count_statements;
pub(crate) use counted::counted;
pub use deliveries::DeadLetterRecord;
pub use events::{outbox_rows, OutboxFollower, OUTBOX_READ_GAP};
pub use files::{upload_ids, Release, Upload, UPLOAD_PATH};
pub use forks::{BackfillStep, ForkOutcome, ForkRequest};
pub use messages::{Editor, Page, PageDir};
pub use ops::{set_consumer_cursor, OpsSnapshot};
pub use search::SearchPage;
pub use state::{ChannelState, StatePart};
pub use unread::UnreadCounts;
pub use users::{UserInput, UserPatch};
pub use visibility::is_visible;

use offshoot_core::model::AppSettings;
use offshoot_core::{Error, ErrorKind};
use sqlx::any::AnyPoolOptions;
use sqlx::{Any, AnyPool, Executor, Transaction};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// The backend a database URL names: `sqlite:` or `postgres://` / `postgresql://`.
    /// Anything else is refused, so a typo never silently becomes a local SQLite file.
    pub fn from_url(url: &str) -> Result<Backend> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else {
            let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or(url);
            Err(StoreError::Config(format!(
                "DATABASE_URL scheme {scheme:?} is not supported: use sqlite://path?mode=rwc or postgres://user@host:5432/db"
            )))
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// Errors at the storage edge. Nothing above this crate looks at `sqlx::Error`.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Domain(#[from] Error),
    /// A unique constraint refused a write. The constraint's text is for the log only.
    #[error("unique constraint violated: {0}")]
    Conflict(String),
    /// A deadlock or serialization failure (SQLSTATE 40P01, 40001): the transaction was rolled
    /// back and may be run again. [`Store`] retries these itself a bounded number of times.
    #[error("transaction lost to a concurrent writer: {0}")]
    Retryable(sqlx::Error),
    /// The database cannot be reached (connection cut, pool exhausted, server shutting down).
    #[error("database unavailable: {0}")]
    Unavailable(sqlx::Error),
    /// The configuration names something the store cannot use.
    #[error("{0}")]
    Config(String),
    #[error("database error: {0}")]
    Db(sqlx::Error),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Database(db) => {
                if db.is_unique_violation() {
                    return StoreError::Conflict(db.message().to_string());
                }
                match db.code().as_deref() {
                    // deadlock_detected, serialization_failure
                    Some("40P01") | Some("40001") => StoreError::Retryable(e),
                    // connection exceptions, admin/crash shutdown, cannot connect now
                    Some(c) if c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03") => StoreError::Unavailable(e),
                    // SQLite: the database is locked by another process past busy_timeout
                    Some("5") | Some("517") | Some("6") => StoreError::Unavailable(e),
                    // character_not_in_repertoire (a NUL in text): refused before the database,
                    // but never a 500 if something slips through
                    Some("22021") => StoreError::Domain(Error::input("text fields cannot contain NUL characters (\\u0000)")),
                    _ => StoreError::Db(e),
                }
            }
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_) => StoreError::Unavailable(e),
            _ => StoreError::Db(e),
        }
    }
}

impl StoreError {
    /// Whether running the whole transaction again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Retryable(_))
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Domain(e) => e,
            StoreError::Conflict(c) => {
                tracing::info!(constraint = %c, "write refused by a unique constraint");
                Error::input("the request conflicts with existing data (an object with that id exists already)")
            }
            StoreError::Retryable(e) => {
                tracing::warn!(error = %e, "transaction still losing to concurrent writers after retries");
                Error::unavailable("the database is busy with concurrent writes to the same object; retry the request")
            }
            StoreError::Unavailable(e) => {
                tracing::warn!(error = %e, "database unavailable");
                Error::unavailable("the database is unavailable; retry the request")
            }
            StoreError::Config(m) => {
                tracing::error!(message = %m, "store configuration error");
                Error::internal()
            }
            StoreError::Db(e) => {
                tracing::error!(error = %e, "database error");
                Error::internal()
            }
        }
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Db(sqlx::Error::Decode(Box::new(e)))
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

pub(crate) fn domain<T>(e: Error) -> Result<T> {
    Err(StoreError::Domain(e))
}

pub(crate) fn not_found<T>(what: impl Into<String>) -> Result<T> {
    Err(StoreError::Domain(Error::new(ErrorKind::NotFound, what)))
}

/// The store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// SQLite has one writer: write transactions of this process queue here instead of
    /// spinning on `SQLITE_BUSY`, requests ahead of backfill pages (`writer.rs`). Other
    /// processes on the same file still meet busy_timeout.
    write_lock: Option<Arc<writer::WriteLock>>,
    /// Background work running at once in this process, at most half the cores: backfill
    /// plans on both engines, and on PostgreSQL backfill pages too (SQLite's pages queue on its
    /// write lock instead). A page or a plan is one busy database process or connection thread
    /// for tens of milliseconds; four at once on two cores left requests' statements queueing
    /// for a core (docs/performance.md, "SQLite writer and backfill pages").
    background_turns: Arc<Semaphore>,
    /// SQLite: the one connection this process's write transactions run on (see
    /// [`Store::begin_with`]); `None` on PostgreSQL, whose writers use `pool`.
    writer: Option<AnyPool>,
    /// Woken after every commit that wrote outbox events.
    events: Arc<Notify>,
    /// PostgreSQL: tells this process's announcer (`events::announce`) that events were
    /// committed, so that it sends other processes a `NOTIFY` outside the writers' transactions.
    announce: Arc<Notify>,
    /// This store's mark in the payload of its `NOTIFY offshoot_events` (`events::announce`),
    /// so its own listener does not wake its consumers a second time.
    origin: Arc<str>,
    url: Arc<str>,
    /// App settings and channel types (`cache.rs`).
    cache: Arc<cache::ConfigCache>,
    /// Message updates waiting to be written together (`batch.rs`).
    updates: Arc<batch::Groups<messages::QueuedUpdate>>,
    /// New messages waiting to be written together (`batch.rs`).
    sends: Arc<batch::Groups<messages::QueuedSend>>,
    /// The outbox horizon reads this process's consumers share (`events.rs`).
    horizon: Arc<events::Horizon>,
    /// The events this process committed last, for its consumers (`events.rs`).
    recent: Arc<events::Recent>,
}

/// A write transaction. Events are collected while it runs and written to the outbox when it
/// commits, so the outbox lock is always the last lock a transaction takes (see the lock order
/// in the crate doc).
pub(crate) struct Tx {
    pub(crate) tx: Transaction<'static, Any>,
    backend: Backend,
    events: Vec<events::Queued>,
    pub(crate) cache: Arc<cache::ConfigCache>,
    _guard: Option<Turn>,
}

/// What a transaction holds until it ends, besides its connection.
enum Turn {
    /// SQLite's write lock (`writer.rs`).
    Writer { _lock: OwnedMutexGuard<()> },
    /// PostgreSQL: a background page's turn ([`Store::background_turns`]).
    Background { _turn: OwnedSemaphorePermit },
}

impl Tx {
    /// ` FOR UPDATE` on PostgreSQL, to append to a `SELECT` whose rows this transaction will
    /// write; nothing on SQLite, whose write transactions are serialised already.
    pub(crate) fn for_update(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => " FOR UPDATE",
            Backend::Sqlite => "",
        }
    }

    /// On PostgreSQL, plans every further statement of this transaction with its values (one
    /// statement: `SET LOCAL`). For the fork's statements: a generic plan cannot see that
    /// `cid = $1` picks one channel among many of very different sizes, and scanned whole
    /// indexes (docs/performance.md, "PostgreSQL without statistics").
    pub(crate) async fn custom_plans(&mut self) -> Result<()> {
        if self.backend == Backend::Postgres {
            custom_plans(&mut self.tx).await?;
        }
        Ok(())
    }

    pub(crate) async fn commit(self, store: &Store) -> Result<()> {
        let Tx { mut tx, backend, events, _guard, .. } = self;
        let wrote = !events.is_empty();
        let written = events::append(&mut tx, backend, events).await?;
        tx.commit().await?;
        // Once committed (on SQLite before the write lock is released).
        store.recent.keep(written);
        drop(_guard);
        if wrote {
            store.events.notify_waiters();
            store.announce.notify_one();
        }
        Ok(())
    }
}

/// Groups of one kind written at once (`batch.rs`): one on SQLite (one writer anyway), two on
/// PostgreSQL (one group's statements run while the other's commit waits for its disk flush).
fn group_writers(backend: Backend) -> usize {
    match backend {
        Backend::Sqlite => 1,
        Backend::Postgres => 2,
    }
}

/// `SET LOCAL plan_cache_mode = force_custom_plan` in the transaction of `conn` (PostgreSQL).
pub(crate) async fn custom_plans(conn: &mut sqlx::AnyConnection) -> Result<()> {
    sqlx::query("SET LOCAL plan_cache_mode = force_custom_plan").execute(crate::counted(&mut *conn)).await?;
    Ok(())
}

/// How often a transaction that lost to a concurrent writer (deadlock, serialization failure)
/// is run again before the client gets a 503.
const WRITE_ATTEMPTS: u32 = 5;

impl Store {
    /// Connects, applies the migrations and returns the store.
    pub async fn connect(url: &str) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let backend = Backend::from_url(url)?;
        let pool = match backend {
            Backend::Sqlite => sqlite::sqlite_pool(url, 4, sqlite::SQLITE_BUSY_WAIT).await?,
            Backend::Postgres => {
                AnyPoolOptions::new()
                    .max_connections(16)
                    // Bounded, so requests during an outage answer 503 instead of hanging; long
                    // enough that a burst queued on one hot row (150 forks of one source) waits
                    // for its turn instead of failing.
                    .acquire_timeout(Duration::from_secs(30))
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            // Prepared statements keep PostgreSQL's default plan choice (a
                            // generic plan once it is no dearer than the custom ones): the hot
                            // writes and reads are key lookups whose plan does not depend on the
                            // values, and planning them on every execution was a third of the
                            // database's time under load (docs/performance.md, "Send path on PostgreSQL"). The
                            // fork's statements, whose plans do, run under
                            // [`Tx::custom_plans`].
                            // Every hot read here is a keyset page of one channel or thread
                            // (`cid = $1 … ORDER BY created_at DESC, id DESC LIMIT n`), which an
                            // ordered index scan answers by reading n rows. Without current
                            // statistics (autovacuum off, or not yet run after a bulk write)
                            // PostgreSQL assumes a channel is a few rows and picks a bitmap scan
                            // that reads and sorts the whole channel instead: 0.3 ms became
                            // 50–500 ms on a 50,000-message channel (docs/performance.md,
                            // "PostgreSQL without statistics").
                            conn.execute("SET enable_bitmapscan = off").await?;
                            // No JIT: every statement here reads or writes a few rows, but
                            // without statistics the planner prices the 30-channel unions of
                            // Query Channels above `jit_above_cost`, and compiling them took
                            // 300–380 ms per statement, 20 times the query (docs/performance.md,
                            // "PostgreSQL without statistics").
                            conn.execute("SET jit = off").await?;
                            Ok(())
                        })
                    })
                    .connect(url)
                    .await?
            }
        };
        let migrator = match backend {
            Backend::Sqlite => &SQLITE_MIGRATIONS,
            Backend::Postgres => &POSTGRES_MIGRATIONS,
        };
        migrator.run(&pool).await.map_err(|e| StoreError::Db(e.into()))?;
        // SQLite's one writer connection has no busy handler: `begin_with` waits for the lock.
        let writer = match backend {
            Backend::Sqlite => Some(sqlite::sqlite_pool(url, 1, Duration::ZERO).await?),
            Backend::Postgres => None,
        };
        let announce = Arc::new(Notify::new());
        let origin: Arc<str> = offshoot_core::ids::new_id().into();
        let write_lock = (backend == Backend::Sqlite).then(|| Arc::new(writer::WriteLock::default()));
        // SQLite (the one with a write lock) checkpoints its WAL; PostgreSQL announces events.
        match (&write_lock, &writer) {
            (Some(lock), Some(writer)) => drop(tokio::spawn(sqlite::checkpoint(pool.clone(), writer.clone(), lock.clone()))),
            _ => drop(tokio::spawn(events::announce(pool.clone(), announce.clone(), origin.clone()))),
        }
        Ok(Store {
            pool,
            backend,
            write_lock,
            background_turns: {
                let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
                Arc::new(Semaphore::new((cores / 2).max(1)))
            },
            writer,
            events: Arc::new(Notify::new()),
            announce,
            origin,
            url: url.into(),
            cache: Arc::new(cache::ConfigCache::new(backend == Backend::Sqlite)),
            updates: Arc::new(batch::Groups::new(group_writers(backend))),
            sends: Arc::new(batch::Groups::new(group_writers(backend))),
            horizon: Arc::default(),
            recent: Arc::default(),
        })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub async fn close(&self) {
        if let Some(writer) = &self.writer {
            writer.close().await;
        }
        self.pool.close().await;
        // The announcer sees the closed pool and ends.
        self.announce.notify_one();
    }

    /// Resolves when an outbox event was committed by this process (or a timeout elapses
    /// on the caller's side). Consumers always re-read the outbox from their cursor.
    pub fn event_notify(&self) -> Arc<Notify> {
        self.events.clone()
    }

    /// On PostgreSQL, relays `LISTEN offshoot_events` from other processes to
    /// [`Store::event_notify`], and `offshoot_config` to the settings cache, until `shutdown`.
    /// The cache is used only while the listener is connected (`cache.rs`). Consumers still
    /// poll, so a lost notification only delays, never loses, work. No-op on SQLite.
    pub async fn relay_notifications(&self, shutdown: impl std::future::Future<Output = ()>) {
        if self.backend != Backend::Postgres {
            return shutdown.await;
        }
        let relay = async {
            loop {
                match sqlx::postgres::PgListener::connect(&self.url).await {
                    Ok(mut l) => {
                        if let Err(e) = l.listen_all(["offshoot_events", "offshoot_config"]).await {
                            tracing::warn!(error = %e, "LISTEN failed");
                        } else {
                            self.cache.set_usable(true);
                            while let Ok(n) = l.recv().await {
                                if n.channel() == "offshoot_config" {
                                    self.cache.invalidate();
                                } else if n.payload() != &*self.origin {
                                    self.events.notify_waiters();
                                }
                            }
                            self.cache.set_usable(false);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "connecting the notification listener failed"),
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        };
        tokio::select! {
            _ = shutdown => {}
            _ = relay => {}
        }
        self.cache.set_usable(false);
    }

    /// A write transaction of a request.
    pub(crate) async fn begin(&self) -> Result<Tx> {
        let guard = match &self.write_lock {
            Some(lock) => Some(Turn::Writer { _lock: lock.request().await }),
            None => None,
        };
        self.begin_with(guard).await
    }

    /// On SQLite, how many request transactions so far had to wait for the one write lock
    /// (`writer.rs`); `None` on PostgreSQL, which has no such lock. A backfill compares it
    /// before and after a page to know whether the page held anyone up.
    pub fn request_write_waits(&self) -> Option<u64> {
        self.write_lock.as_ref().map(|lock| lock.request_waits())
    }

    /// On SQLite, how long ago a request transaction last took the one write lock (`None` when
    /// none has, and on PostgreSQL). A backfill that starts while requests are writing starts
    /// with a small page.
    pub fn since_last_request_write(&self) -> Option<std::time::Duration> {
        self.write_lock.as_ref()?.since_last_request()
    }

    /// A write transaction of background work (a backfill page), which on SQLite lets waiting
    /// requests go first (`writer.rs`) and on PostgreSQL waits for its turn among this process's
    /// pages ([`Store::background_turns`]).
    pub(crate) async fn begin_background(&self) -> Result<Tx> {
        let guard = match &self.write_lock {
            Some(lock) => Turn::Writer { _lock: lock.background().await },
            None => Turn::Background { _turn: self.background_turn().await },
        };
        self.begin_with(Some(guard)).await
    }

    /// A turn among this process's background work ([`Store::background_turns`]).
    pub(crate) async fn background_turn(&self) -> OwnedSemaphorePermit {
        self.background_turns.clone().acquire_owned().await.expect("the turns are never closed")
    }

    /// Takes every turn of this process's background work until the returned turns are
    /// dropped: backfill plans (and PostgreSQL's pages) wait meanwhile. For tests that check
    /// what waits for a turn.
    #[doc(hidden)]
    pub async fn hold_background_turns(&self) -> Vec<OwnedSemaphorePermit> {
        let mut turns = Vec::new();
        while self.background_turns.available_permits() > 0 {
            turns.push(self.background_turn().await);
        }
        turns
    }

    /// On SQLite the transaction runs on the store's one writer connection, which has no busy
    /// handler: this process's writers already queue on the write lock, so `BEGIN IMMEDIATE`
    /// meets only the short writes of apalis's own pool (job rows) or of another process, and
    /// is tried again every millisecond for up to [`sqlite::SQLITE_BUSY_WAIT`]. SQLite's own busy handler
    /// sleeps 1, 2, 5, 10, … ms between tries, so a request that met a job-row write of a
    /// millisecond slept for up to 8 ms while holding the write lock (docs/performance.md, "SQLite writer and backfill pages").
    async fn begin_with(&self, guard: Option<Turn>) -> Result<Tx> {
        let tx = match &self.writer {
            Some(writer) => {
                let deadline = tokio::time::Instant::now() + sqlite::SQLITE_BUSY_WAIT;
                loop {
                    match writer.begin_with("BEGIN IMMEDIATE").await {
                        Ok(tx) => break tx,
                        Err(e) if sqlite::is_sqlite_busy(&e) && tokio::time::Instant::now() < deadline => {
                            tokio::time::sleep(Duration::from_millis(1)).await
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            None => self.pool.begin().await?,
        };
        Ok(Tx { tx, backend: self.backend, events: Vec::new(), cache: self.cache.clone(), _guard: guard })
    }

    /// Runs a write transaction, again (after a short random pause) when it lost to a
    /// concurrent writer, at most [`WRITE_ATTEMPTS`] times. `f` must build its transaction from
    /// scratch each time: nothing of a rolled-back attempt survives.
    pub(crate) async fn retrying<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let mut attempt = 1;
        loop {
            match f().await {
                Err(e) if e.is_retryable() && attempt < WRITE_ATTEMPTS => {
                    tracing::debug!(what, attempt, error = %e, "retrying a transaction that lost to a concurrent writer");
                    tokio::time::sleep(jittered(Duration::from_millis(5 * u64::from(attempt)), Duration::from_millis(19))).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// `SELECT 1`, for readiness.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(crate::counted(&self.pool)).await?;
        Ok(())
    }

    /// The app's key pair and settings; creates the app row on first start. A configured key
    /// pair replaces the stored one; with none configured, a pair is generated once.
    pub async fn ensure_app(&self, key: Option<&str>, secret: Option<&str>) -> Result<(String, String, bool)> {
        let mut tx = self.begin().await?;
        let row: Option<AppKeys> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT api_key, api_secret FROM app WHERE id = 1{}", tx.for_update())))
                .fetch_optional(crate::counted(&mut *tx.tx))
                .await?;
        let now = offshoot_core::time::now();
        let result = match (row, key, secret) {
            (Some(_), Some(k), Some(s)) => {
                sqlx::query("UPDATE app SET api_key = $1, api_secret = $2, updated_at = $3 WHERE id = 1")
                    .bind(k.to_string())
                    .bind(s.to_string())
                    .bind(now)
                    .execute(crate::counted(&mut *tx.tx))
                    .await?;
                (k.to_string(), s.to_string(), false)
            }
            (Some(keys), _, _) => (keys.api_key, keys.api_secret, false),
            (None, k, s) => {
                let generated = k.is_none() || s.is_none();
                let k = k.map(str::to_string).unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string()[..12].to_string());
                let s =
                    s.map(str::to_string).unwrap_or_else(|| format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple()));
                let settings = serde_json::to_string(&AppSettings::default())?;
                // Two processes starting on a new database: the first insert wins.
                let res = sqlx::query("INSERT INTO app (id, api_key, api_secret, settings, created_at, updated_at) VALUES (1, $1, $2, $3, $4, $4) ON CONFLICT (id) DO NOTHING")
                    .bind(k.clone())
                    .bind(s.clone())
                    .bind(settings)
                    .bind(now)
                    .execute(crate::counted(&mut *tx.tx))
                    .await?;
                if res.rows_affected() == 0 {
                    // Another process created the app row first: use its pair.
                    let keys: AppKeys =
                        sqlx::query_as("SELECT api_key, api_secret FROM app WHERE id = 1").fetch_one(crate::counted(&mut *tx.tx)).await?;
                    (keys.api_key, keys.api_secret, false)
                } else {
                    (k, s, generated)
                }
            }
        };
        tx.commit(self).await?;
        Ok(result)
    }

    /// The app settings, from memory when they are cached (`cache.rs`).
    pub async fn app_settings(&self) -> Result<AppSettings> {
        if let Some(s) = self.cache.cached_settings() {
            return Ok(s);
        }
        let mut conn = self.pool.acquire().await?;
        self.cache.settings(&mut conn).await
    }

    /// Commits a transaction that changed the app settings or a channel type, and drops the
    /// cached copies here and, on PostgreSQL, in every other process (`cache.rs`).
    pub(crate) async fn commit_config_change(&self, mut tx: Tx) -> Result<()> {
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT pg_notify('offshoot_config', '')").execute(counted(&mut *tx.tx)).await?;
        }
        tx.commit(self).await?;
        self.cache.invalidate();
        Ok(())
    }

    /// Changes the app settings under the app row's lock, so concurrent `PATCH /app` calls that
    /// change different settings all survive. `change` may run more than once (retries).
    pub async fn update_app_settings<F>(&self, change: F) -> Result<AppSettings>
    where
        F: Fn(&mut AppSettings) -> offshoot_core::error::Result<()>,
    {
        self.retrying("update_app_settings", || async {
            let mut tx = self.begin().await?;
            let stored: Option<rows::Json<AppSettings>> =
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT settings FROM app WHERE id = 1{}", tx.for_update())))
                    .fetch_optional(crate::counted(&mut *tx.tx))
                    .await?;
            let mut settings = stored.map(|s| s.0).unwrap_or_default();
            change(&mut settings)?;
            sqlx::query("UPDATE app SET settings = $1, updated_at = $2 WHERE id = 1")
                .bind(serde_json::to_string(&settings)?)
                .bind(offshoot_core::time::now())
                .execute(crate::counted(&mut *tx.tx))
                .await?;
            self.commit_config_change(tx).await?;
            Ok(settings)
        })
        .await
    }
}

/// The app's key pair as stored.
#[derive(sqlx::FromRow)]
struct AppKeys {
    api_key: String,
    api_secret: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constraint_texts_and_database_errors_never_reach_the_client_message() {
        let conflict = Error::from(StoreError::Conflict("duplicate key value violates unique constraint \"message_pkey\"".into()));
        assert_eq!(conflict.kind, ErrorKind::Input);
        assert!(!conflict.message.contains("message_pkey") && !conflict.message.contains("duplicate key"), "{}", conflict.message);
        let busy = Error::from(StoreError::Retryable(sqlx::Error::Protocol("deadlock detected on relation 12345".into())));
        assert_eq!((busy.kind, busy.kind.status()), (ErrorKind::Unavailable, 503));
        assert!(!busy.message.contains("12345"), "{}", busy.message);
        let down = Error::from(StoreError::from(sqlx::Error::PoolTimedOut));
        assert_eq!(down.kind, ErrorKind::Unavailable);
        let other = Error::from(StoreError::Db(sqlx::Error::Protocol("relation \"secret_table\" does not exist".into())));
        assert_eq!(other.kind, ErrorKind::Internal);
        assert!(!other.message.contains("secret_table"), "{}", other.message);
    }

    #[test]
    fn only_lost_races_are_retried() {
        assert!(StoreError::Retryable(sqlx::Error::PoolTimedOut).is_retryable());
        assert!(!StoreError::from(sqlx::Error::PoolTimedOut).is_retryable(), "a commit of unknown outcome is not run again");
        assert!(!StoreError::Conflict(String::new()).is_retryable());
    }
}
