//! Rate limits as Stream applies them (README, "Rate limits"): the headers on every answer of
//! a limited route, the 429 envelope with `Retry-After`, per-user isolation, server-side
//! tokens exempt from the per-user limit, `GET /rate_limits`, the WebSocket connection cap per
//! user and the per-connection cap on client events, and (PostgreSQL) one limit held across
//! two api processes.

use crate::helpers::*;
use crate::ws::{connect_legacy, connect_user, Ws};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// One answer with its rate-limit headers.
struct Limited {
    status: u16,
    body: Value,
    limit: Option<i64>,
    remaining: Option<i64>,
    reset: Option<i64>,
    retry_after: Option<i64>,
}

async fn call(app: &Client, method: reqwest::Method, path: &str, token: &str, body: Option<Value>) -> Limited {
    let mut rb = app.request(method, path, token);
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let resp = rb.send().await.expect("the server answers");
    let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<i64>().ok());
    let (limit, remaining, reset, retry_after) =
        (header("x-ratelimit-limit"), header("x-ratelimit-remaining"), header("x-ratelimit-reset"), header("retry-after"));
    let status = resp.status().as_u16();
    let body = resp.json::<Value>().await.unwrap_or(Value::Null);
    Limited { status, body, limit, remaining, reset, retry_after }
}

async fn send_as(app: &Client, cid: &str, token: &str, user: &str, text: &str) -> Limited {
    call(
        app,
        reqwest::Method::POST,
        &format!("{}/message", channel_path(cid)),
        token,
        Some(json!({"message": {"text": text, "user_id": user}})),
    )
    .await
}

fn limits(spec: &str) -> offshoot::RateLimitConfig {
    // These tests count server-side tokens too, which a default configuration does not limit.
    offshoot::RateLimitConfig::parse(&format!("server_side=on,{spec}")).expect("a valid limits spec")
}

#[tokio::test]
async fn every_answer_carries_the_headers_a_user_over_its_limit_gets_streams_429_and_others_are_not_refused() {
    let app = TestApp::spawn_with(|c| c.rate_limits = limits("SendMessage=8,GetMessage=50,user=3")).await;
    app.users(&["alice", "bob"]).await;
    app.channel("messaging:limits", "alice", &["alice", "bob"]).await;
    let (alice, bob) = (app.user("alice"), app.user("bob"));

    // Alice's three sends spend her per-user budget of 3; the headers count it down.
    let before = unix_secs();
    for left in [2, 1, 0] {
        let r = send_as(&app, "messaging:limits", &alice, "alice", "hi").await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!((r.limit, r.remaining), (Some(3), Some(left)), "the per-user limit is the tighter one");
        let reset = r.reset.expect("X-RateLimit-Reset");
        assert!(reset >= before && reset <= unix_secs() + 61, "reset is a Unix second within the minute: {reset}");
    }
    // The fourth is refused with Stream's envelope, code 9, and when to try again.
    let r = send_as(&app, "messaging:limits", &alice, "alice", "one too many").await;
    assert_eq!(r.status, 429, "{}", r.body);
    Resp { status: r.status, body: r.body.clone() }.err(429, 9);
    assert!(r.body["message"].as_str().unwrap().starts_with("Too many requests"), "{}", r.body);
    assert_eq!((r.limit, r.remaining), (Some(3), Some(0)));
    assert!(r.retry_after.is_some_and(|s| (1..=60).contains(&s)), "Retry-After in seconds: {:?}", r.retry_after);
    let history = app.state("messaging:limits", 10).await;
    assert_eq!(history["messages"].as_array().unwrap().len(), 3, "the refused send wrote nothing");

    // Bob is another user: his budget is his own, and Alice's refusals used none of the app's.
    for left in [2, 1] {
        let r = send_as(&app, "messaging:limits", &bob, "bob", "hello").await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.remaining, Some(left));
    }
    // App (web) budget: 8, spent 5 so far. Server-side tokens count apart (their own
    // platform) and are not subject to the per-user limit of 3: eight server-side sends for
    // Alice pass, the ninth meets the app's server-side limit.
    let server = app.server();
    for i in 0..8 {
        let r = send_as(&app, "messaging:limits", &server, "alice", &format!("server {i}")).await;
        assert_eq!(r.status, 200, "server-side send {i}: {}", r.body);
        assert_eq!((r.limit, r.remaining), (Some(8), Some(7 - i)), "server-side answers show the app's limit");
    }
    let r = send_as(&app, "messaging:limits", &server, "alice", "server over").await;
    Resp { status: r.status, body: r.body.clone() }.err(429, 9);

    // Error answers of a limited route carry the headers too, and each endpoint counts apart.
    let r = call(&app, reqwest::Method::GET, "/messages/no-such-message", &server, None).await;
    assert_eq!(r.status, 404, "{}", r.body);
    assert_eq!((r.limit, r.remaining), (Some(50), Some(49)), "GetMessage has its own budget");
    let r = call(&app, reqwest::Method::GET, "/api/v2/chat/messages/no-such-message", &bob, None).await;
    assert_eq!(r.limit, Some(3), "the v2 path is the same endpoint: {}", r.body);
}

#[tokio::test]
async fn the_cors_preflight_exposes_the_rate_limit_headers() {
    let app = TestApp::spawn().await;
    let resp = app
        .http
        .get(app.url("/app"))
        .header("Origin", "https://example.com")
        .header("Authorization", app.user("alice"))
        .header("stream-auth-type", "jwt")
        .send()
        .await
        .expect("answer");
    let exposed = resp.headers().get("access-control-expose-headers").and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
    for h in ["x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "retry-after"] {
        assert!(exposed.contains(h), "{h} is exposed to browsers: {exposed:?}");
    }
    assert!(resp.headers().contains_key("x-ratelimit-limit"), "GET /app carries the headers");
}

#[tokio::test]
async fn get_rate_limits_answers_streams_shape_for_the_platforms_and_endpoints_asked() {
    // A bucket of 10 refills one every 6 s: the counts below are read well within that.
    let app = TestApp::spawn_with(|c| c.rate_limits = limits("SendMessage=10")).await;
    app.users(&["alice"]).await;
    app.channel("messaging:rl", "alice", &["alice"]).await;
    for _ in 0..4 {
        assert_eq!(send_as(&app, "messaging:rl", &app.server(), "alice", "x").await.status, 200);
    }
    let body = app.get("/rate_limits?server_side=true&endpoints=SendMessage,GetApp", &app.server()).await.ok();
    let sm = &body["server_side"]["SendMessage"];
    assert_eq!(sm["limit"], json!(10), "{body}");
    assert_eq!(sm["remaining"], json!(6), "four sends spent, reading spent nothing: {body}");
    assert!(sm["reset"].as_i64().is_some_and(|r| r >= unix_secs()), "{body}");
    assert_eq!(body["server_side"]["GetApp"]["limit"], json!(10_000), "Stream's default: {body}");
    assert!(body.get("web").is_none() && body.get("android").is_none(), "only the platforms asked for: {body}");
    assert_eq!(body["server_side"].as_object().unwrap().len(), 2, "only the endpoints asked for: {body}");

    // No platform asked: all four, every endpoint; under /api/v2 too.
    let all = app.get("/api/v2/rate_limits", &app.server()).await.ok();
    for p in ["server_side", "android", "ios", "web"] {
        assert!(all[p]["SendMessage"]["limit"].is_i64(), "{p}: {all}");
    }
    assert_eq!(all["web"]["SendMessage"]["remaining"], json!(10), "web spent nothing: {all}");
    // Server-side only; an unknown endpoint name is a named input error.
    app.get("/rate_limits", &app.user("alice")).await.err(403, 17);
    let bad = app.get("/rate_limits?endpoints=SendMesage", &app.server()).await.err(400, 4);
    assert_eq!(bad["exception_fields"]["field"], json!("endpoints"), "{bad}");
}

/// Reads frames until a close frame (its code) or the socket ends (None), bounded.
async fn close_code(ws: &mut Ws) -> Option<u16> {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(20), ws.next()).await {
            Ok(Some(Ok(Message::Close(frame)))) => return frame.map(|f| u16::from(f.code)),
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(_))) | Ok(None) | Err(_) => return None,
        }
    }
    None
}

#[tokio::test]
async fn a_users_connection_beyond_the_cap_is_refused_with_streams_error_and_others_connect() {
    let app = TestApp::spawn_with(|c| c.ws_connections_per_user = 3).await;
    app.users(&["many", "other"]).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect_user(&app, "many").await.0);
    }
    let (mut fourth, first) = connect_legacy(&app, "many", &app.user("many"), "jwt").await;
    assert_eq!(first["type"], json!("connection.error"), "{first}");
    assert_eq!((first["error"]["code"].clone(), first["error"]["StatusCode"].clone()), (json!(9), json!(429)), "{first}");
    assert_eq!(close_code(&mut fourth).await, Some(1000), "closed so that the client does not retry at once");
    // Another user is not affected.
    let _other = connect_user(&app, "other").await;
    // Once one of the three is gone, the user may connect again (the server sees the close
    // asynchronously: wait for it, bounded).
    let mut one = held.pop().unwrap();
    one.close(None).await.expect("close");
    let deadline = Instant::now() + WAIT;
    loop {
        let (ws, first) = connect_legacy(&app, "many", &app.user("many"), "jwt").await;
        if first["type"] == json!("health.check") {
            held.push(ws);
            break;
        }
        assert!(Instant::now() < deadline, "the closed connection never freed its place: {first}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_connection_flooding_client_events_is_closed_and_the_others_keep_answering() {
    let app = TestApp::spawn_with(|c| c.ws_client_events_per_minute = 20).await;
    app.users(&["flood", "calm"]).await;
    let (mut flood, flood_id) = connect_user(&app, "flood").await;
    let (mut calm, calm_id) = connect_user(&app, "calm").await;
    let check = |id: &str| Message::Text(json!([{"type": "health.check", "client_id": id}]).to_string().into());
    // Far more than 20 frames at once: the connection is closed with 1008 (policy violation).
    let mut sent = 0;
    for _ in 0..200 {
        if flood.send(check(&flood_id)).await.is_err() {
            break;
        }
        sent += 1;
    }
    assert!(sent > 20, "the flood got going");
    assert_eq!(close_code(&mut flood).await, Some(1008), "the flooding connection is closed with a clear code");
    // The calm connection still answers its health check.
    calm.send(check(&calm_id)).await.expect("send");
    let deadline = Instant::now() + WAIT;
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(20), calm.next()).await.expect("an answer").expect("open").expect("frame");
        if let Message::Text(t) = frame {
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            if v["type"] == json!("health.check") {
                break;
            }
        }
        assert!(Instant::now() < deadline, "no health check answer");
    }
    // And the flooder may reconnect: the cap is per connection.
    let _again = connect_user(&app, "flood").await;
}

/// Waits until fewer than `margin` seconds are left in the current minute is not the case, so
/// that a test counting one window does not straddle two (bounded: at most `margin` s).
async fn away_from_the_minute_end(margin: i64) {
    while 60 - unix_secs().rem_euclid(60) < margin {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn two_api_processes_on_postgres_share_one_limit() {
    if backend() != Backend::Postgres {
        eprintln!("several api processes need PostgreSQL (OFFSHOOT_TEST_BACKEND=postgres); SQLite runs one process");
        return;
    }
    let db = TestDb::create().await;
    let env = [
        ("OFFSHOOT_ROLES", "api"),
        ("OFFSHOOT_RATE_LIMITS", "server_side=on,*=100000,SendMessage=30"),
        ("OFFSHOOT_RATE_LIMIT_FLUSH_MS", "50"),
    ];
    let api1 = ServerProcess::start(&db, &env).await;
    let api2 = ServerProcess::start(&db, &env).await;
    api1.users(&["alice"]).await;
    api1.channel("messaging:shared", "alice", &["alice"]).await;
    away_from_the_minute_end(25).await;

    // 18 sends through the first process...
    for i in 0..18 {
        let r = send_as(&api1, "messaging:shared", &api1.server(), "alice", &format!("a{i}")).await;
        assert_eq!(r.status, 200, "send {i} through the first process: {}", r.body);
    }
    // ...are seen by the second once the counts are flushed (a condition, bounded).
    let deadline = Instant::now() + WAIT;
    loop {
        let body = api2.get("/rate_limits?server_side=true&endpoints=SendMessage", &api2.server()).await.ok();
        if body["server_side"]["SendMessage"]["remaining"].as_i64().is_some_and(|r| r <= 12) {
            break;
        }
        assert!(Instant::now() < deadline, "the second process never saw the first's sends: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The second process admits what is left of the 30, then refuses.
    let mut admitted = 0;
    loop {
        let r = send_as(&api2, "messaging:shared", &api2.server(), "alice", "b").await;
        match r.status {
            200 => admitted += 1,
            429 => break,
            s => panic!("unexpected {s}: {}", r.body),
        }
        assert!(admitted <= 30, "the second process never refused");
    }
    assert_eq!(admitted, 12, "30 per minute across both processes, 18 of them spent through the first");
    // And the first, once it has read the second's count back (a condition, bounded), refuses.
    let deadline = Instant::now() + WAIT;
    loop {
        let body = api1.get("/rate_limits?server_side=true&endpoints=SendMessage", &api1.server()).await.ok();
        if body["server_side"]["SendMessage"]["remaining"] == json!(0) {
            break;
        }
        assert!(Instant::now() < deadline, "the first process never saw the second's sends: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = send_as(&api1, "messaging:shared", &api1.server(), "alice", "c").await;
    Resp { status: r.status, body: r.body }.err(429, 9);
    let total = api1.state("messaging:shared", 100).await["messages"].as_array().unwrap().len();
    assert_eq!(total, 30, "30 per minute across both processes");
}

#[tokio::test]
async fn events_sent_over_rest_for_a_connection_count_against_that_connections_cap() {
    let app = TestApp::spawn_with(|c| {
        c.ws_client_events_per_minute = 5;
        c.rate_limits = limits("*=1000000,user=1000000");
    })
    .await;
    app.users(&["typist", "other"]).await;
    app.channel("messaging:typing", "typist", &["typist", "other"]).await;
    let (_ws, conn) = connect_user(&app, "typist").await;
    let (_ws2, other_conn) = connect_user(&app, "other").await;
    let event = |conn: &str, user: &str| {
        let app = &app;
        let (path, token) = (format!("{}/event?connection_id={conn}", channel_path("messaging:typing")), app.user(user));
        async move { call(app, reqwest::Method::POST, &path, &token, Some(json!({"event": {"type": "typing.start"}}))).await }
    };
    for i in 0..5 {
        let r = event(&conn, "typist").await;
        assert_eq!(r.status, 200, "event {i}: {}", r.body);
    }
    let r = event(&conn, "typist").await;
    assert_eq!(r.status, 429, "the sixth event of the connection within the minute: {}", r.body);
    Resp { status: r.status, body: r.body }.err(429, 9);
    // Another connection's events are not affected.
    let r = event(&other_conn, "other").await;
    assert_eq!(r.status, 200, "{}", r.body);
}

#[tokio::test]
async fn by_default_server_side_tokens_are_not_limited_and_client_side_tokens_are() {
    let app = TestApp::spawn_with(|c| c.rate_limits = offshoot::RateLimitConfig::parse("SendMessage=3,user=2").expect("spec")).await;
    app.users(&["alice", "bob"]).await;
    app.channel("messaging:default-limits", "alice", &["alice", "bob"]).await;
    for i in 0..6 {
        let r = send_as(&app, "messaging:default-limits", &app.server(), "alice", &format!("server {i}")).await;
        assert_eq!(r.status, 200, "server-side send {i}: {}", r.body);
        assert_eq!(r.limit, None, "no limit applies, so no header claims one");
    }
    let bob = app.user("bob");
    for left in [1, 0] {
        let r = send_as(&app, "messaging:default-limits", &bob, "bob", "hi").await;
        assert_eq!((r.status, r.remaining), (200, Some(left)), "{}", r.body);
    }
    let r = send_as(&app, "messaging:default-limits", &bob, "bob", "over").await;
    Resp { status: r.status, body: r.body.clone() }.err(429, 9);
}
