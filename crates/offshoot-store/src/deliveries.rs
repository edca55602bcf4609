//! Dead-lettered webhook deliveries: what the worker gave up on, with the body it sent, so an
//! admin can list and replay them. Deliveries still being tried live in the job queue.

use crate::{Result, Store};
use offshoot_core::jobs::DeadLetter;
use offshoot_core::time;
use sqlx::AssertSqlSafe;

/// A dead letter and the exact body that was sent (and is sent again on replay).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterRecord {
    pub letter: DeadLetter,
    pub body: String,
}

const COLS: &str = "id, url, event_type, event_seq, body, attempts, last_error, first_attempt_at, created_at";

#[derive(sqlx::FromRow)]
struct DeadLetterRow {
    id: String,
    url: String,
    event_type: String,
    event_seq: i64,
    body: String,
    attempts: i64,
    last_error: String,
    first_attempt_at: i64,
    created_at: i64,
}

impl From<DeadLetterRow> for DeadLetterRecord {
    fn from(r: DeadLetterRow) -> DeadLetterRecord {
        DeadLetterRecord {
            letter: DeadLetter {
                id: r.id,
                url: r.url,
                event_type: r.event_type,
                event_seq: r.event_seq,
                attempts: r.attempts,
                last_error: r.last_error,
                first_attempt_at: r.first_attempt_at,
                created_at: r.created_at,
            },
            body: r.body,
        }
    }
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
        .execute(crate::counted(&mut *tx.tx))
        .await?;
        tx.commit(self).await
    }

    /// Dead letters, newest first.
    pub async fn dead_letters(&self, limit: i64, offset: i64) -> Result<Vec<DeadLetterRecord>> {
        let rows: Vec<DeadLetterRow> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {COLS} FROM webhook_dead_letter ORDER BY created_at DESC, id DESC LIMIT $1 OFFSET $2"
        )))
        .bind(limit)
        .bind(offset)
        .fetch_all(crate::counted(self.pool()))
        .await?;
        Ok(crate::rows::all(rows))
    }

    /// The dead letters with these ids (unknown ids are left out).
    pub async fn dead_letters_by_id(&self, ids: &[String]) -> Result<Vec<DeadLetterRecord>> {
        let mut out = Vec::new();
        for chunk in ids.chunks(500) {
            let sql = format!(
                "SELECT {COLS} FROM webhook_dead_letter WHERE id IN ({}) ORDER BY created_at, id",
                crate::rows::placeholders(1, chunk.len())
            );
            let mut q = sqlx::query_as::<_, DeadLetterRow>(AssertSqlSafe(sql));
            for id in chunk {
                q = q.bind(id.clone());
            }
            out.extend(q.fetch_all(crate::counted(self.pool())).await?.into_iter().map(DeadLetterRecord::from));
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
            n += q.execute(crate::counted(&mut *tx.tx)).await?.rows_affected();
            tx.commit(self).await?;
        }
        Ok(n)
    }

    pub async fn count_dead_letters(&self) -> Result<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM webhook_dead_letter").fetch_one(crate::counted(self.pool())).await?)
    }

    /// Forks that ended `failed` (the backfill queue's dead letters).
    pub async fn count_failed_forks(&self) -> Result<i64> {
        Ok(sqlx::query_scalar("SELECT COUNT(*) FROM fork WHERE status = 'failed'").fetch_one(crate::counted(self.pool())).await?)
    }
}
