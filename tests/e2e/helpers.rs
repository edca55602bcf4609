//! The harness: a real Offshoot server per test, on `127.0.0.1:0`, with a fresh database, driven
//! over HTTP like a client.
//!
//! - [`TestApp::spawn`] runs `offshoot::run` in-process on a runtime of its own (so a test's
//!   runtime ending never cuts the server off mid-transaction) and waits for `GET /healthz`.
//! - [`ServerProcess::start`] runs the real `offshoot` binary as a child process (the crash test
//!   kills it with SIGKILL); [`binary_path`] builds it from the current sources first.
//! - The backend comes from `OFFSHOOT_TEST_BACKEND` (`sqlite`, the default, or `postgres` with
//!   `OFFSHOOT_TEST_PG_URL`); every [`TestDb`] is a new database, removed when the last server
//!   using it is gone.

#![allow(dead_code)]

use futures_util::stream::{self, StreamExt};
use offshoot_core::token::{sign, Claims};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

pub const API_KEY: &str = "e2e-test-key";
pub const API_SECRET: &str = "e2e-test-secret-7f3a9c0d2b1e4f6a8c5d";

/// The rate limits of every test server unless a test sets its own: every number far above
/// what any test sends, so the limiting layer runs (and stamps its headers) without refusing;
/// the rate-limit tests start servers with low limits.
pub const TEST_RATE_LIMITS: &str = "*=1000000,user=1000000";
/// WebSocket caps of every test server unless a test sets its own.
pub const TEST_WS_CONNECTIONS_PER_USER: usize = 100_000;
pub const TEST_WS_CLIENT_EVENTS_PER_MINUTE: u32 = 1_000_000;

/// How long a test waits for something the server does in the background.
pub const WAIT: Duration = Duration::from_secs(60);

/// The most pages a paging loop reads before it counts as endless.
pub const MAX_PAGES: usize = 1000;

// ---------------------------------------------------------------------------------------------
// Databases

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub fn backend() -> Backend {
    match std::env::var("OFFSHOOT_TEST_BACKEND").ok().as_deref().map(str::trim) {
        None | Some("") | Some("sqlite") => Backend::Sqlite,
        Some("postgres") | Some("postgresql") | Some("pg") => Backend::Postgres,
        Some(other) => panic!("OFFSHOOT_TEST_BACKEND={other:?}: use sqlite or postgres"),
    }
}

/// The first statement of a test that needs PostgreSQL (several processes on one database).
/// Such a test also carries `#[ignore = "PostgreSQL only: …"]`, so a plain run on SQLite reports
/// it as ignored, not passed; the PostgreSQL pass runs it with `--include-ignored`. Run on
/// SQLite anyway, it fails here rather than passing without testing anything.
#[track_caller]
pub fn require_postgres(why: &str) {
    assert_eq!(backend(), Backend::Postgres, "PostgreSQL only ({why}): run it with OFFSHOOT_TEST_BACKEND=postgres");
}

/// `admin_url` with its database name replaced by `name` (query parameters kept).
fn database_url(admin_url: &str, name: &str) -> String {
    let after_scheme = admin_url.find("://").map(|i| i + 3).unwrap_or(0);
    let (base, query) = match admin_url.find('?') {
        Some(q) => (&admin_url[..q], &admin_url[q..]),
        None => (admin_url, ""),
    };
    let host_end = base[after_scheme..].find('/').map(|i| i + after_scheme).unwrap_or(base.len());
    format!("{}/{name}{query}", &base[..host_end])
}

fn pg_admin_url() -> String {
    std::env::var("OFFSHOOT_TEST_PG_URL")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A database of its own for one test. Dropped best-effort when the last holder lets go.
pub struct TestDb {
    pub url: String,
    cleanup: Cleanup,
}

enum Cleanup {
    File(PathBuf),
    Postgres { admin_url: String, name: String },
}

/// `CREATE DATABASE` statements racing on `template1` fail ("being accessed by other users");
/// tests create their databases one at a time.
static PG_CREATE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl TestDb {
    pub async fn create() -> Arc<TestDb> {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        match backend() {
            Backend::Sqlite => {
                let path = PathBuf::from(format!("/tmp/offshoot-test-{suffix}.db"));
                Arc::new(TestDb { url: format!("sqlite://{}?mode=rwc", path.display()), cleanup: Cleanup::File(path) })
            }
            Backend::Postgres => {
                use sqlx::Connection;
                let admin_url = pg_admin_url();
                let name = format!("offshoot_t_{suffix}");
                let _one_at_a_time = PG_CREATE.lock().await;
                let mut conn = sqlx::PgConnection::connect(&admin_url)
                    .await
                    .unwrap_or_else(|e| panic!("connecting to PostgreSQL at {admin_url} (OFFSHOOT_TEST_PG_URL): {e}"));
                // Another process creating a database at the same time makes PostgreSQL refuse
                // ("template1 is being accessed by other users"): try again, a bounded number of times.
                let mut attempt = 0;
                loop {
                    match sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await {
                        Ok(_) => break,
                        Err(e) if attempt < 20 && e.to_string().contains("being accessed by other users") => {
                            attempt += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => panic!("CREATE DATABASE {name}: {e}"),
                    }
                }
                let _ = conn.close().await;
                let url = database_url(&admin_url, &name);
                Arc::new(TestDb { url, cleanup: Cleanup::Postgres { admin_url, name } })
            }
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        match &self.cleanup {
            Cleanup::File(path) => {
                for ext in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{ext}", path.display()));
                }
            }
            Cleanup::Postgres { admin_url, name } => {
                // Drop may run inside a runtime: do the async work on a thread of its own.
                let (admin_url, name) = (admin_url.clone(), name.clone());
                let t = std::thread::spawn(move || {
                    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                        return;
                    };
                    rt.block_on(async move {
                        use sqlx::Connection;
                        if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url).await {
                            let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")))
                                .execute(&mut conn)
                                .await;
                            let _ = conn.close().await;
                        }
                    });
                });
                let _ = t.join();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tokens and time

pub fn server_claims() -> Claims {
    Claims::default()
}

pub fn user_claims(user_id: &str) -> Claims {
    let now = unix_secs();
    Claims { user_id: Some(user_id.into()), iat: Some(now - 5), exp: Some(now + 3600), ..Default::default() }
}

pub fn unix_secs() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock after 1970").as_secs() as i64
}

/// Unix nanoseconds, rounded to milliseconds.
pub fn now_ns() -> i64 {
    let ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock after 1970").as_nanos() as i64;
    ns - ns % 1_000_000
}

/// A time safely in the past (one day ago, whole milliseconds), for server-side `created_at`.
pub fn past_ns() -> i64 {
    now_ns() - 86_400_000_000_000
}

/// RFC 3339 for a request's `created_at`.
pub fn rfc3339(ns: i64) -> String {
    offshoot_core::time::to_rfc3339(ns)
}

/// Parses a legacy (RFC 3339) or v2 (nanoseconds) timestamp.
pub fn ts_of(v: &Value) -> i64 {
    offshoot_core::time::parse(v).unwrap_or_else(|| panic!("not a timestamp: {v}"))
}

/// The documented copy id formula, computed here independently of the server's code.
pub fn copy_id(fork_cid: &str, source_message_id: &str) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, format!("offshoot:fork:{fork_cid}:{source_message_id}").as_bytes()).to_string()
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

/// `agent:c1` → `/channels/agent/c1`.
pub fn channel_path(cid: &str) -> String {
    let (t, id) = cid.split_once(':').unwrap_or_else(|| panic!("{cid:?} is not a cid"));
    format!("/channels/{t}/{id}")
}

// ---------------------------------------------------------------------------------------------
// Responses

/// A response: status and JSON body (`Value::Null` when the body is empty or not JSON; the
/// raw text is then under `"_raw"`).
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub body: Value,
}

impl Resp {
    /// Panics with the body unless the status is 200; returns the body.
    #[track_caller]
    pub fn ok(self) -> Value {
        assert_eq!(self.status, 200, "expected 200, got {}: {}", self.status, self.body);
        assert!(self.body.get("duration").and_then(Value::as_str).is_some(), "a success body carries duration: {}", self.body);
        self.body
    }

    /// Asserts Stream's error envelope with this HTTP status and code; returns the body.
    #[track_caller]
    pub fn err(self, status: u16, code: i64) -> Value {
        assert_eq!(self.status, status, "expected HTTP {status}, got {}: {}", self.status, self.body);
        assert_error_envelope(&self.body);
        assert_eq!(self.body["code"], json!(code), "expected code {code}: {}", self.body);
        assert_eq!(self.body["StatusCode"], json!(status), "StatusCode mirrors the HTTP status: {}", self.body);
        self.body
    }

    /// Like [`Resp::err`], and `exception_fields.reason` is `reason`.
    #[track_caller]
    pub fn err_reason(self, status: u16, code: i64, reason: &str) -> Value {
        let body = self.err(status, code);
        assert_eq!(body["exception_fields"]["reason"], json!(reason), "expected reason {reason:?}: {body}");
        body
    }
}

/// Every error body has `code, message, StatusCode, duration, more_info, details` (a list).
#[track_caller]
pub fn assert_error_envelope(body: &Value) {
    assert!(body["code"].is_i64(), "error code is an integer: {body}");
    assert!(body["message"].is_string(), "error message is a string: {body}");
    assert!(body["StatusCode"].is_i64(), "StatusCode is an integer: {body}");
    assert!(body["duration"].is_string(), "duration is a string: {body}");
    assert!(body["more_info"].is_string(), "more_info is a string: {body}");
    assert!(body["details"].is_array(), "details is a list: {body}");
    if let Some(f) = body.get("exception_fields") {
        assert!(f.is_object() && f.as_object().unwrap().values().all(Value::is_string), "exception_fields maps strings to strings: {body}");
    }
}

pub fn ids(messages: &Value) -> Vec<String> {
    messages
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {messages}"))
        .iter()
        .map(|m| m["id"].as_str().expect("message id").to_string())
        .collect()
}

pub fn member_ids(state: &Value) -> Vec<String> {
    let mut v: Vec<String> =
        state["members"].as_array().expect("members").iter().map(|m| m["user_id"].as_str().expect("user_id").to_string()).collect();
    v.sort();
    v
}

// ---------------------------------------------------------------------------------------------
// The HTTP client, for any running server

#[derive(Clone)]
pub struct Client {
    pub base: String,
    pub http: reqwest::Client,
    pub api_key: String,
    pub api_secret: String,
}

impl Client {
    pub fn new(base: String) -> Client {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).pool_max_idle_per_host(64).build().expect("http client");
        Client { base, http, api_key: API_KEY.into(), api_secret: API_SECRET.into() }
    }

    pub fn token(&self, claims: &Claims) -> String {
        sign(claims, &self.api_secret)
    }

    /// getstream 7's server token: `{}`.
    pub fn server(&self) -> String {
        self.token(&server_claims())
    }

    /// JS / stream-chat's server token: `{"server": true}`.
    pub fn server_flag(&self) -> String {
        self.token(&Claims { server: Some(true), ..Default::default() })
    }

    pub fn user(&self, user_id: &str) -> String {
        self.token(&user_claims(user_id))
    }

    /// The URL of `path` with `api_key` added.
    pub fn url(&self, path: &str) -> String {
        let sep = if path.contains('?') { '&' } else { '?' };
        format!("{}{path}{sep}api_key={}", self.base, self.api_key)
    }

    /// A request with Stream's headers (`Authorization: <jwt>`, `stream-auth-type: jwt`).
    pub fn request(&self, method: reqwest::Method, path: &str, token: &str) -> reqwest::RequestBuilder {
        self.http.request(method, self.url(path)).header("Authorization", token).header("stream-auth-type", "jwt")
    }

    pub async fn send(&self, rb: reqwest::RequestBuilder) -> Resp {
        let resp = rb.send().await.expect("the server answers");
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.expect("a response body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| json!({"_raw": String::from_utf8_lossy(&bytes)}))
        };
        Resp { status, body }
    }

    pub async fn call(&self, method: reqwest::Method, path: &str, token: &str, body: Option<Value>) -> Resp {
        let mut rb = self.request(method, path, token);
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        self.send(rb).await
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> Resp {
        self.call(reqwest::Method::POST, path, token, Some(body)).await
    }
    pub async fn put(&self, path: &str, token: &str, body: Value) -> Resp {
        self.call(reqwest::Method::PUT, path, token, Some(body)).await
    }
    pub async fn patch(&self, path: &str, token: &str, body: Value) -> Resp {
        self.call(reqwest::Method::PATCH, path, token, Some(body)).await
    }
    pub async fn get(&self, path: &str, token: &str) -> Resp {
        self.call(reqwest::Method::GET, path, token, None).await
    }
    pub async fn delete(&self, path: &str, token: &str) -> Resp {
        self.call(reqwest::Method::DELETE, path, token, None).await
    }

    /// Waits (bounded) for `GET /healthz` to answer 200. `alive` says whether the server is
    /// still running, so a server that failed to start is reported at once.
    pub async fn wait_healthy(&self, mut alive: impl FnMut() -> Result<(), String>) {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(r) = self.http.get(format!("{}/healthz", self.base)).timeout(Duration::from_secs(2)).send().await {
                if r.status().as_u16() == 200 {
                    return;
                }
            }
            if let Err(e) = alive() {
                panic!("the server stopped before it was healthy: {e}");
            }
            assert!(Instant::now() < deadline, "GET /healthz did not answer 200 within {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // --- users, channels, messages (server-side) ----------------------------------------------

    /// Upserts users with role `user` (100 per request, Stream's limit).
    pub async fn users(&self, ids: &[&str]) {
        for chunk in ids.chunks(100) {
            let users: Map<String, Value> = chunk.iter().map(|id| (id.to_string(), json!({"id": id}))).collect();
            self.post("/users", &self.server(), json!({ "users": users })).await.ok();
        }
    }

    pub async fn user_with_role(&self, id: &str, role: &str) {
        self.post("/users", &self.server(), json!({"users": {id: {"id": id, "role": role}}})).await.ok();
    }

    /// Get-or-create `cid` (server-side) created by `creator` with `members`; returns the state.
    pub async fn channel(&self, cid: &str, creator: &str, members: &[&str]) -> Value {
        self.channel_with(cid, json!({"created_by_id": creator, "members": members})).await
    }

    pub async fn channel_with(&self, cid: &str, data: Value) -> Value {
        self.post(&format!("{}/query", channel_path(cid)), &self.server(), json!({"data": data, "state": true})).await.ok()
    }

    /// The channel state as the server sees it, with up to `limit` messages.
    pub async fn state(&self, cid: &str, limit: i64) -> Value {
        self.post(&format!("{}/query", channel_path(cid)), &self.server(), json!({"state": true, "messages": {"limit": limit}})).await.ok()
    }

    /// Every message of the channel's main list as the server sees it, oldest first.
    ///
    /// Bounded: a server that ignored `id_lt` would answer the same page for ever; a page that
    /// repeats a message, or more than [`MAX_PAGES`] pages, fails the test instead of hanging it.
    pub async fn all_messages(&self, cid: &str) -> Vec<Value> {
        let mut out: Vec<Value> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut before: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut page = json!({"limit": 300});
            if let Some(b) = &before {
                page["id_lt"] = json!(b);
            }
            let st =
                self.post(&format!("{}/query", channel_path(cid)), &self.server(), json!({"state": true, "messages": page})).await.ok();
            let msgs = st["messages"].as_array().expect("messages").clone();
            if msgs.is_empty() {
                return out;
            }
            for m in &msgs {
                let id = m["id"].as_str().expect("id").to_string();
                assert!(seen.insert(id.clone()), "paging {cid} with id_lt={before:?} returned {id} again");
            }
            before = Some(msgs[0]["id"].as_str().expect("id").to_string());
            let n = msgs.len();
            out.splice(0..0, msgs);
            if n < 300 {
                return out;
            }
        }
        panic!("{cid} has more than {MAX_PAGES} pages of messages: paging does not end")
    }

    /// Sends `message` (a message object; `user_id` must be in it) server-side; returns the
    /// message as stored.
    pub async fn send_message(&self, cid: &str, message: Value) -> Value {
        self.post(&format!("{}/message", channel_path(cid)), &self.server(), json!({ "message": message })).await.ok()["message"].clone()
    }

    /// Sends a text message; returns its id.
    pub async fn say(&self, cid: &str, user: &str, text: &str) -> String {
        self.send_message(cid, json!({"text": text, "user_id": user})).await["id"].as_str().expect("id").to_string()
    }

    /// Sends a message with a chosen id and server-side `created_at`.
    pub async fn say_at(&self, cid: &str, user: &str, id: &str, at_ns: i64) -> String {
        self.send_message(cid, json!({"id": id, "text": format!("text of {id}"), "user_id": user, "created_at": rfc3339(at_ns)})).await
            ["id"]
            .as_str()
            .expect("id")
            .to_string()
    }

    /// A reply (not shown in the channel) with a chosen id and `created_at`.
    pub async fn reply_at(&self, cid: &str, user: &str, parent: &str, id: &str, at_ns: i64) -> String {
        self.send_message(
            cid,
            json!({"id": id, "text": format!("reply {id}"), "user_id": user, "parent_id": parent, "created_at": rfc3339(at_ns)}),
        )
        .await["id"]
            .as_str()
            .expect("id")
            .to_string()
    }

    /// `n` top-level messages `{prefix}-{i:05}` one millisecond apart from `start_ns`, sent
    /// `concurrency` at a time; returns their ids oldest first.
    pub async fn seed(&self, cid: &str, user: &str, prefix: &str, n: usize, start_ns: i64, concurrency: usize) -> Vec<String> {
        let ids: Vec<String> = (0..n).map(|i| format!("{prefix}-{i:05}")).collect();
        let messages = ids
            .iter()
            .enumerate()
            .map(|(i, id)| json!({"id": id, "text": format!("message {i}"), "user_id": user, "created_at": rfc3339(start_ns + i as i64 * 1_000_000)}))
            .collect();
        self.send_many(cid, messages, concurrency).await;
        ids
    }

    /// Sends every message of `messages` (message objects with `user_id`) server-side,
    /// `concurrency` at a time; panics on the first failure.
    pub async fn send_many(&self, cid: &str, messages: Vec<Value>, concurrency: usize) {
        let path = format!("{}/message", channel_path(cid));
        let token = self.server();
        let results: Vec<Resp> = stream::iter(messages.into_iter().map(|m| {
            let (path, token) = (path.clone(), token.clone());
            async move { self.post(&path, &token, json!({ "message": m })).await }
        }))
        .buffer_unordered(concurrency)
        .collect()
        .await;
        for r in results {
            r.ok();
        }
    }

    pub async fn rewind(&self, cid: &str, message_id: &str, expected_last: &str, inclusive: bool) -> Resp {
        self.post(
            &format!("{}/rewind", channel_path(cid)),
            &self.server(),
            json!({"message_id": message_id, "expected_last_message_id": expected_last, "inclusive": inclusive}),
        )
        .await
    }

    // --- fork ---------------------------------------------------------------------------------

    /// `POST {source}/fork` server-side with `message_id` and `channel.id`.
    pub async fn fork(&self, source_cid: &str, message_id: &str, target_id: &str) -> Resp {
        self.fork_with(source_cid, json!({"message_id": message_id, "channel": {"id": target_id}})).await
    }

    pub async fn fork_with(&self, source_cid: &str, body: Value) -> Resp {
        self.post(&format!("{}/fork", channel_path(source_cid)), &self.server(), body).await
    }

    /// The fork summary of `cid` (`channel.fork`) as a channel query shows it.
    pub async fn fork_summary(&self, cid: &str) -> Value {
        self.state(cid, 1).await["channel"]["fork"].clone()
    }

    /// Waits (bounded) until the fork `cid` is no longer backfilling; returns its summary.
    pub async fn wait_fork_finished(&self, cid: &str) -> Value {
        self.wait_fork_finished_within(cid, WAIT).await
    }

    pub async fn wait_fork_finished_within(&self, cid: &str, wait: Duration) -> Value {
        let deadline = Instant::now() + wait;
        loop {
            let f = self.fork_summary(cid).await;
            assert!(f.is_object(), "{cid} is not a fork: {f}");
            if f["status"] != json!("backfilling") {
                return f;
            }
            assert!(Instant::now() < deadline, "fork {cid} still backfilling after {wait:?}: {f}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn lookup(&self, fork_cid: &str, token: &str, source_ids: &[String]) -> Resp {
        self.post(&format!("{}/fork/message_ids", channel_path(fork_cid)), token, json!({"source_message_ids": source_ids})).await
    }
}

// ---------------------------------------------------------------------------------------------
// In-process server

pub struct TestApp {
    pub client: Client,
    pub db: Arc<TestDb>,
    shutdown: CancellationToken,
    done: mpsc::Receiver<()>,
}

impl std::ops::Deref for TestApp {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl TestApp {
    /// A server with every role on a fresh database.
    pub async fn spawn() -> TestApp {
        Self::spawn_with(|_| {}).await
    }

    /// A server on a fresh database with a configuration adjusted by `tweak`.
    pub async fn spawn_with(tweak: impl FnOnce(&mut offshoot::Config)) -> TestApp {
        let db = TestDb::create().await;
        Self::spawn_on(db, tweak).await
    }

    /// A fork whose backfill does not start until [`TestApp::start_worker`]: every role but the
    /// worker.
    pub async fn spawn_without_worker() -> TestApp {
        Self::spawn_with(|c| c.roles = offshoot::Roles { api: true, ws: true, worker: false }).await
    }

    /// Another server on the same database running only the worker role (it lives as long as
    /// the returned value).
    pub async fn start_worker(&self) -> TestApp {
        Self::spawn_on(self.db.clone(), |c| c.roles = offshoot::Roles { api: false, ws: false, worker: true }).await
    }

    /// With `OFFSHOOT_TEST_LOG=<file>`, the in-process servers log to that file (filtered by
    /// `RUST_LOG`, `debug` by default): to read what a server did in a failure that does not
    /// reproduce in isolation. Off by default: the suite's output stays the tests' own.
    fn log_to_file_if_asked() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            let Some(path) = std::env::var_os("OFFSHOOT_TEST_LOG") else { return };
            let file = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("OFFSHOOT_TEST_LOG file");
            let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "debug".into());
            let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_writer(std::sync::Mutex::new(file)).try_init();
        });
    }

    /// A server on `db` (shared with other servers of the same test).
    pub async fn spawn_on(db: Arc<TestDb>, tweak: impl FnOnce(&mut offshoot::Config)) -> TestApp {
        Self::log_to_file_if_asked();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener.set_nonblocking(true).expect("non-blocking listener");
        let addr = listener.local_addr().expect("local addr");
        let mut config = offshoot::Config {
            listen: addr.to_string(),
            database_url: db.url.clone(),
            api_key: Some(API_KEY.into()),
            api_secret: Some(API_SECRET.into()),
            worker_poll_interval: Duration::from_millis(200),
            rate_limits: offshoot::RateLimitConfig::parse(TEST_RATE_LIMITS).expect("the test limits parse"),
            ws_connections_per_user: TEST_WS_CONNECTIONS_PER_USER,
            ws_client_events_per_minute: TEST_WS_CLIENT_EVENTS_PER_MINUTE,
            storage: Some(format!("file://{}", std::env::temp_dir().join("offshoot-e2e-files").display())),
            ..offshoot::Config::default()
        };
        tweak(&mut config);
        let shutdown = CancellationToken::new();
        let (done_tx, done) = mpsc::channel();
        let (err_tx, err_rx) = mpsc::channel::<String>();
        let (s, db_held) = (shutdown.clone(), db.clone());
        std::thread::Builder::new()
            .name(format!("offshoot-{}", addr.port()))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("server runtime");
                let result = rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                    offshoot::run(listener, config, s).await
                });
                drop(rt);
                if let Err(e) = result {
                    let _ = err_tx.send(format!("{e:#}"));
                }
                drop(db_held);
                let _ = done_tx.send(());
            })
            .expect("server thread");
        let client = Client::new(format!("http://{addr}"));
        client
            .wait_healthy(|| match err_rx.try_recv() {
                Ok(e) => Err(e),
                Err(mpsc::TryRecvError::Empty) => Ok(()),
                Err(mpsc::TryRecvError::Disconnected) => Err("the server thread ended".into()),
            })
            .await;
        TestApp { client, db, shutdown, done }
    }
}

impl TestApp {
    /// Starts the graceful shutdown (what SIGTERM does to the binary) without waiting for it;
    /// dropping the app then waits for the server to stop.
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
        // Bounded: the server drains and stops its roles within its own bound.
        let _ = self.done.recv_timeout(Duration::from_secs(30));
    }
}

// ---------------------------------------------------------------------------------------------
// The real binary, as a child process

/// The `offshoot` binary next to the test executable's directory (`target/debug/offshoot`),
/// built from the current sources by the first test that asks for it. `cargo test` alone does
/// not rebuild a binary the test crate does not link, so a test that only checked the file
/// existed could run an old build; `cargo build` is a no-op when the binary is current.
pub fn binary_path() -> PathBuf {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_binary).clone().unwrap_or_else(|e| panic!("{e}"))
}

fn build_binary() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    let dir = exe.parent().and_then(|deps| deps.parent()).ok_or("the test executable is not in target/<profile>/deps")?;
    let target_dir = dir.parent().ok_or("target/<profile> has no parent")?;
    let profile = dir.file_name().and_then(|p| p.to_str()).ok_or("target/<profile>")?;
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = std::process::Command::new(&cargo);
    cmd.args(["build", "--quiet", "-p", "offshoot", "--manifest-path"]).arg(&manifest).arg("--target-dir").arg(target_dir);
    if profile == "release" {
        cmd.arg("--release");
    } else if profile != "debug" {
        cmd.args(["--profile", profile]);
    }
    let status = cmd.status().map_err(|e| format!("running {cargo} build -p offshoot: {e}"))?;
    if !status.success() {
        return Err(format!("`cargo build -p offshoot` failed ({status}): the process tests need the current binary"));
    }
    let bin = dir.join("offshoot");
    if !bin.exists() {
        return Err(format!("{} is missing after `cargo build -p offshoot`", bin.display()));
    }
    Ok(bin)
}

pub struct ServerProcess {
    pub client: Client,
    child: std::process::Child,
    pub log: PathBuf,
}

impl std::ops::Deref for ServerProcess {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl ServerProcess {
    /// Starts `offshoot serve` on `db` on a free port with `env` added; waits for healthz.
    pub async fn start(db: &TestDb, env: &[(&str, &str)]) -> ServerProcess {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            l.local_addr().expect("addr").port()
        };
        let log = PathBuf::from(format!("/tmp/offshoot-test-{}.log", uuid::Uuid::new_v4().simple()));
        let log_file = std::fs::File::create(&log).expect("log file");
        let mut cmd = std::process::Command::new(binary_path());
        cmd.arg("serve")
            .env("DATABASE_URL", &db.url)
            .env("OFFSHOOT_LISTEN", format!("127.0.0.1:{port}"))
            .env("OFFSHOOT_API_KEY", API_KEY)
            .env("OFFSHOOT_API_SECRET", API_SECRET)
            .env("RUST_LOG", "warn")
            .env("OFFSHOOT_RATE_LIMITS", TEST_RATE_LIMITS)
            .env("OFFSHOOT_WS_CONNECTIONS_PER_USER", TEST_WS_CONNECTIONS_PER_USER.to_string())
            .env("OFFSHOOT_WS_CLIENT_EVENTS_PER_MINUTE", TEST_WS_CLIENT_EVENTS_PER_MINUTE.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(log_file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawning the offshoot binary");
        let client = Client::new(format!("http://127.0.0.1:{port}"));
        let log2 = log.clone();
        client
            .wait_healthy(|| match child.try_wait() {
                Ok(None) => Ok(()),
                Ok(Some(status)) => Err(format!("exited with {status}; log: {}", std::fs::read_to_string(&log2).unwrap_or_default())),
                Err(e) => Err(e.to_string()),
            })
            .await;
        ServerProcess { client, child, log }
    }

    /// SIGTERM, then waits (bounded) for the process to exit; returns its exit status.
    pub async fn terminate(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        self.sigterm();
        self.wait_exit(within).await
    }

    /// Sends SIGTERM (the graceful shutdown) without waiting.
    pub fn sigterm(&self) {
        let pid = self.child.id().to_string();
        let sent = std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("running kill");
        assert!(sent.success(), "kill -TERM {pid} failed");
    }

    /// Waits (bounded) for the process to exit; returns its exit status.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no graceful shutdown, no chance to finish a page.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.log);
    }
}
