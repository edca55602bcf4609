//! The HTTP API: Stream's chat REST surface in both wire dialects (legacy paths render RFC 3339
//! and flat custom fields; `/api/v2` paths render nanoseconds and nested `custom`), auth, the
//! error envelope, the fork endpoints and uploads (`files.rs`). It also serves the web
//! console's static files at `/console` (`console.rs`; README, "Console"), which read only
//! this API.
//!
//! Handlers parse input into domain types, check permissions (offshoot-core) and call the
//! store. Depends on offshoot-core, offshoot-store and offshoot-files (upload storage, signed
//! links); must not depend on offshoot-ws or offshoot-worker (the WebSocket registry arrives as
//! a `Watchers` trait object).
//!
//! Handlers look alike on purpose: each names its extractors (state, caller, path, query or
//! body type) and then loads, checks and calls the store in a few lines. The `duplicates` tool
//! lists those signatures as repeated shape; the shared steps themselves are one function each
//! (`ctx.rs` authentication, `channels::load`, `require_read`/`require_manage`, `actor`).

mod app;
mod channels;
mod console;
mod ctx;
mod error;
mod files;
mod fork;
mod input;
mod jobs;
mod messages;
mod openapi;
pub mod ops;
pub mod ratelimit;
pub mod ratelimit_shared;
mod search;
mod state;

pub use error::ApiError;
pub use files::DEFAULT_MAX_UPLOAD;

use axum::extract::{DefaultBodyLimit, Request};
use axum::handler::Handler;
use axum::http::{header, HeaderName, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use offshoot_core::render::Dialect;
use offshoot_store::Store;
use openapi::{Doc, Routes};
use std::time::Instant;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{Any, CorsLayer};

pub use state::{ApiState, Shared};

/// Request body limit; bigger bodies get Stream's 413 (code 22).
pub const MAX_BODY: usize = 2 * 1024 * 1024;

tokio::task_local! {
    /// When the current request started, for `duration`.
    pub(crate) static STARTED: Instant;
}

pub(crate) fn duration() -> String {
    let ms = STARTED.try_with(|s| s.elapsed().as_secs_f64() * 1000.0).unwrap_or(0.0);
    format!("{ms:.2}ms")
}

/// Routes of chat resources: mounted at `/` (legacy) and `/api/v2/chat` (v2).
fn chat_routes() -> Routes<ApiState> {
    use openapi::{ForkLineage, ForkLookupRequest, ForkLookupResponse, ForkRequest, ForkResponse, ForkTree};
    use utoipa::openapi::schema::Type;
    let ch = |s| Doc::new("channels", s);
    let msg = |s| Doc::new("messages", s);
    let fork = |s| Doc::new("fork", s);
    Routes::new()
        .op(Method::POST, "/channels", channels::query_channels, ch("Query channels").body())
        .op(Method::POST, "/channels/delete", channels::delete_channels, ch("Delete channels").body())
        .op(
            Method::POST,
            "/channels/{type}/query",
            channels::query_distinct_channel,
            ch("Get or create a distinct channel (by members)").body(),
        )
        .op(Method::POST, "/channels/{type}/{id}/query", channels::query_channel, ch("Get or create a channel, optionally watch it").body())
        .op(Method::POST, "/channels/{type}/{id}", channels::update_channel, ch("Update a channel").body())
        .op(Method::PATCH, "/channels/{type}/{id}", channels::partial_update_channel, ch("Partially update a channel (set/unset)").body())
        .op(
            Method::DELETE,
            "/channels/{type}/{id}",
            channels::delete_channel,
            ch("Delete a channel").query("hard_delete", Type::Boolean, "Delete for good"),
        )
        .op(Method::GET, "/channels/{type}/{id}", channels::get_channel, ch("Get a channel"))
        .op(Method::POST, "/channels/{type}/{id}/message", messages::send_message, msg("Send a message").body())
        .op(Method::POST, "/channels/{type}/{id}/truncate", channels::truncate_channel, ch("Truncate a channel").body())
        .op(Method::POST, "/channels/{type}/{id}/rewind", channels::rewind_channel, ch("Rewind an agent channel to a message").body())
        .op(Method::POST, "/channels/{type}/{id}/read", channels::mark_read, ch("Mark a channel read").body())
        .op(Method::POST, "/channels/{type}/{id}/event", channels::send_event, ch("Send an event (typing, AI state, custom)").body())
        .op(Method::POST, "/channels/{type}/{id}/stop-watching", channels::stop_watching, ch("Stop watching a channel").body())
        .op(
            Method::POST,
            "/channels/{type}/{id}/fork",
            fork::fork_channel,
            fork("Fork an agent channel at a message").body_of::<ForkRequest>().ok_of::<ForkResponse>(),
        )
        .op(
            Method::POST,
            "/channels/{type}/{id}/fork/message_ids",
            fork::lookup_fork_message_ids,
            fork("Look up the copy ids of source messages in a fork").body_of::<ForkLookupRequest>().ok_of::<ForkLookupResponse>(),
        )
        .op(
            Method::GET,
            "/channels/{type}/{id}/forks",
            fork::list_forks,
            fork("The lineage of a channel: its forks and its own source")
                .ok_of::<ForkLineage>()
                .query("limit", Type::Integer, "1..100, default 25")
                .query("offset", Type::Integer, "default 0"),
        )
        .op(
            Method::GET,
            "/channels/{type}/{id}/lineage",
            fork::get_lineage,
            fork("The whole fork tree of a channel, root first").ok_of::<ForkTree>().query(
                "max_nodes",
                Type::Integer,
                "1..5000, default 1000",
            ),
        )
        .op(Method::GET, "/messages/{id}", messages::get_message, msg("Get a message"))
        .op(Method::POST, "/messages/{id}", messages::update_message, msg("Update a message").body())
        .op(Method::PUT, "/messages/{id}", messages::partial_update_message, msg("Partially update a message (set/unset)").body())
        .op(
            Method::DELETE,
            "/messages/{id}",
            messages::delete_message,
            msg("Delete a message").query("hard", Type::Boolean, "Delete for good"),
        )
        .op(Method::PATCH, "/messages/{id}/ephemeral", messages::ephemeral_update, msg("Broadcast an ephemeral message update").body())
        .op(Method::GET, "/messages/{id}/replies", messages::get_replies, msg("Replies of a message"))
        .op(Method::POST, "/messages/{id}/reaction", messages::send_reaction, msg("Send a reaction").body())
        .op(
            Method::DELETE,
            "/messages/{id}/reaction/{type}",
            messages::delete_reaction,
            msg("Delete a reaction").query("user_id", Type::String, "Server-side: whose reaction"),
        )
        .op(Method::GET, "/messages/{id}/reactions", messages::get_reactions, msg("Reactions of a message"))
        .op(Method::POST, "/threads", messages::query_threads, msg("Query threads").body())
        .op(Method::GET, "/threads/{id}", messages::get_thread, msg("Get a thread"))
        .op(
            Method::GET,
            "/search",
            search::search_messages,
            msg("Search messages across channels (full text, message filters, dedupe_copies)").query(
                "payload",
                Type::String,
                "JSON: filter_conditions (required), query or message_filter_conditions, sort, limit, offset or next, dedupe_copies",
            ),
        )
        .op(
            Method::POST,
            "/channels/{type}/{id}/file",
            files::upload_file.layer(DefaultBodyLimit::disable()),
            ch("Upload a file (multipart: file, user)").multipart(),
        )
        .op(
            Method::POST,
            "/channels/{type}/{id}/image",
            files::upload_image.layer(DefaultBodyLimit::disable()),
            ch("Upload an image (multipart: file, user)").multipart(),
        )
        .op(
            Method::DELETE,
            "/channels/{type}/{id}/file",
            files::delete_file,
            ch("Delete an uploaded file").query("url", Type::String, "The file's URL"),
        )
        .op(
            Method::DELETE,
            "/channels/{type}/{id}/image",
            files::delete_image,
            ch("Delete an uploaded image").query("url", Type::String, "The image's URL"),
        )
        .op(Method::GET, "/channeltypes", app::list_channel_types, Doc::new("app", "List channel types"))
        .op(Method::GET, "/channeltypes/{name}", app::get_channel_type, Doc::new("app", "Get a channel type"))
        .op(Method::PUT, "/channeltypes/{name}", app::put_channel_type, Doc::new("app", "Create or update a channel type").body())
}

/// Routes outside chat: mounted at `/` and `/api/v2`.
fn general_routes() -> Routes<ApiState> {
    use openapi::TaskResponse;
    use utoipa::openapi::schema::Type;
    let users = |s| Doc::new("users", s);
    let app = |s| Doc::new("app", s);
    Routes::new()
        .op(Method::POST, "/users", app::upsert_users, users("Create or replace users").body())
        .op(Method::PATCH, "/users", app::partial_update_users, users("Partially update users").body())
        .op(
            Method::GET,
            "/users",
            app::query_users,
            users("Query users").query("payload", Type::String, "JSON: filter_conditions, sort, limit, offset"),
        )
        .op(Method::GET, "/app", app::get_app, app("Get the app settings"))
        .op(Method::PATCH, "/app", app::update_app, app("Update the app settings (webhooks, fork_enabled, …)").body())
        .op(Method::POST, "/guest", app::create_guest, users("Create a guest user and its token").body())
        .op(
            Method::GET,
            "/tasks/{id}",
            fork::get_task,
            Doc::new("fork", "A task: the backfill of a fork, with its progress").ok_of::<TaskResponse>(),
        )
        .op(Method::GET, "/jobs", jobs::job_counts, Doc::new("worker", "Queue jobs per state (server-side)"))
        .op(
            Method::GET,
            "/webhooks/dead_letters",
            jobs::list_dead_letters,
            Doc::new("worker", "Dead-lettered webhook deliveries (server-side)"),
        )
        .op(
            Method::POST,
            "/webhooks/dead_letters/replay",
            jobs::replay_dead_letters,
            Doc::new("worker", "Replay dead-lettered webhook deliveries: {ids} or {all: true}").body(),
        )
        .op(
            Method::GET,
            "/rate_limits",
            ratelimit::get_rate_limits,
            app("Rate limits and what remains of them (server-side)")
                .query("server_side", Type::Boolean, "Include server-side limits")
                .query("android", Type::Boolean, "Include Android limits")
                .query("ios", Type::Boolean, "Include iOS limits")
                .query("web", Type::Boolean, "Include web limits")
                .query("endpoints", Type::String, "Comma-separated endpoint names (default: every endpoint)"),
        )
        .op(Method::POST, "/moderation/ban", app::ban_user, users("Ban a user").body())
        .op(
            Method::DELETE,
            "/moderation/ban",
            app::unban_user,
            users("Lift a user's bans").query("target_user_id", Type::String, "The banned user"),
        )
}

/// Every API route, in both dialects, with the document that describes them (and the
/// process's own endpoints: health, metrics, this document).
fn api_routes() -> Routes<ApiState> {
    Routes::new().merge(chat_routes()).merge(general_routes()).nest("/api/v2/chat", chat_routes()).nest("/api/v2", general_routes())
}

/// The OpenAPI 3.1 document of every route [`router`] serves, and of `/healthz`,
/// `/metrics`, `/openapi.json`, `/connect`, `/api/v2/connect` and the upload links.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api_routes().merge(ops_docs()).into_parts().1
}

/// Documentation of the routes served outside the API router (health, metrics, WebSocket,
/// this document), so the document lists every path of a full process.
fn ops_docs() -> Routes<ApiState> {
    async fn unreachable() {}
    let ops = |s| Doc::new("operating", s);
    Routes::new()
        .op(Method::GET, "/healthz", unreachable, ops("Readiness: 200 once the database answers").public(openapi::health_schema()))
        .op(Method::GET, "/metrics", unreachable, ops("Prometheus metrics (text format)").public(openapi::any_schema()))
        .op(Method::GET, "/openapi.json", unreachable, ops("This document").public(openapi::any_schema()))
        .op(
            Method::GET,
            "/connect",
            unreachable,
            Doc::new("websocket", "WebSocket (legacy dialect): upgrade with ?json=…&api_key=…&authorization=…"),
        )
        .op(
            Method::GET,
            "/api/v2/connect",
            unreachable,
            Doc::new("websocket", "WebSocket (v2 dialect): upgrade with ?api_key=…, token in the first frame"),
        )
        .op(
            Method::GET,
            "/uploads/{id}/{name}",
            unreachable,
            Doc::new("files", "An uploaded file by its signed link (no api_key, no token; Range is served)")
                .public(openapi::any_schema())
                .query("exp", utoipa::openapi::schema::Type::Integer, "Expiry, Unix seconds")
                .query("sig", utoipa::openapi::schema::Type::String, "HMAC-SHA256 with the API secret of the path, a newline and exp, hex"),
        )
}

/// Every (method, path) the API router serves, for tests that hold it against the document.
pub fn api_operations() -> Vec<(Method, String)> {
    api_routes().operations()
}

pub fn router(state: ApiState) -> Router {
    let store = state.store.clone();
    let max_body = state.max_body;
    let limiter = state.rate_limits.clone();
    let (routes, _) = api_routes().into_parts();
    let routes = routes.route_layer(middleware::from_fn_with_state(limiter, ratelimit::limit));
    let document = std::sync::Arc::new(openapi());
    let api = routes
        // Links to uploads: one path for both dialects, without the API's auth (documented in
        // `ops_docs`).
        .route("/uploads/{id}/{name}", get(files::serve_upload))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state);
    Router::new()
        .merge(api)
        .merge(health_router(store))
        .merge(console::router())
        .route("/openapi.json", get(move || async move { axum::Json(document.as_ref().clone()) }))
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(middleware::from_fn(stamp))
        .layer(cors())
}

/// `GET /healthz` alone (roles without the API still answer it).
pub fn health_router(store: Store) -> Router {
    Router::new().route("/healthz", get(healthz)).with_state(store)
}

async fn healthz(axum::extract::State(store): axum::extract::State<Store>) -> Response {
    match store.ping().await {
        Ok(()) => (StatusCode::OK, axum::Json(serde_json::json!({"status": "ok"}))).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "health check failed");
            let mut response = error::envelope(StatusCode::SERVICE_UNAVAILABLE, -1, "the database does not answer", &Default::default());
            response.headers_mut().insert(header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
            response
        }
    }
}

/// A bug that panics in a handler answers Stream's 500 envelope; the server keeps running.
fn panic_response(err: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let what = err.downcast_ref::<String>().map(String::as_str).or_else(|| err.downcast_ref::<&str>().copied()).unwrap_or("unknown panic");
    tracing::error!(panic = what, "a request handler panicked");
    ApiError(offshoot_core::Error::internal()).into_response()
}

fn cors() -> CorsLayer {
    CorsLayer::new()
        .allow_origin(Any)
        .allow_methods([Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE, Method::OPTIONS])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            HeaderName::from_static("stream-auth-type"),
            HeaderName::from_static("x-stream-client"),
            HeaderName::from_static("x-client-request-id"),
            HeaderName::from_static("x-request-id"),
        ])
        .expose_headers([
            HeaderName::from_static("x-request-id"),
            ratelimit::LIMIT,
            ratelimit::REMAINING,
            ratelimit::RESET,
            header::RETRY_AFTER,
        ])
}

/// Records the start time and the dialect (by path) for the handlers below.
async fn stamp(mut req: Request, next: Next) -> Response {
    let dialect = if req.uri().path().starts_with("/api/v2/") { Dialect::V2 } else { Dialect::Legacy };
    req.extensions_mut().insert(dialect);
    STARTED.scope(Instant::now(), next.run(req)).await
}

pub(crate) async fn not_found(req: Request) -> ApiError {
    ApiError(offshoot_core::Error::not_found(format!("no endpoint {} {}", req.method(), req.uri().path())))
}

pub(crate) async fn method_not_allowed(req: Request) -> ApiError {
    ApiError(offshoot_core::Error::new(
        offshoot_core::ErrorKind::MethodNotAllowed,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    ))
}
