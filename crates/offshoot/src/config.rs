//! The typed configuration and how it is read: defaults ([`Config::default`]), then a config
//! file (`--config FILE` / `OFFSHOOT_CONFIG`: `KEY=value` lines as `offshoot.env.example`),
//! then the environment (`OFFSHOOT_*`, `DATABASE_URL`), then command-line flags, each layer
//! overriding the one before (figment), and validated once at the end.

use anyhow::Context;
use figment::providers::{Env, Serialized};
use figment::Figment;
use secrecy::SecretString;
use serde::{Deserialize, Deserializer, Serialize};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

/// Typed configuration. Secrets are redacted in `Debug`.
#[derive(Clone)]
pub struct Config {
    /// `host:port`; port 0 picks a free one.
    pub listen: String,
    /// `sqlite://file.db?mode=rwc` (default) or `postgres://…`.
    pub database_url: String,
    pub api_key: Option<String>,
    /// Never logged: `Debug` prints it redacted and reading it takes `expose_secret`.
    pub api_secret: Option<SecretString>,
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
    /// Rate limits per endpoint, platform and user (README, "Rate limits").
    pub rate_limits: offshoot_api::ratelimit::RateLimitConfig,
    /// PostgreSQL: how often each api process adds its counts to the shared windows.
    pub rate_limit_flush: Duration,
    /// WebSocket connections one user may hold at once (across the process).
    pub ws_connections_per_user: usize,
    /// Client events (typing, custom events, health checks) one WebSocket connection may send
    /// per minute; a connection over it is closed.
    pub ws_client_events_per_minute: u32,
    /// Where uploads are stored: `file://DIR` or `s3://BUCKET?endpoint=…`; `None`: the directory
    /// `offshoot-files` next to the SQLite file (or in the working directory on PostgreSQL).
    pub storage: Option<String>,
    /// Bytes one uploaded file may have at most (Stream's 100 MB by default).
    pub max_upload_bytes: u64,
    /// `scheme://host[:port]` that upload links start with; `None`: the request's `Host`.
    pub public_url: Option<String>,
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
            .field("api_secret", &self.api_secret)
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
            .field("rate_limits", &self.rate_limits)
            .field("rate_limit_flush", &self.rate_limit_flush)
            .field("ws_connections_per_user", &self.ws_connections_per_user)
            .field("ws_client_events_per_minute", &self.ws_client_events_per_minute)
            .field("storage", &self.storage.as_deref().map(redact_storage))
            .field("max_upload_bytes", &self.max_upload_bytes)
            .field("public_url", &self.public_url)
            .finish()
    }
}

/// A storage setting without its credentials (`secret_access_key`).
fn redact_storage(s: &str) -> String {
    match s.split_once('?') {
        Some((base, query)) => {
            let kept: Vec<&str> = query.split('&').filter(|p| !p.starts_with("secret_access_key=")).collect();
            format!("{base}?{}", kept.join("&"))
        }
        None => s.to_string(),
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
            rate_limits: offshoot_api::ratelimit::RateLimitConfig::default(),
            rate_limit_flush: offshoot_api::ratelimit_shared::DEFAULT_FLUSH,
            ws_connections_per_user: offshoot_ws::DEFAULT_CONNECTIONS_PER_USER,
            ws_client_events_per_minute: offshoot_ws::DEFAULT_CLIENT_EVENTS_PER_MINUTE,
            storage: None,
            max_upload_bytes: offshoot_api::DEFAULT_MAX_UPLOAD,
            public_url: None,
        }
    }
}

/// The settings as the layers give them, before they are checked: every key optional, named as
/// its environment variable without `OFFSHOOT_` (`DATABASE_URL` is `database_url`). An empty
/// value counts as unset, in every layer.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Settings {
    #[serde(default, deserialize_with = "text", skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    #[serde(default, deserialize_with = "text", skip_serializing_if = "Option::is_none")]
    pub database_url: Option<String>,
    #[serde(default, deserialize_with = "text", skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    #[serde(default, deserialize_with = "text", skip_serializing_if = "Option::is_none")]
    pub api_secret: Option<String>,
    #[serde(default, deserialize_with = "text", skip_serializing_if = "Option::is_none")]
    pub roles: Option<String>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub backfill_page_size: Option<i64>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub backfill_page_delay_ms: Option<u64>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub backfill_page_budget_ms: Option<u64>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub backfill_concurrency: Option<usize>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub worker_poll_ms: Option<u64>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub worker_heartbeat_secs: Option<u64>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub worker_reconcile_secs: Option<u64>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub backfill_max_attempts: Option<u32>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub backfill_backoff_base_ms: Option<u64>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub backfill_backoff_max_secs: Option<u64>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub webhook_retry_window_secs: Option<u64>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub webhook_backoff_base_ms: Option<u64>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub webhook_backoff_max_secs: Option<u64>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub webhook_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub webhook_circuit_threshold: Option<u32>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub webhook_probe_interval_ms: Option<u64>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub webhook_release_concurrency: Option<usize>,
    #[serde(default, deserialize_with = "text", skip_serializing_if = "Option::is_none")]
    pub log_format: Option<String>,
    #[serde(default, deserialize_with = "text", skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<String>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub request_timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<usize>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub max_ws_connections: Option<usize>,
    #[serde(default, deserialize_with = "text", skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<String>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub rate_limit_flush_ms: Option<u64>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub ws_connections_per_user: Option<usize>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub ws_client_events_per_minute: Option<u32>,
    pub storage: Option<String>,
    #[serde(default, deserialize_with = "number", skip_serializing_if = "Option::is_none")]
    pub max_upload_bytes: Option<u64>,
    #[serde(default, deserialize_with = "text", skip_serializing_if = "Option::is_none")]
    pub public_url: Option<String>,
}

/// A value as text. The environment and the file hold text that figment reads as numbers or
/// booleans where it can (`OFFSHOOT_API_KEY=12345`); a string setting takes it back as text.
#[derive(Deserialize)]
#[serde(untagged)]
enum Scalar {
    Text(String),
    UInt(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
}

impl Scalar {
    fn into_text(self) -> String {
        match self {
            Scalar::Text(s) => s,
            Scalar::UInt(n) => n.to_string(),
            Scalar::Int(n) => n.to_string(),
            Scalar::Float(f) => f.to_string(),
            Scalar::Bool(b) => b.to_string(),
        }
    }
}

fn text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<Scalar>::deserialize(d)?.map(Scalar::into_text).filter(|s| !s.is_empty()))
}

fn number<'de, D: Deserializer<'de>, T: FromStr>(d: D) -> Result<Option<T>, D::Error> {
    match text(d)? {
        None => Ok(None),
        Some(s) => s.trim().parse().map(Some).map_err(|_| serde::de::Error::custom(format!("expected a whole number, got {s:?}"))),
    }
}

impl Config {
    /// Defaults, then the environment. Reads only; validates.
    pub fn from_env() -> anyhow::Result<Config> {
        Self::load(None, Settings::default())
    }

    /// Defaults, then `file` (if any), then the environment, then `flags`. Reads only;
    /// validates.
    pub fn load(file: Option<&Path>, flags: Settings) -> anyhow::Result<Config> {
        Self::from_figment(Self::figment(file, flags)?)
    }

    /// The layers: the config file, the environment, the flags (each wins over the one before).
    pub fn figment(file: Option<&Path>, flags: Settings) -> anyhow::Result<Figment> {
        let mut figment = Figment::new();
        if let Some(path) = file {
            figment = figment.merge(Serialized::defaults(read_env_file(path)?));
        }
        Ok(figment.merge(Env::prefixed("OFFSHOOT_")).merge(Env::raw().only(&["DATABASE_URL"])).merge(Serialized::defaults(flags)))
    }

    /// The layered settings over the defaults, checked.
    pub fn from_figment(figment: Figment) -> anyhow::Result<Config> {
        let s: Settings = figment.extract().context("reading the configuration")?;
        let mut c = Config::default();
        if let Some(v) = s.listen {
            c.listen = v;
        }
        if let Some(v) = s.database_url {
            c.database_url = v;
        }
        offshoot_store::Backend::from_url(&c.database_url).map_err(|e| anyhow::anyhow!("{e}"))?;
        anyhow::ensure!(s.api_key.is_some() == s.api_secret.is_some(), "set both OFFSHOOT_API_KEY and OFFSHOOT_API_SECRET, or neither");
        c.api_key = s.api_key;
        c.api_secret = s.api_secret.map(SecretString::from);
        if let Some(v) = s.roles {
            c.roles = Roles::parse(&v)?;
        }
        if let Some(v) = s.backfill_page_size {
            anyhow::ensure!(v > 0, "OFFSHOOT_BACKFILL_PAGE_SIZE must be positive");
            c.backfill_page_size = v;
        }
        if let Some(v) = s.backfill_page_delay_ms {
            c.backfill_page_delay = Duration::from_millis(v);
        }
        if let Some(v) = s.worker_poll_ms {
            c.worker_poll_interval = Duration::from_millis(v.max(10));
        }
        let w = &mut c.worker;
        if let Some(v) = s.worker_heartbeat_secs {
            anyhow::ensure!(v > 0, "OFFSHOOT_WORKER_HEARTBEAT_SECS must be positive");
            w.heartbeat = Duration::from_secs(v);
        }
        if let Some(v) = s.worker_reconcile_secs {
            w.reconcile_interval = Duration::from_secs(v.max(1));
        }
        if let Some(v) = s.backfill_page_budget_ms {
            anyhow::ensure!(v > 0, "OFFSHOOT_BACKFILL_PAGE_BUDGET_MS must be positive");
            w.backfill.page_budget = Duration::from_millis(v);
        }
        if let Some(v) = s.backfill_concurrency {
            anyhow::ensure!(v > 0, "OFFSHOOT_BACKFILL_CONCURRENCY must be positive");
            w.backfill.concurrency = v;
        }
        if let Some(v) = s.backfill_max_attempts {
            anyhow::ensure!(v > 0, "OFFSHOOT_BACKFILL_MAX_ATTEMPTS must be positive");
            w.backfill.max_attempts = v;
        }
        if let Some(v) = s.backfill_backoff_base_ms {
            w.backfill.backoff_base = Duration::from_millis(v);
        }
        if let Some(v) = s.backfill_backoff_max_secs {
            w.backfill.backoff_max = Duration::from_secs(v);
        }
        if let Some(v) = s.webhook_retry_window_secs {
            w.webhooks.retry_window = Duration::from_secs(v);
        }
        if let Some(v) = s.webhook_backoff_base_ms {
            w.webhooks.backoff_base = Duration::from_millis(v);
        }
        if let Some(v) = s.webhook_backoff_max_secs {
            w.webhooks.backoff_max = Duration::from_secs(v);
        }
        if let Some(v) = s.webhook_timeout_ms {
            anyhow::ensure!(v > 0, "OFFSHOOT_WEBHOOK_TIMEOUT_MS must be positive");
            w.webhooks.attempt_timeout = Duration::from_millis(v);
        }
        if let Some(v) = s.webhook_circuit_threshold {
            anyhow::ensure!(v > 0, "OFFSHOOT_WEBHOOK_CIRCUIT_THRESHOLD must be positive");
            w.webhooks.circuit_threshold = v;
        }
        if let Some(v) = s.webhook_probe_interval_ms {
            anyhow::ensure!(v > 0, "OFFSHOOT_WEBHOOK_PROBE_INTERVAL_MS must be positive");
            w.webhooks.probe_interval = Duration::from_millis(v);
        }
        if let Some(v) = s.webhook_release_concurrency {
            anyhow::ensure!(v > 0, "OFFSHOOT_WEBHOOK_RELEASE_CONCURRENCY must be positive");
            w.webhooks.release_concurrency = v;
        }
        if let Some(v) = s.log_format {
            c.log_format = match v.to_ascii_lowercase().as_str() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                other => anyhow::bail!("OFFSHOOT_LOG_FORMAT must be text or json, not {other:?}"),
            };
        }
        if let Some(v) = s.metrics_listen {
            c.metrics = match v.as_str() {
                "off" => MetricsListen::Off,
                "main" => MetricsListen::Main,
                addr => MetricsListen::Separate(addr.to_string()),
            };
        }
        if let Some(v) = s.request_timeout_ms {
            anyhow::ensure!(v > 0, "OFFSHOOT_REQUEST_TIMEOUT_MS must be positive");
            c.request_timeout = Duration::from_millis(v);
        }
        if let Some(v) = s.max_body_bytes {
            anyhow::ensure!(v >= 1024, "OFFSHOOT_MAX_BODY_BYTES must be at least 1024");
            c.max_body_bytes = v;
        }
        if let Some(v) = s.max_ws_connections {
            c.max_ws_connections = v;
        }
        if let Some(v) = s.rate_limits {
            c.rate_limits =
                offshoot_api::ratelimit::RateLimitConfig::parse(&v).map_err(|e| anyhow::anyhow!("OFFSHOOT_RATE_LIMITS: {e}"))?;
        }
        if let Some(v) = s.rate_limit_flush_ms {
            anyhow::ensure!(v >= 10, "OFFSHOOT_RATE_LIMIT_FLUSH_MS must be at least 10");
            c.rate_limit_flush = Duration::from_millis(v);
        }
        if let Some(v) = s.ws_connections_per_user {
            anyhow::ensure!(v > 0, "OFFSHOOT_WS_CONNECTIONS_PER_USER must be positive");
            c.ws_connections_per_user = v;
        }
        if let Some(v) = s.ws_client_events_per_minute {
            anyhow::ensure!(v > 0, "OFFSHOOT_WS_CLIENT_EVENTS_PER_MINUTE must be positive");
            c.ws_client_events_per_minute = v;
        }
        if let Some(v) = s.storage {
            anyhow::ensure!(
                v.starts_with("file://") || v.starts_with("s3://"),
                "OFFSHOOT_STORAGE must be file://DIR or s3://BUCKET?…, not {v:?}"
            );
            c.storage = Some(v);
        }
        if let Some(v) = s.max_upload_bytes {
            anyhow::ensure!(v >= 1024, "OFFSHOOT_MAX_UPLOAD_BYTES must be at least 1024");
            c.max_upload_bytes = v;
        }
        if let Some(v) = s.public_url {
            anyhow::ensure!(
                v.starts_with("http://") || v.starts_with("https://"),
                "OFFSHOOT_PUBLIC_URL must be an http:// or https:// URL"
            );
            c.public_url = Some(v.trim_end_matches('/').to_string());
        }
        Ok(c)
    }

    /// The storage setting in force: [`Config::storage`], or the `offshoot-files` directory
    /// next to the SQLite database file (the working directory's on PostgreSQL).
    pub fn storage_setting(&self) -> String {
        if let Some(s) = &self.storage {
            return s.clone();
        }
        let file = self.database_url.strip_prefix("sqlite://").or_else(|| self.database_url.strip_prefix("sqlite:"));
        let dir = file
            .map(|f| f.split('?').next().unwrap_or(f))
            .filter(|f| !f.is_empty() && *f != ":memory:")
            .and_then(|f| Path::new(f).parent().map(Path::to_path_buf))
            .map(|p| if p.as_os_str().is_empty() { Path::new(".").to_path_buf() } else { p })
            .unwrap_or_else(|| Path::new(".").to_path_buf());
        format!("file://{}", dir.join("offshoot-files").display())
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

/// A config file in env-file form (`KEY=value`, `#` comments, quotes, `export`; dotenvy
/// parses it without touching the process's environment), keyed as the environment layer is:
/// `OFFSHOOT_` taken off, lower case.
fn read_env_file(path: &Path) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let entries = dotenvy::from_path_iter(path).with_context(|| format!("reading the config file {}", path.display()))?;
    let mut out = std::collections::BTreeMap::new();
    for entry in entries {
        let (k, v) = entry.with_context(|| format!("in the config file {}", path.display()))?;
        let key = k.strip_prefix("OFFSHOOT_").unwrap_or(&k).to_ascii_lowercase();
        out.insert(key, v);
    }
    Ok(out)
}

#[cfg(test)]
// figment::Jail's closures return figment's own (large) error type.
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;
    use figment::Jail;
    use secrecy::ExposeSecret;

    #[test]
    fn each_layer_overrides_the_one_before_defaults_file_environment_flags() {
        Jail::expect_with(|jail| {
            jail.create_file(
                "offshoot.env",
                "# comment\nOFFSHOOT_LISTEN=127.0.0.1:4000\nexport OFFSHOOT_ROLES='worker'\nOFFSHOOT_BACKFILL_PAGE_SIZE=\"250\"\nOFFSHOOT_MAX_WS_CONNECTIONS=7\nOFFSHOOT_BACKFILL_PAGE_BUDGET_MS=9\nOFFSHOOT_BACKFILL_CONCURRENCY=2\n",
            )?;
            jail.set_env("OFFSHOOT_LISTEN", "127.0.0.1:5000");
            jail.set_env("OFFSHOOT_BACKFILL_PAGE_SIZE", "300");
            jail.set_env("OFFSHOOT_API_KEY", "12345");
            jail.set_env("OFFSHOOT_API_SECRET", "s3cret");
            jail.set_env("OFFSHOOT_REQUEST_TIMEOUT_MS", "");
            jail.set_env("OFFSHOOT_RATE_LIMITS", "SendMessage=2000,user=120");
            let flags = Settings { backfill_page_size: Some(400), ..Default::default() };
            let c = Config::load(Some(Path::new("offshoot.env")), flags).map_err(|e| e.to_string())?;
            assert_eq!(c.listen, "127.0.0.1:5000", "the environment wins over the file");
            assert_eq!(c.roles, Roles { api: false, ws: false, worker: true }, "the file wins over the defaults");
            assert_eq!(c.max_ws_connections, 7);
            assert_eq!(c.worker_config().backfill.page_budget, Duration::from_millis(9), "the page budget reaches the worker");
            assert_eq!(c.worker_config().backfill.concurrency, 2, "the backfills at once reach the worker");
            assert_eq!(c.backfill_page_size, 400, "a flag wins over the environment");
            assert_eq!(c.api_key.as_deref(), Some("12345"), "a key of digits stays text");
            assert_eq!(c.api_secret.as_ref().map(|s| s.expose_secret()), Some("s3cret"));
            assert_eq!(c.request_timeout, Duration::from_secs(30), "an empty value is unset: the default stays");
            assert_eq!(c.database_url, "sqlite://offshoot.db?mode=rwc");
            assert_eq!((c.rate_limits.endpoints["SendMessage"], c.rate_limits.user), (2000, 120), "the limits table is overridden");
            assert_eq!(c.rate_limits.endpoints["Connect"], 10_000, "what the override does not name keeps Stream's default");
            Ok(())
        });
    }

    /// A dead worker's jobs are started elsewhere within 10 s by default; the heartbeat
    /// setting, from the file or the environment, moves that bound.
    #[test]
    fn the_worker_takeover_is_under_ten_seconds_by_default_and_follows_the_heartbeat_setting() {
        Jail::expect_with(|jail| {
            let c = Config::load(None, Settings::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.worker_config().heartbeat, Duration::from_secs(2));
            assert!(c.worker_config().takeover_bound() <= Duration::from_secs(10), "{:?}", c.worker_config().takeover_bound());
            jail.create_file("offshoot.env", "OFFSHOOT_WORKER_HEARTBEAT_SECS=30\n")?;
            let c = Config::load(Some(Path::new("offshoot.env")), Settings::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.worker_config().heartbeat, Duration::from_secs(30), "from the file");
            assert_eq!(c.worker_config().takeover_bound(), Duration::from_secs(30 * 4 + 1));
            jail.set_env("OFFSHOOT_WORKER_HEARTBEAT_SECS", "1");
            jail.set_env("OFFSHOOT_WORKER_POLL_MS", "500");
            let c = Config::load(Some(Path::new("offshoot.env")), Settings::default()).map_err(|e| e.to_string())?;
            assert_eq!(c.worker_config().heartbeat, Duration::from_secs(1), "the environment wins over the file");
            assert_eq!(c.worker_config().takeover_bound(), Duration::from_millis(4_500));
            jail.set_env("OFFSHOOT_WORKER_HEARTBEAT_SECS", "0");
            assert!(Config::load(None, Settings::default()).is_err(), "a heartbeat of 0 is refused");
            Ok(())
        });
    }

    #[test]
    fn the_secret_is_redacted_when_the_config_is_logged() {
        let c = Config {
            api_secret: Some(SecretString::from("hunter2-secret")),
            database_url: "postgres://u:pw@h/db".into(),
            ..Config::default()
        };
        let shown = format!("{c:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("pw@"), "{shown}");
    }

    #[test]
    fn a_bad_value_in_any_layer_is_refused() {
        Jail::expect_with(|jail| {
            jail.create_file("bad.env", "OFFSHOOT_BACKFILL_PAGE_SIZE=0\n")?;
            assert!(Config::load(Some(Path::new("bad.env")), Settings::default()).is_err(), "a page size of 0 is refused");
            jail.create_file("worse.env", "not a pair\n")?;
            assert!(Config::load(Some(Path::new("worse.env")), Settings::default()).is_err(), "a line without = is refused");
            jail.create_file("zero.env", "OFFSHOOT_BACKFILL_PAGE_BUDGET_MS=0\n")?;
            assert!(Config::load(Some(Path::new("zero.env")), Settings::default()).is_err(), "a page budget of 0 is refused");
            jail.create_file("none.env", "OFFSHOOT_BACKFILL_CONCURRENCY=0\n")?;
            assert!(Config::load(Some(Path::new("none.env")), Settings::default()).is_err(), "no backfills at once is refused");
            jail.create_file("limits.env", "OFFSHOOT_RATE_LIMITS=SendMesage=5\n")?;
            assert!(Config::load(Some(Path::new("limits.env")), Settings::default()).is_err(), "an unknown endpoint name is refused");
            jail.set_env("OFFSHOOT_WEBHOOK_TIMEOUT_MS", "soon");
            assert!(Config::load(None, Settings::default()).is_err(), "a word where a number belongs is refused");
            Ok(())
        });
    }
}
