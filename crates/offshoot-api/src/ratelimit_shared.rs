//! The cross-process part of the rate limits (PostgreSQL): a count per key and one-minute
//! window, kept locally and flushed to the `rate_limit_window` table every flush interval
//! (one upsert per key per flush, which also reads the global count back).
//!
//! A process admits a request while the global count it last read plus its own requests
//! since then stay under the limit. Each process's view is at most one flush interval old, so
//! with N processes a window admits at most `limit + N × r × interval` requests, where r is
//! the rate one process admits (README, "Rate limits"). A window resets at the minute.

use offshoot_store::Store;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// How often a process adds its counts to the shared rows, by default.
pub const DEFAULT_FLUSH: Duration = Duration::from_millis(250);

#[derive(Default, Clone, Copy)]
struct Count {
    /// Admitted here and not flushed yet.
    pending: u64,
    /// The window's count across processes at the last flush.
    global: u64,
}

/// The shared windows of one process.
#[derive(Default)]
pub struct Windows {
    counts: Mutex<HashMap<(String, i64), Count>>,
}

fn now_secs() -> i64 {
    offshoot_core::time::now() / 1_000_000_000
}

fn window_of(secs: i64) -> i64 {
    secs - secs.rem_euclid(60)
}

impl Windows {
    pub fn new() -> Windows {
        Windows::default()
    }

    /// Counts one request under `key` if the window has room: `Ok(remaining)`, or
    /// `Err(wait)` until the next window.
    pub fn admit(&self, key: &str, limit: u32) -> Result<u32, Duration> {
        let now = now_secs();
        let window = window_of(now);
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let c = counts.entry((key.to_string(), window)).or_default();
        let used = c.global + c.pending;
        if used >= u64::from(limit) {
            return Err(Duration::from_secs((window + 60 - now).max(1) as u64));
        }
        c.pending += 1;
        Ok((u64::from(limit) - used - 1) as u32)
    }

    /// What remains of `key`'s current window as this process sees it. A key not counted here
    /// yet is followed from now on (the next flush reads its global count).
    pub fn remaining(&self, key: &str, limit: u32) -> u32 {
        let window = window_of(now_secs());
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let c = counts.entry((key.to_string(), window)).or_default();
        u64::from(limit).saturating_sub(c.global + c.pending) as u32
    }

    /// Adds the pending counts to the shared rows and reads the global counts back; forgets
    /// past windows once flushed.
    pub async fn flush(&self, store: &Store) -> Result<(), offshoot_store::StoreError> {
        let current = window_of(now_secs());
        let rows: Vec<(String, i64, i64)> = {
            let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            counts
                .iter()
                .filter(|((_, w), c)| *w == current || c.pending > 0)
                .map(|((k, w), c)| (k.clone(), *w, c.pending as i64))
                .collect()
        };
        if rows.is_empty() {
            return Ok(());
        }
        let totals = store.add_rate_counts(&rows).await?;
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        for ((key, window, delta), (_, _, total)) in rows.into_iter().zip(totals) {
            if let Some(c) = counts.get_mut(&(key, window)) {
                c.pending = c.pending.saturating_sub(delta as u64);
                c.global = total.max(0) as u64;
            }
        }
        counts.retain(|(_, w), c| *w >= current || c.pending > 0);
        Ok(())
    }

    /// Flushes every `interval` until `stop` resolves, and prunes windows older than two
    /// minutes once a minute.
    pub async fn run(&self, store: Store, interval: Duration, stop: impl std::future::Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let mut last_prune = now_secs();
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep(interval) => {}
            }
            if let Err(e) = self.flush(&store).await {
                tracing::warn!(error = %e, "flushing the rate-limit counts failed; limits are counted locally until the next flush");
            }
            let now = now_secs();
            if now - last_prune >= 60 {
                last_prune = now;
                if let Err(e) = store.prune_rate_counts(window_of(now) - 120).await {
                    tracing::warn!(error = %e, "pruning the rate-limit windows failed");
                }
            }
        }
        let _ = self.flush(&store).await;
    }
}
