//! Where PostgreSQL's checkpoints fell during a backend's figures. After a checkpoint starts,
//! the first change of every page writes a whole page image to the WAL, and a spread
//! checkpoint writes for minutes beside the figures: in full runs, figure c's sends on
//! PostgreSQL were 5–7 times slower with a checkpoint running than the same figure alone
//! (docs/performance.md, "Disk writeback and checkpoints"; a stall of c also happens with none). The report counts the checkpoints by cause and names each completed one by its
//! span, so a figure's lines (each stamped with the time of day) can be set against them.
//!
//! `pg_stat_bgwriter` counts the checkpoints by cause; the control file's `checkpoint_time` (when
//! the last completed checkpoint began) is sampled every 250 ms, so each completed checkpoint is
//! named with its begin and the sample that saw it done. Two that complete within one sample
//! (a spread checkpoint hurried by `DROP DATABASE`'s) show as the later; PostgreSQL's log
//! (`log_checkpoints`) has every one.

use crate::server;
use anyhow::Result;
use sqlx::Row;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A running sampler; [`Watch::finish`] stops it and describes what it saw.
pub struct Watch {
    pool: sqlx::AnyPool,
    first: Counts,
    stop: CancellationToken,
    /// Each completed checkpoint seen: its begin and when it was seen done (UTC time of day).
    task: tokio::task::JoinHandle<Vec<(String, String)>>,
}

/// `pg_stat_bgwriter`'s checkpoints by cause.
struct Counts {
    timed: i64,
    requested: i64,
}

async fn counts(pool: &sqlx::AnyPool) -> Result<Counts> {
    let row = sqlx::query("SELECT checkpoints_timed, checkpoints_req FROM pg_stat_bgwriter").fetch_one(pool).await?;
    Ok(Counts { timed: row.try_get(0)?, requested: row.try_get(1)? })
}

/// When the last completed checkpoint began (UTC time of day).
async fn last_began(pool: &sqlx::AnyPool) -> Result<String> {
    Ok(sqlx::query_scalar("SELECT to_char(checkpoint_time AT TIME ZONE 'UTC', 'HH24:MI:SS') FROM pg_control_checkpoint()")
        .fetch_one(pool)
        .await?)
}

impl Watch {
    /// Starts watching the PostgreSQL server at `url`.
    pub async fn start(url: &str) -> Result<Watch> {
        let pool = server::connect(url, 2).await?;
        let first = counts(&pool).await?;
        let mut last = last_began(&pool).await?;
        let stop = CancellationToken::new();
        let (stopped, sampler) = (stop.clone(), pool.clone());
        let task = tokio::spawn(async move {
            let mut seen = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            while !stopped.is_cancelled() {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.cancelled() => {}
                }
                if let Ok(now) = last_began(&sampler).await {
                    if now != last {
                        seen.push((now.clone(), crate::clock()));
                        last = now;
                    }
                }
            }
            seen
        });
        Ok(Watch { pool, first, stop, task })
    }

    /// Stops the sampler; one line for the report.
    pub async fn finish(self) -> String {
        self.stop.cancel();
        let seen = self.task.await.unwrap_or_default();
        let by_cause = match counts(&self.pool).await {
            Ok(end) => format!("{} by time, {} requested", end.timed - self.first.timed, end.requested - self.first.requested),
            Err(e) => format!("not counted ({e})"),
        };
        self.pool.close().await;
        let each: Vec<String> = seen.iter().map(|(began, done)| format!("{began} → {done}")).collect();
        format!(
            "PostgreSQL checkpoints during these figures: {by_cause} (by WAL volume, or by a command such as the DROP DATABASE after each figure's server); completed ones, begin → seen done (UTC): {}",
            if each.is_empty() { "none".to_string() } else { each.join(", ") }
        )
    }
}
