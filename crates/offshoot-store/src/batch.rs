//! Group commit of message updates. An agent streams its answer as a partial update of one
//! message twenty times a second; each update alone is a transaction of its own (lock, read,
//! write, hydrate, outbox, commit), and two cores ran out at about 1,000 of them a second
//! (BENCHMARKS.md, figure e). Here the updates that arrive while earlier ones are being written
//! wait in one queue and are written together, in one transaction, by the next free writer: a
//! lone update is written at once, a stream of them in groups whose size follows the load.
//!
//! Each update keeps its own outcome: one that names a missing message, or whose change refuses,
//! fails alone and the others are written. If the group's transaction fails as a whole (a
//! deadlock that outlives its retries, a refused write), nothing of it was committed and each of
//! its updates is written again alone, in arrival order, with the outcome it would have had
//! without the group.
//!
//! Updates are taken in arrival order, and a message's updates are applied to it in that order,
//! each announced with the message as it was after it: updates of one message in one group are
//! applied in order, and a message with updates in a group being written has its later updates
//! wait for that group (two writers run at once on PostgreSQL, and the later group could
//! otherwise take the channel's lock first).

use crate::messages::Editor;
use crate::{Result, Store};
use futures_util::FutureExt;
use offshoot_core::model::{Channel, Message};
use std::collections::{HashSet, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

/// A change of a stored message, given its channel as locked (it may run more than once: a
/// retried or regrouped write).
pub(crate) type ChangeFn = dyn Fn(&mut Message, &Channel) -> offshoot_core::error::Result<()> + Send + Sync;

/// A queued change.
pub(crate) type Change = Arc<ChangeFn>;

/// One update waiting for a writer.
pub(crate) struct Pending {
    pub(crate) id: String,
    pub(crate) editor: Editor,
    pub(crate) change: Change,
    /// The outcome, and the statements it took (`counted.rs`; a group's go to its first update).
    pub(crate) reply: oneshot::Sender<(Result<Message>, u64)>,
}

/// The most updates one group writes: its statements stay far below either engine's
/// parameter limit and its transaction short.
pub(crate) const MAX_GROUP: usize = 128;

/// The queue of updates and the writers that drain it.
pub(crate) struct Updates {
    queue: Mutex<Queue>,
    /// Groups being written at once: one on SQLite (one writer anyway), two on PostgreSQL (one
    /// group's statements run while the other's commit waits for its disk flush).
    writers: Arc<Semaphore>,
}

#[derive(Default)]
struct Queue {
    waiting: VecDeque<Pending>,
    /// Messages with updates in a group being written. Their later updates wait for that group
    /// to end (its writer takes them next), so two groups written at once never hold updates of
    /// one message, and a message's updates are applied in the order they arrived.
    in_flight: HashSet<String>,
}

impl Updates {
    pub(crate) fn new(writers: usize) -> Updates {
        Updates { queue: Mutex::default(), writers: Arc::new(Semaphore::new(writers.max(1))) }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, p: Pending) {
        self.queue().waiting.push_back(p);
    }

    /// The next group: up to [`MAX_GROUP`] waiting updates in arrival order, passing over those
    /// of messages in another writer's group. Its messages are in flight until its [`Flight`] is dropped.
    fn take(&self) -> Vec<Pending> {
        let mut q = self.queue();
        let mut group = Vec::new();
        let mut passed = VecDeque::new();
        while let Some(p) = q.waiting.pop_front() {
            if group.len() < MAX_GROUP && !q.in_flight.contains(&p.id) {
                group.push(p);
            } else {
                passed.push_back(p);
            }
        }
        q.waiting = passed;
        for p in &group {
            q.in_flight.insert(p.id.clone());
        }
        group
    }

    /// Whether an update waits that a new writer could take now.
    fn has_ready(&self) -> bool {
        let q = self.queue();
        q.waiting.iter().any(|p| !q.in_flight.contains(&p.id))
    }
}

/// The messages of a group being written; no longer in flight once it is dropped (also when
/// the writer's task panics, so their later updates are not held for ever).
struct Flight<'a> {
    updates: &'a Updates,
    ids: Vec<String>,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let mut q = self.updates.queue();
        for id in &self.ids {
            q.in_flight.remove(id);
        }
    }
}

impl Store {
    /// Queues an update and waits for its outcome.
    pub(crate) async fn update_grouped(&self, id: &str, editor: Editor, change: Change) -> Result<Message> {
        let (reply, outcome) = oneshot::channel();
        self.updates.push(Pending { id: id.to_string(), editor, change, reply });
        self.start_writer();
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

    /// Starts a writer of queued updates when one is free. The writer runs as a task of its own,
    /// so a request that stops waiting never cuts a group short.
    fn start_writer(&self) {
        let Ok(turn) = self.updates.writers.clone().try_acquire_owned() else { return };
        let store = self.clone();
        drop(tokio::spawn(async move { store.write_queued(turn).await }));
    }

    async fn write_queued(self, turn: OwnedSemaphorePermit) {
        loop {
            let group = self.updates.take();
            if group.is_empty() {
                break;
            }
            let _flight = Flight { updates: &self.updates, ids: group.iter().map(|p| p.id.clone()).collect() };
            // A change that panics fails its group, not the writer: the group's transaction is
            // rolled back, its updates are answered as with a lost connection, and the writer
            // goes on with the queue (which would otherwise wait for the next update to arrive).
            let written = AssertUnwindSafe(crate::count_statements(self.write_group(&group))).catch_unwind().await;
            let Ok((outcomes, statements)) = written else {
                tracing::error!(updates = group.len(), "writing a group of message updates panicked; its updates fail");
                continue;
            };
            let mut statements = Some(statements);
            for (p, outcome) in group.into_iter().zip(outcomes) {
                let _ = p.reply.send((outcome, statements.take().unwrap_or(0)));
            }
        }
        drop(turn);
        // An update queued after the last look but before the turn was given back found no
        // free writer: it is written now. (One waiting for another writer's group is taken by
        // that writer when its group ends.)
        if self.updates.has_ready() {
            self.start_writer();
        }
    }

    /// The outcome of each update of `group`, in order.
    async fn write_group(&self, group: &[Pending]) -> Vec<Result<Message>> {
        if let [p] = group {
            return vec![self.retrying("update_message", || self.update_message_once(&p.id, &p.editor, &*p.change)).await];
        }
        let items: Vec<(&str, &Editor, &Change)> = group.iter().map(|p| (p.id.as_str(), &p.editor, &p.change)).collect();
        match self.retrying("update_messages", || self.update_messages_once(&items)).await {
            Ok(outcomes) => outcomes,
            Err(e) => {
                tracing::info!(error = %e, updates = group.len(), "a group of message updates failed; writing each alone");
                let mut outcomes = Vec::with_capacity(group.len());
                for p in group {
                    outcomes.push(self.retrying("update_message", || self.update_message_once(&p.id, &p.editor, &*p.change)).await);
                }
                outcomes
            }
        }
    }
}
