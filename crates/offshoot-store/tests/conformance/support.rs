//! The harness: one fresh database per test on the backend named by `OFFSHOOT_TEST_BACKEND`
//! (`sqlite`, the default, or `postgres`), and small builders shared by the tests.

use offshoot_core::model::{Audience, Channel, NewMessage, OutboxEvent, User, Viewer};
use offshoot_core::{Error, ErrorKind};
use offshoot_store::{MemberInput, NewChannel, Store, StoreError, UserInput};
use sqlx::{AssertSqlSafe, Connection};
use std::future::Future;
use std::path::PathBuf;

/// A fixed instant in the past (2023-11-14) from which seeded histories count, so their
/// `created_at` values are distinct, ordered and older than anything stamped with `now`.
pub const BASE_TS: i64 = 1_700_000_000_000_000_000;
/// One millisecond in nanoseconds.
pub const MS: i64 = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestBackend {
    Sqlite,
    Postgres,
}

pub fn test_backend() -> TestBackend {
    match std::env::var("OFFSHOOT_TEST_BACKEND").as_deref() {
        Err(_) | Ok("") | Ok("sqlite") => TestBackend::Sqlite,
        Ok("postgres") => TestBackend::Postgres,
        Ok(other) => panic!("OFFSHOOT_TEST_BACKEND={other:?}: use sqlite or postgres"),
    }
}

/// The first statement of a test that needs PostgreSQL. Such a test also carries
/// `#[ignore = "PostgreSQL only: …"]`, so a plain run on SQLite reports it as ignored, not
/// passed; the PostgreSQL pass runs it with `--include-ignored`. Run on SQLite anyway, it fails
/// here rather than passing without testing anything.
#[track_caller]
pub fn require_postgres(why: &str) {
    assert_eq!(test_backend(), TestBackend::Postgres, "PostgreSQL only ({why}): run it with OFFSHOOT_TEST_BACKEND=postgres");
}

fn pg_admin_url() -> String {
    std::env::var("OFFSHOOT_TEST_PG_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// `url` with its database name replaced by `db` (query parameters kept).
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let after_scheme = base.find("://").map(|i| i + 3).unwrap_or(0);
    let root = match base[after_scheme..].find('/') {
        Some(i) => &base[..after_scheme + i],
        None => base,
    };
    match query {
        Some(q) => format!("{root}/{db}?{q}"),
        None => format!("{root}/{db}"),
    }
}

/// A database of its own for one test.
pub struct TestDb {
    pub url: String,
    cleanup: Cleanup,
}

enum Cleanup {
    Sqlite(PathBuf),
    Postgres { admin_url: String, name: String },
}

static PG_CREATE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl TestDb {
    /// A fresh database on the backend under test.
    pub async fn new() -> TestDb {
        TestDb::on(test_backend()).await
    }

    /// A fresh database on `backend`, whichever backend is under test.
    pub async fn on(backend: TestBackend) -> TestDb {
        let id = uuid::Uuid::new_v4().simple().to_string();
        match backend {
            TestBackend::Sqlite => {
                let path = PathBuf::from(format!("/tmp/offshoot-store-{id}.db"));
                TestDb { url: format!("sqlite://{}?mode=rwc", path.display()), cleanup: Cleanup::Sqlite(path) }
            }
            TestBackend::Postgres => {
                let admin_url = pg_admin_url();
                let name = format!("offshoot_s_{id}");
                // `CREATE DATABASE` copies `template1` and fails while another session uses it
                // ("source database is being accessed by other users"): the tests of this
                // process create their databases one at a time, and a creation racing another
                // process (the e2e suite, a second run) is tried again a bounded number of times.
                let _one_at_a_time = PG_CREATE.lock().await;
                let mut conn = sqlx::PgConnection::connect(&admin_url)
                    .await
                    .unwrap_or_else(|e| panic!("cannot connect to PostgreSQL at {admin_url} (OFFSHOOT_TEST_PG_URL): {e}"));
                let mut attempt = 0;
                loop {
                    match sqlx::raw_sql(AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await {
                        Ok(_) => break,
                        Err(e) if attempt < 50 && e.to_string().contains("being accessed by other users") => {
                            attempt += 1;
                            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        }
                        Err(e) => panic!("CREATE DATABASE {name}: {e}"),
                    }
                }
                // A throw-away database needs no durability: commits need not wait for the WAL
                // flush. Nothing a test can observe changes, only the time the suite takes.
                sqlx::raw_sql(AssertSqlSafe(format!("ALTER DATABASE {name} SET synchronous_commit = off")))
                    .execute(&mut conn)
                    .await
                    .expect("configure the test database");
                conn.close().await.ok();
                TestDb { url: with_database(&admin_url, &name), cleanup: Cleanup::Postgres { admin_url, name } }
            }
        }
    }

    /// Best effort: a leftover database is harmless, a failing cleanup must not hide the
    /// test's own outcome.
    pub async fn remove(self) {
        match self.cleanup {
            Cleanup::Sqlite(path) => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
            }
            Cleanup::Postgres { admin_url, name } => {
                if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url).await {
                    let _ = sqlx::raw_sql(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))).execute(&mut conn).await;
                    let _ = conn.close().await;
                }
            }
        }
    }
}

/// What a test body gets: a migrated store on a fresh database, and that database's URL.
#[derive(Clone)]
pub struct Ctx {
    pub store: Store,
    pub url: String,
}

/// Runs `body` against a fresh, migrated database and removes the database afterwards, also
/// when the body panics (the panic is re-raised after the cleanup).
pub async fn with_store<F, Fut>(body: F)
where
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let db = TestDb::new().await;
    let store = Store::connect(&db.url).await.expect("connect and migrate a fresh database");
    let outcome = tokio::spawn(body(Ctx { store: store.clone(), url: db.url.clone() })).await;
    store.close().await;
    db.remove().await;
    if let Err(e) = outcome {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
        panic!("the test body was cancelled: {e}");
    }
}

/// Runs `store`'s notification relay (as a process does) until the returned sender is used
/// or dropped; the handle ends when the relay has stopped.
pub fn spawn_relay(store: &Store) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let store = store.clone();
    let relay = tokio::spawn(async move {
        store
            .relay_notifications(async {
                let _ = stopped.await;
            })
            .await
    });
    (stop, relay)
}

// ---- races ----------------------------------------------------------------------------------

/// Runs `contender(store, i)` for `i` in `0..n` at the same moment, each on a store of its own
/// (its own connection pool, and on SQLite its own in-process write lock, as separate processes
/// would have) on the database at `url`: the contenders meet only in the database, so the test
/// exercises the database's locks and constraints, not the store's in-process serialisation.
/// Every store connects (and answers a ping) before a barrier releases all contenders at once.
/// Returns the results in contender order.
pub async fn race<T, F, Fut>(url: &str, n: usize, contender: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(Store, usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let mut stores = Vec::with_capacity(n);
    for _ in 0..n {
        let s = Store::connect(url).await.expect("connect a contender's store");
        s.ping().await.expect("ping");
        stores.push(s);
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(n));
    let tasks: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (barrier, work) = (barrier.clone(), contender(s.clone(), i));
            tokio::spawn(async move {
                barrier.wait().await;
                work.await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("a contender panicked"));
    }
    for s in stores {
        s.close().await;
    }
    out
}

// ---- builders -------------------------------------------------------------------------------

pub fn user(id: &str) -> User {
    User::placeholder(id, "user")
}

pub fn viewer(id: &str) -> Viewer {
    Viewer::User { id: id.to_string(), role: "user".into() }
}

pub fn user_input(id: &str) -> UserInput {
    UserInput { id: id.to_string(), name: Some(format!("{id} name")), ..Default::default() }
}

pub fn member(id: &str) -> MemberInput {
    MemberInput { user_id: id.to_string(), ..Default::default() }
}

/// A regular top-level message with a client-chosen id.
pub fn msg(id: &str, text: &str) -> NewMessage {
    NewMessage { id: id.to_string(), kind: "regular".into(), text: text.to_string(), ..Default::default() }
}

/// A regular top-level message stamped at `created_at` (server-side import).
pub fn msg_at(id: &str, text: &str, created_at: i64) -> NewMessage {
    NewMessage { created_at: Some(created_at), ..msg(id, text) }
}

/// A reply in the thread of `parent`.
pub fn reply(id: &str, parent: &str, text: &str) -> NewMessage {
    NewMessage { parent_id: Some(parent.to_string()), ..msg(id, text) }
}

pub fn reply_at(id: &str, parent: &str, text: &str, created_at: i64) -> NewMessage {
    NewMessage { created_at: Some(created_at), ..reply(id, parent, text) }
}

/// Upserts `members` (and the creator) and creates `type:id` with them.
pub async fn channel_of(store: &Store, kind: &str, id: &str, creator: &str, members: &[&str]) -> Channel {
    let mut inputs: Vec<UserInput> = members.iter().map(|m| user_input(m)).collect();
    if !members.contains(&creator) {
        inputs.push(user_input(creator));
    }
    store.upsert_users(&inputs).await.expect("upsert users");
    let new = NewChannel {
        kind: kind.to_string(),
        id: id.to_string(),
        created_by_id: Some(creator.to_string()),
        members: members.iter().map(|m| member(m)).collect(),
        ..Default::default()
    };
    let (ch, created) = store.create_channel(&new).await.expect("create channel");
    assert!(created, "channel {kind}:{id} should be new");
    ch
}

pub async fn agent_channel(store: &Store, id: &str, members: &[&str]) -> Channel {
    channel_of(store, "agent", id, "owner", members).await
}

/// Sends `n` top-level messages `{prefix}{i:05}` by `author`, 1 ms apart from `start`.
pub async fn seed(store: &Store, cid: &str, author: &str, prefix: &str, n: usize, start: i64) -> Vec<String> {
    let author = user(author);
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("{prefix}{i:05}");
        store.send_message(cid, &msg_at(&id, &format!("message {i}"), start + i as i64 * MS), &author).await.expect("send seeded message");
        ids.push(id);
    }
    ids
}

/// The channel's main list as the server sees it (up to 300), ids oldest first.
pub async fn ids_seen_by(store: &Store, cid: &str, viewer: &Viewer) -> Vec<String> {
    let ch = store.get_channel(cid).await.expect("get channel").expect("channel exists");
    let page = offshoot_store::Page { limit: 300, dir: offshoot_store::PageDir::Latest };
    store.channel_messages(&ch, viewer, &page).await.expect("channel messages").into_iter().map(|m| m.id).collect()
}

/// The domain error of a failed store call (panics on success or on a database error).
pub fn domain_err<T: std::fmt::Debug>(r: Result<T, StoreError>) -> Error {
    match r {
        Ok(v) => panic!("expected a domain error, got Ok({v:?})"),
        Err(StoreError::Domain(e)) => e,
        Err(e) => panic!("expected a domain error, got {e:?}"),
    }
}

pub fn assert_kind<T: std::fmt::Debug>(r: Result<T, StoreError>, kind: ErrorKind) -> Error {
    let e = domain_err(r);
    assert_eq!(e.kind, kind, "unexpected error: {e}");
    e
}

/// Outbox events after `seq`, oldest first (all of them, in pages of 500).
pub async fn events_since(store: &Store, mut seq: i64) -> Vec<OutboxEvent> {
    let mut out = Vec::new();
    loop {
        let page = store.events_after(seq, 500).await.expect("events_after");
        let Some(last) = page.last() else { return out };
        seq = last.seq;
        out.extend(page.iter().map(|e| OutboxEvent::clone(e)));
    }
}

pub fn kinds(events: &[OutboxEvent]) -> Vec<String> {
    events.iter().map(|e| e.event.kind.clone()).collect()
}

pub fn watchers_and_hooks(cid: &str) -> Audience {
    Audience { watchers_of: Some(cid.to_string()), users: Vec::new(), webhooks: true, ..Default::default() }
}

#[test]
fn with_database_replaces_only_the_database_name() {
    assert_eq!(with_database("postgres://u@h:5432/postgres", "x"), "postgres://u@h:5432/x");
    assert_eq!(with_database("postgres://u@h:5432/ci_db?sslmode=disable", "x"), "postgres://u@h:5432/x?sslmode=disable");
    assert_eq!(with_database("postgres://u@h", "x"), "postgres://u@h/x");
}
