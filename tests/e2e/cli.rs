//! The client commands of the `offshoot` binary (`fork`, `tree`, `task`, `lookup`, `token`,
//! `console`), run as an operator runs them against a test server: their output, and their
//! exit codes (0 done, 1 refused or failed, 2 usage, 3 unreachable).

use crate::helpers::*;
use offshoot_core::token::{sign, Claims};
use serde_json::{json, Value};

/// What a run of the binary gave.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Stdout as the one JSON document `--json` promises.
    #[track_caller]
    fn json(&self) -> Value {
        assert_eq!(self.code, 0, "exit 0 expected: {}", self.stderr);
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {:?}", self.stdout))
    }

    /// A failure: its exit code and its one line on stderr.
    #[track_caller]
    fn failed(&self, code: i32) -> &str {
        assert_eq!(self.code, code, "exit {code} expected; stdout {:?}, stderr {:?}", self.stdout, self.stderr);
        assert!(self.stdout.is_empty(), "nothing on stdout when a command fails: {:?}", self.stdout);
        let line = self.stderr.trim_end();
        assert_eq!(line.lines().count(), 1, "one line on stderr: {:?}", self.stderr);
        assert!(!line.contains("Error {") && !line.contains("kind:"), "no Rust debug dump: {line}");
        line
    }
}

/// Runs `offshoot ARGS` with the test app's key pair and `url`, and `extra` environment.
async fn offshoot(url: &str, args: &[&str], extra: &[(&str, &str)]) -> Run {
    let mut cmd = tokio::process::Command::new(binary_path());
    cmd.args(args)
        .env("OFFSHOOT_URL", url)
        .env("OFFSHOOT_API_KEY", API_KEY)
        .env("OFFSHOOT_API_SECRET", API_SECRET)
        .env_remove("OFFSHOOT_CONFIG")
        .env_remove("DATABASE_URL")
        .env("NO_COLOR", "1")
        .kill_on_drop(true);
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(WAIT, cmd.output()).await.expect("the command ends").expect("running the offshoot binary");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test]
async fn fork_wait_json_of_a_3000_message_source_ends_completed_with_the_right_count() {
    let app = TestApp::spawn().await;
    app.users(&["amy"]).await;
    let src = format!("agent:{}", unique("cli-src"));
    app.channel(&src, "amy", &["amy"]).await;
    let ids = app.seed(&src, "amy", &unique("m"), 3_000, past_ns(), 16).await;
    let target = unique("cli-fork");
    let run = offshoot(&app.base, &["fork", &src, "--at", &ids[2_999], "--to", &target, "--wait", "--json"], &[]).await;
    let out = run.json();
    let fork_cid = format!("agent:{target}");
    assert_eq!(out["cid"], json!(fork_cid));
    assert_eq!(out["status"], json!("completed"), "{out}");
    assert_eq!((out["copied_message_count"].clone(), out["total_message_count"].clone()), (json!(3_000), json!(3_000)), "{out}");
    assert_eq!(out["truncated"], json!(false));
    assert!(out["task_id"].is_string() && out["seconds"].is_f64(), "{out}");
    // The server agrees: the fork holds the 3,000 copies.
    let summary = app.fork_summary(&fork_cid).await;
    assert_eq!((summary["status"].clone(), summary["copied_message_count"].clone()), (json!("completed"), json!(3_000)));
    assert_eq!(app.all_messages(&fork_cid).await.len(), 3_000);

    // The task and the lookup, for scripts.
    let task_id = out["task_id"].as_str().expect("task id");
    let task = offshoot(&app.base, &["task", task_id, "--watch", "--json"], &[]).await.json();
    assert_eq!((task["status"].clone(), task["result"]["copied_message_count"].clone()), (json!("completed"), json!(3_000)));
    let text = offshoot(&app.base, &["task", task_id], &[]).await;
    assert_eq!(text.code, 0, "{}", text.stderr);
    assert!(text.stdout.starts_with(&format!("task {task_id}: completed, 3000/3000 messages copied")), "{}", text.stdout);
    let looked = offshoot(&app.base, &["lookup", &fork_cid, &ids[0], "no-such-id", "--json"], &[]).await.json();
    assert_eq!(looked["message_id_map"], json!({ids[0].clone(): copy_id(&fork_cid, &ids[0])}));
}

#[tokio::test]
async fn tree_of_a_source_with_two_forks_and_a_fork_of_a_fork_prints_all_four_in_shape() {
    let app = TestApp::spawn().await;
    app.users(&["amy", "ben"]).await;
    let id = unique("cli-tree");
    let root = format!("agent:{id}");
    app.channel_with(&root, json!({"created_by_id": "amy", "members": ["amy", "ben"], "name": "the root"})).await;
    let pa = app.say(&root, "amy", "where a starts").await;
    app.fork(&root, &pa, &format!("{id}-a")).await.ok();
    let pb = app.say(&root, "ben", "where b starts").await;
    app.fork(&root, &pb, &format!("{id}-b")).await.ok();
    let a = format!("agent:{id}-a");
    let pc = app.say(&a, "amy", "where c starts").await;
    app.fork(&a, &pc, &format!("{id}-c")).await.ok();

    let run = offshoot(&app.base, &["tree", &a], &[]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        run.stdout,
        format!(
            "agent:{id}  \"the root\"  root\n\
             ├── agent:{id}-a  completed 1/1  at \"where a starts\"  ◀\n\
             │   └── agent:{id}-c  completed 2/2  at \"where c starts\"\n\
             └── agent:{id}-b  completed 2/2  at \"where b starts\"\n"
        ),
        "no colour when stdout is not a terminal"
    );
    let doc = offshoot(&app.base, &["tree", &a, "--json"], &[]).await.json();
    let cids: Vec<&str> = doc["nodes"].as_array().expect("nodes").iter().map(|n| n["cid"].as_str().expect("cid")).collect();
    assert_eq!(cids, vec![root.clone(), a.clone(), format!("agent:{id}-b"), format!("agent:{id}-c")]);
}

#[tokio::test]
async fn token_and_console_mint_tokens_the_server_accepts_and_an_expired_one_is_refused() {
    let app = TestApp::spawn().await;
    app.users(&["amy"]).await;
    let cid = format!("agent:{}", unique("cli-tok"));
    app.channel(&cid, "amy", &["amy"]).await;
    let user = offshoot(&app.base, &["token", "--user", "amy", "--ttl", "10m"], &[]).await;
    assert_eq!(user.code, 0, "{}", user.stderr);
    let token = user.stdout.trim();
    app.get(&channel_path(&cid), token).await.ok();
    let server = offshoot(&app.base, &["token", "--json"], &[]).await.json();
    assert_eq!(server["user_id"], Value::Null);
    app.get("/app", server["token"].as_str().expect("token")).await.ok();

    let link = offshoot(&app.base, &["console", "--ttl", "1h", "--json"], &[]).await.json();
    let url = link["url"].as_str().expect("url");
    let fragment = url.strip_prefix(&format!("{}/console#", app.base)).unwrap_or_else(|| panic!("{url}"));
    let (key, console_token) = fragment.split_once('&').expect("two parts");
    assert_eq!(key, format!("api_key={API_KEY}"));
    let console_token = console_token.strip_prefix("token=").expect("token=");
    app.get("/app", console_token).await.ok();
    let plain = offshoot(&app.base, &["console"], &[]).await;
    assert_eq!(plain.stdout.lines().count(), 1, "one line: {:?}", plain.stdout);

    // A console token past its `exp` is refused.
    let now = unix_secs();
    let expired = sign(&Claims { iat: Some(now - 7200), exp: Some(now - 3600), ..Default::default() }, API_SECRET);
    app.get("/app", &expired).await.err(401, 40);
}

#[tokio::test]
async fn wrong_secret_unknown_channel_failed_fork_and_down_server_give_their_exit_codes() {
    let app = TestApp::spawn().await;
    // Wrong secret: the server refuses, with its message and code.
    let line = offshoot(&app.base, &["tree", "agent:whatever"], &[("OFFSHOOT_API_SECRET", "not-the-secret")]).await.failed(1).to_string();
    assert!(line.contains("signature") && line.contains("code 43"), "{line}");
    // Unknown channel.
    let line = offshoot(&app.base, &["tree", "agent:no-such-channel"], &[]).await.failed(1).to_string();
    assert!(line.contains("does not exist") && line.contains("code 16"), "{line}");
    // A fork that ends failed exits 1 with its reason.
    app.users(&["u1"]).await;
    let src = format!("agent:{}", unique("cli-big"));
    app.channel(&src, "u1", &["u1"]).await;
    app.put("/channeltypes/agent", &app.server(), json!({"max_message_length": 10000})).await.ok();
    let t = past_ns();
    app.send_message(&src, json!({"id": unique("big"), "text": "y".repeat(7000), "user_id": "u1", "created_at": rfc3339(t)})).await;
    let point = app.say_at(&src, "u1", &unique("small"), t + 1_000_000).await;
    app.put("/channeltypes/agent", &app.server(), json!({"max_message_length": 5000})).await.ok();
    let run = offshoot(&app.base, &["fork", &src, "--at", &point, "--wait"], &[]).await;
    assert_eq!(run.code, 1, "{run:?}", run = (&run.stdout, &run.stderr));
    assert!(run.stderr.trim_end().lines().count() == 1 && run.stderr.contains("failed: message_too_large"), "{}", run.stderr);
    assert!(run.stdout.contains(": failed"), "the summary still prints: {}", run.stdout);
    // Usage: bad arguments, or no key pair.
    assert_eq!(offshoot(&app.base, &["tree"], &[]).await.code, 2, "a missing argument");
    offshoot(&app.base, &["tree", "not-a-cid"], &[]).await.failed(2);
    let line =
        offshoot(&app.base, &["tree", "agent:x"], &[("OFFSHOOT_API_KEY", ""), ("OFFSHOOT_API_SECRET", "")]).await.failed(2).to_string();
    assert!(line.contains("OFFSHOOT_API_SECRET"), "{line}");
    // A server that is down.
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
    let line = offshoot(&format!("http://127.0.0.1:{port}"), &["tree", "agent:x"], &[]).await.failed(3).to_string();
    assert!(line.contains("cannot reach the server"), "{line}");
}

#[tokio::test]
async fn completions_print_a_script_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let run = offshoot("http://127.0.0.1:1", &["completions", shell], &[]).await;
        assert_eq!(run.code, 0, "{shell}: {}", run.stderr);
        assert!(run.stdout.contains("offshoot") && run.stdout.contains("fork") && run.stdout.contains("console"), "{shell}");
    }
    let help = offshoot("http://127.0.0.1:1", &["--help"], &[]).await;
    assert!(help.stdout.contains("3  the server cannot be reached"), "{}", help.stdout);
}
