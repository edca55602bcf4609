//! The backfill loop: copies the older history of every backfilling fork, page by page.
//! Each page is one transaction with its cursor, so a crash at any point resumes from the
//! last committed page without losing or duplicating a copy. Several workers (processes) may
//! run at once: on PostgreSQL a page locks its fork row, on SQLite writes are serialised.

use offshoot_store::{BackfillStep, Store};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinSet;
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

/// Forks copied at the same time by one worker.
const PARALLEL_FORKS: usize = 4;

/// Runs until `shutdown`. `wake` is notified by the API when it creates a backfilling fork.
/// Every pass re-reads the backfilling forks from the database, so a fork whose wake-up was
/// lost (a crash between commit and notify, another process) is picked up by the next poll.
pub async fn run(store: Store, config: BackfillConfig, wake: Arc<Notify>, shutdown: CancellationToken) {
    tracing::info!(page_size = config.page_size, "backfill worker started");
    let mut running: HashSet<String> = HashSet::new();
    let mut tasks: JoinSet<String> = JoinSet::new();
    loop {
        match store.backfilling_forks().await {
            Ok(forks) => {
                for cid in forks {
                    if running.len() >= PARALLEL_FORKS {
                        break;
                    }
                    if running.insert(cid.clone()) {
                        let (store, config, shutdown) = (store.clone(), config.clone(), shutdown.clone());
                        tasks.spawn(async move {
                            drain(&store, &config, &cid, &shutdown).await;
                            cid
                        });
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "listing backfilling forks failed"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = wake.notified() => {}
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                if let Ok(cid) = done {
                    running.remove(&cid);
                }
            }
            _ = tokio::time::sleep(config.poll_interval) => {}
        }
        while let Some(done) = tasks.try_join_next() {
            if let Ok(cid) = done {
                running.remove(&cid);
            }
        }
    }
    // Let in-flight pages commit; each drain stops at its next page boundary.
    while tasks.join_next().await.is_some() {}
}

/// Copies pages of one fork until it is finished, gone, or shutdown is requested.
async fn drain(store: &Store, config: &BackfillConfig, cid: &str, shutdown: &CancellationToken) {
    loop {
        let started = std::time::Instant::now();
        let step = store.backfill_step(cid, config.page_size).await;
        tracing::debug!(fork = cid, elapsed_ms = started.elapsed().as_secs_f64() * 1000.0, "backfill page");
        match step {
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
