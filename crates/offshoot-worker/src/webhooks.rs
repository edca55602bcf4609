//! Webhook delivery as apalis jobs.
//!
//! Queueing: [`relay`] reads the event outbox from the `webhooks` cursor and pushes one job per
//! (event, endpoint), carrying the rendered body, then moves the cursor (compare-and-set). The
//! first attempt's job id is derived from the delivery id (a version 5 UUID of the event's
//! `seq` and the URL), so two workers queueing the same events, or a worker queueing them
//! again after a crash between push and cursor move, collide on apalis's unique job id instead
//! of delivering twice.
//!
//! Delivering: each attempt POSTs the same body with Stream's headers, `X-Webhook-Id` (the
//! delivery id, the same on every attempt) and `X-Webhook-Attempt`. HTTP 408, 429, 5xx, a
//! timeout or a network error is retried: the job ends and a new one is pushed after an
//! exponential back-off with jitter, for as long as the retry window (24 h by default) lasts.
//! Any other answer (a 4xx: the receiver refuses this event) and a delivery still failing at
//! the end of the window are **dead-lettered**: kept with their body, listed and replayed by
//! an admin (`GET /webhooks/dead_letters`, `POST /webhooks/dead_letters/replay`, or the CLI).
//!
//! Per endpoint, a circuit opens after [`WebhookPolicy::circuit_threshold`] failures in a row:
//! while it is open that endpoint's deliveries wait (pushed again for when it closes, or for
//! the end of their own back-off if that is later) without spending an attempt; when it half-opens one delivery probes, and a success closes it. The
//! circuit is kept per worker process. Other endpoints are never held back.
//!
//! Catching up: a delivery waiting out a long back-off would reach a receiver minutes after it
//! is back. So when an endpoint's circuit opens (and at start-up, for every endpoint with
//! deliveries waiting in the queue) a task of this process probes it every
//! [`WebhookPolicy::probe_interval`] by making its oldest waiting delivery due at once; and as
//! soon as the endpoint answers (that probe, or any delivery to it, succeeds) the task releases
//! its waiting deliveries oldest event first, at most [`WebhookPolicy::release_concurrency`]
//! in flight, the next as each ends. Releasing is one `UPDATE` of apalis's table that makes
//! still-waiting jobs due and marks them `released` (an open circuit anywhere lets them
//! through); a job a worker took meanwhile is not touched, and apalis's fetch locks what it
//! takes, so each delivery still runs once. A released delivery that fails again is retried
//! with its back-off, and the task goes back to probing.

pub use crate::jobs::DeliveryJob;
use crate::queue::WaitingDelivery;
use crate::queue::{ulid_of, QueueError};
use crate::record::{self, Attempt};
use crate::Shared;
use apalis::prelude::{BoxDynError, Data};
use hmac::{Hmac, KeyInit, Mac};
use offshoot_core::jobs::DeadLetter;
use offshoot_core::model::{AppSettings, OutboxEvent};
use offshoot_core::render::{self, Dialect};
use offshoot_core::time;
use offshoot_store::{DeadLetterRecord, Store};
use secrecy::ExposeSecret;
use sha2::Sha256;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The outbox cursor of webhook queueing.
pub const CURSOR: &str = "webhooks";
/// Events read from the outbox per query.
const BATCH: i64 = 500;

/// How deliveries are retried.
#[derive(Debug, Clone)]
pub struct WebhookPolicy {
    /// How long after its first attempt a delivery is still retried; then it is dead-lettered.
    pub retry_window: Duration,
    /// Back-off before attempt 2, doubled for each further attempt up to `backoff_max`, with
    /// jitter (each pause is between half and all of that).
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Per attempt.
    pub attempt_timeout: Duration,
    /// Failures in a row that open an endpoint's circuit.
    pub circuit_threshold: u32,
    /// Deliveries in flight at once per worker process.
    pub concurrency: usize,
    /// While an endpoint fails, how often its oldest waiting delivery is tried early.
    pub probe_interval: Duration,
    /// Released deliveries in flight at once per endpoint and worker process, once it answers.
    pub release_concurrency: usize,
}

impl Default for WebhookPolicy {
    fn default() -> Self {
        WebhookPolicy {
            retry_window: Duration::from_secs(24 * 3600),
            backoff_base: Duration::from_secs(2),
            backoff_max: Duration::from_secs(3600),
            attempt_timeout: Duration::from_secs(6),
            circuit_threshold: 5,
            concurrency: 16,
            probe_interval: Duration::from_secs(5),
            release_concurrency: 8,
        }
    }
}

/// The delivery id of an event at an endpoint.
pub fn delivery_id(seq: i64, url: &str) -> uuid::Uuid {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, format!("offshoot:webhook:{seq}:{url}").as_bytes())
}

// ---------------------------------------------------------------------------------------------
// Queueing

/// Turns outbox events into delivery jobs until `shutdown`.
pub async fn relay(shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut cursor = Cursor::default();
    tracing::info!("webhook queueing started");
    resume_catch_up(&shared).await;
    let mut outbox = shared.store.follow_outbox("webhook queueing");
    while outbox.next(shutdown.cancelled()).await {
        outbox.read(queue_new(&shared, &mut cursor).await);
    }
    if let Err(e) = cursor.store(&shared.store).await {
        tracing::warn!(error = %e, "saving the webhook cursor at shutdown failed; the events since are read again");
    }
    tracing::info!("webhook queueing stopped");
}

/// How long the relay may run ahead of its stored cursor while it queues nothing.
const CURSOR_LAG: Duration = Duration::from_secs(1);

/// The relay's place in the outbox. Events that queue no delivery (no endpoint, or none for
/// their type) move it in memory only, and it is stored at most every [`CURSOR_LAG`]: storing
/// it is a write transaction, and one per batch of such events was a fifth of the write
/// transactions of agent streaming on SQLite (docs/performance.md, "Worker (apalis)"). Events read
/// again after a restart queue nothing again; a delivery is stored before the events that
/// follow it are read.
#[derive(Default)]
struct Cursor {
    /// The stored cursor, as last read or written (None: read it).
    stored: Option<i64>,
    /// How far this relay has read, when ahead of `stored`.
    ahead: Option<i64>,
    /// When `stored` was last written.
    stored_at: Option<tokio::time::Instant>,
}

impl Cursor {
    /// Where to read from next.
    async fn position(&mut self, store: &offshoot_store::Store) -> Result<i64, BoxDynError> {
        if let Some(at) = self.ahead.or(self.stored) {
            return Ok(at);
        }
        let at = store.outbox_cursor(CURSOR).await?;
        self.stored = Some(at);
        Ok(at)
    }

    fn due(&self) -> bool {
        self.stored_at.is_none_or(|at| at.elapsed() >= CURSOR_LAG)
    }

    /// Stores the position `to`. False when another worker moved the stored cursor in the
    /// meantime (its jobs collided with ours): the cursor is read again.
    async fn store_at(&mut self, store: &offshoot_store::Store, to: i64) -> Result<bool, BoxDynError> {
        let Some(from) = self.stored else {
            self.ahead = None;
            return Ok(false);
        };
        if to != from && !store.advance_cursor_from(CURSOR, from, to).await? {
            *self = Cursor::default();
            return Ok(false);
        }
        (self.stored, self.ahead, self.stored_at) = (Some(to), None, Some(tokio::time::Instant::now()));
        Ok(true)
    }

    /// Stores how far it is ahead, if it is.
    async fn store(&mut self, store: &offshoot_store::Store) -> Result<(), BoxDynError> {
        if let Some(to) = self.ahead {
            self.store_at(store, to).await?;
        }
        Ok(())
    }
}

/// Pushes a delivery job per webhook-audience event and URL past the cursor, then moves it.
/// With no webhook configured the cursor passes the events without reading them (an agent's
/// streamed answer is thousands of events a second, each carrying the whole message).
async fn queue_new(shared: &Shared, cursor: &mut Cursor) -> Result<(), BoxDynError> {
    let store = &shared.store;
    loop {
        let from = cursor.position(store).await?;
        let settings = store.app_settings().await?;
        let (last, read, jobs) = if hooks(&settings).next().is_none() {
            let (last, read) = store.event_span_after(from, BATCH).await?;
            (last, read, Vec::new())
        } else {
            let batch = store.events_after(from, BATCH).await?;
            let jobs = delivery_jobs(store, &settings, &batch).await?;
            (batch.last().map(|e| e.seq), offshoot_store::outbox_rows(&batch), jobs)
        };
        let Some(to) = last else {
            if cursor.due() {
                cursor.store(store).await?;
            }
            return Ok(());
        };
        let queued = !jobs.is_empty();
        shared.pools.push_deliveries(jobs).await?;
        let moved = match queued || cursor.due() {
            true => cursor.store_at(store, to).await?,
            false => {
                cursor.ahead = Some(to);
                true
            }
        };
        if moved && read < BATCH {
            return Ok(());
        }
    }
}

/// A delivery job per webhook-audience event of `batch` and URL that wants it.
async fn delivery_jobs(
    store: &Store,
    settings: &AppSettings,
    batch: &[std::sync::Arc<OutboxEvent>],
) -> Result<Vec<(DeliveryJob, ulid::Ulid, Duration)>, BoxDynError> {
    let dialect = webhook_dialect(settings);
    let now = time::now();
    let mut jobs = Vec::new();
    for ev in batch.iter().filter(|e| e.audience.webhooks && !e.event.kind.is_empty()) {
        let urls = webhook_urls(settings, &ev.event.kind);
        if urls.is_empty() {
            continue;
        }
        let body = render_body(store, dialect, ev).await?;
        for url in urls {
            let id = delivery_id(ev.seq, &url);
            let job = DeliveryJob {
                id: id.to_string(),
                url,
                event_type: ev.event.kind.clone(),
                seq: ev.seq,
                body: body.clone(),
                attempt: 1,
                window_start: now,
                last_error: None,
                released: false,
            };
            jobs.push((job, ulid_of(id), Duration::ZERO));
        }
    }
    Ok(jobs)
}

fn carries_members(kind: &str) -> bool {
    ["message.", "channel.", "member.", "reaction."].iter().any(|p| kind.starts_with(p))
}

async fn render_body(store: &Store, dialect: Dialect, ev: &OutboxEvent) -> Result<String, BoxDynError> {
    let mut value = render::event(dialect, &ev.event);
    // Like Stream, message and channel events carry the channel's members (up to 50).
    if let Some(cid) = ev.event.cid.as_deref().filter(|_| carries_members(&ev.event.kind)) {
        let members = store.members(cid, 50, 0).await?;
        // Each member's user carries their unread counters, as Stream's do: those the event
        // recorded when it was written (message.new), else the current ones.
        let missing: Vec<String> = members.iter().map(|m| m.user_id.clone()).filter(|u| !ev.audience.unread.contains_key(u)).collect();
        let mut unread = store.unread_counts_of(&missing).await?;
        unread.extend(ev.audience.unread.iter().map(|(k, v)| (k.clone(), *v)));
        value["members"] = members
            .iter()
            .map(|m| {
                let mut v = render::member(dialect, m);
                let u = unread.get(&m.user_id).copied().unwrap_or_default();
                if let Some(user) = v.get_mut("user").and_then(serde_json::Value::as_object_mut) {
                    user.insert("total_unread_count".into(), u.total.into());
                    user.insert("unread_count".into(), u.total.into());
                    user.insert("unread_channels".into(), u.channels.into());
                }
                v
            })
            .collect();
    }
    Ok(serde_json::to_string(&value)?)
}

/// The URLs an event of type `kind` goes to: `webhook_url` (filtered by `webhook_events`) and
/// every enabled `event_hooks` entry of type `webhook` (filtered by its `event_types`). An
/// empty filter means every event. Each URL once.
pub fn webhook_urls(settings: &AppSettings, kind: &str) -> Vec<String> {
    let mut urls: Vec<String> = hooks(settings)
        .filter(|(_, types)| types.is_empty() || types.iter().any(|t| *t == kind || *t == "*"))
        .map(|(url, _)| url.to_string())
        .collect();
    let mut seen = std::collections::HashSet::new();
    urls.retain(|u| seen.insert(u.clone()));
    urls
}

/// The enabled webhooks of the app: each URL with the event types it asks for (none: all).
fn hooks(settings: &AppSettings) -> impl Iterator<Item = (&str, Vec<&str>)> {
    let main = settings.webhook_url.as_deref().map(str::trim).filter(|u| !u.is_empty());
    let main = main.map(|url| (url, settings.webhook_events.iter().map(String::as_str).collect()));
    let others = settings.event_hooks.iter().filter_map(|h| h.as_object()).filter_map(|hook| {
        let kind_of_hook = hook.get("hook_type").and_then(|v| v.as_str()).unwrap_or("webhook");
        let enabled = hook.get("enabled").and_then(|v| v.as_bool()).unwrap_or(true);
        let url = hook.get("webhook_url").and_then(|v| v.as_str()).map(str::trim).filter(|u| !u.is_empty())?;
        if kind_of_hook != "webhook" || !enabled {
            return None;
        }
        let types = hook.get("event_types").and_then(|v| v.as_array()).map(|a| a.iter().filter_map(|t| t.as_str()).collect());
        Some((url, types.unwrap_or_default()))
    });
    main.into_iter().chain(others)
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

// ---------------------------------------------------------------------------------------------
// Delivering

/// How one attempt ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Delivered,
    /// Worth another attempt.
    Retry(String),
    /// The receiver refused this event: no point in trying again.
    Refused(String),
}

fn classify_status(status: reqwest::StatusCode) -> Outcome {
    if status.is_success() {
        Outcome::Delivered
    } else if status.as_u16() == 408 || status.as_u16() == 429 || status.is_server_error() {
        Outcome::Retry(format!("HTTP {status}"))
    } else {
        Outcome::Refused(format!("HTTP {status}"))
    }
}

/// The apalis handler of the webhook queue: one attempt.
pub async fn run_job(job: DeliveryJob, shared: Data<Arc<Shared>>) -> Result<(), BoxDynError> {
    crate::on_own_task(run(job, Arc::clone(&shared))).await
}

async fn run(job: DeliveryJob, shared: Arc<Shared>) -> Result<(), BoxDynError> {
    let policy = &shared.webhooks;
    let deadline = job.window_start + policy.retry_window.as_nanos() as i64;
    let admit = match job.released {
        true => Admit::Go,
        false => shared.circuits.admit(&job.url, policy),
    };
    if let Admit::Wait(wait) = admit {
        // Not an attempt: wait for the circuit, unless the window ends first. Its own back-off
        // at least: the endpoint's catch-up releases it as soon as the endpoint answers.
        let wait = wait.max(offshoot_store::backoff(policy.backoff_base, policy.backoff_max, job.attempt));
        if time::now() + wait.as_nanos() as i64 > deadline {
            let reason = format!(
                "{}; the endpoint kept failing until the end of the retry window",
                job.last_error.as_deref().unwrap_or("the endpoint's circuit was open")
            );
            return dead_letter(&shared, &job, job.attempt.saturating_sub(1), &reason).await;
        }
        tracing::debug!(delivery = %job.id, url = %job.url, wait_s = wait.as_secs(), "endpoint circuit open; delivery waits");
        start_catch_up(&shared, &job.url, false);
        shared.pools.push_deliveries(vec![(job.clone(), ulid::Ulid::generate(), wait)]).await?;
        return Ok(());
    }
    let outcome = post(&shared, &job).await;
    let answered = !matches!(outcome, Outcome::Retry(_));
    if shared.circuits.record(&job.url, answered, policy) {
        start_catch_up(&shared, &job.url, answered);
    }
    match outcome {
        Outcome::Delivered => {
            record::webhook_attempt(Attempt::Delivered);
            tracing::debug!(delivery = %job.id, seq = job.seq, url = %job.url, attempt = job.attempt, "webhook delivered");
            Ok(())
        }
        Outcome::Refused(reason) => {
            record::webhook_attempt(Attempt::Failed);
            tracing::warn!(delivery = %job.id, event = %job.event_type, url = %job.url, attempt = job.attempt, %reason, "webhook refused by the receiver; dead-lettered");
            dead_letter(&shared, &job, job.attempt, &reason).await
        }
        Outcome::Retry(reason) => {
            let delay = offshoot_store::backoff(policy.backoff_base, policy.backoff_max, job.attempt);
            if time::now() + delay.as_nanos() as i64 > deadline {
                record::webhook_attempt(Attempt::Failed);
                tracing::warn!(delivery = %job.id, event = %job.event_type, url = %job.url, attempt = job.attempt, %reason, "webhook not delivered within the retry window; dead-lettered");
                return dead_letter(&shared, &job, job.attempt, &reason).await;
            }
            tracing::info!(delivery = %job.id, url = %job.url, attempt = job.attempt, retry_in_s = delay.as_secs(), %reason, "webhook attempt failed; retrying");
            record::webhook_attempt(Attempt::Retried);
            let next = DeliveryJob { attempt: job.attempt + 1, last_error: Some(reason), released: false, ..job };
            shared.pools.push_deliveries(vec![(next, ulid::Ulid::generate(), delay)]).await?;
            Ok(())
        }
    }
}

async fn post(shared: &Shared, job: &DeliveryJob) -> Outcome {
    let request = shared
        .http
        .post(&job.url)
        .header("Content-Type", "application/json")
        .header("X-Signature", sign(shared.api_secret.expose_secret(), job.body.as_bytes()))
        .header("X-Webhook-Id", &job.id)
        .header("X-Webhook-Attempt", job.attempt.to_string())
        .header("X-Api-Key", &*shared.api_key)
        .body(job.body.clone());
    match request.send().await {
        Ok(resp) => classify_status(resp.status()),
        Err(e) if e.is_timeout() => Outcome::Retry("timed out".into()),
        Err(e) if e.is_builder() => Outcome::Refused(format!("invalid webhook URL: {e}")),
        Err(e) => Outcome::Retry(format!("network error: {e}")),
    }
}

async fn dead_letter(shared: &Shared, job: &DeliveryJob, attempts: u32, reason: &str) -> Result<(), BoxDynError> {
    let record = DeadLetterRecord {
        letter: DeadLetter {
            id: job.id.clone(),
            url: job.url.clone(),
            event_type: job.event_type.clone(),
            event_seq: job.seq,
            attempts: attempts as i64,
            last_error: reason.to_string(),
            first_attempt_at: job.window_start,
            created_at: time::now(),
        },
        body: job.body.clone(),
    };
    shared.store.dead_letter(&record).await?;
    Ok(())
}

/// Queues dead letters again: a new retry window, the same `X-Webhook-Id`, the attempt count
/// going on; the dead letter is removed once its job is queued. Returns how many.
pub async fn replay(pools: &crate::queue::Pools, store: &Store, records: Vec<DeadLetterRecord>) -> Result<u64, QueueError> {
    let now = time::now();
    let mut n = 0;
    for chunk in records.chunks(200) {
        let jobs = chunk
            .iter()
            .map(|r| {
                let job = DeliveryJob {
                    id: r.letter.id.clone(),
                    url: r.letter.url.clone(),
                    event_type: r.letter.event_type.clone(),
                    seq: r.letter.event_seq,
                    body: r.body.clone(),
                    attempt: r.letter.attempts as u32 + 1,
                    window_start: now,
                    last_error: None,
                    released: false,
                };
                (job, ulid::Ulid::generate(), Duration::ZERO)
            })
            .collect();
        pools.push_deliveries(jobs).await?;
        let ids: Vec<String> = chunk.iter().map(|r| r.letter.id.clone()).collect();
        n += store.delete_dead_letters(&ids).await.map_err(|e| e.to_string())?;
    }
    Ok(n)
}

// ---------------------------------------------------------------------------------------------
// Catching up

/// Starts catching up with every endpoint that has deliveries waiting in the queue (left by an
/// earlier process, or by another worker process).
async fn resume_catch_up(shared: &Arc<Shared>) {
    match shared.pools.waiting_deliveries(None).await {
        Ok(waiting) => {
            let urls: HashSet<String> = waiting.into_iter().map(|w| w.url).collect();
            for url in urls {
                start_catch_up(shared, &url, false);
            }
        }
        Err(e) => tracing::warn!(error = %e, "reading the waiting webhook deliveries failed; they wait out their back-off"),
    }
}

/// Starts this process's catch-up task for `url`, unless it runs already: releasing its
/// waiting deliveries at once when it has just `answered`, else probing it first.
fn start_catch_up(shared: &Arc<Shared>, url: &str, answered: bool) {
    if !shared.circuits.catching_up.lock().expect("catching up").insert(url.to_string()) {
        return;
    }
    let (shared, url) = (Arc::clone(shared), url.to_string());
    tokio::spawn(async move {
        if let Err(e) = catch_up(&shared, &url, answered).await {
            tracing::warn!(%url, error = %e, "catching up with a webhook endpoint failed; its deliveries wait out their back-off");
        }
        shared.circuits.catching_up.lock().expect("catching up").remove(&url);
    });
}

/// How a catch-up's probe or release ended.
enum Step {
    /// The endpoint answers: release what waits (as read).
    Answers(Vec<WaitingDelivery>),
    /// A released delivery failed: probe again.
    FailsAgain,
    /// Nothing waits any more, or the process stops.
    Over,
}

/// Probes `url` until it answers, then releases its waiting deliveries; again while releases
/// meet failures; ends when nothing waits.
async fn catch_up(shared: &Arc<Shared>, url: &str, mut answered: bool) -> Result<(), QueueError> {
    loop {
        let step = match std::mem::take(&mut answered) {
            true => Step::Answers(shared.pools.waiting_deliveries(Some(url)).await?),
            false => probe(shared, url).await?,
        };
        let waiting = match step {
            Step::Answers(waiting) => waiting,
            Step::FailsAgain => continue,
            Step::Over => return Ok(()),
        };
        match release(shared, url, waiting).await? {
            Step::FailsAgain => {
                tracing::info!(%url, "a released webhook delivery failed; probing the endpoint again");
            }
            _ => return Ok(()),
        }
    }
}

/// Sleeps `d`, or less when the process stops (then false).
async fn pause(shared: &Shared, d: Duration) -> bool {
    tokio::select! {
        _ = shared.shutdown.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

/// Every probe interval, makes the oldest delivery waiting for `url` due at once, until such
/// a probe, or any other delivery to it from this process, succeeds.
async fn probe(shared: &Arc<Shared>, url: &str) -> Result<Step, QueueError> {
    let policy = &shared.webhooks;
    loop {
        let answered = shared.circuits.tally(url).ok;
        let wait = shared.circuits.answered.notified();
        tokio::select! {
            _ = shared.shutdown.cancelled() => return Ok(Step::Over),
            _ = wait => {}
            _ = tokio::time::sleep(policy.probe_interval) => {}
        }
        let waiting = shared.pools.waiting_deliveries(Some(url)).await?;
        if shared.circuits.tally(url).ok > answered {
            tracing::info!(%url, waiting = waiting.len(), "webhook endpoint answers again; releasing its waiting deliveries");
            return Ok(Step::Answers(waiting));
        }
        let Some(oldest) = waiting.first().cloned() else { return Ok(Step::Over) };
        let released = shared.pools.release_deliveries(std::slice::from_ref(&oldest.job_id)).await?;
        if released.is_empty() {
            continue;
        }
        tracing::debug!(%url, delivery = %oldest.delivery_id, "probing a failing webhook endpoint with its oldest waiting delivery");
        if !wait_ended(shared, &released).await? {
            return Ok(Step::Over);
        }
        // A failed probe waits again (its retry); one that is no longer waiting was answered.
        let waiting = shared.pools.waiting_deliveries(Some(url)).await?;
        if !waiting.iter().any(|w| w.delivery_id == oldest.delivery_id) {
            tracing::info!(%url, waiting = waiting.len(), "webhook endpoint answers again; releasing its waiting deliveries");
            return Ok(Step::Answers(waiting));
        }
    }
}

/// Waits until these released jobs have run (bounded: a job whose worker died is taken over
/// by another only after a while). False when the process stops.
async fn wait_ended(shared: &Shared, jobs: &[String]) -> Result<bool, QueueError> {
    let bound = tokio::time::Instant::now() + stall_bound(&shared.webhooks);
    let mut live = jobs.to_vec();
    while !live.is_empty() && tokio::time::Instant::now() < bound {
        if !pause(shared, POLL).await {
            return Ok(false);
        }
        live = shared.pools.live_deliveries(&live).await?;
    }
    Ok(true)
}

/// How often a catch-up looks whether its released deliveries have run.
const POLL: Duration = Duration::from_millis(25);

/// How long released deliveries may go without one ending before a catch-up stops counting
/// them as in flight.
fn stall_bound(policy: &WebhookPolicy) -> Duration {
    policy.attempt_timeout * 2 + Duration::from_secs(10)
}

/// Releases the deliveries waiting for `url`, oldest event first, at most
/// [`WebhookPolicy::release_concurrency`] in flight; reads again when they are through, for
/// deliveries that started waiting meanwhile. Each delivery is released once: when one is
/// waiting again, or an attempt at `url` failed in this process, the endpoint fails again.
async fn release(shared: &Arc<Shared>, url: &str, waiting: Vec<WaitingDelivery>) -> Result<Step, QueueError> {
    let policy = &shared.webhooks;
    let limit = policy.release_concurrency.max(1);
    let failures = shared.circuits.tally(url).failed;
    let mut next: VecDeque<WaitingDelivery> = waiting.into();
    let mut released: HashSet<String> = HashSet::new();
    let mut in_flight: Vec<String> = Vec::new();
    let mut progress = tokio::time::Instant::now();
    loop {
        if shared.circuits.tally(url).failed > failures {
            return Ok(Step::FailsAgain);
        }
        let mut batch = Vec::new();
        while in_flight.len() + batch.len() < limit {
            let Some(w) = next.pop_front() else { break };
            if released.insert(w.delivery_id) {
                batch.push(w.job_id);
            }
        }
        in_flight.extend(shared.pools.release_deliveries(&batch).await?);
        if in_flight.is_empty() {
            if !next.is_empty() {
                continue;
            }
            let again = shared.pools.waiting_deliveries(Some(url)).await?;
            if again.iter().any(|w| released.contains(&w.delivery_id)) {
                return Ok(Step::FailsAgain);
            }
            if again.is_empty() {
                tracing::info!(%url, released = released.len(), "webhook endpoint caught up");
                return Ok(Step::Over);
            }
            next = again.into();
            continue;
        }
        if !pause(shared, POLL).await {
            return Ok(Step::Over);
        }
        let live = shared.pools.live_deliveries(&in_flight).await?;
        if live.len() < in_flight.len() {
            progress = tokio::time::Instant::now();
        } else if progress.elapsed() > stall_bound(policy) {
            tracing::warn!(%url, stuck = live.len(), "released webhook deliveries have not run for a while; releasing the next");
            in_flight.clear();
            progress = tokio::time::Instant::now();
            continue;
        }
        in_flight = live;
    }
}

// ---------------------------------------------------------------------------------------------
// Circuits

enum Admit {
    Go,
    Wait(Duration),
}

#[derive(Debug, Default)]
struct Circuit {
    failures: u32,
    open_until: Option<Instant>,
    probing: bool,
}

/// Per-endpoint circuits of this process, the endpoints it is catching up with, and the
/// outcomes of attempts per endpoint (which a catch-up watches).
#[derive(Debug, Default)]
pub struct Circuits {
    circuits: Mutex<HashMap<String, Circuit>>,
    catching_up: Mutex<HashSet<String>>,
    tallies: Mutex<HashMap<String, Tally>>,
    /// Notified when an endpoint answers after failing.
    answered: tokio::sync::Notify,
}

/// Attempts at one endpoint in this process so far.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    ok: u64,
    failed: u64,
}

impl Circuits {
    fn admit(&self, url: &str, policy: &WebhookPolicy) -> Admit {
        let mut map = self.circuits.lock().expect("circuits");
        let Some(c) = map.get_mut(url) else { return Admit::Go };
        let Some(until) = c.open_until else { return Admit::Go };
        let now = Instant::now();
        if now < until {
            return Admit::Wait(jitter_up(until - now));
        }
        if c.probing {
            // Half-open: one probe at a time; the others look again shortly.
            return Admit::Wait(jitter_up(policy.backoff_base));
        }
        c.probing = true;
        Admit::Go
    }

    /// Records an attempt's outcome. True when the endpoint should be caught up with: its
    /// circuit has just opened, or it answers after failing.
    fn record(&self, url: &str, ok: bool, policy: &WebhookPolicy) -> bool {
        {
            let mut tallies = self.tallies.lock().expect("tallies");
            let tally = tallies.entry(url.to_string()).or_default();
            match ok {
                true => tally.ok += 1,
                false => tally.failed += 1,
            }
        }
        let mut map = self.circuits.lock().expect("circuits");
        if ok {
            let Some(c) = map.remove(url) else { return false };
            if c.open_until.is_some() {
                tracing::info!(%url, "webhook endpoint answers again; circuit closed");
            }
            self.answered.notify_waiters();
            return true;
        }
        let c = map.entry(url.to_string()).or_default();
        c.failures += 1;
        c.probing = false;
        if c.failures >= policy.circuit_threshold {
            let open_for = offshoot_store::backoff(policy.backoff_base, policy.backoff_max, c.failures - policy.circuit_threshold + 1);
            let opened = c.open_until.is_none();
            if opened {
                tracing::warn!(%url, failures = c.failures, "webhook endpoint keeps failing; circuit open");
            }
            c.open_until = Some(Instant::now() + open_for);
            return opened;
        }
        false
    }

    fn tally(&self, url: &str) -> Tally {
        self.tallies.lock().expect("tallies").get(url).copied().unwrap_or_default()
    }
}

/// `d` plus up to a quarter more, at least one second (apalis schedules in whole seconds).
fn jitter_up(d: Duration) -> Duration {
    offshoot_store::jittered(d, d / 4).max(Duration::from_secs(1))
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
    fn server_errors_and_throttling_are_retried_and_other_answers_refuse_the_event() {
        use reqwest::StatusCode;
        assert_eq!(classify_status(StatusCode::OK), Outcome::Delivered);
        assert_eq!(classify_status(StatusCode::NO_CONTENT), Outcome::Delivered);
        for s in [StatusCode::REQUEST_TIMEOUT, StatusCode::TOO_MANY_REQUESTS, StatusCode::INTERNAL_SERVER_ERROR, StatusCode::BAD_GATEWAY] {
            assert!(matches!(classify_status(s), Outcome::Retry(_)), "{s}");
        }
        for s in [StatusCode::BAD_REQUEST, StatusCode::NOT_FOUND, StatusCode::FOUND] {
            assert!(matches!(classify_status(s), Outcome::Refused(_)), "{s}");
        }
    }

    #[test]
    fn the_dialect_setting_picks_the_renderer() {
        let mut s = AppSettings::default();
        assert_eq!(webhook_dialect(&s), Dialect::Legacy);
        s.webhook_dialect = "v2".into();
        assert_eq!(webhook_dialect(&s), Dialect::V2);
    }

    #[test]
    fn a_delivery_id_depends_on_the_event_and_the_endpoint_only() {
        assert_eq!(delivery_id(7, "http://a/"), delivery_id(7, "http://a/"));
        assert_ne!(delivery_id(7, "http://a/"), delivery_id(8, "http://a/"));
        assert_ne!(delivery_id(7, "http://a/"), delivery_id(7, "http://b/"));
        assert_eq!(ulid_of(delivery_id(7, "http://a/")).0, delivery_id(7, "http://a/").as_u128());
    }

    #[test]
    fn a_circuit_opens_after_failures_in_a_row_lets_one_probe_through_and_closes_on_success() {
        let policy = WebhookPolicy { circuit_threshold: 3, backoff_base: Duration::from_millis(1), ..Default::default() };
        let c = Circuits::default();
        for _ in 0..2 {
            assert!(!c.record("http://x/", false, &policy), "below the threshold no catch-up starts");
            assert!(matches!(c.admit("http://x/", &policy), Admit::Go), "below the threshold every delivery goes");
        }
        assert!(c.record("http://x/", false, &policy), "the circuit opening calls for catching up");
        assert!(matches!(c.admit("http://y/", &policy), Admit::Go), "other endpoints are not held back");
        std::thread::sleep(Duration::from_millis(5));
        assert!(matches!(c.admit("http://x/", &policy), Admit::Go), "after the open period one probe goes");
        assert!(matches!(c.admit("http://x/", &policy), Admit::Wait(_)), "while it probes the others wait");
        assert!(c.record("http://x/", true, &policy), "a success after failures calls for catching up");
        assert!(matches!(c.admit("http://x/", &policy), Admit::Go), "a success closes the circuit");
        assert!(!c.record("http://x/", true, &policy), "a success after successes does not");
        assert_eq!((c.tally("http://x/").ok, c.tally("http://x/").failed), (2, 3));
    }
}
