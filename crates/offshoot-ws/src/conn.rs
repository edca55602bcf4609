//! One WebSocket connection: the handshake of each endpoint, then a loop that writes queued
//! events, answers and sends heartbeats, and ends on close, error, a full queue or shutdown.

use crate::auth::{self, Credentials};
use crate::{Conn, ConnSlot, Hub, QUEUE_CAPACITY};
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use offshoot_core::model::User;
use offshoot_core::render::{self, Dialect};
use offshoot_core::{time, Error};
use offshoot_store::UnreadCounts;
use serde_json::{json, Map, Value};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};
use tokio_util::sync::CancellationToken;

/// The server's own heartbeat (JS marks a connection unhealthy after 35 s of silence).
const HEARTBEAT: Duration = Duration::from_secs(25);
/// A write that takes longer than this means the client is gone or stuck.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a v2 client has to send its auth frame.
const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// Clients send only heartbeats and the auth frame.
const MAX_INCOMING: usize = 64 * 1024;
/// The WebSocket read buffer of each connection. The library's default (128 KiB) is filled
/// with zeros up to its capacity on every read, so it is resident for every idle connection
/// (145 KiB per connection in figure d; docs/performance.md, "Memory: connections, allocator and
/// huge pages"); frames from clients are small.
const READ_BUFFER: usize = 4 * 1024;

/// Close codes: 1000 stops JS from reconnecting (a rejected connection); 1001 and 1013 make
/// it reconnect and recover its channels.
const CLOSE_REJECTED: u16 = 1000;
const CLOSE_GOING_AWAY: u16 = 1001;
const CLOSE_TRY_AGAIN: u16 = 1013;
const CLOSE_TOO_BIG: u16 = 1009;
/// A client that sends more events than its cap allows (RFC 6455: policy violation).
const CLOSE_FLOODING: u16 = 1008;

/// WebSocket connections one user may hold at once on one process, by default (Stream's 50).
pub const DEFAULT_CONNECTIONS_PER_USER: usize = 50;
/// Frames (typing and custom events, health checks, anything) one connection may send per
/// minute, by default; a burst may spend the whole minute's count at once (GCRA).
pub const DEFAULT_CLIENT_EVENTS_PER_MINUTE: u32 = 600;

/// The limits on what clients open and send (README, "Rate limits").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    /// The user's connection beyond this is refused (`connection.error`, code 9, 429).
    pub connections_per_user: usize,
    /// A connection that sends more frames than this per minute is closed with 1008.
    pub events_per_minute: u32,
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits { connections_per_user: DEFAULT_CONNECTIONS_PER_USER, events_per_minute: DEFAULT_CLIENT_EVENTS_PER_MINUTE }
    }
}

impl Hub {
    /// Sets the per-user connection cap and the per-connection event rate (for connections
    /// opened from now on).
    pub fn set_client_limits(&self, limits: ClientLimits) {
        *self.client_limits.write().unwrap_or_else(|e| e.into_inner()) = limits;
    }

    fn client_limits(&self) -> ClientLimits {
        *self.client_limits.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the connection unless its user already holds `cap` connections here; the
    /// check and the insert happen under one lock, so concurrent connects cannot overshoot.
    fn register_within(&self, id: String, conn: Conn, cap: usize) -> bool {
        let mut reg = self.write();
        if reg.by_user.get(&conn.user_id).is_some_and(|ids| ids.len() >= cap) {
            return false;
        }
        reg.insert(id, conn);
        true
    }
}

type EventLimiter = governor::DefaultDirectRateLimiter;

fn event_limiter(per_minute: u32) -> EventLimiter {
    let n = std::num::NonZeroU32::new(per_minute.max(1)).expect("at least 1");
    governor::RateLimiter::direct(governor::Quota::per_minute(n))
}

type Sink = SplitSink<WebSocket, Message>;
type Source = SplitStream<WebSocket>;

/// An answer before the upgrade, in Stream's error envelope (the request log reads its code).
fn refuse(status: StatusCode, code: i64, message: &str) -> Response {
    let body = render::error_body(code, status.as_u16(), message, "0.00ms", &Default::default());
    let mut response = (status, axum::Json(body)).into_response();
    response.extensions_mut().insert(render::ErrorCode(code));
    response
}

/// The upgrade and a slot under the per-process connection cap, or the envelope answer: a
/// request that is not an upgrade (a plain `GET`) gets 400 (code 4); one over the cap gets 503
/// (code 71), and existing connections are unaffected.
fn admit(hub: &Arc<Hub>, ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>) -> Result<(WebSocketUpgrade, ConnSlot), Box<Response>> {
    let ws =
        ws.map_err(|e| Box::new(refuse(e.status(), 4, &format!("this endpoint takes WebSocket connections only: {}", e.body_text()))))?;
    let Some(slot) = ConnSlot::acquire(hub) else {
        metrics::counter!("offshoot_ws_connections_refused_total").increment(1);
        let mut r = refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            71,
            &format!("this server holds its maximum of {} WebSocket connections; try again later", hub.max_connections),
        );
        r.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("5"));
        return Err(Box::new(r));
    };
    Ok((ws, slot))
}

/// `GET /connect?json=…&api_key=…&authorization=…&stream-auth-type=jwt|anonymous`.
pub(crate) async fn connect_legacy(
    State(hub): State<Arc<Hub>>,
    Query(params): Query<HashMap<String, String>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    upgrade(hub, ws, move |hub, sink, source| async move {
        let creds = legacy_credentials(&params);
        serve(hub, sink, source, creds, Dialect::Legacy, "health.check").await
    })
}

/// `GET /api/v2/connect?api_key=…`; the client's first frame carries the token.
pub(crate) async fn connect_v2(
    State(hub): State<Arc<Hub>>,
    Query(params): Query<HashMap<String, String>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    upgrade(hub, ws, move |hub, sink, mut source| async move {
        let creds = match timeout(AUTH_TIMEOUT, first_text(&mut source)).await {
            Ok(Some(text)) => v2_credentials(&params, &text),
            Ok(None) => return,
            Err(_) => Err(Error::input("no auth frame ({\"token\": …, \"user_details\": {\"id\": …}}) within 10 s")),
        };
        serve(hub, sink, source, creds, Dialect::V2, "connection.ok").await
    })
}

/// Admits a WebSocket request (it takes a connection slot, or is refused) and upgrades it,
/// handing the socket's halves to `run`, which holds the slot for as long as it runs.
fn upgrade<F, Fut>(hub: Arc<Hub>, ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>, run: F) -> Response
where
    F: FnOnce(Arc<Hub>, Sink, Source) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (ws, slot) = match admit(&hub, ws) {
        Ok(admitted) => admitted,
        Err(refused) => return *refused,
    };
    ws.max_message_size(MAX_INCOMING).read_buffer_size(READ_BUFFER).on_upgrade(move |socket| async move {
        let _slot = slot;
        let (sink, source) = socket.split();
        run(hub, sink, source).await
    })
}

/// Authenticates the connection's credentials and runs its session (greeting it with `hello`),
/// or answers the error and closes.
async fn serve(hub: Arc<Hub>, mut sink: Sink, source: Source, creds: Result<Credentials, Error>, dialect: Dialect, hello: &str) {
    let user = match creds {
        Ok(creds) => auth::authenticate(&hub, creds).await,
        Err(e) => Err(e),
    };
    match user {
        Ok(user) => session(hub, sink, source, user, dialect, hello).await,
        Err(e) => reject(&mut sink, source, &e).await,
    }
}

fn anonymous(params: &HashMap<String, String>) -> bool {
    params.get("stream-auth-type").is_some_and(|t| t.eq_ignore_ascii_case("anonymous"))
}

fn legacy_credentials(params: &HashMap<String, String>) -> Result<Credentials, Error> {
    let payload: Map<String, Value> = match params.get("json").map(String::as_str) {
        None | Some("") => Map::new(),
        Some(raw) => match serde_json::from_str(raw) {
            Ok(Value::Object(o)) => o,
            _ => return Err(Error::input("the json query parameter must be a JSON object")),
        },
    };
    let user_details = payload.get("user_details").and_then(Value::as_object).cloned();
    let user_id = payload
        .get("user_id")
        .and_then(Value::as_str)
        .or_else(|| user_details.as_ref().and_then(|d| d.get("id")).and_then(Value::as_str))
        .map(str::to_string);
    Ok(Credentials {
        api_key: params.get("api_key").cloned(),
        anonymous: anonymous(params),
        token: params.get("authorization").cloned().unwrap_or_default(),
        user_id,
        user_details,
    })
}

fn v2_credentials(params: &HashMap<String, String>, frame: &str) -> Result<Credentials, Error> {
    let Ok(Value::Object(payload)) = serde_json::from_str::<Value>(frame) else {
        return Err(Error::input("the first frame must be a JSON object {\"token\": …, \"user_details\": {\"id\": …}}"));
    };
    let user_details = payload.get("user_details").and_then(Value::as_object).cloned();
    Ok(Credentials {
        api_key: params.get("api_key").cloned(),
        anonymous: anonymous(params),
        token: payload.get("token").and_then(Value::as_str).unwrap_or_default().to_string(),
        user_id: user_details.as_ref().and_then(|d| d.get("id")).and_then(Value::as_str).map(str::to_string),
        user_details,
    })
}

/// The first text frame; None when the client went away first.
async fn first_text(source: &mut Source) -> Option<String> {
    while let Some(frame) = source.next().await {
        match frame {
            Ok(Message::Text(t)) => return Some(t.to_string()),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => {}
        }
    }
    None
}

/// `connection.error`, then close with 1000 so the client does not retry.
async fn reject(sink: &mut Sink, source: Source, e: &Error) {
    reject_with(sink, source, e.kind.code(), e.kind.status(), &e.message).await
}

/// `connection.error` with this code, status and message, then close with 1000.
async fn reject_with(sink: &mut Sink, mut source: Source, code: i64, status: u16, message: &str) {
    tracing::debug!(code, message, "websocket connection rejected");
    let body = json!({
        "type": "connection.error",
        "error": {
            "code": code,
            "StatusCode": status,
            "message": message,
            "duration": "0ms",
            "more_info": "",
            "details": [],
        },
        "created_at": Dialect::Legacy.ts(time::now()),
    });
    let _ = send(sink, Message::Text(body.to_string().into())).await;
    close(sink, CLOSE_REJECTED, "").await;
    // Wait (bounded) for the client's close reply so the close handshake completes.
    let _ = timeout(Duration::from_secs(1), async { while let Some(Ok(_)) = source.next().await {} }).await;
}

async fn session(hub: Arc<Hub>, mut sink: Sink, mut source: Source, mut user: User, dialect: Dialect, hello: &str) {
    let conn_id = uuid::Uuid::new_v4().to_string();
    let (queue, mut events) = mpsc::channel(QUEUE_CAPACITY);
    let kick = CancellationToken::new();
    // Registered here before the store records it (the heartbeat removes records of
    // connections the registry does not hold), and both before the first frame, so a watch
    // sent right after it finds the connection.
    let limits = hub.client_limits();
    let conn = Conn { user_id: user.id.clone(), dialect, queue, watching: HashSet::new(), kick: kick.clone() };
    if !hub.register_within(conn_id.clone(), conn, limits.connections_per_user) {
        metrics::counter!("offshoot_ws_connections_refused_total").increment(1);
        let message = format!("Too many requests: user {} already holds {} WebSocket connections", user.id, limits.connections_per_user);
        reject_with(&mut sink, source, 9, 429, &message).await;
        return;
    }
    let client_events = event_limiter(limits.events_per_minute);
    match hub.store.open_connection(&hub.instance, &conn_id, &user.id).await {
        Ok(Some(stored)) => user = stored,
        Ok(None) => {}
        Err(e) => {
            // Without its record the user would not be online nor the connection a watcher.
            tracing::warn!(error = %e, "recording the websocket connection failed; closing it");
            hub.disconnect(&conn_id);
            close(&mut sink, CLOSE_TRY_AGAIN, "database unavailable").await;
            return;
        }
    }
    tracing::debug!(connection_id = %conn_id, user_id = %user.id, "websocket connected");

    let heartbeat_frame = |kind: &str, me: &Value| {
        let frame = json!({"type": kind, "connection_id": conn_id, "cid": "*", "me": me, "created_at": dialect.ts(time::now())});
        Message::Text(frame.to_string().into())
    };
    let me = render_me(dialect, &user, unread_counts(&hub, &user.id).await);
    let mut heartbeat = tokio::time::interval_at(Instant::now() + HEARTBEAT, HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut close_with = None;
    if send(&mut sink, heartbeat_frame(hello, &me)).await.is_ok() {
        close_with = loop {
            tokio::select! {
                // Cancellation first, then events before the client's frames: a client
                // only sends heartbeats, and a busy channel fills the queue otherwise.
                biased;
                _ = hub.closing.cancelled() => break Some((CLOSE_GOING_AWAY, "server shutting down")),
                _ = kick.cancelled() => break Some((CLOSE_TRY_AGAIN, "too many events queued; reconnect")),
                event = events.recv() => match event {
                    Some(text) => {
                        if send(&mut sink, Message::Text(text)).await.is_err() { break None }
                        metrics::counter!("offshoot_ws_events_sent_total").increment(1);
                    }
                    None => break None,
                },
                frame = source.next() => match frame {
                    // Every frame but the close counts against the connection's event cap.
                    Some(Ok(ref m)) if !matches!(m, Message::Close(_)) && client_events.check().is_err() => {
                        metrics::counter!("offshoot_ws_flooding_closed_total").increment(1);
                        break Some((CLOSE_FLOODING, "too many client events"));
                    }
                    Some(Ok(Message::Text(text))) => {
                        if is_health_check(&text) {
                            let me = render_me(dialect, &user, unread_counts(&hub, &user.id).await);
                            if send(&mut sink, heartbeat_frame("health.check", &me)).await.is_err() {
                                break None;
                            }
                        }
                    }
                    // A frame over MAX_INCOMING: "message too big", as RFC 6455 names it.
                    Some(Err(e)) if is_too_big(&e) => break Some((CLOSE_TOO_BIG, "frame too large")),
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break None,
                    Some(Ok(_)) => {}
                },
                _ = heartbeat.tick() => {
                    let me = render_me(dialect, &user, unread_counts(&hub, &user.id).await);
                    if send(&mut sink, heartbeat_frame("health.check", &me)).await.is_err() { break None }
                }
            }
        };
    }
    hub.disconnect(&conn_id);
    if let Err(e) = hub.store.close_connection(&conn_id).await {
        tracing::warn!(error = %e, "removing the websocket connection's record failed; the heartbeat removes it later");
    }
    match close_with {
        Some((code, reason)) => {
            close(&mut sink, code, reason).await;
            // Read (bounded) until the client's close reply: a socket closed with unread bytes
            // (a flooding client's frames) is reset, and the reset can overtake the close frame.
            let _ = timeout(Duration::from_secs(1), async {
                while let Some(Ok(frame)) = source.next().await {
                    if matches!(frame, Message::Close(_)) {
                        break;
                    }
                }
            })
            .await;
        }
        None => {
            let _ = timeout(Duration::from_secs(1), sink.close()).await;
        }
    }
    tracing::debug!(connection_id = %conn_id, "websocket closed");
}

/// The user's unread counters as `me` carries them (0 when they cannot be read).
async fn unread_counts(hub: &Hub, user_id: &str) -> UnreadCounts {
    match hub.store.unread_counts(user_id).await {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(error = %e, "reading the unread counters failed; me carries 0");
            UnreadCounts::default()
        }
    }
}

/// Whether a read failed because the client's frame or message exceeded [`MAX_INCOMING`]. axum
/// does not expose tungstenite's error type; its capacity error names the limit.
fn is_too_big(e: &axum::Error) -> bool {
    let text = e.to_string();
    text.contains("Message too long") || text.contains("Space limit exceeded")
}

/// A client heartbeat: `[{"type":"health.check",…}]` (JS) or a bare object.
fn is_health_check(text: &Utf8Bytes) -> bool {
    let is_check = |v: &Value| v.get("type").and_then(Value::as_str) == Some("health.check");
    match serde_json::from_str::<Value>(text.as_str()) {
        Ok(Value::Array(items)) => items.iter().any(is_check),
        Ok(v) => is_check(&v),
        Err(_) => false,
    }
}

/// The connection's own user, as JS `connectUser` expects it in `me`.
fn render_me(dialect: Dialect, user: &User, unread: UnreadCounts) -> Value {
    let mut me = render::user(dialect, user);
    if let Value::Object(o) = &mut me {
        o.insert("online".into(), true.into());
        o.insert("total_unread_count".into(), unread.total.into());
        o.insert("unread_count".into(), unread.total.into());
        o.insert("unread_channels".into(), unread.channels.into());
        o.insert("unread_threads".into(), 0.into());
        for key in ["channel_mutes", "mutes", "devices"] {
            o.insert(key.into(), Value::Array(Vec::new()));
        }
    }
    me
}

async fn send(sink: &mut Sink, msg: Message) -> Result<(), ()> {
    match timeout(SEND_TIMEOUT, sink.send(msg)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "websocket write failed");
            Err(())
        }
        Err(_) => {
            tracing::debug!("websocket write timed out");
            Err(())
        }
    }
}

async fn close(sink: &mut Sink, code: u16, reason: &str) {
    let frame = Message::Close(Some(CloseFrame { code, reason: Utf8Bytes::from(reason) }));
    let _ = timeout(Duration::from_secs(1), async {
        let _ = sink.send(frame).await;
        let _ = sink.close().await;
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeats_are_recognised_as_arrays_and_objects() {
        assert!(is_health_check(&Utf8Bytes::from(r#"[{"type":"health.check","client_id":"u1--x"}]"#)));
        assert!(is_health_check(&Utf8Bytes::from(r#"{"type":"health.check"}"#)));
        assert!(!is_health_check(&Utf8Bytes::from(r#"{"type":"typing.start"}"#)));
        assert!(!is_health_check(&Utf8Bytes::from("not json")));
    }

    #[test]
    fn legacy_credentials_take_the_user_from_json_and_the_token_from_authorization() {
        let params: HashMap<String, String> = [
            ("json", r#"{"user_id":"u1","user_details":{"id":"u1","name":"U"}}"#),
            ("api_key", "k"),
            ("authorization", "t"),
            ("stream-auth-type", "jwt"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let c = legacy_credentials(&params).unwrap();
        assert_eq!(c.user_id.as_deref(), Some("u1"));
        assert_eq!(c.token, "t");
        assert!(!c.anonymous);
        assert_eq!(c.user_details.unwrap()["name"], "U");
        let bad: HashMap<String, String> = [("json".to_string(), "[1]".to_string())].into_iter().collect();
        assert!(legacy_credentials(&bad).is_err());
    }

    #[test]
    fn me_carries_the_counters_js_reads() {
        let me = render_me(Dialect::Legacy, &User::placeholder("u1", "user"), UnreadCounts { total: 7, channels: 2 });
        assert_eq!(me["id"], "u1");
        assert_eq!(
            (me["total_unread_count"].clone(), me["unread_count"].clone(), me["unread_channels"].clone()),
            (json!(7), json!(7), json!(2))
        );
        assert_eq!(me["mutes"], json!([]));
    }
}
