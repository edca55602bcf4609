//! What the API asks of the job queue, without knowing which queue it is: the worker crate
//! implements [`Jobs`] over apalis; the API holds an `Arc<dyn Jobs>`.

use crate::Error;
use serde::Serialize;
use std::future::Future;
use std::pin::Pin;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Jobs of one queue by state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct JobCounts {
    pub queue: String,
    /// Waiting to run now.
    pub queued: i64,
    /// Taken by a worker.
    pub running: i64,
    /// Waiting for a later attempt (back-off, an open circuit).
    pub retrying: i64,
    /// Given up by the queue itself (a handler that kept erroring).
    pub failed: i64,
    /// Given up after the retry window (webhooks) or the last attempt (backfills: failed forks).
    pub dead_lettered: i64,
}

/// A webhook delivery given up after its retry window, kept for replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// The delivery's `X-Webhook-Id`; a replay sends it again.
    pub id: String,
    pub url: String,
    pub event_type: String,
    /// The event's position in the outbox.
    pub event_seq: i64,
    pub attempts: i64,
    pub last_error: String,
    /// Unix nanoseconds.
    pub first_attempt_at: i64,
    pub created_at: i64,
}

/// The job queue as the API sees it.
pub trait Jobs: Send + Sync {
    /// Queues the backfill of a fork whose transaction has committed. A lost call only delays
    /// the backfill: the worker's reconciler queues every backfilling fork without a job.
    fn enqueue_backfill<'a>(&'a self, fork_cid: &'a str) -> BoxFuture<'a, Result<(), Error>>;
    /// Dead-lettered webhook deliveries, newest first.
    fn dead_letters(&self, limit: i64, offset: i64) -> BoxFuture<'_, Result<Vec<DeadLetter>, Error>>;
    /// Queues the given dead-lettered deliveries (all of them when `ids` is `None`) for a new
    /// retry window, with the same `X-Webhook-Id`; returns how many were queued.
    fn replay_dead_letters<'a>(&'a self, ids: Option<&'a [String]>) -> BoxFuture<'a, Result<u64, Error>>;
    /// Jobs per queue and state.
    fn counts(&self) -> BoxFuture<'_, Result<Vec<JobCounts>, Error>>;
    /// Queues the files job, which frees the uploads no message refers to any more. A lost
    /// call only delays the freeing until the next files job.
    fn enqueue_files(&self) -> BoxFuture<'_, Result<(), Error>>;
}
