//! The transactional outbox. Events are written in the transaction of the change they
//! announce; consumers read them in `seq` order from a cursor of their own.

use crate::rows::{get_i64, get_str};
use crate::{Backend, Result, Store, Tx};
use offshoot_core::model::{Audience, Event, OutboxEvent};
use offshoot_core::time;
use sqlx::any::AnyRow;

impl Tx {
    /// Queues an event for the outbox; it is written when this transaction commits.
    pub(crate) async fn event(&mut self, event: Event, audience: Audience) -> Result<()> {
        self.events.push((event, audience));
        Ok(())
    }
}

/// Writes a committing transaction's events. On PostgreSQL it first takes the outbox lock and
/// holds it until commit, so `seq` order is commit order and a consumer's cursor never skips
/// an event committed late; it is the last lock of every transaction (crate doc, lock order).
pub(crate) async fn append(tx: &mut sqlx::Transaction<'static, sqlx::Any>, backend: Backend, events: Vec<(Event, Audience)>) -> Result<()> {
    if backend == Backend::Postgres {
        sqlx::query("SELECT pg_advisory_xact_lock(7261001)").execute(&mut **tx).await?;
    }
    for (event, audience) in events {
        sqlx::query("INSERT INTO event (type, cid, payload, audience, created_at) VALUES ($1, $2, $3, $4, $5)")
            .bind(event.kind.clone())
            .bind(event.cid.clone())
            .bind(serde_json::to_string(&event)?)
            .bind(serde_json::to_string(&audience)?)
            .bind(event.created_at)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// Decodes an outbox row. A payload that no longer decodes (written by another version) becomes
/// an event with an empty type and no audience, which every consumer passes over, instead of
/// an error that would stop the consumer at that `seq` for ever.
fn outbox_event(r: &AnyRow) -> Result<OutboxEvent> {
    let seq = get_i64(r, "seq")?;
    let event = serde_json::from_str(&get_str(r, "payload")?);
    let audience = serde_json::from_str(&get_str(r, "audience")?);
    match (event, audience) {
        (Ok(event), Ok(audience)) => Ok(OutboxEvent { seq, event, audience }),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(seq, error = %e, "undecodable outbox event; consumers skip it");
            Ok(OutboxEvent { seq, event: Event::default(), audience: Audience::default() })
        }
    }
}

impl Store {
    /// Events with `seq > after`, oldest first.
    pub async fn events_after(&self, after: i64, limit: i64) -> Result<Vec<OutboxEvent>> {
        let rows: Vec<AnyRow> = sqlx::query("SELECT seq, payload, audience FROM event WHERE seq > $1 ORDER BY seq LIMIT $2")
            .bind(after)
            .bind(limit)
            .fetch_all(self.pool())
            .await?;
        rows.iter().map(outbox_event).collect()
    }

    /// The newest `seq` in the outbox (0 when empty).
    pub async fn last_event_seq(&self) -> Result<i64> {
        let row: AnyRow = sqlx::query("SELECT COALESCE(MAX(seq), 0) AS seq FROM event").fetch_one(self.pool()).await?;
        get_i64(&row, "seq")
    }

    /// A consumer's cursor; created at the current end of the outbox on first use.
    pub async fn outbox_cursor(&self, name: &str) -> Result<i64> {
        let row: Option<AnyRow> =
            sqlx::query("SELECT seq FROM outbox_cursor WHERE name = $1").bind(name.to_string()).fetch_optional(self.pool()).await?;
        if let Some(row) = row {
            return get_i64(&row, "seq");
        }
        let mut tx = self.begin().await?;
        let now = time::now();
        sqlx::query("INSERT INTO outbox_cursor (name, seq, created_at, updated_at) SELECT $1, COALESCE(MAX(seq), 0), $2, $2 FROM event WHERE true ON CONFLICT (name) DO NOTHING")
            .bind(name.to_string())
            .bind(now)
            .execute(&mut *tx.tx)
            .await?;
        let row: AnyRow =
            sqlx::query("SELECT seq FROM outbox_cursor WHERE name = $1").bind(name.to_string()).fetch_one(&mut *tx.tx).await?;
        tx.commit(self).await?;
        get_i64(&row, "seq")
    }

    /// Moves a cursor forward and queues webhook deliveries for the events passed over, in
    /// one transaction: a crash in between neither loses nor repeats a delivery.
    pub async fn advance_cursor(&self, name: &str, seq: i64, deliveries: &[(i64, String)]) -> Result<()> {
        let mut tx = self.begin().await?;
        let now = time::now();
        sqlx::query("UPDATE outbox_cursor SET seq = $1, updated_at = $2 WHERE name = $3 AND seq < $1")
            .bind(seq)
            .bind(now)
            .bind(name.to_string())
            .execute(&mut *tx.tx)
            .await?;
        queue_deliveries(&mut tx, deliveries, now).await?;
        tx.commit(self).await
    }

    /// Deliveries due now: (delivery id, event, url, attempts so far).
    pub async fn due_deliveries(&self, limit: i64) -> Result<Vec<(String, OutboxEvent, String, i64)>> {
        let rows: Vec<AnyRow> = sqlx::query(
            "SELECT d.id, d.url, d.attempt, e.seq, e.payload, e.audience FROM webhook_delivery d JOIN event e ON e.seq = d.seq WHERE d.next_attempt_at <= $1 ORDER BY d.seq LIMIT $2",
        )
        .bind(time::now())
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(|r| Ok((get_str(r, "id")?, outbox_event(r)?, get_str(r, "url")?, get_i64(r, "attempt")?))).collect()
    }

    /// Records the outcome of a delivery attempt: done (removed) or retried at `retry_at`.
    #[tracing::instrument(name = "store.finish_delivery", skip(self))]
    pub async fn finish_delivery(&self, id: &str, retry_at: Option<i64>) -> Result<()> {
        let mut tx = self.begin().await?;
        match retry_at {
            None => {
                sqlx::query("DELETE FROM webhook_delivery WHERE id = $1").bind(id.to_string()).execute(&mut *tx.tx).await?;
            }
            Some(at) => {
                sqlx::query("UPDATE webhook_delivery SET attempt = attempt + 1, next_attempt_at = $1, updated_at = $2 WHERE id = $3")
                    .bind(at)
                    .bind(time::now())
                    .bind(id.to_string())
                    .execute(&mut *tx.tx)
                    .await?;
            }
        }
        tx.commit(self).await
    }

    /// Like [`Store::advance_cursor`], but only if the cursor is still at `from`
    /// (compare-and-set). False when another consumer moved it first; then nothing is queued,
    /// so two worker processes never queue the same events twice.
    #[tracing::instrument(name = "store.queue_deliveries", skip(self, deliveries), fields(deliveries = deliveries.len()))]
    pub async fn advance_cursor_from(&self, name: &str, from: i64, to: i64, deliveries: &[(i64, String)]) -> Result<bool> {
        let mut tx = self.begin().await?;
        let now = time::now();
        let res = sqlx::query("UPDATE outbox_cursor SET seq = $1, updated_at = $2 WHERE name = $3 AND seq = $4")
            .bind(to)
            .bind(now)
            .bind(name.to_string())
            .bind(from)
            .execute(&mut *tx.tx)
            .await?;
        if res.rows_affected() == 0 {
            return Ok(false);
        }
        queue_deliveries(&mut tx, deliveries, now).await?;
        tx.commit(self).await?;
        Ok(true)
    }

    /// Leases a due delivery until `lease_until` (Unix ns) so no other worker picks it up
    /// while it is in flight. False when it is no longer due with `attempts` attempts (another
    /// worker holds it, or it was finished). A worker that dies mid-attempt loses the lease
    /// when it expires, and the attempt is made again.
    #[tracing::instrument(name = "store.claim_delivery", skip(self))]
    pub async fn claim_delivery(&self, id: &str, attempts: i64, lease_until: i64) -> Result<bool> {
        let mut tx = self.begin().await?;
        let now = time::now();
        let res = sqlx::query(
            "UPDATE webhook_delivery SET next_attempt_at = $1, updated_at = $2 WHERE id = $3 AND attempt = $4 AND next_attempt_at <= $2",
        )
        .bind(lease_until)
        .bind(now)
        .bind(id.to_string())
        .bind(attempts)
        .execute(&mut *tx.tx)
        .await?;
        tx.commit(self).await?;
        Ok(res.rows_affected() == 1)
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
    /// Deletes outbox events created before `before` that every consumer cursor has passed and
    /// no webhook delivery still needs (with no cursor at all, as in a deployment without a
    /// worker, age alone decides: a consumer created later starts at the end). Returns how many
    /// were deleted.
    pub async fn prune_events(&self, before: i64) -> Result<u64> {
        let mut tx = self.begin().await?;
        let res = sqlx::query(
            "DELETE FROM event WHERE created_at < $1 AND seq <= COALESCE((SELECT MIN(seq) FROM outbox_cursor), event.seq) \
             AND NOT EXISTS (SELECT 1 FROM webhook_delivery d WHERE d.seq = event.seq)",
        )
        .bind(before)
        .execute(&mut *tx.tx)
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
                .execute(&mut *tx.tx)
                .await?;
        }
        ("ai_indicator.clear" | "ai_indicator.stop", Some(mid)) => {
            sqlx::query("DELETE FROM ai_state WHERE cid = $1 AND message_id = $2")
                .bind(cid.clone())
                .bind(mid.to_string())
                .execute(&mut *tx.tx)
                .await?;
        }
        ("ai_indicator.clear" | "ai_indicator.stop", None) => {
            sqlx::query("DELETE FROM ai_state WHERE cid = $1").bind(cid.clone()).execute(&mut *tx.tx).await?;
        }
        _ => {}
    }
    Ok(())
}

/// Queues one webhook delivery per (event seq, url), due now.
async fn queue_deliveries(tx: &mut Tx, deliveries: &[(i64, String)], now: i64) -> Result<()> {
    for (event_seq, url) in deliveries {
        sqlx::query("INSERT INTO webhook_delivery (id, seq, url, attempt, next_attempt_at, created_at, updated_at) VALUES ($1, $2, $3, 0, $4, $4, $4)")
            .bind(uuid::Uuid::new_v4().to_string())
            .bind(*event_seq)
            .bind(url.clone())
            .bind(now)
            .execute(&mut *tx.tx)
            .await?;
    }
    Ok(())
}
