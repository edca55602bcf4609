//! The Offshoot server: the command line ([`cli`]) with its HTTP client commands ([`client`]),
//! the configuration ([`config`]), and [`run`], which starts the chosen roles (api, ws, worker)
//! on one bound listener and stops them when the shutdown token is cancelled.
//!
//! Depends on every other crate; nothing depends on it but the binary and the test suites.

pub mod cli;
pub mod client;
pub mod config;
mod tree;

pub use config::{Config, LogFormat, MetricsListen, Roles, Settings};
pub use offshoot_api::ratelimit::RateLimitConfig;

use anyhow::Context;
use offshoot_core::model::{NoWatchers, Watchers};
use offshoot_store::Store;
use secrecy::{ExposeSecret, SecretString};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Starts the configured roles on `listener` and runs until `shutdown` is cancelled; then
/// drains in-flight requests (bounded) and returns.
pub async fn run(listener: TcpListener, config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    if let Err(e) = huge_pages_off() {
        tracing::warn!(error = %e, "could not turn transparent huge pages off for this process");
    }
    let store = Store::connect(&config.database_url).await.map_err(|e| anyhow::anyhow!("opening the database: {e}"))?;
    let (api_key, api_secret) = load_app(&store, &config).await?;
    // Every role pushes jobs (the API queues backfills), so every role opens the queue.
    let queue = offshoot_worker::Queue::connect(store.clone(), &config.database_url)
        .await
        .map_err(|e| anyhow::anyhow!("opening the job queue: {e}"))?;
    let mut tasks = tokio::task::JoinSet::new();
    {
        let (st, s) = (store.clone(), shutdown.clone());
        tasks.spawn(async move { st.relay_notifications(s.cancelled_owned()).await });
    }
    // Every process prunes the outbox, whatever its roles: a deployment without a worker
    // still must not grow the event table for ever.
    tasks.spawn(prune_outbox(store.clone(), config.event_retention, config.prune_interval, shutdown.clone()));

    let router = role_routes(&config, &store, &queue, &api_key, &api_secret, &mut tasks, &shutdown).await?;

    let limits = offshoot_api::ops::Limits { request_timeout: config.request_timeout, max_body: config.max_body_bytes };
    let router = with_metrics(router, &config, &store, &queue, limits, &mut tasks, &shutdown).await?;
    let router = offshoot_api::ops::layers(router, limits);

    tracing::info!(addr = %listener.local_addr()?, backend = store.backend().name(), roles = ?config.roles, "offshoot listening");
    let s = shutdown.clone();
    axum::serve(listener, router.into_make_service()).with_graceful_shutdown(async move { s.cancelled().await }).await?;
    // Background roles stop at the token; give them a bounded time to finish their page.
    let _ = tokio::time::timeout(Duration::from_secs(10), async { while tasks.join_next().await.is_some() {} }).await;
    queue.close().await;
    store.close().await;
    Ok(())
}

/// The app's key pair: the configured one, or the stored one, or a new one (printed once).
async fn load_app(store: &Store, config: &Config) -> anyhow::Result<(String, SecretString)> {
    let (api_key, api_secret, generated) = store
        .ensure_app(config.api_key.as_deref(), config.api_secret.as_ref().map(|s| s.expose_secret()))
        .await
        .map_err(|e| anyhow::anyhow!("loading the app: {e}"))?;
    if generated {
        println!("offshoot: generated an API key pair (stored in the database)\n  OFFSHOOT_API_KEY={api_key}\n  OFFSHOOT_API_SECRET={api_secret}");
    } else {
        tracing::info!(api_key = %api_key, "app loaded");
    }
    let api_secret = SecretString::from(api_secret);
    Ok((api_key, api_secret))
}

/// The routes of this process's roles (the API's, or its health routes alone, and the
/// WebSocket's), with the WebSocket hub and the worker started on `tasks`.
async fn role_routes(
    config: &Config,
    store: &Store,
    queue: &offshoot_worker::Queue,
    api_key: &str,
    api_secret: &SecretString,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &CancellationToken,
) -> anyhow::Result<axum::Router> {
    // The recorder first, so that what the roles register as they start (the WebSocket gauge)
    // is recorded.
    if !matches!(config.metrics, MetricsListen::Off) {
        offshoot_api::ops::install_metrics();
    }
    let hub = config
        .roles
        .ws
        .then(|| offshoot_ws::Hub::with_max_connections(store.clone(), api_key.to_string(), api_secret.clone(), config.max_ws_connections));
    if let Some(h) = &hub {
        h.set_client_limits(offshoot_ws::ClientLimits {
            connections_per_user: config.ws_connections_per_user,
            events_per_minute: config.ws_client_events_per_minute,
        });
    }
    let watchers: Arc<dyn Watchers> = match &hub {
        Some(h) => h.clone(),
        None => Arc::new(NoWatchers),
    };
    let limiter = rate_limiter(config, store, api_secret, tasks, shutdown);
    let files = if config.roles.api || config.roles.worker {
        let setting = config.storage_setting();
        let files = offshoot_files::Files::open(&setting).map_err(|e| anyhow::anyhow!("opening the file storage: {e}"))?;
        tracing::info!(storage = files.describe(), "file storage");
        Some(files)
    } else {
        None
    };
    let mut router = axum::Router::new();
    if config.roles.api {
        let state = offshoot_api::ApiState::with_max_body(
            store.clone(),
            api_key.to_string(),
            api_secret.clone(),
            watchers,
            Arc::new(queue.clone()),
            config.max_body_bytes,
        )
        .with_rate_limits(limiter.clone());
        let state = match &files {
            Some(f) => state.with_uploads(f.clone(), config.max_upload_bytes, config.public_url.clone()),
            None => state,
        };
        router = router.merge(offshoot_api::router(state));
    } else {
        router = router.merge(offshoot_api::health_router(store.clone()));
    }
    if let Some(hub) = &hub {
        // `Connect` is limited like the API's endpoints.
        let limit = axum::middleware::from_fn_with_state(limiter.clone(), offshoot_api::ratelimit::limit);
        router = router.merge(hub.clone().router().route_layer(limit));
        let (h, s) = (hub.clone(), shutdown.clone());
        tasks.spawn(async move { h.run(s).await });
    }
    if config.roles.worker {
        // Before the listener serves: the webhook relay's cursor must exist before this
        // process's API writes its first event, or that event is never relayed.
        offshoot_worker::prepare(queue).await.map_err(|e| anyhow::anyhow!("preparing the worker: {e}"))?;
        let mut c = config.worker_config();
        c.files = files.clone();
        let (q, k, sec, s) = (queue.clone(), api_key.to_string(), api_secret.clone(), shutdown.clone());
        tasks.spawn(async move { offshoot_worker::run(q, c, k, sec, s).await });
    }

    Ok(router)
}

/// `router` with the metrics routes when they share the main listener, or with the metrics
/// served on a listener of their own (on `tasks`).
async fn with_metrics(
    mut router: axum::Router,
    config: &Config,
    store: &Store,
    queue: &offshoot_worker::Queue,
    limits: offshoot_api::ops::Limits,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &CancellationToken,
) -> anyhow::Result<axum::Router> {
    match &config.metrics {
        MetricsListen::Off => {}
        MetricsListen::Main => {
            router = router.merge(offshoot_api::ops::metrics_router(
                store.clone(),
                offshoot_api::ops::install_metrics(),
                Arc::new(queue.clone()),
            ))
        }
        MetricsListen::Separate(addr) => {
            let metrics_listener = TcpListener::bind(addr).await.with_context(|| format!("binding OFFSHOOT_METRICS_LISTEN {addr}"))?;
            tracing::info!(addr = %metrics_listener.local_addr()?, "metrics listening");
            let app = offshoot_api::ops::layers(
                offshoot_api::ops::metrics_router(store.clone(), offshoot_api::ops::install_metrics(), Arc::new(queue.clone())),
                limits,
            );
            let s = shutdown.clone();
            tasks.spawn(async move {
                if let Err(e) = axum::serve(metrics_listener, app.into_make_service()).with_graceful_shutdown(s.cancelled_owned()).await {
                    tracing::error!(error = %e, "the metrics listener failed");
                }
            });
        }
    }
    Ok(router)
}

/// The process's rate limits: Stream's table as configured. On PostgreSQL the app's counts are
/// also shared with the other api processes through the database, flushed every
/// `rate_limit_flush`; idle per-user cells are forgotten every minute.
fn rate_limiter(
    config: &Config,
    store: &Store,
    secret: &SecretString,
    tasks: &mut tokio::task::JoinSet<()>,
    shutdown: &CancellationToken,
) -> Arc<offshoot_api::ratelimit::RateLimiter> {
    use offshoot_api::ratelimit::RateLimiter;
    if !config.rate_limits.enabled {
        return Arc::new(RateLimiter::off());
    }
    let mut limiter =
        RateLimiter::new(config.rate_limits.clone(), secret.clone()).with_connection_events(config.ws_client_events_per_minute);
    if store.backend() == offshoot_store::Backend::Postgres {
        let windows = Arc::new(offshoot_api::ratelimit_shared::Windows::new());
        limiter = limiter.share(windows.clone());
        let (st, s, every) = (store.clone(), shutdown.clone(), config.rate_limit_flush);
        tasks.spawn(async move { windows.run(st, every, s.cancelled_owned()).await });
    }
    let limiter = Arc::new(limiter);
    let (l, s) = (limiter.clone(), shutdown.clone());
    tasks.spawn(async move {
        loop {
            tokio::select! {
                _ = s.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(60)) => l.forget_idle(),
            }
        }
    });
    limiter
}

/// Deletes delivered outbox events older than `retention`, every `interval`, until shutdown.
async fn prune_outbox(store: Store, retention: Duration, interval: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let before = offshoot_core::time::now() - i64::try_from(retention.as_nanos()).unwrap_or(i64::MAX);
        match store.prune_events(before).await {
            Ok(n) if n > 0 => tracing::info!(deleted = n, "pruned delivered outbox events"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "pruning the outbox failed"),
        }
    }
}

/// Turns transparent huge pages off for this process (Linux; elsewhere nothing to do). The
/// allocator asks for huge pages for its memory where the kernel offers them on request, and
/// each first touch of such memory then has the kernel zero 2 MiB on the request's thread: under
/// load both runtime threads spent a quarter of a second at a time doing that while every
/// request waited: PostgreSQL's sustained send rate was 100–750/s with huge pages and is
/// 1,500/s without (docs/performance.md, "Memory: connections, allocator and huge pages"). The
/// kernel checks the flag at each fault, so memory mapped before the call gets no new huge pages
/// either; pages already faulted in stay as they are.
pub fn huge_pages_off() -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    rustix::thread::disable_transparent_huge_pages(true)?;
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn huge_pages_are_off_for_the_process_after_the_call() {
        super::huge_pages_off().expect("prctl");
        assert!(rustix::thread::transparent_huge_pages_are_disabled().expect("prctl"));
    }
}
