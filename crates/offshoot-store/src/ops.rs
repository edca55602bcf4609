//! What an operator's metrics read from the database at scrape time (queue depths, lags, the
//! pool), and the fork counters recorded after the commits that change a fork's status.
//!
//! Counters go through the `metrics` facade: without an installed recorder (tests, tools)
//! they cost a no-op call.

use crate::{Result, Store};
use offshoot_core::model::{ForkStatus, ForkSummary};
use offshoot_core::time;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Outbox positions of consumers that keep their cursor in memory (the WebSocket fan-out of
/// this process), next to the durable cursors of the `outbox_cursor` table.
static MEMORY_CURSORS: Mutex<BTreeMap<&'static str, i64>> = Mutex::new(BTreeMap::new());

/// Records how far an in-memory consumer of the outbox has read, for `offshoot_outbox_lag_events`.
pub fn set_consumer_cursor(name: &'static str, seq: i64) {
    MEMORY_CURSORS.lock().unwrap_or_else(|e| e.into_inner()).insert(name, seq);
}

/// Database-derived gauges, read when `/metrics` is scraped.
#[derive(Debug, Clone, Default)]
pub struct OpsSnapshot {
    /// Forks still backfilling.
    pub backfilling_forks: i64,
    /// Age in seconds of the oldest backfilling fork (0 when none).
    pub backfill_lag_seconds: f64,
    /// Newest outbox sequence minus each consumer's cursor.
    pub outbox_lag: Vec<(String, i64)>,
    /// Connections of the pool: (in use, idle).
    pub pool_in_use: u32,
    pub pool_idle: u32,
}

impl Store {
    /// Reads the gauges of [`OpsSnapshot`]: a handful of small aggregate queries.
    pub async fn ops_snapshot(&self) -> Result<OpsSnapshot> {
        let now = time::now();
        let (backfilling_forks, oldest): (i64, i64) =
            sqlx::query_as("SELECT COUNT(*), COALESCE(MIN(created_at), 0) FROM fork WHERE status = 'backfilling'")
                .fetch_one(crate::counted(self.pool()))
                .await?;
        let backfill_lag_seconds = if backfilling_forks > 0 { (now - oldest).max(0) as f64 / 1e9 } else { 0.0 };
        let newest = self.last_event_seq().await?;
        let cursors: Vec<(String, i64)> =
            sqlx::query_as("SELECT name, seq FROM outbox_cursor ORDER BY name").fetch_all(crate::counted(self.pool())).await?;
        let mut outbox_lag: Vec<(String, i64)> = cursors.into_iter().map(|(name, seq)| (name, (newest - seq).max(0))).collect();
        for (name, seq) in MEMORY_CURSORS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            outbox_lag.push((name.to_string(), (newest - seq).max(0)));
        }
        let size = self.pool().size();
        let idle = u32::try_from(self.pool().num_idle()).unwrap_or(u32::MAX);
        Ok(OpsSnapshot { backfilling_forks, backfill_lag_seconds, outbox_lag, pool_in_use: size.saturating_sub(idle), pool_idle: idle })
    }
}

/// A fork reached a final status (after the commit that wrote it).
pub(crate) fn record_fork_finished(fork: &ForkSummary) {
    match fork.status {
        ForkStatus::Completed => metrics::counter!("offshoot_forks_completed_total").increment(1),
        ForkStatus::Failed => metrics::counter!("offshoot_forks_failed_total").increment(1),
        ForkStatus::Backfilling => return,
    }
    if fork.truncated {
        metrics::counter!("offshoot_forks_truncated_total").increment(1);
    }
}

/// One committed backfill page.
pub(crate) fn record_backfill_page(copied: i64) {
    metrics::counter!("offshoot_backfill_pages_total").increment(1);
    metrics::counter!("offshoot_backfill_messages_copied_total").increment(u64::try_from(copied).unwrap_or(0));
}
