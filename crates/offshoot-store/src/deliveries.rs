//! Dead-lettered webhook deliveries: what the worker gave up on, with the body it sent, so an
//! admin can list and replay them. Deliveries still being tried live in the job queue.

use crate::rows::{get_i64, get_str};
use crate::{Result, Store};
use offshoot_core::jobs::DeadLetter;
use offshoot_core::time;
use sqlx::any::AnyRow;
use sqlx::AssertSqlSafe;

/// A dead letter and the exact body that was sent (and is sent again on replay).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterRecord {
    pub letter: DeadLetter,
    pub body: String,
}

const COLS: &str = "id, url, event_type, event_seq, body, attempts, last_error, first_attempt_at, created_at";

fn record(r: &AnyRow) -> Result<DeadLetterRecord> {
    Ok(DeadLetterRecord {
        letter: DeadLetter {
            id: get_str(r, "id")?,
            url: get_str(r, "url")?,
            event_type: get_str(r, "event_type")?,
            event_seq: get_i64(r, "event_seq")?,
            attempts: get_i64(r, "attempts")?,
            last_error: get_str(r, "last_error")?,
            first_attempt_at: get_i64(r, "first_attempt_at")?,
            created_at: get_i64(r, "created_at")?,
        },
        body: get_str(r, "body")?,
    })
}

impl Store {
    /// Records a delivery given up on. A delivery dead-lettered again after a replay replaces
    /// its earlier record.
    pub async fn dead_letter(&self, d: &DeadLetterRecord) -> Result<()> {
        let mut tx = self.begin().await?;
        let now = time::now();
        sqlx::query(
            "INSERT INTO webhook_dead_letter (id, url, event_type, event_seq, body, attempts, last_error, first_attempt_at, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9) ON CONFLICT (id) DO UPDATE SET url = excluded.url, event_type = excluded.event_type, \
             event_seq = excluded.event_seq, body = excluded.body, attempts = excluded.attempts, last_error = excluded.last_error, \
             first_attempt_at = excluded.first_attempt_at, updated_at = excluded.updated_at",
        )
        .bind(d.letter.id.clone())
        .bind(d.letter.url.clone())
        .bind(d.letter.event_type.clone())
        .bind(d.letter.event_seq)
        .bind(d.body.clone())
        .bind(d.letter.attempts)
        .bind(d.letter.last_error.clone())
        .bind(d.letter.first_attempt_at)
        .bind(now)
        .execute(&mut *tx.tx)
        .await?;
        tx.commit(self).await
    }

    /// Dead letters, newest first.
    pub async fn dead_letters(&self, limit: i64, offset: i64) -> Result<Vec<DeadLetterRecord>> {
        let rows: Vec<AnyRow> = sqlx::query(AssertSqlSafe(format!(
            "SELECT {COLS} FROM webhook_dead_letter ORDER BY created_at DESC, id DESC LIMIT $1 OFFSET $2"
        )))
        .bind(limit)
        .bind(offset)
        .fetch_all(self.pool())
        .await?;
        rows.iter().map(record).collect()
    }

    /// The dead letters with these ids (unknown ids are left out).
    pub async fn dead_letters_by_id(&self, ids: &[String]) -> Result<Vec<DeadLetterRecord>> {
        let mut out = Vec::new();
        for chunk in ids.chunks(500) {
            let sql = format!(
                "SELECT {COLS} FROM webhook_dead_letter WHERE id IN ({}) ORDER BY created_at, id",
                crate::rows::placeholders(1, chunk.len())
            );
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for id in chunk {
                q = q.bind(id.clone());
            }
            for row in q.fetch_all(self.pool()).await? {
                out.push(record(&row)?);
            }
        }
        Ok(out)
    }

    /// Removes dead letters (after they were queued again). Returns how many were removed.
    pub async fn delete_dead_letters(&self, ids: &[String]) -> Result<u64> {
        let mut n = 0;
        for chunk in ids.chunks(500) {
            let mut tx = self.begin().await?;
            let sql = format!("DELETE FROM webhook_dead_letter WHERE id IN ({})", crate::rows::placeholders(1, chunk.len()));
            let mut q = sqlx::query(AssertSqlSafe(sql));
            for id in chunk {
                q = q.bind(id.clone());
            }
            n += q.execute(&mut *tx.tx).await?.rows_affected();
            tx.commit(self).await?;
        }
        Ok(n)
    }

    pub async fn count_dead_letters(&self) -> Result<i64> {
        let row: AnyRow = sqlx::query("SELECT COUNT(*) AS n FROM webhook_dead_letter").fetch_one(self.pool()).await?;
        get_i64(&row, "n")
    }

    /// Forks that ended `failed` (the backfill queue's dead letters).
    pub async fn count_failed_forks(&self) -> Result<i64> {
        let row: AnyRow = sqlx::query("SELECT COUNT(*) AS n FROM fork WHERE status = 'failed'").fetch_one(self.pool()).await?;
        get_i64(&row, "n")
    }
}
