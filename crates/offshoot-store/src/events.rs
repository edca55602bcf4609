//! The transactional outbox. Events are written in the transaction of the change they
//! announce; consumers read them in `seq` order from a cursor of their own. A row holds one
//! event, or one event and the notification that repeats it to members who do not watch its
//! channel ([`Note`]); both are read with the row's `seq`.

use crate::{Backend, Result, Store, Tx};
use offshoot_core::model::{Audience, Channel, Event, OutboxEvent};
use offshoot_core::time;
use serde::{Deserialize, Serialize};

impl Tx {
    /// Queues an event for the outbox; it is written when this transaction commits.
    pub(crate) async fn event(&mut self, event: Event, audience: Audience) -> Result<()> {
        self.events.push(Queued { event, audience, note: None });
        Ok(())
    }

    /// Queues an event and the notification that repeats it to `note.users` who do not watch
    /// its channel ([`Note`]): one outbox row, read back as the two events.
    pub(crate) async fn event_noted(&mut self, event: Event, audience: Audience, note: Note) -> Result<()> {
        self.events.push(Queued { event, audience, note: Some(note) });
        Ok(())
    }
}

/// An event waiting for its transaction's commit, with the notification stored beside it.
pub(crate) struct Queued {
    event: Event,
    audience: Audience,
    note: Option<Note>,
}

/// A `notification.*` event stored in the row of the channel event it repeats: a send's
/// `notification.message_new` is its `message.new` with the channel, for the members who do
/// not watch the channel. Written as two rows, each send stored its message twice, and the
/// outbox was most of what the database wrote under chat traffic (docs/performance.md,
/// "Outbox rows and compression"). What the notification carries is derived from the event by
/// [`Note::event`], the one rule for both the rows read back and the events kept in memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Note {
    /// The notification's type.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// Who hears it, on every connection they hold that does not watch the event's channel.
    pub(crate) users: Vec<String>,
    /// The channel it carries.
    pub(crate) channel: Channel,
}

impl Note {
    /// The notification of `event` (to `audience`): the event with this type and channel and
    /// without the fields the channel's watchers alone hear (`extra`: the `watcher_count`),
    /// to these users except the channel's watchers, with the event's unread counters.
    pub(crate) fn event(self, event: &Event, audience: &Audience) -> (Event, Audience) {
        let mut note = event.clone();
        note.kind = self.kind;
        note.channel = Some(self.channel);
        note.extra = Default::default();
        let audience = Audience {
            users: self.users,
            except_watchers_of: audience.watchers_of.clone(),
            unread: audience.unread.clone(),
            ..Default::default()
        };
        (note, audience)
    }
}

/// The events of one outbox row: its event, and the notification stored beside it. Both
/// carry the row's `seq`.
fn row_events(seq: i64, event: Event, audience: Audience, note: Option<Note>) -> Vec<std::sync::Arc<OutboxEvent>> {
    let noted = note.map(|n| n.event(&event, &audience));
    let mut events = vec![std::sync::Arc::new(OutboxEvent { seq, event, audience })];
    if let Some((event, audience)) = noted {
        events.push(std::sync::Arc::new(OutboxEvent { seq, event, audience }));
    }
    events
}

/// Writes a committing transaction's events. On PostgreSQL each writer takes the outbox lock
/// in *shared* mode with its first event and holds it until commit; writers do not wait for
/// each other, so their commits (and the disk flushes behind them) overlap. Their `seq` order is
/// then not commit order, and a consumer must not move its cursor past a `seq` whose
/// transaction may still commit: [`Store::events_after`] first takes the lock *exclusively*
/// for a moment ([`outbox_horizon`]), which waits out every writer that holds a drawn `seq`,
/// and reads only up to the sequence's value at that moment (unless this process's memory holds
/// the run after the cursor, [`Recent`]). The lock is the last one every transaction takes
/// (crate doc, lock order). The events are serialised before it is taken and written in the
/// statement that takes it (their `seq` follows their order in the statement's `VALUES`, which
/// is the order they were queued in). Returns the events with the numbers they got, for
/// [`Recent`].
pub(crate) async fn append(tx: &mut sqlx::Transaction<'static, sqlx::Any>, backend: Backend, events: Vec<Queued>) -> Result<Written> {
    let mut written = Written::default();
    if events.is_empty() {
        return Ok(written);
    }
    let mut rows = Vec::with_capacity(events.len());
    for queued in events {
        let payload = serde_json::to_string(&queued.event)?;
        let audience_text = serde_json::to_string(&queued.audience)?;
        let note_text = queued.note.as_ref().map(serde_json::to_string).transpose()?;
        rows.push((queued, payload, audience_text, note_text));
    }
    // 6 parameters a row; a statement stays far below either engine's parameter limit.
    let mut first = true;
    while !rows.is_empty() {
        let chunk: Vec<_> = rows.drain(..rows.len().min(500)).collect();
        let values = crate::rows::value_rows(backend, 1, chunk.len(), 6);
        let sql = match backend {
            // The lock is taken by the statement's first row: every row, and so every `seq`
            // drawn for one, comes after it. No NOTIFY here: see [`announce`].
            Backend::Postgres if first => format!(
                "WITH outbox_lock AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared({OUTBOX_LOCK})) \
                 INSERT INTO event (type, cid, payload, audience, note, created_at) \
                 SELECT v.* FROM outbox_lock, (VALUES {values}) AS v (type, cid, payload, audience, note, created_at) RETURNING seq"
            ),
            // SQLite's one writer numbers the rows of a statement one after another in the
            // order of its `VALUES` (AUTOINCREMENT: the highest `seq` so far, plus one);
            // PostgreSQL's sequence does too, unless another writer draws between them.
            _ => format!("INSERT INTO event (type, cid, payload, audience, note, created_at) VALUES {values} RETURNING seq"),
        };
        first = false;
        let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
        // The texts are moved into the statement; each row keeps the length of what it stores.
        let mut sized = Vec::with_capacity(chunk.len());
        for (queued, payload, audience, note) in chunk {
            let size = payload.len() + note.as_ref().map_or(0, String::len);
            let e = &queued.event;
            q = q.bind(e.kind.clone()).bind(e.cid.clone()).bind(payload).bind(audience).bind(note).bind(e.created_at);
            sized.push((queued, size));
        }
        let seqs: Vec<i64> = q.fetch_all(crate::counted(&mut **tx)).await?.iter().map(|r| sqlx::Row::get(r, 0)).collect();
        written.numbered(&seqs, sized);
    }
    Ok(written)
}

/// The events of one outbox row, with its `seq` and the length of what it stores.
struct Row {
    seq: i64,
    events: Vec<std::sync::Arc<OutboxEvent>>,
    size: usize,
}

/// A committing transaction's events with their `seq`, for [`Recent`]. A statement whose
/// numbers were not the run its rows were expected to get (on PostgreSQL, another writer drew
/// numbers between them) adds none: its events are then numbers [`Recent`] does not hold, read
/// from the table.
#[derive(Default)]
pub(crate) struct Written {
    rows: Vec<Row>,
}

impl Written {
    /// Numbers the rows of one statement (each with the length of what it stores) by the `seq`
    /// it returned for them.
    fn numbered(&mut self, seqs: &[i64], chunk: Vec<(Queued, usize)>) {
        let (Some(&first), Some(&last)) = (seqs.iter().min(), seqs.iter().max()) else { return };
        if last - first + 1 != chunk.len() as i64 || seqs.len() != chunk.len() {
            return;
        }
        for (seq, (q, size)) in (first..).zip(chunk) {
            self.rows.push(Row { seq, events: row_events(seq, q.event, q.audience, q.note), size });
        }
    }
}

/// The most outbox rows, and the most bytes of what they store, [`Recent`] keeps.
const RECENT_ROWS: usize = 2_048;
const RECENT_BYTES: usize = 16 << 20;

/// The events this process committed last, by `seq`, as they were before they were written.
/// This process's consumers (the WebSocket fan-out, the webhook relay) take them from here
/// instead of reading back and parsing what was just written: an agent's streamed answer is
/// thousands of `message.updated` events a second, each carrying the whole message
/// (docs/performance.md, "Outbox events from memory"). Only an unbroken run of `seq` right
/// after a consumer's cursor is served from here; anything else (an event another process or
/// store wrote, a number a rolled-back transaction drew, one pushed out by newer ones, one whose
/// transaction has not committed yet) is read from the database. Every kept row committed, so
/// such a run leaves no number below its end that could still commit: on PostgreSQL, where
/// writers commit out of `seq` order, it needs no outbox horizon ([`outbox_horizon`]). Rows are
/// kept once their commit succeeded (SQLite's one writer keeps them before its lock is
/// released, so there in `seq` order).
#[derive(Default)]
pub(crate) struct Recent {
    kept: std::sync::Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    rows: std::collections::BTreeMap<i64, Row>,
    bytes: usize,
}

impl Recent {
    /// Keeps a committed transaction's events; past the bounds, the lowest numbers go.
    pub(crate) fn keep(&self, written: Written) {
        if written.rows.is_empty() {
            return;
        }
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        for row in written.rows {
            kept.bytes += row.size;
            if let Some(old) = kept.rows.insert(row.seq, row) {
                kept.bytes -= old.size;
            }
        }
        while kept.rows.len() > RECENT_ROWS || kept.bytes > RECENT_BYTES {
            let Some((_, row)) = kept.rows.pop_first() else { break };
            kept.bytes -= row.size;
        }
    }

    /// The events of the kept rows with `seq > after`, up to `limit` rows, when the first of
    /// them is `after + 1`; they end before the first number missing from the run. `None` when
    /// there are none.
    fn after(&self, after: i64, limit: usize) -> Option<Vec<std::sync::Arc<OutboxEvent>>> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let out: Vec<_> = Kept::run(&kept.rows, after, limit).flat_map(|row| row.events.iter().cloned()).collect();
        (!out.is_empty()).then_some(out)
    }

    /// The last `seq` and the number of rows of what [`Recent::after`] would serve.
    fn span_after(&self, after: i64, limit: usize) -> Option<(i64, i64)> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let rows = Kept::run(&kept.rows, after, limit).count() as i64;
        (rows > 0).then(|| (after + rows, rows))
    }
}

impl Kept {
    /// The kept rows numbered `after + 1`, `after + 2`, … without a gap, at most `limit`.
    fn run(rows: &std::collections::BTreeMap<i64, Row>, after: i64, limit: usize) -> impl Iterator<Item = &Row> {
        let first = after.saturating_add(1);
        rows.range(first..).zip(first..).take(limit).take_while(|((seq, _), want)| **seq == *want).map(|((_, row), _)| row)
    }
}

/// Tells other processes on PostgreSQL that events were committed: one `NOTIFY
/// offshoot_events` after commits that wrote events, sent by this task *after* they committed,
/// and coalesced (commits during a `NOTIFY` in flight share the next one). A `NOTIFY` inside
/// a transaction would make its commit take PostgreSQL's database-wide notification lock and
/// hold it through the commit's disk flush, so every writer would commit one at a time. The
/// announcement needs no durability (consumers also poll): it is sent on a connection of its
/// own whose commits do not wait for the flush, one statement each. Its payload is `origin`,
/// this process's mark, so the process's own listener can ignore it (its consumers were woken
/// at the commit). Ends when the pool is closed.
pub(crate) async fn announce(pool: sqlx::AnyPool, pending: std::sync::Arc<tokio::sync::Notify>, origin: std::sync::Arc<str>) {
    let mut conn: Option<sqlx::AnyConnection> = None;
    loop {
        pending.notified().await;
        if pool.is_closed() {
            return;
        }
        let sent = async {
            if conn.is_none() {
                // Out of the pool for good: its session setting must not reach other work.
                let mut c = pool.acquire().await?.detach();
                sqlx::Executor::execute(&mut c, "SET synchronous_commit TO OFF").await?;
                conn = Some(c);
            }
            let c = conn.as_mut().expect("connected above");
            sqlx::query("SELECT pg_notify('offshoot_events', $1)").bind(origin.to_string()).execute(&mut *c).await
        }
        .await;
        if let Err(e) = sent {
            conn = None;
            if pool.is_closed() {
                return;
            }
            // Consumers poll meanwhile; try again on the next commit, or after a pause.
            tracing::warn!(error = %e, "announcing committed events failed");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            pending.notify_one();
        }
    }
}

/// The shortest time between the starts of two reads of the outbox by one consumer woken by
/// commits: under a stream of commits a consumer reads every few of them at once instead of
/// once per commit, and an event that comes alone is read at once. On PostgreSQL each read
/// takes the outbox lock exclusively for a moment, which holds new writers back until the
/// writers before it commit; at 750 sends a second the two consumers of a process, woken by
/// every commit, read about once per send each (docs/performance.md, "Outbox on PostgreSQL").
pub const OUTBOX_READ_GAP: std::time::Duration = std::time::Duration::from_millis(5);

/// How often a consumer of the outbox reads it when no commit woke it (a lost notification, an
/// event of another process on SQLite).
const OUTBOX_POLL: std::time::Duration = std::time::Duration::from_millis(250);

impl Store {
    /// The pace of one consumer of the outbox (`what` names it in the log): see
    /// [`OutboxFollower`].
    pub fn follow_outbox(&self, what: &'static str) -> OutboxFollower {
        OutboxFollower { notify: self.event_notify(), what, failing: false, read_at: tokio::time::Instant::now(), woken: None }
    }
}

/// When one consumer of the outbox reads it: after every commit's wake-up
/// ([`Store::event_notify`]), at most once per [`OUTBOX_READ_GAP`], and at least every
/// [`OUTBOX_POLL`]. A consumer loops `while follower.next(stop).await { follower.read(..) }`.
pub struct OutboxFollower {
    notify: std::sync::Arc<tokio::sync::Notify>,
    what: &'static str,
    failing: bool,
    read_at: tokio::time::Instant,
    /// The wake-up registered before the last read (none before the first).
    woken: Option<std::pin::Pin<Box<tokio::sync::futures::OwnedNotified>>>,
}

impl OutboxFollower {
    /// Waits until the next read is due; false when `stop` resolved first. The first read is
    /// due at once; each later one after a commit's wake-up or [`OUTBOX_POLL`], and no sooner
    /// than [`OUTBOX_READ_GAP`] after the one before.
    pub async fn next(&mut self, stop: impl std::future::Future<Output = ()>) -> bool {
        if let Some(woken) = self.woken.as_mut() {
            tokio::select! {
                _ = stop => return false,
                _ = woken => {}
                _ = tokio::time::sleep(OUTBOX_POLL) => {}
            }
        }
        // Registered before reading, so a commit during the read still wakes the next wait.
        let mut woken = Box::pin(self.notify.clone().notified_owned());
        woken.as_mut().enable();
        self.woken = Some(woken);
        // Paced: at most one read per gap while commits keep waking it.
        tokio::time::sleep_until(self.read_at + OUTBOX_READ_GAP).await;
        self.read_at = tokio::time::Instant::now();
        true
    }

    /// Records how a read went: a failure is logged once as `"{what} failed; retrying"` (the
    /// next wake-up tries again), and the first read that works after failures logs
    /// `"{what} works again"`.
    pub fn read<E: std::fmt::Display>(&mut self, outcome: std::result::Result<(), E>) {
        let what = self.what;
        match outcome {
            Ok(()) if self.failing => {
                self.failing = false;
                tracing::info!("{what} works again");
            }
            Ok(()) => {}
            Err(e) if !self.failing => {
                self.failing = true;
                tracing::error!(error = %e, "{what} failed; retrying");
            }
            Err(_) => {}
        }
    }
}

/// The advisory lock key of the outbox (writers shared, the horizon exclusive).
const OUTBOX_LOCK: i64 = 7_261_001;

/// The highest `seq` below which no transaction can still commit an event, on PostgreSQL:
/// taking the outbox lock exclusively waits for every writer that holds a drawn `seq` (they
/// hold the lock shared from before drawing it until their commit is visible), and the
/// sequence's value read under it bounds every `seq` drawn so far. A later writer draws a
/// higher one. The rows must be read by a *later* statement, whose snapshot sees those commits.
/// `None` on SQLite, whose single writer commits in `seq` order.
///
/// The consumers of a process share the reads: a caller takes the result of a read that
/// started after it asked (it covers every commit the caller could have been woken by), and
/// otherwise starts one, one at a time. Both consumers of a process are woken by the same
/// commits, and each read holds new writers back for a moment (docs/performance.md, "Outbox on PostgreSQL").
async fn outbox_horizon(store: &Store) -> Result<Option<i64>> {
    if store.backend() != Backend::Postgres {
        return Ok(None);
    }
    let asked = std::time::Instant::now();
    let _turn = store.horizon.reading.lock().await;
    if let Some((horizon, started)) = *store.horizon.last.lock().unwrap_or_else(|e| e.into_inner()) {
        if started >= asked {
            return Ok(Some(horizon));
        }
    }
    let started = std::time::Instant::now();
    let horizon: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "WITH barrier AS MATERIALIZED (SELECT pg_advisory_xact_lock({OUTBOX_LOCK})::text AS taken) \
         SELECT COALESCE(pg_sequence_last_value('event_seq_seq'::regclass), 0) FROM barrier WHERE taken IS NOT NULL"
    )))
    .fetch_one(crate::counted(store.pool()))
    .await?;
    *store.horizon.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((horizon, started));
    Ok(Some(horizon))
}

/// The outbox horizon reads of a process ([`outbox_horizon`]).
#[derive(Default)]
pub(crate) struct Horizon {
    /// Held while a read runs.
    reading: tokio::sync::Mutex<()>,
    /// The last read's horizon and when it started.
    last: std::sync::Mutex<Option<(i64, std::time::Instant)>>,
}

/// An outbox row. Its JSON is decoded leniently (see [`OutboxRow::decode`]), so it is read as text.
#[derive(sqlx::FromRow)]
struct OutboxRow {
    seq: i64,
    payload: String,
    audience: String,
    note: Option<String>,
}

impl OutboxRow {
    /// The row's events ([`row_events`]). A payload that no longer decodes (written by another
    /// version) becomes an event with an empty type and no audience, which every consumer
    /// passes over, instead of an error that would stop the consumer at that `seq` for ever; a
    /// notification that no longer decodes is left out, its event is not.
    fn decode(self) -> Vec<std::sync::Arc<OutboxEvent>> {
        let seq = self.seq;
        let (event, audience) = match (serde_json::from_str(&self.payload), serde_json::from_str(&self.audience)) {
            (Ok(event), Ok(audience)) => (event, audience),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(seq, error = %e, "undecodable outbox event; consumers skip it");
                (Event::default(), Audience::default())
            }
        };
        let note = self.note.and_then(|text| match serde_json::from_str(&text) {
            Ok(note) => Some(note),
            Err(e) => {
                tracing::error!(seq, error = %e, "undecodable notification in the outbox; consumers hear only its event");
                None
            }
        });
        row_events(seq, event, audience, note)
    }
}

/// How many outbox rows `events` (as [`Store::events_after`] returns them) came from: a row's
/// events share its `seq`. A consumer that asked for `limit` rows and got fewer has caught up.
pub fn outbox_rows(events: &[std::sync::Arc<OutboxEvent>]) -> i64 {
    events.chunk_by(|a, b| a.seq == b.seq).count() as i64
}

impl Store {
    /// Events with `seq > after`, oldest first, from at most `limit` outbox rows, up to the
    /// outbox horizon on PostgreSQL: a consumer that moves its cursor to the last one never
    /// passes over an event that commits later (see [`append`]). A row may hold a notification
    /// beside its event ([`Note`]): both come, one after the other, with the row's `seq`, and a
    /// row's events are never split between two reads. The events this process committed last come
    /// from memory when they follow `after` without a gap ([`Recent`]).
    pub async fn events_after(&self, after: i64, limit: i64) -> Result<Vec<std::sync::Arc<OutboxEvent>>> {
        if let Some(kept) = self.recent.after(after, limit.max(0) as usize) {
            metrics::counter!("offshoot_outbox_events_read_total", "from" => "memory").increment(kept.len() as u64);
            return Ok(kept);
        }
        let horizon = outbox_horizon(self).await?.unwrap_or(i64::MAX);
        let rows: Vec<OutboxRow> =
            sqlx::query_as("SELECT seq, payload, audience, note FROM event WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3")
                .bind(after)
                .bind(horizon)
                .bind(limit)
                .fetch_all(crate::counted(self.pool()))
                .await?;
        let events: Vec<_> = rows.into_iter().flat_map(OutboxRow::decode).collect();
        metrics::counter!("offshoot_outbox_events_read_total", "from" => "database").increment(events.len() as u64);
        Ok(events)
    }

    /// What [`Store::events_after`] would return, without the events: the last `seq` (none when
    /// there is nothing new) and how many. For a consumer that only needs to pass them by.
    pub async fn event_span_after(&self, after: i64, limit: i64) -> Result<(Option<i64>, i64)> {
        if let Some((last, rows)) = self.recent.span_after(after, limit.max(0) as usize) {
            return Ok((Some(last), rows));
        }
        let horizon = outbox_horizon(self).await?.unwrap_or(i64::MAX);
        let (last, count): (Option<i64>, i64) = sqlx::query_as(
            "SELECT MAX(seq), COUNT(*) FROM (SELECT seq FROM event WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3) AS span",
        )
        .bind(after)
        .bind(horizon)
        .bind(limit)
        .fetch_one(crate::counted(self.pool()))
        .await?;
        Ok((last, count))
    }

    /// The newest `seq` in the outbox (0 when empty). On PostgreSQL no event with a lower
    /// `seq` commits after this returns, so it is a safe place for a new cursor to start.
    pub async fn last_event_seq(&self) -> Result<i64> {
        outbox_horizon(self).await?;
        Ok(sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) FROM event").fetch_one(crate::counted(self.pool())).await?)
    }

    /// A consumer's cursor; created at the current end of the outbox on first use.
    pub async fn outbox_cursor(&self, name: &str) -> Result<i64> {
        let seq: Option<i64> = sqlx::query_scalar("SELECT seq FROM outbox_cursor WHERE name = $1")
            .bind(name.to_string())
            .fetch_optional(crate::counted(self.pool()))
            .await?;
        if let Some(seq) = seq {
            return Ok(seq);
        }
        // A new cursor starts at the end: first wait out the writers still committing below it.
        outbox_horizon(self).await?;
        let mut tx = self.begin().await?;
        let now = time::now();
        sqlx::query("INSERT INTO outbox_cursor (name, seq, created_at, updated_at) SELECT $1, COALESCE(MAX(seq), 0), $2, $2 FROM event WHERE true ON CONFLICT (name) DO NOTHING")
            .bind(name.to_string())
            .bind(now)
            .execute(crate::counted(&mut *tx.tx))
            .await?;
        let seq: i64 = sqlx::query_scalar("SELECT seq FROM outbox_cursor WHERE name = $1")
            .bind(name.to_string())
            .fetch_one(crate::counted(&mut *tx.tx))
            .await?;
        tx.commit(self).await?;
        Ok(seq)
    }

    /// Moves a consumer's cursor from `from` to `to` if it is still at `from`
    /// (compare-and-set). False when another consumer moved it first, so two worker processes
    /// never pass over the same events twice.
    #[tracing::instrument(name = "store.advance_cursor_from", skip(self))]
    pub async fn advance_cursor_from(&self, name: &str, from: i64, to: i64) -> Result<bool> {
        let mut tx = self.begin().await?;
        let now = time::now();
        let res = sqlx::query("UPDATE outbox_cursor SET seq = $1, updated_at = $2 WHERE name = $3 AND seq = $4")
            .bind(to)
            .bind(now)
            .bind(name.to_string())
            .bind(from)
            .execute(crate::counted(&mut *tx.tx))
            .await?;
        if res.rows_affected() == 0 {
            return Ok(false);
        }
        tx.commit(self).await?;
        Ok(true)
    }
}

impl Store {
    /// Publishes a client event (typing, AI state, custom) through the outbox. AI-state events
    /// also keep the message's state in `ai_state` (read by `require_finished`).
    pub async fn publish(&self, event: Event, audience: Audience) -> Result<()> {
        self.retrying("publish", || async {
            let mut tx = self.begin().await?;
            record_ai_state(&mut tx, &event).await?;
            tx.event(event.clone(), audience.clone()).await?;
            tx.commit(self).await
        })
        .await
    }
}

impl Store {
    /// Deletes outbox events created before `before` that every consumer cursor has passed
    /// (with no cursor at all, as in a deployment without a worker, age alone decides: a
    /// consumer created later starts at the end). Webhook deliveries carry their body in the
    /// job queue, so they need no event row. Returns how many were deleted.
    pub async fn prune_events(&self, before: i64) -> Result<u64> {
        let mut tx = self.begin().await?;
        let res =
            sqlx::query("DELETE FROM event WHERE created_at < $1 AND seq <= COALESCE((SELECT MIN(seq) FROM outbox_cursor), event.seq)")
                .bind(before)
                .execute(crate::counted(&mut *tx.tx))
                .await?;
        tx.commit(self).await?;
        Ok(res.rows_affected())
    }
}

/// `ai_indicator.update` sets a message's AI state; `ai_indicator.clear` / `.stop` end it (for
/// one message, or for the whole channel when they name none).
async fn record_ai_state(tx: &mut Tx, event: &Event) -> Result<()> {
    let Some(cid) = &event.cid else { return Ok(()) };
    let message_id = event.extra.get("message_id").and_then(serde_json::Value::as_str);
    let now = time::now();
    match (event.kind.as_str(), message_id) {
        ("ai_indicator.update", Some(mid)) => {
            let state = event.extra.get("ai_state").and_then(serde_json::Value::as_str).unwrap_or_default();
            sqlx::query("INSERT INTO ai_state (cid, message_id, state, created_at, updated_at) VALUES ($1, $2, $3, $4, $4) ON CONFLICT (cid, message_id) DO UPDATE SET state = $3, updated_at = $4")
                .bind(cid.clone())
                .bind(mid.to_string())
                .bind(state.to_string())
                .bind(now)
                .execute(crate::counted(&mut *tx.tx))
                .await?;
        }
        ("ai_indicator.clear" | "ai_indicator.stop", Some(mid)) => {
            sqlx::query("DELETE FROM ai_state WHERE cid = $1 AND message_id = $2")
                .bind(cid.clone())
                .bind(mid.to_string())
                .execute(crate::counted(&mut *tx.tx))
                .await?;
        }
        ("ai_indicator.clear" | "ai_indicator.stop", None) => {
            sqlx::query("DELETE FROM ai_state WHERE cid = $1").bind(cid.clone()).execute(crate::counted(&mut *tx.tx)).await?;
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn written(seqs: impl IntoIterator<Item = i64>, size: usize) -> Written {
        let rows = seqs.into_iter().map(|seq| Row { seq, events: row_events(seq, Event::default(), Audience::default(), None), size });
        Written { rows: rows.collect() }
    }

    fn seqs(events: Option<Vec<Arc<OutboxEvent>>>) -> Vec<i64> {
        events.unwrap_or_default().iter().map(|e| e.seq).collect()
    }

    #[test]
    fn recent_serves_the_unbroken_run_after_a_cursor_and_nothing_else() {
        let recent = Recent::default();
        recent.keep(written([3, 4, 5], 10));
        recent.keep(written([7, 8], 10));
        assert_eq!(seqs(recent.after(2, 10)), vec![3, 4, 5]);
        assert_eq!(seqs(recent.after(3, 1)), vec![4], "up to the limit");
        assert_eq!(seqs(recent.after(5, 10)), Vec::<i64>::new(), "6 was written elsewhere");
        assert_eq!(seqs(recent.after(6, 10)), vec![7, 8]);
        assert_eq!(seqs(recent.after(1, 10)), Vec::<i64>::new(), "2 is not kept");
        assert_eq!(seqs(recent.after(8, 10)), Vec::<i64>::new(), "nothing newer is known here");
        assert_eq!(recent.span_after(2, 10), Some((5, 3)), "the span ends where the events do");
        assert_eq!(recent.span_after(3, 1), Some((4, 1)));
        assert_eq!(recent.span_after(5, 10), None);
    }

    #[test]
    fn recent_keeps_a_bounded_number_and_size() {
        let recent = Recent::default();
        recent.keep(written(1..=(RECENT_ROWS as i64 + 5), 1));
        assert_eq!(seqs(recent.after(0, 10)), Vec::<i64>::new(), "the oldest went");
        assert_eq!(seqs(recent.after(5, 2)), vec![6, 7]);
        recent.keep(written([10_000, 10_001, 10_002], RECENT_BYTES / 2));
        assert_eq!(seqs(recent.after(10_000, 10)), vec![10_001, 10_002]);
        assert_eq!(seqs(recent.after(9_999, 10)), Vec::<i64>::new(), "the oldest went for the size");
        assert_eq!(seqs(recent.after(5, 10)), Vec::<i64>::new(), "so did every smaller one");
    }

    /// On PostgreSQL writers commit out of `seq` order: a run is served once every number in
    /// it is kept, whatever order they came in.
    #[test]
    fn recent_serves_a_run_whose_numbers_were_kept_out_of_order_once_it_is_whole() {
        let recent = Recent::default();
        recent.keep(written([5, 7], 10));
        assert_eq!(seqs(recent.after(4, 10)), vec![5], "6 has not committed here yet");
        assert_eq!(seqs(recent.after(5, 10)), Vec::<i64>::new());
        recent.keep(written([6], 10));
        assert_eq!(seqs(recent.after(4, 10)), vec![5, 6, 7]);
        recent.keep(written([2], 10));
        assert_eq!(seqs(recent.after(1, 10)), vec![2], "a late low number is kept too");
        assert_eq!(seqs(recent.after(4, 10)), vec![5, 6, 7]);
        recent.keep(written([6], 10));
        assert_eq!(seqs(recent.after(4, 10)), vec![5, 6, 7], "a number kept twice is one row");
    }

    /// A row with a notification gives both events, with its `seq`; the limit counts rows, so
    /// a row's events are never split between two reads.
    #[test]
    fn recent_serves_a_rows_notification_with_its_event_and_counts_rows() {
        let recent = Recent::default();
        let event = Event { kind: "message.new".into(), cid: Some("agent:x".into()), ..Default::default() };
        let audience = Audience { watchers_of: Some("agent:x".into()), webhooks: true, ..Default::default() };
        let channel = Channel { cid: "agent:x".into(), ..Default::default() };
        let note = Note { kind: "notification.message_new".into(), users: vec!["amy".into()], channel };
        let mut rows = written([1], 10);
        rows.rows.push(Row { seq: 2, events: row_events(2, event, audience, Some(note)), size: 10 });
        rows.rows.extend(written([3], 10).rows);
        recent.keep(rows);
        let kinds = |events: Option<Vec<Arc<OutboxEvent>>>| -> Vec<(i64, String)> {
            events.unwrap_or_default().iter().map(|e| (e.seq, e.event.kind.clone())).collect()
        };
        let both = vec![(2, "message.new".to_string()), (2, "notification.message_new".to_string())];
        assert_eq!(kinds(recent.after(1, 1)), both, "one row, both its events");
        assert_eq!(kinds(recent.after(0, 2)), [vec![(1, String::new())], both.clone()].concat());
        assert_eq!(seqs(recent.after(2, 10)), vec![3]);
        // Three events from two rows: a consumer that asked for two rows has not caught up.
        assert_eq!(outbox_rows(&recent.after(0, 2).unwrap_or_default()), 2);
        assert_eq!(outbox_rows(&recent.after(0, 10).unwrap_or_default()), 3);
        assert_eq!(outbox_rows(&[]), 0);
    }
}
