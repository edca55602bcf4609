//! Group commit of message writes. An agent streams its answer as a partial update of one
//! message twenty times a second, and a busy app sends hundreds of messages a second; each
//! write alone is a transaction of its own (lock, read, write, outbox, commit and its disk
//! flush), and two cores ran out at about 1,000 updates or 750 sends a second (BENCHMARKS.md,
//! "Method", figures e and f; docs/performance.md, "Group commit"). Here the writes that arrive while earlier ones are being written wait in a
//! queue of their kind and are written together, in one transaction, by the next free writer:
//! a lone write is written at once, a stream of them in groups whose size follows the load.
//!
//! Each write keeps its own outcome: one that fails alone (an update naming a missing message,
//! a change that refuses) fails and the others are written. If the group's transaction fails as
//! a whole (a deadlock that outlives its retries, a refused write, a send refused midway),
//! nothing of it was committed and each of its writes is written again alone, in arrival order,
//! with the outcome it would have had without the group.
//!
//! Writes are taken in arrival order. A message's updates are applied to it in that order, each
//! announced with the message as it was after it: updates of one message in one group are
//! applied in order, and a message with updates in a group being written has its later updates
//! wait for that group (two writers run at once on PostgreSQL, and the later group could
//! otherwise take the channel's lock first).

use crate::{Result, Store};
use futures_util::FutureExt;
use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

/// A kind of write that is written in groups.
pub(crate) trait Work: Sized + Send + Sync + 'static {
    type Output: Send + 'static;
    /// The `kind` label of this kind's group metrics.
    const KIND: &'static str;
    /// The store's queue of this kind.
    fn groups(store: &Store) -> &Groups<Self>;
    /// What two groups being written at once must not both hold (a message's updates), if any.
    fn key(&self) -> Option<&str> {
        None
    }
    /// The write in a transaction of its own (retried when it loses to a concurrent writer).
    fn alone(&self, store: &Store) -> impl Future<Output = Result<Self::Output>> + Send;
    /// The writes of `group` in one transaction (retried likewise): the outcome of each, in
    /// order, or the transaction's error when it failed as a whole.
    fn together(store: &Store, group: &[Self]) -> impl Future<Output = Result<Vec<Result<Self::Output>>>> + Send;
}

/// The outcome of each write of `group`, in order: written together, or each alone when the
/// group's transaction failed as a whole.
async fn write_group<W: Work>(store: &Store, group: &[W]) -> Vec<Result<W::Output>> {
    if let [w] = group {
        return vec![w.alone(store).await];
    }
    match W::together(store, group).await {
        Ok(outcomes) => outcomes,
        Err(e) => {
            tracing::debug!(error = %e, writes = group.len(), "a group of writes failed; writing each alone");
            let mut outcomes = Vec::with_capacity(group.len());
            for w in group {
                outcomes.push(w.alone(store).await);
            }
            outcomes
        }
    }
}

/// One write waiting for a writer.
struct Pending<W: Work> {
    work: W,
    /// The outcome, and the statements it took (`counted.rs`; a group's go to its first write).
    reply: oneshot::Sender<(Result<W::Output>, u64)>,
}

/// The most writes one group holds: its statements stay far below either engine's parameter
/// limit and its transaction short.
pub(crate) const MAX_GROUP: usize = 128;

/// The queue of one kind of write and the writers that drain it.
pub(crate) struct Groups<W: Work> {
    queue: Mutex<Queue<W>>,
    /// Groups being written at once (`lib.rs`, `group_writers`).
    writers: Arc<Semaphore>,
}

struct Queue<W: Work> {
    waiting: VecDeque<Pending<W>>,
    /// Keys of the writes in a group being written. Later writes with one of them wait for that
    /// group to end (its writer takes them next), so two groups written at once never hold
    /// updates of one message, and a message's updates are applied in the order they arrived.
    in_flight: HashSet<String>,
}

impl<W: Work> Groups<W> {
    pub(crate) fn new(writers: usize) -> Groups<W> {
        Groups {
            queue: Mutex::new(Queue { waiting: VecDeque::new(), in_flight: HashSet::new() }),
            writers: Arc::new(Semaphore::new(writers.max(1))),
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue<W>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next group: up to [`MAX_GROUP`] waiting writes in arrival order, passing over those
    /// whose key is in another writer's group. Its keys are in flight until its [`Flight`] is dropped.
    fn take(&self) -> Vec<Pending<W>> {
        let mut q = self.queue();
        let mut group = Vec::new();
        let mut passed = VecDeque::new();
        while let Some(p) = q.waiting.pop_front() {
            if group.len() < MAX_GROUP && !p.work.key().is_some_and(|k| q.in_flight.contains(k)) {
                group.push(p);
            } else {
                passed.push_back(p);
            }
        }
        q.waiting = passed;
        for p in &group {
            if let Some(k) = p.work.key() {
                q.in_flight.insert(k.to_string());
            }
        }
        group
    }

    /// Whether a write waits that a new writer could take now.
    fn has_ready(&self) -> bool {
        let q = self.queue();
        q.waiting.iter().any(|p| !p.work.key().is_some_and(|k| q.in_flight.contains(k)))
    }
}

/// The keys of a group being written; no longer in flight once it is dropped (also when the
/// writer's task panics, so their later writes are not held for ever).
struct Flight<'a, W: Work> {
    groups: &'a Groups<W>,
    keys: Vec<String>,
}

impl<W: Work> Drop for Flight<'_, W> {
    fn drop(&mut self) {
        let mut q = self.groups.queue();
        for k in &self.keys {
            q.in_flight.remove(k);
        }
    }
}

impl Store {
    /// Queues a write and waits for its outcome.
    pub(crate) async fn grouped<W: Work>(&self, work: W) -> Result<W::Output> {
        let (reply, outcome) = oneshot::channel();
        W::groups(self).queue().waiting.push_back(Pending { work, reply });
        self.start_writer::<W>();
        match outcome.await {
            Ok((outcome, statements)) => {
                crate::counted::add(statements);
                outcome
            }
            // The writer gave no answer (writing its group panicked, `write_queued`): the caller
            // is told as with a connection lost.
            Err(_) => Err(crate::StoreError::Unavailable(sqlx::Error::WorkerCrashed)),
        }
    }

    /// Starts a writer of queued writes of kind `W` when one is free. The writer runs as a task
    /// of its own, so a request that stops waiting never cuts a group short.
    fn start_writer<W: Work>(&self) {
        let Ok(turn) = W::groups(self).writers.clone().try_acquire_owned() else { return };
        let store = self.clone();
        drop(tokio::spawn(async move { store.write_queued::<W>(turn).await }));
    }

    async fn write_queued<W: Work>(self, turn: OwnedSemaphorePermit) {
        let groups = W::groups(&self);
        loop {
            let group = groups.take();
            if group.is_empty() {
                break;
            }
            let _flight = Flight { groups, keys: group.iter().filter_map(|p| p.work.key().map(str::to_string)).collect() };
            let (works, replies): (Vec<W>, Vec<_>) = group.into_iter().map(|p| (p.work, p.reply)).unzip();
            // A write that panics fails its group, not the writer: the group's transaction is
            // rolled back, its writes are answered as with a lost connection, and the writer
            // goes on with the queue (which would otherwise wait for the next write to arrive).
            let started = std::time::Instant::now();
            let written = AssertUnwindSafe(crate::count_statements(write_group(&self, &works))).catch_unwind().await;
            let took = started.elapsed();
            tracing::debug!(target: "offshoot_store::groups", writes = works.len(), micros = took.as_micros() as u64, "group written");
            // A writer's seconds per second is how busy it is (README "Operating").
            metrics::counter!("offshoot_write_groups_total", "kind" => W::KIND).increment(1);
            metrics::counter!("offshoot_write_group_writes_total", "kind" => W::KIND).increment(works.len() as u64);
            metrics::histogram!("offshoot_write_group_seconds", "kind" => W::KIND).record(took.as_secs_f64());
            let Ok((outcomes, statements)) = written else {
                tracing::error!(writes = works.len(), "writing a group of message writes panicked; its writes fail");
                continue;
            };
            let mut statements = Some(statements);
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send((outcome, statements.take().unwrap_or(0)));
            }
        }
        drop(turn);
        // A write queued after the last look but before the turn was given back found no free
        // writer: it is written now. (One waiting for another writer's group is taken by that
        // writer when its group ends.)
        if groups.has_ready() {
            self.start_writer::<W>();
        }
    }
}
