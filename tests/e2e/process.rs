//! The binary as an operator runs it: first start without configuration, graceful shutdown.

use crate::helpers::*;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test]
async fn the_first_start_without_a_key_pair_generates_one_prints_it_and_reuses_it_on_the_next_start() {
    let db = TestDb::create().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
    let run = |port: u16| {
        std::process::Command::new(binary_path())
            .arg("serve")
            .env("DATABASE_URL", &db.url)
            .env("OFFSHOOT_LISTEN", format!("127.0.0.1:{port}"))
            .env_remove("OFFSHOOT_API_KEY")
            .env_remove("OFFSHOOT_API_SECRET")
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawning the offshoot binary")
    };
    let read_pair = |out: &str| -> Option<(String, String)> {
        let key = out.lines().find_map(|l| l.trim().strip_prefix("OFFSHOOT_API_KEY="))?.to_string();
        let secret = out.lines().find_map(|l| l.trim().strip_prefix("OFFSHOOT_API_SECRET="))?.to_string();
        Some((key, secret))
    };

    // First start: the pair is printed; it works against the API.
    let child = run(port);
    let client = Client::new(format!("http://127.0.0.1:{port}"));
    client.wait_healthy(|| Ok(())).await;
    let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let out = child.wait_with_output().expect("wait for the first start");
    assert!(out.status.success(), "a SIGTERM ends the server cleanly: {:?}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let (key, secret) = read_pair(&stdout).unwrap_or_else(|| panic!("the first start prints the generated pair: {stdout:?}"));
    assert!(!key.is_empty() && secret.len() >= 32, "{key} / {secret}");

    // Second start on the same database: the stored pair is reused and not printed again.
    let child = run(port);
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    Client::new(base.clone()).wait_healthy(|| Ok(())).await;
    let token = offshoot_core::token::sign(&offshoot_core::token::Claims::default(), &secret);
    let r = http.get(format!("{base}/app?api_key={key}")).header("Authorization", &token).send().await.expect("GET /app");
    assert_eq!(r.status(), 200, "the printed pair authenticates against the restarted server");
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(body["app"]["api_key"], json!(key));
    let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let out = child.wait_with_output().expect("wait for the second start");
    assert!(read_pair(&String::from_utf8_lossy(&out.stdout)).is_none(), "the pair is printed once, on the first start");
}

/// A request held open by the client: its head went out with `Expect: 100-continue`, and the
/// server's `100 Continue` (sent when the handler starts reading the body) says the server is
/// handling it. The body follows when the test says: until then the request cannot finish.
struct HeldRequest {
    stream: tokio::net::TcpStream,
    body: Vec<u8>,
}

/// Reads from `stream` until `done(bytes so far)`, within [`WAIT`].
async fn read_until(stream: &mut tokio::net::TcpStream, what: &str, done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + WAIT;
    while !done(&got) {
        let n = tokio::time::timeout_at(deadline, stream.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no {what} within {WAIT:?}: {:?}", String::from_utf8_lossy(&got)))
            .expect("reading the response");
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    got
}

async fn hold_request(client: &Client, path: &str, token: &str, body: serde_json::Value) -> HeldRequest {
    use tokio::io::AsyncWriteExt;
    let addr = client.base.trim_start_matches("http://").to_string();
    let mut stream = tokio::net::TcpStream::connect(&addr).await.expect("connect to the server");
    let body = serde_json::to_vec(&body).expect("json");
    let head = format!(
        "POST {path}?api_key={API_KEY} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: {token}\r\nstream-auth-type: jwt\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("send the request head");
    let got = read_until(&mut stream, "100 Continue", |b| b.windows(4).any(|w| w == b"\r\n\r\n")).await;
    assert!(got.starts_with(b"HTTP/1.1 100"), "the server reads the body: {:?}", String::from_utf8_lossy(&got));
    HeldRequest { stream, body }
}

impl HeldRequest {
    /// Sends the body; returns the response's status and JSON body.
    async fn finish(mut self) -> (u16, serde_json::Value) {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(&self.body).await.expect("send the request body");
        // `Connection: close`: the response ends with the connection.
        let raw = read_until(&mut self.stream, "response", |_| false).await;
        let text = String::from_utf8_lossy(&raw).to_string();
        let (head, rest) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("an HTTP response: {text:?}"));
        let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("a status line: {head:?}"));
        let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            // Chunks: "<hex size>\r\n<data>\r\n", ending with size 0.
            let mut out = String::new();
            let mut rest = rest;
            while let Some((size, after)) = rest.split_once("\r\n") {
                let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
                if n == 0 {
                    break;
                }
                out.push_str(&after[..n]);
                rest = &after[n + 2..];
            }
            out
        } else {
            rest.to_string()
        };
        (status, serde_json::from_str(&body).unwrap_or_else(|_| json!({"_raw": body})))
    }
}

/// SIGTERM arrives while a fork is backfilling and while requests are open. The backfill pauses
/// a minute between pages, so once the worker has taken its job it is certainly still running
/// when the signal comes; each request is certainly open, held by its client after the server
/// asked for its body. The open requests are answered and their messages stored;
/// the process exits with success; the backfill resumes after a restart on the same database
/// and ends with every message copied exactly once.
#[tokio::test]
async fn sigterm_during_a_backfill_and_open_requests_answers_them_exits_cleanly_and_the_backfill_resumes_after_a_restart() {
    let db = TestDb::create().await;
    let mut first = ServerProcess::start(&db, &[("OFFSHOOT_BACKFILL_PAGE_SIZE", "10"), ("OFFSHOOT_BACKFILL_PAGE_DELAY_MS", "60000")]).await;
    first.users(&["u1"]).await;
    first.channel("agent:kept", "u1", &["u1"]).await;
    let before = first.say("agent:kept", "u1", "before the restart").await;
    let source = first.seed("agent:kept", "u1", "kept", 300, past_ns(), 8).await;
    let fc = "agent:kept-fork";
    let r = first.fork("agent:kept", &source[299], "kept-fork").await.ok();
    assert_eq!(r["fork"]["status"], json!("backfilling"), "{r}");
    // The worker has taken the fork's job: the backfill runs (and pauses between its pages).
    let deadline = Instant::now() + WAIT;
    loop {
        let counts = first.get("/jobs", &first.server()).await.ok();
        let backfill = counts["queues"].as_array().and_then(|qs| qs.iter().find(|q| q["queue"] == json!("offshoot.backfill"))).cloned();
        if backfill.as_ref().is_some_and(|q| q["running"] == json!(1)) {
            break;
        }
        assert!(Instant::now() < deadline, "the worker did not take the fork's job within {WAIT:?}: {counts}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mut held = Vec::new();
    for i in 0..3 {
        let body =
            json!({"message": {"id": format!("during-shutdown-{i}"), "text": format!("sent during the shutdown {i}"), "user_id": "u1"}});
        held.push(hold_request(&first, &format!("{}/message", channel_path("agent:kept")), &first.server(), body).await);
    }
    first.sigterm();
    for (i, request) in held.into_iter().enumerate() {
        let (status, body) = request.finish().await;
        assert_eq!(status, 200, "request {i}, open when SIGTERM came, is answered: {body}");
        assert_eq!(body["message"]["id"], json!(format!("during-shutdown-{i}")), "{body}");
    }
    let status = first.wait_exit(Duration::from_secs(30)).await.expect("the server exits within 30 s of SIGTERM");
    assert!(status.success(), "graceful shutdown exits with success: {status:?}");

    let second = ServerProcess::start(&db, &[("OFFSHOOT_BACKFILL_PAGE_SIZE", "10")]).await;
    let r = second.get(&format!("/messages/{before}"), &second.server()).await.ok();
    assert_eq!(r["message"]["text"], json!("before the restart"), "{r}");
    for i in 0..3 {
        let r = second.get(&format!("/messages/during-shutdown-{i}"), &second.server()).await.ok();
        assert_eq!(r["message"]["text"], json!(format!("sent during the shutdown {i}")), "{r}");
    }
    let done = second.wait_fork_finished(fc).await;
    assert_eq!(done["status"], json!("completed"), "{done}");
    // The seeded history is a day old; the fork point is its newest message.
    assert_eq!(done["copied_message_count"], json!(300), "{done}");
    let all = ids(&serde_json::Value::Array(second.all_messages(fc).await));
    assert_eq!(all, source.iter().map(|s| copy_id(fc, s)).collect::<Vec<_>>(), "every message exactly once, in order");
}

/// SIGKILL mid-backfill, then a restart at once on the same database. On SQLite, which one
/// process serves, the restarted process takes back the job its dead predecessor held before
/// its workers fetch (`offshoot_worker::prepare`): once it answers, no job is held by a worker
/// of the dead process any more. Its heartbeat is a minute, so neither apalis's takeover
/// (3 missed heartbeats: 3 min) nor the reconciler's stall check (a minute without a page) can
/// come within the bound below; only the start-up take-back can finish the fork in time. On
/// PostgreSQL a restarted process knows its predecessor's jobs only by their heartbeat (another
/// live process may be running them): with a 1 s heartbeat they are taken over within 5 s.
/// Either way the fork ends with every message copied exactly once.
#[tokio::test]
async fn a_process_killed_mid_backfill_and_restarted_at_once_takes_its_job_back_and_finishes_the_fork() {
    let db = TestDb::create().await;
    let sqlite = backend() == Backend::Sqlite;
    let heartbeat_secs: u64 = if sqlite { 60 } else { 1 };
    let heartbeat = heartbeat_secs.to_string();
    // The first process copies a page, then pauses a minute: its job is running when it dies.
    let env = [("OFFSHOOT_BACKFILL_PAGE_SIZE", "10"), ("OFFSHOOT_WORKER_HEARTBEAT_SECS", heartbeat.as_str())];
    let mut first = ServerProcess::start(&db, &[env.as_slice(), &[("OFFSHOOT_BACKFILL_PAGE_DELAY_MS", "60000")]].concat()).await;
    first.users(&["u1"]).await;
    first.channel("agent:revived", "u1", &["u1"]).await;
    let source = first.seed("agent:revived", "u1", "revived", 300, past_ns(), 8).await;
    let fc = "agent:revived-fork";
    let r = first.fork("agent:revived", &source[299], "revived-fork").await.ok();
    assert_eq!(r["fork"]["status"], json!("backfilling"), "{r}");
    let held = crate::worker::wait_one_running_backfill(&db).await;
    let dead_worker = held.lock_by.clone();

    first.kill();
    let restarted = Instant::now();
    let second = ServerProcess::start(&db, &env).await;
    if sqlite {
        let jobs = crate::worker::backfill_jobs(&db).await;
        assert!(
            jobs.iter().all(|j| j.lock_by != dead_worker),
            "the restarted process is up and the dead worker ({dead_worker:?}) holds nothing: {jobs:?}"
        );
    }
    // Well before the heartbeat takeover (3 heartbeats) and the reconciler's stall check (60 s)
    // on SQLite; the takeover's bound is 4 heartbeats and a poll on PostgreSQL.
    let within = if sqlite { Duration::from_secs(45) } else { WAIT };
    let done = second.wait_fork_finished_within(fc, within).await;
    eprintln!("figure: the fork finished {:?} after the restart began", restarted.elapsed());
    assert_eq!(done["status"], json!("completed"), "{done}");
    assert_eq!(done["copied_message_count"], json!(300), "{done}");
    let all = ids(&serde_json::Value::Array(second.all_messages(fc).await));
    assert_eq!(all, source.iter().map(|s| copy_id(fc, s)).collect::<Vec<_>>(), "every message exactly once, in order");
    let jobs = crate::worker::backfill_jobs(&db).await;
    assert!(jobs.iter().any(|j| j.id == held.id && j.lock_by != dead_worker), "the dead worker's own job was run again: {jobs:?}");
}

/// Runs the binary with `args` to completion; returns (success, stdout, stderr).
fn run_binary(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(binary_path()).args(args).output().expect("running the offshoot binary");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test]
async fn every_command_has_its_help_and_the_binary_tells_its_version() {
    let (ok, out, _) = run_binary(&["--help"]);
    assert!(ok && out.contains("serve") && out.contains("dead-letters") && out.contains("jobs"), "{out}");
    let (ok, out, _) = run_binary(&["serve", "--help"]);
    assert!(
        ok && out.contains("--listen") && out.contains("--database-url") && out.contains("--roles") && out.contains("--config"),
        "{out}"
    );
    let (ok, out, _) = run_binary(&["dead-letters", "replay", "--help"]);
    assert!(ok && out.contains("--all"), "{out}");
    let (ok, out, _) = run_binary(&["--version"]);
    assert!(ok && out.trim() == format!("offshoot {}", env!("CARGO_PKG_VERSION")), "{out}");
    let (ok, _, err) = run_binary(&["serve", "--no-such-flag"]);
    assert!(!ok && err.contains("--no-such-flag"), "an unknown flag is refused and named: {err}");
}

#[tokio::test]
async fn a_flag_given_as_flag_equals_value_overrides_the_environment() {
    let db = TestDb::create().await;
    let free_port = || std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
    let (flag_port, env_port) = (free_port(), free_port());
    let mut child = std::process::Command::new(binary_path())
        .args(["serve", &format!("--listen=127.0.0.1:{flag_port}")])
        .env("DATABASE_URL", &db.url)
        .env("OFFSHOOT_LISTEN", format!("127.0.0.1:{env_port}"))
        .env("OFFSHOOT_API_KEY", API_KEY)
        .env("OFFSHOOT_API_SECRET", API_SECRET)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawning the offshoot binary");
    // Healthy on the flag's port (bounded wait, panics otherwise): the flag won over the
    // environment, which names another port.
    let client = Client::new(format!("http://127.0.0.1:{flag_port}"));
    client
        .wait_healthy(|| match child.try_wait() {
            Ok(None) => Ok(()),
            other => Err(format!("the server ended: {other:?}")),
        })
        .await;
    let _ = child.kill();
    let _ = child.wait();
}
