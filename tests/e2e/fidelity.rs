//! What Stream clients expect beyond the basics: `ephemeral` and `error` messages go to their
//! author only and are never stored.

use crate::helpers::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::time::Duration;
use tokio_tungstenite::tungstenite::Message as Frame;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Connects `user` to `/connect` as JS does; returns the socket and its connection id.
async fn connect(app: &TestApp, user: &str) -> (Ws, String) {
    let json_param = json!({"user_id": user, "user_details": {"id": user}}).to_string();
    let url = reqwest::Url::parse_with_params(
        &format!("{}/connect", app.base.replacen("http", "ws", 1)),
        &[("json", json_param.as_str()), ("api_key", API_KEY), ("authorization", &app.user(user)), ("stream-auth-type", "jwt")],
    )
    .expect("url");
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str()).await.expect("handshake");
    let first = next_json(&mut ws, Duration::from_secs(20)).await.expect("health.check");
    let id = first["connection_id"].as_str().expect("connection_id").to_string();
    (ws, id)
}

async fn next_json(ws: &mut Ws, wait: Duration) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => return None,
            Ok(Some(Ok(Frame::Text(t)))) => return Some(serde_json::from_str(t.as_str()).expect("json frame")),
            Ok(Some(Ok(_))) => {}
            Ok(other) => panic!("the socket ended: {other:?}"),
        }
    }
}

/// The types of the `message.new` events a socket receives up to and including the one whose
/// message has the text `marker` (within [`WAIT`]).
async fn new_message_types_until(ws: &mut Ws, marker: &str) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut out = Vec::new();
    loop {
        let v = next_json(ws, deadline.saturating_duration_since(tokio::time::Instant::now()))
            .await
            .unwrap_or_else(|| panic!("no message.new {marker:?} within {WAIT:?}; before it: {out:?}"));
        if v["type"] == json!("message.new") {
            out.push(v["message"]["type"].as_str().unwrap_or_default().to_string());
            if v["message"]["text"] == json!(marker) {
                return out;
            }
        }
    }
}

#[tokio::test]
async fn ephemeral_and_error_messages_reach_their_author_only_and_are_never_stored() {
    let app = TestApp::spawn().await;
    app.users(&["asker", "other"]).await;
    app.channel("agent:eph", "asker", &["asker", "other"]).await;
    let (mut asker, asker_conn) = connect(&app, "asker").await;
    let (mut other, other_conn) = connect(&app, "other").await;
    for (user, conn) in [("asker", &asker_conn), ("other", &other_conn)] {
        app.post(&format!("{}/query?connection_id={conn}", channel_path("agent:eph")), &app.user(user), json!({"watch": true})).await.ok();
    }

    let path = format!("{}/message", channel_path("agent:eph"));
    let eph = app.post(&path, &app.server(), json!({"message": {"type": "ephemeral", "text": "only you", "user_id": "asker"}})).await.ok();
    assert_eq!(eph["message"]["type"], json!("ephemeral"), "{eph}");
    let err = app.post(&path, &app.server(), json!({"message": {"type": "error", "text": "failed", "user_id": "asker"}})).await.ok();
    assert_eq!(err["message"]["type"], json!("error"), "{err}");
    app.say("agent:eph", "other", "for everyone").await;

    // A regular message sent after them marks how far each socket has to be read.
    let seen_by_asker = new_message_types_until(&mut asker, "for everyone").await;
    assert_eq!(seen_by_asker, ["ephemeral", "error", "regular"], "the author gets both, in order, then the regular message");
    let seen_by_other = new_message_types_until(&mut other, "for everyone").await;
    assert_eq!(seen_by_other, ["regular"], "another member does not see them before the regular message");
    // And not later either: a second regular message, sent once both had the first, is the next
    // thing each socket gets.
    app.say("agent:eph", "asker", "and after").await;
    assert_eq!(new_message_types_until(&mut other, "and after").await, ["regular"], "another member never sees them");
    assert_eq!(new_message_types_until(&mut asker, "and after").await, ["regular"], "the author got each of them once");

    let state = app.state("agent:eph", 100).await;
    let stored: Vec<&str> = state["messages"].as_array().expect("messages").iter().filter_map(|m| m["text"].as_str()).collect();
    assert_eq!(stored, ["for everyone", "and after"], "only the regular messages are stored in the history");
    let id = eph["message"]["id"].as_str().expect("id");
    app.get(&format!("/messages/{id}"), &app.server()).await.err(404, 16);
    // Client-side requests cannot send them.
    app.post(&path, &app.user("asker"), json!({"message": {"type": "ephemeral", "text": "x"}})).await.err(403, 17);
}

#[tokio::test]
async fn me_carries_the_users_unread_counters_when_it_connects() {
    let app = TestApp::spawn().await;
    app.users(&["reader", "writer"]).await;
    for cid in ["agent:unread-1", "agent:unread-2", "agent:unread-3"] {
        app.channel(cid, "writer", &["reader", "writer"]).await;
    }
    app.say("agent:unread-1", "writer", "one").await;
    app.say("agent:unread-1", "writer", "two").await;
    app.say("agent:unread-2", "writer", "three").await;
    app.say("agent:unread-3", "reader", "my own message is not unread").await;
    app.send_message("agent:unread-3", json!({"text": "for someone else", "user_id": "writer", "restricted_visibility": ["writer"]})).await;

    let json_param = json!({"user_id": "reader", "user_details": {"id": "reader"}}).to_string();
    let first = |token: String| {
        let json_param = json_param.clone();
        let base = app.base.replacen("http", "ws", 1);
        async move {
            let url = reqwest::Url::parse_with_params(
                &format!("{base}/connect"),
                &[("json", json_param.as_str()), ("api_key", API_KEY), ("authorization", &token), ("stream-auth-type", "jwt")],
            )
            .expect("url");
            let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str()).await.expect("handshake");
            next_json(&mut ws, Duration::from_secs(20)).await.expect("health.check")
        }
    };
    let me = first(app.user("reader")).await["me"].clone();
    assert_eq!((me["total_unread_count"].clone(), me["unread_channels"].clone()), (json!(3), json!(2)), "{me}");

    app.post(&format!("{}/read", channel_path("agent:unread-1")), &app.user("reader"), json!({})).await.ok();
    let me = first(app.user("reader")).await["me"].clone();
    assert_eq!((me["total_unread_count"].clone(), me["unread_channels"].clone()), (json!(1), json!(1)), "after marking one read: {me}");
}

#[tokio::test]
async fn marking_a_channel_read_tells_the_readers_connections_their_new_counters() {
    let app = TestApp::spawn().await;
    app.users(&["reader", "writer"]).await;
    app.channel("agent:mark-1", "writer", &["reader", "writer"]).await;
    app.channel("agent:mark-2", "writer", &["reader", "writer"]).await;
    app.say("agent:mark-1", "writer", "one").await;
    app.say("agent:mark-2", "writer", "two").await;
    app.say("agent:mark-2", "writer", "three").await;
    let (mut ws, _) = connect(&app, "reader").await;
    app.post(&format!("{}/read", channel_path("agent:mark-2")), &app.user("reader"), json!({})).await.ok();
    let deadline = tokio::time::Instant::now() + WAIT;
    let note = loop {
        let v = next_json(&mut ws, deadline.saturating_duration_since(tokio::time::Instant::now())).await.expect("notification.mark_read");
        if v["type"] == json!("notification.mark_read") {
            break v;
        }
    };
    assert_eq!(note["cid"], json!("agent:mark-2"), "{note}");
    assert_eq!((note["total_unread_count"].clone(), note["unread_channels"].clone()), (json!(1), json!(1)), "{note}");
}

/// The next event of `kind` on a socket, passing over others (bounded by [`WAIT`]).
async fn next_of(ws: &mut Ws, kind: &str) -> Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let v = next_json(ws, deadline.saturating_duration_since(tokio::time::Instant::now())).await.unwrap_or_else(|| panic!("no {kind}"));
        if v["type"] == json!(kind) {
            return v;
        }
    }
}

/// `user`'s unread messages in `cid` as the channel's read state says.
async fn unread_in(app: &TestApp, cid: &str, user: &str) -> i64 {
    let state = app.state(cid, 1).await;
    state["read"].as_array().expect("read").iter().find(|r| r["user"]["id"] == json!(user)).expect("a read row")["unread_messages"]
        .as_i64()
        .expect("unread_messages")
}

#[tokio::test]
async fn a_new_message_carries_each_recipients_counters_and_reaches_members_who_do_not_watch_as_notification_message_new() {
    let app = TestApp::spawn().await;
    app.users(&["reader", "watcher", "writer"]).await;
    app.channel("agent:note-1", "writer", &["reader", "watcher", "writer"]).await;
    app.channel("agent:note-2", "writer", &["reader", "writer"]).await;
    app.say("agent:note-2", "writer", "earlier").await;
    let (mut reader, _) = connect(&app, "reader").await;
    let (mut watcher, conn) = connect(&app, "watcher").await;
    app.post(&format!("{}/query?connection_id={conn}", channel_path("agent:note-1")), &app.user("watcher"), json!({"watch": true}))
        .await
        .ok();

    let id = app.say("agent:note-1", "writer", "hello").await;
    // The relay may still hand this new socket note-2's earlier message (sent before it
    // connected): pass over it.
    let note = loop {
        let note = next_of(&mut reader, "notification.message_new").await;
        if note["message"]["text"] != json!("earlier") {
            break note;
        }
    };
    assert_eq!(note["cid"], json!("agent:note-1"), "{note}");
    assert_eq!(note["message"]["id"], json!(id), "{note}");
    assert_eq!(note["channel"]["cid"], json!("agent:note-1"), "the notification carries the channel: {note}");
    assert_eq!(
        (note["total_unread_count"].clone(), note["unread_count"].clone(), note["unread_channels"].clone()),
        (json!(2), json!(2), json!(2)),
        "reader: one unread here and one in note-2: {note}"
    );
    let new = next_of(&mut watcher, "message.new").await;
    assert_eq!(new["message"]["id"], json!(id), "{new}");
    assert_eq!((new["total_unread_count"].clone(), new["unread_channels"].clone()), (json!(1), json!(1)), "watcher: {new}");

    // The watcher hears the message once, as message.new: a later marker arrives next.
    let marker = app.say("agent:note-1", "writer", "marker").await;
    let next = next_json(&mut watcher, WAIT).await.expect("the marker");
    assert_eq!((next["type"].clone(), next["message"]["id"].clone()), (json!("message.new"), json!(marker)), "{next}");
    assert_eq!(next["total_unread_count"], json!(2), "{next}");
}

#[tokio::test]
async fn unread_counters_follow_reads_deletes_threads_visibility_and_truncation() {
    let app = TestApp::spawn().await;
    app.users(&["reader", "writer"]).await;
    let cid = "agent:counted";
    app.channel(cid, "writer", &["reader", "writer"]).await;
    let mut ids = Vec::new();
    for text in ["one", "two", "three", "four"] {
        ids.push(app.say(cid, "writer", text).await);
    }
    app.say(cid, "reader", "mine is not unread").await;
    assert_eq!(unread_in(&app, cid, "reader").await, 4);
    assert_eq!(unread_in(&app, cid, "writer").await, 1);

    app.delete(&format!("/messages/{}", ids[0]), &app.server()).await.ok();
    assert_eq!(unread_in(&app, cid, "reader").await, 3, "a deleted message is no longer unread");
    let reply = app.send_message(cid, json!({"text": "in a thread", "user_id": "writer", "parent_id": ids[2]})).await;
    let reply_id = reply["id"].as_str().expect("reply id").to_string();
    assert_eq!(unread_in(&app, cid, "reader").await, 3, "a reply not shown in the channel is not counted");
    app.put(&format!("/messages/{reply_id}"), &app.server(), json!({"set": {"show_in_channel": true}})).await.ok();
    assert_eq!(unread_in(&app, cid, "reader").await, 4, "shown in the channel by an update: counted");
    app.send_message(cid, json!({"text": "for the writer only", "user_id": "writer", "restricted_visibility": ["writer"]})).await;
    assert_eq!(unread_in(&app, cid, "reader").await, 4, "a message restricted to others is not the reader's");

    app.post(&format!("{}/read", channel_path(cid)), &app.user("reader"), json!({})).await.ok();
    assert_eq!(unread_in(&app, cid, "reader").await, 0);
    app.say(cid, "writer", "after the read").await;
    assert_eq!(unread_in(&app, cid, "reader").await, 1);
    // Sent with a time before the reader's read mark: already read.
    app.send_message(cid, json!({"text": "backdated", "user_id": "writer", "created_at": rfc3339(past_ns())})).await;
    assert_eq!(unread_in(&app, cid, "reader").await, 1, "a message older than the read mark is not unread");

    app.post(&format!("{}/truncate", channel_path(cid)), &app.server(), json!({})).await.ok();
    assert_eq!(unread_in(&app, cid, "reader").await, 0, "truncation leaves nothing unread");
    assert_eq!(unread_in(&app, cid, "writer").await, 0);
    app.say(cid, "writer", "fresh").await;
    assert_eq!(unread_in(&app, cid, "reader").await, 1);
}
