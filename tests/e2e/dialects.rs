//! The two wire dialects (docs/compatibility.md, "Wire"): legacy paths render RFC 3339 strings and flat
//! custom fields; `/api/v2/...` paths render integer nanoseconds and nested `custom`.

use crate::helpers::*;
use serde_json::{json, Value};

fn is_rfc3339(v: &Value) -> bool {
    v.as_str().is_some_and(|s| offshoot_core::time::parse_str(s).is_some() && s.contains('T'))
}

#[tokio::test]
async fn legacy_channel_query_renders_rfc3339_timestamps_and_flat_custom_fields() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let st = app.channel_with("agent:legacy", json!({"created_by_id": "u1", "members": ["u1"], "title": "flat title"})).await;
    let ch = &st["channel"];
    assert!(is_rfc3339(&ch["created_at"]), "{ch}");
    assert!(is_rfc3339(&ch["updated_at"]), "{ch}");
    assert_eq!(ch["title"], json!("flat title"), "custom fields are flat: {ch}");
    assert!(ch.get("custom").is_none() || ch["custom"].is_null(), "no nested custom in legacy: {ch}");
    assert!(is_rfc3339(&st["members"][0]["created_at"]), "{st}");
}

#[tokio::test]
async fn v2_channel_query_renders_nanosecond_integers_and_nested_custom() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let st = app
        .post(
            "/api/v2/chat/channels/agent/v2chan/query",
            &app.server(),
            json!({"state": true, "data": {"created_by_id": "u1", "members": [{"user_id": "u1"}], "custom": {"title": "nested"}}}),
        )
        .await
        .ok();
    let ch = &st["channel"];
    assert!(ch["created_at"].is_i64(), "{ch}");
    assert!(ch["created_at"].as_i64().unwrap() > 1_600_000_000_000_000_000, "nanoseconds: {ch}");
    assert_eq!(ch["custom"]["title"], json!("nested"), "{ch}");
    assert!(ch.get("title").is_none(), "custom is not flattened in v2: {ch}");
    // The same channel read on the legacy path shows the same instant and a flat field.
    let legacy = app.state("agent:v2chan", 10).await;
    assert_eq!(ts_of(&legacy["channel"]["created_at"]), ch["created_at"].as_i64().unwrap());
    assert_eq!(legacy["channel"]["title"], json!("nested"));
}

#[tokio::test]
async fn a_message_sent_with_flat_custom_fields_reads_back_nested_on_v2_and_flat_on_legacy() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.channel("agent:msgs", "u1", &["u1"]).await;
    let sent = app.send_message("agent:msgs", json!({"text": "hi", "user_id": "u1", "generating": true})).await;
    assert_eq!(sent["generating"], json!(true), "{sent}");
    assert!(is_rfc3339(&sent["created_at"]), "{sent}");
    let id = sent["id"].as_str().unwrap();
    let v2 = app.get(&format!("/api/v2/chat/messages/{id}"), &app.server()).await.ok();
    let m = &v2["message"];
    assert_eq!(m["custom"]["generating"], json!(true), "{m}");
    assert!(m.get("generating").is_none(), "{m}");
    assert!(m["created_at"].is_i64(), "{m}");
    assert_eq!(m["created_at"].as_i64().unwrap(), ts_of(&sent["created_at"]));
    assert!(m["user"]["created_at"].is_i64(), "nested objects follow the dialect too: {m}");
}

#[tokio::test]
async fn a_message_sent_on_v2_with_nested_custom_reads_back_flat_on_legacy() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.channel("agent:nest", "u1", &["u1"]).await;
    let sent = app
        .post(
            "/api/v2/chat/channels/agent/nest/message",
            &app.server(),
            json!({"message": {"text": "hi", "user_id": "u1", "custom": {"ai_generated": true}}}),
        )
        .await
        .ok();
    assert_eq!(sent["message"]["custom"]["ai_generated"], json!(true), "{sent}");
    let id = sent["message"]["id"].as_str().unwrap();
    let legacy = app.get(&format!("/messages/{id}"), &app.server()).await.ok();
    assert_eq!(legacy["message"]["ai_generated"], json!(true), "{legacy}");
    assert!(is_rfc3339(&legacy["message"]["created_at"]), "{legacy}");
}

#[tokio::test]
async fn users_upserted_on_v2_render_custom_nested_and_on_legacy_flat() {
    let app = TestApp::spawn().await;
    let v2 = app
        .post("/api/v2/users", &app.server(), json!({"users": {"u1": {"id": "u1", "name": "U One", "custom": {"color": "red"}}}}))
        .await
        .ok();
    assert_eq!(v2["users"]["u1"]["custom"]["color"], json!("red"), "{v2}");
    assert!(v2["users"]["u1"]["created_at"].is_i64(), "{v2}");
    let legacy = app.post("/users", &app.server(), json!({"users": {"u2": {"id": "u2", "color": "blue"}}})).await.ok();
    assert_eq!(legacy["users"]["u2"]["color"], json!("blue"), "{legacy}");
    assert!(is_rfc3339(&legacy["users"]["u2"]["created_at"]), "{legacy}");
}

#[tokio::test]
async fn v2_app_and_error_bodies_use_the_same_envelope() {
    let app = TestApp::spawn().await;
    app.get("/api/v2/app", &app.server()).await.ok();
    let r = app.get("/api/v2/chat/messages/nope", &app.server()).await;
    r.err(404, 16);
}

#[tokio::test]
async fn the_v2_fork_endpoint_renders_the_fork_in_nanoseconds() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.channel("agent:v2src", "u1", &["u1"]).await;
    let m = app.say("agent:v2src", "u1", "hello").await;
    let r =
        app.post("/api/v2/chat/channels/agent/v2src/fork", &app.server(), json!({"message_id": m, "channel": {"id": "v2fork"}})).await.ok();
    assert!(r["fork"]["created_at"].is_i64(), "{r}");
    assert!(r["channel"]["created_at"].is_i64(), "{r}");
    assert!(r["channel"]["fork"]["created_at"].is_i64(), "{r}");
    assert_eq!(r["fork"]["message_id_map"][&m], json!(copy_id("agent:v2fork", &m)), "{r}");
    let look =
        app.post("/api/v2/chat/channels/agent/v2fork/fork/message_ids", &app.server(), json!({"source_message_ids": [m]})).await.ok();
    assert_eq!(look["message_id_map"][&m], json!(copy_id("agent:v2fork", &m)), "{look}");
}
