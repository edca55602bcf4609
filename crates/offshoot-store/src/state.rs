//! A channel's state as a channel query returns it (messages, pinned messages, members, read
//! state, the caller's membership), for one channel or for a whole Query Channels page in a
//! fixed number of statements, whatever the number of channels.

use crate::channels::read_states_sql;
use crate::channels::ReadState;
use crate::messages::{arguments, hydrate_messages_of, latest_pages, union_all, visible_to, Bind, Page};
use crate::rows::{self, placeholders, MemberRow, MEMBER_COLS, MESSAGE_COLS};
use crate::users::load_users;
use crate::{counted, Result, Store};
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
        let (mut main, mut pins, mut binds) = (Vec::new(), Vec::new(), Vec::new());
        for ch in channels {
            binds.push(Bind::S(ch.cid.clone()));
            let c = binds.len();
            let vis = visible_to(viewer, ch.truncated_at, &mut binds);
            main.push((ch.cid.clone(), format!("m.cid = ${c} AND (m.parent_id IS NULL OR m.show_in_channel = TRUE) AND {vis}")));
            pins.push(format!(
                "SELECT {MESSAGE_COLS} FROM message m WHERE m.cid = ${c} AND m.pinned = TRUE AND m.deleted_at IS NULL AND {vis} \
                 ORDER BY m.pinned_at DESC LIMIT {PINNED_LIMIT}"
            ));
        }
        let mut messages = latest_pages(&mut conn, &main, &binds, message_limit.clamp(0, 300), |m| m.cid.clone()).await?;
        let mut pinned: HashMap<String, Vec<Message>> = HashMap::new();
        for chunk in pins.chunks(100) {
            let rows: Vec<rows::MessageRow> =
                sqlx::query_as_with(AssertSqlSafe(union_all(chunk)), arguments(&binds)?).fetch_all(counted(&mut *conn)).await?;
            for m in rows.into_iter().map(Message::from) {
                pinned.entry(m.cid.clone()).or_default().push(m);
            }
        }
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
        let mut members = members_of(&mut conn, &cids, member_limit).await?;
        let mut reads = read_states_of(&mut conn, channels, member_limit).await?;
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
async fn members_of(conn: &mut AnyConnection, cids: &[String], limit: i64) -> Result<HashMap<String, Vec<Member>>> {
    let mut out: HashMap<String, Vec<Member>> = HashMap::new();
    for chunk in cids.chunks(100) {
        let statements: Vec<String> = (0..chunk.len())
            .map(|i| format!("SELECT {MEMBER_COLS} FROM member WHERE cid = ${} ORDER BY created_at, user_id LIMIT {limit}", i + 1))
            .collect();
        let mut q = sqlx::query_as::<_, MemberRow>(AssertSqlSafe(union_all(&statements)));
        for cid in chunk {
            q = q.bind(cid.clone());
        }
        for m in q.fetch_all(counted(&mut *conn)).await?.into_iter().map(Member::from) {
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
async fn read_states_of(conn: &mut AnyConnection, channels: &[Channel], limit: i64) -> Result<HashMap<String, Vec<ReadState>>> {
    #[derive(sqlx::FromRow)]
    struct Row {
        cid: String,
        #[sqlx(flatten)]
        state: ReadState,
    }
    let mut out: HashMap<String, Vec<ReadState>> = HashMap::new();
    for chunk in channels.chunks(100) {
        let statements: Vec<String> = (0..chunk.len()).map(|i| read_states_sql(&format!("${}", i + 1), &limit.to_string())).collect();
        let mut q = sqlx::query_as::<_, Row>(AssertSqlSafe(union_all(&statements)));
        for ch in chunk {
            q = q.bind(ch.cid.clone());
        }
        for r in q.fetch_all(counted(&mut *conn)).await? {
            out.entry(r.cid).or_default().push(r.state);
        }
    }
    Ok(out)
}
