//! Unread counters: `member.unread_count`, each member's unread messages in one channel.
//!
//! The rule (as Stream's clients count): a message is unread for a member when it is newer than
//! the member's read mark (or, without one, than when they joined, so a fork's copied history
//! is not unread), newer than the channel's truncation, written by someone else, visible to the
//! member (not hidden by a rewind, not deleted, not shadowed, restricted visibility naming
//! them), in the main list (top level, or a reply shown in the channel), and not a system,
//! ephemeral or error message.
//!
//! The counter is kept by the writes that change it, in their transaction, under the channel's
//! lock (crate doc, lock order): a new message adds one for exactly the members it is unread
//! for ([`count_new_message`]); deleting one takes one from exactly the members it counted for
//! ([`uncount_message`]), so neither grows with the history; a read sets the reader's to zero;
//! everything rarer (truncation, rewinds, visibility changes, a channel made again) recounts
//! the channel by the rule ([`recount`]). Reads (`me`, read states, `has_unread`, the counters sent with events)
//! then read member rows, never messages.

use crate::rows;
use crate::{counted, Result, Tx};
use offshoot_core::model::Message;
use sqlx::{AnyConnection, AssertSqlSafe};
use std::collections::{BTreeMap, HashMap};

pub use offshoot_core::model::UnreadCounts;

/// Whether a message counts toward unread counters at all (whoever reads it).
fn counts(m: &Message, truncated_at: Option<i64>) -> bool {
    !m.shadowed
        && !matches!(m.kind.as_str(), "system" | "deleted" | "ephemeral" | "error")
        && (m.parent_id.is_none() || m.show_in_channel)
        && truncated_at.is_none_or(|t| m.created_at > t)
}

/// Adds one to the counter of every member the new message `m` is unread for (the rule of the
/// module doc, evaluated for one message). Run after the message and its restricted-visibility
/// rows are written, with the channel locked.
pub(crate) async fn count_new_message(tx: &mut Tx, m: &Message, truncated_at: Option<i64>) -> Result<()> {
    if !counts(m, truncated_at) {
        return Ok(());
    }
    add_for_readers(tx, m, 1).await
}

/// [`count_new_message`] for several new messages (their channels locked): the messages of
/// restricted visibility one statement each, every other in one statement for all.
pub(crate) async fn count_new_messages(tx: &mut Tx, msgs: &[&Message], truncated_at: impl Fn(&str) -> Option<i64>) -> Result<()> {
    let mut plain = Vec::new();
    for m in msgs.iter().filter(|m| counts(m, truncated_at(&m.cid))) {
        if m.restricted_visibility.is_empty() {
            plain.push(*m);
        } else {
            add_for_readers(tx, m, 1).await?;
        }
    }
    if plain.is_empty() {
        return Ok(());
    }
    let values = rows::value_rows(tx.backend, 1, plain.len(), 3);
    // The member side of the rule, as in `add_for_readers`, counted for each member over the
    // new messages of their channel.
    let sql = format!(
        "WITH v (cid, user_id, created_at) AS (VALUES {values}), \
         d (cid, user_id, n) AS (SELECT mb.cid, mb.user_id, COUNT(*) FROM member mb JOIN v ON v.cid = mb.cid AND v.user_id <> mb.user_id \
           WHERE v.created_at > COALESCE((SELECT r.last_read FROM channel_read r WHERE r.cid = mb.cid AND r.user_id = mb.user_id), mb.created_at) \
           GROUP BY mb.cid, mb.user_id) \
         UPDATE member SET unread_count = unread_count + d.n FROM d WHERE member.cid = d.cid AND member.user_id = d.user_id"
    );
    let mut q = sqlx::query(AssertSqlSafe(sql));
    for m in plain {
        q = q.bind(m.cid.clone()).bind(m.user_id.clone()).bind(m.created_at);
    }
    q.execute(counted(&mut *tx.tx)).await?;
    Ok(())
}

/// Takes one from the counter of every member the message `m` counts for (as [`recount`] would
/// find it). Run before the message stops counting (deleted, or its row and restricted-visibility
/// rows removed), with the channel locked, and only for a message that is not hidden by a rewind.
///
/// A delete once recounted the whole channel: 343 ms on a 50,000-message channel under the
/// channel lock (docs/performance.md,
/// "Unread counters").
pub(crate) async fn uncount_message(tx: &mut Tx, m: &Message, truncated_at: Option<i64>) -> Result<()> {
    if !counts(m, truncated_at) || m.deleted_at.is_some() {
        return Ok(());
    }
    add_for_readers(tx, m, -1).await
}

/// Adds `delta` to the counter of every member but the author for whom `m` is newer than their
/// read mark (or, without one, than their joining) and, when its visibility is restricted, who
/// is named in it: the member side of the rule, for one message whose own side holds.
async fn add_for_readers(tx: &mut Tx, m: &Message, delta: i64) -> Result<()> {
    let floor = if delta < 0 { " AND unread_count > 0" } else { "" };
    let restricted = if m.restricted_visibility.is_empty() {
        String::new()
    } else {
        format!(" AND {}", crate::visibility::restricted_to("$5", "member.user_id"))
    };
    let mut q = sqlx::query(AssertSqlSafe(format!(
        "UPDATE member SET unread_count = unread_count + $4 \
         WHERE cid = $1 AND user_id <> $2{floor} \
         AND $3 > COALESCE((SELECT r.last_read FROM channel_read r WHERE r.cid = member.cid AND r.user_id = member.user_id), member.created_at){restricted}"
    )))
    .bind(m.cid.clone())
    .bind(m.user_id.clone())
    .bind(m.created_at)
    .bind(delta);
    if !m.restricted_visibility.is_empty() {
        q = q.bind(m.id.clone());
    }
    q.execute(counted(&mut *tx.tx)).await?;
    Ok(())
}

/// Recounts the counters of the members of `cid` (only `user`'s when given) by the rule.
pub(crate) async fn recount(tx: &mut Tx, cid: &str, user: Option<&str>) -> Result<()> {
    let only = if user.is_some() { " AND user_id = $2" } else { "" };
    let sql = format!(
        "UPDATE member SET unread_count = (\
           SELECT COUNT(*) FROM message m JOIN channel c ON c.cid = m.cid \
           WHERE m.cid = member.cid \
           AND m.created_at > COALESCE((SELECT r.last_read FROM channel_read r WHERE r.cid = member.cid AND r.user_id = member.user_id), member.created_at) \
           AND (c.truncated_at IS NULL OR m.created_at > c.truncated_at) \
           AND m.user_id <> member.user_id AND m.hidden_at IS NULL AND m.deleted_at IS NULL AND m.shadowed = FALSE \
           AND m.type NOT IN ('system', 'deleted', 'ephemeral', 'error') AND (m.parent_id IS NULL OR m.show_in_channel = TRUE) \
           AND (m.restricted_visibility = '[]' OR {})) \
         WHERE cid = $1{only}",
        crate::visibility::restricted_to("m.id", "member.user_id")
    );
    let mut q = sqlx::query(AssertSqlSafe(sql)).bind(cid.to_string());
    if let Some(u) = user {
        q = q.bind(u.to_string());
    }
    q.execute(counted(&mut *tx.tx)).await?;
    Ok(())
}

/// Sets `user`'s counter in `cid` to zero (they read everything).
pub(crate) async fn clear(tx: &mut Tx, cid: &str, user: &str) -> Result<()> {
    sqlx::query("UPDATE member SET unread_count = 0 WHERE cid = $1 AND user_id = $2")
        .bind(cid.to_string())
        .bind(user.to_string())
        .execute(counted(&mut *tx.tx))
        .await?;
    Ok(())
}

/// The SQL of a user's counters over their channels that are not deleted, grouped by user; the
/// caller adds the condition on `mb` that picks the users, and the grouping.
///
/// The plan must start from the users' member rows (`member` by `user_id`) whatever the
/// statistics: PostgreSQL run without them (autovacuum off) took `channel … deleted_at IS NULL`
/// for one row and scanned every channel of the database for each send (docs/performance.md,
/// "PostgreSQL without statistics"). The channel's deletion is therefore a correlated lookup, which the planner cannot
/// turn into a join of its choosing, and it looks in the index of deleted channels only
/// (`channel_deleted`): the channel rows themselves are rewritten by every send, and reading
/// them was the largest cost of a send on PostgreSQL (docs/performance.md, "Send path on PostgreSQL"). Member rows
/// exist only for existing channels (a hard delete removes them with the channel).
const TOTALS: &str = "SELECT mb.user_id AS user_id, CAST(SUM(mb.unread_count) AS BIGINT) AS total, \
     CAST(SUM(CASE WHEN mb.unread_count > 0 THEN 1 ELSE 0 END) AS BIGINT) AS channels \
     FROM member mb \
     WHERE (SELECT COUNT(*) FROM channel c WHERE c.cid = mb.cid AND c.deleted_at IS NOT NULL) = 0 AND";

/// One row of [`TOTALS`].
#[derive(sqlx::FromRow)]
struct Totals {
    user_id: String,
    total: i64,
    channels: i64,
}

impl Totals {
    fn pair(self) -> (String, UnreadCounts) {
        (self.user_id, UnreadCounts { total: self.total, channels: self.channels })
    }
}

/// One user's counters over all their channels (a read of their member rows).
pub(crate) async fn counts_of(conn: &mut AnyConnection, user_id: &str) -> Result<UnreadCounts> {
    let row: Option<Totals> = sqlx::query_as(AssertSqlSafe(format!("{TOTALS} mb.user_id = $1 GROUP BY mb.user_id")))
        .bind(user_id.to_string())
        .fetch_optional(counted(&mut *conn))
        .await?;
    Ok(row.map(|r| r.pair().1).unwrap_or_default())
}

/// The counters of every member of `cid`, each over all their channels: what the events of a
/// new message carry to each recipient.
pub(crate) async fn counts_of_members(conn: &mut AnyConnection, cid: &str) -> Result<BTreeMap<String, UnreadCounts>> {
    let rows: Vec<Totals> =
        sqlx::query_as(AssertSqlSafe(format!("{TOTALS} mb.user_id IN (SELECT user_id FROM member WHERE cid = $1) GROUP BY mb.user_id")))
            .bind(cid.to_string())
            .fetch_all(counted(&mut *conn))
            .await?;
    Ok(rows.into_iter().map(Totals::pair).collect())
}

/// [`counts_of_members`] for several channels in one statement: by channel, by member.
pub(crate) async fn counts_of_members_of(
    conn: &mut AnyConnection,
    cids: &[String],
) -> Result<HashMap<String, BTreeMap<String, UnreadCounts>>> {
    #[derive(sqlx::FromRow)]
    struct Row {
        cid: String,
        #[sqlx(flatten)]
        totals: Totals,
    }
    let list = rows::placeholders(1, cids.len());
    let sql = format!(
        "SELECT x.cid AS cid, t.user_id AS user_id, t.total AS total, t.channels AS channels FROM member x \
         JOIN ({TOTALS} mb.user_id IN (SELECT user_id FROM member WHERE cid IN ({list})) GROUP BY mb.user_id) t ON t.user_id = x.user_id \
         WHERE x.cid IN ({list})"
    );
    let mut q = sqlx::query_as::<_, Row>(AssertSqlSafe(sql));
    for cid in cids {
        q = q.bind(cid.clone());
    }
    let mut out: HashMap<String, BTreeMap<String, UnreadCounts>> = HashMap::new();
    for row in q.fetch_all(counted(&mut *conn)).await? {
        let (user, counts) = row.totals.pair();
        out.entry(row.cid).or_default().insert(user, counts);
    }
    Ok(out)
}

/// The counters of each of `users` (those with no channel have none: zero).
pub(crate) async fn counts_of_users(conn: &mut AnyConnection, users: &[String]) -> Result<BTreeMap<String, UnreadCounts>> {
    if users.is_empty() {
        return Ok(BTreeMap::new());
    }
    let list = rows::placeholders(1, users.len());
    let mut q = sqlx::query_as::<_, Totals>(AssertSqlSafe(format!("{TOTALS} mb.user_id IN ({list}) GROUP BY mb.user_id")));
    for u in users {
        q = q.bind(u.clone());
    }
    Ok(q.fetch_all(counted(&mut *conn)).await?.into_iter().map(Totals::pair).collect())
}
