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

pub(crate) type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How long to wait for one frame.
const FRAME_WAIT: Duration = Duration::from_secs(20);

pub(crate) fn ws_base(app: &Client) -> String {
    app.base.replacen("http", "ws", 1)
}

/// Opens `/connect` as JS does; returns the socket and the first frame.
pub(crate) async fn connect_legacy(app: &Client, user: &str, token: &str, auth_type: &str) -> (Ws, Value) {
    connect_legacy_with(app, user, json!({"id": user}), token, auth_type).await
}

pub(crate) async fn connect_legacy_with(app: &Client, user: &str, details: Value, token: &str, auth_type: &str) -> (Ws, Value) {
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
pub(crate) async fn connect_user(app: &Client, user: &str) -> (Ws, String) {
    let (ws, first) = connect_legacy(app, user, &app.user(user), "jwt").await;
    assert_eq!(first["type"], json!("health.check"), "the first frame of an accepted connection: {first}");
    let id = first["connection_id"].as_str().unwrap_or_else(|| panic!("connection_id in {first}")).to_string();
    (ws, id)
}

/// Subscribes a connection to `cid` as JS `channel.watch()` does.
pub(crate) async fn watch(app: &Client, cid: &str, user: &str, connection_id: &str) -> Value {
    app.post(&format!("{}/query?connection_id={connection_id}", channel_path(cid)), &app.user(user), json!({"watch": true, "state": true}))
        .await
        .ok()
}

/// The next JSON text frame (bounded wait); panics on close or timeout.
pub(crate) async fn next_json(ws: &mut Ws) -> Value {
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
pub(crate) async fn next_event(ws: &mut Ws, kind: &str) -> Value {
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
async fn a_member_that_does_not_watch_the_channel_does_not_receive_its_messages() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "bob"]).await;
    let (quiet, loud) = ("agent:wsquiet", "agent:wsloud");
    // Alice is a member of both channels: only watching tells them apart.
    app.channel(quiet, "bob", &["alice", "bob"]).await;
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

    // Stop watching through the api server: later messages no longer arrive as channel events
    // (only as the member's notification), and the relay events are never pushed to clients.
    api.post(&format!("{}/stop-watching?connection_id={conn}", channel_path(cid)), &api.user("alice"), json!({})).await.ok();
    api.say(cid, "bob", "after stop-watching").await;
    let other = "agent:split-marker";
    api.channel(other, "bob", &["alice", "bob"]).await;
    watch(&api, other, "alice", &conn).await;
    let marker = api.say(other, "bob", "marker").await;
    loop {
        let ev = next_json(&mut ws).await;
        assert!(!ev["type"].as_str().unwrap_or_default().starts_with("offshoot."), "relay events stay internal: {ev}");
        if ev["message"]["text"] == json!("after stop-watching") {
            // Alice is still a member: she hears it as a member who does not watch.
            assert_eq!(ev["type"], json!("notification.message_new"), "no channel events after stop-watching: {ev}");
        }
        if ev["type"] == json!("message.new") && ev["message_id"] == json!(marker) {
            break;
        }
    }
}

// --- whose connection ---------------------------------------------------------------------------

/// The first `message.new` of `ws` is `expected`: events reach a connection in outbox order,
/// so anything sent before the marker would have come first.
async fn next_message_is(ws: &mut Ws, expected: &str, why: &str) {
    let ev = next_event(ws, "message.new").await;
    assert_eq!(ev["message_id"], json!(expected), "{why}: {ev}");
}

async fn someone_elses_connection_cannot_be_watched_or_unwatched(api: &TestApp, ws_server: &TestApp, tag: &str) {
    api.users(&["alice", "mallory", "bob"]).await;
    let (theirs, shared, marker) = (format!("agent:{tag}-m"), format!("agent:{tag}-s"), format!("agent:{tag}-k"));
    api.channel(&theirs, "mallory", &["mallory"]).await;
    api.channel(&shared, "bob", &["alice", "mallory", "bob"]).await;
    api.channel(&marker, "bob", &["alice", "bob"]).await;
    let (mut alice, conn) = connect_user(ws_server, "alice").await;
    watch(api, &shared, "alice", &conn).await;
    watch(api, &marker, "alice", &conn).await;

    // Mallory subscribes alice's connection to a channel of hers, and unsubscribes it from one
    // alice watches: both are answered (a connection id is not a secret the server can prove
    // ownership of across processes) and both change nothing.
    watch(api, &theirs, "mallory", &conn).await;
    api.post(&format!("{}/stop-watching?connection_id={conn}", channel_path(&shared)), &api.user("mallory"), json!({})).await.ok();

    let leaked = api.say(&theirs, "mallory", "for mallory's channel only").await;
    let kept = api.say(&shared, "bob", "alice still watches this").await;
    next_message_is(&mut alice, &kept, "mallory's channel is not pushed to alice, and alice still watches the shared one").await;
    let _ = leaked;

    // Alice herself can stop watching with her connection.
    api.post(&format!("{}/stop-watching?connection_id={conn}", channel_path(&shared)), &api.user("alice"), json!({})).await.ok();
    api.say(&shared, "bob", "not for alice any more").await;
    let m = api.say(&marker, "bob", "marker").await;
    next_message_is(&mut alice, &m, "after her own stop-watching").await;
}

#[tokio::test]
async fn a_user_cannot_watch_or_stop_watching_with_another_users_connection() {
    let app = TestApp::spawn().await;
    someone_elses_connection_cannot_be_watched_or_unwatched(&app, &app, "own").await;
}

#[tokio::test]
async fn a_user_cannot_watch_or_stop_watching_with_another_users_connection_held_by_another_server() {
    let ws_server = TestApp::spawn_with(|c| c.roles = offshoot::Roles { api: false, ws: true, worker: false }).await;
    let api = TestApp::spawn_on(ws_server.db.clone(), |c| c.roles = offshoot::Roles { api: true, ws: false, worker: true }).await;
    someone_elses_connection_cannot_be_watched_or_unwatched(&api, &ws_server, "split").await;
}

#[tokio::test]
async fn stop_watching_a_channel_one_may_not_read_is_refused_with_code_17() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "bob"]).await;
    app.channel("agent:wsnotyours", "bob", &["bob"]).await;
    let (_ws, conn) = connect_user(&app, "alice").await;
    app.post(&format!("/channels/agent/wsnotyours/stop-watching?connection_id={conn}"), &app.user("alice"), json!({})).await.err(403, 17);
    app.post("/channels/agent/no-such-channel/stop-watching", &app.user("alice"), json!({})).await.err(404, 16);
}

// --- reconnecting, shutdown, slow and oversized ---------------------------------------------------

#[tokio::test]
async fn a_client_that_reconnects_gets_a_new_connection_and_recovers_what_it_missed_by_querying_again() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "bob"]).await;
    let cid = "agent:wsback";
    app.channel(cid, "bob", &["alice", "bob"]).await;
    let (mut first, conn1) = connect_user(&app, "alice").await;
    watch(&app, cid, "alice", &conn1).await;
    let before = app.say(cid, "bob", "before the drop").await;
    next_message_is(&mut first, &before, "the first connection works").await;
    first.close(None).await.expect("close");
    let _ = tokio::time::timeout(FRAME_WAIT, async { while let Some(Ok(_)) = first.next().await {} }).await;

    // While alice is away.
    let missed: Vec<String> = [app.say(cid, "bob", "missed 1").await, app.say(cid, "bob", "missed 2").await].to_vec();

    let (mut second, conn2) = connect_user(&app, "alice").await;
    assert_ne!(conn1, conn2, "a reconnect is a new connection");
    // The old connection id is gone: watching with it is a no-op, not an error or a leak.
    watch(&app, cid, "alice", &conn1).await;
    // What JS does after a reconnect: query its channels again, with watch.
    let state = watch(&app, cid, "alice", &conn2).await;
    let got = ids(&state["messages"]);
    assert_eq!(got, [vec![before.clone()], missed.clone()].concat(), "the re-query returns what was missed: {state}");
    let live = app.say(cid, "bob", "after the reconnect").await;
    let ev = next_event(&mut second, "message.new").await;
    assert_eq!(ev["message_id"], json!(live), "live events resume on the new connection, and none is replayed: {ev}");
    assert_eq!(ev["watcher_count"], json!(1), "{ev}");
}

#[tokio::test]
async fn at_server_shutdown_every_connection_is_closed_with_1001_going_away() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "bob"]).await;
    let (mut a, _) = connect_user(&app, "alice").await;
    let url = format!("{}/api/v2/connect?api_key={}&stream-auth-type=jwt", ws_base(&app), app.api_key);
    let (mut b, _) = tokio_tungstenite::connect_async(url.as_str()).await.expect("handshake");
    b.send(Message::text(json!({"token": app.user("bob"), "user_details": {"id": "bob"}}).to_string())).await.expect("auth frame");
    assert_eq!(next_json(&mut b).await["type"], json!("connection.ok"));

    app.begin_shutdown();
    for (who, ws) in [("legacy", &mut a), ("v2", &mut b)] {
        let deadline = Instant::now() + FRAME_WAIT;
        loop {
            match tokio::time::timeout_at(deadline, ws.next()).await.unwrap_or_else(|_| panic!("{who}: no close frame at shutdown")) {
                Some(Ok(Message::Close(Some(f)))) => {
                    assert_eq!(u16::from(f.code), 1001, "{who}: going away, so clients reconnect elsewhere: {f:?}");
                    break;
                }
                Some(Ok(Message::Text(_) | Message::Ping(_) | Message::Pong(_))) => {}
                other => panic!("{who}: expected a close frame with 1001, got {other:?}"),
            }
        }
    }
}

/// A socket whose receive buffer is tiny, so a client that stops reading fills it at once.
async fn connect_slow(app: &TestApp, user: &str) -> (Ws, String) {
    let addr: std::net::SocketAddr = app.base.trim_start_matches("http://").parse().expect("addr");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(2048).expect("SO_RCVBUF");
    let stream = socket.connect(addr).await.expect("connect");
    let json_param = json!({"user_id": user, "user_details": {"id": user}}).to_string();
    let token = app.user(user);
    let url = reqwest::Url::parse_with_params(
        &format!("{}/connect", ws_base(app)),
        &[("json", json_param.as_str()), ("api_key", app.api_key.as_str()), ("authorization", token.as_str()), ("stream-auth-type", "jwt")],
    )
    .expect("url");
    let (mut ws, _) = tokio_tungstenite::client_async(url.as_str(), MaybeTlsStream::Plain(stream)).await.expect("handshake");
    let first = next_json(&mut ws).await;
    (ws, first["connection_id"].as_str().expect("connection_id").to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_dropped_and_the_other_watchers_get_every_event() {
    let app = TestApp::spawn().await;
    app.users(&["slow", "fast", "bob"]).await;
    let cid = "agent:wsslow";
    app.channel(cid, "bob", &["slow", "fast", "bob"]).await;
    let (mut slow, slow_conn) = connect_slow(&app, "slow").await;
    let (mut fast, fast_conn) = connect_user(&app, "fast").await;
    watch(&app, cid, "slow", &slow_conn).await;
    watch(&app, cid, "fast", &fast_conn).await;

    // Batches of messages with text enough to fill the kernel's buffers, then more than a
    // connection may have queued (1024), until a marker shows the slow watcher gone. The fast
    // watcher reads everything after each batch (a batch is well under its own queue).
    let filler = "x".repeat(4000);
    let (batch, max_batches) = (200, 40);
    let (mut sent, mut got) = (Vec::new(), Vec::new());
    let mut dropped_after = None;
    for b in 0..max_batches {
        let messages: Vec<Value> =
            (0..batch).map(|i| json!({"id": format!("slow-{b:03}-{i:03}"), "text": format!("{i} {filler}"), "user_id": "bob"})).collect();
        sent.extend(messages.iter().map(|m| m["id"].as_str().expect("id").to_string()));
        // One at a time, so the outbox order is the order they are listed in.
        app.send_many(cid, messages, 1).await;
        let marker = app.say(cid, "bob", &format!("marker {b}")).await;
        let count = loop {
            let ev = next_event(&mut fast, "message.new").await;
            if ev["message_id"] == json!(marker) {
                break ev["watcher_count"].clone();
            }
            got.push(ev["message_id"].as_str().expect("message_id").to_string());
        };
        if count == json!(1) {
            dropped_after = Some(sent.len());
            break;
        }
        assert_eq!(count, json!(2), "{b}");
    }
    let n = dropped_after.unwrap_or_else(|| panic!("the slow watcher was still there after {} messages", sent.len()));
    assert_eq!(got, sent, "the fast watcher got every event, in order, while the slow one fell behind");

    // Reading now, the slow client finds its socket ends (1013 "try again", or the server gave
    // up writing) before it has all the events.
    let mut delivered = 0;
    let ended = tokio::time::timeout(WAIT, async {
        loop {
            match slow.next().await {
                Some(Ok(Message::Text(t))) if t.as_str().contains("\"message.new\"") => delivered += 1,
                Some(Ok(Message::Close(Some(f)))) => {
                    assert_eq!(u16::from(f.code), 1013, "a dropped client is told to try again: {f:?}");
                    return;
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the slow client's socket was not closed");
    assert!(delivered < n, "the slow client cannot have received every event ({delivered})");
}

#[tokio::test]
async fn a_frame_over_64_kib_closes_the_connection_and_the_server_keeps_serving() {
    let app = TestApp::spawn().await;
    app.users(&["alice"]).await;
    let (mut ws, conn) = connect_user(&app, "alice").await;
    // Just under the limit: a (padded) heartbeat is answered.
    let padded = |len: usize| {
        let head = json!([{"type": "health.check", "client_id": "alice--1", "pad": ""}]).to_string();
        head.replace("\"pad\":\"\"", &format!("\"pad\":\"{}\"", "p".repeat(len - head.len())))
    };
    ws.send(Message::text(padded(60 * 1024))).await.expect("send");
    assert_eq!(next_event(&mut ws, "health.check").await["connection_id"], json!(conn));

    ws.send(Message::text(padded(64 * 1024 + 1))).await.expect("send");
    let deadline = Instant::now() + FRAME_WAIT;
    let closed_with = loop {
        match tokio::time::timeout_at(deadline, ws.next()).await.expect("the server closes the connection") {
            Some(Ok(Message::Close(f))) => break f.map(|f| u16::from(f.code)),
            Some(Ok(_)) => {}
            Some(Err(_)) | None => break None,
        }
    };
    assert_eq!(closed_with, Some(1009), "message too big");
    let (_again, _) = connect_user(&app, "alice").await;
}

/// REST's answer to a `POST /channels` with `token` and `api_key`: (HTTP status, code, message).
async fn rest_verdict(app: &TestApp, api_key: &str, token: &str) -> (Value, Value, Value) {
    let rb = app
        .http
        .post(format!("{}/channels?api_key={api_key}", app.base))
        .header("Authorization", token)
        .header("stream-auth-type", "jwt")
        .json(&json!({}));
    let body = app.send(rb).await.body;
    (body["StatusCode"].clone(), body["code"].clone(), body["message"].clone())
}

/// The WebSocket's answer to `/connect` as `user` with `token` and `api_key`: the
/// `connection.error`'s (status, code, message).
async fn ws_verdict(app: &TestApp, api_key: &str, user: &str, token: &str) -> (Value, Value, Value) {
    let json_param = json!({"user_id": user, "user_details": {"id": user}}).to_string();
    let params = [("json", json_param.as_str()), ("api_key", api_key), ("authorization", token), ("stream-auth-type", "jwt")];
    let url = reqwest::Url::parse_with_params(&format!("{}/connect", ws_base(app)), &params).expect("a valid url");
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str()).await.expect("the websocket handshake succeeds");
    let first = next_json(&mut ws).await;
    assert_eq!(first["type"], json!("connection.error"), "{first}");
    expect_close_1000(&mut ws).await;
    let e = &first["error"];
    (e["StatusCode"].clone(), e["code"].clone(), e["message"].clone())
}

/// Asserts that REST refuses `token` with `code` and the WebSocket, connecting as `user`, with
/// the same status, code and message; `code` 0: both accept it.
async fn same_verdict(app: &TestApp, what: &str, api_key: &str, user: &str, token: &str, code: i64) {
    let rest = rest_verdict(app, api_key, token).await;
    if code == 0 {
        assert_eq!(rest.1, Value::Null, "{what}: REST accepts it: {rest:?}");
        let (_ws, first) = connect_legacy(app, user, token, "jwt").await;
        assert_eq!(first["type"], json!("health.check"), "{what}: the WebSocket accepts it: {first}");
        return;
    }
    assert_eq!(rest.1, json!(code), "{what}: REST answers code {code}: {rest:?}");
    let ws = ws_verdict(app, api_key, user, token).await;
    assert_eq!(rest, ws, "{what}: REST and the WebSocket answer alike");
}

#[tokio::test]
async fn the_rest_api_and_the_websocket_refuse_every_bad_credential_with_the_same_status_code_and_message() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "rogue"]).await;
    app.post("/moderation/ban", &app.server(), json!({"target_user_id": "rogue"})).await.ok();
    let now = unix_secs();
    let alice = |exp: Option<i64>, nbf: Option<i64>, iat: Option<i64>| {
        app.token(&offshoot_core::token::Claims { user_id: Some("alice".into()), exp, nbf, iat, ..Default::default() })
    };
    let key = app.api_key.as_str();
    let forged = offshoot_core::token::sign(&user_claims("alice"), "not-the-secret");
    same_verdict(&app, "another secret", key, "alice", &forged, 43).await;
    same_verdict(&app, "expired", key, "alice", &alice(Some(now - 3600), None, None), 40).await;
    same_verdict(&app, "not valid yet", key, "alice", &alice(None, Some(now + 3600), None), 41).await;
    same_verdict(&app, "not a JWT", key, "alice", "not.a.jwt", 5).await;
    same_verdict(&app, "no token", key, "alice", "", 5).await;
    same_verdict(&app, "a wrong api_key", "wrong-key", "alice", &app.user("alice"), 2).await;
    same_verdict(&app, "no api_key", "", "alice", &app.user("alice"), 2).await;
    same_verdict(&app, "a banned user", key, "rogue", &app.user("rogue"), 17).await;
    same_verdict(&app, "an illegal user id", key, "no spaces", &app.user("no spaces"), 4).await;

    app.patch("/app", &app.server(), json!({"revoke_tokens_issued_before": rfc3339(now_ns())})).await.ok();
    same_verdict(&app, "issued before the revocation", key, "alice", &alice(None, None, Some(now - 3600)), 5).await;
    // An `iat` this large overflows nanoseconds unless the conversion saturates.
    same_verdict(&app, "issued in the far future", key, "alice", &alice(None, None, Some(i64::MAX)), 0).await;
}
