//! Uploaded files and the messages that refer to them (migration 0017).
//!
//! An upload row names a stored object; a reference row (`upload_ref`) says that a message's
//! attachments point at it. References are written in the transaction that writes the message:
//! a new message, an edit that adds a link, a fork's copies (the copy refers to the same file:
//! no byte is copied). They go when the message row goes (hard delete of the message or its
//! channel, hard truncate). An edit that drops a link keeps the reference until the message is
//! gone: a file is never freed while any message row might still show it.
//!
//! A file is freed only when no message of any channel refers to it any more: `referenced` is
//! set once a message has referred to it (a file uploaded and never attached is kept, as on
//! Stream) and [`Store::collect_unreferenced_uploads`] deletes each referenced upload without a
//! reference, in the files job.
//!
//! **Concurrent writers (PostgreSQL).** A writer of references first takes the upload rows
//! `FOR SHARE` (writers do not wait for each other) and writes references only for the rows it
//! got; the collector takes one upload row `FOR UPDATE`, then looks for references in a
//! statement of its own (READ COMMITTED: it sees every reference committed before its lock was
//! granted) and deletes the row only when there is none. Either the writer's share lock comes
//! first, and the collector then sees its reference, or the collector's delete does, and the
//! writer then finds no row and refers to nothing. Upload rows come after message rows in the
//! lock order (crate doc) and the collector locks one upload row alone. On SQLite writers are
//! serialised and the same statements are correct as they are.

use crate::rows::{self, Flag};
use crate::{Backend, Result, Store, Tx};
use offshoot_core::model::Message;
use offshoot_core::time;
use serde_json::Value;
use sqlx::AssertSqlSafe;

/// The path segment before an upload's id in its URL (`…/uploads/{id}/{name}`).
pub const UPLOAD_PATH: &str = "/uploads/";

/// An uploaded file as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    /// 32 lower-case hex digits.
    pub id: String,
    /// Where the storage keeps it.
    pub object_key: String,
    /// The channel it was uploaded to.
    pub cid: String,
    pub user_id: String,
    /// `file` or `image`.
    pub kind: String,
    /// The file name as uploaded.
    pub name: String,
    pub mime_type: String,
    pub size: i64,
    /// Some message has referred to it (or its deletion was asked while one did).
    pub referenced: bool,
    pub created_at: i64,
}

#[derive(sqlx::FromRow)]
struct UploadRow {
    id: String,
    object_key: String,
    cid: String,
    user_id: String,
    kind: String,
    name: String,
    mime_type: String,
    size: i64,
    referenced: Flag,
    created_at: i64,
}

impl From<UploadRow> for Upload {
    fn from(r: UploadRow) -> Upload {
        Upload {
            id: r.id,
            object_key: r.object_key,
            cid: r.cid,
            user_id: r.user_id,
            kind: r.kind,
            name: r.name,
            mime_type: r.mime_type,
            size: r.size,
            referenced: r.referenced.0,
            created_at: r.created_at,
        }
    }
}

const UPLOAD_COLS: &str = "id, object_key, cid, user_id, kind, name, mime_type, size, referenced, created_at";

/// What asking to delete an upload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Release {
    /// No message referred to it: its row is gone; remove this object from storage.
    Freed(String),
    /// Messages still refer to it: it is freed when the last of them goes.
    Kept,
    /// No such upload.
    Missing,
}

/// The upload ids that `attachments` link to: each string value of an attachment (at any
/// depth) holding [`UPLOAD_PATH`] followed by 32 hex digits and a `/`.
pub fn upload_ids(attachments: &[Value]) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) => {
                let mut rest = s.as_str();
                while let Some(i) = rest.find(UPLOAD_PATH) {
                    rest = &rest[i + UPLOAD_PATH.len()..];
                    let id = rest.get(..32).filter(|id| id.bytes().all(|b| b.is_ascii_hexdigit()));
                    if let Some(id) = id.filter(|_| rest[32..].starts_with('/')) {
                        let id = id.to_ascii_lowercase();
                        if !out.contains(&id) {
                            out.push(id);
                        }
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            Value::Object(o) => o.values().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for a in attachments {
        walk(a, &mut out);
    }
    out
}

/// Records that each of `msgs` refers to the uploads its attachments link to (those that
/// exist). Nothing is read or written for messages without such a link, so sends and edits
/// without uploads cost nothing more.
pub(crate) async fn refer<'a>(tx: &mut Tx, msgs: impl IntoIterator<Item = &'a Message>) -> Result<()> {
    let pairs: Vec<(String, String)> =
        msgs.into_iter().flat_map(|m| upload_ids(&m.attachments).into_iter().map(move |u| (m.id.clone(), u))).collect();
    if pairs.is_empty() {
        return Ok(());
    }
    let mut uploads: Vec<String> = pairs.iter().map(|(_, u)| u.clone()).collect();
    uploads.sort();
    uploads.dedup();
    let present = share_uploads(tx, &uploads).await?;
    let pairs: Vec<(String, String)> = pairs.into_iter().filter(|(_, u)| present.contains(u)).collect();
    let now = time::now();
    for chunk in pairs.chunks(200) {
        let values = rows::value_rows(tx.backend, 1, chunk.len(), 4);
        let sql = format!(
            "INSERT INTO upload_ref (message_id, upload_id, created_at, updated_at) VALUES {values} ON CONFLICT (message_id, upload_id) DO NOTHING"
        );
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for (m, u) in chunk {
            q = q.bind(m.clone()).bind(u.clone()).bind(now).bind(now);
        }
        q.execute(crate::counted(&mut *tx.tx)).await?;
    }
    mark_referenced(tx, &present, now).await
}

/// Gives each copy (`(source id, copy id, …)`) the references of its source: a fork's copies
/// share the source's files.
pub(crate) async fn copy_refs<A, B>(tx: &mut Tx, copies: &[(String, String, A, B)]) -> Result<()> {
    if copies.is_empty() {
        return Ok(());
    }
    let now = time::now();
    let sources: Vec<String> = copies.iter().map(|c| c.0.clone()).collect();
    let mut uploads = Vec::new();
    for chunk in sources.chunks(500) {
        let sql = format!(
            "SELECT DISTINCT upload_id FROM upload_ref WHERE message_id IN ({})",
            rows::many_placeholders(tx.backend, 1, chunk.len())
        );
        let mut q = sqlx::query_scalar::<_, String>(AssertSqlSafe(sql));
        for id in chunk {
            q = q.bind(id.clone());
        }
        uploads.extend(q.fetch_all(crate::counted(&mut *tx.tx)).await?);
    }
    if uploads.is_empty() {
        return Ok(());
    }
    uploads.sort();
    uploads.dedup();
    let present = share_uploads(tx, &uploads).await?;
    if present.is_empty() {
        return Ok(());
    }
    for chunk in copies.chunks(200) {
        let values = rows::value_rows(tx.backend, 1, chunk.len(), 2);
        // `now` is this process's clock, written into the statement as a number.
        let sql = format!(
            "INSERT INTO upload_ref (message_id, upload_id, created_at, updated_at) \
             SELECT v.column2, r.upload_id, {now}, {now} FROM (VALUES {values}) AS v JOIN upload_ref r ON r.message_id = v.column1 \
             JOIN upload u ON u.id = r.upload_id \
             ON CONFLICT (message_id, upload_id) DO NOTHING"
        );
        let sql = match tx.backend {
            // SQLite reads `ON CONFLICT` after a `SELECT … JOIN` as the join's; a `WHERE` ends it.
            Backend::Sqlite => sql.replace(" ON CONFLICT", " WHERE TRUE ON CONFLICT"),
            Backend::Postgres => sql,
        };
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for (src, copy, _, _) in chunk {
            q = q.bind(src.clone()).bind(copy.clone());
        }
        q.execute(crate::counted(&mut *tx.tx)).await?;
    }
    Ok(())
}

/// The ids among `uploads` (sorted) that exist, their rows held `FOR SHARE` on PostgreSQL.
async fn share_uploads(tx: &mut Tx, uploads: &[String]) -> Result<Vec<String>> {
    let lock = match tx.backend {
        Backend::Postgres => " ORDER BY id FOR SHARE",
        Backend::Sqlite => "",
    };
    let mut present = Vec::new();
    for chunk in uploads.chunks(500) {
        let sql = format!("SELECT id FROM upload WHERE id IN ({}){lock}", rows::many_placeholders(tx.backend, 1, chunk.len()));
        let mut q = sqlx::query_scalar::<_, String>(AssertSqlSafe(sql));
        for id in chunk {
            q = q.bind(id.clone());
        }
        present.extend(q.fetch_all(crate::counted(&mut *tx.tx)).await?);
    }
    Ok(present)
}

/// Sets `referenced` on those of `uploads` not marked yet (the rows already marked are left
/// alone, so writers referring to a file already in use do not queue on its row).
async fn mark_referenced(tx: &mut Tx, uploads: &[String], now: i64) -> Result<()> {
    for chunk in uploads.chunks(500) {
        let sql = format!(
            "UPDATE upload SET referenced = TRUE, updated_at = {p1} WHERE referenced = FALSE AND id IN ({ids})",
            p1 = rows::many_placeholders(tx.backend, 1, 1),
            ids = rows::many_placeholders(tx.backend, 2, chunk.len())
        );
        let mut q = sqlx::query(AssertSqlSafe(sql)).bind(now);
        for id in chunk {
            q = q.bind(id.clone());
        }
        q.execute(crate::counted(&mut *tx.tx)).await?;
    }
    Ok(())
}

impl Store {
    /// Records a file just stored.
    pub async fn record_upload(&self, u: &Upload) -> Result<()> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "INSERT INTO upload (id, object_key, cid, user_id, kind, name, mime_type, size, referenced, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, FALSE, $9, $9)",
        )
        .bind(u.id.clone())
        .bind(u.object_key.clone())
        .bind(u.cid.clone())
        .bind(u.user_id.clone())
        .bind(u.kind.clone())
        .bind(u.name.clone())
        .bind(u.mime_type.clone())
        .bind(u.size)
        .bind(u.created_at)
        .execute(crate::counted(&mut *tx.tx))
        .await?;
        tx.commit(self).await
    }

    /// The upload `id`, if it is recorded.
    pub async fn upload(&self, id: &str) -> Result<Option<Upload>> {
        let sql = format!("SELECT {UPLOAD_COLS} FROM upload WHERE id = $1");
        let row = sqlx::query_as::<_, UploadRow>(AssertSqlSafe(sql)).bind(id.to_string()).fetch_optional(self.pool()).await?;
        Ok(row.map(Upload::from))
    }

    /// How many message rows refer to the upload `id`.
    pub async fn upload_references(&self, id: &str) -> Result<i64> {
        Ok(sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM upload_ref WHERE upload_id = $1")
            .bind(id.to_string())
            .fetch_one(self.pool())
            .await?)
    }

    /// Asks to delete the upload `id`: freed now when no message refers to it, else marked so
    /// that the last reference gone frees it.
    pub async fn release_upload(&self, id: &str) -> Result<Release> {
        self.retrying("release_upload", || self.release_upload_once(id)).await
    }

    async fn release_upload_once(&self, id: &str) -> Result<Release> {
        let mut tx = self.begin().await?;
        let outcome = match lock_unreferenced(&mut tx, id).await? {
            Locked::Missing => Release::Missing,
            Locked::Unreferenced(key) => Release::Freed(key),
            Locked::Referenced => {
                sqlx::query("UPDATE upload SET referenced = TRUE, updated_at = $1 WHERE id = $2")
                    .bind(time::now())
                    .bind(id.to_string())
                    .execute(crate::counted(&mut *tx.tx))
                    .await?;
                Release::Kept
            }
        };
        tx.commit(self).await?;
        Ok(outcome)
    }

    /// Deletes the rows of up to `limit` referenced uploads that no message refers to any more;
    /// returns their object keys, for the caller to remove from storage.
    pub async fn collect_unreferenced_uploads(&self, limit: i64) -> Result<Vec<String>> {
        let candidates: Vec<String> = sqlx::query_scalar(
            "SELECT u.id FROM upload u WHERE u.referenced = TRUE AND NOT EXISTS (SELECT 1 FROM upload_ref r WHERE r.upload_id = u.id) ORDER BY u.id LIMIT $1",
        )
        .bind(limit)
        .fetch_all(self.pool())
        .await?;
        let mut freed = Vec::with_capacity(candidates.len());
        for id in candidates {
            let got = self
                .retrying("collect_upload", || async {
                    let mut tx = self.begin().await?;
                    let locked = lock_unreferenced(&mut tx, &id).await?;
                    tx.commit(self).await?;
                    Ok(locked)
                })
                .await?;
            if let Locked::Unreferenced(key) = got {
                freed.push(key);
            }
        }
        Ok(freed)
    }
}

enum Locked {
    Missing,
    Referenced,
    /// Its row was deleted in this transaction; the object key.
    Unreferenced(String),
}

/// Locks the upload row `id` and, when no reference exists once the lock is held, deletes it.
async fn lock_unreferenced(tx: &mut Tx, id: &str) -> Result<Locked> {
    let sql = format!("SELECT object_key FROM upload WHERE id = $1{}", tx.for_update());
    let Some(key) =
        sqlx::query_scalar::<_, String>(AssertSqlSafe(sql)).bind(id.to_string()).fetch_optional(crate::counted(&mut *tx.tx)).await?
    else {
        return Ok(Locked::Missing);
    };
    // A statement of its own, after the lock: it sees every reference committed before.
    let deleted = sqlx::query("DELETE FROM upload WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM upload_ref r WHERE r.upload_id = $1)")
        .bind(id.to_string())
        .execute(crate::counted(&mut *tx.tx))
        .await?
        .rows_affected();
    Ok(if deleted == 1 { Locked::Unreferenced(key) } else { Locked::Referenced })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn upload_ids_are_read_from_any_string_of_an_attachment_once_each() {
        let a = "0123456789abcdef0123456789abcdef";
        let b = "fedcba9876543210fedcba9876543210";
        let atts = vec![
            json!({"type": "image", "image_url": format!("http://h/uploads/{a}/x.png?exp=1&sig=2"), "thumb_url": format!("http://h/uploads/{a}/x.png")}),
            json!({"type": "file", "asset_url": format!("https://cdn/api/uploads/{b}/doc.pdf"), "nested": {"u": "http://h/uploads/nothex0123456789abcdef01234567/x"}}),
            json!({"type": "link", "og_scrape_url": "https://example.com/uploads/short/x"}),
        ];
        assert_eq!(upload_ids(&atts), vec![a.to_string(), b.to_string()]);
        assert!(upload_ids(&[json!({"text": "no links"})]).is_empty());
    }
}
