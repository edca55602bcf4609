//! Where PostgreSQL's checkpoints fell during a backend's figures. After a checkpoint starts,
//! the first change of every page writes a whole page image to the WAL, and a spread
//! checkpoint writes for minutes beside the figures: in the full runs, figure c's sends were
//! 5–7 times slower on PostgreSQL than the same figure alone, with a checkpoint running
//! (BENCHMARKS.md, twentieth session 4). The report names each checkpoint, its cause and its
//! span, so a figure's lines (each stamped with the time of day) can be set against them.
//!
//! Sampled from the database every 250 ms: `pg_stat_bgwriter`'s counters rise when a
//! checkpoint begins (by its cause), and the control file's `checkpoint_time` (the time the
//! checkpoint began) changes when it completes.

use crate::server;
use anyhow::Result;
use sqlx::Row;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// One checkpoint seen by the sampler.
#[derive(Debug, Clone)]
struct Checkpoint {
    /// "time" (`checkpoint_timeout`) or "requested" (WAL volume, or a command such as
    /// `DROP DATABASE`).
    cause: &'static str,
    /// Its begin, from the control file once it completed, else when the sampler saw it begin.
    began: String,
    /// When the sampler saw it complete; `None` while it still runs.
    done_by: Option<String>,
}

/// A running sampler; [`Watch::finish`] stops it and describes what it saw.
pub struct Watch {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Vec<Checkpoint>>,
}

/// The counters and the control file's last checkpoint, at one moment.
#[derive(PartialEq)]
struct Sample {
    timed: i64,
    requested: i64,
    last_began: String,
}

async fn sample(pool: &sqlx::AnyPool) -> Result<Sample> {
    let row = sqlx::query(
        "SELECT b.checkpoints_timed, b.checkpoints_req, \
                to_char(c.checkpoint_time AT TIME ZONE 'UTC', 'HH24:MI:SS') \
         FROM pg_stat_bgwriter AS b, pg_control_checkpoint() AS c",
    )
    .fetch_one(pool)
    .await?;
    Ok(Sample { timed: row.try_get(0)?, requested: row.try_get(1)?, last_began: row.try_get(2)? })
}

fn time_of_day() -> String {
    let now = offshoot_core::time::to_rfc3339(offshoot_core::time::now());
    now.get(11..19).unwrap_or(&now).to_string()
}

impl Watch {
    /// Starts sampling the PostgreSQL server at `url`.
    pub async fn start(url: &str) -> Result<Watch> {
        let pool = server::connect(url, 1).await?;
        let mut last = sample(&pool).await?;
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut seen: Vec<Checkpoint> = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            while !stopped.is_cancelled() {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.cancelled() => {}
                }
                let Ok(now) = sample(&pool).await else { continue };
                for (cause, n) in [("time", now.timed - last.timed), ("requested", now.requested - last.requested)] {
                    for _ in 0..n.max(0) {
                        seen.push(Checkpoint { cause, began: format!("≈{}", time_of_day()), done_by: None });
                    }
                }
                if now.last_began != last.last_began {
                    // The oldest checkpoint still running is the one that completed (they run one
                    // at a time); one that began and ended between two samples has no entry yet.
                    match seen.iter_mut().find(|c| c.done_by.is_none()) {
                        Some(c) => {
                            c.began = now.last_began.clone();
                            c.done_by = Some(time_of_day());
                        }
                        None => seen.push(Checkpoint { cause: "unknown", began: now.last_began.clone(), done_by: Some(time_of_day()) }),
                    }
                }
                last = now;
            }
            pool.close().await;
            seen
        });
        Ok(Watch { stop, task })
    }

    /// Stops the sampler; one line for the report.
    pub async fn finish(self) -> String {
        self.stop.cancel();
        let seen = self.task.await.unwrap_or_default();
        if seen.is_empty() {
            return "PostgreSQL checkpoints during these figures: none".to_string();
        }
        let each: Vec<String> = seen
            .iter()
            .map(|c| match &c.done_by {
                Some(done) => format!("began {} ({}), done by {done}", c.began, c.cause),
                None => format!("began {} ({}), still running", c.began, c.cause),
            })
            .collect();
        format!(
            "PostgreSQL checkpoints during these figures (UTC; requested: by WAL volume or a command, as each DROP DATABASE between the figures' servers): {}",
            each.join("; ")
        )
    }
}
