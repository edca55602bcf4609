//! Webhooks as Stream sends them: a POST of the event per configured URL, signed with the API
//! secret (`X-Signature`), with a delivery id stable across retries and a 1-based attempt
//! number; a 5xx answer is retried.

use crate::helpers::*;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, KeyInit, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Hook {
    headers: HeaderMap,
    raw: Bytes,
    body: Value,
}

impl Hook {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_else(|| panic!("header {name} is missing: {:?}", self.headers))
    }
}

#[derive(Clone)]
struct Receiver {
    seen: mpsc::UnboundedSender<Hook>,
    /// Answer 500 to the first attempt of every delivery.
    fail_first: bool,
    ids: Arc<Mutex<HashSet<String>>>,
}

async fn receive(State(r): State<Receiver>, headers: HeaderMap, raw: Bytes) -> StatusCode {
    let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
    let id = headers.get("x-webhook-id").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let first_time = r.ids.lock().expect("ids").insert(id);
    let _ = r.seen.send(Hook { headers, raw, body });
    if r.fail_first && first_time {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    }
}

/// A webhook receiver on `127.0.0.1:0`; returns its URL and what it receives.
async fn receiver(fail_first: bool) -> (String, mpsc::UnboundedReceiver<Hook>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let state = Receiver { seen: tx, fail_first, ids: Arc::default() };
    let app = axum::Router::new().route("/hook", axum::routing::post(receive)).with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the receiver");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/hook"), rx)
}

/// The first request matching `pred` (others are kept in `log`), within a bounded time.
async fn next_hook(rx: &mut mpsc::UnboundedReceiver<Hook>, log: &mut Vec<Hook>, what: &str, pred: impl Fn(&Hook) -> bool) -> Hook {
    let deadline = Instant::now() + WAIT;
    loop {
        let hook = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no webhook {what} within {WAIT:?}; got {log:?}"))
            .expect("the receiver runs");
        log.push(hook.clone());
        if pred(&hook) {
            return hook;
        }
    }
}

fn is_message_new(id: &str) -> impl Fn(&Hook) -> bool + '_ {
    move |h: &Hook| h.body["type"] == json!("message.new") && h.body["message"]["id"] == json!(id)
}

fn signature(body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(API_SECRET.as_bytes()).expect("any key length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

#[tokio::test]
async fn a_message_new_webhook_is_signed_with_the_api_secret_and_carries_streams_headers() {
    let app = TestApp::spawn().await;
    let (url, mut rx) = receiver(false).await;
    app.patch("/app", &app.server(), json!({"webhook_url": url})).await.ok();
    app.users(&["u1"]).await;
    let cid = "agent:hooked";
    app.channel(cid, "u1", &["u1"]).await;

    let m = app.say(cid, "u1", "ping the hook").await;

    let mut log = Vec::new();
    let hook = next_hook(&mut rx, &mut log, "message.new", is_message_new(&m)).await;
    assert_eq!(hook.header("x-signature"), signature(&hook.raw), "X-Signature is the hex HMAC-SHA256 of the raw body");
    assert_eq!(hook.header("x-api-key"), API_KEY);
    assert_eq!(hook.header("x-webhook-attempt"), "1");
    assert!(uuid::Uuid::parse_str(hook.header("x-webhook-id")).is_ok(), "X-Webhook-Id is a UUID: {:?}", hook.headers);
    assert!(hook.header("content-type").starts_with("application/json"));
    assert_eq!(hook.body["cid"], json!(cid), "{}", hook.body);
    assert_eq!(hook.body["message"]["text"], json!("ping the hook"), "{}", hook.body);
    assert!(hook.body["created_at"].is_string(), "webhooks use the legacy dialect by default: {}", hook.body);
    let members: Vec<&str> =
        hook.body["members"].as_array().map(|a| a.iter().filter_map(|m| m["user_id"].as_str()).collect()).unwrap_or_default();
    assert_eq!(members, vec!["u1"], "message events carry the channel's members: {}", hook.body);
}

#[tokio::test]
async fn a_delivery_answered_with_500_is_retried_with_the_same_webhook_id_and_a_higher_attempt() {
    let app = TestApp::spawn().await;
    let (url, mut rx) = receiver(true).await;
    app.patch("/app", &app.server(), json!({"webhook_url": url})).await.ok();
    app.users(&["u1"]).await;
    let cid = "agent:retried";
    app.channel(cid, "u1", &["u1"]).await;

    let m = app.say(cid, "u1", "try again").await;

    let mut log = Vec::new();
    let first = next_hook(&mut rx, &mut log, "message.new", is_message_new(&m)).await;
    assert_eq!(first.header("x-webhook-attempt"), "1");
    let id = first.header("x-webhook-id").to_string();
    let second = next_hook(&mut rx, &mut log, "retry", |h| h.headers.get("x-webhook-id").is_some_and(|v| v == id.as_str())).await;
    assert_eq!(second.header("x-webhook-attempt"), "2", "the retry counts its attempt");
    assert_eq!(second.raw, first.raw, "a retry sends the same body");
    assert_eq!(second.header("x-signature"), signature(&second.raw));
}

#[tokio::test]
async fn event_hooks_deliver_only_the_event_types_they_name() {
    let app = TestApp::spawn().await;
    let (url, mut rx) = receiver(false).await;
    // A second hook without a filter, on a receiver of its own: the deliveries of an event to
    // every URL are queued together, so once it has received an event, the filtered hook's
    // delivery of that event was queued too, or never will be.
    let (all_url, mut all_rx) = receiver(false).await;
    let hooks = json!([
        {"hook_type": "webhook", "enabled": true, "webhook_url": url, "event_types": ["message.new"]},
        {"hook_type": "webhook", "enabled": true, "webhook_url": all_url, "event_types": []},
    ]);
    app.patch("/app", &app.server(), json!({"event_hooks": hooks})).await.ok();
    app.users(&["u1"]).await;
    let cid = "agent:filtered";
    app.channel(cid, "u1", &["u1"]).await;

    let first = app.say(cid, "u1", "one").await;
    let second = app.say(cid, "u1", "two").await;

    // Deliveries run up to 32 at a time: they may arrive in any order, so wait for each.
    let mut all_log = Vec::new();
    for (what, pred) in [
        ("channel.created", Box::new(|h: &Hook| h.body["type"] == json!("channel.created")) as Box<dyn Fn(&Hook) -> bool>),
        ("the first message.new", Box::new(is_message_new(&first))),
        ("the second message.new", Box::new(is_message_new(&second))),
    ] {
        if !all_log.iter().any(|h: &Hook| pred(h)) {
            next_hook(&mut all_rx, &mut all_log, what, pred).await;
        }
    }
    let mut log = Vec::new();
    for m in [&first, &second] {
        if !log.iter().any(|h: &Hook| is_message_new(m)(h)) {
            next_hook(&mut rx, &mut log, "message.new on the filtered hook", is_message_new(m)).await;
        }
    }
    // Everything was queued; a delivery of another type to the filtered hook, had it been
    // queued, would be in flight now: deliveries to a loopback receiver take milliseconds.
    let settle = Instant::now() + std::time::Duration::from_secs(2);
    while let Ok(Some(h)) = tokio::time::timeout_at(settle, rx.recv()).await {
        log.push(h);
    }
    let types: Vec<&Value> = log.iter().map(|h| &h.body["type"]).collect();
    assert!(types.iter().all(|t| **t == json!("message.new")), "only message.new is delivered to the filtered hook: {types:?}");
    assert_eq!(types.len(), 2, "each message once: {types:?}");
}

#[tokio::test]
async fn the_v2_webhook_dialect_sends_nanosecond_timestamps() {
    let app = TestApp::spawn().await;
    let (url, mut rx) = receiver(false).await;
    app.patch("/app", &app.server(), json!({"webhook_url": url, "webhook_dialect": "v2"})).await.ok();
    app.users(&["u1"]).await;
    let cid = "agent:hookv2";
    app.channel(cid, "u1", &["u1"]).await;

    let m = app.say(cid, "u1", "in nanoseconds").await;

    let mut log = Vec::new();
    let hook = next_hook(&mut rx, &mut log, "message.new", is_message_new(&m)).await;
    assert!(hook.body["created_at"].is_i64(), "{}", hook.body);
    assert!(hook.body["message"]["created_at"].is_i64(), "{}", hook.body);
    assert_eq!(hook.header("x-signature"), signature(&hook.raw));
}
