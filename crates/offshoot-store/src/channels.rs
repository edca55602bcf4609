//! Channels and members.

use crate::cache::ConfigCache;
use crate::query::{channel_condition, channel_order, SqlBuilder};
use crate::rows::{self, fork_json, placeholders, user_json, ChannelRow, MemberRow, Nested, CHANNEL_COLS, MEMBER_COLS};
use crate::sql::{arguments, Bind};
use crate::unread::{self, UnreadCounts};
use crate::users::load_users;
use crate::{domain, not_found, Backend, Result, Store, Tx};
use offshoot_core::model::{Audience, Channel, Custom, Event, ForkSummary, Member, NewMessage, User};
use offshoot_core::query::{ChannelField, ChannelSortField, Filter, Sort};
use offshoot_core::{time, Error};
use sqlx::{AnyConnection, AssertSqlSafe};
use std::collections::HashMap;

#[derive(Debug, Clone, Default)]
pub struct MemberInput {
    pub user_id: String,
    pub channel_role: Option<String>,
    pub custom: Custom,
}

#[derive(Debug, Clone, Default)]
pub struct NewChannel {
    pub kind: String,
    pub id: String,
    pub created_by_id: Option<String>,
    pub team: Option<String>,
    pub custom: Custom,
    pub members: Vec<MemberInput>,
}

/// A full channel update (`POST /channels/{type}/{id}`): every part is optional and all of it
/// is one transaction.
#[derive(Debug, Clone, Default)]
pub struct ChannelUpdate {
    /// Replaces the custom data.
    pub custom: Option<Custom>,
    pub team: Option<String>,
    pub frozen: Option<bool>,
    pub add_members: Vec<MemberInput>,
    pub remove_members: Vec<String>,
    /// A system message to post, with its author.
    pub message: Option<(NewMessage, User)>,
}

/// One member's read state of a channel.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ReadState {
    pub user_id: String,
    pub last_read: i64,
    pub last_read_message_id: Option<String>,
    pub unread_messages: i64,
}

/// A member's stored read mark of a channel.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ReadMark {
    pub user_id: String,
    pub last_read: i64,
    pub last_read_message_id: Option<String>,
}

/// Query Channels: every `Some` narrows the result.
#[derive(Debug, Clone, Default)]
pub struct ChannelFilter {
    pub types: Option<Vec<String>>,
    pub cids: Option<Vec<String>>,
    pub ids: Option<Vec<String>>,
    /// Channels that have any of these users as members.
    pub members_any: Option<Vec<String>>,
    /// Channels that have all of these users as members.
    pub members_all: Option<Vec<String>>,
    pub created_by_ids: Option<Vec<String>>,
    /// Restricts the result to channels this user is a member of (client-side callers).
    pub member_of: Option<String>,
    pub teams: Option<Vec<String>>,
    /// The client's filter tree (`filter_conditions`).
    pub filter: Option<Filter<ChannelField>>,
    /// The calling user, for `joined` and `has_unread`.
    pub user_id: Option<String>,
    /// Sort keys; `c.cid` breaks ties.
    pub sort: Vec<Sort<ChannelSortField>>,
    pub limit: i64,
    pub offset: i64,
}

pub(crate) fn event_for(kind: &str, channel: &Channel, user: Option<User>) -> Event {
    Event {
        kind: kind.to_string(),
        cid: Some(channel.cid.clone()),
        channel_type: Some(channel.kind.clone()),
        channel_id: Some(channel.id.clone()),
        user,
        created_at: time::now(),
        ..Default::default()
    }
}

pub(crate) fn to_watchers_and_hooks(cid: &str) -> Audience {
    Audience { watchers_of: Some(cid.to_string()), users: Vec::new(), webhooks: true, ..Default::default() }
}

impl Store {
    pub async fn get_channel(&self, cid: &str) -> Result<Option<Channel>> {
        let mut conn = self.pool().acquire().await?;
        load_channel(&mut conn, &self.cache, cid).await
    }

    /// A channel (soft-deleted ones too) with its fork summary and type config, without its
    /// creator: one statement, for the checks before a write.
    pub async fn get_channel_bare(&self, cid: &str) -> Result<Option<Channel>> {
        let mut conn = self.pool().acquire().await?;
        bare_channel(&mut conn, &self.cache, cid).await
    }

    pub async fn is_member(&self, cid: &str, user_id: &str) -> Result<bool> {
        let row: Option<String> = sqlx::query_scalar("SELECT user_id FROM member WHERE cid = $1 AND user_id = $2")
            .bind(cid.to_string())
            .bind(user_id.to_string())
            .fetch_optional(crate::counted(self.pool()))
            .await?;
        Ok(row.is_some())
    }

    pub async fn members(&self, cid: &str, limit: i64, offset: i64) -> Result<Vec<Member>> {
        let mut conn = self.pool().acquire().await?;
        load_members(&mut conn, cid, limit, offset).await
    }

    /// Get-or-create. Returns the channel and whether this call created it. A soft-deleted
    /// channel is brought back empty: its old messages stay hidden behind `truncated_at`.
    /// Concurrent calls for the same new channel create it once; the others get it back.
    pub async fn create_channel(&self, new: &NewChannel) -> Result<(Channel, bool)> {
        self.retrying("create_channel", || self.create_channel_once(new)).await
    }

    async fn create_channel_once(&self, new: &NewChannel) -> Result<(Channel, bool)> {
        let cid = offshoot_core::ids::cid(&new.kind, &new.id);
        let mut tx = self.begin().await?;
        let existing = lock_and_load(&mut tx, &cid).await?;
        if let Some(ch) = existing.clone().filter(|c| c.deleted_at.is_none()) {
            tx.commit(self).await?;
            return Ok((ch, false));
        }
        let now = time::now();
        if let Some(old) = existing {
            sqlx::query("UPDATE channel SET deleted_at = NULL, truncated_at = $1, message_count = 0, last_message_at = NULL, custom = $2, created_by_id = $3, team = $4, updated_at = $1, created_at = $1 WHERE cid = $5")
                .bind(now)
                .bind(serde_json::to_string(&new.custom)?)
                .bind(new.created_by_id.clone())
                .bind(new.team.clone())
                .bind(old.cid.clone())
                .execute(crate::counted(&mut *tx.tx))
                .await?;
            sqlx::query("DELETE FROM member WHERE cid = $1").bind(cid.clone()).execute(crate::counted(&mut *tx.tx)).await?;
        } else if !insert_channel_row(&mut tx, &cid, new, now).await? {
            // Created by a concurrent request since we looked: that one wins, and it has
            // committed (the insert waited for it). Answer with its channel.
            drop(tx);
            let ch = self.get_channel(&cid).await?;
            return match ch {
                Some(ch) => Ok((ch, false)),
                None => not_found(format!("channel {cid:?} was deleted while it was created")),
            };
        }
        let creator = match &new.created_by_id {
            Some(id) => load_users(&mut tx.tx, std::slice::from_ref(id)).await?.remove(id),
            None => None,
        };
        let channel = reload(&mut tx, &cid).await?;
        tx.event(event_for("channel.created", &channel, creator.clone()).with_channel(&channel), to_watchers_and_hooks(&cid)).await?;
        add_members_tx(&mut tx, &channel, &new.members, creator.as_ref()).await?;
        let channel = reload(&mut tx, &cid).await?;
        tx.commit(self).await?;
        Ok((channel, true))
    }

    pub async fn partial_update_channel(&self, cid: &str, set: &Custom, unset: &[String], actor: Option<&User>) -> Result<Channel> {
        self.retrying("partial_update_channel", || self.partial_update_channel_once(cid, set, unset, actor)).await
    }

    async fn partial_update_channel_once(&self, cid: &str, set: &Custom, unset: &[String], actor: Option<&User>) -> Result<Channel> {
        let mut tx = self.begin().await?;
        let Some(mut ch) = lock_and_load(&mut tx, cid).await? else { return not_found(format!("channel {cid:?} does not exist")) };
        for (k, v) in set {
            match k.as_str() {
                "team" => ch.team = v.as_str().map(str::to_string),
                "frozen" => ch.frozen = v.as_bool().unwrap_or(false),
                "disabled" => ch.disabled = v.as_bool().unwrap_or(false),
                "cid" | "id" | "type" | "created_at" | "updated_at" | "created_by" | "created_by_id" | "members" | "member_count"
                | "fork" | "deleted_at" | "truncated_at" => {
                    return domain(Error::input(format!("field {k:?} cannot be changed by a partial update")));
                }
                _ => {
                    ch.custom.insert(k.clone(), v.clone());
                }
            }
        }
        for k in unset {
            if k == "team" {
                ch.team = None;
            } else {
                ch.custom.remove(k);
            }
        }
        if serde_json::to_vec(&ch.custom)?.len() > offshoot_core::fork::MAX_CUSTOM_BYTES {
            return domain(Error::input(format!("channel custom data would exceed {} bytes", offshoot_core::fork::MAX_CUSTOM_BYTES)));
        }
        write_channel_fields(&mut tx, &ch).await?;
        let ch = reload(&mut tx, cid).await?;
        tx.event(event_for("channel.updated", &ch, actor.cloned()).with_channel(&ch), to_watchers_and_hooks(cid)).await?;
        tx.commit(self).await?;
        Ok(ch)
    }

    pub async fn add_members(&self, cid: &str, members: &[MemberInput], actor: Option<&User>) -> Result<Channel> {
        let update = ChannelUpdate { add_members: members.to_vec(), ..Default::default() };
        Ok(self.update_channel(cid, &update, actor).await?.0)
    }

    pub async fn remove_members(&self, cid: &str, user_ids: &[String], actor: Option<&User>) -> Result<Channel> {
        let update = ChannelUpdate { remove_members: user_ids.to_vec(), ..Default::default() };
        Ok(self.update_channel(cid, &update, actor).await?.0)
    }

    /// Soft delete keeps the rows and sets `deleted_at`; hard delete removes the channel, its
    /// members, messages, reactions and read state, and its fork row (freeing the source's slot).
    pub async fn delete_channel(&self, cid: &str, hard: bool, actor: Option<&User>) -> Result<Channel> {
        self.retrying("delete_channel", || self.delete_channel_once(cid, hard, actor)).await
    }

    async fn delete_channel_once(&self, cid: &str, hard: bool, actor: Option<&User>) -> Result<Channel> {
        let mut tx = self.begin().await?;
        let Some(mut ch) = lock_and_load(&mut tx, cid).await? else { return not_found(format!("channel {cid:?} does not exist")) };
        let now = time::now();
        if hard {
            for sql in [
                "DELETE FROM reaction WHERE message_id IN (SELECT id FROM message WHERE cid = $1)",
                "DELETE FROM message_restricted WHERE message_id IN (SELECT id FROM message WHERE cid = $1)",
                "DELETE FROM upload_ref WHERE message_id IN (SELECT id FROM message WHERE cid = $1)",
                "DELETE FROM message WHERE cid = $1",
                "DELETE FROM member WHERE cid = $1",
                "DELETE FROM channel_read WHERE cid = $1",
                "DELETE FROM ai_state WHERE cid = $1",
                "DELETE FROM fork WHERE cid = $1",
                "DELETE FROM channel WHERE cid = $1",
            ] {
                sqlx::query(sql).bind(cid.to_string()).execute(crate::counted(&mut *tx.tx)).await?;
            }
        } else {
            sqlx::query("UPDATE channel SET deleted_at = $1, updated_at = $1 WHERE cid = $2")
                .bind(now)
                .bind(cid.to_string())
                .execute(crate::counted(&mut *tx.tx))
                .await?;
        }
        ch.deleted_at = Some(now);
        ch.updated_at = now;
        tx.event(event_for("channel.deleted", &ch, actor.cloned()).with_channel(&ch), to_watchers_and_hooks(cid)).await?;
        tx.commit(self).await?;
        Ok(ch)
    }

    /// Query Channels: the channels `f` selects, in its order, each with its creator, fork
    /// summary and type config (a fixed number of statements).
    pub async fn query_channels(&self, f: &ChannelFilter) -> Result<Vec<Channel>> {
        let mut b = SqlBuilder::new(self.backend(), Vec::new());
        let mut sql = format!("SELECT {CHANNEL_COLS} FROM channel c WHERE c.deleted_at IS NULL{}", filter_conditions(f, &mut b)?);
        let order = channel_order(&mut b, &f.sort);
        sql.push_str(&format!(" ORDER BY {order} LIMIT {} OFFSET {}", f.limit.clamp(0, 300), f.offset.clamp(0, 10_000)));
        let mut conn = self.pool().acquire().await?;
        let rows: Vec<ChannelRow> =
            sqlx::query_as_with(AssertSqlSafe(sql), arguments(&b.binds)?).fetch_all(crate::counted(&mut *conn)).await?;
        let mut channels: Vec<Channel> = rows::all(rows);
        hydrate_channels(&mut conn, &self.cache, &mut channels).await?;
        Ok(channels)
    }

    /// Read state of the first `limit` members of `ch`. A member who never marked the channel
    /// read has read up to when they joined; unread messages are counted by the rule of the
    /// `unread` module (kept in `member.unread_count`).
    pub async fn member_read_states(&self, ch: &Channel, limit: i64) -> Result<Vec<ReadState>> {
        Ok(sqlx::query_as(AssertSqlSafe(read_states_sql("$1", "$2")))
            .bind(ch.cid.clone())
            .bind(limit)
            .fetch_all(crate::counted(self.pool()))
            .await?)
    }

    /// A user's unread messages over every channel they are a member of, and in how many
    /// channels they are: a read of their member rows (`unread` module).
    pub async fn unread_counts(&self, user_id: &str) -> Result<UnreadCounts> {
        let mut conn = self.pool().acquire().await?;
        unread::counts_of(&mut conn, user_id).await
    }

    /// The unread counters of each of `users` (one query over their member rows).
    pub async fn unread_counts_of(&self, users: &[String]) -> Result<std::collections::BTreeMap<String, UnreadCounts>> {
        let mut conn = self.pool().acquire().await?;
        unread::counts_of_users(&mut conn, users).await
    }

    /// The stored read marks of a channel, by user id.
    pub async fn read_states(&self, cid: &str) -> Result<Vec<ReadMark>> {
        Ok(sqlx::query_as("SELECT user_id, last_read, last_read_message_id FROM channel_read WHERE cid = $1 ORDER BY user_id")
            .bind(cid.to_string())
            .fetch_all(crate::counted(self.pool()))
            .await?)
    }

    pub async fn mark_read(&self, cid: &str, user: &User, message_id: Option<&str>) -> Result<i64> {
        self.retrying("mark_read", || self.mark_read_once(cid, user, message_id)).await
    }

    /// One upsert of the member's read row and their unread counter set to zero, under the
    /// channel's lock (a message sent at the same time counts by the read mark it sees).
    async fn mark_read_once(&self, cid: &str, user: &User, message_id: Option<&str>) -> Result<i64> {
        let mut tx = self.begin().await?;
        let Some(ch) = lock_and_load(&mut tx, cid).await? else { return not_found(format!("channel {cid:?} does not exist")) };
        let now = time::now();
        sqlx::query("INSERT INTO channel_read (cid, user_id, last_read, last_read_message_id, created_at, updated_at) VALUES ($1, $2, $3, $4, $3, $3) ON CONFLICT (cid, user_id) DO UPDATE SET last_read = $3, last_read_message_id = $4, updated_at = $3")
            .bind(cid.to_string())
            .bind(user.id.clone())
            .bind(now)
            .bind(message_id.map(str::to_string))
            .execute(crate::counted(&mut *tx.tx))
            .await?;
        unread::clear(&mut tx, cid, &user.id).await?;
        tx.event(event_for("message.read", &ch, Some(user.clone())), to_watchers_and_hooks(cid)).await?;
        // The reader's own connections learn their new counters, as Stream's clients expect.
        let unread = unread::counts_of(&mut tx.tx, &user.id).await?;
        let mut note = event_for("notification.mark_read", &ch, Some(user.clone()));
        note.extra.insert("total_unread_count".into(), unread.total.into());
        note.extra.insert("unread_count".into(), unread.total.into());
        note.extra.insert("unread_channels".into(), unread.channels.into());
        note.extra.insert("unread_messages".into(), 0.into());
        tx.event(note, Audience { watchers_of: None, users: vec![user.id.clone()], webhooks: false, ..Default::default() }).await?;
        tx.commit(self).await?;
        Ok(now)
    }
}

/// The conditions of a Query Channels filter on channel alias `c`, each starting with ` AND`,
/// their values bound in `b`.
fn filter_conditions(f: &ChannelFilter, b: &mut SqlBuilder) -> Result<String> {
    let mut sql = String::new();
    let list = |sql: &mut String, col: &str, values: &[String], b: &mut SqlBuilder| {
        if values.is_empty() {
            sql.push_str(" AND 1 = 0");
            return;
        }
        let ps: Vec<String> = values.iter().map(|v| b.bind(Bind::S(v.clone()))).collect();
        sql.push_str(&format!(" AND {col} IN ({})", ps.join(", ")));
    };
    if let Some(v) = &f.types {
        list(&mut sql, "c.type", v, b);
    }
    if let Some(v) = &f.cids {
        list(&mut sql, "c.cid", v, b);
    }
    if let Some(v) = &f.ids {
        list(&mut sql, "c.id", v, b);
    }
    if let Some(v) = &f.created_by_ids {
        list(&mut sql, "c.created_by_id", v, b);
    }
    if let Some(v) = &f.members_any {
        let mut inner = String::new();
        list(&mut inner, "mf.user_id", v, b);
        sql.push_str(&format!(" AND EXISTS (SELECT 1 FROM member mf WHERE mf.cid = c.cid{inner})"));
    }
    if let Some(v) = &f.members_all {
        for uid in v {
            let p = b.bind(Bind::S(uid.clone()));
            sql.push_str(&format!(" AND EXISTS (SELECT 1 FROM member ma WHERE ma.cid = c.cid AND ma.user_id = {p})"));
        }
    }
    if let Some(uid) = &f.member_of {
        let p = b.bind(Bind::S(uid.clone()));
        sql.push_str(&format!(" AND EXISTS (SELECT 1 FROM member mo WHERE mo.cid = c.cid AND mo.user_id = {p})"));
    }
    if let Some(v) = &f.teams {
        list(&mut sql, "c.team", v, b);
    }
    if let Some(tree) = &f.filter {
        let cond = channel_condition(b, tree, f.user_id.as_deref())?;
        sql.push_str(&format!(" AND {cond}"));
    }
    Ok(sql)
}

pub(crate) trait WithChannel {
    fn with_channel(self, ch: &Channel) -> Self;
}
impl WithChannel for Event {
    fn with_channel(mut self, ch: &Channel) -> Self {
        self.channel = Some(ch.clone());
        self
    }
}

/// Locks a channel's row (PostgreSQL) and loads it: the first step of every write that touches
/// a channel or its members or messages (crate doc, lock order).
/// One statement locks and reads the row (`SELECT … FOR UPDATE`), so the lock is held for one
/// round trip less than a lock followed by a read.
pub(crate) async fn lock_and_load(tx: &mut Tx, cid: &str) -> Result<Option<Channel>> {
    let Some(ch) = lock_channel_row(tx, "c.cid = $1", cid).await? else { return Ok(None) };
    let mut chs = vec![ch];
    hydrate_channels(&mut tx.tx, &tx.cache, &mut chs).await?;
    Ok(chs.pop())
}

/// Locks (PostgreSQL) and reads the channel row matching `condition` (on alias `c`, binding
/// `key` as `$1`) with its fork summary, without its creator or type: for writes that need only
/// the row's own fields (its cid, type, id and truncation).
pub(crate) async fn lock_channel_row(tx: &mut Tx, condition: &str, key: &str) -> Result<Option<Channel>> {
    let sql = format!("SELECT {CHANNEL_COLS} FROM channel c WHERE {condition}{}", tx.for_update());
    let row: Option<ChannelRow> =
        sqlx::query_as(AssertSqlSafe(sql)).bind(key.to_string()).fetch_optional(crate::counted(&mut *tx.tx)).await?;
    Ok(row.map(Channel::from))
}

/// Locks the channels of the messages `ids` (those that exist) in one statement, in cid order:
/// two transactions that lock several channels this way never wait for each other in a cycle.
pub(crate) async fn lock_channels_of_messages(tx: &mut Tx, ids: &[String]) -> Result<Vec<Channel>> {
    lock_channels_where(tx, &format!("c.cid IN (SELECT m.cid FROM message m WHERE m.id IN ({}))", placeholders(1, ids.len())), ids).await
}

/// Locks the channels `cids` (those that exist) in one statement, in cid order, and reads them
/// with their fork summaries and creators (after the lock, [`channel_extras`]) and types.
pub(crate) async fn lock_channels(tx: &mut Tx, cids: &[String]) -> Result<Vec<Channel>> {
    let mut chs = lock_channels_where(tx, &format!("c.cid IN ({})", placeholders(1, cids.len())), cids).await?;
    channel_extras(&mut tx.tx, &mut chs, None).await?;
    let types = tx.cache.types(&mut tx.tx).await?;
    for ch in &mut chs {
        ch.config = types.get(&ch.kind).cloned();
    }
    Ok(chs)
}

/// Locks (PostgreSQL) and reads the channel rows matching `condition` (binding `keys` as `$1`…)
/// in cid order, in one statement.
async fn lock_channels_where(tx: &mut Tx, condition: &str, keys: &[String]) -> Result<Vec<Channel>> {
    let lock = match tx.backend {
        Backend::Postgres => " FOR UPDATE OF c",
        Backend::Sqlite => "",
    };
    let sql = format!("SELECT {CHANNEL_COLS} FROM channel c WHERE {condition} ORDER BY c.cid{lock}");
    let mut q = sqlx::query_as::<_, ChannelRow>(AssertSqlSafe(sql));
    for key in keys {
        q = q.bind(key.clone());
    }
    Ok(q.fetch_all(crate::counted(&mut *tx.tx)).await?.into_iter().map(Channel::from).collect())
}

/// Records new messages on their locked channels, one row per channel: `(cid, how many, the
/// newest created_at)`, as [`BUMP_CHANNEL`] records one; the number of users watching each.
pub(crate) async fn bump_channels(tx: &mut Tx, bumps: &[(String, i64, i64)], now: i64) -> Result<HashMap<String, i64>> {
    if bumps.is_empty() {
        return Ok(HashMap::new());
    }
    let values = rows::value_rows(tx.backend, 1, bumps.len(), 3);
    // Now is the last parameter, also in the text (SQLite numbers anonymous `?` in order).
    let now_param = rows::many_placeholders(tx.backend, 1 + bumps.len() * 3, 1);
    let sql = format!(
        "WITH v (cid, n, last_at) AS (VALUES {values}) \
         UPDATE channel SET last_message_at = CASE WHEN channel.last_message_at IS NULL OR channel.last_message_at < v.last_at THEN v.last_at ELSE channel.last_message_at END, \
         message_count = channel.message_count + v.n, updated_at = {now_param} FROM v WHERE channel.cid = v.cid \
         RETURNING channel.cid, (SELECT COUNT(DISTINCT w.user_id) FROM ws_watch w WHERE w.cid = channel.cid) AS watcher_count"
    );
    let mut q = sqlx::query_as::<_, (String, i64)>(AssertSqlSafe(sql));
    for (cid, n, last_at) in bumps {
        q = q.bind(cid.clone()).bind(*n).bind(*last_at);
    }
    Ok(q.bind(now).fetch_all(crate::counted(&mut *tx.tx)).await?.into_iter().collect())
}

/// Records a new message on its channel (`last_message_at`, `message_count`, `updated_at`) and
/// returns the channel as written, with its creator, fork summary and type, the stored user
/// `author` (`None` when there is none yet) and how many users watch the channel. The update
/// takes the channel's row lock, so it is the first step of a send (crate doc, lock order): the
/// lock, the row's read and its write are one statement; the rest is read by the next one,
/// after the lock ([`channel_extras`]). A send that fails a check afterwards rolls it back.
pub(crate) async fn lock_for_new_message(
    tx: &mut Tx,
    cid: &str,
    created_at: i64,
    now: i64,
    author: &str,
) -> Result<Option<(Channel, Option<User>, i64)>> {
    #[derive(sqlx::FromRow)]
    struct Bumped {
        #[sqlx(flatten)]
        channel: ChannelRow,
        watcher_count: i64,
    }
    // SQLite's RETURNING takes no table alias: the channel's columns by the table's name.
    let returning =
        CHANNEL_COLS.split(", ").map(|c| c.trim_start_matches("c.").replace("= c.", "= channel.")).collect::<Vec<_>>().join(", ");
    // Watches are written under their users' locks, never the channel's (`presence.rs`): the
    // count is what any read at this moment would give.
    let sql = format!(
        "UPDATE channel SET {BUMP_CHANNEL} WHERE cid = $3 RETURNING {returning}, \
         (SELECT COUNT(DISTINCT w.user_id) FROM ws_watch w WHERE w.cid = channel.cid) AS watcher_count"
    );
    let row: Option<Bumped> = sqlx::query_as(AssertSqlSafe(sql))
        .bind(created_at)
        .bind(now)
        .bind(cid.to_string())
        .fetch_optional(crate::counted(&mut *tx.tx))
        .await?;
    let Some(row) = row else { return Ok(None) };
    let mut chs = [Channel::from(row.channel)];
    let author = channel_extras(&mut tx.tx, &mut chs, Some(author)).await?;
    let [mut ch] = chs;
    ch.config = tx.cache.types(&mut tx.tx).await?.get(&ch.kind).cloned();
    Ok(Some((ch, author, row.watcher_count)))
}

/// The assignments of a new message's channel update (`$1` its `created_at`, `$2` now).
pub(crate) const BUMP_CHANNEL: &str = "last_message_at = CASE WHEN last_message_at IS NULL OR last_message_at < $1 THEN $1 ELSE last_message_at END, message_count = message_count + 1, updated_at = $2";

/// The channel as this transaction sees it now; it holds the channel's lock, so it exists.
pub(crate) async fn reload(tx: &mut Tx, cid: &str) -> Result<Channel> {
    match load_channel(&mut tx.tx, &tx.cache, cid).await? {
        Some(ch) => Ok(ch),
        None => not_found(format!("channel {cid:?} does not exist")),
    }
}

/// Inserts a channel row; false when the cid exists already.
pub(crate) async fn insert_channel_row(tx: &mut Tx, cid: &str, new: &NewChannel, now: i64) -> Result<bool> {
    let res = sqlx::query(
        "INSERT INTO channel (cid, type, id, created_by_id, team, custom, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $7) ON CONFLICT (cid) DO NOTHING",
    )
    .bind(cid.to_string())
    .bind(new.kind.clone())
    .bind(new.id.clone())
    .bind(new.created_by_id.clone())
    .bind(new.team.clone())
    .bind(serde_json::to_string(&new.custom)?)
    .bind(now)
    .execute(crate::counted(&mut *tx.tx))
    .await?;
    Ok(res.rows_affected() == 1)
}

pub(crate) async fn write_channel_fields(tx: &mut Tx, ch: &Channel) -> Result<()> {
    sqlx::query("UPDATE channel SET custom = $1, team = $2, frozen = $3, disabled = $4, updated_at = $5 WHERE cid = $6")
        .bind(serde_json::to_string(&ch.custom)?)
        .bind(ch.team.clone())
        .bind(ch.frozen)
        .bind(ch.disabled)
        .bind(time::now())
        .bind(ch.cid.clone())
        .execute(crate::counted(&mut *tx.tx))
        .await?;
    Ok(())
}

/// Adds members that are not members yet, with `member.added` and
/// `notification.added_to_channel` for each.
pub(crate) async fn add_members_tx(tx: &mut Tx, ch: &Channel, members: &[MemberInput], actor: Option<&User>) -> Result<()> {
    let ids: Vec<String> = members.iter().map(|m| m.user_id.clone()).collect();
    let users = load_users(&mut tx.tx, &ids).await?;
    let now = time::now();
    // Member rows in user id order (crate doc, lock order).
    let mut members: Vec<&MemberInput> = members.iter().collect();
    members.sort_by(|a, b| a.user_id.cmp(&b.user_id));
    for m in members {
        let role = m.channel_role.clone().unwrap_or_else(|| {
            if ch.created_by_id.as_deref() == Some(m.user_id.as_str()) {
                "channel_moderator".into()
            } else {
                "channel_member".into()
            }
        });
        let res = sqlx::query("INSERT INTO member (cid, user_id, channel_role, custom, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (cid, user_id) DO NOTHING")
            .bind(ch.cid.clone())
            .bind(m.user_id.clone())
            .bind(role.clone())
            .bind(serde_json::to_string(&m.custom)?)
            .bind(now)
            .execute(crate::counted(&mut *tx.tx))
            .await?;
        if res.rows_affected() == 0 {
            continue;
        }
        let member = Member {
            cid: ch.cid.clone(),
            user_id: m.user_id.clone(),
            user: users.get(&m.user_id).cloned(),
            channel_role: role,
            custom: m.custom.clone(),
            created_at: now,
            updated_at: now,
        };
        let mut ev = event_for("member.added", ch, actor.cloned().or_else(|| users.get(&m.user_id).cloned()));
        ev.member = Some(member.clone());
        tx.event(ev, to_watchers_and_hooks(&ch.cid)).await?;
        let mut note = event_for("notification.added_to_channel", ch, actor.cloned());
        note.member = Some(member);
        note.channel = Some(ch.clone());
        tx.event(note, Audience { watchers_of: None, users: vec![m.user_id.clone()], webhooks: false, ..Default::default() }).await?;
    }
    Ok(())
}

/// Removes members, with `member.removed` and `notification.removed_from_channel` for each
/// that was a member.
pub(crate) async fn remove_members_tx(tx: &mut Tx, ch: &Channel, user_ids: &[String], actor: Option<&User>) -> Result<()> {
    let users = load_users(&mut tx.tx, user_ids).await?;
    let mut ids: Vec<&String> = user_ids.iter().collect();
    ids.sort();
    ids.dedup();
    for uid in ids {
        let res = sqlx::query("DELETE FROM member WHERE cid = $1 AND user_id = $2")
            .bind(ch.cid.clone())
            .bind(uid.clone())
            .execute(crate::counted(&mut *tx.tx))
            .await?;
        if res.rows_affected() == 0 {
            continue;
        }
        let now = time::now();
        let member = Member {
            cid: ch.cid.clone(),
            user_id: uid.clone(),
            user: users.get(uid).cloned(),
            channel_role: "channel_member".into(),
            custom: Custom::new(),
            created_at: now,
            updated_at: now,
        };
        let mut ev = event_for("member.removed", ch, actor.cloned().or_else(|| users.get(uid).cloned()));
        ev.member = Some(member.clone());
        tx.event(ev, to_watchers_and_hooks(&ch.cid)).await?;
        let mut note = event_for("notification.removed_from_channel", ch, actor.cloned());
        note.member = Some(member);
        note.channel = Some(ch.clone());
        tx.event(note, Audience { watchers_of: None, users: vec![uid.clone()], webhooks: false, ..Default::default() }).await?;
    }
    Ok(())
}

/// The statement of [`Store::member_read_states`] (with the member's `cid` too), its
/// placeholders named: the channel's cid and the limit. Unread counts are the members'
/// counters (`unread` module).
pub(crate) fn read_states_sql(cid: &str, limit: &str) -> String {
    format!(
        "SELECT mb.cid AS cid, mb.user_id AS user_id, COALESCE(r.last_read, mb.created_at) AS last_read, r.last_read_message_id AS last_read_message_id, \
         mb.unread_count AS unread_messages \
         FROM member mb LEFT JOIN channel_read r ON r.cid = mb.cid AND r.user_id = mb.user_id \
         WHERE mb.cid = {cid} ORDER BY mb.created_at, mb.user_id LIMIT {limit}"
    )
}

/// [`Store::get_channel_bare`] on `conn`.
pub(crate) async fn bare_channel(conn: &mut AnyConnection, cache: &ConfigCache, cid: &str) -> Result<Option<Channel>> {
    let sql = format!("SELECT {CHANNEL_COLS} FROM channel c WHERE c.cid = $1");
    let row: Option<ChannelRow> =
        sqlx::query_as(AssertSqlSafe(sql)).bind(cid.to_string()).fetch_optional(crate::counted(&mut *conn)).await?;
    let Some(mut ch) = row.map(Channel::from) else { return Ok(None) };
    ch.config = cache.types(conn).await?.get(&ch.kind).cloned();
    Ok(Some(ch))
}

/// Loads a channel (soft-deleted ones too) with its creator, fork summary and type config.
pub(crate) async fn load_channel(conn: &mut AnyConnection, cache: &ConfigCache, cid: &str) -> Result<Option<Channel>> {
    Ok(load_channels(conn, cache, &[cid.to_string()]).await?.remove(cid))
}

/// Loads channels by cid (soft-deleted ones too), hydrated as [`load_channel`] does, keyed by
/// cid: a fixed number of statements whatever their number.
pub(crate) async fn load_channels(conn: &mut AnyConnection, cache: &ConfigCache, cids: &[String]) -> Result<HashMap<String, Channel>> {
    let mut channels: Vec<Channel> = Vec::with_capacity(cids.len());
    for chunk in cids.chunks(500) {
        let sql = format!("SELECT {CHANNEL_COLS} FROM channel c WHERE c.cid IN ({})", placeholders(1, chunk.len()));
        let mut q = sqlx::query_as::<_, ChannelRow>(AssertSqlSafe(sql));
        for cid in chunk {
            q = q.bind(cid.clone());
        }
        channels.extend(q.fetch_all(crate::counted(&mut *conn)).await?.into_iter().map(Channel::from));
    }
    hydrate_channels(conn, cache, &mut channels).await?;
    Ok(channels.into_iter().map(|c| (c.cid.clone(), c)).collect())
}

/// Fills the creators, fork summaries and type configs of channels: one statement
/// ([`channel_extras`]; types come from the cache), whatever their number.
pub(crate) async fn hydrate_channels(conn: &mut AnyConnection, cache: &ConfigCache, channels: &mut [Channel]) -> Result<()> {
    if channels.is_empty() {
        return Ok(());
    }
    channel_extras(conn, channels, None).await?;
    let types = cache.types(conn).await?;
    for ch in channels.iter_mut() {
        ch.config = types.get(&ch.kind).cloned();
    }
    Ok(())
}

/// Reads what a channel row does not hold, its fork summary and its creator, into `channels`
/// (one statement per 500), and the user `also` names in the same statement (a send's author;
/// `None` when it does not exist). Never in the statement that locks a channel: on PostgreSQL a
/// statement sees the database as it was when it began, before any wait for the lock, so a
/// fork summary read there could miss the backfill page that held the lock (the
/// `UPDATE … RETURNING` of a send, `SELECT … FOR UPDATE`); read after the lock, it is current.
pub(crate) async fn channel_extras(conn: &mut AnyConnection, channels: &mut [Channel], also: Option<&str>) -> Result<Option<User>> {
    type Extras = (String, Option<Nested<ForkSummary>>, Option<Nested<User>>, Option<Nested<User>>);
    let backend = rows::backend_of(conn);
    let mut found: HashMap<String, (Option<ForkSummary>, Option<User>)> = HashMap::new();
    let mut also_user = None;
    for chunk in channels.chunks(500) {
        let also_col = match also {
            Some(_) => user_json(backend, &format!("${}", chunk.len() + 1)),
            None => "CAST(NULL AS TEXT)".to_string(),
        };
        let sql = format!(
            "SELECT c.cid, {} AS fork, {} AS creator, {also_col} AS also FROM channel c WHERE c.cid IN ({})",
            fork_json(backend, "c.cid"),
            user_json(backend, "c.created_by_id"),
            placeholders(1, chunk.len())
        );
        let mut q = sqlx::query_as::<_, Extras>(AssertSqlSafe(sql));
        for ch in chunk {
            q = q.bind(ch.cid.clone());
        }
        if let Some(id) = also {
            q = q.bind(id.to_string());
        }
        for (cid, fork, creator, also) in q.fetch_all(crate::counted(&mut *conn)).await? {
            found.insert(cid, (fork.map(|f| f.0), creator.map(|u| u.0)));
            also_user = also_user.or(also.map(|u| u.0));
        }
    }
    for ch in channels.iter_mut() {
        (ch.fork, ch.created_by) = found.remove(&ch.cid).unwrap_or_default();
    }
    Ok(also_user)
}

pub(crate) async fn load_members(conn: &mut AnyConnection, cid: &str, limit: i64, offset: i64) -> Result<Vec<Member>> {
    let rows: Vec<MemberRow> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT {MEMBER_COLS} FROM member WHERE cid = $1 ORDER BY created_at, user_id LIMIT $2 OFFSET $3"
    )))
    .bind(cid.to_string())
    .bind(limit)
    .bind(offset)
    .fetch_all(crate::counted(&mut *conn))
    .await?;
    let mut members: Vec<Member> = rows::all(rows);
    let ids: Vec<String> = members.iter().map(|m| m.user_id.clone()).collect();
    let users = load_users(conn, &ids).await?;
    for m in &mut members {
        m.user = users.get(&m.user_id).cloned();
    }
    Ok(members)
}

/// On PostgreSQL, locks the channel row for the rest of the transaction (SQLite transactions
/// are already serialised).
pub(crate) async fn lock_channel(tx: &mut Tx, cid: &str) -> Result<()> {
    if tx.backend == crate::Backend::Postgres {
        sqlx::query("SELECT cid FROM channel WHERE cid = $1 FOR UPDATE")
            .bind(cid.to_string())
            .fetch_optional(crate::counted(&mut *tx.tx))
            .await?;
    }
    Ok(())
}
