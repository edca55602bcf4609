//! Message search (`offshoot_core::search`): the channels a search looks in, then one statement
//! over the full-text index of their messages with the visibility every channel read applies,
//! ranked, sorted and paged; with `dedupe_copies`, one hit per source message across a source
//! and its forks.
//!
//! The full-text indexes (migration 0020) are kept by the database in the transaction that
//! writes a message, so sends, edits, deletes, fork copies and backfill pages need nothing
//! here. SQLite: the contentless FTS5 table `message_search` of each message's text and
//! channel (keyed by the message's rowid), ranked by `bm25` of the text. PostgreSQL: the GIN
//! index `message_search` of the generated column `search_document`, ranked by `ts_rank`.
//! Relevance is "higher is better" on both.
//!
//! The statement reads no other table for the hits: each searched channel's truncation is read
//! with the channel list and written into it as a constant, so the plan is the full-text index
//! and the message table whatever the planner estimates (docs/performance.md, "Message search").

use crate::channels::load_channels;
use crate::messages::hydrate_messages_of;
use crate::query::{channel_condition, custom_leaf, SqlBuilder};
use crate::rows::{MessageRow, MESSAGE_COLS};
use crate::sql::{arguments, Bind};
use crate::visibility::visible_after;
use crate::{Backend, Result, Store};
use offshoot_core::model::{Channel, Message, Viewer};
use offshoot_core::query::{Op, Scalar, Sort};
use offshoot_core::search::{Cursor, FullText, MessageField, MessageSortField, Search, MAX_CHANNELS};
use offshoot_core::Error;
use serde_json::Value;
use sqlx::AssertSqlSafe;

/// The indexed document of a message on PostgreSQL: the generated column the `message_search`
/// index covers (migration 0020).
const PG_DOCUMENT: &str = "m.search_document";

/// How many source links a copy's lineage is followed up to its original, for `dedupe_copies`
/// (a fork of a fork of … records its direct source only).
const MAX_LINEAGE_DEPTH: i64 = 64;

/// A page of search hits, each with its channel, and the cursors around it.
#[derive(Debug, Clone)]
pub struct SearchPage {
    pub hits: Vec<(Message, Channel)>,
    pub next: Option<String>,
    pub previous: Option<String>,
}

#[derive(sqlx::FromRow)]
struct Hit {
    #[sqlx(flatten)]
    row: MessageRow,
    score: f64,
}

/// The full-text match of `ft` as the engine's query text.
fn match_text(backend: Backend, ft: &FullText) -> String {
    match backend {
        // Each word a quoted FTS5 string (words hold letters and digits only), all required,
        // in the text column only.
        Backend::Sqlite => format!(
            "{{text}} : ({})",
            ft.words.iter().map(|w| format!("\"{w}\"{}", if ft.prefix { "*" } else { "" })).collect::<Vec<_>>().join(" ")
        ),
        Backend::Postgres => ft.words.iter().map(|w| format!("'{w}'{}", if ft.prefix { ":*" } else { "" })).collect::<Vec<_>>().join(" & "),
    }
}

/// A channel's token in the `cid` column of SQLite's `message_search` (migration 0020): the
/// hex of its cid's bytes, as SQLite's `hex()` writes it.
fn channel_token(cid: &str) -> String {
    cid.bytes().map(|b| format!("{b:02X}")).collect()
}

/// The FTS5 condition that a hit is in one of `channels`.
fn channels_match(channels: &[SearchedChannel]) -> String {
    format!("{{cid}} : ({})", channels.iter().map(|c| format!("\"{}\"", channel_token(&c.cid))).collect::<Vec<_>>().join(" OR "))
}

/// A channel a search looks in, with its truncation (messages created at or before it are
/// hidden from every read).
#[derive(sqlx::FromRow)]
struct SearchedChannel {
    cid: String,
    truncated_at: Option<i64>,
}

/// The SQL expression (on message alias `m`) of the truncation of the hit's channel among
/// `channels`, for [`visible_after`]: each truncated channel's time bound as a value, and
/// `m.created_at - 1` (nothing hidden) for the others.
fn truncation(b: &mut SqlBuilder, channels: &[SearchedChannel]) -> String {
    let whens: Vec<String> = channels
        .iter()
        .filter_map(|c| c.truncated_at.map(|t| (c, t)))
        .map(|(c, t)| format!("WHEN {} THEN {}", b.bind(Bind::S(c.cid.clone())), b.bind(Bind::I(t))))
        .collect();
    if whens.is_empty() {
        "m.created_at - 1".to_string()
    } else {
        format!("CASE m.cid {} ELSE m.created_at - 1 END", whens.join(" "))
    }
}

/// The `tsquery` of a bound query text (PostgreSQL), its diacritics removed as the documents'.
fn pg_query(p: &str) -> String {
    format!("to_tsquery('simple'::regconfig, offshoot_search_text({p}))")
}

/// A condition (on message alias `m`) that the message matches `ft`.
fn full_text_condition(b: &mut SqlBuilder, ft: &FullText) -> String {
    let p = b.bind(Bind::S(match_text(b.backend, ft)));
    match b.backend {
        Backend::Sqlite => format!("m.rowid IN (SELECT rowid FROM message_search WHERE message_search MATCH {p})"),
        Backend::Postgres => format!("{PG_DOCUMENT} @@ {}", pg_query(&p)),
    }
}

/// A `text` condition: a full-text match of each value.
fn text_leaf(b: &mut SqlBuilder, op: &Op) -> Result<String, Error> {
    let mut one = |b: &mut SqlBuilder, s: &Scalar, prefix: bool| -> Result<String, Error> {
        let Scalar::Str(text) = s else { return Err(Error::input("text takes a string").field("field", "text")) };
        Ok(match FullText::parse(text, prefix)? {
            Some(ft) => full_text_condition(b, &ft),
            None => "1 = 0".to_string(),
        })
    };
    let any = |b: &mut SqlBuilder, items: &[Scalar], one: &mut dyn FnMut(&mut SqlBuilder, &Scalar, bool) -> Result<String, Error>| {
        if items.is_empty() {
            return Ok::<_, Error>("1 = 0".to_string());
        }
        let parts = items.iter().map(|s| one(b, s, false)).collect::<Result<Vec<_>, _>>()?;
        Ok(format!("({})", parts.join(" OR ")))
    };
    Ok(match op {
        Op::Eq(s) => one(b, s, false)?,
        Op::Autocomplete(t) => one(b, &Scalar::Str(t.clone()), true)?,
        Op::Ne(s) => format!("NOT ({})", one(b, s, false)?),
        Op::In(items) => any(b, items, &mut one)?,
        Op::Nin(items) => format!("NOT {}", any(b, items, &mut one)?),
        _ => return Err(Error::input("text takes a full-text match: a string, $q, $autocomplete, $in, $ne or $nin").field("field", "text")),
    })
}

/// An `attachments.type` condition: some attachment's type compared by `op` (`$eq`, `$in`,
/// `$exists`), or none (`$ne`, `$nin`, `$exists: false`).
fn attachment_type_leaf(b: &mut SqlBuilder, op: &Op) -> Result<String, Error> {
    let (each, ty) = match b.backend {
        Backend::Sqlite => ("json_each(m.attachments) AS a", "json_extract(a.value, '$.type')"),
        Backend::Postgres => ("jsonb_array_elements(m.attachments::jsonb) AS a(value)", "(a.value ->> 'type')"),
    };
    let exists = |cond: String| format!("EXISTS (SELECT 1 FROM {each} WHERE {cond})");
    Ok(match op {
        Op::Eq(_) | Op::In(_) | Op::Exists(true) => exists(b.compare(ty, op, true)),
        Op::Ne(s) => format!("NOT {}", exists(b.compare(ty, &Op::Eq(s.clone()), true))),
        Op::Nin(items) => format!("NOT {}", exists(b.compare(ty, &Op::In(items.clone()), true))),
        Op::Exists(false) => format!("NOT {}", exists(b.compare(ty, &Op::Exists(true), true))),
        _ => return Err(Error::input("attachments.type takes $eq, $in, $ne, $nin or $exists").field("field", "attachments.type")),
    })
}

fn message_leaf(b: &mut SqlBuilder, field: &MessageField, op: &Op) -> Result<String, Error> {
    Ok(match field {
        MessageField::Id => b.compare("m.id", op, false),
        MessageField::Text => text_leaf(b, op)?,
        MessageField::UserId => b.compare("m.user_id", op, false),
        MessageField::Type => b.compare("m.type", op, false),
        MessageField::ParentId => b.compare("m.parent_id", op, true),
        MessageField::CreatedAt => b.compare("m.created_at", op, false),
        MessageField::UpdatedAt => b.compare("m.updated_at", op, false),
        MessageField::Pinned => b.compare("m.pinned", op, false),
        MessageField::ReplyCount => b.compare("m.reply_count", op, false),
        MessageField::Attachments => match op {
            Op::Exists(true) => "m.attachments <> '[]'".to_string(),
            Op::Exists(false) => "m.attachments = '[]'".to_string(),
            _ => return Err(Error::input("attachments takes $exists").field("field", "attachments")),
        },
        MessageField::AttachmentType => attachment_type_leaf(b, op)?,
        MessageField::Custom(key) => custom_leaf(b, "m.custom", key, op),
    })
}

fn sort_column(field: MessageSortField) -> &'static str {
    match field {
        MessageSortField::Relevance => "m.score",
        MessageSortField::Id => "m.id",
        MessageSortField::CreatedAt => "m.created_at",
        MessageSortField::UpdatedAt => "m.updated_at",
        MessageSortField::ReplyCount => "m.reply_count",
    }
}

/// A hit's value of a sort field, for a cursor.
fn sort_value(m: &Message, score: f64, field: MessageSortField) -> Value {
    match field {
        MessageSortField::Relevance => score.into(),
        MessageSortField::Id => m.id.clone().into(),
        MessageSortField::CreatedAt => m.created_at.into(),
        MessageSortField::UpdatedAt => m.updated_at.into(),
        MessageSortField::ReplyCount => m.reply_count.into(),
    }
}

fn bad_cursor() -> Error {
    Error::input("next is not a cursor this server gave").field("field", "next")
}

/// The keyset condition: hits after (or, `before`, ahead of) `key` in the order of `sort`.
fn keyset(b: &mut SqlBuilder, sort: &[Sort<MessageSortField>], key: &[Value], before: bool) -> Result<String, Error> {
    let mut values = Vec::with_capacity(key.len());
    for (s, v) in sort.iter().zip(key) {
        let bind = match s.field {
            MessageSortField::Relevance => Bind::F(v.as_f64().ok_or_else(bad_cursor)?),
            MessageSortField::Id => Bind::S(v.as_str().ok_or_else(bad_cursor)?.to_string()),
            _ => Bind::I(v.as_i64().ok_or_else(bad_cursor)?),
        };
        values.push(b.bind(bind));
    }
    let mut alternatives = Vec::with_capacity(sort.len());
    for i in 0..sort.len() {
        let mut parts: Vec<String> = (0..i).map(|j| format!("{} = {}", sort_column(sort[j].field), values[j])).collect();
        let later = sort[i].desc != before;
        parts.push(format!("{} {} {}", sort_column(sort[i].field), if later { "<" } else { ">" }, values[i]));
        alternatives.push(format!("({})", parts.join(" AND ")));
    }
    Ok(format!("({})", alternatives.join(" OR ")))
}

fn order_by(sort: &[Sort<MessageSortField>], reverse: bool) -> String {
    sort.iter()
        .map(|s| format!("{} {}", sort_column(s.field), if s.desc != reverse { "DESC" } else { "ASC" }))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Store {
    /// The channels `s` searches for `viewer`: those its channel filter selects that are not
    /// deleted and, for users other than admins, that they are a member of (as Query Channels
    /// and every channel read require), at most [`MAX_CHANNELS`], the most recently active first.
    async fn search_channels(&self, s: &Search, viewer: &Viewer) -> Result<Vec<SearchedChannel>> {
        let mut b = SqlBuilder::new(self.backend(), Vec::new());
        let cond = channel_condition(&mut b, &s.channels, viewer.user_id())?;
        let mut sql = format!("SELECT c.cid, c.truncated_at FROM channel c WHERE c.deleted_at IS NULL AND {cond}");
        if !viewer.is_admin() {
            let Some(uid) = viewer.user_id() else { return Ok(Vec::new()) };
            let p = b.bind(Bind::S(uid.to_string()));
            sql.push_str(&format!(" AND EXISTS (SELECT 1 FROM member mo WHERE mo.cid = c.cid AND mo.user_id = {p})"));
        }
        sql.push_str(&format!(" ORDER BY c.last_message_at DESC NULLS LAST, c.cid LIMIT {MAX_CHANNELS}"));
        Ok(sqlx::query_as_with(AssertSqlSafe(sql), arguments(&b.binds)?).fetch_all(crate::counted(self.pool())).await?)
    }

    /// Message search: a page of the hits `s` asks for that `viewer` may read, each with its
    /// channel, hydrated as channel reads hydrate messages. A hit is a message of a searched
    /// channel that a read of that channel by `viewer` shows (not rewound, truncated, shadowed
    /// from them or restricted to others) and that is not deleted, ephemeral or an error.
    pub async fn search_messages(&self, s: &Search, viewer: &Viewer) -> Result<SearchPage> {
        let empty = SearchPage { hits: Vec::new(), next: None, previous: None };
        if s.matches_nothing {
            return Ok(empty);
        }
        let channels = self.search_channels(s, viewer).await?;
        if channels.is_empty() {
            return Ok(empty);
        }
        let backend = self.backend();
        let mut b = SqlBuilder::new(backend, Vec::new());
        // Relevance is computed only when the sort uses it: ranking reads every match's text
        // again on PostgreSQL, and the UI kit sorts by `created_at`.
        let ranked = s.sort.iter().any(|x| x.field == MessageSortField::Relevance);
        // The ranking term: SQLite reads the FTS5 table first (bm25 needs its match in the
        // FROM), matching the words in the text and the searched channels in the channel column
        // (so FTS5 returns only the hits in those channels), the text alone weighing in bm25;
        // PostgreSQL matches and ranks the stored document.
        let (from, score, mut conds) = match (&s.text, backend) {
            (Some(ft), Backend::Sqlite) => {
                let p = b.bind(Bind::S(format!("{} AND {}", match_text(backend, ft), channels_match(&channels))));
                let rank = if ranked { "-bm25(message_search, 1.0, 0.0)" } else { "0.0" };
                (
                    format!(
                        "(SELECT rowid AS rid, {rank} AS score FROM message_search WHERE message_search MATCH {p}) AS h \
                         JOIN message m ON m.rowid = h.rid"
                    ),
                    "h.score".to_string(),
                    Vec::new(),
                )
            }
            (Some(ft), Backend::Postgres) => {
                let p = b.bind(Bind::S(match_text(backend, ft)));
                let q = pg_query(&p);
                (
                    "message m".to_string(),
                    if ranked {
                        format!("CAST(ts_rank({PG_DOCUMENT}, {q}) AS DOUBLE PRECISION)")
                    } else {
                        "CAST(0 AS DOUBLE PRECISION)".to_string()
                    },
                    vec![format!("{PG_DOCUMENT} @@ {q}")],
                )
            }
            (None, _) => ("message m".to_string(), "CAST(0 AS DOUBLE PRECISION)".to_string(), Vec::new()),
        };
        let in_channels = channels.iter().map(|c| b.bind(Bind::S(c.cid.clone()))).collect::<Vec<_>>().join(", ");
        conds.push(format!("m.cid IN ({in_channels})"));
        conds.push("m.deleted_at IS NULL AND m.type NOT IN ('ephemeral', 'error', 'deleted')".to_string());
        // The visibility of channel reads (`messages::visible_to`), each channel's truncation
        // as read with the channel list.
        let truncated = truncation(&mut b, &channels);
        conds.push(visible_after(viewer, &truncated, &mut b.binds));
        if let Some(f) = &s.filter {
            let cond = b.tree(f, &mut |b, field, op| message_leaf(b, field, op))?;
            conds.push(cond);
        }
        let hits = format!("SELECT {MESSAGE_COLS}, {score} AS score FROM {from} WHERE {}", conds.join(" AND "));
        let source = if s.dedupe_copies { deduped(&mut b, s, &hits) } else { (String::new(), format!("({hits}) AS m")) };
        let before = s.cursor.as_ref().is_some_and(|c| c.previous);
        let mut sql = format!("{} SELECT {MESSAGE_COLS}, m.score FROM {}", source.0, source.1);
        if let Some(c) = &s.cursor {
            sql.push_str(&format!(" WHERE {}", keyset(&mut b, &s.sort, &c.key, before)?));
        }
        sql.push_str(&format!(" ORDER BY {} LIMIT {} OFFSET {}", order_by(&s.sort, before), s.limit + 1, s.offset));
        let mut conn = self.pool().acquire().await?;
        let rows: Vec<Hit> = match backend {
            // The store's connections plan without bitmap scans (docs/performance.md,
            // "PostgreSQL without statistics"), and a GIN index is read by nothing else: the
            // statement runs in a transaction that allows them, so its plan is the index
            // whatever the planner estimates.
            Backend::Postgres => {
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                sqlx::query("SET LOCAL enable_bitmapscan = on").execute(crate::counted(&mut *tx)).await?;
                let rows = sqlx::query_as_with(AssertSqlSafe(sql), arguments(&b.binds)?).fetch_all(crate::counted(&mut *tx)).await?;
                tx.commit().await?;
                rows
            }
            Backend::Sqlite => sqlx::query_as_with(AssertSqlSafe(sql), arguments(&b.binds)?).fetch_all(crate::counted(&mut *conn)).await?,
        };
        let more = rows.len() as i64 > s.limit;
        let mut hits: Vec<(Message, f64)> = rows.into_iter().take(s.limit as usize).map(|h| (Message::from(h.row), h.score)).collect();
        if before {
            hits.reverse();
        }
        let cursor = |(m, score): &(Message, f64), previous: bool| {
            Cursor {
                sort: s.sort.iter().map(|x| (x.field, x.desc)).collect(),
                key: s.sort.iter().map(|x| sort_value(m, *score, x.field)).collect(),
                previous,
            }
            .encode()
        };
        let (next, previous) = match (hits.first(), hits.last()) {
            (Some(first), Some(last)) => {
                let next = (if before { true } else { more }).then(|| cursor(last, false));
                let previous = (if before { more } else { s.cursor.is_some() || s.offset > 0 }).then(|| cursor(first, true));
                (next, previous)
            }
            _ => (None, None),
        };
        let mut msgs: Vec<Message> = hits.into_iter().map(|(m, _)| m).collect();
        let mut hit_cids: Vec<String> = msgs.iter().map(|m| m.cid.clone()).collect();
        hit_cids.sort();
        hit_cids.dedup();
        let channels = load_channels(&mut conn, &self.cache, &hit_cids).await?;
        hydrate_messages_of(&mut conn, &mut msgs, viewer, &|cid| channels.get(cid).and_then(|c| c.truncated_at)).await?;
        let hits = msgs.into_iter().filter_map(|m| channels.get(&m.cid).cloned().map(|c| (m, c))).collect();
        Ok(SearchPage { hits, next, previous })
    }
}

/// `(WITH …, FROM …)` keeping one hit per original message among `hits` (a statement):
/// copies are followed up their `source_message_id` links to the message they copy (or
/// the last one still there); the hit kept is the one in the channel listed first by the
/// filter, else the original, else the first by cid.
fn deduped(b: &mut SqlBuilder, s: &Search, hits: &str) -> (String, String) {
    let listed = s.listed_cids.len();
    let preference = if listed == 0 {
        "CASE WHEN h.source_message_id IS NULL THEN 0 ELSE 1 END".to_string()
    } else {
        let whens: Vec<String> =
            s.listed_cids.iter().enumerate().map(|(i, cid)| format!("WHEN {} THEN {i}", b.bind(Bind::S(cid.clone())))).collect();
        format!("CASE h.cid {} ELSE {listed} + CASE WHEN h.source_message_id IS NULL THEN 0 ELSE 1 END END", whens.join(" "))
    };
    let with = format!(
            "WITH RECURSIVE hits AS ({hits}), \
             up (id, origin_id, depth) AS ( \
               SELECT h.id, h.source_message_id, 0 FROM hits h WHERE h.source_message_id IS NOT NULL \
               UNION ALL \
               SELECT up.id, s.source_message_id, up.depth + 1 FROM up JOIN message s ON s.id = up.origin_id \
               WHERE s.source_message_id IS NOT NULL AND up.depth < {MAX_LINEAGE_DEPTH}), \
             origin (id, origin_id) AS (SELECT u.id, u.origin_id FROM up u WHERE NOT EXISTS (SELECT 1 FROM up d WHERE d.id = u.id AND d.depth > u.depth)), \
             ranked AS (SELECT h.*, ROW_NUMBER() OVER (PARTITION BY COALESCE(o.origin_id, h.id) ORDER BY {preference}, h.cid, h.id) AS copy_rank \
               FROM hits h LEFT JOIN origin o ON o.id = h.id)"
        );
    (with, "(SELECT * FROM ranked WHERE copy_rank = 1) AS m".to_string())
}
