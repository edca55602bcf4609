//! The HTTP API: Stream's chat REST surface in both wire dialects (legacy paths render RFC 3339
//! and flat custom fields; `/api/v2` paths render nanoseconds and nested `custom`), auth, the
//! error envelope, and the fork endpoints.
//!
//! Handlers parse input into domain types, check permissions (offshoot-core) and call the
//! store. Depends on offshoot-core and offshoot-store; must not depend on offshoot-ws or
//! offshoot-worker (the WebSocket registry arrives as a `Watchers` trait object).

mod app;
mod channels;
mod ctx;
mod error;
mod fork;
mod input;
mod jobs;
mod messages;
mod state;

pub use error::ApiError;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, HeaderName, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use offshoot_core::render::Dialect;
use offshoot_store::Store;
use std::time::Instant;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{Any, CorsLayer};

pub use state::ApiState;

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
fn chat_routes() -> Router<ApiState> {
    Router::new()
        .route("/channels", post(channels::query_channels))
        .route("/channels/delete", post(channels::delete_channels))
        .route("/channels/{type}/query", post(channels::query_distinct_channel))
        .route("/channels/{type}/{id}/query", post(channels::query_channel))
        .route(
            "/channels/{type}/{id}",
            post(channels::update_channel)
                .patch(channels::partial_update_channel)
                .delete(channels::delete_channel)
                .get(channels::get_channel),
        )
        .route("/channels/{type}/{id}/message", post(messages::send_message))
        .route("/channels/{type}/{id}/truncate", post(channels::truncate_channel))
        .route("/channels/{type}/{id}/rewind", post(channels::rewind_channel))
        .route("/channels/{type}/{id}/read", post(channels::mark_read))
        .route("/channels/{type}/{id}/event", post(channels::send_event))
        .route("/channels/{type}/{id}/stop-watching", post(channels::stop_watching))
        .route("/channels/{type}/{id}/fork", post(fork::fork_channel))
        .route("/channels/{type}/{id}/fork/message_ids", post(fork::lookup_fork_message_ids))
        .route("/channels/{type}/{id}/forks", get(fork::list_forks))
        .route(
            "/messages/{id}",
            get(messages::get_message)
                .post(messages::update_message)
                .put(messages::partial_update_message)
                .delete(messages::delete_message),
        )
        .route("/messages/{id}/ephemeral", axum::routing::patch(messages::ephemeral_update))
        .route("/messages/{id}/replies", get(messages::get_replies))
        .route("/messages/{id}/reaction", post(messages::send_reaction))
        .route("/messages/{id}/reaction/{type}", delete(messages::delete_reaction))
        .route("/messages/{id}/reactions", get(messages::get_reactions))
        .route("/threads", post(messages::query_threads))
        .route("/threads/{id}", get(messages::get_thread))
        .route("/channeltypes", get(app::list_channel_types))
        .route("/channeltypes/{name}", get(app::get_channel_type).put(app::put_channel_type))
}

/// Routes outside chat: mounted at `/` and `/api/v2`.
fn general_routes() -> Router<ApiState> {
    Router::new()
        .route("/users", post(app::upsert_users).patch(app::partial_update_users).get(app::query_users))
        .route("/app", get(app::get_app).patch(app::update_app))
        .route("/guest", post(app::create_guest))
        .route("/tasks/{id}", get(fork::get_task))
        .route("/jobs", get(jobs::job_counts))
        .route("/webhooks/dead_letters", get(jobs::list_dead_letters))
        .route("/webhooks/dead_letters/replay", post(jobs::replay_dead_letters))
        .route("/moderation/ban", post(app::ban_user).delete(app::unban_user))
}

pub fn router(state: ApiState) -> Router {
    let store = state.store.clone();
    let api = Router::new()
        .merge(chat_routes())
        .merge(general_routes())
        .nest("/api/v2/chat", chat_routes())
        .nest("/api/v2", general_routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state);
    Router::new()
        .merge(api)
        .merge(health_router(store))
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
            (StatusCode::SERVICE_UNAVAILABLE, axum::Json(serde_json::json!({"status": "unavailable"}))).into_response()
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
        ])
}

/// Records the start time and the dialect (by path) for the handlers below.
async fn stamp(mut req: Request, next: Next) -> Response {
    let dialect = if req.uri().path().starts_with("/api/v2/") { Dialect::V2 } else { Dialect::Legacy };
    req.extensions_mut().insert(dialect);
    STARTED.scope(Instant::now(), next.run(req)).await
}

async fn not_found(req: Request) -> ApiError {
    ApiError(offshoot_core::Error::not_found(format!("no endpoint {} {}", req.method(), req.uri().path())))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError(offshoot_core::Error::new(
        offshoot_core::ErrorKind::MethodNotAllowed,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    ))
}
