//! A channel's state as a channel query returns it (messages, pinned messages, members, read
//! state, the caller's membership), for one channel or for a whole Query Channels page in a
//! fixed number of statements, whatever the number of channels.

use crate::channels::read_states_sql;
use crate::channels::ReadState;
use crate::messages::{hydrate_messages_of, latest_pages, page_sql, pins_sql, Page};
use crate::rows::{self, lateral, placeholders, MemberRow, MEMBER_COLS};
use crate::sql::{arguments, union_all, Bind};
use crate::users::load_users;
use crate::visibility::{visible_after, visible_to};
use crate::{counted, Backend, Result, Store};
use offshoot_core::model::{Channel, Member, Message, Viewer};
use sqlx::{AnyConnection, AssertSqlSafe};
use std::collections::{HashMap, HashSet};

/// How many pinned messages a channel state carries.
const PINNED_LIMIT: i64 = 10;

/// What a channel query answers besides the channel itself.
#[derive(Debug, Clone, Default)]
pub struct ChannelState {
    /// Whether the viewer is a member.
    pub is_member: bool,
    /// The page of the main list, oldest first.
    pub messages: Vec<Message>,
    /// Pinned messages, newest pin first.
    pub pinned: Vec<Message>,
    /// The first members, in the order they joined.
    pub members: Vec<Member>,
    /// The read state of those members.
    pub reads: Vec<ReadState>,
}

impl Store {
    /// The state of one channel with the message page `page`.
    pub async fn channel_state(&self, ch: &Channel, viewer: &Viewer, page: &Page, member_limit: i64) -> Result<ChannelState> {
        let is_member = match viewer.user_id() {
            Some(uid) => self.is_member(&ch.cid, uid).await?,
            None => false,
        };
        Ok(ChannelState {
            is_member,
            messages: self.channel_messages(ch, viewer, page).await?,
            pinned: self.pinned_messages(ch, viewer, PINNED_LIMIT).await?,
            members: self.members(&ch.cid, member_limit, 0).await?,
            reads: self.member_read_states(ch, member_limit).await?,
        })
    }

    /// The states of `channels` with their newest `message_limit` messages, in `channels`
    /// order: one statement per part for up to 100 channels (Query Channels' page size).
    pub async fn channel_states(
        &self,
        channels: &[Channel],
        viewer: &Viewer,
        message_limit: i64,
        member_limit: i64,
    ) -> Result<Vec<ChannelState>> {
        if channels.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.pool().acquire().await?;
        let cids: Vec<String> = channels.iter().map(|c| c.cid.clone()).collect();
        let truncation: HashMap<String, Option<i64>> = channels.iter().map(|c| (c.cid.clone(), c.truncated_at)).collect();
        let truncated_at = |cid: &str| truncation.get(cid).copied().flatten();

        let mut joined: HashSet<String> = HashSet::new();
        if let Some(uid) = viewer.user_id() {
            for chunk in cids.chunks(500) {
                let sql = format!("SELECT cid FROM member WHERE user_id = $1 AND cid IN ({})", placeholders(2, chunk.len()));
                let mut q = sqlx::query_scalar::<_, String>(AssertSqlSafe(sql)).bind(uid.to_string());
                for cid in chunk {
                    q = q.bind(cid.clone());
                }
                joined.extend(q.fetch_all(counted(&mut *conn)).await?);
            }
        }

        // The main list and the pins of each channel, as `channel_messages` and
        // `pinned_messages` select them.
        let lim = message_limit.clamp(0, 300);
        let (mut messages, mut pinned) = match self.backend {
            Backend::Postgres => latest_and_pinned_lateral(&mut conn, channels, viewer, lim).await?,
            Backend::Sqlite => latest_and_pinned_union(&mut conn, channels, viewer, lim).await?,
        };
        for pins in pinned.values_mut() {
            pins.sort_by_key(|m| std::cmp::Reverse(m.pinned_at));
        }
        // Hydrate every message of every channel at once, then hand each channel its part:
        // its page first, then its pins.
        let mut all: Vec<Message> = Vec::new();
        let mut lengths = Vec::with_capacity(cids.len());
        for cid in &cids {
            let (page, pins) = (messages.remove(cid).unwrap_or_default(), pinned.remove(cid).unwrap_or_default());
            lengths.push((page.len(), pins.len()));
            all.extend(page);
            all.extend(pins);
        }
        hydrate_messages_of(&mut conn, &mut all, viewer, &truncated_at).await?;
        let mut members = members_of(&mut conn, self.backend, &cids, member_limit).await?;
        let mut reads = read_states_of(&mut conn, self.backend, &cids, member_limit).await?;
        let mut all = all.into_iter();
        let mut out = Vec::with_capacity(channels.len());
        for (ch, (page_len, pins_len)) in channels.iter().zip(lengths) {
            let members = members.remove(&ch.cid).unwrap_or_default();
            let mut reads = reads.remove(&ch.cid).unwrap_or_default();
            // The read states of the same first members, in the same order.
            let position: HashMap<&str, usize> = members.iter().enumerate().map(|(i, m)| (m.user_id.as_str(), i)).collect();
            reads.sort_by_key(|r| position.get(r.user_id.as_str()).copied().unwrap_or(usize::MAX));
            out.push(ChannelState {
                is_member: joined.contains(&ch.cid),
                messages: all.by_ref().take(page_len).collect(),
                pinned: all.by_ref().take(pins_len).collect(),
                members,
                reads,
            });
        }
        Ok(out)
    }
}

/// The first `limit` members of each channel (as `Store::members` orders them), with their users.
async fn members_of(conn: &mut AnyConnection, backend: Backend, cids: &[String], limit: i64) -> Result<HashMap<String, Vec<Member>>> {
    let mut out: HashMap<String, Vec<Member>> = HashMap::new();
    for chunk in cids.chunks(100) {
        let sql = members_statement(backend, chunk.len(), limit);
        for m in rows::fetch_json::<MemberRow>(conn, &sql, MEMBER_COLS, cid_arguments(chunk)?).await?.into_iter().map(Member::from) {
            out.entry(m.cid.clone()).or_default().push(m);
        }
    }
    let ids: Vec<String> = out.values().flatten().map(|m| m.user_id.clone()).collect();
    let users = load_users(conn, &ids).await?;
    for members in out.values_mut() {
        members.sort_by(|a, b| (a.created_at, &a.user_id).cmp(&(b.created_at, &b.user_id)));
        for m in members.iter_mut() {
            m.user = users.get(&m.user_id).cloned();
        }
    }
    Ok(out)
}

/// `Store::member_read_states` of each channel, unordered.
async fn read_states_of(
    conn: &mut AnyConnection,
    backend: Backend,
    cids: &[String],
    limit: i64,
) -> Result<HashMap<String, Vec<ReadState>>> {
    // The columns of `read_states_sql`: cid, then the read state's fields.
    type Row = (String, String, i64, Option<String>, i64);
    let mut out: HashMap<String, Vec<ReadState>> = HashMap::new();
    for chunk in cids.chunks(100) {
        let sql = read_states_statement(backend, chunk.len(), limit);
        let select = "cid, user_id, last_read, last_read_message_id, unread_messages";
        for (cid, user_id, last_read, last_read_message_id, unread_messages) in
            rows::fetch_json::<Row>(conn, &sql, select, cid_arguments(chunk)?).await?
        {
            out.entry(cid).or_default().push(ReadState { user_id, last_read, last_read_message_id, unread_messages });
        }
    }
    Ok(out)
}

/// The statement of the first `limit` members of each of `n` channels (bound as `$1 … $n`), in
/// `(created_at, user_id)` order, which the index `member_cid_created_at` holds (migration 0014).
fn members_statement(backend: Backend, n: usize, limit: i64) -> String {
    per_channel(backend, n, |cid| format!("SELECT {MEMBER_COLS} FROM member WHERE cid = {cid} ORDER BY created_at, user_id LIMIT {limit}"))
}

/// The statement of the read states of the first `limit` members of each of `n` channels.
fn read_states_statement(backend: Backend, n: usize, limit: i64) -> String {
    per_channel(backend, n, |cid| read_states_sql(cid, &limit.to_string()))
}

/// `cids` as the arguments `$1 … $n`.
fn cid_arguments(cids: &[String]) -> Result<sqlx::any::AnyArguments> {
    arguments(&cids.iter().map(|c| Bind::S(c.clone())).collect::<Vec<_>>())
}

/// One statement that runs `each` (a statement about one channel, given the SQL of its cid) for
/// `n` channels bound as `$1 … $n`. PostgreSQL: one `LATERAL` subquery over a `VALUES` list of
/// the cids, planned once; a `UNION ALL` of `n` copies was planned copy by copy on every
/// execution (plans are made per execution here, `Store::connect`), 4–9 ms per statement for 30
/// channels, more than running it (docs/performance.md, "Query Channels"). SQLite has no
/// `LATERAL` and plans a union in microseconds: the union.
fn per_channel(backend: Backend, n: usize, each: impl Fn(&str) -> String) -> String {
    match backend {
        Backend::Postgres => {
            let keys = (1..=n).map(|i| format!("(${i})")).collect::<Vec<_>>().join(", ");
            lateral(&keys, "cid", &each("k.cid"))
        }
        Backend::Sqlite => union_all(&(1..=n).map(|i| each(&format!("${i}"))).collect::<Vec<_>>()),
    }
}

/// The newest `lim` messages (oldest first) and the pins of each channel, by cid, as a union of
/// one page per channel (SQLite).
async fn latest_and_pinned_union(
    conn: &mut AnyConnection,
    channels: &[Channel],
    viewer: &Viewer,
    lim: i64,
) -> Result<(HashMap<String, Vec<Message>>, HashMap<String, Vec<Message>>)> {
    let (mut main, mut binds) = (Vec::new(), Vec::new());
    for ch in channels {
        binds.push(Bind::S(ch.cid.clone()));
        let c = binds.len();
        let vis = visible_to(viewer, ch.truncated_at, &mut binds);
        main.push((ch.cid.clone(), format!("m.cid = ${c} AND (m.parent_id IS NULL OR m.show_in_channel = TRUE) AND {vis}")));
    }
    let messages = latest_pages(conn, &main, &binds, lim, |m| m.cid.clone()).await?;
    let mut pinned: HashMap<String, Vec<Message>> = HashMap::new();
    for chunk in channels.chunks(100) {
        let (sql, binds) = pins_statement(Backend::Sqlite, chunk, viewer);
        messages_by_cid(conn, sql, &binds, &mut pinned).await?;
    }
    Ok((messages, pinned))
}

/// [`latest_and_pinned_union`] as two `LATERAL` statements over the channels (PostgreSQL; see
/// [`per_channel`]).
async fn latest_and_pinned_lateral(
    conn: &mut AnyConnection,
    channels: &[Channel],
    viewer: &Viewer,
    lim: i64,
) -> Result<(HashMap<String, Vec<Message>>, HashMap<String, Vec<Message>>)> {
    let (mut messages, mut pinned): (HashMap<String, Vec<Message>>, HashMap<String, Vec<Message>>) = Default::default();
    for chunk in channels.chunks(100) {
        let (mut binds, keys) = lateral_keys(chunk);
        let vis = visible_after(viewer, "k.after", &mut binds);
        let main = page_sql(&format!("m.cid = k.cid AND (m.parent_id IS NULL OR m.show_in_channel = TRUE) AND {vis}"), true, lim);
        messages_by_cid(conn, lateral(&keys, "cid, after", &main), &binds, &mut messages).await?;
        let (sql, binds) = pins_statement(Backend::Postgres, chunk, viewer);
        messages_by_cid(conn, sql, &binds, &mut pinned).await?;
    }
    for page in messages.values_mut() {
        rows::oldest_first(page);
    }
    Ok((messages, pinned))
}

/// The rows `(cid, after)` of `channels` for [`lateral`], as placeholders, and their values.
fn lateral_keys(channels: &[Channel]) -> (Vec<Bind>, String) {
    let mut binds = Vec::with_capacity(channels.len() * 2 + 1);
    let mut keys = Vec::with_capacity(channels.len());
    for ch in channels {
        binds.push(Bind::S(ch.cid.clone()));
        binds.push(Bind::I(ch.truncated_at.unwrap_or(i64::MIN)));
        keys.push(format!("(${}, ${})", binds.len() - 1, binds.len()));
    }
    (binds, keys.join(", "))
}

/// The statement that reads the pins of `channels` (each after its own truncation, as `viewer`
/// sees them, newest pin first, [`PINNED_LIMIT`] each), and its values: a `LATERAL` list on
/// PostgreSQL, a union on SQLite (see [`per_channel`]). [`Store::channel_states_plan`] explains
/// this same statement.
fn pins_statement(backend: Backend, channels: &[Channel], viewer: &Viewer) -> (String, Vec<Bind>) {
    match backend {
        Backend::Postgres => {
            let (mut binds, keys) = lateral_keys(channels);
            let vis = visible_after(viewer, "k.after", &mut binds);
            (lateral(&keys, "cid, after", &pins_sql(Backend::Postgres, "k.cid", &vis, PINNED_LIMIT)), binds)
        }
        Backend::Sqlite => {
            let (mut pins, mut binds) = (Vec::new(), Vec::new());
            for ch in channels {
                binds.push(Bind::S(ch.cid.clone()));
                let c = binds.len();
                let vis = visible_to(viewer, ch.truncated_at, &mut binds);
                pins.push(pins_sql(Backend::Sqlite, &format!("${c}"), &vis, PINNED_LIMIT));
            }
            (union_all(&pins), binds)
        }
    }
}

/// A statement of [`Store::channel_states`] whose plan [`Store::channel_states_plan`] shows.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatePart {
    /// Each channel's pins.
    Pins,
    /// Each channel's first members.
    Members,
    /// The read states of each channel's first members.
    ReadStates,
}

impl Store {
    /// The database's plan, as text, for one statement of [`Store::channel_states`] over
    /// `channels` (`EXPLAIN` on PostgreSQL, `EXPLAIN QUERY PLAN` on SQLite), on a connection of
    /// the store with its settings. The conformance suite checks that each reads through its
    /// index rather than walking each channel's messages or members (migrations 0013 and 0014).
    /// On SQLite, members and read states run inside a `json_group_array` wrapper
    /// (`rows::fetch_json`); this is the statement inside it.
    #[doc(hidden)]
    pub async fn channel_states_plan(&self, part: StatePart, channels: &[Channel], viewer: &Viewer, member_limit: i64) -> Result<String> {
        let cids: Vec<String> = channels.iter().map(|c| c.cid.clone()).collect();
        let (sql, args) = match part {
            StatePart::Pins => {
                let (sql, binds) = pins_statement(self.backend, channels, viewer);
                (sql, arguments(&binds)?)
            }
            StatePart::Members => (members_statement(self.backend, cids.len(), member_limit), cid_arguments(&cids)?),
            StatePart::ReadStates => (read_states_statement(self.backend, cids.len(), member_limit), cid_arguments(&cids)?),
        };
        let explain = match self.backend {
            Backend::Postgres => "EXPLAIN",
            Backend::Sqlite => "EXPLAIN QUERY PLAN",
        };
        let sql = format!("{explain} {sql}");
        let mut conn = self.pool().acquire().await?;
        let rows = sqlx::query_with(AssertSqlSafe(sql), args).fetch_all(crate::counted(&mut *conn)).await?;
        let mut lines = Vec::with_capacity(rows.len());
        for row in &rows {
            // PostgreSQL's one column, or SQLite's last (`detail`).
            lines.push(sqlx::Row::try_get::<String, _>(row, sqlx::Row::len(row) - 1)?);
        }
        Ok(lines.join("\n"))
    }
}

/// Runs a statement of messages and adds its rows to `into`, by cid.
async fn messages_by_cid(conn: &mut AnyConnection, sql: String, binds: &[Bind], into: &mut HashMap<String, Vec<Message>>) -> Result<()> {
    for m in rows::fetch_messages(conn, &sql, arguments(binds)?).await? {
        into.entry(m.cid.clone()).or_default().push(m);
    }
    Ok(())
}
