//! Input and lifecycle defects that once reached clients as 500s or leaks, on both backends:
//! NUL characters, html from client-side edits, inexact restricted-visibility matching, and
//! outbox pruning (every role prunes; `require_finished` does not depend on pruned events),
//! over-long ids bound for indexed columns, envelopes on every route, plain logs in a pipe.

use crate::helpers::*;
use serde_json::json;
use std::time::{Duration, Instant};

#[tokio::test]
async fn nul_characters_are_refused_with_a_400_that_names_the_field_on_both_backends() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.channel("agent:nul", "u1", &["u1"]).await;
    let msg_path = format!("{}/message", channel_path("agent:nul"));

    let body = app.post(&msg_path, &app.server(), json!({"message": {"text": "a\u{0}b", "user_id": "u1"}})).await.err(400, 4);
    assert_eq!(body["exception_fields"]["field"], json!("message.text"), "{body}");
    let body = app.post("/users", &app.server(), json!({"users": {"u2": {"id": "u2", "name": "x\u{0}"}}})).await.err(400, 4);
    assert_eq!(body["exception_fields"]["field"], json!("users.u2.name"), "{body}");
    let body = app.post(&msg_path, &app.server(), json!({"message": {"text": "ok", "user_id": "u1", "custom_\u{0}": 1}})).await.err(400, 4);
    assert_eq!(body["exception_fields"]["field"], json!("message.custom_\u{0}"), "{body}");

    for (path, field) in [
        ("/tasks/abc%00def", "id"),
        ("/api/v2/tasks/abc%00def", "id"),
        ("/messages/m%00x", "id"),
        ("/messages/m%00x/replies", "id"),
        ("/threads/t%00", "id"),
    ] {
        let body = app.get(path, &app.server()).await.err(400, 4);
        assert_eq!(body["exception_fields"]["field"], json!(field), "{path}: {body}");
    }
    let body = app.get(&format!("{}?messages_limit=%00", channel_path("agent:nul")), &app.server()).await.err(400, 4);
    assert_eq!(body["exception_fields"]["field"], json!("messages_limit"), "{body}");

    // Nothing was written, and the server is fine.
    let state = app.state("agent:nul", 10).await;
    assert_eq!(state["messages"].as_array().expect("messages").len(), 0, "{state}");
    app.say("agent:nul", "u1", "still works").await;
}

#[tokio::test]
async fn a_client_side_partial_update_cannot_set_html_but_a_server_side_one_can() {
    let app = TestApp::spawn().await;
    app.users(&["author"]).await;
    app.channel("agent:html", "author", &["author"]).await;
    let id = app.say("agent:html", "author", "plain").await;
    let path = format!("/messages/{id}");
    app.put(&path, &app.user("author"), json!({"set": {"html": "<script>x</script>"}})).await.err(403, 17);
    let before = app.get(&path, &app.server()).await.ok()["message"]["html"].clone();
    assert!(!before.as_str().expect("html").contains("script"), "the refused edit changed nothing: {before}");
    let m = app.put(&path, &app.server(), json!({"set": {"html": "<b>bold</b>"}, "user_id": "author"})).await.ok()["message"].clone();
    assert_eq!(m["html"], json!("<b>bold</b>"), "{m}");
}

#[tokio::test]
async fn restricted_visibility_matches_user_ids_exactly_in_reads_and_unread_counts() {
    let app = TestApp::spawn().await;
    // `_` is a LIKE wildcard: "a_c" must not match "abc".
    app.users(&["owner", "a_c", "abc"]).await;
    app.channel("agent:restricted", "owner", &["owner", "a_c", "abc"]).await;
    let id = app
        .send_message("agent:restricted", json!({"text": "for a_c only", "user_id": "owner", "restricted_visibility": ["a_c"]}))
        .await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let seen_by = |user: &'static str| {
        let (app, id) = (&app, &id);
        async move {
            let state =
                app.post(&format!("{}/query", channel_path("agent:restricted")), &app.user(user), json!({"state": true})).await.ok();
            let sees = ids(&state["messages"]).contains(id);
            let unread = state["read"]
                .as_array()
                .expect("read")
                .iter()
                .find(|r| r["user"]["id"] == json!(user))
                .map(|r| r["unread_messages"].as_i64().expect("unread"))
                .expect("a read state of the user");
            (sees, unread)
        }
    };
    assert_eq!(seen_by("a_c").await, (true, 1), "the listed user sees it and has it unread");
    assert_eq!(seen_by("abc").await, (false, 0), "another user whose id matches the LIKE pattern neither sees nor counts it");
    let r = app.get(&format!("/messages/{id}"), &app.user("abc")).await;
    assert_eq!(r.status, 404, "not readable by id either: {}", r.body);
}

#[tokio::test]
async fn a_process_without_the_worker_role_prunes_the_outbox_and_require_finished_survives_pruning() {
    let app = TestApp::spawn_with(|c| {
        c.roles = offshoot::Roles { api: true, ws: true, worker: false };
        c.event_retention = Duration::ZERO;
        c.prune_interval = Duration::from_millis(100);
    })
    .await;
    app.users(&["u1"]).await;
    app.channel("agent:pruned", "u1", &["u1"]).await;
    let answer = app.say("agent:pruned", "u1", "half an answer").await;
    let event = json!({"event": {"type": "ai_indicator.update", "message_id": answer, "ai_state": "AI_STATE_GENERATING", "user_id": "u1"}});
    app.post(&format!("{}/event", channel_path("agent:pruned")), &app.server(), event).await.ok();

    // The outbox empties although no worker runs.
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&app.db.url).await.expect("connect to the test database");
    let deadline = Instant::now() + WAIT;
    loop {
        let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM event").fetch_one(&pool).await.expect("count events");
        if n == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{n} outbox events were never pruned by an api/ws process");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pool.close().await;

    // The agent is still writing: pruning its ai_indicator.update changed nothing.
    let body = json!({"message_id": answer, "channel": {"id": "pruned-fork"}, "require_finished": true});
    app.fork_with("agent:pruned", body).await.err_reason(409, 4, "fork_point_generating");
}

#[tokio::test]
async fn over_long_ids_bound_for_indexed_columns_are_refused_with_a_400_that_names_the_field_on_both_backends() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.channel("agent:long", "u1", &["u1"]).await;
    let path = channel_path("agent:long");
    // Incompressible and far over PostgreSQL's index row limit (about 2.7 KB).
    let long: String = (0..20_000).map(|i| char::from(b'a' + ((i * 7919 + i / 13) % 26) as u8)).collect();

    for kind in ["ai_indicator.update", "ai_indicator.clear"] {
        let body = app
            .post(
                &format!("{path}/event"),
                &app.server(),
                json!({"event": {"type": kind, "message_id": long, "ai_state": "AI_STATE_THINKING", "user_id": "u1"}}),
            )
            .await
            .err(400, 4);
        assert_eq!(body["exception_fields"]["field"], json!("event.message_id"), "{kind}: {body}");
    }
    let body = app
        .post(&format!("{path}/event"), &app.server(), json!({"event": {"type": "ai_indicator.update", "message_id": 7, "user_id": "u1"}}))
        .await
        .err(400, 4);
    assert_eq!(body["exception_fields"]["field"], json!("event.message_id"), "{body}");
    for (field, message) in [
        ("message.parent_id", json!({"text": "a", "user_id": "u1", "parent_id": long})),
        ("message.quoted_message_id", json!({"text": "a", "user_id": "u1", "quoted_message_id": long})),
        ("message.restricted_visibility", json!({"text": "a", "user_id": "u1", "restricted_visibility": [long]})),
    ] {
        let body = app.post(&format!("{path}/message"), &app.server(), json!({"message": message})).await.err(400, 4);
        assert_eq!(body["exception_fields"]["field"], json!(field), "{body}");
    }

    // Nothing was written; a well-formed AI event and message still go through.
    let state = app.state("agent:long", 10).await;
    assert_eq!(state["messages"].as_array().expect("messages").len(), 0, "{state}");
    let id = app.say("agent:long", "u1", "fine").await;
    app.post(
        &format!("{path}/event"),
        &app.server(),
        json!({"event": {"type": "ai_indicator.update", "message_id": id, "ai_state": "AI_STATE_THINKING", "user_id": "u1"}}),
    )
    .await
    .ok();
}

#[tokio::test]
async fn a_wrong_method_on_connect_healthz_and_metrics_and_an_unknown_path_answer_stream_envelopes() {
    let app = TestApp::spawn().await;
    for path in ["/connect", "/api/v2/connect", "/healthz", "/metrics"] {
        for method in [reqwest::Method::PUT, reqwest::Method::PATCH, reqwest::Method::DELETE, reqwest::Method::POST] {
            let r = app.send(app.http.request(method.clone(), format!("{}{path}", app.base))).await;
            let body = r.err(405, 4);
            assert!(body["message"].as_str().is_some_and(|m| m.contains(path)), "{method} {path}: {body}");
        }
    }
    let r = app.send(app.http.get(format!("{}/no/such/endpoint", app.base))).await;
    r.err(404, 16);
}

#[tokio::test]
async fn logs_written_to_a_pipe_carry_no_colour_codes() {
    let db = TestDb::create().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
    let child = std::process::Command::new(binary_path())
        .arg("serve")
        .env("DATABASE_URL", &db.url)
        .env("OFFSHOOT_LISTEN", format!("127.0.0.1:{port}"))
        .env("OFFSHOOT_API_KEY", API_KEY)
        .env("OFFSHOOT_API_SECRET", API_SECRET)
        .env("RUST_LOG", "info")
        .env("OFFSHOOT_LOG_FORMAT", "text")
        .env_remove("NO_COLOR")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning the offshoot binary");
    let client = Client::new(format!("http://127.0.0.1:{port}"));
    client.wait_healthy(|| Ok(())).await;
    let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let out = child.wait_with_output().expect("the server exits");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("offshoot listening"), "the log reached the pipe: {text}");
    assert!(!text.contains('\u{1b}') && !out.stderr.contains(&0x1b), "no ANSI escape in piped logs: {text:?}");
}
