//! A group of new messages written together (`batch.rs`) with one statement per step for the
//! whole group, not per message: its channels locked and read in one (cid order), its authors
//! in one, the messages its replies and quotes name in one, its rows inserted in one, the unread
//! counters in one, its channels recorded in one, its recipients' totals in one, its events in
//! one. Written one by one in one transaction, a group held its channels' locks for five round
//! trips per message and PostgreSQL sustained fewer sends than without groups (docs/performance.md,
//! "Group commit").
//!
//! Each send is checked as a lone send is ([`Store::send_message_once`], the same checks in the
//! same order, with the same errors), and a refused send writes nothing: its checks come before
//! any write, and the insert that finds its id taken writes no row for it. Two kinds of send
//! are left for a transaction of their own after the group: a reply to or a quote of a message
//! of the same group (not written yet when the group's messages are read), and a second send of
//! one id.
//!
//! What differs from sends written one by one: every send of a group carries its recipients'
//! unread totals as they are after the whole group (a lone send's are as after it).

use crate::channels::{bump_channels, lock_channels};
use crate::messages::{check_parent, check_quote, check_reserved, id_taken, insert_new_rows, load_messages, new_row, QueuedSend};
use crate::users::{ensure_user, load_users};
use crate::{domain, not_found, rows, Result, Store};
use offshoot_core::model::{Channel, Message};
use offshoot_core::{ids, time};
use sqlx::AssertSqlSafe;
use std::collections::{BTreeMap, HashMap, HashSet};

/// A send's outcome: the message as written and its channel's truncation (to hydrate it).
pub(crate) type Sent = (Message, Option<i64>);

impl Store {
    /// The sends `items` in one transaction: each one's outcome, or `None` for a send left for a
    /// transaction of its own after this one (module doc).
    pub(crate) async fn send_messages_once(&self, items: &[QueuedSend]) -> Result<Vec<Option<Result<Sent>>>> {
        let mut outcomes: Vec<Option<Result<Sent>>> = items.iter().map(|_| None).collect();
        let ids: Vec<String> = items.iter().map(|s| if s.new.id.is_empty() { ids::new_id() } else { s.new.id.clone() }).collect();
        let live = written_together(items, &ids);
        if live.is_empty() {
            return Ok(outcomes);
        }
        let mut tx = self.begin().await?;
        let cids = sorted(live.iter().map(|i| items[*i].cid.clone()));
        let channels: HashMap<String, Channel> = lock_channels(&mut tx, &cids).await?.into_iter().map(|c| (c.cid.clone(), c)).collect();
        let mut authors = load_users(&mut tx.tx, &sorted(live.iter().map(|i| items[*i].author.id.clone()))).await?;
        let named = sorted(live.iter().flat_map(|i| [items[*i].new.parent_id.clone(), items[*i].new.quoted_message_id.clone()]).flatten());
        let named: HashMap<String, (Message, bool)> = if named.is_empty() {
            HashMap::new()
        } else {
            load_messages(&mut tx.tx, &named).await?.into_iter().map(|(m, hidden)| (m.id.clone(), (m, hidden))).collect()
        };
        // The checks of a lone send, in its order; a refused send writes nothing.
        let mut accepted = Vec::with_capacity(live.len());
        for i in live {
            match check_send(&items[i], &ids[i], &channels, &named) {
                Ok(()) => accepted.push(i),
                Err(e) => outcomes[i] = Some(Err(e)),
            }
        }
        for i in &accepted {
            let author = &items[*i].author;
            if !authors.contains_key(&author.id) {
                authors.insert(author.id.clone(), ensure_user(&mut tx, author).await?);
            }
        }
        // Each message a microsecond after the one before, so a channel's messages keep the order
        // in which they arrived.
        let now = time::now();
        let msgs: Vec<Message> = accepted
            .iter()
            .enumerate()
            .map(|(k, i)| {
                let s = &items[*i];
                new_row(&channels[&s.cid], &s.new, &authors[&s.author.id], ids[*i].clone(), now + k as i64 * 1_000)
            })
            .collect();
        let written = insert_new_rows(&mut tx, &msgs).await?;
        let mut kept: Vec<(usize, Message)> = Vec::with_capacity(msgs.len());
        for (i, m) in accepted.into_iter().zip(msgs) {
            if written.contains(&m.id) {
                kept.push((i, m));
            } else {
                outcomes[i] = Some(domain(id_taken(&m.id)));
            }
        }
        if kept.is_empty() {
            return Ok(outcomes);
        }
        let kept_msgs: Vec<&Message> = kept.iter().map(|(_, m)| m).collect();
        count_replies(&mut tx, &kept_msgs).await?;
        crate::unread::count_new_messages(&mut tx, &kept_msgs, |cid| channels[cid].truncated_at).await?;
        let bumps = channel_bumps(&kept_msgs);
        let last_at = now + (kept.len() as i64 - 1) * 1_000;
        let watchers = bump_channels(&mut tx, &bumps, last_at).await?;
        let kept_cids: Vec<String> = bumps.into_iter().map(|(cid, _, _)| cid).collect();
        let totals = crate::unread::counts_of_members_of(&mut tx.tx, &kept_cids).await?;
        // Each send's channel as it was after it (the lone send's `UPDATE … RETURNING`).
        let mut state = channels;
        for (i, m) in kept {
            let ch = state.get_mut(&m.cid).expect("a kept send's channel is locked");
            ch.message_count += 1;
            ch.last_message_at = Some(ch.last_message_at.map_or(m.created_at, |at| at.max(m.created_at)));
            ch.updated_at = last_at;
            let unread = totals.get(&m.cid).cloned().unwrap_or_default();
            let watchers = watchers.get(&m.cid).copied().unwrap_or(0);
            crate::messages::queue_message_new(&mut tx, ch, &m, m.user.clone(), watchers, unread).await?;
            outcomes[i] = Some(Ok((m, ch.truncated_at)));
        }
        tx.commit(self).await?;
        Ok(outcomes)
    }
}

/// The sends of `items` (with the message ids `ids`) that this group writes: not a second send
/// of one id, and not a reply to or a quote of a message of the same group (module doc).
fn written_together(items: &[QueuedSend], ids: &[String]) -> Vec<usize> {
    let in_group: HashSet<&str> = ids.iter().map(String::as_str).collect();
    let mut seen = HashSet::new();
    (0..items.len())
        .filter(|i| {
            let new = &items[*i].new;
            let names_group = [&new.parent_id, &new.quoted_message_id].into_iter().flatten().any(|r| in_group.contains(r.as_str()));
            seen.insert(ids[*i].as_str()) && !names_group
        })
        .collect()
}

/// The checks of a lone send of `s` with the message id `id`, in its order, against its locked
/// channel and the messages its reply and quote name.
fn check_send(s: &QueuedSend, id: &str, channels: &HashMap<String, Channel>, named: &HashMap<String, (Message, bool)>) -> Result<()> {
    match channels.get(&s.cid) {
        None => not_found(format!("channel {:?} does not exist", s.cid)),
        Some(ch) if ch.deleted_at.is_some() => not_found(format!("channel {:?} was deleted", s.cid)),
        Some(ch) => ch
            .check_text(&s.new.text)
            .map_err(Into::into)
            .and_then(|()| check_reserved(ch, id))
            .and_then(|()| check_parent(ch, &s.new, s.new.parent_id.as_ref().and_then(|p| named.get(p))))
            .and_then(|()| check_quote(ch, &s.new, s.new.quoted_message_id.as_ref().and_then(|q| named.get(q)))),
    }
}

/// Each channel of `msgs` with how many of them it gets and the newest one's `created_at`, by
/// cid (the order the channels were locked in).
fn channel_bumps(msgs: &[&Message]) -> Vec<(String, i64, i64)> {
    let mut bumps: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    for m in msgs {
        let (n, last) = bumps.entry(&m.cid).or_insert((0, m.created_at));
        *n += 1;
        *last = (*last).max(m.created_at);
    }
    bumps.into_iter().map(|(cid, (n, last))| (cid.to_string(), n, last)).collect()
}

/// The distinct values of `it`, sorted.
fn sorted(it: impl Iterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = it.collect();
    v.sort();
    v.dedup();
    v
}

/// Adds the new replies `msgs` to their parents' reply counts, in one statement.
async fn count_replies(tx: &mut crate::Tx, msgs: &[&Message]) -> Result<()> {
    let mut parents: BTreeMap<&str, i64> = BTreeMap::new();
    for pid in msgs.iter().filter_map(|m| m.parent_id.as_deref()) {
        *parents.entry(pid).or_default() += 1;
    }
    if parents.is_empty() {
        return Ok(());
    }
    let values = rows::value_rows(tx.backend, 1, parents.len(), 2);
    let sql = format!(
        "WITH v (id, n) AS (VALUES {values}) UPDATE message SET reply_count = message.reply_count + v.n FROM v WHERE message.id = v.id"
    );
    let mut q = sqlx::query(AssertSqlSafe(sql));
    for (pid, n) in parents {
        q = q.bind(pid.to_string()).bind(n);
    }
    q.execute(crate::counted(&mut *tx.tx)).await?;
    Ok(())
}
