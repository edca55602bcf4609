//! Operating the server (README "Operating"): request ids, `/metrics` moving while a fork
//! backfills and a webhook receiver fails, the OpenAPI document matching the routes, the
//! limits, and kept-alive connections surviving early answers.

use crate::helpers::*;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Sum of the samples of `name` whose labels contain every `label="value"` in `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
        if metric != name || !labels.iter().all(|l| rest.contains(l)) {
            continue;
        }
        *found.get_or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    found
}

async fn scrape(app: &TestApp) -> String {
    let resp = reqwest::get(format!("{}/metrics", app.base)).await.expect("GET /metrics");
    assert_eq!(resp.status(), 200);
    let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    assert!(ct.starts_with("text/plain"), "Prometheus text format: {ct}");
    resp.text().await.expect("metrics text")
}

/// A webhook receiver on `127.0.0.1:0` that answers 500 to everything.
async fn failing_receiver() -> String {
    let app = axum::Router::new().route("/hook", axum::routing::post(|| async { axum::http::StatusCode::INTERNAL_SERVER_ERROR }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the receiver");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}/hook")
}

#[tokio::test]
async fn metrics_show_requests_forks_backfill_pages_and_failing_webhooks_moving() {
    // Small pages, so the backfill takes several.
    let app = TestApp::spawn_with(|c| c.backfill_page_size = 50).await;
    let before = scrape(&app).await;
    let hook = failing_receiver().await;
    app.patch("/app", &app.server(), json!({"webhook_url": hook})).await.ok();
    app.users(&["u1"]).await;
    let cid = format!("agent:{}", unique("metrics"));
    app.channel(&cid, "u1", &["u1"]).await;
    let ids = app.seed(&cid, "u1", "m", 400, past_ns(), 8).await;
    let fork_id = unique("metrics-fork");
    app.fork(&cid, &ids[399], &fork_id).await.ok();
    app.wait_fork_finished(&format!("agent:{fork_id}")).await;

    // Webhook attempts fail and are retried (in the background): wait, bounded, for a retry.
    let deadline = Instant::now() + WAIT;
    let after = loop {
        let text = scrape(&app).await;
        let retried = sample(&text, "offshoot_webhook_deliveries_total", &["outcome=\"retried\""]).unwrap_or(0.0);
        if retried > sample(&before, "offshoot_webhook_deliveries_total", &["outcome=\"retried\""]).unwrap_or(0.0) {
            break text;
        }
        assert!(Instant::now() < deadline, "no webhook retry counted within {WAIT:?}:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let grew = |name: &str, labels: &[&str]| {
        let (b, a) = (sample(&before, name, labels).unwrap_or(0.0), sample(&after, name, labels));
        assert!(a.is_some_and(|a| a > b), "{name}{labels:?} did not grow: before {b}, after {a:?}\n{after}");
    };
    grew("offshoot_http_requests_total", &["route=\"/channels/{type}/{id}/fork\"", "status=\"200\""]);
    grew("offshoot_http_request_duration_seconds_count", &["route=\"/channels/{type}/{id}/message\""]);
    grew("offshoot_forks_created_total", &[]);
    grew("offshoot_forks_completed_total", &[]);
    grew("offshoot_backfill_pages_total", &[]);
    grew("offshoot_backfill_messages_copied_total", &[]);
    grew("offshoot_webhook_retries_total", &[]);
    // The seed's sends were written in groups; the webhook relay read their events.
    grew("offshoot_write_groups_total", &["kind=\"send\""]);
    grew("offshoot_write_group_writes_total", &["kind=\"send\""]);
    grew("offshoot_write_group_seconds_count", &["kind=\"send\""]);
    grew("offshoot_outbox_events_read_total", &[]);
    for (name, labels) in [
        ("offshoot_backfill_lag_seconds", &[][..]),
        ("offshoot_queue_jobs", &["queue=\"webhook\""][..]),
        ("offshoot_outbox_lag_events", &["consumer=\"webhooks\""][..]),
        ("offshoot_db_pool_connections", &["state=\"idle\""][..]),
        ("offshoot_ws_connections", &[][..]),
    ] {
        assert!(sample(&after, name, labels).is_some(), "{name}{labels:?} is missing:\n{after}");
    }
}

#[tokio::test]
async fn every_request_gets_a_request_id_and_one_it_sent_is_echoed() {
    let app = TestApp::spawn().await;
    let resp = app.request(reqwest::Method::GET, "/app", &app.server()).send().await.expect("GET /app");
    let id = resp.headers().get("x-request-id").and_then(|v| v.to_str().ok()).expect("an X-Request-Id").to_string();
    assert!(uuid::Uuid::parse_str(&id).is_ok(), "a generated id is a UUID: {id}");
    let resp = app.request(reqwest::Method::GET, "/nowhere", &app.server()).header("x-request-id", "abc-123").send().await.unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(resp.headers().get("x-request-id").and_then(|v| v.to_str().ok()), Some("abc-123"));
}

#[tokio::test]
async fn a_plain_get_on_the_websocket_endpoints_answers_the_error_envelope() {
    let app = TestApp::spawn().await;
    for path in ["/connect", "/api/v2/connect"] {
        let r = app.send(app.http.get(app.url(path))).await;
        assert_eq!(r.status, 400, "{path}: {}", r.body);
        assert_error_envelope(&r.body);
        assert_eq!(r.body["code"], json!(4));
    }
}

#[tokio::test]
async fn websocket_connections_beyond_the_cap_are_refused_with_an_envelope() {
    let app = TestApp::spawn_with(|c| c.max_ws_connections = 1).await;
    app.users(&["u1"]).await;
    let url = format!(
        "{}/connect?api_key={}&authorization={}&stream-auth-type=jwt&json={}",
        app.base.replacen("http", "ws", 1),
        app.api_key,
        app.user("u1"),
        "%7B%22user_id%22%3A%22u1%22%7D"
    );
    let (_first, _) = tokio_tungstenite::connect_async(url.as_str()).await.expect("the first connection is accepted");
    match tokio_tungstenite::connect_async(url.as_str()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status(), 503);
            let body: Value = serde_json::from_slice(resp.body().as_deref().unwrap_or_default()).expect("a JSON body");
            assert_error_envelope(&body);
            assert_eq!(body["code"], json!(71));
        }
        other => panic!("the second connection should be refused: {:?}", other.map(|(_, r)| r.status())),
    }
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_with_413_and_the_connection_closed_cleanly() {
    let app = TestApp::spawn_with(|c| c.max_body_bytes = 4096).await;
    let big = json!({"text": "x".repeat(8192)});
    let resp = app.request(reqwest::Method::POST, "/channels", &app.server()).json(&big).send().await.expect("answered");
    assert_eq!(resp.status(), 413);
    assert_eq!(resp.headers().get("connection").and_then(|v| v.to_str().ok()), Some("close"));
    let body: Value = resp.json().await.expect("JSON");
    assert_error_envelope(&body);
    assert_eq!(body["code"], json!(22));
}

/// Reads one HTTP/1.1 response (head and a `Content-Length` body) from `s`.
async fn read_response(s: &mut TcpStream) -> Option<(u16, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0)))
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                let status = head.split(' ').nth(1)?.parse().ok()?;
                return Some((status, head));
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk)).await.ok()?.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test]
async fn an_answer_given_before_the_body_arrived_leaves_the_kept_alive_connection_usable() {
    let app = TestApp::spawn().await;
    let host = app.base.trim_start_matches("http://").to_string();
    for path in ["/channels?api_key=wrong", "/no/such/route?api_key=wrong", "/channels?api_key=e2e-test-key"] {
        let mut s = TcpStream::connect(&host).await.expect("connect");
        // The head alone: the server can answer (bad key, no route, no token) before the body.
        let body = br#"{"filter_conditions":{}}"#;
        let head =
            format!("POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len());
        s.write_all(head.as_bytes()).await.unwrap();
        let first = tokio::time::timeout(Duration::from_millis(300), read_response(&mut s)).await;
        // Then the body, then a second request on the same connection.
        s.write_all(body).await.unwrap();
        let first = match first {
            Ok(r) => r,
            Err(_) => read_response(&mut s).await,
        };
        let (status, head) = first.unwrap_or_else(|| panic!("{path}: no first answer"));
        assert!(status >= 400, "{path}: {status}");
        assert!(!head.to_ascii_lowercase().contains("connection: close"), "{path}: {head}");
        let again = format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n");
        s.write_all(again.as_bytes()).await.unwrap();
        let second = read_response(&mut s).await;
        assert_eq!(second.map(|r| r.0), Some(200), "{path}: the second request on the connection got no answer");
    }
}

#[tokio::test]
async fn the_openapi_document_is_3_1_and_every_operation_in_it_is_routed() {
    let app = TestApp::spawn().await;
    let doc: Value = reqwest::get(format!("{}/openapi.json", app.base)).await.unwrap().json().await.expect("JSON");
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.1")), "{}", doc["openapi"]);
    let paths = doc["paths"].as_object().expect("paths");
    for p in ["/channels/{type}/{id}/fork", "/api/v2/chat/channels/{type}/{id}/fork", "/tasks/{id}", "/api/v2/tasks/{id}"] {
        assert!(paths.contains_key(p), "{p} is documented");
    }
    let fork = &paths["/channels/{type}/{id}/fork"]["post"];
    assert_eq!(fork["requestBody"]["content"]["application/json"]["schema"]["$ref"], json!("#/components/schemas/ForkRequest"));
    assert_eq!(fork["responses"]["default"]["content"]["application/json"]["schema"]["$ref"], json!("#/components/schemas/ErrorEnvelope"));
    for (path, item) in paths {
        for (method, _) in item.as_object().expect("a path item") {
            let concrete = path.replace("{type}", "messaging").replace("{id}", "nothing-here").replace("{name}", "messaging");
            let m = reqwest::Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
            let r = app.call(m, &concrete, &app.server(), None).await;
            let unrouted = r.status == 405 || (r.status == 404 && r.body["message"].as_str().is_some_and(|m| m.starts_with("no endpoint")));
            assert!(!unrouted, "{method} {path} is documented but not routed: {} {}", r.status, r.body);
        }
    }
}
