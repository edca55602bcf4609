//! What the store does on SQLite only: its pools' settings and the copying of the WAL into the
//! database (checkpoints), off every request's path.

use crate::{writer, Result, StoreError};
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, Executor};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// How long a SQLite write transaction waits for the database's write lock held by another
/// connection (apalis's pool, another process) before the request gets a 503; the read pool's
/// busy timeout is the same.
pub(crate) const SQLITE_BUSY_WAIT: Duration = Duration::from_secs(15);

/// A pool on the SQLite file at `url`: WAL, `synchronous = NORMAL` (no flush per commit),
/// SQLite's busy handler waiting up to `busy` for another connection's lock, and no automatic
/// checkpoints: a commit that crosses the WAL's threshold would copy the WAL into the database
/// and flush it before returning, while requests wait ([`checkpoint`] does it instead). SQLite's
/// temporary files are kept in memory: a backfill page's insert spilled its statement journal
/// to a new file under `/var/tmp` past 64 KiB, a file created, written and deleted for every
/// page the one writer wrote (docs/performance.md, "SQLite WAL checkpoints").
pub(crate) async fn sqlite_pool(url: &str, connections: u32, busy: Duration) -> Result<AnyPool> {
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
/// waiting behind whatever the disk is flushing. With a bound of 100,000 frames (400 MB) the
/// part written a minute before had left the page cache (the kernel pages out file pages unused
/// for about a minute): some 5,000 such reads in one run of figure c, writes of the one writer
/// taking 5–20 ms. Kept to 10,000 frames, the WAL is written over every few seconds under load,
/// while its pages are in memory, and the reads fall to a few hundred; a restart is cheap enough
/// for it because its round flushes the database file before taking the lock
/// (`checkpoint_round`; docs/performance.md, "SQLite WAL checkpoints").
const RESTART_FRAMES: i64 = 10_000;

/// Copies the SQLite WAL into the database every [`CHECKPOINT_EVERY`], off every request's and
/// backfill page's path (their connections do not checkpoint, [`sqlite_pool`]). `PASSIVE`: it
/// takes no lock that writers or readers wait for; what a reader still uses stays for the next
/// round. Ends when the pool is closed.
///
/// A WAL that is never started over grows for as long as writes last, and every page read then
/// searches more of the WAL's index: the send ceiling halved after a run of heavy writes, and
/// during the agent streams of figure e the WAL reached 1.2 GB. SQLite starts the WAL over by itself only when a writer finds it
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
/// backfills. Even with nothing left to copy when the round began, a restart held it 21–55 ms
/// (the frames written since, and the flushes of both files), the slowest sends of figure c.
/// So before it takes the lock, further rounds copy what the writers added meanwhile until a
/// round copies few, the database file is flushed without the lock, and while requests are
/// writing the backfills' pages are held back meanwhile
/// ([`writer::WriteLock::pause_background`]); see `checkpoint_round` and docs/performance.md,
/// "SQLite WAL checkpoints".
pub(crate) async fn checkpoint(pool: AnyPool, writer: AnyPool, lock: Arc<writer::WriteLock>) {
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
        let pause = || tokio::time::sleep(RESTART_PAUSE);
        if let Err(e) = checkpoint_round(&pool, &writer, &lock, file.as_deref(), RESTART_FRAMES, pause).await {
            if pool.is_closed() {
                return;
            }
            tracing::warn!(error = %e, "checkpointing the SQLite WAL failed; trying again");
        }
    }
}

/// One round of [`checkpoint`], restarting the WAL past `restart_past` frames
/// ([`RESTART_FRAMES`]; a test gives fewer) after flushing the database `file` (none in memory).
/// `between_tries` runs each time a restart gave up because a reader is on the WAL's frames,
/// before the next try: [`RESTART_PAUSE`] of sleep (a test ends its reader there instead).
/// Fails only when its `PASSIVE` copy fails.
async fn checkpoint_round<F: Future<Output = ()>>(
    pool: &AnyPool,
    writer: &AnyPool,
    lock: &writer::WriteLock,
    file: Option<&std::path::Path>,
    restart_past: i64,
    between_tries: impl Fn() -> F,
) -> Result<()> {
    let (frames, done) = passive_checkpoint(pool).await?;
    if frames < restart_past {
        return Ok(());
    }
    // The restart flushes the database file holding the lock, and a `PASSIVE` round flushes it
    // only when it copies the WAL to its end, which under steady writes it never does: so the
    // restart flushed everything the rounds had copied since the last restart, 60–140 MB,
    // 50–100 ms of every writer's wait. Here, before the
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
    // hold is every writer's wait.
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
            Ok(false) if tries < RESTART_TRIES && !lock.requests_waiting() => between_tries().await,
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
pub(crate) fn is_sqlite_busy(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("5"))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// The moment of figure e where SQLite never starts the WAL over by itself (docs/performance.md,
    /// "SQLite WAL checkpoints"): after each write a reader begins on the WAL's frames (the
    /// outbox's consumers, woken by the commit), the round copies them all, and the next write
    /// comes while that reader is still open. SQLite tries its restart only at the first write
    /// after a full copy, and a reader on the frames makes it give up; so with `cap` out of
    /// reach the WAL only grows. Past `cap` the round holds the write lock and tries again while
    /// the reader finishes, as reads do. Each step happens in sequence, not by timing: the reader
    /// of a write ends when the round's restart gives up on it (the round's `between_tries`), or
    /// else after the next write. Returns the WAL's frames after each round and how many
    /// restarts gave up on a reader.
    async fn wal_frames_under_readers_after_every_write(cap: i64) -> (Vec<i64>, usize) {
        let scratch = Scratch::new(8).await;
        let (readers, writer) = (&scratch.readers, &scratch.writer);
        let lock = writer::WriteLock::default();
        sqlx::query("CREATE TABLE t (x INTEGER, pad TEXT)").execute(writer).await.expect("create");
        let reading: tokio::sync::Mutex<Option<sqlx::Transaction<'static, sqlx::Any>>> = Default::default();
        let gave_up = std::sync::atomic::AtomicUsize::new(0);
        let end_reader = || async {
            if let Some(read) = reading.lock().await.take() {
                read.rollback().await.expect("end read");
            }
        };
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
            // The reader before it, when the last round left it on, is done after this write,
            // so the round copies every frame; this one stays on them.
            end_reader().await;
            *reading.lock().await = Some(read);
            let between_tries = || async {
                gave_up.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                end_reader().await;
            };
            checkpoint_round(readers, writer, &lock, Some(&scratch.path), cap, between_tries).await.expect("round");
            frames.push(scratch.wal_frames().await);
        }
        end_reader().await;
        scratch.remove().await;
        (frames, gave_up.into_inner())
    }

    #[tokio::test]
    async fn the_checkpoint_starts_over_a_wal_that_a_reader_is_always_on() {
        let cap = 60;
        let (frames, gave_up) = wal_frames_under_readers_after_every_write(cap).await;
        let restarts = frames.windows(2).filter(|w| w[1] < w[0]).count();
        let most = frames.iter().copied().max().unwrap_or(0);
        // Never started over, the WAL holds every write's frames: 300 and more after 100 writes.
        assert!(
            restarts >= 2 && most < 3 * cap,
            "the WAL was started over past {cap} frames: {restarts} restarts, {most} frames at most ({frames:?})"
        );
        assert!(gave_up >= restarts, "each restart first found the reader on the WAL: {gave_up} gave up, {restarts} restarts");
    }

    #[tokio::test]
    async fn without_a_bound_a_wal_that_a_reader_is_always_on_only_grows() {
        let (frames, gave_up) = wal_frames_under_readers_after_every_write(i64::MAX).await;
        let restarts = frames.windows(2).filter(|w| w[1] < w[0]).count();
        let most = frames.iter().copied().max().unwrap_or(0);
        assert!(
            restarts == 0 && gave_up == 0 && most >= 300,
            "SQLite never started the WAL over by itself: {restarts} restarts, {most} frames at most ({frames:?})"
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
}
