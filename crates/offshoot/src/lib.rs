//! The Offshoot server: configuration, and [`run`], which starts the chosen roles (api, ws,
//! worker) on one bound listener and stops them when the shutdown token is cancelled.
//!
//! Depends on every other crate; nothing depends on it but the binary and the test suites.

pub mod cli;

use anyhow::Context;
use offshoot_core::model::{NoWatchers, Watchers};
use offshoot_store::Store;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Typed configuration. Secrets are redacted in `Debug`.
#[derive(Clone)]
pub struct Config {
    /// `host:port`; port 0 picks a free one.
    pub listen: String,
    /// `sqlite://file.db?mode=rwc` (default) or `postgres://…`.
    pub database_url: String,
    pub api_key: Option<String>,
    pub api_secret: Option<String>,
    pub roles: Roles,
    pub backfill_page_size: i64,
    pub backfill_page_delay: Duration,
    pub worker_poll_interval: Duration,
    /// How long delivered outbox events are kept (every role prunes).
    pub event_retention: Duration,
    /// How often each process prunes the outbox.
    pub prune_interval: Duration,
    /// Retry and heartbeat policies of the job queue (page size, page delay and poll interval
    /// come from the fields above).
    pub worker: offshoot_worker::WorkerConfig,
    /// `text` (default) or `json` log lines.
    pub log_format: LogFormat,
    /// Where `GET /metrics` is served.
    pub metrics: MetricsListen,
    /// A request still running after this is answered 408 (Stream code 23).
    pub request_timeout: Duration,
    /// Request bodies larger than this are answered 413 (Stream code 22).
    pub max_body_bytes: usize,
    /// WebSocket connections one process holds at most; new ones beyond are refused (503, code 71).
    pub max_ws_connections: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Where `GET /metrics` is served (`OFFSHOOT_METRICS_LISTEN`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsListen {
    /// On the server's own port, next to `/healthz` (the default).
    Main,
    /// On a listener of its own (e.g. a private interface), and not on the server's port.
    Separate(String),
    /// Not served.
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    pub api: bool,
    pub ws: bool,
    pub worker: bool,
}

impl Roles {
    pub const ALL: Roles = Roles { api: true, ws: true, worker: true };

    /// `api,ws,worker` (any subset).
    pub fn parse(s: &str) -> anyhow::Result<Roles> {
        let mut r = Roles { api: false, ws: false, worker: false };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "api" => r.api = true,
                "ws" => r.ws = true,
                "worker" => r.worker = true,
                "all" => r = Roles::ALL,
                other => anyhow::bail!("unknown role {other:?}: use api, ws, worker or all"),
            }
        }
        anyhow::ensure!(r.api || r.ws || r.worker, "no role selected");
        Ok(r)
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("listen", &self.listen)
            .field("database_url", &redact_url(&self.database_url))
            .field("api_key", &self.api_key)
            .field("api_secret", &self.api_secret.as_ref().map(|_| "<redacted>"))
            .field("roles", &self.roles)
            .field("backfill_page_size", &self.backfill_page_size)
            .field("backfill_page_delay", &self.backfill_page_delay)
            .field("event_retention", &self.event_retention)
            .field("worker", &self.worker)
            .field("log_format", &self.log_format)
            .field("metrics", &self.metrics)
            .field("request_timeout", &self.request_timeout)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("max_ws_connections", &self.max_ws_connections)
            .finish()
    }
}

fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://<redacted>@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:3000".into(),
            database_url: "sqlite://offshoot.db?mode=rwc".into(),
            api_key: None,
            api_secret: None,
            roles: Roles::ALL,
            backfill_page_size: offshoot_core::fork::BACKFILL_PAGE,
            backfill_page_delay: Duration::ZERO,
            worker_poll_interval: Duration::from_secs(1),
            event_retention: Duration::from_secs(24 * 3600),
            prune_interval: Duration::from_secs(600),
            worker: offshoot_worker::WorkerConfig::default(),
            log_format: LogFormat::Text,
            metrics: MetricsListen::Main,
            request_timeout: Duration::from_secs(30),
            max_body_bytes: offshoot_api::MAX_BODY,
            max_ws_connections: offshoot_ws::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

impl Config {
    /// Defaults, then the environment (`OFFSHOOT_*`, `DATABASE_URL`). Reads only; validates.
    pub fn from_env() -> anyhow::Result<Config> {
        Self::load(None)
    }

    /// Defaults, then a config file in env-file form (`KEY=value` lines, `#` comments, as
    /// `offshoot.env.example`), then the environment, which wins. Reads only; validates.
    pub fn load(file: Option<&std::path::Path>) -> anyhow::Result<Config> {
        let mut from_file = std::collections::HashMap::new();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading the config file {}", path.display()))?;
            from_file = parse_env_file(&text).with_context(|| format!("in the config file {}", path.display()))?;
        }
        let var = |k: &str| std::env::var(k).ok().or_else(|| from_file.get(k).cloned()).filter(|v| !v.is_empty());
        let mut c = Config::default();
        if let Some(v) = var("OFFSHOOT_LISTEN") {
            c.listen = v;
        }
        if let Some(v) = var("DATABASE_URL") {
            c.database_url = v;
        }
        offshoot_store::Backend::from_url(&c.database_url).map_err(|e| anyhow::anyhow!("{e}"))?;
        c.api_key = var("OFFSHOOT_API_KEY");
        c.api_secret = var("OFFSHOOT_API_SECRET");
        anyhow::ensure!(c.api_key.is_some() == c.api_secret.is_some(), "set both OFFSHOOT_API_KEY and OFFSHOOT_API_SECRET, or neither");
        if let Some(v) = var("OFFSHOOT_ROLES") {
            c.roles = Roles::parse(&v)?;
        }
        if let Some(v) = var("OFFSHOOT_BACKFILL_PAGE_SIZE") {
            c.backfill_page_size = v.parse().context("OFFSHOOT_BACKFILL_PAGE_SIZE must be a number")?;
            anyhow::ensure!(c.backfill_page_size > 0, "OFFSHOOT_BACKFILL_PAGE_SIZE must be positive");
        }
        if let Some(v) = var("OFFSHOOT_BACKFILL_PAGE_DELAY_MS") {
            c.backfill_page_delay = Duration::from_millis(v.parse().context("OFFSHOOT_BACKFILL_PAGE_DELAY_MS must be a number")?);
        }
        let number = |key: &str| -> anyhow::Result<Option<u64>> {
            var(key).map(|v| v.parse::<u64>().with_context(|| format!("{key} must be a whole number"))).transpose()
        };
        if let Some(v) = number("OFFSHOOT_WORKER_POLL_MS")? {
            c.worker_poll_interval = Duration::from_millis(v.max(10));
        }
        let w = &mut c.worker;
        if let Some(v) = number("OFFSHOOT_WORKER_HEARTBEAT_SECS")? {
            anyhow::ensure!(v > 0, "OFFSHOOT_WORKER_HEARTBEAT_SECS must be positive");
            w.heartbeat = Duration::from_secs(v);
        }
        if let Some(v) = number("OFFSHOOT_WORKER_RECONCILE_SECS")? {
            w.reconcile_interval = Duration::from_secs(v.max(1));
        }
        if let Some(v) = number("OFFSHOOT_BACKFILL_MAX_ATTEMPTS")? {
            anyhow::ensure!(v > 0, "OFFSHOOT_BACKFILL_MAX_ATTEMPTS must be positive");
            w.backfill.max_attempts = v as u32;
        }
        if let Some(v) = number("OFFSHOOT_BACKFILL_BACKOFF_BASE_MS")? {
            w.backfill.backoff_base = Duration::from_millis(v);
        }
        if let Some(v) = number("OFFSHOOT_BACKFILL_BACKOFF_MAX_SECS")? {
            w.backfill.backoff_max = Duration::from_secs(v);
        }
        if let Some(v) = number("OFFSHOOT_WEBHOOK_RETRY_WINDOW_SECS")? {
            w.webhooks.retry_window = Duration::from_secs(v);
        }
        if let Some(v) = number("OFFSHOOT_WEBHOOK_BACKOFF_BASE_MS")? {
            w.webhooks.backoff_base = Duration::from_millis(v);
        }
        if let Some(v) = number("OFFSHOOT_WEBHOOK_BACKOFF_MAX_SECS")? {
            w.webhooks.backoff_max = Duration::from_secs(v);
        }
        if let Some(v) = number("OFFSHOOT_WEBHOOK_TIMEOUT_MS")? {
            anyhow::ensure!(v > 0, "OFFSHOOT_WEBHOOK_TIMEOUT_MS must be positive");
            w.webhooks.attempt_timeout = Duration::from_millis(v);
        }
        if let Some(v) = number("OFFSHOOT_WEBHOOK_CIRCUIT_THRESHOLD")? {
            anyhow::ensure!(v > 0, "OFFSHOOT_WEBHOOK_CIRCUIT_THRESHOLD must be positive");
            w.webhooks.circuit_threshold = v as u32;
        }
        if let Some(v) = var("OFFSHOOT_LOG_FORMAT") {
            c.log_format = match v.to_ascii_lowercase().as_str() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                other => anyhow::bail!("OFFSHOOT_LOG_FORMAT must be text or json, not {other:?}"),
            };
        }
        if let Some(v) = var("OFFSHOOT_METRICS_LISTEN") {
            c.metrics = match v.as_str() {
                "off" => MetricsListen::Off,
                "main" => MetricsListen::Main,
                addr => MetricsListen::Separate(addr.to_string()),
            };
        }
        if let Some(v) = var("OFFSHOOT_REQUEST_TIMEOUT_MS") {
            c.request_timeout = Duration::from_millis(v.parse().context("OFFSHOOT_REQUEST_TIMEOUT_MS must be a number")?);
            anyhow::ensure!(!c.request_timeout.is_zero(), "OFFSHOOT_REQUEST_TIMEOUT_MS must be positive");
        }
        if let Some(v) = var("OFFSHOOT_MAX_BODY_BYTES") {
            c.max_body_bytes = v.parse().context("OFFSHOOT_MAX_BODY_BYTES must be a number")?;
            anyhow::ensure!(c.max_body_bytes >= 1024, "OFFSHOOT_MAX_BODY_BYTES must be at least 1024");
        }
        if let Some(v) = var("OFFSHOOT_MAX_WS_CONNECTIONS") {
            c.max_ws_connections = v.parse().context("OFFSHOOT_MAX_WS_CONNECTIONS must be a number")?;
        }
        Ok(c)
    }

    /// The worker's configuration with the backfill and polling fields applied.
    pub fn worker_config(&self) -> offshoot_worker::WorkerConfig {
        let mut w = self.worker.clone();
        w.backfill.page_size = self.backfill_page_size;
        w.backfill.page_delay = self.backfill_page_delay;
        w.poll_interval = self.worker_poll_interval;
        w
    }
}

/// `KEY=value` lines; blank lines and `#` comments are skipped; values may be quoted.
fn parse_env_file(text: &str) -> anyhow::Result<std::collections::HashMap<String, String>> {
    let mut out = std::collections::HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let (k, v) = line.split_once('=').with_context(|| format!("line {}: expected KEY=value", n + 1))?;
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|x| x.strip_suffix('"'))
            .or_else(|| v.strip_prefix('\'').and_then(|x| x.strip_suffix('\'')))
            .unwrap_or(v);
        out.insert(k.trim().to_string(), v.to_string());
    }
    Ok(out)
}

/// Starts the configured roles on `listener` and runs until `shutdown` is cancelled; then
/// drains in-flight requests (bounded) and returns.
pub async fn run(listener: TcpListener, config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let store = Store::connect(&config.database_url).await.map_err(|e| anyhow::anyhow!("opening the database: {e}"))?;
    let (api_key, api_secret, generated) = store
        .ensure_app(config.api_key.as_deref(), config.api_secret.as_deref())
        .await
        .map_err(|e| anyhow::anyhow!("loading the app: {e}"))?;
    if generated {
        println!("offshoot: generated an API key pair (stored in the database)\n  OFFSHOOT_API_KEY={api_key}\n  OFFSHOOT_API_SECRET={api_secret}");
    } else {
        tracing::info!(api_key = %api_key, "app loaded");
    }
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

    let hub = config
        .roles
        .ws
        .then(|| offshoot_ws::Hub::with_max_connections(store.clone(), api_key.clone(), api_secret.clone(), config.max_ws_connections));
    let watchers: Arc<dyn Watchers> = match &hub {
        Some(h) => h.clone(),
        None => Arc::new(NoWatchers),
    };
    let mut router = axum::Router::new();
    if config.roles.api {
        let mut state = offshoot_api::ApiState::new(store.clone(), api_key.clone(), api_secret.clone(), watchers, Arc::new(queue.clone()));
        state.max_body = config.max_body_bytes;
        router = router.merge(offshoot_api::router(state));
    } else {
        router = router.merge(offshoot_api::health_router(store.clone()));
    }
    if let Some(hub) = &hub {
        router = router.merge(hub.clone().router());
        let (h, s) = (hub.clone(), shutdown.clone());
        tasks.spawn(async move { h.run(s).await });
    }
    if config.roles.worker {
        let (q, c, k, sec, s) = (queue.clone(), config.worker_config(), api_key.clone(), api_secret.clone(), shutdown.clone());
        tasks.spawn(async move { offshoot_worker::run(q, c, k, sec, s).await });
    }

    let limits = offshoot_api::ops::Limits { request_timeout: config.request_timeout, max_body: config.max_body_bytes };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_files_parse_comments_quotes_and_export() {
        let m = parse_env_file("# comment\n\nOFFSHOOT_LISTEN=127.0.0.1:4000\nexport DATABASE_URL=\"postgres://x\"\nOFFSHOOT_ROLES='api'\n")
            .unwrap();
        assert_eq!(m["OFFSHOOT_LISTEN"], "127.0.0.1:4000");
        assert_eq!(m["DATABASE_URL"], "postgres://x");
        assert_eq!(m["OFFSHOOT_ROLES"], "api");
        assert!(parse_env_file("not a pair").is_err());
    }

    #[test]
    fn a_config_file_is_read_and_validated() {
        let path = std::env::temp_dir().join(format!("offshoot-config-{}.env", std::process::id()));
        std::fs::write(&path, "OFFSHOOT_BACKFILL_PAGE_SIZE=250\nOFFSHOOT_ROLES=worker\n").unwrap();
        let c = Config::load(Some(&path)).unwrap();
        assert_eq!(c.backfill_page_size, 250);
        assert_eq!(c.roles, Roles { api: false, ws: false, worker: true });
        std::fs::write(&path, "OFFSHOOT_BACKFILL_PAGE_SIZE=0\n").unwrap();
        assert!(Config::load(Some(&path)).is_err(), "a page size of 0 is refused");
        std::fs::remove_file(&path).unwrap();
    }
}
