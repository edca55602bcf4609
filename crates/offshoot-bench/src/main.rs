//! The benchmark: `cargo run --release -p offshoot-bench [-- --quick]`.
//!
//! For each backend (SQLite in a temporary file; PostgreSQL in fresh databases when the server
//! at `OFFSHOOT_BENCH_PG_URL` is reachable) it starts the real server in a child process of its
//! own (this executable, `serve` mode: `offshoot::run` on a loopback port), writes realistic
//! agent conversations through the HTTP API (`seed.rs`), and prints the figures
//! (BENCHMARKS.md, "Method", says how each is taken):
//! - a. the synchronous fork on realistic sources of 1,000 and 50,000 messages (p50, ratio);
//! - b. the backfill of a realistic 10,000-message source: time to `channel.forked` against the
//!   floor (the database copying the same rows with the same v5 keys in one `INSERT … SELECT`);
//! - c. the p99 of message sends while four 10,000-message forks backfill, against none;
//! - d. WebSocket capacity: 10,000 idle clients (resident memory per connection), one message
//!   to 1,000 watchers, 100 channels × 10 watchers at 200 messages/s (`ws.rs`);
//! - e. agent streaming: concurrent streams of 20 partial updates/s with `ai_indicator` events;
//! - f. the highest sustained send rate with p99 ≤ 50 ms, stepping the offered rate;
//! - g. Query Channels for a user in 30 channels of 100 messages;
//! - t. fork to completion for realistic sources of 1,000, 10,000 and 50,000 messages (the
//!   figure the apalis worker is compared on);
//! - the message-id lookup of 1,000 ids and webhook deliveries per second.
//!
//! The load generator is this process (reqwest and tokio-tungstenite); it raises its own
//! open-file limit. It is a program that prints figures, not a test: nothing here fails on a
//! slow machine. Depends on the `offshoot` crate (to run the server) and talks to the database
//! only to time the floor.

mod checkpoints;
mod cpu;
mod flood;
mod lineage;
mod search;
mod seed;
mod server;
mod ws;

use anyhow::{ensure, Context, Result};
use futures_util::StreamExt;
use serde_json::{json, Value};
use server::{Api, Db, Server};
use sqlx::{AssertSqlSafe, Executor, Row};
use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

const API_KEY: &str = "bench-key";
const API_SECRET: &str = "bench-secret-0123456789abcdef0123456789abcdef";
const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
/// Requests in flight while a source is written.
const SEED_CONCURRENCY: usize = 32;
/// Forks (and floors) of figure b, at least, in a full run.
const B_REPS: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
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

pub struct Args {
    backends: Vec<Backend>,
    /// The figures to take (letters a–g, plus `l` lookup, `t` fork to completion by size and
    /// `w` webhooks).
    only: String,
    quick: bool,
    /// Measured forks per source for the synchronous latency (after warm-up forks).
    forks: usize,
    /// Repetitions of each fork-to-completion run.
    reps: usize,
    /// The large source of figure a (50,000).
    big: usize,
    /// The backfilled source of figures b and c (10,000).
    mid: usize,
    /// Idle WebSocket clients of figure d (10,000).
    pub clients: usize,
    /// Seconds of each step of figures e and f, and of the 200 messages/s run of d.
    pub step_secs: f64,
    /// The offered rates of figure f, stepped up in order (`--rates 500,750` to profile one).
    rates: Vec<f64>,
    /// Seconds of each step of figure f when not the default (to profile one rate).
    f_step: Option<f64>,
    /// The Query Channels requests figure g measures when not the default (100, 20 with
    /// `--quick`; `--g-queries 2000` to profile it).
    g_queries: Option<usize>,
    /// The numbers of concurrent streams of figure e when not the default (`--streams 100` to
    /// profile one).
    pub streams: Option<Vec<usize>>,
    pg_url: String,
}

impl Args {
    fn wants(&self, figure: char) -> bool {
        self.only.contains(figure)
    }
}

/// The command line (`--help` prints it).
#[derive(clap::Parser)]
#[command(
    name = "offshoot-bench",
    about = "The Offshoot benchmark: prints the figures BENCHMARKS.md reports",
    after_help = "PostgreSQL: --pg-url or OFFSHOOT_BENCH_PG_URL (default postgres://postgres@127.0.0.1:5432/postgres); fresh databases are created there and dropped.\n\
                  --quick: small sources (10,000 / 3,000), 2,000 WebSocket clients, 3 s steps; a flag given explicitly wins over it."
)]
struct Cli {
    /// Small sources (10,000 / 3,000), 2,000 WebSocket clients, 3 s steps.
    #[arg(long)]
    quick: bool,
    /// The backends to measure.
    #[arg(long, value_enum, default_value = "all")]
    backend: BackendChoice,
    /// The figures to take: letters of abcdefgltwnsr.
    #[arg(long, default_value = "abcdefgltwnsr")]
    only: String,
    /// Measured forks per source for figure a (5–95; 40, 10 with --quick).
    #[arg(long)]
    forks: Option<usize>,
    /// Repetitions of each fork-to-completion run (3, 1 with --quick).
    #[arg(long)]
    reps: Option<usize>,
    /// Idle WebSocket clients of figure d (10,000, 2,000 with --quick; at least 2,000).
    #[arg(long)]
    clients: Option<usize>,
    /// The offered send rates of figure f, stepped up in order (R,R,…).
    #[arg(long, value_delimiter = ',')]
    rates: Option<Vec<f64>>,
    /// Seconds of each step of figure f.
    #[arg(long = "f-step-secs")]
    f_step_secs: Option<f64>,
    /// The Query Channels requests figure g measures (100, 20 with --quick).
    #[arg(long)]
    g_queries: Option<usize>,
    /// The numbers of concurrent streams of figure e (N,N,…).
    #[arg(long, value_delimiter = ',')]
    streams: Option<Vec<usize>>,
    /// The PostgreSQL server the benchmark creates its databases on.
    #[arg(long, env = "OFFSHOOT_BENCH_PG_URL", hide_env_values = true, default_value = DEFAULT_PG_URL)]
    pg_url: String,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BackendChoice {
    Sqlite,
    Postgres,
    All,
}

/// The run's settings: each flag given, else its default (the smaller one with `--quick`).
fn parse_args(argv: impl Iterator<Item = String>) -> Result<Args> {
    let cli = <Cli as clap::Parser>::parse_from(std::iter::once("offshoot-bench".to_string()).chain(argv));
    let quick = cli.quick;
    let pick = |given: Option<usize>, full: usize, small: usize| given.unwrap_or(if quick { small } else { full });
    let args = Args {
        backends: match cli.backend {
            BackendChoice::Sqlite => vec![Backend::Sqlite],
            BackendChoice::Postgres => vec![Backend::Postgres],
            BackendChoice::All => vec![Backend::Sqlite, Backend::Postgres],
        },
        only: cli.only,
        quick,
        forks: pick(cli.forks, 40, 10),
        reps: pick(cli.reps, 3, 1),
        big: if quick { 10_000 } else { 50_000 },
        mid: if quick { 3_000 } else { 10_000 },
        clients: pick(cli.clients, 10_000, 2_000),
        step_secs: if quick { 3.0 } else { 10.0 },
        rates: cli.rates.unwrap_or_else(|| vec![100.0, 250.0, 500.0, 750.0, 1_000.0, 1_250.0, 1_500.0, 2_000.0, 3_000.0]),
        f_step: cli.f_step_secs,
        g_queries: cli.g_queries,
        streams: cli.streams,
        pg_url: cli.pg_url,
    };
    ensure!(args.forks >= 5 && args.forks + 5 <= 100, "--forks must be between 5 and 95 (100 forks per source at most)");
    ensure!(args.reps >= 1, "--reps must be positive");
    ensure!(args.g_queries != Some(0), "--g-queries must be positive");
    ensure!(args.clients >= 2_000, "--clients must be at least 2,000 (1,000 watchers of one channel and 100 × 10 more)");
    Ok(args)
}

// ---------------------------------------------------------------------------------------------
// Figures

#[derive(Default)]
pub struct Report {
    lines: Vec<String>,
}

impl Report {
    /// Prints `line` with the UTC time of day (to place it in the server's and the database's
    /// logs) and keeps it, without the time, for the summary.
    pub fn add(&mut self, line: String) {
        println!("  [{}] {line}", clock());
        self.lines.push(line);
    }
}

/// The UTC time of day, to the millisecond (`14:07:40.125`).
pub fn clock() -> String {
    let now = offshoot_core::time::to_rfc3339(offshoot_core::time::now());
    now.get(11..23).unwrap_or(&now).to_string()
}

pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// Percentile of a sample (zero when it is empty), from an HDR histogram of it in microseconds
/// to three significant digits.
pub fn percentile(sample: &[Duration], p: f64) -> Duration {
    // From 1 µs to an hour; longer values count as an hour.
    let Ok(mut h) = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3) else { return Duration::ZERO };
    for d in sample {
        h.saturating_record(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    }
    if h.is_empty() {
        return Duration::ZERO;
    }
    Duration::from_micros(h.value_at_quantile(p / 100.0))
}

pub fn median(sample: &[Duration]) -> Duration {
    percentile(sample, 50.0)
}

pub fn goal(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

fn machine() -> String {
    let cpuinfo = <procfs::CpuInfo as procfs::Current>::current().ok();
    let cpu = cpuinfo.as_ref().and_then(|c| c.model_name(0)).unwrap_or("unknown CPU");
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem_kb = meminfo_kib(|m| m.mem_total).unwrap_or(0);
    format!("{cores} cores ({cpu}), {:.1} GiB memory, {}", mem_kb as f64 / 1024.0 / 1024.0, std::env::consts::OS)
}

/// One field of `/proc/meminfo`, in KiB.
fn meminfo_kib(field: impl Fn(&procfs::Meminfo) -> u64) -> Option<u64> {
    <procfs::Meminfo as procfs::Current>::current().ok().map(|m| field(&m) / 1024)
}

/// Has the kernel write back every dirty page (`sync`) and prints how much there was and how
/// long it took. The figures that measure a latency under their own load (c, d, e, f) begin
/// with it: the seeding and the figures before them write hundreds of MB, which the kernel
/// writes back all at once when they are 30 s old; that fell inside c's windows and every
/// commit waited 70–150 ms behind it, and inside f's second step, 30 s after c's backfills
/// (docs/performance.md, "Disk writeback and checkpoints"). Each figure measures what its
/// own load costs, not what the one before it wrote; the writes of its own earlier steps still
/// fall inside its later ones.
pub async fn settle_disk(figure: &str) -> Result<()> {
    let dirty = meminfo_kib(|m| m.dirty).unwrap_or(0);
    let started = Instant::now();
    let status = tokio::task::spawn_blocking(|| std::process::Command::new("sync").status()).await??;
    ensure!(status.success(), "sync failed: {status}");
    println!("  [{}] before {figure}: {:.0} MB of dirty pages written back in {}", clock(), dirty as f64 / 1024.0, ms(started.elapsed()));
    Ok(())
}

/// The kernel's settings for writing back dirty pages, which decide how much a commit's flush
/// can queue behind (docs/performance.md, "Disk writeback and checkpoints").
fn writeback_settings() -> String {
    let read =
        |name: &str| std::fs::read_to_string(format!("/proc/sys/vm/{name}")).map(|v| v.trim().to_string()).unwrap_or_else(|_| "?".into());
    let background = match read("dirty_background_bytes").as_str() {
        "0" | "?" => format!("{} % of memory", read("dirty_background_ratio")),
        bytes => format!("{bytes} bytes"),
    };
    format!(
        "kernel writeback: in the background past {background}, of pages dirty for {} cs, every {} cs",
        read("dirty_expire_centisecs"),
        read("dirty_writeback_centisecs")
    )
}

fn load_average() -> String {
    <procfs::LoadAverage as procfs::Current>::current().map(|l| format!("{:.2}", l.one)).unwrap_or_default()
}

/// Raises the soft open-file limit to the hard one (the WebSocket figures hold thousands of
/// sockets on each side). Returns what it did, for the output.
fn raise_nofile() -> String {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => format!("open-file limit of this process raised to {n} (the server process inherits it)"),
        Err(e) => format!("could not raise the open-file limit: {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Open-loop load

/// Outcome of an open-loop run.
pub struct Run {
    /// Per request, from its scheduled start to its answer (so queueing counts).
    pub latencies: Vec<Duration>,
    /// Per request (in the order of `latencies`), its scheduled start.
    pub starts: Vec<Instant>,
    pub errors: usize,
    pub first_error: Option<String>,
    /// From the first scheduled start to the last answer.
    pub wall: Duration,
}

impl Run {
    pub fn p(&self, p: f64) -> Duration {
        percentile(&self.latencies, p)
    }
    pub fn rate(&self) -> f64 {
        self.latencies.len() as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// Starts `job(i)` at `rate` per second, each at its scheduled time whether or not earlier ones
/// have answered, until `duration` has passed or `stop` is cancelled; at most `max_in_flight`
/// at once (a request that finds no room counts as an error: the server is not keeping up).
pub async fn open_loop<F, Fut>(rate: f64, duration: Duration, stop: Option<CancellationToken>, max_in_flight: usize, job: F) -> Run
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let started = Instant::now();
    let limit = Arc::new(tokio::sync::Semaphore::new(max_in_flight));
    let mut tasks = tokio::task::JoinSet::new();
    let mut errors = 0;
    let mut i = 0u64;
    loop {
        let at = started + Duration::from_secs_f64(i as f64 / rate);
        if at.duration_since(started) >= duration || stop.as_ref().is_some_and(|s| s.is_cancelled()) {
            break;
        }
        tokio::time::sleep_until(at.into()).await;
        let Ok(permit) = limit.clone().try_acquire_owned() else {
            errors += 1;
            i += 1;
            continue;
        };
        let fut = job(i);
        tasks.spawn(async move {
            let out = fut.await;
            drop(permit);
            out.map(|()| (at, at.elapsed()))
        });
        i += 1;
    }
    let mut latencies = Vec::with_capacity(i as usize);
    let mut starts = Vec::with_capacity(i as usize);
    let mut first_error = None;
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ok((at, d))) => {
                starts.push(at);
                latencies.push(d);
            }
            Ok(Err(e)) => {
                errors += 1;
                first_error.get_or_insert_with(|| format!("{e:#}"));
            }
            Err(e) => {
                errors += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    Run { latencies, starts, errors, first_error, wall: started.elapsed() }
}

/// A chat message of a user or an agent, about the size of real ones.
fn chat_message(i: u64) -> Value {
    let user = if i.is_multiple_of(2) { seed::HUMANS[(i / 2 % 4) as usize] } else { seed::AGENTS[(i / 2 % 2) as usize] };
    let mut rng = seed::Rng::new(i);
    let mut m = json!({"text": seed::text(&mut rng, 40, 400), "user_id": user});
    if i % 2 == 1 {
        m["ai_generated"] = true.into();
    }
    json!({ "message": m })
}

/// `count` channels `{prefix}{i}` whose members are the bench users plus `extra`.
async fn chat_channels(api: &Api, prefix: &str, count: usize, extra: &[&str]) -> Result<Vec<String>> {
    let mut members: Vec<&str> = seed::HUMANS.to_vec();
    members.extend(seed::AGENTS);
    members.extend(extra);
    let mut ids = Vec::new();
    for i in 0..count {
        let id = format!("{prefix}{i}");
        api.post(
            &format!("/channels/agent/{id}/query"),
            &json!({"state": false, "data": {"created_by_id": seed::HUMANS[0], "members": members}}),
        )
        .await?;
        ids.push(id);
    }
    Ok(ids)
}

/// Sends messages at `rate` to the channels round robin.
async fn send_at(api: &Api, channels: &[String], rate: f64, duration: Duration, stop: Option<CancellationToken>) -> Run {
    open_loop(rate, duration, stop, 4_000, |i| {
        let api = api.clone();
        let path = format!("/channels/agent/{}/message", channels[i as usize % channels.len()]);
        async move { api.post(&path, &chat_message(i)).await.map(|_| ()) }
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// a. The synchronous fork on realistic sources

async fn bench_sync(backend: Backend, args: &Args, report: &mut Report) -> Result<()> {
    let db = Db::create(backend, "sync", &args.pg_url).await?;
    // No worker: no backfill competes with the request being timed.
    let outcome = match Server::start(&db.url(), "api", 100).await {
        Ok(server) => {
            let runs = sync_runs(&server, args, report).await;
            let stopped = server.stop().await;
            runs.and(stopped)
        }
        Err(e) => Err(e),
    };
    db.drop_it().await;
    outcome
}

async fn sync_runs(server: &Server, args: &Args, report: &mut Report) -> Result<()> {
    let api = &server.api;
    seed::users(api).await?;
    let mut p50s = Vec::new();
    for n in [1_000usize, args.big] {
        let source = seed::source(api, &format!("sync-{n}"), n, SEED_CONCURRENCY).await?;
        report.add(format!(
            "seeding: a realistic source of {n} messages through the API in {:.1} s ({} requests, {:.0} requests/s, {SEED_CONCURRENCY} at a time)",
            source.took.as_secs_f64(),
            source.requests,
            source.requests as f64 / source.took.as_secs_f64()
        ));
        for i in 0..3 {
            api.fork(&source.id, &source.newest, &format!("{}-warm-{i}", source.id)).await?;
        }
        let mut sample = Vec::with_capacity(args.forks);
        let mut copied = 0;
        let cpu = cpu::Mark::now();
        for i in 0..args.forks {
            let (resp, took) = api.fork(&source.id, &source.newest, &format!("{}-f{i}", source.id)).await?;
            ensure!(resp["fork"]["status"] == "backfilling", "a fork of {n} messages should be backfilling: {}", resp["fork"]);
            copied = resp["messages"].as_array().map(Vec::len).unwrap_or(0);
            sample.push(took);
        }
        let p50 = percentile(&sample, 50.0);
        p50s.push(p50);
        report.add(format!(
            "a. sync fork, realistic {n:>6}-message source: p50 {} p95 {} (n={}, {} messages in the answer{}; goal p50 ≤ 25 ms: {})",
            ms(p50),
            ms(percentile(&sample, 95.0)),
            sample.len(),
            copied,
            cpu::note("; ", cpu::since(cpu)),
            goal(p50 <= Duration::from_millis(25))
        ));
    }
    let ratio = p50s[1].as_secs_f64() / p50s[0].as_secs_f64();
    report.add(format!("a. sync fork p50 ratio {} / 1,000: {ratio:.2}x (goal ≤ 1.5x: {})", args.big, goal(ratio <= 1.5)));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// r: a flood from one user token, on a server with the default rate limits

/// Stream's table with room for the steady senders: 100 sends a second from 99 users is 6,000 a
/// minute for the app and about 61 a minute for each user, over the defaults of 1,000 and 60.
/// The flood's own user keeps a per-user limit far below its rate.
const FLOOD_LIMITS: &str = "SendMessage=20000,user=120";

async fn bench_flood(backend: Backend, args: &Args, report: &mut Report) -> Result<()> {
    let db = Db::create(backend, "flood", &args.pg_url).await?;
    let outcome = match Server::start_with(&db.url(), "api,ws,worker", 100, &[("OFFSHOOT_RATE_LIMITS", FLOOD_LIMITS)]).await {
        Ok(server) => {
            let duration = Duration::from_secs_f64(if args.quick { 5.0 } else { 20.0 });
            let run = flood::measure(&server.api, 100.0, 10_000.0, duration).await;
            if let Ok(figure) = &run {
                figure.lines().into_iter().for_each(|l| report.add(format!("r. {l}")));
            }
            let stopped = server.stop().await;
            run.map(|_| ()).and(stopped)
        }
        Err(e) => Err(e),
    };
    db.drop_it().await;
    outcome
}

// ---------------------------------------------------------------------------------------------
// b, c, f, g, lookup and webhooks, on a server with every role

async fn bench_load(backend: Backend, args: &Args, report: &mut Report) -> Result<()> {
    let db = Db::create(backend, "load", &args.pg_url).await?;
    let outcome = match Server::start(&db.url(), "api,ws,worker", 100).await {
        Ok(server) => {
            let runs = load_runs(&server, args, report).await;
            let stopped = server.stop().await;
            runs.and(stopped)
        }
        Err(e) => Err(e),
    };
    db.drop_it().await;
    outcome
}

async fn load_runs(server: &Server, args: &Args, report: &mut Report) -> Result<()> {
    let api = &server.api;
    seed::users(api).await?;
    if args.wants('b') || args.wants('c') || args.wants('l') {
        let n = args.mid;
        let source = seed::source(api, &format!("bf-{n}"), n, SEED_CONCURRENCY).await?;
        report.add(format!(
            "seeding: a realistic source of {n} messages through the API in {:.1} s ({:.0} requests/s)",
            source.took.as_secs_f64(),
            source.requests as f64 / source.took.as_secs_f64()
        ));
        // A warm-up fork, so the first measured run does not pay for cold caches.
        let (warm, _) = api.fork(&source.id, &source.newest, "bf-warm").await?;
        api.wait_for_fork(&warm["fork"], "bf-warm").await?;
        if args.wants('b') || args.wants('l') {
            let fork = backfill_vs_floor(server, &source, args, report).await?;
            if args.wants('l') {
                lookup(api, &source, &fork, report).await?;
            }
        }
        if args.wants('c') {
            sends_during_backfills(api, &source, args, report).await?;
        }
    }
    if args.wants('t') {
        completion_sizes(api, args, report).await?;
    }
    if args.wants('g') {
        query_channels(api, args, report).await?;
    }
    if args.wants('n') {
        lineage::lineage_of_1000_nodes(api, "lin", report).await?;
    }
    if args.wants('s') {
        let figure = search::run(api, args.quick).await?;
        report.add(search::report(&server.backend_name, &figure));
    }
    if args.wants('f') {
        send_rate(api, args, report).await?;
    }
    if args.wants('w') {
        webhook_runs(api, report).await?;
    }
    Ok(())
}

/// b. Fork to completion (`channel.forked` is written in the transaction that completes the
/// task) against the floor. Returns a completed fork's id.
async fn backfill_vs_floor(server: &Server, source: &seed::Source, args: &Args, report: &mut Report) -> Result<String> {
    // Five of each unless `--quick`: the floor alone varied by 2.4× within one run of three
    // (docs/performance.md, "Measuring on shared two-core machines"). The forks first, then the floors: a floor right after
    // each fork made both about a fifth slower on PostgreSQL (the other's writes still being
    // flushed), and the figures not comparable with other runs.
    let reps = if args.quick { args.reps } else { args.reps.max(B_REPS) };
    let cpu = cpu::Mark::now();
    let done = to_completion(&server.api, source, reps, "full").await?;
    let (med, copied) = (done.median(), done.copied);
    report.add(format!(
        "b. fork to channel.forked, realistic {}-message source: median {} ({copied} copied, {:.0} messages/s; runs: {}{})",
        source.written,
        ms(med),
        copied as f64 / med.as_secs_f64(),
        done.runs(),
        cpu::note("; ", cpu::since(cpu))
    ));
    let mut floors = Vec::new();
    for rep in 0..reps {
        floors.push(floor_copy(server, &source.id, &done.last, &format!("floor-{rep}")).await?);
    }
    let floor = median(&floors);
    let ratio = med.as_secs_f64() / floor.as_secs_f64();
    report.add(format!(
        "b. floor: one INSERT … SELECT of the same {copied} rows with v5 keys (supplied as a list): median {} (runs: {}); ratio {ratio:.1}x (goal ≤ 2x: {})",
        ms(floor),
        floors.iter().map(|t| ms(*t)).collect::<Vec<_>>().join(", "),
        goal(ratio <= 2.0)
    ));
    Ok(done.last)
}

/// Forks timed from the request to their completion (`GET /tasks/{id}` says `completed`).
struct Completions {
    times: Vec<Duration>,
    /// Messages the last fork copied.
    copied: i64,
    /// The last fork's channel id.
    last: String,
}

impl Completions {
    fn median(&self) -> Duration {
        median(&self.times)
    }

    fn runs(&self) -> String {
        self.times.iter().map(|t| ms(*t)).collect::<Vec<_>>().join(", ")
    }
}

/// Forks `source` at its newest message `reps` times, one after the other, each waited for.
async fn to_completion(api: &Api, source: &seed::Source, reps: usize, label: &str) -> Result<Completions> {
    let mut done = Completions { times: Vec::new(), copied: 0, last: String::new() };
    for rep in 0..reps {
        let target = format!("{}-{label}-{rep}", source.id);
        let started = Instant::now();
        let (resp, _) = api.fork(&source.id, &source.newest, &target).await?;
        let summary = api.wait_for_fork(&resp["fork"], &target).await?;
        done.times.push(started.elapsed());
        done.copied = summary["copied_message_count"].as_i64().unwrap_or(0);
        done.last = target;
    }
    Ok(done)
}

/// t. Fork to completion for realistic sources of 1,000, 10,000 and 50,000 messages (the last
/// one copies the 10,000 the cap allows): the figure that
/// compares worker changes run against run.
async fn completion_sizes(api: &Api, args: &Args, report: &mut Report) -> Result<()> {
    for n in [1_000, args.mid, args.big] {
        let source = seed::source(api, &format!("t-{n}"), n, SEED_CONCURRENCY).await?;
        let (warm, _) = api.fork(&source.id, &source.newest, &format!("t-{n}-warm")).await?;
        api.wait_for_fork(&warm["fork"], &format!("t-{n}-warm")).await?;
        let done = to_completion(api, &source, args.reps, "t").await?;
        let med = done.median();
        report.add(format!(
            "t. fork to completion, realistic {:>6}-message source: median {} ({} copied, {:.0} messages/s; runs: {})",
            source.written,
            ms(med),
            done.copied,
            done.copied as f64 / med.as_secs_f64(),
            done.runs()
        ));
    }
    Ok(())
}

/// The floor: the database copying the rows the fork `fork` copied from `source` into the
/// channel `agent:{scratch}`, in one statement with the keys a fork into it would use (copy id,
/// parent copy, quote copy) supplied as a `VALUES` list, committed. Returns the elapsed time.
async fn floor_copy(server: &Server, source: &str, fork: &str, scratch: &str) -> Result<Duration> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT m.id, m.parent_id, m.quoted_message_id FROM message m \
         WHERE m.cid = 'agent:{source}' AND m.id IN (SELECT source_message_id FROM message WHERE cid = 'agent:{fork}')"
    )))
    .fetch_all(&server.db)
    .await?;
    let scratch_cid = format!("agent:{scratch}");
    let key = |id: &str| uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, format!("offshoot:fork:{scratch_cid}:{id}").as_bytes()).to_string();
    let lit = |v: Option<String>| v.map(|s| format!("'{}'", key(&s))).unwrap_or_else(|| "NULL".into());
    let mut values = Vec::with_capacity(rows.len());
    for row in &rows {
        let id: String = row.try_get("id")?;
        let parent: Option<String> = row.try_get("parent_id")?;
        let quoted: Option<String> = row.try_get("quoted_message_id")?;
        values.push(format!("('{id}', '{}', {}, {})", key(&id), lit(parent), lit(quoted)));
    }
    let sql = format!(
        "INSERT INTO message (id, cid, user_id, type, text, html, mml, command, parent_id, show_in_channel, quoted_message_id, \
         attachments, mentioned_users, restricted_visibility, silent, i18n, custom, shadowed, pinned, reply_count, \
         deleted_reply_count, created_at, updated_at, message_text_updated_at, source_cid, source_message_id) \
         SELECT v.column2, '{scratch_cid}', m.user_id, m.type, m.text, m.html, m.mml, m.command, v.column3, m.show_in_channel, v.column4, \
         m.attachments, m.mentioned_users, m.restricted_visibility, m.silent, m.i18n, m.custom, FALSE, FALSE, 0, \
         0, m.created_at, m.updated_at, m.message_text_updated_at, m.cid, m.id \
         FROM (VALUES {}) AS v JOIN message m ON m.id = v.column1",
        values.join(", ")
    );
    let mut conn = server.db.acquire().await?;
    let started = Instant::now();
    let done = conn.execute(AssertSqlSafe(sql)).await?;
    let elapsed = started.elapsed();
    ensure!(done.rows_affected() == rows.len() as u64, "the floor copied {} rows, not {}", done.rows_affected(), rows.len());
    Ok(elapsed)
}

/// The lookup of 1,000 ids spread over the whole history of a completed fork.
async fn lookup(api: &Api, source: &seed::Source, fork: &str, report: &mut Report) -> Result<()> {
    let step = (source.visible_top.len() / 1_000).max(1);
    let ids: Vec<&String> = source.visible_top.iter().step_by(step).take(1_000).collect();
    let body = json!({ "source_message_ids": ids });
    let path = format!("/channels/agent/{fork}/fork/message_ids");
    let mut sample = Vec::new();
    for i in 0..55 {
        let (resp, took) = api.call(reqwest::Method::POST, &path, Some(&body)).await?;
        let found = resp["message_id_map"].as_object().map(|m| m.len()).unwrap_or(0);
        ensure!(found == ids.len(), "the lookup found {found} of {} copies", ids.len());
        if i >= 5 {
            sample.push(took);
        }
    }
    report.add(format!(
        "lookup of {} ids: p50 {} p95 {} (n={})",
        ids.len(),
        ms(percentile(&sample, 50.0)),
        ms(percentile(&sample, 95.0)),
        sample.len()
    ));
    Ok(())
}

/// c. The p99 of sends at a steady rate, without and then with four forks backfilling (in
/// rounds of four, one after another, so that the tail is the 99th percentile of hundreds of
/// sends on both sides, not their second-worst).
async fn sends_during_backfills(api: &Api, source: &seed::Source, args: &Args, report: &mut Report) -> Result<()> {
    const RATE: f64 = 100.0;
    let rounds = if args.quick { 1 } else { 3 };
    let channels = chat_channels(api, "c-chat-", 10, &[]).await?;
    settle_disk("c").await?;
    let window = Duration::from_secs_f64(args.step_secs.min(5.0) * rounds as f64);
    let cpu_calm = cpu::Mark::now();
    let calm = send_at(api, &channels, RATE, window, None).await;
    let cpu_calm = cpu::note("; ", cpu::since(cpu_calm));
    ensure!(calm.errors == 0, "sends failed without backfills: {:?}", calm.first_error);
    // The end of the backfills is learnt from `channel.forked` on a watching connection, as a
    // client learns it: polling four tasks every few milliseconds would add hundreds of requests
    // a second to the sends being measured, which the window without backfills does not have.
    let mut watch = ws::ForkedWatch::start(api, seed::HUMANS[0], &source.id).await?;
    let targets: Vec<Vec<String>> = (0..rounds).map(|r| (0..4).map(|i| format!("{}-busy-{r}-{i}", source.id)).collect()).collect();
    let stop = CancellationToken::new();
    let forks = {
        let (api, stop, source_id, newest, targets) =
            (api.clone(), stop.clone(), source.id.clone(), source.newest.clone(), targets.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            // Per round: when its fork requests were sent and when the last of them answered.
            let mut requests = Vec::new();
            let forked = async {
                for round in &targets {
                    let sent = Instant::now();
                    let forks = futures_util::future::try_join_all(round.iter().map(|t| api.fork(&source_id, &newest, t))).await?;
                    requests.push((sent, Instant::now()));
                    ensure!(forks.iter().all(|(resp, _)| resp["fork"]["status"] == "backfilling"), "every fork should be backfilling");
                    let cids: Vec<String> = round.iter().map(|t| format!("agent:{t}")).collect();
                    watch.wait_for(&cids, server::COMPLETION_TIMEOUT).await?;
                }
                Ok(())
            };
            let out = forked.await;
            stop.cancel();
            out.map(|()| (started.elapsed() / rounds, requests))
        })
    };
    let cpu_busy = cpu::Mark::now();
    let busy = send_at(api, &channels, RATE, server::COMPLETION_TIMEOUT, Some(stop)).await;
    let (backfill_time, requests) = forks.await??;
    let cpu_busy = cpu::note("; ", cpu::since(cpu_busy));
    // The sends scheduled while no fork request was in flight: only the backfills beside them.
    let no_request_in_flight = |at: &Instant| !requests.iter().any(|(sent, answered)| (*sent..*answered).contains(at));
    let backfill_only: Vec<Duration> =
        busy.starts.iter().zip(&busy.latencies).filter(|(at, _)| no_request_in_flight(at)).map(|(_, d)| *d).collect();
    if std::env::var_os("OFFSHOOT_BENCH_C_TRACE").is_some() {
        let t0 = busy.starts.iter().min().copied().unwrap_or_else(Instant::now);
        // Milliseconds since busy start, and t0 as Unix seconds, to place them in the server's log.
        let at = |i: Instant| i.saturating_duration_since(t0).as_secs_f64() * 1000.0;
        let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64()
            - t0.elapsed().as_secs_f64();
        eprintln!("c trace: busy start at {unix:.3} (Unix seconds)");
        // The slowest of the sends the goal counts (none scheduled during a fork request), the
        // p99's own samples among them.
        let mut worst: Vec<(Instant, Duration)> =
            busy.starts.iter().copied().zip(busy.latencies.iter().copied()).filter(|(at, _)| no_request_in_flight(at)).collect();
        worst.sort_by_key(|w| std::cmp::Reverse(w.1));
        eprintln!("c trace: fork requests at {:?}", requests.iter().map(|(s, a)| (at(*s), at(*a))).collect::<Vec<_>>());
        for (i, d) in worst.iter().take(worst.len() / 100 + 5) {
            eprintln!("c trace: send at {:.0} ms took {}", at(*i), ms(*d));
        }
    }
    ensure!(busy.errors == 0, "sends failed during backfills: {:?}", busy.first_error);
    let mut copied = Vec::new();
    for t in targets.iter().flatten() {
        let summary = api.completed_fork(t).await?;
        copied.push(summary["copied_message_count"].as_i64());
    }
    ensure!(copied.windows(2).all(|w| w[0] == w[1]), "the forks copied different counts: {copied:?}");
    let p99_backfill_only = percentile(&backfill_only, 99.0);
    let (p99_calm, p99_busy) = (calm.p(99.0), busy.p(99.0));
    let ratio = p99_backfill_only.as_secs_f64() / p99_calm.as_secs_f64();
    report.add(format!(
        "c. sends at {RATE:.0}/s: p99 {} without backfills (p50 {}, n={}{cpu_calm}); p99 {} while four {}-message forks backfill (p50 {}, n={}: the sends scheduled while no fork request was in flight; {rounds} round(s) of four, each took {}{cpu_busy}); ratio {ratio:.1}x (goal ≤ 2x: {})",
        ms(p99_calm),
        ms(calm.p(50.0)),
        calm.latencies.len(),
        ms(p99_backfill_only),
        source.written,
        ms(percentile(&backfill_only, 50.0)),
        backfill_only.len(),
        ms(backfill_time),
        goal(ratio <= 2.0)
    ));
    report.add(format!(
        "c. the whole window, the four fork requests of each round included: p99 {} (n={}), ratio {:.1}x",
        ms(p99_busy),
        busy.latencies.len(),
        p99_busy.as_secs_f64() / p99_calm.as_secs_f64()
    ));
    Ok(())
}

/// f. Steps the offered send rate up until the p99 passes 50 ms or requests fail.
async fn send_rate(api: &Api, args: &Args, report: &mut Report) -> Result<()> {
    let channels = chat_channels(api, "f-chat-", 20, &[]).await?;
    settle_disk("f").await?;
    // Warm-up: connections and caches.
    send_at(api, &channels, 200.0, Duration::from_secs(1), None).await;
    let step = Duration::from_secs_f64(args.f_step.unwrap_or(args.step_secs.min(5.0)));
    let mut best = None;
    let mut steps = Vec::new();
    for &rate in &args.rates {
        let cpu = cpu::Mark::now();
        let run = send_at(api, &channels, rate, step, None).await;
        let ok = run.errors == 0 && run.p(99.0) <= Duration::from_millis(50) && run.rate() >= 0.95 * rate;
        steps.push(format!(
            "{rate:.0}/s → {:.0}/s p50 {} p99 {}{}{}",
            run.rate(),
            ms(run.p(50.0)),
            ms(run.p(99.0)),
            if run.errors > 0 { format!(" ({} failed or not started)", run.errors) } else { String::new() },
            cpu::since(cpu).map(|u| format!(" [{u}]")).unwrap_or_default()
        ));
        if !ok {
            break;
        }
        best = Some(rate);
    }
    report.add(format!("f. offered send rates ({} s each, 20 channels): {}", step.as_secs_f64(), steps.join("; ")));
    let best = best.unwrap_or(0.0);
    report.add(format!("f. highest sustained send rate with p99 ≤ 50 ms: {best:.0} messages/s (goal ≥ 1,000: {})", goal(best >= 1_000.0)));
    Ok(())
}

/// g. Query Channels for a user who is a member of 30 channels of 100 messages each.
async fn query_channels(api: &Api, args: &Args, report: &mut Report) -> Result<()> {
    const USER: &str = "gina";
    api.post("/users", &json!({"users": {USER: {"id": USER, "name": "Gina"}}})).await?;
    let channels = chat_channels(api, "g-chat-", 30, &[USER]).await?;
    let sends = futures_util::stream::iter(0..3_000u64)
        .map(|i| {
            let path = format!("/channels/agent/{}/message", channels[i as usize % 30]);
            async move { api.post(&path, &chat_message(i)).await }
        })
        .buffer_unordered(SEED_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    for r in sends {
        r?;
    }
    let token = server::user_token(USER)?;
    let body = json!({
        "filter_conditions": {"type": "agent", "members": {"$in": [USER]}},
        "sort": [{"field": "last_message_at", "direction": -1}],
        "limit": 30, "state": true, "watch": false, "presence": false
    });
    let reps = args.g_queries.unwrap_or(if args.quick { 20 } else { 100 });
    let (mut sample, mut with_parse, mut size) = (Vec::new(), Vec::new(), 0);
    let mut cpu = None;
    for i in 0..reps + 5 {
        if i == 5 {
            cpu = cpu::Mark::now();
        }
        let (resp, took, parse) = api.call_split(&token, reqwest::Method::POST, "/channels", Some(&body)).await?;
        let n = resp["channels"].as_array().map(Vec::len).unwrap_or(0);
        ensure!(n == 30, "Query Channels returned {n} channels, not 30");
        if i >= 5 {
            sample.push(took);
            with_parse.push(took + parse);
            size = resp.to_string().len();
        }
    }
    // The response time ends at the answer's last byte; the load generator's own parse of the
    // answer (about 1.2 MB: 750 messages with their users) into JSON is shown beside it.
    let p50 = percentile(&sample, 50.0);
    report.add(format!(
        "g. Query Channels, a user in 30 channels of 100 messages (limit 30, state, default message limit): p50 {} p95 {} to the last byte (n={}, {} KiB; with the client's JSON parse: p50 {}{}); goal p50 ≤ 20 ms: {}",
        ms(p50),
        ms(percentile(&sample, 95.0)),
        sample.len(),
        size / 1024,
        ms(percentile(&with_parse, 50.0)),
        cpu::note("; ", cpu::since(cpu)),
        goal(p50 <= Duration::from_millis(20))
    ));
    Ok(())
}

/// Messages sent for the webhook run.
const WEBHOOK_MESSAGES: u64 = 2_000;

/// A minimal HTTP/1.1 receiver on a loopback port that answers 200 to every request (keep-alive)
/// and counts them. Returns its URL.
async fn counting_receiver(count: Arc<std::sync::atomic::AtomicU64>) -> Result<String> {
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
async fn webhook_runs(api: &Api, report: &mut Report) -> Result<()> {
    let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let url = counting_receiver(count.clone()).await?;
    let channels = chat_channels(api, "w-chat-", 1, &[]).await?;
    api.call(reqwest::Method::PATCH, "/app", Some(&json!({"webhook_url": url}))).await?;
    let started = Instant::now();
    let path = format!("/channels/agent/{}/message", channels[0]);
    let sends = futures_util::stream::iter(0..WEBHOOK_MESSAGES)
        .map(|i| {
            let path = &path;
            async move { api.post(path, &chat_message(i)).await }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    for r in sends {
        r?;
    }
    let sent = started.elapsed();
    let deadline = Instant::now() + server::COMPLETION_TIMEOUT;
    while count.load(std::sync::atomic::Ordering::SeqCst) < WEBHOOK_MESSAGES {
        ensure!(
            Instant::now() < deadline,
            "only {} of {WEBHOOK_MESSAGES} webhooks arrived",
            count.load(std::sync::atomic::Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let all = started.elapsed();
    report.add(format!(
        "webhooks: {WEBHOOK_MESSAGES} message.new delivered to a local receiver in {} from the first send ({:.0} deliveries/s; the sends took {})",
        ms(all),
        WEBHOOK_MESSAGES as f64 / all.as_secs_f64(),
        ms(sent)
    ));
    api.call(reqwest::Method::PATCH, "/app", Some(&json!({"webhook_url": ""}))).await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------

/// The same allocator as the `offshoot` binary, whose server the child process runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<()> {
    let mut argv = std::env::args().skip(1).peekable();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    if argv.peek().map(String::as_str) == Some("serve") {
        argv.next();
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
            // Stdout is the benchmark's line to the child (its address); the log goes to stderr.
            .with_writer(std::io::stderr)
            .init();
        return runtime.block_on(server::serve_child(argv));
    }
    let args = parse_args(argv)?;
    runtime.block_on(bench(args))
}

async fn bench(args: Args) -> Result<()> {
    let machine = machine();
    println!("offshoot-bench on {machine}{}", if args.quick { " (--quick)" } else { "" });
    let nofile = raise_nofile();
    println!("{nofile}");
    println!("{}", writeback_settings());
    if cfg!(debug_assertions) {
        println!("WARNING: a debug build; run `cargo run --release -p offshoot-bench` for real figures");
    }
    let mut summary = String::new();
    for &backend in &args.backends {
        if backend == Backend::Postgres && !server::pg_reachable(&args.pg_url).await {
            println!("\nPostgreSQL not reachable at {}: the PostgreSQL benchmark was SKIPPED", server::redact(&args.pg_url));
            continue;
        }
        let speed = tokio::task::spawn_blocking(cpu::speed_check).await?;
        println!("\n== {} (load average {}; speed check {}, the best of five) ==", backend.name(), load_average(), ms(speed));
        let mut report = Report::default();
        let started = Instant::now();
        let cpu = cpu::Mark::now();
        let checkpoints = match backend {
            Backend::Postgres => Some(checkpoints::Watch::start(&args.pg_url).await?),
            Backend::Sqlite => None,
        };
        if args.wants('a') {
            bench_sync(backend, &args, &mut report).await.with_context(|| format!("{}: a. synchronous fork", backend.name()))?;
        }
        if "bcfgltwns".chars().any(|c| args.wants(c)) {
            bench_load(backend, &args, &mut report).await.with_context(|| format!("{}: b, c, f, g", backend.name()))?;
        }
        if args.wants('r') {
            bench_flood(backend, &args, &mut report)
                .await
                .with_context(|| format!("{}: r (a flood from one user token)", backend.name()))?;
        }
        if args.wants('d') || args.wants('e') {
            ws::bench_ws(backend, &args, &mut report).await.with_context(|| format!("{}: d, e (WebSocket)", backend.name()))?;
        }
        if let Some(watch) = checkpoints {
            report.add(watch.finish().await);
        }
        println!(
            "  ({} in {:.0} s, load average now {}{})",
            backend.name(),
            started.elapsed().as_secs_f64(),
            load_average(),
            cpu::note("; ", cpu::since(cpu))
        );
        let _ = writeln!(
            summary,
            "\n### {}\n\nSpeed check at the start: {} (`cpu.rs`: one core, a fixed JSON page written and read 40 times).\n",
            backend.name(),
            ms(speed)
        );
        for line in &report.lines {
            let _ = writeln!(summary, "- {line}");
        }
    }
    println!("\n--- for BENCHMARKS.md ---\nMachine: {machine}\n{nofile}\n{summary}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(flags: &[&str]) -> Args {
        parse_args(flags.iter().map(|f| f.to_string())).expect("valid flags")
    }

    #[test]
    fn an_explicit_flag_wins_over_quick_in_either_order() {
        for flags in [["--quick", "--forks", "20"], ["--forks", "20", "--quick"]] {
            let a = args(&flags);
            assert_eq!((a.forks, a.reps, a.clients, a.mid), (20, 1, 2_000, 3_000), "{flags:?}");
        }
        let full = args(&[]);
        assert_eq!((full.forks, full.reps, full.clients, full.mid, full.big), (40, 3, 10_000, 10_000, 50_000));
    }

    #[test]
    fn percentiles_of_a_sample_are_within_a_thousandth() {
        let sample: Vec<Duration> = (1..=1_000).map(Duration::from_millis).collect();
        for (p, want) in [(50.0, 500.0), (99.0, 990.0), (100.0, 1_000.0)] {
            let got = percentile(&sample, p).as_secs_f64() * 1e3;
            assert!((got - want).abs() <= want / 1_000.0, "p{p}: {got} ms, want {want}");
        }
        assert_eq!(percentile(&[], 99.0), Duration::ZERO);
    }
}
