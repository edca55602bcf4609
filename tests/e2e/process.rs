//! The binary as an operator runs it: first start without configuration, graceful shutdown.

use crate::helpers::*;
use serde_json::json;
use std::time::Duration;

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

#[tokio::test]
async fn sigterm_drains_and_exits_cleanly_and_the_data_is_there_after_a_restart() {
    let db = TestDb::create().await;
    let mut first = ServerProcess::start(&db, &[]).await;
    first.users(&["u1"]).await;
    first.channel("agent:kept", "u1", &["u1"]).await;
    let id = first.say("agent:kept", "u1", "before the restart").await;
    let status = first.terminate(Duration::from_secs(15)).await.expect("the server exits within 15 s of SIGTERM");
    assert!(status.success(), "graceful shutdown exits with success: {status:?}");
    let second = ServerProcess::start(&db, &[]).await;
    let r = second.get(&format!("/messages/{id}"), &second.server()).await.ok();
    assert_eq!(r["message"]["text"], json!("before the restart"), "{r}");
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
