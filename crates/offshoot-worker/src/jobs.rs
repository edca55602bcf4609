//! The jobs the worker queues, as they are stored in apalis's tables: what `queue.rs` pushes
//! and what `backfill.rs` and `webhooks.rs` run.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackfillJob {
    pub fork_cid: String,
    /// Attempts that failed in a row before this one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl BackfillJob {
    pub fn new(fork_cid: &str) -> BackfillJob {
        BackfillJob { fork_cid: fork_cid.to_string(), failures: 0 }
    }
}

/// One delivery of one event to one endpoint, as queued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryJob {
    /// `X-Webhook-Id`: the same on every attempt and replay.
    pub id: String,
    pub url: String,
    pub event_type: String,
    pub seq: i64,
    /// The exact body, rendered when the event was queued; every attempt sends it unchanged.
    pub body: String,
    /// 1-based number of this attempt (`X-Webhook-Attempt`).
    pub attempt: u32,
    /// When the retry window started (Unix nanoseconds).
    pub window_start: i64,
    /// Why the previous attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Made due early because its endpoint answers again (`webhooks.rs`, "Catching up"): the
    /// endpoint's circuit does not hold it back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
}
