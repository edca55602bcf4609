//! The client side of the command line: `fork`, `tree`, `task`, `lookup`, `token`, `console`.
//! They talk to a running server over HTTP like any Stream client (a server-side token signed
//! with the app's secret), so they work from any machine that can reach it.
//!
//! Exit codes: 0 done; 1 the server refused (its Stream error message and code are printed),
//! or a fork ended `failed`; 2 usage (bad arguments, no key and secret configured); 3 the
//! server cannot be reached.

use crate::cli::{ClientArgs, ConsoleArgs, ForkArgs, LookupArgs, TaskArgs, TokenArgs, TreeArgs};
use crate::config::Config;
use crate::tree;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use offshoot_core::token::{sign, Claims};
use secrecy::ExposeSecret;
use serde_json::{json, Value};
use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

/// How often `--wait` and `--watch` ask for a backfill's progress.
const POLL: Duration = Duration::from_millis(250);
/// How long a request may take before the server counts as unreachable.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Lifetime of the server-side token each request carries.
const REQUEST_TOKEN_TTL: i64 = 300;

/// Why a command did not succeed; each maps to one exit code and one line on stderr.
#[derive(Debug)]
pub enum Failure {
    /// The server answered with Stream's error envelope.
    Refused { message: String, code: i64, status: u16 },
    /// The server accepted the work, but it ended badly (a fork that failed).
    Failed(String),
    /// Bad arguments or configuration.
    Usage(String),
    /// No answer from the server.
    Unreachable(String),
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Refused { .. } | Failure::Failed(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Unreachable(_) => 3,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Refused { message, code, status } => write!(f, "{message} (Stream error code {code}, HTTP {status})"),
            Failure::Failed(m) | Failure::Usage(m) | Failure::Unreachable(m) => f.write_str(m),
        }
    }
}

type Outcome<T = ()> = Result<T, Failure>;

/// The app's key pair and the server's address, from the configuration and the flags.
pub struct Client {
    base: String,
    api_key: String,
    api_secret: String,
    http: reqwest::Client,
}

/// The URL a client command talks to: `--url` / `OFFSHOOT_URL`, else the configured listen
/// address (an unspecified host means this machine).
fn base_url(args: &ClientArgs, config: &Config) -> Outcome<String> {
    let url = match &args.url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => {
            let listen = config.listen.replace("0.0.0.0:", "127.0.0.1:").replace("[::]:", "[::1]:");
            format!("http://{listen}")
        }
    };
    if url.starts_with("https://") {
        return Err(Failure::Usage(format!("{url}: this build speaks plain HTTP only (no TLS stack); reach the server over http://")));
    }
    if !url.starts_with("http://") {
        return Err(Failure::Usage(format!("{url}: the server URL must start with http://")));
    }
    Ok(url)
}

/// The key pair from the configuration (file or environment).
fn key_pair(config: &Config) -> Outcome<(String, String)> {
    match (&config.api_key, &config.api_secret) {
        (Some(k), Some(s)) => Ok((k.clone(), s.expose_secret().to_string())),
        _ => Err(Failure::Usage(
            "no API key and secret: set OFFSHOOT_API_KEY and OFFSHOOT_API_SECRET, or name a config file holding them with --config".into(),
        )),
    }
}

fn load_config(file: Option<&Path>) -> Outcome<Config> {
    Config::load(file, Default::default()).map_err(|e| Failure::Usage(format!("{e:#}")))
}

fn unix_secs() -> i64 {
    offshoot_core::time::now() / 1_000_000_000
}

/// A token signed with `secret`: server-side without `user_id`, expiring after `ttl` seconds.
pub fn mint(secret: &str, user_id: Option<&str>, ttl: i64) -> (String, i64) {
    let now = unix_secs();
    let exp = now.saturating_add(ttl);
    let claims = Claims { user_id: user_id.map(str::to_string), iat: Some(now), exp: Some(exp), ..Default::default() };
    (sign(&claims, secret), exp)
}

impl Client {
    fn new(args: &ClientArgs, config: &Config) -> Outcome<Client> {
        let base = base_url(args, config)?;
        let (api_key, api_secret) = key_pair(config)?;
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| Failure::Usage(format!("setting up the HTTP client: {e}")))?;
        Ok(Client { base, api_key, api_secret, http })
    }

    /// One request with a fresh server-side token; the body of a 2xx answer, or the failure.
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Outcome<Value> {
        let (token, _) = mint(&self.api_secret, None, REQUEST_TOKEN_TTL);
        let sep = if path.contains('?') { '&' } else { '?' };
        let url = format!("{}{path}{sep}api_key={}", self.base, self.api_key);
        let mut rb = self.http.request(method, &url).header("Authorization", token).header("stream-auth-type", "jwt");
        if let Some(b) = body {
            rb = rb.json(&b);
        }
        let resp = rb.send().await.map_err(|e| Failure::Unreachable(format!("cannot reach the server at {}: {}", self.base, cause(&e))))?;
        let status = resp.status().as_u16();
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| Failure::Unreachable(format!("the server at {} broke off its answer: {}", self.base, cause(&e))))?;
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            return Ok(body);
        }
        match (body.get("message").and_then(Value::as_str), body.get("code").and_then(Value::as_i64)) {
            (Some(message), Some(code)) => Err(Failure::Refused { message: message.to_string(), code, status }),
            _ => {
                Err(Failure::Refused { message: format!("{} answered HTTP {status} without a Stream error", self.base), code: -1, status })
            }
        }
    }

    async fn get(&self, path: &str) -> Outcome<Value> {
        self.call(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> Outcome<Value> {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }
}

/// The innermost cause of an HTTP error, in one line ("Connection refused (os error 111)").
fn cause(e: &reqwest::Error) -> String {
    let mut source: &dyn std::error::Error = e;
    while let Some(next) = source.source() {
        source = next;
    }
    if e.is_timeout() {
        return format!("no answer within {}s", REQUEST_TIMEOUT.as_secs());
    }
    source.to_string()
}

/// `type:id` → `/channels/type/id`.
fn channel_path(cid: &str) -> Outcome<String> {
    match cid.split_once(':') {
        Some((t, id)) if !t.is_empty() && !id.is_empty() && !id.contains('/') && !t.contains('/') => Ok(format!("/channels/{t}/{id}")),
        _ => Err(Failure::Usage(format!("{cid:?} is not a channel cid: write TYPE:ID, e.g. agent:support-42"))),
    }
}

/// Prints one JSON document on stdout.
fn print_json(v: &Value) {
    println!("{}", serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()));
}

/// Colour on stdout: only on a terminal, and never with `NO_COLOR` set.
pub fn colour_on_stdout() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Runs a client command; prints its one-line failure on stderr and returns the exit code.
pub async fn run(config_file: Option<&Path>, command: ClientCommand) -> u8 {
    match dispatch(config_file, command).await {
        Ok(()) => 0,
        Err(f) => {
            eprintln!("offshoot: {f}");
            f.exit_code()
        }
    }
}

/// The client commands, as [`run`] takes them.
pub enum ClientCommand {
    Fork(ForkArgs),
    Tree(TreeArgs),
    Task(TaskArgs),
    Lookup(LookupArgs),
    Token(TokenArgs),
    Console(ConsoleArgs),
}

async fn dispatch(config_file: Option<&Path>, command: ClientCommand) -> Outcome {
    let config = load_config(config_file)?;
    match command {
        ClientCommand::Fork(a) => fork(&Client::new(&a.client, &config)?, &a).await,
        ClientCommand::Tree(a) => show_tree(&Client::new(&a.client, &config)?, &a).await,
        ClientCommand::Task(a) => task(&Client::new(&a.client, &config)?, &a).await,
        ClientCommand::Lookup(a) => lookup(&Client::new(&a.client, &config)?, &a).await,
        ClientCommand::Token(a) => token(&config, &a),
        ClientCommand::Console(a) => console(&config, &a),
    }
}

/// A fork's progress as `GET /tasks/{id}` reports it.
struct Progress {
    /// `pending`, `running`, `completed` or `failed`.
    status: String,
    copied: i64,
    total: Option<i64>,
    truncated: bool,
    failed_reason: Option<String>,
}

impl Progress {
    fn of_task(t: &Value) -> Progress {
        let r = &t["result"];
        Progress {
            status: t["status"].as_str().unwrap_or("unknown").to_string(),
            copied: r["copied_message_count"].as_i64().unwrap_or(0),
            total: r["total_message_count"].as_i64(),
            truncated: r["truncated"].as_bool().unwrap_or(false),
            failed_reason: t["error"]["type"].as_str().map(str::to_string),
        }
    }

    fn finished(&self) -> bool {
        matches!(self.status.as_str(), "completed" | "failed")
    }
}

/// A progress bar of copied/total on stderr, or a hidden one when stderr is no terminal or the
/// output is JSON.
fn progress_bar(json: bool) -> ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{spinner} {msg} [{bar:40}] {pos}/{len} messages ({elapsed})")
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message("pending");
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// Polls the task until its fork is finished, moving `bar`.
async fn follow(client: &Client, task_id: &str, bar: &ProgressBar) -> Outcome<Progress> {
    loop {
        let p = Progress::of_task(&client.get(&format!("/tasks/{task_id}")).await?);
        if let Some(total) = p.total {
            bar.set_length(total as u64);
        }
        bar.set_position(p.copied as u64);
        bar.set_message(p.status.clone());
        if p.finished() {
            bar.finish_and_clear();
            return Ok(p);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `offshoot fork TYPE:ID --at MESSAGE_ID …`.
async fn fork(client: &Client, a: &ForkArgs) -> Outcome {
    let source_path = channel_path(&a.source)?;
    let source_type = a.source.split_once(':').map(|(t, _)| t).unwrap_or_default();
    let target_id = a.to.clone().unwrap_or_else(|| {
        let id = a.source.split_once(':').map(|(_, id)| id).unwrap_or_default();
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        format!("{id}-fork-{}", &suffix[..8])
    });
    let mut channel = json!({"id": target_id});
    if !a.members.is_empty() {
        channel["members"] = json!(a.members);
    }
    let mut body = json!({"message_id": a.at, "channel": channel});
    if a.exclude_attachments {
        body["exclude_attachments"] = json!(true);
    }
    if !a.inherit.is_empty() {
        body["inherit_data"] = json!(a.inherit);
    }
    let started = Instant::now();
    let answer = client.post(&format!("{source_path}/fork"), body).await?;
    let summary = &answer["fork"];
    let fork_cid = summary["channel_cid"].as_str().map(str::to_string).unwrap_or_else(|| format!("{source_type}:{target_id}"));
    let task_id = summary["task_id"].as_str().map(str::to_string);
    let wait = a.wait_or(std::io::stdout().is_terminal());
    let mut progress = Progress {
        status: summary["status"].as_str().unwrap_or("unknown").to_string(),
        copied: summary["copied_message_count"].as_i64().unwrap_or(0),
        total: None,
        truncated: summary["truncated"].as_bool().unwrap_or(false),
        failed_reason: summary["failed_reason"].as_str().map(str::to_string),
    };
    if let Some(task_id) = &task_id {
        if wait {
            let bar = progress_bar(a.client.json);
            progress = follow(client, task_id, &bar).await?;
        } else {
            // The fork's own summary counts copies only once finished; the task is live.
            progress = Progress::of_task(&client.get(&format!("/tasks/{task_id}")).await?);
        }
    }
    let status = match progress.status.as_str() {
        "pending" | "running" => "backfilling",
        s => s,
    };
    let elapsed = started.elapsed();
    if a.client.json {
        let mut out = json!({
            "cid": fork_cid,
            "source_cid": a.source,
            "source_message_id": a.at,
            "status": status,
            "copied_message_count": progress.copied,
            "total_message_count": progress.total,
            "truncated": progress.truncated,
            "task_id": task_id,
            "seconds": (elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
        });
        if let Some(r) = &progress.failed_reason {
            out["failed_reason"] = json!(r);
        }
        print_json(&out);
    } else {
        let counts = match progress.total {
            Some(t) => format!("{}/{t} messages", progress.copied),
            None => format!("{} messages so far", progress.copied),
        };
        let truncated = if progress.truncated { ", truncated at the 10,000 newest" } else { "" };
        println!("forked {} at {} into {fork_cid}: {status}, {counts}{truncated}", a.source, a.at);
        if let Some(t) = &task_id {
            println!("task {t}");
        }
        if wait {
            println!("took {:.1}s", elapsed.as_secs_f64());
        }
    }
    if status == "failed" {
        let reason = progress.failed_reason.as_deref().unwrap_or("no reason given");
        return Err(Failure::Failed(format!("fork {fork_cid} failed: {reason}")));
    }
    Ok(())
}

/// `offshoot tree TYPE:ID`.
async fn show_tree(client: &Client, a: &TreeArgs) -> Outcome {
    let path = channel_path(&a.cid)?;
    let lineage = client.get(&format!("{path}/lineage?max_nodes={}", a.max_nodes)).await?;
    if a.client.json {
        print_json(&lineage);
    } else {
        print!("{}", tree::draw(&lineage, &a.cid, colour_on_stdout()));
    }
    Ok(())
}

/// `offshoot task TASK_ID [--watch]`.
async fn task(client: &Client, a: &TaskArgs) -> Outcome {
    let path = format!("/tasks/{}", a.task_id);
    let mut t = client.get(&path).await?;
    if a.watch && !Progress::of_task(&t).finished() {
        let bar = progress_bar(a.client.json);
        follow(client, &a.task_id, &bar).await?;
        t = client.get(&path).await?;
    }
    let p = Progress::of_task(&t);
    if a.client.json {
        print_json(&t);
    } else {
        let r = &t["result"];
        let total = p.total.map_or("?".to_string(), |n| n.to_string());
        let fork = r["fork_channel_cid"].as_str().unwrap_or("?");
        let source = r["source_channel_cid"].as_str().unwrap_or("?");
        let truncated = if p.truncated { ", truncated" } else { "" };
        println!("task {}: {}, {}/{total} messages copied{truncated} ({source} → {fork})", a.task_id, p.status, p.copied);
        if let Some(r) = &p.failed_reason {
            println!("failed: {r}");
        }
    }
    if a.watch && p.status == "failed" {
        let reason = p.failed_reason.as_deref().unwrap_or("no reason given");
        return Err(Failure::Failed(format!("task {} failed: {reason}", a.task_id)));
    }
    Ok(())
}

/// `offshoot lookup FORK_CID SOURCE_ID…`.
async fn lookup(client: &Client, a: &LookupArgs) -> Outcome {
    let path = channel_path(&a.fork)?;
    let answer = client.post(&format!("{path}/fork/message_ids"), json!({"source_message_ids": a.source_ids})).await?;
    let map = answer["message_id_map"].as_object().cloned().unwrap_or_default();
    if a.client.json {
        print_json(&json!({"fork": a.fork, "message_id_map": map}));
    } else {
        for id in &a.source_ids {
            match map.get(id).and_then(Value::as_str) {
                Some(copy) => println!("{id} → {copy}"),
                None => println!("{id} → (not copied)"),
            }
        }
    }
    Ok(())
}

/// `offshoot token [--user ID] [--ttl 1h]`: needs only the secret, not the server.
fn token(config: &Config, a: &TokenArgs) -> Outcome {
    let (_, secret) = key_pair(config)?;
    let ttl = parse_ttl(&a.ttl)?;
    let (token, exp) = mint(&secret, a.user.as_deref(), ttl);
    if a.json {
        print_json(&json!({"token": token, "user_id": a.user, "expires_at": offshoot_core::time::to_rfc3339(exp * 1_000_000_000)}));
    } else {
        println!("{token}");
    }
    Ok(())
}

/// `offshoot console [--ttl 1h]`: a link to the console carrying a short-lived server-side
/// token in the URL fragment, which browsers never send to the server.
fn console(config: &Config, a: &ConsoleArgs) -> Outcome {
    let base = base_url(&a.client, config)?;
    let (key, secret) = key_pair(config)?;
    let ttl = parse_ttl(&a.ttl)?;
    let (token, _) = mint(&secret, None, ttl);
    let url = format!("{base}/console#api_key={key}&token={token}");
    if a.client.json {
        print_json(&json!({"url": url}));
    } else {
        println!("{url}");
    }
    Ok(())
}

/// `90s`, `30m`, `1h`, `2d` (or bare seconds) → seconds, at least 1 and at most 366 days.
pub fn parse_ttl(s: &str) -> Outcome<i64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: i64 = digits.parse().map_err(|_| Failure::Usage(format!("--ttl {s:?}: write a number and a unit, e.g. 90s, 30m, 1h, 2d")))?;
    let per = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(Failure::Usage(format!("--ttl {s:?}: the unit is s, m, h or d"))),
    };
    let secs = n.saturating_mul(per);
    if !(1..=366 * 86_400).contains(&secs) {
        return Err(Failure::Usage(format!("--ttl {s:?}: between 1s and 366d")));
    }
    Ok(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_read_their_unit_and_refuse_nonsense() {
        assert_eq!(parse_ttl("1h").ok(), Some(3600));
        assert_eq!(parse_ttl("90s").ok(), Some(90));
        assert_eq!(parse_ttl("45").ok(), Some(45));
        assert_eq!(parse_ttl("2d").ok(), Some(172_800));
        for bad in ["", "h", "1w", "0s", "-1h", "400d", "1.5h"] {
            assert!(matches!(parse_ttl(bad), Err(Failure::Usage(_))), "{bad:?}");
        }
    }

    #[test]
    fn a_minted_token_verifies_with_the_secret_and_expires_after_its_ttl() {
        let (t, exp) = mint("s3cret", Some("amy"), 60);
        let now = unix_secs();
        let c = offshoot_core::token::verify(&t, "s3cret", now).expect("valid now");
        assert_eq!((c.user_id.as_deref(), c.exp), (Some("amy"), Some(exp)));
        assert!(offshoot_core::token::verify(&t, "other", now).is_err(), "another secret refuses it");
        assert!(offshoot_core::token::verify(&t, "s3cret", now + 120).is_err(), "expired after its ttl");
    }

    #[test]
    fn failures_map_to_the_documented_exit_codes() {
        assert_eq!(Failure::Refused { message: "x".into(), code: 16, status: 404 }.exit_code(), 1);
        assert_eq!(Failure::Failed("x".into()).exit_code(), 1);
        assert_eq!(Failure::Usage("x".into()).exit_code(), 2);
        assert_eq!(Failure::Unreachable("x".into()).exit_code(), 3);
    }

    #[test]
    fn a_cid_must_have_a_type_and_an_id() {
        assert_eq!(channel_path("agent:x").ok().as_deref(), Some("/channels/agent/x"));
        for bad in ["agent", ":x", "agent:", "a/b:c", "agent:x/y"] {
            assert!(channel_path(bad).is_err(), "{bad}");
        }
    }
}
