//! Authentication and the error envelope (docs/compatibility.md, "Wire").

use crate::helpers::*;
use offshoot_core::token::{sign, Claims};
use serde_json::{json, Value};

#[tokio::test]
async fn a_request_without_api_key_is_rejected_with_code_2() {
    let app = TestApp::spawn().await;
    let rb = app.http.get(format!("{}/app", app.base)).header("Authorization", app.server()).header("stream-auth-type", "jwt");
    app.send(rb).await.err(401, 2);
}

#[tokio::test]
async fn a_request_with_an_unknown_api_key_is_rejected_with_code_2() {
    let app = TestApp::spawn().await;
    let rb = app
        .http
        .get(format!("{}/app?api_key=not-the-key", app.base))
        .header("Authorization", app.server())
        .header("stream-auth-type", "jwt");
    app.send(rb).await.err(401, 2);
}

#[tokio::test]
async fn a_token_signed_with_another_secret_is_rejected_with_code_43() {
    let app = TestApp::spawn().await;
    let forged = sign(&Claims::default(), "some-other-secret");
    app.get("/app", &forged).await.err(401, 43);
}

#[tokio::test]
async fn an_expired_user_token_is_rejected_with_code_40() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let now = unix_secs();
    let expired = app.token(&Claims { user_id: Some("u1".into()), iat: Some(now - 7200), exp: Some(now - 3600), ..Default::default() });
    let cid = "agent:expired";
    app.channel(cid, "u1", &["u1"]).await;
    app.post(&format!("{}/query", channel_path(cid)), &expired, json!({"state": true})).await.err(401, 40);
}

#[tokio::test]
async fn a_request_without_a_token_is_rejected_with_code_5() {
    let app = TestApp::spawn().await;
    let rb = app.http.get(app.url("/app")).header("stream-auth-type", "jwt");
    app.send(rb).await.err(401, 5);
}

#[tokio::test]
async fn a_garbage_token_is_rejected_with_code_5() {
    let app = TestApp::spawn().await;
    app.get("/app", "not.a.jwt").await.err(401, 5);
}

#[tokio::test]
async fn server_tokens_with_empty_claims_and_with_server_true_are_both_server_side() {
    let app = TestApp::spawn().await;
    let a = app.get("/app", &app.server()).await.ok();
    let b = app.get("/app", &app.server_flag()).await.ok();
    assert!(a["app"].is_object() && b["app"].is_object(), "{a} {b}");
}

#[tokio::test]
async fn the_raw_jwt_stream_sends_and_a_jwt_with_a_bearer_prefix_are_both_accepted() {
    let app = TestApp::spawn().await;
    let raw = app.http.get(app.url("/app")).header("Authorization", app.server()).header("stream-auth-type", "jwt");
    app.send(raw).await.ok();
    let bearer =
        app.http.get(app.url("/app")).header("Authorization", format!("Bearer {}", app.server())).header("stream-auth-type", "jwt");
    app.send(bearer).await.ok();
    // The prefix is only taken off; what follows must still be a valid token.
    let bad = app.http.get(app.url("/app")).header("Authorization", "Bearer not.a.jwt").header("stream-auth-type", "jwt");
    app.send(bad).await.err(401, 5);
}

#[tokio::test]
async fn malformed_json_is_rejected_with_code_4() {
    let app = TestApp::spawn().await;
    let rb = app
        .request(reqwest::Method::POST, "/users", &app.server())
        .header("Content-Type", "application/json")
        .body("{\"users\": {\"u1\": ");
    app.send(rb).await.err(400, 4);
}

#[tokio::test]
async fn a_body_of_the_wrong_shape_is_rejected_with_code_4() {
    let app = TestApp::spawn().await;
    app.post("/users", &app.server(), json!({"users": "not a map"})).await.err(400, 4);
}

#[tokio::test]
async fn an_unknown_channel_type_is_an_error_with_the_envelope() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    // Stream answers a request input error, as for any other invalid path part.
    app.post("/channels/no-such-type/c1/query", &app.server(), json!({"data": {"created_by_id": "u1"}})).await.err(400, 4);
}

#[tokio::test]
async fn an_illegal_channel_id_is_rejected_with_code_4() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.post("/channels/agent/has%20space/query", &app.server(), json!({"data": {"created_by_id": "u1"}})).await.err(400, 4);
    let long = "x".repeat(65);
    app.post(&format!("/channels/agent/{long}/query"), &app.server(), json!({"data": {"created_by_id": "u1"}})).await.err(400, 4);
}

#[tokio::test]
async fn a_body_over_the_size_limit_is_rejected_with_413_and_code_22() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.channel("agent:big", "u1", &["u1"]).await;
    // Just over the server's 2 MiB limit: a much bigger body would still be in flight when the
    // server answers and closes, and the client would see a broken pipe instead of the 413.
    let huge = "x".repeat(2 * 1024 * 1024 + 4096);
    let rb = app
        .request(reqwest::Method::POST, "/channels/agent/big/message", &app.server())
        .json(&json!({"message": {"text": huge, "user_id": "u1"}}));
    app.send(rb).await.err(413, 22);
}

#[tokio::test]
async fn an_unknown_resource_is_a_404_with_code_16() {
    let app = TestApp::spawn().await;
    app.get("/messages/does-not-exist", &app.server()).await.err(404, 16);
}

#[tokio::test]
async fn every_error_body_carries_the_full_envelope_and_every_success_carries_duration() {
    let app = TestApp::spawn().await;
    app.users(&["u1", "u2"]).await;
    let cid = "agent:env";
    app.channel(cid, "u1", &["u1"]).await;
    let m = app.say(cid, "u1", "hi").await;
    let server = app.server();
    let outsider = app.user("u2");
    // A mix of errors: each must carry the whole envelope.
    let errors: Vec<Resp> = vec![
        app.get("/messages/nope", &server).await,
        app.post(&format!("{}/query", channel_path(cid)), &outsider, json!({"state": true})).await,
        app.post(
            &format!("{}/message", channel_path(cid)),
            &server,
            json!({"message": {"text": "x", "user_id": "u1", "parent_id": "nope"}}),
        )
        .await,
        app.post(&format!("{}/fork", channel_path(cid)), &server, json!({"channel": {"id": "f"}})).await,
        app.rewind(cid, &m, "nope", false).await,
    ];
    for r in errors {
        assert!(r.status >= 400, "expected an error: {} {}", r.status, r.body);
        assert_error_envelope(&r.body);
        assert_eq!(r.body["StatusCode"], json!(r.status), "{}", r.body);
    }
    // Successes carry duration.
    for r in [
        app.get("/app", &server).await,
        app.get(&format!("/messages/{m}"), &server).await,
        app.post(&format!("{}/query", channel_path(cid)), &server, json!({"state": true})).await,
        app.post("/channels", &server, json!({"filter_conditions": {"type": "agent"}})).await,
    ] {
        let body: Value = r.ok();
        assert!(body["duration"].as_str().is_some_and(|d| d.ends_with("ms")), "{body}");
    }
}

#[tokio::test]
async fn a_user_cannot_use_server_only_endpoints() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.patch("/app", &app.user("u1"), json!({"fork_enabled": false})).await.err(403, 17);
    app.put("/channeltypes/agent", &app.user("u1"), json!({"max_message_length": 10})).await.err(403, 17);
}

#[tokio::test]
async fn an_anonymous_caller_reads_nothing_and_writes_nothing() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    app.channel("agent:anon", "u1", &["u1"]).await;
    let anon = |method: reqwest::Method, path: &str| app.http.request(method, app.url(path)).header("stream-auth-type", "anonymous");
    let r = app.send(anon(reqwest::Method::POST, "/channels").json(&json!({"filter_conditions": {"type": "agent"}}))).await.ok();
    assert_eq!(r["channels"], json!([]), "anonymous users are members of nothing: {r}");
    app.send(anon(reqwest::Method::POST, "/channels/agent/anon/query").json(&json!({"state": true}))).await.err(403, 17);
    app.send(anon(reqwest::Method::POST, "/channels/agent/anon/message").json(&json!({"message": {"text": "hi"}}))).await.err(403, 17);
    // Without stream-auth-type: anonymous, a missing token is an auth error.
    app.send(app.http.request(reqwest::Method::POST, app.url("/channels")).json(&json!({}))).await.err(401, 5);
}

#[tokio::test]
async fn a_guest_gets_a_token_for_a_guest_user_that_cannot_create_channels() {
    let app = TestApp::spawn().await;
    // JS `setGuestUser` asks for the token anonymously, with the api key alone.
    let rb = app.http.request(reqwest::Method::POST, app.url("/guest")).header("stream-auth-type", "anonymous");
    let r = app.send(rb.json(&json!({"user": {"id": "visitor", "name": "V"}}))).await.ok();
    let token = r["access_token"].as_str().expect("access_token").to_string();
    let guest_id = r["user"]["id"].as_str().expect("user.id").to_string();
    assert_eq!(r["user"]["role"], json!("guest"), "{r}");
    assert_eq!(r["user"]["name"], json!("V"));
    let claims = offshoot_core::token::verify(&token, API_SECRET, unix_secs()).expect("a token signed with the app secret");
    assert_eq!(claims.user_id.as_deref(), Some(guest_id.as_str()));
    app.post("/channels/agent/g1/query", &token, json!({"data": {"members": [guest_id]}})).await.err(403, 17);
}

#[tokio::test]
async fn cors_preflight_allows_the_headers_the_sdks_send() {
    let app = TestApp::spawn().await;
    let resp = app
        .http
        .request(reqwest::Method::OPTIONS, app.url("/channels"))
        .header("Origin", "http://localhost:5173")
        .header("Access-Control-Request-Method", "POST")
        .header("Access-Control-Request-Headers", "authorization,stream-auth-type,x-stream-client,x-client-request-id,content-type")
        .send()
        .await
        .expect("preflight");
    assert!(resp.status().is_success(), "{}", resp.status());
    let allowed = resp.headers().get("access-control-allow-headers").and_then(|v| v.to_str().ok()).unwrap_or_default().to_lowercase();
    for h in ["authorization", "stream-auth-type", "x-stream-client", "x-client-request-id", "content-type"] {
        assert!(allowed.contains(h), "{h} is allowed: {allowed}");
    }
    assert!(resp.headers().get("access-control-allow-origin").is_some());
}

#[tokio::test]
async fn custom_data_over_5_kib_on_users_and_channels_is_rejected_and_nothing_is_written() {
    let app = TestApp::spawn().await;
    let big = "x".repeat(6 * 1024);
    let r = app.post("/users", &app.server(), json!({"users": {"fat": {"id": "fat", "bio": big}}})).await.err(400, 4);
    assert!(r["message"].as_str().unwrap_or_default().contains("custom data"), "{r}");
    let r = app.post("/users", &app.server(), json!({"users": {"fat": {"id": "fat"}}})).await.ok();
    assert!(r["users"]["fat"].get("bio").is_none(), "the rejected upsert wrote nothing: {r}");
    app.users(&["u1"]).await;
    app.post("/channels/agent/fat/query", &app.server(), json!({"data": {"created_by_id": "u1", "blob": big}})).await.err(400, 4);
    app.channel("agent:slim", "u1", &["u1"]).await;
    app.patch("/channels/agent/slim", &app.server(), json!({"set": {"blob": big}})).await.err(400, 4);
    let state = app.post("/channels/agent/slim/query", &app.server(), json!({"state": true})).await.ok();
    assert!(state["channel"].get("blob").is_none(), "{state}");
    let found = app.post("/channels", &app.server(), json!({"filter_conditions": {"cid": "agent:fat"}})).await.ok();
    assert_eq!(found["channels"], json!([]), "the rejected channel was not created: {found}");
}

#[tokio::test]
async fn a_path_that_does_not_decode_gets_the_error_envelope_not_a_plain_text_rejection() {
    let app = TestApp::spawn().await;
    let r = app.get("/messages/%FF%FE", &app.server()).await.err(400, 4);
    assert!(r["message"].as_str().unwrap_or_default().contains("path"), "{r}");
    app.post("/channels/agent/%FF/query", &app.server(), json!({})).await.err(400, 4);
}
