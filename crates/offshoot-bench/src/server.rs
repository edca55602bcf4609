//! The databases the benchmark creates and drops, the server it starts (in a child process of
//! its own, so that its resident memory and its CPU profile are its own), and the HTTP client
//! that talks to it.

use crate::{Backend, API_KEY, API_SECRET};
use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, AssertSqlSafe, Executor};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_util::sync::CancellationToken;

/// How often the completion of a fork is polled (`GET /tasks/{id}`).
const POLL_INTERVAL: Duration = Duration::from_millis(5);
/// Give up on a fork that has not completed by then.
pub const COMPLETION_TIMEOUT: Duration = Duration::from_secs(600);
/// The line the child prints once it listens.
const READY: &str = "offshoot-bench server listening on ";

// ---------------------------------------------------------------------------------------------
// Databases

/// Where a benchmark database lives, so it can be removed afterwards.
pub enum Db {
    Sqlite { path: PathBuf },
    Postgres { admin_url: String, name: String },
}

impl Db {
    pub fn url(&self) -> String {
        match self {
            Db::Sqlite { path } => format!("sqlite://{}?mode=rwc", path.display()),
            Db::Postgres { admin_url, name } => with_database(admin_url, name),
        }
    }

    pub async fn create(backend: Backend, label: &str, pg_url: &str) -> Result<Db> {
        match backend {
            Backend::Sqlite => {
                let dir = std::env::temp_dir().join(format!("offshoot-bench-{}", std::process::id()));
                std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
                let path = dir.join(format!("{label}.db"));
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
                Ok(Db::Sqlite { path })
            }
            Backend::Postgres => {
                let name = format!("offshoot_bench_{}_{label}", std::process::id());
                let admin = connect(pg_url, 1).await?;
                admin.execute(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name}"))).await?;
                admin.execute(AssertSqlSafe(format!("CREATE DATABASE {name}"))).await?;
                admin.close().await;
                Ok(Db::Postgres { admin_url: pg_url.to_string(), name })
            }
        }
    }

    /// Drops the database, unless `OFFSHOOT_BENCH_KEEP_DB=1` asks to keep it for `EXPLAIN`
    /// (its name or path is then printed on stderr).
    pub async fn drop_it(self) {
        if std::env::var("OFFSHOOT_BENCH_KEEP_DB").is_ok_and(|v| v == "1") {
            match &self {
                Db::Sqlite { path } => eprintln!("kept the database {}", path.display()),
                Db::Postgres { name, .. } => eprintln!("kept the database {name}"),
            }
            return;
        }
        match self {
            Db::Sqlite { path } => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
                }
                if let Some(dir) = path.parent() {
                    let _ = std::fs::remove_dir(dir);
                }
            }
            Db::Postgres { admin_url, name } => {
                if let Ok(admin) = connect(&admin_url, 1).await {
                    let _ = admin.execute(AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))).await;
                    admin.close().await;
                }
            }
        }
    }
}

/// `url` with its database path replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let scheme_end = url.find("://").map(|i| i + 3).unwrap_or(0);
    let (head, rest) = url.split_at(scheme_end);
    let (authority, tail) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let query = tail.find('?').map(|i| &tail[i..]).unwrap_or("");
    format!("{head}{authority}/{name}{query}")
}

pub async fn connect(url: &str, max: u32) -> Result<AnyPool> {
    sqlx::any::install_default_drivers();
    let sqlite = url.starts_with("sqlite:");
    AnyPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(5))
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if sqlite {
                    // The same settings the server uses, so the floor is measured on equal terms.
                    conn.execute("PRAGMA busy_timeout = 15000").await?;
                    conn.execute("PRAGMA synchronous = NORMAL").await?;
                }
                Ok(())
            })
        })
        .connect(url)
        .await
        .with_context(|| format!("connecting to {}", redact(url)))
}

pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://…@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

pub async fn pg_reachable(url: &str) -> bool {
    match tokio::time::timeout(Duration::from_secs(5), connect(url, 1)).await {
        Ok(Ok(pool)) => {
            pool.close().await;
            true
        }
        _ => false,
    }
}

// ---------------------------------------------------------------------------------------------
// The server, in a child process

/// The child's side: `offshoot-bench serve DATABASE_URL ROLES MAX_WS` runs `offshoot::run` on
/// a loopback port, prints [`READY`] and the address, and stops when its standard input closes
/// (the parent went away or asked it to stop).
pub async fn serve_child(mut args: impl Iterator<Item = String>) -> Result<()> {
    let url = args.next().context("serve: the database URL")?;
    let roles = offshoot::Roles::parse(&args.next().context("serve: the roles")?)?;
    let max_ws: usize = args.next().context("serve: the WebSocket cap")?.parse()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    // The operator's settings from the environment (a page size or budget to try, say), with
    // what the benchmark itself decides on top.
    // Rate limits and the WebSocket caps only where the environment names them (the flood
    // figure): the other figures load the server far beyond Stream's default table.
    let from_env = offshoot::Config::from_env()?;
    let set = |name: &str| std::env::var_os(name).is_some();
    let config = offshoot::Config {
        listen: addr.to_string(),
        database_url: url,
        api_key: Some(API_KEY.into()),
        api_secret: Some(API_SECRET.into()),
        roles,
        max_ws_connections: max_ws,
        rate_limits: if set("OFFSHOOT_RATE_LIMITS") { from_env.rate_limits.clone() } else { offshoot::RateLimitConfig::off() },
        ws_connections_per_user: if set("OFFSHOOT_WS_CONNECTIONS_PER_USER") { from_env.ws_connections_per_user } else { usize::MAX },
        ws_client_events_per_minute: if set("OFFSHOOT_WS_CLIENT_EVENTS_PER_MINUTE") {
            from_env.ws_client_events_per_minute
        } else {
            u32::MAX
        },
        ..from_env
    };
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(offshoot::run(listener, config, shutdown.clone()));
    println!("{READY}{addr}");
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let mut stdin = BufReader::new(tokio::io::stdin());
        let mut line = String::new();
        while matches!(stdin.read_line(&mut line).await, Ok(n) if n > 0) {
            line.clear();
        }
        stop.cancel();
    });
    server.await?
}

/// A server started in a child process, and the benchmark's own connection to its database.
pub struct Server {
    pub api: Api,
    pub db: AnyPool,
    pub pid: u32,
    pub backend_name: String,
    child: tokio::process::Child,
}

impl Server {
    pub async fn start(url: &str, roles: &str, max_ws: usize) -> Result<Server> {
        Self::start_with(url, roles, max_ws, &[]).await
    }

    /// [`Server::start`] with settings of its own in the child's environment (the flood figure's
    /// rate limits).
    pub async fn start_with(url: &str, roles: &str, max_ws: usize, env: &[(&str, &str)]) -> Result<Server> {
        let exe = std::env::current_exe().context("the benchmark's own executable")?;
        let mut child = tokio::process::Command::new(exe)
            .args(["serve", url, roles, &max_ws.to_string()])
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("starting the server process")?;
        let pid = child.id().context("the server process has no id")?;
        let stdout = child.stdout.take().context("the server's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(addr) = line.strip_prefix(READY) {
                    return Ok(addr.to_string());
                }
            }
            bail!("the server process ended before it listened")
        })
        .await
        .context("the server process did not listen within 60 s")??;
        // Whatever else the child prints goes to our stdout.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                println!("  [server] {line}");
            }
        });
        let api = Api::new(format!("http://{addr}"))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = api.http.get(format!("{}/healthz", api.base)).send().await {
                if r.status().is_success() {
                    break;
                }
            }
            if let Ok(Some(status)) = child.try_wait() {
                bail!("the server stopped before it was ready: {status}");
            }
            ensure!(Instant::now() < deadline, "the server was not ready within 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The server has applied the migrations by now; the bench's own pool times the floor.
        let db = connect(url, 2).await?;
        let backend_name = if url.starts_with("postgres") { "PostgreSQL" } else { "SQLite" }.to_string();
        Ok(Server { api, db, pid, child, backend_name })
    }

    /// Closes the child's standard input (a graceful stop) and waits for it.
    pub async fn stop(mut self) -> Result<()> {
        self.db.close().await;
        drop(self.child.stdin.take());
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                ensure!(status.success(), "the server ended with {status}");
                Ok(())
            }
            Err(_) => {
                self.child.kill().await?;
                bail!("the server did not stop within 30 s of being asked")
            }
        }
    }

    /// The server process's resident memory in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> Option<u64> {
        procfs::process::Process::new(i32::try_from(self.pid).ok()?).ok()?.status().ok()?.vmrss
    }
}

/// The HTTP client: server-side calls with a server token, user calls with user tokens.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
    pub token: String,
}

pub fn sign(claims: &Value) -> Result<String> {
    let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    let key = jsonwebtoken::EncodingKey::from_secret(API_SECRET.as_bytes()).context("the signing key")?;
    Ok(jsonwebtoken::encode(&header, claims, &key)?)
}

pub fn user_token(user_id: &str) -> Result<String> {
    sign(&json!({"user_id": user_id}))
}

impl Api {
    /// The server's WebSocket address (`ws://…`).
    pub fn ws_base(&self) -> String {
        self.base.replacen("http", "ws", 1)
    }

    /// The fork's own state (`fork` of `POST /channels/agent/{target}/query`), which must say
    /// `completed`.
    pub async fn completed_fork(&self, target: &str) -> Result<Value> {
        let (state, _) =
            self.call(reqwest::Method::POST, &format!("/channels/agent/{target}/query"), Some(&json!({"state": false}))).await?;
        let summary = state["channel"]["fork"].clone();
        ensure!(summary["status"] == "completed", "the fork into {target} is not completed: {summary}");
        Ok(summary)
    }

    fn new(base: String) -> Result<Api> {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).pool_max_idle_per_host(4096).build()?;
        Ok(Api { base, http, token: sign(&json!({"server": true}))? })
    }

    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<(Value, Duration)> {
        self.call_as(&self.token, method, path, body).await
    }

    pub async fn call_as(&self, token: &str, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<(Value, Duration)> {
        let (value, to_last_byte, parse) = self.call_split(token, method, path, body).await?;
        Ok((value, to_last_byte + parse))
    }

    /// A call whose time is split in two: from sending the request to the last byte of the
    /// answer, and the client's parse of that answer into JSON after it.
    pub async fn call_split(
        &self,
        token: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(Value, Duration, Duration)> {
        let mut req = self.request(token, method, path);
        if let Some(b) = body {
            req = req.json(b);
        }
        let started = Instant::now();
        let resp = req.send().await.with_context(|| path.to_string())?;
        let status = resp.status();
        let bytes = resp.bytes().await.with_context(|| path.to_string())?;
        let to_last_byte = started.elapsed();
        let value: Value = serde_json::from_slice(&bytes).with_context(|| format!("{path}: the body is not JSON"))?;
        let parse = started.elapsed() - to_last_byte;
        ensure!(status.is_success(), "{path} answered {status}: {value}");
        Ok((value, to_last_byte, parse))
    }

    /// A request to the server as `token`, with the API key and auth type every call sends.
    fn request(&self, token: &str, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let url = format!("{}{path}", self.base);
        self.http.request(method, url).query(&[("api_key", API_KEY)]).header("Authorization", token).header("stream-auth-type", "jwt")
    }

    /// A call whose answer is only checked for success: the body is read, and parsed only to
    /// report a failure. For the agent streams' updates (figure e), whose answers are the whole
    /// message so far and are not used: the load generator shares the server's two cores.
    pub async fn call_unread(&self, method: reqwest::Method, path: &str, body: &impl serde::Serialize) -> Result<()> {
        let req = self.request(&self.token, method, path).json(body);
        let resp = req.send().await.with_context(|| path.to_string())?;
        let status = resp.status();
        let bytes = resp.bytes().await.with_context(|| path.to_string())?;
        ensure!(status.is_success(), "{path} answered {status}: {}", String::from_utf8_lossy(&bytes));
        Ok(())
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value> {
        Ok(self.call(reqwest::Method::POST, path, Some(body)).await?.0)
    }

    pub async fn fork(&self, source_id: &str, message_id: &str, target: &str) -> Result<(Value, Duration)> {
        let body = json!({"message_id": message_id, "channel": {"id": target}});
        self.call(reqwest::Method::POST, &format!("/channels/agent/{source_id}/fork"), Some(&body)).await
    }

    /// Polls the fork's task until it is finished; returns the final fork summary.
    pub async fn wait_for_fork(&self, fork: &Value, target: &str) -> Result<Value> {
        let deadline = Instant::now() + COMPLETION_TIMEOUT;
        if let Some(task_id) = fork["task_id"].as_str().filter(|_| fork["status"] == "backfilling") {
            loop {
                let (task, _) = self.call(reqwest::Method::GET, &format!("/tasks/{task_id}"), None).await?;
                match task["status"].as_str() {
                    Some("completed") => break,
                    Some("failed") => bail!("the fork into {target} failed: {task}"),
                    _ => {}
                }
                ensure!(Instant::now() < deadline, "the fork into {target} did not complete within {COMPLETION_TIMEOUT:?}");
                tokio::time::sleep(POLL_INTERVAL).await;
            }
        }
        self.completed_fork(target).await
    }
}
