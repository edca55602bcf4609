//! The worker's metrics: one call at each point where a webhook attempt's outcome is known.
//! (Backfill pages and fork outcomes are counted by the store after the commits that write
//! them; queue depths are read from the database at scrape time.)
//!
//! | series | labels | when |
//! |---|---|---|
//! | `offshoot_webhook_deliveries_total` | `outcome`: `delivered`, `retried`, `failed` | each attempt |
//! | `offshoot_webhook_retries_total` | | an attempt failed and another is scheduled |
//! | `offshoot_webhook_dead_letters_total` | | a delivery was given up (no attempt left, or not retryable) |

/// How a webhook attempt ended, as the metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    Delivered,
    /// Failed; another attempt is scheduled.
    Retried,
    /// Failed for good: the delivery becomes a dead letter.
    Failed,
}

pub fn webhook_attempt(outcome: Attempt) {
    let label = match outcome {
        Attempt::Delivered => "delivered",
        Attempt::Retried => "retried",
        Attempt::Failed => "failed",
    };
    metrics::counter!("offshoot_webhook_deliveries_total", "outcome" => label).increment(1);
    match outcome {
        Attempt::Delivered => {}
        Attempt::Retried => metrics::counter!("offshoot_webhook_retries_total").increment(1),
        Attempt::Failed => metrics::counter!("offshoot_webhook_dead_letters_total").increment(1),
    }
}
