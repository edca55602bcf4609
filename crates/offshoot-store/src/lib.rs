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

mod batch;
mod cache;
mod channels;
mod counted;
mod deliveries;
mod directory;
mod events;
mod files;
mod forks;
mod messages;
mod ops;
mod presence;
mod query;
mod rows;
mod sends;
mod state;
mod unread;
mod users;
mod writer;

pub use channels::{ChannelFilter, ChannelUpdate, MemberInput, NewChannel, ReadMark, ReadState};
pub use counted::count_statements;
pub(crate) use counted::counted;
pub use deliveries::DeadLetterRecord;
pub use events::{outbox_rows, OUTBOX_READ_GAP};
pub use files::{upload_ids, Release, Upload, UPLOAD_PATH};
pub use forks::{BackfillStep, ForkOutcome, ForkRequest};
pub use messages::{is_visible, Editor, Page, PageDir};
pub use ops::{set_consumer_cursor, OpsSnapshot};
pub use state::{ChannelState, StatePart};
pub use unread::UnreadCounts;
pub use users::{UserInput, UserPatch};

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
    /// for a core (BENCHMARKS.md, figure c).
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
    updates: Arc<batch::Groups<batch::QueuedUpdate>>,
    /// New messages waiting to be written together (`batch.rs`).
    sends: Arc<batch::Groups<batch::QueuedSend>>,
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
    /// indexes (BENCHMARKS.md, "Reading the figures" of the first round).
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

/// How long a SQLite write transaction waits for the database's write lock held by another
/// connection (apalis's pool, another process) before the request gets a 503; the read pool's
/// busy timeout is the same.
const SQLITE_BUSY_WAIT: Duration = Duration::from_secs(15);

/// A pool on the SQLite file at `url`: WAL, `synchronous = NORMAL` (no flush per commit),
/// SQLite's busy handler waiting up to `busy` for another connection's lock, and no automatic
/// checkpoints: a commit that crosses the WAL's threshold would copy the WAL into the database
/// and flush it before returning, while requests wait ([`checkpoint`] does it instead). SQLite's
/// temporary files are kept in memory: a backfill page's insert spilled its statement journal
/// to a new file under `/var/tmp` past 64 KiB, a file created, written and deleted for every
/// page the one writer wrote (BENCHMARKS.md, twenty-second session).
async fn sqlite_pool(url: &str, connections: u32, busy: Duration) -> Result<AnyPool> {
    let pragmas: Arc<str> = format!(
        "PRAGMA journal_mode = WAL; PRAGMA busy_timeout = {}; PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0; PRAGMA temp_store = MEMORY",
        busy.as_millis()
    )
    .into();
    Ok(AnyPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(30))
        .after_connect(move |conn, _| {
            let pragmas = pragmas.clone();
            Box::pin(async move {
                for pragma in pragmas.split("; ") {
                    conn.execute(sqlx::AssertSqlSafe(pragma.to_string())).await?;
                }
                Ok(())
            })
        })
        .connect(url)
        .await?)
}

/// How often the SQLite WAL is copied into the database by [`checkpoint`].
const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);

/// WAL frames (pages) past which [`checkpoint`] restarts the WAL under the write lock, whether
/// or not its rounds copied them all: about 40 MB with 4 KiB pages.
///
/// After a restart the writers write the WAL's file over from its start, and SQLite's frames
/// (a page and a 24-byte header) straddle the file system's blocks, so a frame written over a
/// block that is no longer in the page cache reads that block from disk first, the writer
/// waiting behind whatever the disk is flushing. Until the twenty-second session the WAL grew
/// to 100,000 frames (400 MB) before a restart when its rounds kept up, and the part written
/// a minute before had left the page cache (this machine's kernel pages out file pages unused
/// for about a minute): some 5,000 such reads in one run of figure c, writes of the one
/// writer taking 5–20 ms (BENCHMARKS.md, twenty-second session). Kept to 10,000 frames, the
/// WAL is written over every few seconds under load, while its pages are in memory. Restarts
/// are cheap enough for it since the twenty-first session (`checkpoint_round`).
const RESTART_FRAMES: i64 = 10_000;

/// Copies the SQLite WAL into the database every [`CHECKPOINT_EVERY`], off every request's and
/// backfill page's path (their connections do not checkpoint, [`sqlite_pool`]). `PASSIVE`: it
/// takes no lock that writers or readers wait for; what a reader still uses stays for the next
/// round. Ends when the pool is closed.
///
/// A WAL that is never started over grows for as long as writes last, and every page read then
/// searches more of the WAL's index. The send ceiling halved after a run of heavy writes
/// (BENCHMARKS.md, ninth session), and during the agent streams of figure e the WAL reached
/// 1.2 GB (seventeenth session). SQLite starts the WAL over by itself only when a writer finds it
/// fully copied and no reader on its frames. Under steady writes that moment does not come:
/// either the rounds never catch up with the last frame (the benchmark's seeding), or they catch
/// up every round but a reader is always on the frames (the streams). So past
/// [`RESTART_FRAMES`] the next round takes the write lock as a background page does (waiting
/// requests go first), so that no writer of this process adds frames. It then restarts the WAL,
/// trying again [`RESTART_PAUSE`] apart while a reader is still on its frames (readers that start
/// meanwhile read the database alone), at most [`RESTART_TRIES`] times and only while no
/// request waits for the lock, and otherwise next round.
///
/// `RESTART` holds the write lock for its copy, and sends waited 10–30 ms behind it during
/// backfills (BENCHMARKS.md, thirteenth session). Even with nothing left to copy when the round
/// began, a restart held it 21–55 ms (the frames written since, and the flushes of both files):
/// the slowest sends of figure c (twentieth session): the frames written during the round.
/// So before it takes the lock, further rounds copy what the writers added meanwhile until a
/// round copies few, the database file is flushed without the lock, and while requests are
/// writing the backfills' pages are held back meanwhile
/// ([`writer::WriteLock::pause_background`]); see `checkpoint_round`.
async fn checkpoint(pool: AnyPool, writer: AnyPool, lock: Arc<writer::WriteLock>) {
    // Asked once: the restarts flush it every few seconds under load.
    let file = database_file(&pool).await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "finding the SQLite database file failed; WAL restarts flush it holding the lock");
        None
    });
    loop {
        tokio::time::sleep(CHECKPOINT_EVERY).await;
        if pool.is_closed() {
            return;
        }
        if let Err(e) = checkpoint_round(&pool, &writer, &lock, file.as_deref(), RESTART_FRAMES).await {
            if pool.is_closed() {
                return;
            }
            tracing::warn!(error = %e, "checkpointing the SQLite WAL failed; trying again");
        }
    }
}

/// One round of [`checkpoint`], restarting the WAL past `restart_past` frames
/// ([`RESTART_FRAMES`]; a test gives fewer) after flushing the database `file` (none in memory).
/// Fails only when its `PASSIVE` copy fails.
async fn checkpoint_round(
    pool: &AnyPool,
    writer: &AnyPool,
    lock: &writer::WriteLock,
    file: Option<&std::path::Path>,
    restart_past: i64,
) -> Result<()> {
    let (frames, done) = passive_checkpoint(pool).await?;
    if frames < restart_past {
        return Ok(());
    }
    // The restart flushes the database file holding the lock, and a `PASSIVE` round flushes it
    // only when it copies the WAL to its end, which under steady writes it never does: so the
    // restart flushed everything the rounds had copied since the last restart, 60–140 MB,
    // 50–100 ms of every writer's wait (BENCHMARKS.md, twenty-first session). Here, before the
    // lock, the rounds copy what the writers added meanwhile and the file is flushed, so that
    // the restart copies and flushes only what was written in the last moments. While requests
    // are writing, the backfills' pages are held back meanwhile (requests go on), so that the
    // restart's hold, every request's wait, is shortest; with no request to wait, a backfill
    // would only lose the pause's 100–300 ms, so it goes on writing and waits for the hold. A
    // round's count of frames is the WAL's when it began, so what was written during a round
    // shows only in the next: the rounds go on until one copies few.
    let requests_writing = lock.since_last_request().is_some_and(|since| since < RECENT_REQUESTS);
    let pause = requests_writing.then(|| lock.pause_background());
    let mut copied_before = done;
    let mut left = frames - done;
    for round in 0..CATCH_UP_ROUNDS {
        match passive_checkpoint(pool).await {
            Ok((_, done)) => {
                left = done - copied_before;
                copied_before = done;
            }
            Err(_) => break,
        }
        if round == 0 {
            if let Err(e) = flush_database_file(file).await {
                tracing::warn!(error = %e, "flushing the SQLite database file before a WAL restart failed");
            }
        } else if left <= RESTART_LEFT {
            break;
        }
    }
    // How long the restart waited for the lock and held it, for the debug line: a restart's
    // hold is every writer's wait (BENCHMARKS.md, twentieth session).
    let asked = std::time::Instant::now();
    let _lock = match &pause {
        Some(pause) => lock.background_while_paused(pause).await,
        None => lock.background().await,
    };
    let taken = std::time::Instant::now();
    let mut tries = 0;
    let outcome = loop {
        tries += 1;
        match restart_wal(writer).await {
            // Not while a request waits: it goes first, and the next round tries again.
            Ok(false) if tries < RESTART_TRIES && !lock.requests_waiting() => tokio::time::sleep(RESTART_PAUSE).await,
            other => break other,
        }
    };
    match outcome {
        Ok(restarted) => {
            let (waited_ms, held_ms) = ((taken - asked).as_secs_f64() * 1e3, taken.elapsed().as_secs_f64() * 1e3);
            tracing::debug!(frames, left, restarted, tries, waited_ms, held_ms, "restarting the SQLite WAL")
        }
        Err(e) => tracing::warn!(error = %e, "restarting the SQLite WAL failed; trying again"),
    }
    Ok(())
}

/// Requests that took the write lock this recently make a WAL restart hold the backfills back
/// while it catches up (`checkpoint_round`).
const RECENT_REQUESTS: Duration = Duration::from_secs(1);

/// Extra `PASSIVE` rounds at most before a restart, and the frames a round copied below which
/// the restart goes ahead without another (about 4 MB).
const CATCH_UP_ROUNDS: usize = 3;
const RESTART_LEFT: i64 = 1_000;

/// Restarts tried under one hold of the write lock while a reader is still on the WAL's frames
/// and no request waits for the lock, and the pause between them: the lock is held for about
/// 10 ms at most, and only while no request wants it.
const RESTART_TRIES: u32 = 10;
const RESTART_PAUSE: Duration = Duration::from_millis(1);

/// `PRAGMA wal_checkpoint(RESTART)` on the writer connection (whose turn it must be), which has
/// no busy handler: when a reader is still on the WAL's frames it copies what it can and gives
/// up at once (false) instead of holding every writer off while a busy handler sleeps until the
/// readers are done (up to the busy timeout, 15 s, behind one long read); the caller tries
/// again next round.
async fn restart_wal(writer: &AnyPool) -> Result<bool> {
    let (busy, _, _) = sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(RESTART)").fetch_one(writer).await?;
    Ok(busy == 0)
}

/// Flushes the database `file` (`fdatasync`; none in memory) on a blocking thread, holding no
/// lock of SQLite's or this process's.
async fn flush_database_file(file: Option<&std::path::Path>) -> Result<()> {
    let Some(file) = file.map(std::path::Path::to_path_buf) else { return Ok(()) };
    tokio::task::spawn_blocking(move || std::fs::File::open(file)?.sync_data())
        .await
        .map_err(|e| StoreError::Db(sqlx::Error::Io(std::io::Error::other(e))))?
        .map_err(|e| StoreError::Db(sqlx::Error::Io(e)))?;
    Ok(())
}

/// The file of `pool`'s main database (`None` in memory).
async fn database_file(pool: &AnyPool) -> Result<Option<std::path::PathBuf>> {
    let path: String = sqlx::query_scalar("SELECT file FROM pragma_database_list WHERE name = 'main'").fetch_one(pool).await?;
    Ok((!path.is_empty()).then(|| path.into()))
}

/// One `PASSIVE` checkpoint: the WAL's frames and how many of them are copied.
async fn passive_checkpoint(pool: &AnyPool) -> Result<(i64, i64)> {
    let (_, frames, done) = sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(PASSIVE)").fetch_one(pool).await?;
    Ok((frames, done))
}

/// `SQLITE_BUSY` (the database file is locked by another connection).
fn is_sqlite_busy(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("5"))
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
            Backend::Sqlite => sqlite_pool(url, 4, SQLITE_BUSY_WAIT).await?,
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
                            // database's time under load (BENCHMARKS.md, tenth session). The
                            // fork's statements, whose plans do, run under
                            // [`Tx::custom_plans`].
                            // Every hot read here is a keyset page of one channel or thread
                            // (`cid = $1 … ORDER BY created_at DESC, id DESC LIMIT n`), which an
                            // ordered index scan answers by reading n rows. Without current
                            // statistics (autovacuum off, or not yet run after a bulk write)
                            // PostgreSQL assumes a channel is a few rows and picks a bitmap scan
                            // that reads and sorts the whole channel instead: 0.3 ms became
                            // 50–500 ms on a 50,000-message channel (BENCHMARKS.md).
                            conn.execute("SET enable_bitmapscan = off").await?;
                            // No JIT: every statement here reads or writes a few rows, but
                            // without statistics the planner prices the 30-channel unions of
                            // Query Channels above `jit_above_cost`, and compiling them took
                            // 300–380 ms per statement, 20 times the query (BENCHMARKS.md,
                            // "Query Channels after a day's data: JIT").
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
            Backend::Sqlite => Some(sqlite_pool(url, 1, Duration::ZERO).await?),
            Backend::Postgres => None,
        };
        let announce = Arc::new(Notify::new());
        let origin: Arc<str> = offshoot_core::ids::new_id().into();
        let write_lock = (backend == Backend::Sqlite).then(|| Arc::new(writer::WriteLock::default()));
        // SQLite (the one with a write lock) checkpoints its WAL; PostgreSQL announces events.
        match (&write_lock, &writer) {
            (Some(lock), Some(writer)) => drop(tokio::spawn(checkpoint(pool.clone(), writer.clone(), lock.clone()))),
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
    /// is tried again every millisecond for up to [`SQLITE_BUSY_WAIT`]. SQLite's own busy handler
    /// sleeps 1, 2, 5, 10, … ms between tries, so a request that met a job-row write of a
    /// millisecond slept for up to 8 ms while holding the write lock (BENCHMARKS.md, issue 6).
    async fn begin_with(&self, guard: Option<Turn>) -> Result<Tx> {
        let tx = match &self.writer {
            Some(writer) => {
                let deadline = tokio::time::Instant::now() + SQLITE_BUSY_WAIT;
                loop {
                    match writer.begin_with("BEGIN IMMEDIATE").await {
                        Ok(tx) => break tx,
                        Err(e) if is_sqlite_busy(&e) && tokio::time::Instant::now() < deadline => {
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
                    let jitter = u64::from(uuid::Uuid::new_v4().as_bytes()[0]) % 20;
                    tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt) + jitter)).await;
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

    /// A scratch SQLite file with the store's pools on it: `readers` (with the busy handler) and
    /// the one `writer` (without).
    struct Scratch {
        path: std::path::PathBuf,
        readers: AnyPool,
        writer: AnyPool,
    }

    impl Scratch {
        async fn new(readers: u32) -> Scratch {
            sqlx::any::install_default_drivers();
            let path = std::env::temp_dir().join(format!("offshoot-wal-{}.db", uuid::Uuid::new_v4()));
            let url = format!("sqlite://{}?mode=rwc", path.display());
            let readers = sqlite_pool(&url, readers, SQLITE_BUSY_WAIT).await.expect("readers");
            let writer = sqlite_pool(&url, 1, Duration::ZERO).await.expect("writer");
            Scratch { path, readers, writer }
        }

        /// The WAL's frames now (a `PASSIVE` round).
        async fn wal_frames(&self) -> i64 {
            passive_checkpoint(&self.readers).await.expect("passive").0
        }

        async fn remove(self) {
            self.readers.close().await;
            self.writer.close().await;
            for suffix in ["", "-wal", "-shm"] {
                std::fs::remove_file(format!("{}{suffix}", self.path.display())).ok();
            }
        }
    }

    #[tokio::test]
    async fn a_wal_restart_gives_up_at_once_while_a_reader_is_on_the_wal_and_restarts_it_after() {
        let scratch = Scratch::new(2).await;
        let (readers, writer) = (&scratch.readers, &scratch.writer);
        sqlx::query("CREATE TABLE t (x INTEGER)").execute(writer).await.expect("create");
        sqlx::query("INSERT INTO t VALUES (1)").execute(writer).await.expect("insert");
        // A reader whose snapshot is on the WAL's frames, and a write after it.
        let mut reader = readers.begin().await.expect("begin read");
        let seen: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t").fetch_one(&mut *reader).await.expect("read");
        sqlx::query("INSERT INTO t VALUES (2)").execute(writer).await.expect("insert after the read");
        // With a busy handler this would wait for the reader (up to the 15 s busy timeout).
        let restarted = tokio::time::timeout(Duration::from_secs(5), restart_wal(writer)).await;
        assert!(matches!(restarted, Ok(Ok(false))), "gave up at once: {restarted:?}");
        let still: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t").fetch_one(&mut *reader).await.expect("read again");
        assert_eq!((seen, still), (1, 1), "the reader kept its snapshot");
        reader.rollback().await.expect("end read");
        let before = scratch.wal_frames().await;
        assert!(restart_wal(writer).await.expect("restart"), "no reader left: restarted");
        // The next write starts the WAL over: it holds only that write's frames.
        sqlx::query("INSERT INTO t VALUES (3)").execute(writer).await.expect("insert after the restart");
        let after = scratch.wal_frames().await;
        assert!(after < before, "the WAL started over: {before} frames before, {after} after");
        scratch.remove().await;
    }

    /// The moment of figure e where SQLite never starts the WAL over by itself (BENCHMARKS.md,
    /// seventeenth session, 4): after each write a reader begins on the WAL's frames (the
    /// outbox's consumers, woken by the commit), the round copies them all, and the next write
    /// comes while that reader is still open. SQLite tries its restart only at the first write
    /// after a full copy, and a reader on the frames makes it give up; so with `cap` out of
    /// reach the WAL only grows. Past `cap` the round holds the write lock and tries again while
    /// the reader finishes, as reads do.
    async fn wal_frames_under_readers_after_every_write(cap: i64) -> Vec<i64> {
        let scratch = Scratch::new(8).await;
        let (readers, writer) = (&scratch.readers, &scratch.writer);
        let lock = writer::WriteLock::default();
        sqlx::query("CREATE TABLE t (x INTEGER, pad TEXT)").execute(writer).await.expect("create");
        let mut reading: Option<tokio::task::JoinHandle<()>> = None;
        let mut frames = Vec::new();
        for i in 0..100 {
            {
                let _turn = lock.request().await;
                // About 10 KB: a few frames a write.
                sqlx::query("INSERT INTO t VALUES ($1, $2)").bind(i).bind("x".repeat(10_000)).execute(writer).await.expect("insert");
            }
            // A reader on the frames just written.
            let mut read = readers.begin().await.expect("begin read");
            let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM t").fetch_one(&mut *read).await.expect("read");
            // The reader before it is done, so the round copies every frame.
            if let Some(previous) = reading.take() {
                previous.await.expect("previous reader");
            }
            // This one finishes on its own 3 ms into the round: after the next write when the
            // round does not wait, and while it waits when it does (10 tries, 1 ms apart).
            reading = Some(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(3)).await;
                read.rollback().await.expect("end read");
            }));
            checkpoint_round(readers, writer, &lock, Some(&scratch.path), cap).await.expect("round");
            frames.push(scratch.wal_frames().await);
        }
        if let Some(last) = reading {
            last.await.expect("last reader");
        }
        scratch.remove().await;
        frames
    }

    #[tokio::test]
    async fn the_checkpoint_starts_over_a_wal_that_a_reader_is_always_on() {
        let cap = 60;
        let frames = wal_frames_under_readers_after_every_write(cap).await;
        let restarts = frames.windows(2).filter(|w| w[1] < w[0]).count();
        let most = frames.iter().copied().max().unwrap_or(0);
        // Never started over, the WAL holds every write's frames: 300 and more after 100 writes.
        assert!(
            restarts >= 2 && most < 3 * cap,
            "the WAL was started over past {cap} frames: {restarts} restarts, {most} frames at most ({frames:?})"
        );
    }

    /// Every connection of both pools keeps SQLite's temporary files (statement journals,
    /// sorts) in memory (`sqlite_pool`).
    #[tokio::test]
    async fn sqlite_connections_keep_temporary_files_in_memory() {
        let scratch = Scratch::new(3).await;
        let mut held = Vec::new();
        for pool in [&scratch.readers, &scratch.readers, &scratch.readers, &scratch.writer] {
            let mut conn = pool.acquire().await.expect("connection");
            // 2 is MEMORY (0, the build's default, uses files).
            let temp_store: i64 = sqlx::query_scalar("PRAGMA temp_store").fetch_one(&mut *conn).await.expect("temp_store");
            assert_eq!(temp_store, 2, "temporary files in memory");
            held.push(conn);
        }
        drop(held);
        scratch.remove().await;
    }

    #[tokio::test]
    async fn the_file_flushed_before_a_wal_restart_is_the_database_s_own() {
        let scratch = Scratch::new(1).await;
        let file = database_file(&scratch.readers).await.expect("file").expect("on disk");
        assert_eq!(file.canonicalize().expect("file"), scratch.path.canonicalize().expect("path"));
        flush_database_file(Some(&file)).await.expect("flushed");
        scratch.remove().await;
        let memory = sqlite_pool("sqlite::memory:", 1, Duration::ZERO).await.expect("memory");
        assert_eq!(database_file(&memory).await.expect("file"), None);
        flush_database_file(None).await.expect("nothing to flush");
    }

    #[test]
    fn only_lost_races_are_retried() {
        assert!(StoreError::Retryable(sqlx::Error::PoolTimedOut).is_retryable());
        assert!(!StoreError::from(sqlx::Error::PoolTimedOut).is_retryable(), "a commit of unknown outcome is not run again");
        assert!(!StoreError::Conflict(String::new()).is_retryable());
    }
}
