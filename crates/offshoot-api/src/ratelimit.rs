//! Rate limits, as Stream counts them (README, "Rate limits"): per endpoint and per platform
//! of the app (`server_side`, `android`, `ios`, `web`), and for client-side tokens also per
//! user and endpoint, over one minute. Every answer of a limited route carries
//! `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (Unix seconds); a
//! request over a limit is answered 429 with Stream's envelope (code 9) and `Retry-After`.
//!
//! Each limit is a GCRA cell of `governor` (a bucket of `limit` requests refilled evenly over
//! the minute): `Remaining` is what is left of the bucket, `Reset` the second at which it is
//! full again, `Retry-After` the wait until the next request fits. Client-side tokens are
//! counted per user first (a refused request does not use the app's budget, so one flooding
//! user cannot starve the others), then per app and platform. Server-side tokens are the
//! operator's own backend: they are not limited unless the configuration says
//! `server_side=on`, because Stream's per-app table (1,000 sends a minute) is far below what
//! one agent backend sends to its own server (an agent streams 20 updates a second; the
//! capacity model in BENCHMARKS.md plans 1,000 messages a second), and a limit there would
//! only refuse the operator's own traffic. With it on they are counted per app, never per user.
//!
//! Every route's endpoint name comes from one table ([`ENDPOINTS`], keyed by method and
//! route template without its `/api/v2` prefix); a test holds every route of the router
//! against it, so a new route cannot go unlimited.
//!
//! Across processes (PostgreSQL), [`RateLimiter::share`] adds a window counter per key and
//! minute: each process counts locally and, every flush interval, adds its deltas to one row
//! per key and window and reads the global count back (one upsert per key per flush). A
//! process refuses once the global count it last read plus its own unflushed requests reach
//! the limit, so N processes admit at most N × (requests per process per flush interval)
//! beyond a limit (README, "Rate limits"). SQLite is one process: its local count is exact
//! and nothing is written to the database.

use crate::error::envelope;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::state::{InMemoryState, NotKeyed};
use governor::Quota;

type Direct = governor::RateLimiter<NotKeyed, InMemoryState, DefaultClock, StateInformationMiddleware>;
type Keyed<K> = governor::RateLimiter<K, DefaultKeyedStateStore<K>, DefaultClock, StateInformationMiddleware>;
use secrecy::{ExposeSecret, SecretString};
use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The one-minute window of every limit.
const WINDOW: Duration = Duration::from_secs(60);

/// Every route (method, template without `/api/v2/chat` or `/api/v2`) and its endpoint name.
pub const ENDPOINTS: &[(&str, &str, &str)] = &[
    ("POST", "/channels", "QueryChannels"),
    ("POST", "/channels/delete", "DeleteChannels"),
    ("POST", "/channels/{type}/query", "GetOrCreateChannel"),
    ("POST", "/channels/{type}/{id}/query", "GetOrCreateChannel"),
    ("GET", "/channels/{type}/{id}", "GetOrCreateChannel"),
    ("POST", "/channels/{type}/{id}", "UpdateChannel"),
    ("PATCH", "/channels/{type}/{id}", "UpdateChannelPartial"),
    ("DELETE", "/channels/{type}/{id}", "DeleteChannel"),
    ("POST", "/channels/{type}/{id}/message", "SendMessage"),
    ("POST", "/channels/{type}/{id}/truncate", "TruncateChannel"),
    ("POST", "/channels/{type}/{id}/rewind", "RewindChannel"),
    ("POST", "/channels/{type}/{id}/read", "MarkRead"),
    ("POST", "/channels/{type}/{id}/event", "SendEvent"),
    ("POST", "/channels/{type}/{id}/stop-watching", "StopWatchingChannel"),
    ("POST", "/channels/{type}/{id}/file", "UploadFile"),
    ("POST", "/channels/{type}/{id}/image", "UploadImage"),
    ("DELETE", "/channels/{type}/{id}/file", "DeleteFile"),
    ("DELETE", "/channels/{type}/{id}/image", "DeleteImage"),
    ("POST", "/channels/{type}/{id}/fork", "ForkChannel"),
    ("POST", "/channels/{type}/{id}/fork/message_ids", "GetForkMessageIds"),
    ("GET", "/channels/{type}/{id}/forks", "ListForks"),
    ("GET", "/channels/{type}/{id}/lineage", "GetLineage"),
    ("GET", "/search", "Search"),
    ("GET", "/messages/{id}", "GetMessage"),
    ("POST", "/messages/{id}", "UpdateMessage"),
    ("PUT", "/messages/{id}", "UpdateMessagePartial"),
    ("DELETE", "/messages/{id}", "DeleteMessage"),
    ("PATCH", "/messages/{id}/ephemeral", "EphemeralMessageUpdate"),
    ("GET", "/messages/{id}/replies", "GetReplies"),
    ("POST", "/messages/{id}/reaction", "SendReaction"),
    ("DELETE", "/messages/{id}/reaction/{type}", "DeleteReaction"),
    ("GET", "/messages/{id}/reactions", "GetReactions"),
    ("POST", "/threads", "QueryThreads"),
    ("GET", "/threads/{id}", "GetThread"),
    ("GET", "/channeltypes", "ListChannelTypes"),
    ("GET", "/channeltypes/{name}", "GetChannelType"),
    ("PUT", "/channeltypes/{name}", "UpdateChannelType"),
    ("POST", "/users", "UpdateUsers"),
    ("PATCH", "/users", "UpdateUsersPartial"),
    ("GET", "/users", "QueryUsers"),
    ("GET", "/app", "GetApp"),
    ("PATCH", "/app", "UpdateApp"),
    ("POST", "/guest", "CreateGuest"),
    ("GET", "/tasks/{id}", "GetTask"),
    ("GET", "/jobs", "GetJobs"),
    ("GET", "/webhooks/dead_letters", "ListDeadLetters"),
    ("POST", "/webhooks/dead_letters/replay", "ReplayDeadLetters"),
    ("POST", "/moderation/ban", "Ban"),
    ("DELETE", "/moderation/ban", "Unban"),
    ("GET", "/rate_limits", "GetRateLimits"),
    ("GET", "/connect", "Connect"),
];

/// Stream's default table (requests per minute per app and platform); the names Offshoot adds
/// (fork, rewind, tasks, operating) are sized like the Stream endpoints they resemble.
pub const DEFAULT_LIMITS: &[(&str, u32)] = &[
    ("Connect", 10_000),
    ("GetOrCreateChannel", 10_000),
    ("GetApp", 10_000),
    ("MarkRead", 10_000),
    ("QueryChannels", 10_000),
    ("SendEvent", 10_000),
    // An agent streams its answer as ephemeral updates, twenty a second: a broadcast, sized
    // like events.
    ("EphemeralMessageUpdate", 10_000),
    ("SendMessage", 1_000),
    ("GetMessage", 1_000),
    ("DeleteMessage", 1_000),
    ("UpdateMessage", 1_000),
    ("UpdateMessagePartial", 1_000),
    ("SendReaction", 1_000),
    ("DeleteReaction", 1_000),
    ("GetReactions", 1_000),
    ("GetReplies", 1_000),
    ("QueryUsers", 1_000),
    ("StopWatchingChannel", 1_000),
    ("UploadFile", 1_000),
    ("UploadImage", 1_000),
    ("CreateGuest", 1_000),
    ("QueryThreads", 1_000),
    ("GetThread", 1_000),
    ("GetForkMessageIds", 1_000),
    ("ListForks", 1_000),
    ("GetLineage", 1_000),
    ("GetTask", 1_000),
    ("RewindChannel", 1_000),
    ("Ban", 300),
    ("Unban", 300),
    ("UpdateUsers", 300),
    ("UpdateUsersPartial", 300),
    ("UpdateChannel", 300),
    ("UpdateChannelPartial", 300),
    ("Search", 300),
    ("QueryMembers", 300),
    ("HideChannel", 300),
    ("ShowChannel", 300),
    ("ForkChannel", 300),
    ("GetJobs", 300),
    ("GetRateLimits", 300),
    ("DeleteChannel", 60),
    ("DeleteChannels", 60),
    ("TruncateChannel", 60),
    ("UpdateApp", 60),
    ("GetChannelType", 60),
    ("ListChannelTypes", 60),
    ("CreateChannelType", 60),
    ("UpdateChannelType", 60),
    ("DeleteChannelType", 60),
    ("DeleteFile", 60),
    ("DeleteImage", 60),
    ("ListDeadLetters", 60),
    ("ReplayDeadLetters", 60),
];

/// Requests per minute per user and endpoint of client-side tokens, by default.
pub const DEFAULT_USER_LIMIT: u32 = 60;

/// The endpoint name of a route: `method` and its matched template, with or without the
/// `/api/v2/chat` or `/api/v2` prefix.
pub fn endpoint_of(method: &Method, template: &str) -> Option<&'static str> {
    let path = template.strip_prefix("/api/v2/chat").or_else(|| template.strip_prefix("/api/v2")).unwrap_or(template);
    ENDPOINTS.iter().find(|(m, p, _)| *m == method.as_str() && *p == path).map(|(_, _, name)| *name)
}

/// Where the limits come from: Stream's table, overridden per endpoint, or off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitConfig {
    /// `false`: nothing is counted and no header is added (`OFFSHOOT_RATE_LIMITS=off`).
    pub enabled: bool,
    /// Requests per minute per app and platform, by endpoint name.
    pub endpoints: BTreeMap<String, u32>,
    /// Requests per minute per user and endpoint (client-side tokens).
    pub user: u32,
    /// Whether server-side tokens are limited (per app, by the same table); off by default.
    pub server_side: bool,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            enabled: true,
            endpoints: DEFAULT_LIMITS.iter().map(|(n, l)| (n.to_string(), *l)).collect(),
            user: DEFAULT_USER_LIMIT,
            server_side: false,
        }
    }
}

impl RateLimitConfig {
    /// No limits at all.
    pub fn off() -> Self {
        RateLimitConfig { enabled: false, ..Self::default() }
    }

    /// Stream's table with `spec` applied: `off`, or comma-separated `Name=n` (an endpoint),
    /// `user=n` (per user and endpoint), `*=n` (every endpoint) and `server_side=on|off`
    /// (whether server-side tokens are limited too), applied left to right.
    pub fn parse(spec: &str) -> Result<RateLimitConfig, String> {
        let spec = spec.trim();
        if spec.eq_ignore_ascii_case("off") {
            return Ok(Self::off());
        }
        let mut c = Self::default();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty() && !p.eq_ignore_ascii_case("default")) {
            let (name, n) = part.split_once('=').ok_or_else(|| format!("{part:?} is not Name=number"))?;
            let (name, n) = (name.trim(), n.trim());
            if name == "server_side" {
                c.server_side = match n.to_ascii_lowercase().as_str() {
                    "on" | "true" | "1" => true,
                    "off" | "false" | "0" => false,
                    _ => return Err(format!("server_side: {n:?} is not on or off")),
                };
                continue;
            }
            let n: u32 = n.parse().ok().filter(|n| *n > 0).ok_or_else(|| format!("{name}: {n:?} is not a positive whole number"))?;
            match name {
                "user" => c.user = n,
                "*" => c.endpoints.values_mut().for_each(|v| *v = n),
                _ => match c.endpoints.get_mut(name) {
                    Some(v) => *v = n,
                    None => {
                        let known: Vec<&str> = c.endpoints.keys().map(String::as_str).collect();
                        return Err(format!("unknown endpoint {name:?}; known: user, *, server_side, {}", known.join(", ")));
                    }
                },
            }
        }
        Ok(c)
    }
}

/// The platforms Stream counts apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    ServerSide,
    Android,
    Ios,
    Web,
}

impl Platform {
    pub const ALL: [Platform; 4] = [Platform::ServerSide, Platform::Android, Platform::Ios, Platform::Web];

    pub fn name(self) -> &'static str {
        match self {
            Platform::ServerSide => "server_side",
            Platform::Android => "android",
            Platform::Ios => "ios",
            Platform::Web => "web",
        }
    }

    /// A client's platform from `X-Stream-Client` (the SDKs send e.g.
    /// `stream-chat-android-…`, `stream-chat-swift-…`, `stream-chat-react-native-ios-…`,
    /// `stream-chat-js-…`), else the user agent; matched by whole words, so that `axios/1.7`
    /// is not iOS.
    pub fn of_client(headers: &HeaderMap) -> Platform {
        let text = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_ascii_lowercase();
        for s in [text("x-stream-client"), text("user-agent")] {
            let words: Vec<&str> = s.split(|c: char| !c.is_ascii_alphanumeric()).collect();
            if words.contains(&"android") {
                return Platform::Android;
            }
            if words.iter().any(|w| matches!(*w, "ios" | "swift" | "iphone" | "ipad")) {
                return Platform::Ios;
            }
        }
        Platform::Web
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Who is calling, as far as the limits care. The handler authenticates again in full; a
/// token that does not verify here is refused there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Server,
    User(String),
    /// No token (`stream-auth-type: anonymous`): counted per app and platform only.
    Anonymous,
    /// A token that does not verify: counted under one shared key with the per-user limit, so
    /// a flood of bad tokens uses none of the app's budget.
    Invalid,
}

impl Caller {
    fn of(headers: &HeaderMap, query: Option<&str>, secret: &str) -> Caller {
        let from_query =
            || query.and_then(|q| form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == "authorization").map(|(_, v)| v.into_owned()));
        let token = headers.get("authorization").and_then(|v| v.to_str().ok()).map(str::to_string).or_else(from_query);
        let Some(token) = token.map(|t| t.trim().trim_start_matches("Bearer ").to_string()).filter(|t| !t.is_empty()) else {
            return Caller::Anonymous;
        };
        match offshoot_core::token::verify(&token, secret, offshoot_core::time::now() / 1_000_000_000) {
            Ok(claims) => match claims.user_id {
                Some(id) => Caller::User(id),
                None => Caller::Server,
            },
            Err(_) => Caller::Invalid,
        }
    }
}

/// One limit's verdict.
#[derive(Debug, Clone, Copy)]
pub struct Verdict {
    pub allowed: bool,
    pub limit: u32,
    pub remaining: u32,
    /// Unix seconds at which the bucket is full again.
    pub reset: i64,
    /// Until the next request fits (refusals only).
    pub retry_after: Duration,
}

fn unix_secs() -> i64 {
    offshoot_core::time::now() / 1_000_000_000
}

fn quota(limit: u32) -> Quota {
    let n = NonZeroU32::new(limit.max(1)).expect("at least 1");
    Quota::with_period(WINDOW / n.get()).expect("a positive period").allow_burst(n)
}

/// Time to refill `used` cells of a bucket of `limit` per minute.
fn refill(limit: u32, used: u32) -> Duration {
    WINDOW.mul_f64(f64::from(used) / f64::from(limit.max(1)))
}

/// One app-level cell and what it last said (for `GET /rate_limits`, which must not spend).
struct AppCell {
    limiter: Direct,
    /// `remaining << 32 | milliseconds since the limiter started`, at the last check.
    last: AtomicU64,
}

/// The limits of one process; shared between the API router and the WebSocket upgrade.
pub struct RateLimiter {
    config: RateLimitConfig,
    secret: Option<SecretString>,
    /// By endpoint name: (limit, one cell per platform).
    app: HashMap<&'static str, (u32, [AppCell; 4])>,
    user: Keyed<(&'static str, String)>,
    clock: DefaultClock,
    started: Instant,
    shared: Option<Arc<crate::ratelimit_shared::Windows>>,
    /// `SendEvent` per WebSocket connection (`?connection_id=`), the REST side of the
    /// connection's client event cap.
    connection_events: Option<(u32, Keyed<String>)>,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter").field("config", &self.config).finish_non_exhaustive()
    }
}

impl RateLimiter {
    /// Limits checked against tokens signed with `secret`.
    pub fn new(config: RateLimitConfig, secret: SecretString) -> RateLimiter {
        let mut app = HashMap::new();
        for (name, _) in DEFAULT_LIMITS {
            let limit = config.endpoints.get(*name).copied().unwrap_or(1);
            let cell = || AppCell {
                limiter: governor::RateLimiter::direct(quota(limit)).with_middleware::<StateInformationMiddleware>(),
                last: AtomicU64::new(u64::from(limit) << 32),
            };
            app.insert(*name, (limit, [cell(), cell(), cell(), cell()]));
        }
        RateLimiter {
            user: governor::RateLimiter::keyed(quota(config.user)).with_middleware::<StateInformationMiddleware>(),
            config,
            secret: Some(secret),
            app,
            clock: DefaultClock::default(),
            started: Instant::now(),
            shared: None,
            connection_events: None,
        }
    }

    /// Also limits `SendEvent` requests naming a WebSocket connection (`?connection_id=`) to
    /// `per_minute` per connection, as its socket is limited.
    pub fn with_connection_events(mut self, per_minute: u32) -> RateLimiter {
        self.connection_events =
            Some((per_minute, governor::RateLimiter::keyed(quota(per_minute)).with_middleware::<StateInformationMiddleware>()));
        self
    }

    /// Counts one `SendEvent` of `connection`: `Some(verdict)` when it is refused.
    fn check_connection_event(&self, connection: &str) -> Option<Verdict> {
        let (limit, limiter) = self.connection_events.as_ref()?;
        let not_until = limiter.check_key(&connection.to_string()).err()?;
        let wait = not_until.wait_time_from(self.clock.now());
        Some(Verdict { allowed: false, limit: *limit, remaining: 0, reset: unix_secs() + wait.as_secs() as i64 + 1, retry_after: wait })
    }

    /// No limits.
    pub fn off() -> RateLimiter {
        RateLimiter {
            app: HashMap::new(),
            user: governor::RateLimiter::keyed(quota(1)).with_middleware::<StateInformationMiddleware>(),
            config: RateLimitConfig::off(),
            secret: None,
            clock: DefaultClock::default(),
            started: Instant::now(),
            shared: None,
            connection_events: None,
        }
    }

    pub fn config(&self) -> &RateLimitConfig {
        &self.config
    }

    pub fn enabled(&self) -> bool {
        self.config.enabled
    }

    /// Counts app-level requests across processes too (PostgreSQL): see the module doc.
    pub fn share(mut self, windows: Arc<crate::ratelimit_shared::Windows>) -> RateLimiter {
        self.shared = Some(windows);
        self
    }

    fn check_cell(&self, name: &'static str, limit: u32, cell: &AppCell, platform: Platform) -> Verdict {
        let now_unix = unix_secs();
        let mut v = match cell.limiter.check() {
            Ok(snap) => {
                let remaining = snap.remaining_burst_capacity();
                Verdict {
                    allowed: true,
                    limit,
                    remaining,
                    reset: now_unix + refill(limit, limit - remaining.min(limit)).as_secs_f64().ceil() as i64,
                    retry_after: Duration::ZERO,
                }
            }
            Err(not_until) => {
                let wait = not_until.wait_time_from(self.clock.now());
                Verdict { allowed: false, limit, remaining: 0, reset: now_unix + refill(limit, limit).as_secs() as i64, retry_after: wait }
            }
        };
        if let Some(shared) = &self.shared {
            if v.allowed {
                let key = format!("{name}:{}", platform.name());
                match shared.admit(&key, limit) {
                    Ok(left) => v.remaining = v.remaining.min(left),
                    Err(wait) => {
                        v = Verdict { allowed: false, limit, remaining: 0, reset: now_unix + wait.as_secs() as i64, retry_after: wait };
                    }
                }
            }
        }
        let ms = self.started.elapsed().as_millis() as u64 & 0xFFFF_FFFF;
        cell.last.store((u64::from(v.remaining) << 32) | ms, Ordering::Relaxed);
        v
    }

    /// Counts one request of `caller` on `platform` to `endpoint`; `None` when limits are off
    /// or the endpoint has none.
    pub fn check(&self, endpoint: &'static str, platform: Platform, caller: &Caller) -> Option<Verdict> {
        if !self.config.enabled || (*caller == Caller::Server && !self.config.server_side) {
            return None;
        }
        let (limit, cells) = self.app.get(endpoint)?;
        let user_key = match caller {
            Caller::User(id) => Some(id.as_str()),
            Caller::Invalid => Some("\u{0}invalid"),
            Caller::Server | Caller::Anonymous => None,
        };
        let mut user_verdict = None;
        if let Some(id) = user_key {
            let key = (endpoint, id.to_string());
            let v = match self.user.check_key(&key) {
                Ok(snap) => {
                    let remaining = snap.remaining_burst_capacity();
                    let limit = self.config.user;
                    Verdict {
                        allowed: true,
                        limit,
                        remaining,
                        reset: unix_secs() + refill(limit, limit - remaining.min(limit)).as_secs_f64().ceil() as i64,
                        retry_after: Duration::ZERO,
                    }
                }
                Err(not_until) => {
                    let wait = not_until.wait_time_from(self.clock.now());
                    let limit = self.config.user;
                    Verdict {
                        allowed: false,
                        limit,
                        remaining: 0,
                        reset: unix_secs() + refill(limit, limit).as_secs() as i64,
                        retry_after: wait,
                    }
                }
            };
            if !v.allowed || matches!(caller, Caller::Invalid) {
                return Some(v);
            }
            user_verdict = Some(v);
        }
        let app = self.check_cell(endpoint, *limit, &cells[platform.index()], platform);
        // The headers tell the limit closest to refusing.
        Some(match user_verdict {
            Some(u) if app.allowed && u.remaining < app.remaining => u,
            _ => app,
        })
    }

    /// The app-level limit of `endpoint` on `platform` and what remains of it now, without
    /// spending anything: (limit, remaining, reset).
    pub fn peek(&self, endpoint: &str, platform: Platform) -> Option<(u32, u32, i64)> {
        let (limit, cells) = self.app.get(endpoint)?;
        let last = cells[platform.index()].last.load(Ordering::Relaxed);
        let (remaining_then, at_ms) = ((last >> 32) as u32, last & 0xFFFF_FFFF);
        let now_ms = self.started.elapsed().as_millis() as u64 & 0xFFFF_FFFF;
        let elapsed = Duration::from_millis(now_ms.wrapping_sub(at_ms) & 0xFFFF_FFFF);
        let refilled = (elapsed.as_secs_f64() / refill(*limit, 1).as_secs_f64()).floor();
        let remaining = (f64::from(remaining_then) + refilled).min(f64::from(*limit)) as u32;
        let mut remaining = remaining;
        if let Some(shared) = &self.shared {
            remaining = remaining.min(shared.remaining(&format!("{endpoint}:{}", platform.name()), *limit));
        }
        let reset = unix_secs() + refill(*limit, limit - remaining).as_secs_f64().ceil() as i64;
        Some((*limit, remaining, reset))
    }

    /// Every endpoint name with a limit.
    pub fn endpoint_names(&self) -> Vec<&'static str> {
        let mut v: Vec<&'static str> = self.app.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Forgets per-user cells that are full again (bounded memory).
    pub fn forget_idle(&self) {
        self.user.retain_recent();
        self.user.shrink_to_fit();
        if let Some((_, l)) = &self.connection_events {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }

    fn secret(&self) -> &str {
        self.secret.as_ref().map(|s| s.expose_secret()).unwrap_or("")
    }
}

pub(crate) const LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
pub(crate) const REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
pub(crate) const RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

fn stamp_headers(headers: &mut HeaderMap, v: &Verdict) {
    headers.insert(LIMIT, HeaderValue::from(v.limit));
    headers.insert(REMAINING, HeaderValue::from(v.remaining));
    headers.insert(RESET, HeaderValue::from(v.reset));
}

/// The answer to a request over a limit: 429, Stream's envelope with code 9, `Retry-After`.
pub fn too_many(endpoint: &str, v: &Verdict) -> Response {
    let retry = v.retry_after.as_secs_f64().ceil().max(1.0) as u64;
    let mut fields = BTreeMap::new();
    fields.insert("endpoint".to_string(), endpoint.to_string());
    let mut response = envelope(
        StatusCode::TOO_MANY_REQUESTS,
        9,
        &format!("Too many requests, check response headers for rate limit info: {endpoint} allows {} per minute", v.limit),
        &fields,
    );
    stamp_headers(response.headers_mut(), v);
    response.headers_mut().insert(axum::http::header::RETRY_AFTER, HeaderValue::from(retry));
    response
}

/// The middleware: counts the request under its route's endpoint name, refuses it over a
/// limit, and stamps the headers on the answer. Mounted as a route layer, so the route
/// template is known.
pub async fn limit(State(limiter): State<Arc<RateLimiter>>, req: Request, next: Next) -> Response {
    if !limiter.enabled() {
        return next.run(req).await;
    }
    let Some(endpoint) = req.extensions().get::<MatchedPath>().and_then(|p| endpoint_of(req.method(), p.as_str())) else {
        return next.run(req).await;
    };
    let caller = Caller::of(req.headers(), req.uri().query(), limiter.secret());
    let platform = if caller == Caller::Server { Platform::ServerSide } else { Platform::of_client(req.headers()) };
    // A WebSocket connection's events over REST count against its own cap first.
    let connection = (endpoint == "SendEvent")
        .then(|| req.uri().query())
        .flatten()
        .and_then(|q| form_urlencoded::parse(q.as_bytes()).find(|(k, _)| k == "connection_id").map(|(_, v)| v.into_owned()));
    if let Some(refused) = connection.and_then(|c| limiter.check_connection_event(&c)) {
        metrics::counter!("offshoot_rate_limited_total", "endpoint" => endpoint, "platform" => platform.name()).increment(1);
        return too_many(endpoint, &refused);
    }
    let Some(verdict) = limiter.check(endpoint, platform, &caller) else {
        return next.run(req).await;
    };
    if !verdict.allowed {
        metrics::counter!("offshoot_rate_limited_total", "endpoint" => endpoint, "platform" => platform.name()).increment(1);
        return too_many(endpoint, &verdict);
    }
    let mut response = next.run(req).await;
    stamp_headers(response.headers_mut(), &verdict);
    response
}

/// The query of `GET /rate_limits`.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct RateLimitsQuery {
    server_side: Option<bool>,
    android: Option<bool>,
    ios: Option<bool>,
    web: Option<bool>,
    endpoints: Option<String>,
}

/// `GET /rate_limits` (server-side): each platform asked for (all when none is), with
/// `{limit, remaining, reset}` per endpoint asked for (all when `endpoints` is absent).
/// Reading spends nothing but this request's own count.
pub(crate) async fn get_rate_limits(
    State(st): State<crate::ApiState>,
    ctx: crate::ctx::Ctx,
    crate::ctx::ApiQuery(q): crate::ctx::ApiQuery<RateLimitsQuery>,
) -> crate::error::ApiResult<axum::Json<serde_json::Value>> {
    use serde_json::{json, Map, Value};
    if !matches!(ctx.viewer, offshoot_core::model::Viewer::Server) {
        return Err(offshoot_core::Error::not_allowed("the rate limits are read server-side").into());
    }
    let limiter = &st.rate_limits;
    let names: Vec<String> = match &q.endpoints {
        Some(list) => {
            let names: Vec<String> = list.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_string).collect();
            if let Some(bad) = names.iter().find(|n| !limiter.config().endpoints.contains_key(n.as_str())) {
                return Err(offshoot_core::Error::input(format!("endpoints: {bad:?} is not an endpoint name"))
                    .field("field", "endpoints")
                    .into());
            }
            names
        }
        None => limiter.config().endpoints.keys().cloned().collect(),
    };
    let asked = [(Platform::ServerSide, q.server_side), (Platform::Android, q.android), (Platform::Ios, q.ios), (Platform::Web, q.web)];
    let any = asked.iter().any(|(_, a)| *a == Some(true));
    let mut out = Map::new();
    for (platform, flag) in asked {
        if any && flag != Some(true) {
            continue;
        }
        let mut per = Map::new();
        if limiter.enabled() {
            for name in &names {
                if let Some((limit, remaining, reset)) = limiter.peek(name, platform) {
                    per.insert(name.clone(), json!({"limit": limit, "remaining": remaining, "reset": reset}));
                }
            }
        }
        out.insert(platform.name().to_string(), Value::Object(per));
    }
    Ok(ctx.ok(Value::Object(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_of_the_router_has_an_endpoint_name_with_a_limit() {
        let limits = RateLimitConfig::default();
        for (method, path) in crate::api_operations() {
            let name =
                endpoint_of(&method, &path).unwrap_or_else(|| panic!("{method} {path} has no endpoint name in ratelimit::ENDPOINTS"));
            assert!(limits.endpoints.contains_key(name), "{name} ({method} {path}) has no default limit");
        }
        for (_, _, name) in ENDPOINTS {
            assert!(limits.endpoints.contains_key(*name), "{name} has no default limit");
        }
    }

    #[test]
    fn the_table_is_streams_and_each_number_can_be_overridden() {
        let c = RateLimitConfig::default();
        assert_eq!(c.endpoints["SendMessage"], 1_000);
        assert_eq!(c.endpoints["Connect"], 10_000);
        assert_eq!(c.endpoints["UpdateChannel"], 300);
        assert_eq!(c.endpoints["TruncateChannel"], 60);
        assert_eq!(c.user, 60);
        let c = RateLimitConfig::parse("SendMessage=2000, user=120").unwrap();
        assert_eq!((c.endpoints["SendMessage"], c.user, c.endpoints["Connect"]), (2000, 120, 10_000));
        let c = RateLimitConfig::parse("*=5,GetApp=7").unwrap();
        assert!(c.endpoints.iter().all(|(n, l)| *l == if n == "GetApp" { 7 } else { 5 }));
        assert!(!RateLimitConfig::parse("off").unwrap().enabled);
        assert!(RateLimitConfig::parse("SendMesage=5").unwrap_err().contains("unknown endpoint"));
        assert!(RateLimitConfig::parse("SendMessage=0").is_err());
        assert!(RateLimitConfig::parse("SendMessage").is_err());
        assert!(!RateLimitConfig::default().server_side, "server-side tokens are not limited by default");
        assert!(RateLimitConfig::parse("server_side=on").unwrap().server_side);
        assert!(RateLimitConfig::parse("server_side=maybe").is_err());
    }

    #[test]
    fn server_side_tokens_are_not_limited_unless_the_configuration_says_so() {
        let l = RateLimiter::new(RateLimitConfig::parse("SendMessage=2").unwrap(), SecretString::from("s"));
        for _ in 0..10 {
            assert!(l.check("SendMessage", Platform::ServerSide, &Caller::Server).is_none(), "no limit, no headers");
        }
        assert!(l.check("SendMessage", Platform::Web, &Caller::User("amy".into())).unwrap().allowed);
        assert!(l.check("SendMessage", Platform::Web, &Caller::User("ben".into())).unwrap().allowed);
        assert!(!l.check("SendMessage", Platform::Web, &Caller::User("cid".into())).unwrap().allowed, "client-side keeps the app's table");
    }

    #[test]
    fn a_user_over_its_limit_is_refused_without_using_the_apps_budget() {
        let l = RateLimiter::new(RateLimitConfig::parse("SendMessage=10,user=3,server_side=on").unwrap(), SecretString::from("s"));
        let alice = Caller::User("alice".into());
        for left in [2, 1, 0] {
            let v = l.check("SendMessage", Platform::Web, &alice).unwrap();
            assert!(v.allowed);
            assert_eq!((v.limit, v.remaining), (3, left));
        }
        for _ in 0..5 {
            let v = l.check("SendMessage", Platform::Web, &alice).unwrap();
            assert!(!v.allowed && v.retry_after > Duration::ZERO);
        }
        assert_eq!(l.peek("SendMessage", Platform::Web).unwrap().1, 7, "the refusals spent nothing of the app's 10");
        let bob = l.check("SendMessage", Platform::Web, &Caller::User("bob".into())).unwrap();
        assert!(bob.allowed, "another user is not refused");
        for _ in 0..10 {
            assert!(l.check("SendMessage", Platform::ServerSide, &Caller::Server).unwrap().allowed, "server-side has its own budget");
        }
        assert!(!l.check("SendMessage", Platform::ServerSide, &Caller::Server).unwrap().allowed);
    }

    #[test]
    fn the_platform_comes_from_the_client_header_or_the_user_agent() {
        let h = |k: &'static str, v: &'static str| {
            let mut m = HeaderMap::new();
            m.insert(k, HeaderValue::from_static(v));
            m
        };
        assert_eq!(Platform::of_client(&h("x-stream-client", "stream-chat-android-6.0")), Platform::Android);
        assert_eq!(Platform::of_client(&h("x-stream-client", "stream-chat-swift-client-v4")), Platform::Ios);
        assert_eq!(Platform::of_client(&h("x-stream-client", "stream-chat-javascript-client-node-9.0")), Platform::Web);
        assert_eq!(Platform::of_client(&h("user-agent", "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0)")), Platform::Ios);
        assert_eq!(Platform::of_client(&h("x-stream-client", "stream-chat-react-native-ios-v6")), Platform::Ios);
        assert_eq!(Platform::of_client(&h("user-agent", "axios/1.7.9")), Platform::Web, "axios is not iOS");
        assert_eq!(Platform::of_client(&HeaderMap::new()), Platform::Web);
    }
}
