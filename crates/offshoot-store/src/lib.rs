//! Offshoot's storage: one [`Store`] over SQLite (the embedded default) or PostgreSQL (the
//! scale-out backend), chosen from the database URL at start-up, with the migrations of each
//! and the transactional event outbox.
//!
//! Both backends share one implementation: the schema is the same on both sides (text, bigint
//! and boolean columns only), so every statement is written once with `$n` placeholders, which
//! both drivers accept. The few places where the engines differ (row locks, outbox ordering,
//! write serialisation on SQLite) branch on [`Backend`]. Two copies of every query would drift;
//! the conformance suite (`tests/conformance.rs`) runs every method on both backends.
//!
//! This crate may depend on `offshoot-core` and sqlx; it must not depend on axum, the API, the
//! worker or the WebSocket crates.

mod channels;
mod events;
mod forks;
mod messages;
mod rows;
mod users;

pub use channels::{ChannelFilter, MemberInput, NewChannel, ReadState};
pub use forks::{BackfillStep, ForkOutcome, ForkRequest};
pub use messages::{is_visible, Page, PageDir};
pub use users::UserInput;

use offshoot_core::{Error, ErrorKind};
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{Any, AnyPool, Executor, Transaction};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, Notify, OwnedMutexGuard};

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn from_url(url: &str) -> Backend {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else {
            Backend::Sqlite
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// Errors at the storage edge. Nothing above this crate looks at `sqlx::Error`.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Domain(#[from] Error),
    #[error("unique constraint violated: {0}")]
    Conflict(String),
    #[error("database error: {0}")]
    Db(sqlx::Error),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &e {
            if db.is_unique_violation() {
                return StoreError::Conflict(db.message().to_string());
            }
        }
        StoreError::Db(e)
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Domain(e) => e,
            StoreError::Conflict(c) => Error::input(format!("the request conflicts with existing data ({c})")),
            StoreError::Db(e) => {
                tracing::error!(error = %e, "database error");
                let mut err = Error::internal();
                if let sqlx::Error::PoolTimedOut = e {
                    err.message = "the database is busy, try again".into();
                }
                err
            }
        }
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Db(sqlx::Error::Decode(Box::new(e)))
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

pub(crate) fn domain<T>(e: Error) -> Result<T> {
    Err(StoreError::Domain(e))
}

pub(crate) fn not_found<T>(what: impl Into<String>) -> Result<T> {
    Err(StoreError::Domain(Error::new(ErrorKind::NotFound, what)))
}

/// The store. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// SQLite has one writer: write transactions of this process queue here instead of
    /// spinning on `SQLITE_BUSY`. Other processes on the same file still meet busy_timeout.
    write_lock: Option<Arc<Mutex<()>>>,
    /// Woken after every commit that wrote outbox events.
    events: Arc<Notify>,
    /// Woken when a fork starts backfilling.
    forks: Arc<Notify>,
    url: Arc<str>,
}

/// A write transaction.
pub(crate) struct Tx {
    pub(crate) tx: Transaction<'static, Any>,
    backend: Backend,
    wrote_events: bool,
    pub(crate) started_fork: bool,
    _guard: Option<OwnedMutexGuard<()>>,
}

impl Tx {
    pub(crate) async fn commit(self, store: &Store) -> Result<()> {
        let (wrote, forked) = (self.wrote_events, self.started_fork);
        let mut tx = self.tx;
        if self.backend == Backend::Postgres {
            // NOTIFY is transactional: other processes hear it when this commits.
            if wrote {
                sqlx::query("SELECT pg_notify('offshoot_events', '')").execute(&mut *tx).await?;
            }
            if forked {
                sqlx::query("SELECT pg_notify('offshoot_forks', '')").execute(&mut *tx).await?;
            }
        }
        tx.commit().await?;
        if wrote {
            store.events.notify_waiters();
        }
        if forked {
            store.forks.notify_one();
        }
        Ok(())
    }
}

impl Store {
    /// Connects, applies the migrations and returns the store.
    pub async fn connect(url: &str) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let backend = Backend::from_url(url);
        let pool = match backend {
            Backend::Sqlite => {
                AnyPoolOptions::new()
                    .max_connections(4)
                    .acquire_timeout(Duration::from_secs(30))
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            conn.execute("PRAGMA journal_mode = WAL").await?;
                            conn.execute("PRAGMA busy_timeout = 15000").await?;
                            conn.execute("PRAGMA synchronous = NORMAL").await?;
                            Ok(())
                        })
                    })
                    .connect(url)
                    .await?
            }
            Backend::Postgres => {
                AnyPoolOptions::new()
                    .max_connections(16)
                    .acquire_timeout(Duration::from_secs(30))
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            // Prepared statements would switch to generic plans, which cannot
                            // see that `cid = $1` is selective and scan whole indexes; plan each
                            // execution with its values instead (a fraction of a millisecond).
                            conn.execute("SET plan_cache_mode = force_custom_plan").await?;
                            Ok(())
                        })
                    })
                    .connect(url)
                    .await?
            }
        };
        let migrator = match backend {
            Backend::Sqlite => &SQLITE_MIGRATIONS,
            Backend::Postgres => &POSTGRES_MIGRATIONS,
        };
        migrator.run(&pool).await.map_err(|e| StoreError::Db(e.into()))?;
        Ok(Store {
            pool,
            backend,
            write_lock: (backend == Backend::Sqlite).then(|| Arc::new(Mutex::new(()))),
            events: Arc::new(Notify::new()),
            forks: Arc::new(Notify::new()),
            url: url.into(),
        })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// Resolves when an outbox event was committed by this process (or a timeout elapses
    /// on the caller's side). Consumers always re-read the outbox from their cursor.
    pub fn event_notify(&self) -> Arc<Notify> {
        self.events.clone()
    }

    /// Notified when a fork starts backfilling (here, or in another process on PostgreSQL).
    pub fn fork_notify(&self) -> Arc<Notify> {
        self.forks.clone()
    }

    /// On PostgreSQL, relays `LISTEN offshoot_events` / `offshoot_forks` from other processes
    /// to [`Store::event_notify`] and [`Store::fork_notify`] until `shutdown`. Consumers still
    /// poll, so a lost notification only delays, never loses, work. No-op on SQLite.
    pub async fn relay_notifications(&self, shutdown: impl std::future::Future<Output = ()>) {
        if self.backend != Backend::Postgres {
            return shutdown.await;
        }
        let relay = async {
            loop {
                match sqlx::postgres::PgListener::connect(&self.url).await {
                    Ok(mut l) => {
                        if let Err(e) = l.listen_all(["offshoot_events", "offshoot_forks"]).await {
                            tracing::warn!(error = %e, "LISTEN failed");
                        } else {
                            while let Ok(n) = l.recv().await {
                                if n.channel() == "offshoot_forks" {
                                    self.forks.notify_one();
                                } else {
                                    self.events.notify_waiters();
                                }
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "connecting the notification listener failed"),
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        };
        tokio::select! {
            _ = shutdown => {}
            _ = relay => {}
        }
    }

    pub(crate) async fn begin(&self) -> Result<Tx> {
        let guard = match &self.write_lock {
            Some(lock) => Some(lock.clone().lock_owned().await),
            None => None,
        };
        let tx = match self.backend {
            Backend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => self.pool.begin().await?,
        };
        Ok(Tx { tx, backend: self.backend, wrote_events: false, started_fork: false, _guard: guard })
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// `SELECT 1`, for readiness.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// The app's key pair and settings; creates the app row on first start. A configured key
    /// pair replaces the stored one; with none configured, a pair is generated once.
    pub async fn ensure_app(&self, key: Option<&str>, secret: Option<&str>) -> Result<(String, String, bool)> {
        let mut tx = self.begin().await?;
        let row: Option<AnyRow> = sqlx::query("SELECT api_key, api_secret FROM app WHERE id = 1").fetch_optional(&mut *tx.tx).await?;
        let now = offshoot_core::time::now();
        let result = match (row, key, secret) {
            (Some(_), Some(k), Some(s)) => {
                sqlx::query("UPDATE app SET api_key = $1, api_secret = $2, updated_at = $3 WHERE id = 1")
                    .bind(k.to_string())
                    .bind(s.to_string())
                    .bind(now)
                    .execute(&mut *tx.tx)
                    .await?;
                (k.to_string(), s.to_string(), false)
            }
            (Some(row), _, _) => (rows::get_str(&row, "api_key")?, rows::get_str(&row, "api_secret")?, false),
            (None, k, s) => {
                let generated = k.is_none() || s.is_none();
                let k = k.map(str::to_string).unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string()[..12].to_string());
                let s =
                    s.map(str::to_string).unwrap_or_else(|| format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple()));
                let settings = serde_json::to_string(&offshoot_core::model::AppSettings::default())?;
                sqlx::query("INSERT INTO app (id, api_key, api_secret, settings, created_at, updated_at) VALUES (1, $1, $2, $3, $4, $4)")
                    .bind(k.clone())
                    .bind(s.clone())
                    .bind(settings)
                    .bind(now)
                    .execute(&mut *tx.tx)
                    .await?;
                (k, s, generated)
            }
        };
        tx.commit(self).await?;
        Ok(result)
    }

    pub async fn app_settings(&self) -> Result<offshoot_core::model::AppSettings> {
        let row: Option<AnyRow> = sqlx::query("SELECT settings FROM app WHERE id = 1").fetch_optional(&self.pool).await?;
        match row {
            Some(row) => Ok(serde_json::from_str(&rows::get_str(&row, "settings")?)?),
            None => Ok(Default::default()),
        }
    }

    pub async fn update_app_settings(&self, settings: &offshoot_core::model::AppSettings) -> Result<()> {
        let mut tx = self.begin().await?;
        sqlx::query("UPDATE app SET settings = $1, updated_at = $2 WHERE id = 1")
            .bind(serde_json::to_string(settings)?)
            .bind(offshoot_core::time::now())
            .execute(&mut *tx.tx)
            .await?;
        tx.commit(self).await
    }
}
