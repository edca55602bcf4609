//! Operating the server: request ids, one log line per request, HTTP metrics, the request
//! limits (the whole body is read before anything answers, a per-request timeout) and
//! `GET /metrics`.
//!
//! [`layers`] wraps the whole router of a process (API, WebSocket upgrades, health, metrics),
//! so every request gets an `X-Request-Id`, a span that every log line of the request carries,
//! one `request` line when it ends, and its count and latency under its matched route.

use crate::error::envelope;
use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use offshoot_core::jobs::Jobs;
use offshoot_core::render::ErrorCode;
use offshoot_store::Store;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use tracing::field::Empty;
use tracing::Span;

/// Request limits of one process (configurable, see the README's "Operating" section).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// A request still running after this is answered 408 (Stream code 23); its work is
    /// dropped (an open transaction rolls back).
    pub request_timeout: Duration,
    /// Request bodies larger than this are answered 413 (Stream code 22).
    pub max_body: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { request_timeout: Duration::from_secs(30), max_body: crate::MAX_BODY }
    }
}

/// Label of requests that matched no route (a fixed value keeps the metric's cardinality
/// bounded whatever paths clients send).
const UNMATCHED: &str = "unmatched";

/// Wraps `router` (every route of the process) with request ids, the request span and log
/// line, HTTP metrics and the limits. Routes that have no answer of their own for a wrong
/// method (`/connect`, `/healthz`, `/metrics`) answer it with Stream's envelope (405), and so
/// does an unknown path in a process without the API role (404).
pub fn layers(router: Router, limits: Limits) -> Router {
    router
        .method_not_allowed_fallback(crate::method_not_allowed)
        .fallback(crate::not_found)
        .layer(middleware::from_fn_with_state(limits, meter))
        .layer(TraceLayer::new_for_http().make_span_with(make_span).on_request(()).on_response(on_response).on_failure(()))
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
}

fn route_of(req: &Request) -> &str {
    req.extensions().get::<MatchedPath>().map(MatchedPath::as_str).unwrap_or(UNMATCHED)
}

/// The request's span: its id, method and route template (never the URI: its query carries
/// tokens on `/connect`), and the caller (`api_key`, `user_id`), filled in by authentication.
fn make_span(req: &Request) -> Span {
    let request_id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("");
    let api_key = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|p| p.strip_prefix("api_key=")))
        .map(|k| if k.len() > 64 { &k[..64] } else { k })
        .unwrap_or("");
    tracing::info_span!("request", request_id, method = %req.method(), route = route_of(req), api_key, user_id = Empty)
}

/// Records who is calling on the current request's span: a user id, `server` or `anonymous`.
pub(crate) fn record_caller(who: &str) {
    Span::current().record("user_id", who);
}

fn on_response(res: &Response, latency: Duration, span: &Span) {
    let code = res.extensions().get::<ErrorCode>().map(|c| c.0);
    tracing::info!(parent: span, status = res.status().as_u16(), duration_ms = latency.as_secs_f64() * 1000.0, code, "request");
}

/// Counts and times the request, and applies the limits.
async fn meter(State(limits): State<Limits>, req: Request, next: Next) -> Response {
    let route = route_of(&req).to_string();
    let method = req.method().as_str().to_string();
    let started = Instant::now();
    let response = limited(limits, req, next).await;
    let status = response.status().as_u16().to_string();
    metrics::histogram!("offshoot_http_request_duration_seconds", "method" => method.clone(), "route" => route.clone())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!("offshoot_http_requests_total", "method" => method, "route" => route, "status" => status).increment(1);
    response
}

/// Reads and drops up to `max` bytes of a refused body (bounded in time).
async fn drain(mut body: Body, max: usize) {
    use http_body_util::BodyExt;
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > max {
                break;
            }
        }
    })
    .await;
}

/// Reads the whole request body (up to the limit) before the handler runs, then runs it
/// under the timeout.
///
/// Reading first matters for keep-alive: an answer given before the body was read (a
/// rejected token, an unknown route) made hyper close the connection once the response was
/// written, whenever the body's bytes had not all arrived yet, without `Connection: close`;
/// a client that then sent its next request on that connection saw it dropped unanswered.
/// Now every request's body is consumed before any answer, and the one answer that cannot
/// read it (a body over the limit) says `Connection: close`.
async fn limited(limits: Limits, req: Request, next: Next) -> Response {
    if crate::files::streams_body(req.method(), req.uri().path()) {
        return timed(limits, next.run(req)).await;
    }
    let (parts, body) = req.into_parts();
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body as u64) {
        // A client still writing the body would see a broken pipe instead of the 413: read and
        // drop a bounded amount of it first (bodies up to twice the limit, within 5 s).
        if declared.is_some_and(|n| n <= 2 * limits.max_body as u64) {
            drain(body, 2 * limits.max_body).await;
        }
        return closing(too_large(limits.max_body));
    }
    let bytes = match axum::body::to_bytes(body, limits.max_body).await {
        Ok(b) => b,
        Err(e) => {
            let too_big = std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            let response = if too_big {
                too_large(limits.max_body)
            } else {
                envelope(StatusCode::BAD_REQUEST, 4, &format!("the request body could not be read: {e}"), &BTreeMap::new())
            };
            return closing(response);
        }
    };
    let req = Request::from_parts(parts, Body::from(bytes));
    timed(limits, next.run(req)).await
}

/// A response, or the 408 envelope when it takes longer than the request timeout.
async fn timed(limits: Limits, response: impl std::future::Future<Output = Response>) -> Response {
    match tokio::time::timeout(limits.request_timeout, response).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(timeout_ms = limits.request_timeout.as_millis() as u64, "request timed out");
            envelope(
                StatusCode::REQUEST_TIMEOUT,
                23,
                &format!("the request did not finish within {} ms", limits.request_timeout.as_millis()),
                &BTreeMap::new(),
            )
        }
    }
}

fn too_large(max: usize) -> Response {
    envelope(StatusCode::PAYLOAD_TOO_LARGE, 22, &format!("the request body is larger than {max} bytes"), &BTreeMap::new())
}

fn closing(mut response: Response) -> Response {
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The process-wide Prometheus recorder (installed once; later calls return the same handle).
pub fn install_metrics() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Suffix("_seconds".into()),
                    &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0],
                )
                .expect("the bucket list is not empty");
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // Another recorder already installed (an embedding program): ours still renders
            // what is recorded through it, which is nothing; say so once.
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was installed already; /metrics shows only Offshoot's own gauges");
            }
            handle
        })
        .clone()
}

#[derive(Clone)]
struct MetricsState {
    store: Store,
    handle: PrometheusHandle,
    jobs: Arc<dyn Jobs>,
}

/// `GET /metrics`: Prometheus text format. Gauges read from the database (queue depths, lags,
/// the pool) are refreshed at each scrape.
pub fn metrics_router(store: Store, handle: PrometheusHandle, jobs: Arc<dyn Jobs>) -> Router {
    Router::new().route("/metrics", get(render_metrics)).with_state(MetricsState { store, handle, jobs })
}

async fn render_metrics(State(st): State<MetricsState>) -> Response {
    // Jobs per queue and state, from the apalis tables.
    match st.jobs.counts().await {
        Ok(queues) => {
            for q in queues {
                for (state, n) in [
                    ("queued", q.queued),
                    ("running", q.running),
                    ("retrying", q.retrying),
                    ("failed", q.failed),
                    ("dead_lettered", q.dead_lettered),
                ] {
                    let queue = q.queue.strip_prefix("offshoot.").unwrap_or(&q.queue).to_string();
                    metrics::gauge!("offshoot_queue_jobs", "queue" => queue, "state" => state).set(n as f64);
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "reading the job counts for /metrics failed"),
    }
    match st.store.ops_snapshot().await {
        Ok(s) => {
            metrics::gauge!("offshoot_backfill_lag_seconds").set(s.backfill_lag_seconds);
            metrics::gauge!("offshoot_backfilling_forks").set(s.backfilling_forks as f64);
            for (consumer, lag) in s.outbox_lag {
                metrics::gauge!("offshoot_outbox_lag_events", "consumer" => consumer).set(lag as f64);
            }
            metrics::gauge!("offshoot_db_pool_connections", "state" => "in_use").set(f64::from(s.pool_in_use));
            metrics::gauge!("offshoot_db_pool_connections", "state" => "idle").set(f64::from(s.pool_idle));
            metrics::gauge!("offshoot_metrics_scrape_errors").set(0.0);
        }
        Err(e) => {
            tracing::warn!(error = %e, "reading the database gauges for /metrics failed");
            metrics::gauge!("offshoot_metrics_scrape_errors").set(1.0);
        }
    }
    st.handle.run_upkeep();
    ([(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"))], st.handle.render()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Serves `app` on 127.0.0.1:0 and returns the raw answer to `request`.
    async fn exchange(app: Router, request: &str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out)).await.expect("answered in time").unwrap();
        out
    }

    #[tokio::test]
    async fn a_request_over_the_timeout_is_answered_408_with_the_envelope() {
        let slow = Router::new().route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                "late"
            }),
        );
        let app = layers(slow, Limits { request_timeout: Duration::from_millis(50), max_body: 1024 });
        let out = exchange(app, "GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 408"), "{out}");
        assert!(out.contains("\"code\":23") && out.contains("\"StatusCode\":408"), "{out}");
        assert!(out.to_ascii_lowercase().contains("x-request-id:"), "{out}");
    }

    #[tokio::test]
    async fn a_declared_body_over_the_limit_is_refused_before_it_is_read() {
        let app = layers(
            Router::new().route("/", axum::routing::post(|| async { "read" })),
            Limits { request_timeout: Duration::from_secs(5), max_body: 1024 },
        );
        let out = exchange(app, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 413"), "{out}");
        assert!(out.to_ascii_lowercase().contains("connection: close"), "{out}");
        assert!(out.contains("\"code\":22"), "{out}");
    }
}
