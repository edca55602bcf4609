//! Webhook delivery from the event outbox.
//!
//! Two steps, both durable. Queueing: the `webhooks` outbox cursor moves past new events and,
//! in the same transaction, one delivery row is written per event and configured URL (so a
//! crash neither loses nor repeats a queued delivery, and the cursor's compare-and-set keeps
//! two workers from queueing the same events). Delivering: a due delivery is leased, POSTed
//! with Stream's headers and signature, then removed or rescheduled. A worker that dies
//! mid-attempt loses the lease and the attempt is made again, so delivery is at least once;
//! `X-Webhook-Id` stays the same across attempts so receivers can drop duplicates.
//!
//! Retries follow Stream: HTTP 408, 429, 5xx or a timeout are tried 3 times, a network error
//! twice, any other answer once. Each attempt times out after 6 s.

use hmac::{Hmac, KeyInit, Mac};
use offshoot_core::model::{AppSettings, OutboxEvent};
use offshoot_core::render::{self, Dialect};
use offshoot_core::time;
use offshoot_store::{Store, StoreError};
use sha2::Sha256;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The outbox cursor of webhook queueing.
pub const CURSOR: &str = "webhooks";
/// Per attempt, as Stream does.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(6);
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Events read from the outbox per query.
const BATCH: i64 = 500;
/// Deliveries in flight at once.
const MAX_IN_FLIGHT: usize = 32;
/// How long a leased delivery stays invisible to other workers (covers one attempt).
const LEASE: Duration = Duration::from_secs(30);

/// Runs until `shutdown`, then waits (bounded by one attempt's timeout) for deliveries in
/// flight.
pub async fn run(store: Store, api_key: String, api_secret: String, shutdown: CancellationToken) {
    let client = match reqwest::Client::builder().timeout(ATTEMPT_TIMEOUT).redirect(reqwest::redirect::Policy::none()).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the webhook HTTP client; webhooks are off");
            return;
        }
    };
    let ctx = Arc::new(Ctx { store, client, api_key, api_secret });
    let notify = ctx.store.event_notify();
    let mut in_flight: JoinSet<()> = JoinSet::new();
    let mut failing = false;
    tracing::info!("webhook delivery started");
    loop {
        // Registered before reading, so a commit during the read still wakes the next wait.
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        reap(&mut in_flight);
        let result = async {
            queue_new(&ctx.store).await?;
            start_due(&ctx, &mut in_flight).await
        }
        .await;
        match result {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("webhook queueing works again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::error!(error = %e, "webhook queueing failed; retrying");
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = &mut notified => {}
            _ = tokio::time::sleep(POLL_INTERVAL) => {}
            Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
        }
    }
    let drained =
        tokio::time::timeout(ATTEMPT_TIMEOUT + Duration::from_secs(1), async { while in_flight.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!("webhook deliveries still in flight at shutdown; they are retried after restart");
    }
    tracing::info!("webhook delivery stopped");
}

struct Ctx {
    store: Store,
    client: reqwest::Client,
    api_key: String,
    api_secret: String,
}

fn reap(in_flight: &mut JoinSet<()>) {
    while let Some(done) = in_flight.try_join_next() {
        if let Err(e) = done {
            tracing::error!(error = %e, "a webhook delivery task failed");
        }
    }
}

/// Moves the cursor past new events, queueing a delivery per webhook-audience event and URL.
async fn queue_new(store: &Store) -> Result<(), StoreError> {
    loop {
        let from = store.outbox_cursor(CURSOR).await?;
        let batch = store.events_after(from, BATCH).await?;
        let Some(to) = batch.last().map(|e| e.seq) else {
            return Ok(());
        };
        let settings = store.app_settings().await?;
        let deliveries: Vec<(i64, String)> = batch
            .iter()
            .filter(|e| e.audience.webhooks && !e.event.kind.is_empty())
            .flat_map(|e| webhook_urls(&settings, &e.event.kind).into_iter().map(move |url| (e.seq, url)))
            .collect();
        // False: another worker queued this range first; read its cursor again.
        let advanced = store.advance_cursor_from(CURSOR, from, to, &deliveries).await?;
        if advanced && (batch.len() as i64) < BATCH {
            return Ok(());
        }
    }
}

/// Leases due deliveries (up to the free capacity) and starts them.
async fn start_due(ctx: &Arc<Ctx>, in_flight: &mut JoinSet<()>) -> Result<(), StoreError> {
    let free = MAX_IN_FLIGHT.saturating_sub(in_flight.len());
    if free == 0 {
        return Ok(());
    }
    let due = ctx.store.due_deliveries(free as i64).await?;
    if due.is_empty() {
        return Ok(());
    }
    let dialect = webhook_dialect(&ctx.store.app_settings().await?);
    for (id, event, url, attempts) in due {
        let lease_until = time::now() + LEASE.as_nanos() as i64;
        if !ctx.store.claim_delivery(&id, attempts, lease_until).await? {
            continue;
        }
        let ctx = ctx.clone();
        in_flight.spawn(async move { deliver(&ctx, dialect, id, event, url, attempts).await });
    }
    Ok(())
}

/// The URLs an event of type `kind` goes to: `webhook_url` (filtered by `webhook_events`) and
/// every enabled `event_hooks` entry of type `webhook` (filtered by its `event_types`). An
/// empty filter means every event. Each URL once.
pub fn webhook_urls(settings: &AppSettings, kind: &str) -> Vec<String> {
    fn wants<'a>(mut types: impl Iterator<Item = &'a str>, kind: &str, empty: bool) -> bool {
        empty || types.any(|t| t == kind || t == "*")
    }
    let mut urls: Vec<String> = Vec::new();
    if let Some(url) = settings.webhook_url.as_deref().map(str::trim).filter(|u| !u.is_empty()) {
        if wants(settings.webhook_events.iter().map(String::as_str), kind, settings.webhook_events.is_empty()) {
            urls.push(url.to_string());
        }
    }
    for hook in settings.event_hooks.iter().filter_map(|h| h.as_object()) {
        let kind_of_hook = hook.get("hook_type").and_then(|v| v.as_str()).unwrap_or("webhook");
        let enabled = hook.get("enabled").and_then(|v| v.as_bool()).unwrap_or(true);
        let Some(url) = hook.get("webhook_url").and_then(|v| v.as_str()).map(str::trim).filter(|u| !u.is_empty()) else {
            continue;
        };
        if kind_of_hook != "webhook" || !enabled {
            continue;
        }
        let types: Vec<&str> =
            hook.get("event_types").and_then(|v| v.as_array()).map(|a| a.iter().filter_map(|t| t.as_str()).collect()).unwrap_or_default();
        if wants(types.iter().copied(), kind, types.is_empty()) {
            urls.push(url.to_string());
        }
    }
    let mut seen = std::collections::HashSet::new();
    urls.retain(|u| seen.insert(u.clone()));
    urls
}

fn webhook_dialect(settings: &AppSettings) -> Dialect {
    if settings.webhook_dialect.eq_ignore_ascii_case("v2") {
        Dialect::V2
    } else {
        Dialect::Legacy
    }
}

/// Lowercase hex HMAC-SHA256 of `body` keyed with the API secret (`X-Signature`).
pub fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes()).expect("HMAC accepts keys of any length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// How one attempt ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Delivered,
    /// Worth another attempt, up to this many attempts in all.
    Retry {
        reason: String,
        max_attempts: i64,
    },
    GiveUp(String),
}

fn classify_status(status: reqwest::StatusCode) -> Outcome {
    if status.is_success() {
        Outcome::Delivered
    } else if status.as_u16() == 408 || status.as_u16() == 429 || status.is_server_error() {
        Outcome::Retry { reason: format!("HTTP {status}"), max_attempts: 3 }
    } else {
        Outcome::GiveUp(format!("HTTP {status}"))
    }
}

/// Pause before attempt `attempt + 1`.
fn backoff(attempt: i64) -> Duration {
    match attempt {
        1 => Duration::from_millis(500),
        _ => Duration::from_secs(2),
    }
}

async fn deliver(ctx: &Ctx, dialect: Dialect, id: String, ev: OutboxEvent, url: String, attempts: i64) {
    let attempt = attempts + 1;
    let outcome = if ev.event.kind.is_empty() {
        Outcome::GiveUp("the event could not be decoded".into())
    } else {
        post(ctx, dialect, &id, &ev, &url, attempt).await
    };
    let retry_at = match &outcome {
        Outcome::Delivered => {
            tracing::debug!(delivery = %id, seq = ev.seq, %url, attempt, "webhook delivered");
            None
        }
        Outcome::Retry { reason, max_attempts } if attempt < *max_attempts => {
            tracing::info!(delivery = %id, seq = ev.seq, %url, attempt, %reason, "webhook attempt failed; retrying");
            Some(time::now() + backoff(attempt).as_nanos() as i64)
        }
        Outcome::Retry { reason, .. } => {
            tracing::warn!(delivery = %id, seq = ev.seq, event = %ev.event.kind, %url, attempt, %reason, "webhook not delivered; giving up after the last attempt");
            None
        }
        Outcome::GiveUp(reason) => {
            tracing::warn!(delivery = %id, seq = ev.seq, event = %ev.event.kind, %url, attempt, %reason, "webhook not delivered; not retrying");
            None
        }
    };
    if let Err(e) = ctx.store.finish_delivery(&id, retry_at).await {
        // The lease expires and the attempt is made again.
        tracing::error!(delivery = %id, error = %e, "recording a webhook attempt failed");
    }
}

fn carries_members(kind: &str) -> bool {
    ["message.", "channel.", "member.", "reaction."].iter().any(|p| kind.starts_with(p))
}

async fn post(ctx: &Ctx, dialect: Dialect, id: &str, ev: &OutboxEvent, url: &str, attempt: i64) -> Outcome {
    let mut value = render::event(dialect, &ev.event);
    // Like Stream, message and channel events carry the channel's members (up to 50).
    if let Some(cid) = ev.event.cid.as_deref().filter(|_| carries_members(&ev.event.kind)) {
        match ctx.store.members(cid, 50, 0).await {
            Ok(members) => value["members"] = members.iter().map(|m| render::member(dialect, m)).collect(),
            Err(e) => return Outcome::Retry { reason: format!("loading the channel's members failed: {e}"), max_attempts: 3 },
        }
    }
    let body = match serde_json::to_vec(&value) {
        Ok(b) => b,
        Err(e) => return Outcome::GiveUp(format!("rendering the event failed: {e}")),
    };
    let request = ctx
        .client
        .post(url)
        .header("Content-Type", "application/json")
        .header("X-Signature", sign(&ctx.api_secret, &body))
        .header("X-Webhook-Id", id)
        .header("X-Webhook-Attempt", attempt.to_string())
        .header("X-Api-Key", &ctx.api_key)
        .body(body);
    match request.send().await {
        Ok(resp) => classify_status(resp.status()),
        Err(e) if e.is_timeout() => Outcome::Retry { reason: "timed out".into(), max_attempts: 3 },
        Err(e) if e.is_builder() => Outcome::GiveUp(format!("invalid webhook URL: {e}")),
        Err(e) => Outcome::Retry { reason: format!("network error: {e}"), max_attempts: 2 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_signature_is_lowercase_hex_hmac_sha256_of_the_body() {
        // RFC 4231 test case 2.
        assert_eq!(sign("Jefe", b"what do ya want for nothing?"), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn urls_come_from_webhook_url_and_enabled_webhook_hooks_filtered_by_type() {
        let mut s = AppSettings { webhook_url: Some("http://a/".into()), webhook_events: vec!["message.new".into()], ..Default::default() };
        s.event_hooks = vec![
            json!({"hook_type": "webhook", "enabled": true, "webhook_url": "http://b/", "event_types": []}),
            json!({"hook_type": "webhook", "enabled": false, "webhook_url": "http://c/"}),
            json!({"hook_type": "sqs", "enabled": true, "sqs_url": "http://d/"}),
            json!({"hook_type": "webhook", "enabled": true, "webhook_url": "http://e/", "event_types": ["channel.forked"]}),
            json!({"hook_type": "webhook", "enabled": true, "webhook_url": "http://a/"}),
            json!("not an object"),
        ];
        assert_eq!(webhook_urls(&s, "message.new"), vec!["http://a/", "http://b/"]);
        assert_eq!(webhook_urls(&s, "channel.forked"), vec!["http://b/", "http://e/", "http://a/"]);
        assert!(webhook_urls(&AppSettings::default(), "message.new").is_empty());
    }

    #[test]
    fn statuses_are_classified_as_stream_retries_them() {
        use reqwest::StatusCode;
        assert_eq!(classify_status(StatusCode::OK), Outcome::Delivered);
        assert_eq!(classify_status(StatusCode::NO_CONTENT), Outcome::Delivered);
        for s in [StatusCode::REQUEST_TIMEOUT, StatusCode::TOO_MANY_REQUESTS, StatusCode::INTERNAL_SERVER_ERROR, StatusCode::BAD_GATEWAY] {
            assert!(matches!(classify_status(s), Outcome::Retry { max_attempts: 3, .. }), "{s}");
        }
        for s in [StatusCode::BAD_REQUEST, StatusCode::NOT_FOUND, StatusCode::FOUND] {
            assert!(matches!(classify_status(s), Outcome::GiveUp(_)), "{s}");
        }
    }

    #[test]
    fn the_dialect_setting_picks_the_renderer() {
        let mut s = AppSettings::default();
        assert_eq!(webhook_dialect(&s), Dialect::Legacy);
        s.webhook_dialect = "v2".into();
        assert_eq!(webhook_dialect(&s), Dialect::V2);
    }
}
