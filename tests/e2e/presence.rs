//! Presence and watchers as Stream clients see them: a user with an open WebSocket connection
//! is `online` (with `last_active`) wherever users are returned; the first connection opening
//! and the last closing announce `user.presence.changed` to the connections that watch, with
//! `presence: true`, a channel the user is a member of; invisible users appear offline and
//! announce nothing. Watchers are counted and listed (`watchers: {limit, offset}`), and
//! `user.watching.start` / `.stop` reach the channel's watchers. On PostgreSQL the same holds
//! across ws processes on one database, also when one of them is killed.

use crate::helpers::*;
use crate::ws::{connect_user, next_event, next_json, Ws};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::time::Instant;

/// Watches `cid` with `connection_id`, asking for presence events or not.
async fn watch_with(app: &Client, cid: &str, user: &str, connection_id: &str, presence: bool) -> Value {
    let body = json!({"watch": true, "state": true, "presence": presence});
    app.post(&format!("{}/query?connection_id={connection_id}", channel_path(cid)), &app.user(user), body).await.ok()
}

/// The stored user as Query Users returns it (server-side).
async fn queried_user(app: &Client, id: &str) -> Value {
    let payload = json!({"filter_conditions": {"id": id}}).to_string();
    let url = reqwest::Url::parse_with_params("http://x/users", &[("payload", payload.as_str())]).expect("url");
    let users = app.get(&format!("/users?{}", url.query().unwrap_or_default()), &app.server()).await.ok();
    users["users"][0].clone()
}

/// Waits (bounded) until Query Users says `id` is `online`.
async fn wait_online(app: &Client, id: &str, online: bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let u = queried_user(app, id).await;
        if u["online"] == json!(online) {
            return u;
        }
        assert!(Instant::now() < deadline, "{id} is not online={online} within {WAIT:?}: {u}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends a marker message into `cid` and returns the frames `ws` received up to its
/// `message.new`: what reached the connection before the marker, in order.
async fn frames_until_marker(app: &Client, ws: &mut Ws, cid: &str, author: &str) -> Vec<Value> {
    let marker = app.say(cid, author, "marker").await;
    let mut frames = Vec::new();
    loop {
        let v = next_json(ws).await;
        if v["type"] == json!("message.new") && v["message"]["id"] == json!(marker) {
            return frames;
        }
        frames.push(v);
    }
}

fn presence_events(frames: &[Value]) -> Vec<&Value> {
    frames.iter().filter(|f| f["type"] == json!("user.presence.changed")).collect()
}

async fn close(mut ws: Ws) {
    let _ = ws.close(None).await;
}

#[tokio::test]
async fn a_connected_user_is_online_with_last_active_everywhere_users_are_returned_and_offline_after_closing() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "bob"]).await;
    let cid = format!("messaging:{}", unique("pres"));
    app.channel(&cid, "alice", &["alice", "bob"]).await;
    let before = queried_user(&app, "bob").await;
    assert_eq!(before["online"], json!(false), "nobody connected yet: {before}");

    let (ws, _) = connect_user(&app, "bob").await;
    let bob = queried_user(&app, "bob").await;
    assert_eq!(bob["online"], json!(true), "bob's connection is recorded before its first frame: {bob}");
    assert!(bob["last_active"].is_string(), "connecting sets last_active: {bob}");
    app.post(&format!("{}/message", channel_path(&cid)), &app.user("bob"), json!({"message": {"id": "hello", "text": "hi"}})).await.ok();
    let state = app.state(&cid, 10).await;
    let member = state["members"].as_array().unwrap().iter().find(|m| m["user_id"] == json!("bob")).cloned().unwrap();
    assert_eq!(member["user"]["online"], json!(true), "members carry online: {member}");
    let alice_member = state["members"].as_array().unwrap().iter().find(|m| m["user_id"] == json!("alice")).cloned().unwrap();
    assert_eq!(alice_member["user"]["online"], json!(false), "alice has no connection: {alice_member}");
    let msg = state["messages"].as_array().unwrap().iter().find(|m| m["id"] == json!("hello")).cloned().unwrap();
    assert_eq!(msg["user"]["online"], json!(true), "message authors carry online: {msg}");

    close(ws).await;
    let after = wait_online(&app, "bob", false).await;
    assert!(after["last_active"].is_string(), "{after}");
}

#[tokio::test]
async fn the_first_connection_and_the_last_close_announce_presence_to_watchers_who_asked_for_it() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "bob", "carol"]).await;
    let cid = format!("messaging:{}", unique("pres"));
    app.channel(&cid, "alice", &["alice", "bob", "carol"]).await;
    let (mut alice, alice_conn) = connect_user(&app, "alice").await;
    watch_with(&app, &cid, "alice", &alice_conn, true).await;
    let (mut carol, carol_conn) = connect_user(&app, "carol").await;
    watch_with(&app, &cid, "carol", &carol_conn, false).await;

    // A side channel alice and bob's first connection watch: its user.watching.stop tells alice
    // that the server has processed the close of that connection.
    let side = format!("messaging:{}", unique("side"));
    app.channel(&side, "alice", &["alice", "bob"]).await;
    watch_with(&app, &side, "alice", &alice_conn, false).await;

    let (bob1, bob1_conn) = connect_user(&app, "bob").await;
    let online = event_about(&mut alice, "user.presence.changed", "bob").await;
    assert_eq!(online["user"]["online"], json!(true), "{online}");
    assert!(online["user"]["last_active"].is_string(), "{online}");
    assert!(online["created_at"].is_string(), "{online}");

    // A second connection, then closing the first: bob stays online, nothing is announced.
    watch_with(&app, &side, "bob", &bob1_conn, false).await;
    let (bob2, _) = connect_user(&app, "bob").await;
    close(bob1).await;
    let stop = next_event(&mut alice, "user.watching.stop").await;
    assert_eq!((stop["cid"].clone(), stop["user"]["id"].clone()), (json!(side), json!("bob")), "{stop}");
    let frames = frames_until_marker(&app, &mut alice, &cid, "carol").await;
    assert!(presence_events(&frames).is_empty(), "no change while bob keeps a connection: {frames:?}");

    close(bob2).await;
    let offline = next_event(&mut alice, "user.presence.changed").await;
    assert_eq!((offline["user"]["id"].clone(), offline["user"]["online"].clone()), (json!("bob"), json!(false)), "{offline}");

    // carol watches without presence: she heard none of it.
    let frames = frames_until_marker(&app, &mut carol, &cid, "alice").await;
    assert!(presence_events(&frames).is_empty(), "carol did not ask for presence: {frames:?}");
}

/// The next event of type `kind` about `user` (others are skipped), within a bounded time.
async fn event_about(ws: &mut Ws, kind: &str, user: &str) -> Value {
    loop {
        let v = next_event(ws, kind).await;
        if v["user"]["id"] == json!(user) {
            return v;
        }
    }
}

/// The next event of type `kind` within `wait` (frames of other types are skipped).
async fn event_within(ws: &mut Ws, kind: &str, wait: Duration) -> Value {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    let deadline = Instant::now() + wait;
    loop {
        let frame = tokio::time::timeout_at(deadline, ws.next()).await.unwrap_or_else(|_| panic!("no {kind} event within {wait:?}"));
        if let Some(Ok(Message::Text(t))) = frame {
            let v: Value = serde_json::from_str(t.as_str()).expect("a JSON frame");
            if v["type"] == json!(kind) {
                return v;
            }
        } else if !matches!(frame, Some(Ok(Message::Ping(_) | Message::Pong(_)))) {
            panic!("the connection ended while waiting for {kind}: {frame:?}");
        }
    }
}

#[tokio::test]
async fn invisible_users_appear_offline_and_announce_nothing() {
    let app = TestApp::spawn().await;
    app.users(&["alice"]).await;
    app.post("/users", &app.server(), json!({"users": {"dave": {"id": "dave", "invisible": true}}})).await.ok();
    let cid = format!("messaging:{}", unique("pres"));
    app.channel(&cid, "alice", &["alice", "dave"]).await;
    let (mut alice, alice_conn) = connect_user(&app, "alice").await;
    watch_with(&app, &cid, "alice", &alice_conn, true).await;

    let (dave, dave_conn) = connect_user(&app, "dave").await;
    let u = queried_user(&app, "dave").await;
    assert_eq!((u["online"].clone(), u["invisible"].clone()), (json!(false), json!(true)), "{u}");
    // dave's watch ending tells alice the server processed his close.
    watch_with(&app, &cid, "dave", &dave_conn, false).await;
    let start = event_about(&mut alice, "user.watching.start", "dave").await;
    assert_eq!(start["user"]["online"], json!(false), "an invisible watcher appears offline: {start}");
    close(dave).await;
    next_event(&mut alice, "user.watching.stop").await;
    let frames = frames_until_marker(&app, &mut alice, &cid, "alice").await;
    assert!(presence_events(&frames).is_empty(), "an invisible user announces nothing: {frames:?}");
}

#[tokio::test]
async fn watchers_are_counted_listed_paginated_and_announced_as_they_start_and_stop() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "bob"]).await;
    let cid = format!("messaging:{}", unique("watch"));
    app.channel(&cid, "alice", &["alice", "bob"]).await;
    let (mut alice, alice_conn) = connect_user(&app, "alice").await;
    let state = watch_with(&app, &cid, "alice", &alice_conn, false).await;
    assert_eq!(state["watcher_count"], json!(1), "alice watches: {}", state["watcher_count"]);
    let start = next_event(&mut alice, "user.watching.start").await;
    assert_eq!((start["user"]["id"].clone(), start["watcher_count"].clone()), (json!("alice"), json!(1)), "{start}");

    let (bob, bob_conn) = connect_user(&app, "bob").await;
    watch_with(&app, &cid, "bob", &bob_conn, false).await;
    let start = next_event(&mut alice, "user.watching.start").await;
    assert_eq!(
        (start["user"]["id"].clone(), start["watcher_count"].clone(), start["cid"].clone()),
        (json!("bob"), json!(2), json!(cid)),
        "{start}"
    );
    // A second watch by the same connection changes nothing.
    watch_with(&app, &cid, "bob", &bob_conn, false).await;

    let q = |body: Value| {
        let app = &app;
        let cid = cid.clone();
        async move { app.post(&format!("{}/query", channel_path(&cid)), &app.server(), body).await }
    };
    let all = q(json!({"state": true, "watchers": {"limit": 10}})).await.ok();
    assert_eq!(all["watcher_count"], json!(2), "{all}");
    let listed: Vec<&str> = all["watchers"].as_array().unwrap().iter().map(|u| u["id"].as_str().unwrap()).collect();
    assert_eq!(listed, ["alice", "bob"], "{}", all["watchers"]);
    assert!(all["watchers"][0]["online"] == json!(true), "watchers are users with online: {}", all["watchers"]);
    let second = q(json!({"state": true, "watchers": {"limit": 1, "offset": 1}})).await.ok();
    assert_eq!(second["watchers"].as_array().unwrap().len(), 1, "{}", second["watchers"]);
    assert_eq!(second["watchers"][0]["id"], json!("bob"));
    let bad = q(json!({"state": true, "watchers": {"limit": 301}})).await.err(400, 4);
    assert!(bad["message"].as_str().unwrap_or_default().contains("watchers"), "{bad}");

    // message.new counts the watchers.
    let marker = app.say(&cid, "bob", "counted").await;
    let new = next_event(&mut alice, "message.new").await;
    assert_eq!((new["message"]["id"].clone(), new["watcher_count"].clone()), (json!(marker), json!(2)), "{new}");

    app.post(&format!("{}/stop-watching?connection_id={bob_conn}", channel_path(&cid)), &app.user("bob"), json!({})).await.ok();
    let stop = next_event(&mut alice, "user.watching.stop").await;
    assert_eq!((stop["user"]["id"].clone(), stop["watcher_count"].clone()), (json!("bob"), json!(1)), "{stop}");

    // Watching again, then closing the connection, also stops.
    watch_with(&app, &cid, "bob", &bob_conn, false).await;
    next_event(&mut alice, "user.watching.start").await;
    close(bob).await;
    let stop = next_event(&mut alice, "user.watching.stop").await;
    assert_eq!((stop["user"]["id"].clone(), stop["watcher_count"].clone()), (json!("bob"), json!(1)), "{stop}");
}

#[tokio::test]
#[ignore = "PostgreSQL only: runs with OFFSHOOT_TEST_BACKEND=postgres and --include-ignored"]
async fn two_ws_processes_on_one_postgres_database_share_presence_and_watchers_and_a_killed_one_is_announced_offline() {
    require_postgres("several ws processes on one database; SQLite runs one process");
    let app = TestApp::spawn().await;
    let other = TestApp::spawn_on(app.db.clone(), |_| {}).await;
    app.users(&["alice", "bob"]).await;
    let cid = format!("messaging:{}", unique("scale"));
    app.channel(&cid, "alice", &["alice", "bob"]).await;
    let (mut alice, alice_conn) = connect_user(&app, "alice").await;
    watch_with(&app, &cid, "alice", &alice_conn, true).await;

    // bob on the other process: alice hears him come online and start watching.
    let (bob, bob_conn) = connect_user(&other, "bob").await;
    let online = next_event(&mut alice, "user.presence.changed").await;
    assert_eq!((online["user"]["id"].clone(), online["user"]["online"].clone()), (json!("bob"), json!(true)), "{online}");
    let state = watch_with(&other, &cid, "bob", &bob_conn, false).await;
    assert_eq!(state["watcher_count"], json!(2), "counted across both processes");
    let start = event_about(&mut alice, "user.watching.start", "bob").await;
    assert_eq!((start["user"]["id"].clone(), start["watcher_count"].clone()), (json!("bob"), json!(2)), "{start}");
    let from_first = app.post(&format!("{}/query", channel_path(&cid)), &app.server(), json!({"state": true})).await.ok();
    assert_eq!(from_first["watcher_count"], json!(2), "either process counts both");
    app.say(&cid, "alice", "counted").await;
    let new = next_event(&mut alice, "message.new").await;
    assert_eq!(new["watcher_count"], json!(2), "{new}");
    close(bob).await;
    let offline = next_event(&mut alice, "user.presence.changed").await;
    assert_eq!(offline["user"]["online"], json!(false), "{offline}");

    // A ws process killed outright: its users go offline once its heartbeat is missed.
    let mut ws_proc = ServerProcess::start(&app.db, &[("OFFSHOOT_ROLES", "ws")]).await;
    let (_bob_again, bob_conn) = connect_user(&ws_proc, "bob").await;
    let online = next_event(&mut alice, "user.presence.changed").await;
    assert_eq!(online["user"]["online"], json!(true), "{online}");
    watch_with(&app, &cid, "bob", &bob_conn, false).await;
    event_about(&mut alice, "user.watching.start", "bob").await;
    ws_proc.kill();
    // Its heartbeat stops; a live process removes its records within the instance TTL (20 s)
    // and one heartbeat (5 s) of the ws role (docs/compatibility.md).
    let stop = event_within(&mut alice, "user.watching.stop", WAIT).await;
    assert_eq!((stop["user"]["id"].clone(), stop["watcher_count"].clone()), (json!("bob"), json!(1)), "{stop}");
    let offline = next_event(&mut alice, "user.presence.changed").await;
    assert_eq!((offline["user"]["id"].clone(), offline["user"]["online"].clone()), (json!("bob"), json!(false)), "{offline}");
    assert_eq!(queried_user(&app, "bob").await["online"], json!(false));
}

#[tokio::test]
async fn every_health_check_carries_the_users_current_unread_counters_in_me() {
    let app = TestApp::spawn().await;
    app.users(&["reader", "writer"]).await;
    let cid = format!("messaging:{}", unique("hc"));
    app.channel(&cid, "writer", &["reader", "writer"]).await;
    let (mut ws, _) = connect_user(&app, "reader").await;
    app.say(&cid, "writer", "one").await;
    app.say(&cid, "writer", "two").await;
    next_event(&mut ws, "notification.message_new").await;
    next_event(&mut ws, "notification.message_new").await;
    // The client's heartbeat, as JS sends it: the answer's `me` has the counters of now.
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    ws.send(Message::Text(r#"[{"type":"health.check","client_id":"reader--1"}]"#.into())).await.expect("send a heartbeat");
    let hc = next_event(&mut ws, "health.check").await;
    let me = &hc["me"];
    assert_eq!(
        (me["total_unread_count"].clone(), me["unread_count"].clone(), me["unread_channels"].clone()),
        (json!(2), json!(2), json!(1)),
        "{hc}"
    );
    assert_eq!(me["online"], json!(true), "{hc}");

    app.post(&format!("{}/read", channel_path(&cid)), &app.user("reader"), json!({})).await.ok();
    next_event(&mut ws, "notification.mark_read").await;
    ws.send(Message::Text(r#"[{"type":"health.check","client_id":"reader--1"}]"#.into())).await.expect("send a heartbeat");
    let hc = next_event(&mut ws, "health.check").await;
    assert_eq!((hc["me"]["total_unread_count"].clone(), hc["me"]["unread_channels"].clone()), (json!(0), json!(0)), "{hc}");
}

#[tokio::test]
async fn query_channels_with_presence_subscribes_to_the_members_presence_and_counts_watchers() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "bob"]).await;
    let cid = format!("messaging:{}", unique("qc"));
    app.channel(&cid, "alice", &["alice", "bob"]).await;
    let (mut alice, alice_conn) = connect_user(&app, "alice").await;
    let body = json!({"filter_conditions": {"cid": cid}, "state": true, "watch": true, "presence": true});
    let got = app.post(&format!("/channels?connection_id={alice_conn}"), &app.user("alice"), body).await.ok();
    assert_eq!(got["channels"][0]["watcher_count"], json!(1), "{got}");
    let (_bob, _) = connect_user(&app, "bob").await;
    let online = event_about(&mut alice, "user.presence.changed", "bob").await;
    assert_eq!(online["user"]["online"], json!(true), "{online}");
}

#[tokio::test]
async fn a_connection_record_the_process_does_not_hold_is_removed_at_its_next_heartbeat() {
    let app = TestApp::spawn().await;
    app.users(&["alice", "carol"]).await;
    let cid = format!("messaging:{}", unique("ghost"));
    app.channel(&cid, "alice", &["alice", "carol"]).await;
    let (mut alice, alice_conn) = connect_user(&app, "alice").await;
    watch_with(&app, &cid, "alice", &alice_conn, true).await;
    // A record of this process for a connection it does not hold (a close whose removal failed).
    crate::worker::execute(
        &app.db,
        "INSERT INTO ws_connection (id, instance_id, user_id, created_at, updated_at) SELECT 'ghost', id, 'carol', 0, 0 FROM ws_instance",
    )
    .await;
    assert_eq!(queried_user(&app, "carol").await["online"], json!(true), "the record makes carol online");
    let offline = event_within(&mut alice, "user.presence.changed", WAIT).await;
    assert_eq!((offline["user"]["id"].clone(), offline["user"]["online"].clone()), (json!("carol"), json!(false)), "{offline}");
    assert_eq!(queried_user(&app, "carol").await["online"], json!(false));
}

#[tokio::test]
async fn a_process_taken_for_dead_closes_its_connections_so_their_clients_reconnect_and_are_recorded_again() {
    let app = TestApp::spawn().await;
    app.users(&["bob"]).await;
    let (mut bob, _) = connect_user(&app, "bob").await;
    // Another process removed this one's records (its heartbeat looked stale).
    crate::worker::execute(&app.db, "DELETE FROM ws_connection; DELETE FROM ws_instance").await;
    let deadline = Instant::now() + WAIT;
    let code = loop {
        use futures_util::StreamExt;
        use tokio_tungstenite::tungstenite::Message;
        match tokio::time::timeout_at(deadline, bob.next()).await.expect("the server closes bob's connection") {
            Some(Ok(Message::Close(Some(f)))) => break u16::from(f.code),
            Some(Ok(_)) => {}
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    assert_eq!(code, 1013, "try again: the client reconnects");
    let (_bob, _) = connect_user(&app, "bob").await;
    assert_eq!(queried_user(&app, "bob").await["online"], json!(true), "recorded again under the re-registered instance");
}
