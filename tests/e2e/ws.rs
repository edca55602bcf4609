//! The WebSocket role as JS `stream-chat` (legacy `/connect`) and the v2 client
//! (`/api/v2/connect`) use it: the handshake, heartbeats, watching a channel and receiving its
//! events, who receives which message, and how a bad connection is refused.

use crate::helpers::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How long to wait for one frame.
const FRAME_WAIT: Duration = Duration::from_secs(20);

fn ws_base(app: &TestApp) -> String {
    app.base.replacen("http", "ws", 1)
}

/// Opens `/connect` as JS does; returns the socket and the first frame.
async fn connect_legacy(app: &TestApp, user: &str, token: &str, auth_type: &str) -> (Ws, Value) {
    connect_legacy_with(app, user, json!({"id": user}), token, auth_type).await
}

async fn connect_legacy_with(app: &TestApp, user: &str, details: Value, token: &str, auth_type: &str) -> (Ws, Value) {
    let json_param = json!({"user_id": user, "user_details": details, "client_request_id": "r1"}).to_string();
    let url = reqwest::Url::parse_with_params(
        &format!("{}/connect", ws_base(app)),
        &[
            ("json", json_param.as_str()),
            ("api_key", app.api_key.as_str()),
            ("authorization", token),
            ("stream-auth-type", auth_type),
            ("X-Stream-Client", "stream-chat-js-v9.53.0-node"),
        ],
    )
    .expect("a valid url");
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str()).await.expect("the websocket handshake succeeds");
    let first = next_json(&mut ws).await;
    (ws, first)
}

/// Connects `user` with a user token; returns the socket and its connection id.
async fn connect_user(app: &TestApp, user: &str) -> (Ws, String) {
    let (ws, first) = connect_legacy(app, user, &app.user(user), "jwt").await;
    assert_eq!(first["type"], json!("health.check"), "the first frame of an accepted connection: {first}");
    let id = first["connection_id"].as_str().unwrap_or_else(|| panic!("connection_id in {first}")).to_string();
    (ws, id)
}

/// Subscribes a connection to `cid` as JS `channel.watch()` does.
async fn watch(app: &TestApp, cid: &str, user: &str, connection_id: &str) -> Value {
    app.post(&format!("{}/query?connection_id={connection_id}", channel_path(cid)), &app.user(user), json!({"watch": true, "state": true}))
        .await
        .ok()
}

/// The next JSON text frame (bounded wait); panics on close or timeout.
async fn next_json(ws: &mut Ws) -> Value {
    loop {
        let frame = tokio::time::timeout(FRAME_WAIT, ws.next()).await.unwrap_or_else(|_| panic!("no frame within {FRAME_WAIT:?}"));
        match frame {
            Some(Ok(Message::Text(t))) => return serde_json::from_str(t.as_str()).unwrap_or_else(|e| panic!("a JSON frame ({e}): {t}")),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

/// The first event of type `kind` (others are skipped), within a bounded time.
async fn next_event(ws: &mut Ws, kind: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "no {kind} event within {WAIT:?}");
        let v = next_json(ws).await;
        if v["type"] == json!(kind) {
            return v;
        }
    }
}

/// After a `connection.error` the server closes with 1000 (JS then does not reconnect).
async fn expect_close_1000(ws: &mut Ws) {
    let deadline = Instant::now() + FRAME_WAIT;
    loop {
        let frame = tokio::time::timeout_at(deadline, ws.next()).await.expect("the server closes the rejected connection");
        match frame {
            Some(Ok(Message::Close(Some(f)))) => {
                assert_eq!(u16::from(f.code), 1000, "a rejected connection closes with 1000: {f:?}");
                return;
            }
            Some(Ok(Message::Close(None))) => panic!("the close frame carries code 1000"),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("expected a close frame, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_client_connects_with_a_user_token_and_gets_health_check_with_connection_id_and_me() {
    let app = TestApp::spawn().await;
    app.users(&["alice"]).await;
    let (_ws, first) = connect_legacy(&app, "alice", &app.user("alice"), "jwt").await;
    assert_eq!(first["type"], json!("health.check"), "{first}");
    assert_eq!(first["cid"], json!("*"), "{first}");
    assert!(first["connection_id"].as_str().is_some_and(|c| !c.is_empty()), "{first}");
    assert!(first["created_at"].is_string(), "legacy timestamps are RFC 3339: {first}");
    let me = &first["me"];
    assert_eq!(me["id"], json!("alice"), "{first}");
    for key in ["total_unread_count", "unread_channels"] {
        assert_eq!(me[key], json!(0), "me.{key}: {first}");
    }
    for key in ["channel_mutes", "mutes", "devices"] {
        assert!(me[key].is_array(), "me.{key} is a list: {first}");
    }
}

#[tokio::test]
async fn every_client_heartbeat_is_answered_with_a_health_check_carrying_the_connection_id() {
    let app = TestApp::spawn().await;
    app.users(&["alice"]).await;
    let (mut ws, id) = connect_user(&app, "alice").await;
    for n in 0..2 {
        ws.send(Message::text(json!([{"type": "health.check", "client_id": format!("alice--{n}")}]).to_string()))
            .await
            .expect("send a heartbeat");
        let pong = next_event(&mut ws, "health.check").await;
        assert_eq!(pong["connection_id"], json!(id), "{pong}");
    }
}

#[tokio::test]
async fn a_watching_client_receives_message_new_when_a_message_is_sent_server_side() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "bob"]).await;
    let cid = "agent:wsnew";
    app.channel(cid, "bob", &["alice", "bob"]).await;
    let (mut ws, conn) = connect_user(&app, "alice").await;
    watch(&app, cid, "alice", &conn).await;

    let m = app.say(cid, "bob", "hello over the socket").await;

    let ev = next_event(&mut ws, "message.new").await;
    assert_eq!(ev["cid"], json!(cid), "{ev}");
    assert_eq!(ev["channel_type"], json!("agent"), "{ev}");
    assert_eq!(ev["channel_id"], json!("wsnew"), "{ev}");
    assert_eq!(ev["message_id"], json!(m), "{ev}");
    assert_eq!(ev["message"]["text"], json!("hello over the socket"), "{ev}");
    assert_eq!(ev["message"]["user"]["id"], json!("bob"), "{ev}");
    assert!(ev["watcher_count"].as_i64().is_some_and(|n| n >= 1), "message.new carries watcher_count: {ev}");
    assert!(ev["created_at"].is_string(), "legacy events carry RFC 3339 timestamps: {ev}");
}

#[tokio::test]
async fn a_client_that_does_not_watch_the_channel_does_not_receive_its_messages() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "bob"]).await;
    let (quiet, loud) = ("agent:wsquiet", "agent:wsloud");
    app.channel(quiet, "bob", &["bob"]).await;
    app.channel(loud, "bob", &["alice", "bob"]).await;
    let (mut ws, conn) = connect_user(&app, "alice").await;
    watch(&app, loud, "alice", &conn).await;

    app.say(quiet, "bob", "not for alice").await;
    let m = app.say(loud, "bob", "for alice").await;

    // Events reach a connection in outbox order: had the first one come, it would come first.
    let ev = next_event(&mut ws, "message.new").await;
    assert_eq!(ev["message_id"], json!(m), "only the watched channel's message arrives: {ev}");
}

#[tokio::test]
async fn a_shadowed_message_is_pushed_to_its_author_only() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "ghost"]).await;
    let cid = "agent:wsshadow";
    app.channel(cid, "alice", &["alice", "ghost"]).await;
    app.post("/moderation/ban", &app.server(), json!({"target_user_id": "ghost", "shadow": true})).await.ok();
    let (mut alice, a) = connect_user(&app, "alice").await;
    let (mut ghost, g) = connect_user(&app, "ghost").await;
    watch(&app, cid, "alice", &a).await;
    watch(&app, cid, "ghost", &g).await;

    let boo = app.say(cid, "ghost", "boo").await;
    let visible = app.say(cid, "alice", "anyone there?").await;

    let seen_by_ghost = next_event(&mut ghost, "message.new").await;
    assert_eq!(seen_by_ghost["message_id"], json!(boo), "the author sees their shadowed message: {seen_by_ghost}");
    let seen_by_alice = next_event(&mut alice, "message.new").await;
    assert_eq!(seen_by_alice["message_id"], json!(visible), "another watcher never gets the shadowed message: {seen_by_alice}");
}

#[tokio::test]
async fn a_message_with_restricted_visibility_is_pushed_only_to_the_listed_users_and_its_author() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2", "u3"]).await;
    let cid = "agent:wsrestrict";
    app.channel(cid, "u1", &["u1", "u2", "u3"]).await;
    let mut sockets = Vec::new();
    for u in ["u1", "u2", "u3"] {
        let (ws, conn) = connect_user(&app, u).await;
        watch(&app, cid, u, &conn).await;
        sockets.push(ws);
    }

    let secret = app.send_message(cid, json!({"text": "for u2", "user_id": "u1", "restricted_visibility": ["u2"]})).await["id"]
        .as_str()
        .expect("id")
        .to_string();
    let open = app.say(cid, "u1", "for all").await;

    for (ws, expected) in sockets.iter_mut().zip([&secret, &secret, &open]) {
        let ev = next_event(ws, "message.new").await;
        assert_eq!(&ev["message_id"], &json!(expected), "{ev}");
    }
}

#[tokio::test]
async fn a_token_signed_with_another_secret_gets_connection_error_and_close_1000() {
    let app = TestApp::spawn().await;
    app.users(&["alice"]).await;
    let forged = offshoot_core::token::sign(&user_claims("alice"), "not-the-secret");
    let (mut ws, first) = connect_legacy(&app, "alice", &forged, "jwt").await;
    assert_eq!(first["type"], json!("connection.error"), "{first}");
    assert_eq!(first["error"]["StatusCode"], json!(401), "{first}");
    assert_eq!(first["error"]["code"], json!(43), "a bad signature is code 43: {first}");
    assert!(first["error"]["message"].is_string(), "{first}");
    assert!(first.get("connection_id").is_none(), "a rejected connection has no connection_id: {first}");
    expect_close_1000(&mut ws).await;
}

#[tokio::test]
async fn a_token_for_another_user_an_expired_token_and_a_wrong_api_key_are_refused() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "bob"]).await;

    let (mut ws, first) = connect_legacy(&app, "alice", &app.user("bob"), "jwt").await;
    assert_eq!(first["type"], json!("connection.error"), "bob's token cannot connect alice: {first}");
    assert_eq!(first["error"]["StatusCode"], json!(401), "{first}");
    expect_close_1000(&mut ws).await;

    let expired =
        app.token(&offshoot_core::token::Claims { user_id: Some("alice".into()), exp: Some(unix_secs() - 3600), ..Default::default() });
    let (mut ws, first) = connect_legacy(&app, "alice", &expired, "jwt").await;
    assert_eq!(first["error"]["code"], json!(40), "an expired token is code 40: {first}");
    expect_close_1000(&mut ws).await;

    let url = reqwest::Url::parse_with_params(
        &format!("{}/connect", ws_base(&app)),
        &[
            ("json", r#"{"user_id":"alice"}"#),
            ("api_key", "wrong-key"),
            ("authorization", app.user("alice").as_str()),
            ("stream-auth-type", "jwt"),
        ],
    )
    .expect("url");
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str()).await.expect("handshake");
    let first = next_json(&mut ws).await;
    assert_eq!(first["type"], json!("connection.error"), "{first}");
    assert_eq!(first["error"]["code"], json!(2), "a wrong api_key is code 2: {first}");
    expect_close_1000(&mut ws).await;
}

#[tokio::test]
async fn connecting_creates_the_user_from_user_details_and_keeps_fields_it_leaves_out() {
    let app = TestApp::spawn().await;
    let details = json!({"id": "newbie", "name": "New Bie", "color": "green", "role": "admin"});
    let (_ws, first) = connect_legacy_with(&app, "newbie", details, &app.user("newbie"), "jwt").await;
    assert_eq!(first["me"]["name"], json!("New Bie"), "{first}");
    assert_eq!(first["me"]["color"], json!("green"), "custom fields are flat in the legacy dialect: {first}");
    assert_eq!(first["me"]["role"], json!("user"), "a client cannot make itself admin: {first}");

    let (_ws, again) = connect_legacy_with(&app, "newbie", json!({"id": "newbie", "color": "blue"}), &app.user("newbie"), "jwt").await;
    assert_eq!(again["me"]["name"], json!("New Bie"), "{again}");
    assert_eq!(again["me"]["color"], json!("blue"), "{again}");
}

#[tokio::test]
async fn a_banned_user_cannot_connect() {
    let app = TestApp::spawn().await;
    app.users(&["rogue"]).await;
    app.post("/moderation/ban", &app.server(), json!({"target_user_id": "rogue"})).await.ok();
    let (mut ws, first) = connect_legacy(&app, "rogue", &app.user("rogue"), "jwt").await;
    assert_eq!(first["type"], json!("connection.error"), "{first}");
    assert_eq!(first["error"]["StatusCode"], json!(403), "{first}");
    expect_close_1000(&mut ws).await;
}

#[tokio::test]
async fn an_anonymous_client_connects_without_a_token_under_a_server_chosen_id() {
    let app = TestApp::spawn().await;
    let (_ws, first) = connect_legacy(&app, "alice", "", "anonymous").await;
    assert_eq!(first["type"], json!("health.check"), "{first}");
    assert!(first["connection_id"].is_string(), "{first}");
    let id = first["me"]["id"].as_str().expect("me.id");
    assert_ne!(id, "alice", "an anonymous client cannot claim a user's id: {first}");
}

#[tokio::test]
async fn a_v2_client_authenticates_in_its_first_frame_and_receives_v2_events() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "bob"]).await;
    let cid = "agent:wsv2";
    app.channel(cid, "bob", &["alice", "bob"]).await;
    let url = format!("{}/api/v2/connect?api_key={}&stream-auth-type=jwt", ws_base(&app), app.api_key);
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str()).await.expect("handshake");
    ws.send(Message::text(json!({"token": app.user("alice"), "user_details": {"id": "alice"}}).to_string())).await.expect("auth frame");
    let ok = next_json(&mut ws).await;
    assert_eq!(ok["type"], json!("connection.ok"), "{ok}");
    assert_eq!(ok["me"]["id"], json!("alice"), "{ok}");
    assert!(ok["me"]["created_at"].is_i64(), "v2 timestamps are nanoseconds: {ok}");
    let conn = ok["connection_id"].as_str().expect("connection_id").to_string();
    watch(&app, cid, "alice", &conn).await;

    let m = app.say(cid, "bob", "v2 hello").await;

    let ev = next_event(&mut ws, "message.new").await;
    assert_eq!(ev["message_id"], json!(m), "{ev}");
    assert!(ev["created_at"].is_i64(), "v2 events carry nanosecond timestamps: {ev}");
    assert!(ev["message"]["created_at"].is_i64(), "{ev}");
}

#[tokio::test]
async fn a_v2_client_with_a_bad_token_gets_connection_error() {
    let app = TestApp::spawn().await;
    let url = format!("{}/api/v2/connect?api_key={}&stream-auth-type=jwt", ws_base(&app), app.api_key);
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str()).await.expect("handshake");
    ws.send(Message::text(json!({"token": "not-a-jwt", "user_details": {"id": "alice"}}).to_string())).await.expect("auth frame");
    let first = next_json(&mut ws).await;
    assert_eq!(first["type"], json!("connection.error"), "{first}");
    assert_eq!(first["error"]["StatusCode"], json!(401), "{first}");
    expect_close_1000(&mut ws).await;
}

#[tokio::test]
async fn closing_the_socket_ends_its_watches() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "bob"]).await;
    let cid = "agent:wsgone";
    app.channel(cid, "bob", &["alice", "bob"]).await;
    let (mut gone, conn) = connect_user(&app, "alice").await;
    watch(&app, cid, "alice", &conn).await;
    gone.close(None).await.expect("close");
    // The server answers the close handshake once it has read the close frame.
    let _ = tokio::time::timeout(FRAME_WAIT, async { while let Some(Ok(_)) = gone.next().await {} }).await;

    let (mut ws, conn) = connect_user(&app, "bob").await;
    watch(&app, cid, "bob", &conn).await;
    let m = app.say(cid, "bob", "who is here?").await;
    let ev = next_event(&mut ws, "message.new").await;
    assert_eq!(ev["message_id"], json!(m), "{ev}");
    assert_eq!(ev["watcher_count"], json!(1), "alice's closed connection no longer watches: {ev}");
}

#[tokio::test]
async fn with_api_and_ws_in_separate_servers_a_watch_made_through_the_api_reaches_the_ws_server() {
    // The ws role holds the socket; the api role (another server on the same database) takes
    // the watch query and relays it through the outbox.
    let ws_server = TestApp::spawn_with(|c| c.roles = offshoot::Roles { api: false, ws: true, worker: false }).await;
    let api = TestApp::spawn_on(ws_server.db.clone(), |c| c.roles = offshoot::Roles { api: true, ws: false, worker: true }).await;
    api.users(&["alice", "bob"]).await;
    let cid = "agent:split";
    api.channel(cid, "bob", &["alice", "bob"]).await;
    let (mut ws, conn) = connect_user(&ws_server, "alice").await;
    watch(&api, cid, "alice", &conn).await;

    let m = api.say(cid, "bob", "across processes").await;
    let ev = next_event(&mut ws, "message.new").await;
    assert_eq!(ev["message_id"], json!(m), "{ev}");

    // Stop watching through the api server: later messages no longer arrive, and the relay
    // events themselves are never pushed to clients.
    api.post(&format!("{}/stop-watching?connection_id={conn}", channel_path(cid)), &api.user("alice"), json!({})).await.ok();
    api.say(cid, "bob", "after stop-watching").await;
    let other = "agent:split-marker";
    api.channel(other, "bob", &["alice", "bob"]).await;
    watch(&api, other, "alice", &conn).await;
    let marker = api.say(other, "bob", "marker").await;
    loop {
        let ev = next_json(&mut ws).await;
        assert!(!ev["type"].as_str().unwrap_or_default().starts_with("offshoot."), "relay events stay internal: {ev}");
        assert_ne!(ev["message"]["text"], json!("after stop-watching"), "no events after stop-watching: {ev}");
        if ev["type"] == json!("message.new") && ev["message_id"] == json!(marker) {
            break;
        }
    }
}
