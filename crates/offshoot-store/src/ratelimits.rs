//! Rate-limit windows shared by several api processes on PostgreSQL: one row per key and
//! minute, to which each process adds its own count every flush interval and reads the sum
//! back (the api crate's `ratelimit` module, README "Rate limits"). SQLite is one process and
//! never writes here.

use crate::{Result, Store};
use sqlx::Row;

/// Rows per statement of [`Store::add_rate_counts`].
const BATCH: usize = 300;

impl Store {
    /// Adds `delta` to the count of each `(key, window)` (one upsert per row, one statement
    /// per 300 rows) and returns each row's count after the addition.
    pub async fn add_rate_counts(&self, rows: &[(String, i64, i64)]) -> Result<Vec<(String, i64, i64)>> {
        let mut out = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(BATCH) {
            let values: Vec<String> = (0..chunk.len()).map(|i| format!("(${}, ${}, ${})", 3 * i + 1, 3 * i + 2, 3 * i + 3)).collect();
            let sql = format!(
                "INSERT INTO rate_limit_window (key, window_start, count) VALUES {} \
                 ON CONFLICT (key, window_start) DO UPDATE SET count = rate_limit_window.count + excluded.count \
                 RETURNING key, window_start, count",
                values.join(", ")
            );
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for (key, window, delta) in chunk {
                q = q.bind(key.clone()).bind(*window).bind(*delta);
            }
            for row in q.fetch_all(crate::counted(self.pool())).await? {
                out.push((row.try_get::<String, _>(0)?, row.try_get::<i64, _>(1)?, row.try_get::<i64, _>(2)?));
            }
        }
        Ok(out)
    }

    /// Deletes the windows that started before `before` (Unix seconds).
    pub async fn prune_rate_counts(&self, before: i64) -> Result<u64> {
        let done =
            sqlx::query("DELETE FROM rate_limit_window WHERE window_start < $1").bind(before).execute(crate::counted(self.pool())).await?;
        Ok(done.rows_affected())
    }
}
