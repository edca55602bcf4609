//! The backfill loop: copies the older history of every backfilling fork, page by page.
//! Each page is one transaction with its cursor, so a crash at any point resumes from the
//! last committed page without losing or duplicating a copy. Several workers (processes) may
//! run at once: on PostgreSQL a page locks its fork row, on SQLite writes are serialised.

use offshoot_store::{BackfillStep, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub struct BackfillConfig {
    /// Messages copied per transaction.
    pub page_size: i64,
    /// Pause between pages (0 in production; tests use it to stop a worker mid-backfill).
    pub page_delay: Duration,
    /// How often to look for backfilling forks without being woken.
    pub poll_interval: Duration,
}

impl Default for BackfillConfig {
    fn default() -> Self {
        BackfillConfig { page_size: offshoot_core::fork::BACKFILL_PAGE, page_delay: Duration::ZERO, poll_interval: Duration::from_secs(1) }
    }
}

/// Runs until `shutdown`. `wake` is notified by the API when it creates a backfilling fork.
pub async fn run(store: Store, config: BackfillConfig, wake: Arc<Notify>, shutdown: CancellationToken) {
    tracing::info!(page_size = config.page_size, "backfill worker started");
    loop {
        let forks = match store.backfilling_forks().await {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(error = %e, "listing backfilling forks failed");
                Vec::new()
            }
        };
        for cid in forks {
            if shutdown.is_cancelled() {
                return;
            }
            drain(&store, &config, &cid, &shutdown).await;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = wake.notified() => {}
            _ = tokio::time::sleep(config.poll_interval) => {}
        }
    }
}

/// Copies pages of one fork until it is finished, gone, or shutdown is requested.
async fn drain(store: &Store, config: &BackfillConfig, cid: &str, shutdown: &CancellationToken) {
    loop {
        match store.backfill_step(cid, config.page_size).await {
            Ok(BackfillStep::More) => {}
            Ok(BackfillStep::Done) | Ok(BackfillStep::Gone) => return,
            Err(e) => {
                tracing::error!(fork = cid, error = %e, "backfill page failed; retrying later");
                return;
            }
        }
        if !config.page_delay.is_zero() {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(config.page_delay) => {}
            }
        } else if shutdown.is_cancelled() {
            return;
        }
    }
}
