//! The fork benchmark: `cargo run --release -p offshoot-bench`.
//!
//! For each backend (SQLite in a temporary file; PostgreSQL in a fresh database when the
//! server at `OFFSHOOT_BENCH_PG_URL` is reachable) it starts the real server in this process
//! (`offshoot::run` on a loopback port), seeds agent source channels directly with bulk SQL
//! (the API would take minutes to write 50,000 messages and is not what is measured), drives
//! the fork API over HTTP like a client, and prints:
//! - the synchronous fork latency (p50/p95) for 1,000- and 50,000-message sources, on a server
//!   whose worker role is off so that no backfill competes with the request being timed;
//! - the time from the fork request to the fork's completion for 1,000-, 10,000- and
//!   50,000-message sources (the last one capped at 10,000 copies), and messages copied per
//!   second, on a server with every role;
//! - the floor: one `INSERT … SELECT` copying the same 10,000 rows inside the database;
//! - the message-id lookup of 1,000 ids (p50/p95);
//! - the peak resident memory of the process during the 50,000-message run;
//! - webhook deliveries per second to a local receiver (2,000 `message.new`).
//!
//! It is a program that prints figures, not a test: nothing here fails on a slow machine.
//! Depends on the `offshoot` crate (to run the server) and talks to the database only to seed
//! it and to time the floor.

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use sqlx::any::AnyPoolOptions;
use sqlx::{AnyPool, AssertSqlSafe, Executor};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const API_KEY: &str = "bench-key";
const API_SECRET: &str = "bench-secret-0123456789abcdef0123456789abcdef";
const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// How often the completion of a fork is polled (`GET /tasks/{id}`).
const POLL_INTERVAL: Duration = Duration::from_millis(5);
/// Give up on a fork that has not completed by then.
const COMPLETION_TIMEOUT: Duration = Duration::from_secs(600);
const USERS: [&str; 2] = ["bench-user", "bench-agent"];
/// About the length of a short agent answer; no quotes (it is pasted into SQL).
const FILLER: &str = "The quick brown fox jumps over the lazy dog while the agent explains, step by step, \
how to configure the deployment, which flags matter, what the logs mean and how to roll back safely \
if the migration fails halfway through the night shift.";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite",
            Backend::Postgres => "PostgreSQL",
        }
    }
}

struct Args {
    backends: Vec<Backend>,
    /// Measured forks per source for the synchronous latency (after a few warm-up forks).
    forks: usize,
    /// Repetitions of each fork-to-completion run.
    reps: usize,
    /// Measured lookups of 1,000 ids.
    lookups: usize,
    pg_url: String,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        backends: vec![Backend::Sqlite, Backend::Postgres],
        forks: 40,
        reps: 3,
        lookups: 50,
        pg_url: std::env::var("OFFSHOOT_BENCH_PG_URL").unwrap_or_else(|_| DEFAULT_PG_URL.to_string()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--backend" => {
                args.backends = match value()?.as_str() {
                    "sqlite" => vec![Backend::Sqlite],
                    "postgres" => vec![Backend::Postgres],
                    "all" => vec![Backend::Sqlite, Backend::Postgres],
                    other => bail!("unknown backend {other:?}: sqlite, postgres or all"),
                }
            }
            "--forks" => args.forks = value()?.parse().context("--forks")?,
            "--reps" => args.reps = value()?.parse().context("--reps")?,
            "--lookups" => args.lookups = value()?.parse().context("--lookups")?,
            "--pg-url" => args.pg_url = value()?,
            "-h" | "--help" => {
                println!(
                    "usage: offshoot-bench [--backend sqlite|postgres|all] [--forks N] [--reps N] [--lookups N] [--pg-url URL]\n\
                     PostgreSQL: --pg-url or OFFSHOOT_BENCH_PG_URL (default {DEFAULT_PG_URL}); fresh databases are created there and dropped."
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    ensure!(args.forks >= 30, "--forks must be at least 30");
    ensure!(args.forks + 5 <= 100, "--forks must leave room under the limit of 100 forks per source");
    ensure!(args.reps >= 1 && args.lookups >= 1, "--reps and --lookups must be positive");
    Ok(args)
}

// ---------------------------------------------------------------------------------------------
// Databases

/// Where a benchmark database lives, so it can be removed afterwards.
enum Db {
    Sqlite { path: PathBuf },
    Postgres { admin_url: String, name: String },
}

impl Db {
    fn url(&self) -> String {
        match self {
            Db::Sqlite { path } => format!("sqlite://{}?mode=rwc", path.display()),
            Db::Postgres { admin_url, name } => with_database(admin_url, name),
        }
    }

    async fn create(backend: Backend, label: &str, pg_url: &str) -> Result<Db> {
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

    async fn drop_it(self) {
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

async fn connect(url: &str, max: u32) -> Result<AnyPool> {
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

fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://…@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

async fn pg_reachable(url: &str) -> bool {
    match tokio::time::timeout(Duration::from_secs(5), connect(url, 1)).await {
        Ok(Ok(pool)) => {
            pool.close().await;
            true
        }
        _ => false,
    }
}

/// Seeds an agent channel `agent:{id}` of `n` top-level messages, one second apart, ending a
/// minute ago, alternating between a user and an agent. Message ids are `{id}-m{k}`, k = 1..n.
/// Returns the id of the newest message.
async fn seed_source(db: &AnyPool, backend: Backend, id: &str, n: i64) -> Result<String> {
    let now = now_ns();
    let base = now - (n + 60) * 1_000_000_000;
    let cid = format!("agent:{id}");
    let mut tx = db.begin().await?;
    for user in USERS {
        tx.execute(AssertSqlSafe(format!(
            "INSERT INTO app_user (id, role, name, created_at, updated_at) VALUES ('{user}', 'user', '{user}', {now}, {now}) ON CONFLICT (id) DO NOTHING"
        )))
        .await?;
    }
    tx.execute(AssertSqlSafe(format!(
        "INSERT INTO channel (cid, type, id, created_by_id, custom, created_at, updated_at, last_message_at, message_count) \
         VALUES ('{cid}', 'agent', '{id}', '{}', '{{\"name\":\"bench source\"}}', {base}, {now}, {last}, {n})",
        USERS[0],
        last = base + n * 1_000_000_000,
    )))
    .await?;
    for user in USERS {
        tx.execute(AssertSqlSafe(format!(
            "INSERT INTO member (cid, user_id, channel_role, custom, created_at, updated_at) VALUES ('{cid}', '{user}', 'channel_member', '{{}}', {base}, {base})"
        )))
        .await?;
    }
    let numbers = match backend {
        Backend::Sqlite => {
            format!("(WITH RECURSIVE seq(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM seq WHERE k < {n}) SELECT k FROM seq) AS s")
        }
        Backend::Postgres => format!("generate_series(1, {n}) AS s(k)"),
    };
    tx.execute(AssertSqlSafe(format!(
        "INSERT INTO message (id, cid, user_id, type, text, html, attachments, mentioned_users, restricted_visibility, custom, created_at, updated_at) \
         SELECT '{id}-m' || k, '{cid}', CASE WHEN k % 2 = 1 THEN '{u}' ELSE '{a}' END, 'regular', \
                'message ' || k || ': {FILLER}', '<p>message ' || k || ': {FILLER}</p>', '[]', '[]', '[]', \
                CASE WHEN k % 2 = 1 THEN '{{}}' ELSE '{{\"ai_generated\":true}}' END, \
                {base} + k * CAST(1000000000 AS BIGINT), {base} + k * CAST(1000000000 AS BIGINT) \
         FROM {numbers}",
        u = USERS[0],
        a = USERS[1],
    )))
    .await?;
    tx.commit().await?;
    if backend == Backend::Postgres {
        db.execute("ANALYZE message").await?;
    }
    Ok(format!("{id}-m{n}"))
}

/// The floor: the database copying the newest 10,000 rows of `source` into a scratch channel
/// in one statement (the same columns a fork copy writes). Returns the elapsed time.
async fn floor_copy(db: &AnyPool, source_cid: &str, scratch: &str, rows: i64) -> Result<Duration> {
    const COLS: &str = "cid, user_id, type, text, html, mml, command, parent_id, show_in_channel, quoted_message_id, attachments, mentioned_users, \
        restricted_visibility, silent, i18n, custom, shadowed, pinned, reply_count, deleted_reply_count, created_at, updated_at, message_text_updated_at, source_cid, source_message_id";
    let sql = format!(
        "INSERT INTO message (id, {COLS}) \
         SELECT '{scratch}-' || id, 'agent:{scratch}', user_id, type, text, html, mml, command, parent_id, show_in_channel, quoted_message_id, attachments, mentioned_users, \
                restricted_visibility, silent, i18n, custom, shadowed, pinned, reply_count, deleted_reply_count, created_at, updated_at, message_text_updated_at, cid, id \
         FROM message WHERE cid = '{source_cid}' ORDER BY created_at DESC, id DESC LIMIT {rows}"
    );
    let mut conn = db.acquire().await?;
    let started = Instant::now();
    let done = conn.execute(AssertSqlSafe(sql)).await?;
    let elapsed = started.elapsed();
    ensure!(done.rows_affected() == rows as u64, "the floor copied {} rows, not {rows}", done.rows_affected());
    Ok(elapsed)
}

// ---------------------------------------------------------------------------------------------
// The server, in process

struct Server {
    base: String,
    http: reqwest::Client,
    token: String,
    db: AnyPool,
    shutdown: CancellationToken,
    handle: tokio::task::JoinHandle<Result<()>>,
}

impl Server {
    async fn start(url: &str, roles: offshoot::Roles) -> Result<Server> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let config = offshoot::Config {
            listen: addr.to_string(),
            database_url: url.to_string(),
            api_key: Some(API_KEY.into()),
            api_secret: Some(API_SECRET.into()),
            roles,
            ..offshoot::Config::default()
        };
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(offshoot::run(listener, config, shutdown.clone()));
        let base = format!("http://{addr}");
        let http = reqwest::Client::builder().timeout(Duration::from_secs(120)).build()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if handle.is_finished() {
                let outcome = handle.await?;
                bail!("the server stopped before it was ready: {outcome:?}");
            }
            if let Ok(r) = http.get(format!("{base}/healthz")).send().await {
                if r.status().is_success() {
                    break;
                }
            }
            ensure!(Instant::now() < deadline, "the server was not ready within 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        let key = jsonwebtoken::EncodingKey::from_secret(API_SECRET.as_bytes()).context("the signing key")?;
        let token = jsonwebtoken::encode(&header, &json!({"server": true}), &key)?;
        // The server has applied the migrations by now; the bench's own pool seeds and times the floor.
        let db = connect(url, 2).await?;
        Ok(Server { base, http, token, db, shutdown, handle })
    }

    async fn stop(self) -> Result<()> {
        self.db.close().await;
        self.shutdown.cancel();
        self.handle.await?.context("the server ended with an error")
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<(Value, Duration)> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .query(&[("api_key", API_KEY)])
            .header("Authorization", &self.token)
            .header("stream-auth-type", "jwt");
        if let Some(b) = body {
            req = req.json(b);
        }
        let started = Instant::now();
        let resp = req.send().await.with_context(|| path.to_string())?;
        let status = resp.status();
        let value: Value = resp.json().await.with_context(|| format!("{path}: the body is not JSON"))?;
        let elapsed = started.elapsed();
        ensure!(status.is_success(), "{path} answered {status}: {value}");
        Ok((value, elapsed))
    }

    async fn fork(&self, source_id: &str, message_id: &str, target: &str) -> Result<(Value, Duration)> {
        let body = json!({"message_id": message_id, "channel": {"id": target}});
        self.call(reqwest::Method::POST, &format!("/channels/agent/{source_id}/fork"), Some(&body)).await
    }

    /// Polls the fork's task until it is finished; returns the final fork summary.
    async fn wait_for_fork(&self, fork: &Value, target: &str) -> Result<Value> {
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
        let (state, _) =
            self.call(reqwest::Method::POST, &format!("/channels/agent/{target}/query"), Some(&json!({"state": false}))).await?;
        let summary = state["channel"]["fork"].clone();
        ensure!(summary["status"] == "completed", "the fork into {target} is not completed: {summary}");
        Ok(summary)
    }
}

// ---------------------------------------------------------------------------------------------
// Figures

#[derive(Default)]
struct Report {
    lines: Vec<String>,
}

impl Report {
    fn add(&mut self, line: String) {
        println!("  {line}");
        self.lines.push(line);
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Nearest-rank percentile of a non-empty sample.
fn percentile(sample: &[Duration], p: f64) -> Duration {
    let mut s = sample.to_vec();
    s.sort();
    let rank = ((p / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank.min(s.len()) - 1]
}

fn median(sample: &[Duration]) -> Duration {
    percentile(sample, 50.0)
}

fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

/// A `/proc/self/status` field in kB.
fn proc_status_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

/// Resets the peak resident set size (`VmHWM`) to the current one (Linux ≥ 4.0).
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu =
        cpuinfo.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(str::trim).unwrap_or("unknown CPU");
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem_kb: u64 = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().find(|l| l.starts_with("MemTotal:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()))
        .unwrap_or(0);
    format!("{cores} cores ({cpu}), {:.1} GiB memory, {}", mem_kb as f64 / 1024.0 / 1024.0, std::env::consts::OS)
}

// ---------------------------------------------------------------------------------------------
// The runs

/// Synchronous fork latency on a server without the worker role.
async fn bench_sync(backend: Backend, args: &Args, report: &mut Report) -> Result<()> {
    let roles = offshoot::Roles { api: true, ws: false, worker: false };
    let db = Db::create(backend, "sync", &args.pg_url).await?;
    let outcome = match Server::start(&db.url(), roles).await {
        Ok(server) => {
            let runs = sync_runs(&server, backend, args, report).await;
            let stopped = server.stop().await;
            runs.and(stopped)
        }
        Err(e) => Err(e),
    };
    // Dropped also after a failure, so no benchmark database is left behind.
    db.drop_it().await;
    outcome
}

async fn sync_runs(server: &Server, backend: Backend, args: &Args, report: &mut Report) -> Result<()> {
    let mut p50s = Vec::new();
    for n in [1_000i64, 50_000] {
        let source = format!("sync-src-{n}");
        let newest = seed_source(&server.db, backend, &source, n).await?;
        for i in 0..5 {
            server.fork(&source, &newest, &format!("{source}-warm-{i}")).await?;
        }
        let mut sample = Vec::with_capacity(args.forks);
        for i in 0..args.forks {
            let target = format!("{source}-f{i}");
            let (resp, took) = server.fork(&source, &newest, &target).await?;
            ensure!(resp["fork"]["status"] == "backfilling", "a fork of {n} messages should be backfilling: {}", resp["fork"]);
            ensure!(resp["messages"].as_array().map(Vec::len) > Some(0), "the fork response carries the newest page");
            sample.push(took);
        }
        let (p50, p95) = (percentile(&sample, 50.0), percentile(&sample, 95.0));
        p50s.push(p50);
        report.add(format!(
            "sync fork, {n:>6} messages: p50 {} p95 {} (n={}, newest page copied: 100 messages)",
            ms(p50),
            ms(p95),
            sample.len()
        ));
    }
    report.add(format!("sync fork p50 ratio 50,000 / 1,000: {:.2}x (goal ≤ 1.5x)", p50s[1].as_secs_f64() / p50s[0].as_secs_f64()));
    Ok(())
}

/// Fork to completion, the floor, the lookup and the peak memory, on a server with every role.
async fn bench_backfill(backend: Backend, args: &Args, report: &mut Report) -> Result<()> {
    let db = Db::create(backend, "backfill", &args.pg_url).await?;
    let outcome = match Server::start(&db.url(), offshoot::Roles::ALL).await {
        Ok(server) => {
            let runs = backfill_runs(&server, backend, args, report).await;
            let runs = match runs {
                Ok(()) => webhook_runs(&server, report).await,
                Err(e) => Err(e),
            };
            let stopped = server.stop().await;
            runs.and(stopped)
        }
        Err(e) => Err(e),
    };
    db.drop_it().await;
    outcome
}

async fn backfill_runs(server: &Server, backend: Backend, args: &Args, report: &mut Report) -> Result<()> {
    let mut sources = Vec::new();
    for n in [1_000i64, 10_000, 50_000] {
        let source = format!("bf-src-{n}");
        let newest = seed_source(&server.db, backend, &source, n).await?;
        sources.push((n, source, newest));
    }
    // A warm-up fork, so the first measured run does not pay for cold caches.
    let (warm, _) = server.fork(&sources[0].1, &sources[0].2, "bf-warm").await?;
    server.wait_for_fork(&warm["fork"], "bf-warm").await?;

    let mut backfill_10k = Vec::new();
    let mut lookup_fork = None;
    for (n, source, newest) in &sources {
        let mut times = Vec::new();
        let mut copied = 0;
        let mut peak_kb = None;
        for rep in 0..args.reps {
            let target = format!("{source}-full-{rep}");
            let measure_memory = *n == 50_000 && reset_peak_rss();
            let started = Instant::now();
            let (resp, _) = server.fork(source, newest, &target).await?;
            let summary = server.wait_for_fork(&resp["fork"], &target).await?;
            times.push(started.elapsed());
            copied = summary["copied_message_count"].as_i64().unwrap_or(0);
            ensure!(copied == (*n).min(10_000), "the fork of {n} messages copied {copied}");
            ensure!(summary["truncated"].as_bool().unwrap_or(false) == (*n > 10_000), "truncated is wrong: {summary}");
            if measure_memory {
                peak_kb = peak_kb.max(proc_status_kb("VmHWM:"));
            }
            if *n == 10_000 && lookup_fork.is_none() {
                lookup_fork = Some(target.clone());
            }
        }
        let med = median(&times);
        if *n == 10_000 {
            backfill_10k = times.clone();
        }
        let all: Vec<String> = times.iter().map(|t| ms(*t)).collect();
        report.add(format!(
            "fork to completion, {n:>6} messages: median {} ({} copied, {:.0} messages/s; runs: {})",
            ms(med),
            copied,
            copied as f64 / med.as_secs_f64(),
            all.join(", ")
        ));
        if let Some(kb) = peak_kb {
            report.add(format!("peak RSS of the process (server + bench) during the 50,000 runs: {:.1} MiB (VmHWM)", kb as f64 / 1024.0));
        }
    }

    // The floor: the database copying the same 10,000 rows by itself.
    let (_, source_10k, _) = &sources[1];
    let mut floors = Vec::new();
    for rep in 0..args.reps {
        floors.push(floor_copy(&server.db, &format!("agent:{source_10k}"), &format!("floor-{rep}"), 10_000).await?);
    }
    let floor = median(&floors);
    report.add(format!(
        "floor: INSERT … SELECT of 10,000 rows: median {} (runs: {})",
        ms(floor),
        floors.iter().map(|t| ms(*t)).collect::<Vec<_>>().join(", ")
    ));
    report.add(format!(
        "fork to completion of 10,000 / floor: {:.1}x (goal ≤ 2x)",
        median(&backfill_10k).as_secs_f64() / floor.as_secs_f64()
    ));

    // The lookup of 1,000 ids, spread over the whole history of a completed 10,000-copy fork.
    let fork_id = lookup_fork.context("no 10,000-message fork to look up")?;
    let ids: Vec<String> = (1..=1_000).map(|k| format!("{source_10k}-m{}", k * 10)).collect();
    let body = json!({ "source_message_ids": ids });
    let path = format!("/channels/agent/{fork_id}/fork/message_ids");
    let mut sample = Vec::new();
    for i in 0..args.lookups + 5 {
        let (resp, took) = server.call(reqwest::Method::POST, &path, Some(&body)).await?;
        let found = resp["message_id_map"].as_object().map(|m| m.len()).unwrap_or(0);
        ensure!(found == 1_000, "the lookup found {found} of 1,000 copies");
        if i >= 5 {
            sample.push(took);
        }
    }
    report.add(format!(
        "lookup of 1,000 ids: p50 {} p95 {} (n={}, goal p50 ≤ 20 ms)",
        ms(percentile(&sample, 50.0)),
        ms(percentile(&sample, 95.0)),
        sample.len()
    ));
    Ok(())
}

/// Messages sent for the webhook run.
const WEBHOOK_MESSAGES: u64 = 2_000;

/// A minimal HTTP/1.1 receiver on a loopback port that answers 200 to every request (keep-alive)
/// and counts them. Returns its URL.
async fn counting_receiver(count: std::sync::Arc<std::sync::atomic::AtomicU64>) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 16 * 1024];
                loop {
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if buf.len() < end + 4 + len {
                            break;
                        }
                        buf.drain(..end + 4 + len);
                        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await.is_err() {
                            return;
                        }
                    }
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    Ok(url)
}

/// Webhook deliveries per second: 2,000 messages sent 16 at a time, each delivered as
/// `message.new` to a local receiver; timed from the first send to the last delivery.
async fn webhook_runs(server: &Server, report: &mut Report) -> Result<()> {
    use futures_util::StreamExt;
    let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let url = counting_receiver(count.clone()).await?;
    server.call(reqwest::Method::PATCH, "/app", Some(&json!({"webhook_url": url}))).await?;
    let started = Instant::now();
    let sends = futures_util::stream::iter(0..WEBHOOK_MESSAGES)
        .map(|i| {
            let body = json!({"message": {"id": format!("hook-{i}"), "text": "a message for the webhook run", "user_id": USERS[0]}});
            async move { server.call(reqwest::Method::POST, "/channels/agent/bf-src-1000/message", Some(&body)).await }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    for r in sends {
        r?;
    }
    let sent = started.elapsed();
    let deadline = Instant::now() + COMPLETION_TIMEOUT;
    while count.load(std::sync::atomic::Ordering::SeqCst) < WEBHOOK_MESSAGES {
        ensure!(
            Instant::now() < deadline,
            "only {} of {WEBHOOK_MESSAGES} webhooks arrived",
            count.load(std::sync::atomic::Ordering::SeqCst)
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    let all = started.elapsed();
    report.add(format!(
        "webhooks: {WEBHOOK_MESSAGES} message.new delivered to a local receiver in {} from the first send ({:.0} deliveries/s; the sends took {})",
        ms(all),
        WEBHOOK_MESSAGES as f64 / all.as_secs_f64(),
        ms(sent)
    ));
    server.call(reqwest::Method::PATCH, "/app", Some(&json!({"webhook_url": ""}))).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .init();
    let args = parse_args()?;
    let machine = machine();
    println!("offshoot-bench on {machine}");
    if cfg!(debug_assertions) {
        println!("WARNING: a debug build; run `cargo run --release -p offshoot-bench` for real figures");
    }
    let mut summary = String::new();
    for &backend in &args.backends {
        if backend == Backend::Postgres && !pg_reachable(&args.pg_url).await {
            println!("\nPostgreSQL not reachable at {}: the PostgreSQL benchmark was SKIPPED", redact(&args.pg_url));
            continue;
        }
        println!("\n== {} ==", backend.name());
        let mut report = Report::default();
        let started = Instant::now();
        bench_sync(backend, &args, &mut report).await.with_context(|| format!("{}: synchronous fork latency", backend.name()))?;
        bench_backfill(backend, &args, &mut report).await.with_context(|| format!("{}: backfill", backend.name()))?;
        println!("  ({} in {:.0} s)", backend.name(), started.elapsed().as_secs_f64());
        let _ = writeln!(summary, "\n### {}\n", backend.name());
        for line in &report.lines {
            let _ = writeln!(summary, "- {line}");
        }
    }
    println!("\n--- for BENCHMARKS.md ---\nMachine: {machine}\n{summary}");
    Ok(())
}
