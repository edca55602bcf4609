//! Messages, replies, reactions, truncation and rewind, with the visibility rules every read
//! applies.

use crate::batch::{Groups, Work};
use crate::channels::{
    add_members_tx, event_for, load_channel, load_channels, lock_and_load, lock_for_new_message, reload, remove_members_tx,
    to_watchers_and_hooks, write_channel_fields, ChannelUpdate, WithChannel, BUMP_CHANNEL,
};
use crate::events::Note;
use crate::rows::{self, placeholders, MessageRow, ReactionRow, MESSAGE_COLS, REACTION_COLS};
use crate::sql::{arguments, union_all, Bind};
use crate::users::{ensure_user, load_users};
use crate::visibility::{is_visible, visible_to};
use crate::{domain, not_found, Backend, Result, Store, Tx};
use offshoot_core::model::{Audience, Channel, ForkStatus, Message, NewMessage, Reaction, UnreadCounts, User, Viewer};
use offshoot_core::{ids, time, Error, ErrorKind};
use sqlx::any::AnyArguments;
use sqlx::{AnyConnection, AssertSqlSafe};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// Message pagination as Stream's `messages` / replies parameters give it.
#[derive(Debug, Clone, Default)]
pub struct Page {
    pub limit: i64,
    pub dir: PageDir,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub enum PageDir {
    #[default]
    Latest,
    Before {
        id: String,
        inclusive: bool,
    },
    After {
        id: String,
        inclusive: bool,
    },
    Around {
        id: String,
    },
}

/// The pins of the channel `cid` (SQL) visible by `vis`, newest pin first. SQLite is told to
/// use the index of pins (`message_pinned`, migration 0009): without statistics it preferred
/// the channel's `created_at` index for the visibility's `created_at > …` and walked every
/// message of the channel (docs/performance.md, "Query Channels"). PostgreSQL made the same choice
/// for Query Channels' pins, whose truncations it cannot see; the index of pins holds
/// `created_at` too (migration 0013, both engines), which it then prefers.
pub(crate) fn pins_sql(backend: Backend, cid: &str, vis: &str, limit: i64) -> String {
    let indexed = match backend {
        Backend::Sqlite => " INDEXED BY message_pinned",
        Backend::Postgres => "",
    };
    format!(
        "SELECT {MESSAGE_COLS} FROM message m{indexed} WHERE m.cid = {cid} AND m.pinned = TRUE AND m.deleted_at IS NULL AND {vis} \
         ORDER BY m.pinned_at DESC LIMIT {limit}"
    )
}

impl Store {
    /// Messages of a channel's main list (top-level and replies shown in the channel),
    /// oldest first.
    pub async fn channel_messages(&self, ch: &Channel, viewer: &Viewer, page: &Page) -> Result<Vec<Message>> {
        let mut conn = self.pool().acquire().await?;
        let mut binds = vec![Bind::S(ch.cid.clone())];
        let vis = visible_to(viewer, ch.truncated_at, &mut binds);
        let base = format!("m.cid = $1 AND (m.parent_id IS NULL OR m.show_in_channel = TRUE) AND {vis}");
        let mut msgs = paginate(&mut conn, &base, binds, page, "m.cid = $1").await?;
        hydrate_messages(&mut conn, &mut msgs, viewer, ch.truncated_at).await?;
        Ok(msgs)
    }

    /// Replies of a thread, oldest first.
    pub async fn replies(&self, parent: &Message, truncated_at: Option<i64>, viewer: &Viewer, page: &Page) -> Result<Vec<Message>> {
        let mut conn = self.pool().acquire().await?;
        let mut binds = vec![Bind::S(parent.id.clone())];
        let vis = visible_to(viewer, truncated_at, &mut binds);
        let base = format!("m.parent_id = $1 AND {vis}");
        let mut msgs = paginate(&mut conn, &base, binds, page, "m.parent_id = $1").await?;
        hydrate_messages(&mut conn, &mut msgs, viewer, truncated_at).await?;
        Ok(msgs)
    }

    /// Pinned messages of a channel visible to `viewer`, newest pin first.
    pub async fn pinned_messages(&self, ch: &Channel, viewer: &Viewer, limit: i64) -> Result<Vec<Message>> {
        let mut conn = self.pool().acquire().await?;
        let mut binds = vec![Bind::S(ch.cid.clone())];
        let vis = visible_to(viewer, ch.truncated_at, &mut binds);
        let sql = pins_sql(self.backend, "$1", &vis, limit);
        let rows: Vec<MessageRow> =
            sqlx::query_as_with(AssertSqlSafe(sql), arguments(&binds)?).fetch_all(crate::counted(&mut *conn)).await?;
        let mut msgs: Vec<Message> = rows::all(rows);
        hydrate_messages(&mut conn, &mut msgs, viewer, ch.truncated_at).await?;
        Ok(msgs)
    }

    /// A message as stored, with `hidden` telling whether a rewind hid it. Not filtered by
    /// viewer: callers apply [`is_visible`].
    pub async fn get_message(&self, id: &str, viewer: &Viewer) -> Result<Option<(Message, bool)>> {
        let mut conn = self.pool().acquire().await?;
        let Some((mut m, hidden)) = load_message(&mut conn, id).await? else { return Ok(None) };
        let truncated_at = load_channel(&mut conn, &self.cache, &m.cid).await?.and_then(|c| c.truncated_at);
        hydrate_messages(&mut conn, std::slice::from_mut(&mut m), viewer, truncated_at).await?;
        Ok(Some((m, hidden)))
    }

    /// [`Store::get_message`] with the message's channel (soft-deleted ones too), which the
    /// read loads anyway. `None` also when the channel is gone.
    pub async fn get_message_in_channel(&self, id: &str, viewer: &Viewer) -> Result<Option<(Message, bool, Channel)>> {
        let mut conn = self.pool().acquire().await?;
        let Some((mut m, hidden)) = load_message(&mut conn, id).await? else { return Ok(None) };
        let Some(ch) = load_channel(&mut conn, &self.cache, &m.cid).await? else { return Ok(None) };
        hydrate_messages(&mut conn, std::slice::from_mut(&mut m), viewer, ch.truncated_at).await?;
        Ok(Some((m, hidden, ch)))
    }

    /// A message as stored (not hydrated: no users, reactions, quote) with its channel's row
    /// with its fork summary and type config (no creator), soft-deleted ones too: what a write's
    /// checks read before its transaction (visibility, the author, the channel's deletion,
    /// truncation and limits), in two statements instead of [`Store::get_message_in_channel`]'s
    /// six. The write's transaction hydrates what it announces. `None` also when the channel
    /// is gone.
    pub async fn message_for_write(&self, id: &str) -> Result<Option<(Message, bool, Channel)>> {
        let mut conn = self.pool().acquire().await?;
        let Some((m, hidden)) = load_message(&mut conn, id).await? else { return Ok(None) };
        let Some(ch) = crate::channels::bare_channel(&mut conn, &self.cache, &m.cid).await? else { return Ok(None) };
        Ok(Some((m, hidden, ch)))
    }

    /// Sends a message. Checks, in the transaction: the channel exists and is not deleted, the
    /// text fits its type's `max_message_length`, the id is free (and not reserved by a fork
    /// still copying), the parent is a top-level message of the channel, the quote exists. Sends
    /// that arrive while others are being written are written together (`batch.rs`).
    pub async fn send_message(&self, cid: &str, new: &NewMessage, author: &User) -> Result<Message> {
        let (m, truncated_at) = self.grouped(QueuedSend { cid: cid.to_string(), new: new.clone(), author: author.clone() }).await?;
        self.hydrated_new(m, truncated_at).await
    }

    /// One send in a transaction of its own.
    pub(crate) async fn send_message_once(&self, cid: &str, new: &NewMessage, author: &User) -> Result<(Message, Option<i64>)> {
        let mut tx = self.begin().await?;
        let sent = send_in(&mut tx, cid, new, author).await?;
        tx.commit(self).await?;
        Ok(sent)
    }

    /// A message just sent, filled in as [`Store::hydrated`] does. A new message has no
    /// reactions and no replies yet (its reaction and participant fields are empty as built)
    /// and its author is loaded already, so only a quote or mentioned users need a read.
    async fn hydrated_new(&self, m: Message, truncated_at: Option<i64>) -> Result<Message> {
        if m.quoted_message_id.is_some() || !m.mentioned_users.is_empty() || m.user.is_none() {
            return self.hydrated(m, truncated_at).await;
        }
        Ok(m)
    }

    /// A message with its users, reactions and quote filled in, as a server-side reader sees it.
    pub(crate) async fn hydrated(&self, m: Message, truncated_at: Option<i64>) -> Result<Message> {
        let mut conn = self.pool().acquire().await?;
        let mut out = vec![m];
        hydrate_messages(&mut conn, &mut out, &Viewer::Server, truncated_at).await?;
        Ok(out.pop().expect("one message in, one out"))
    }

    /// Applies `change` to a stored message and announces `message.updated` as done by `actor`
    /// ([`Store::edit_message`]).
    pub async fn update_message<F>(&self, id: &str, actor: &User, change: F) -> Result<Message>
    where
        F: Fn(&mut Message) -> offshoot_core::error::Result<()> + Send + Sync + 'static,
    {
        self.edit_message(id, Editor::User(actor.clone()), move |m, _| change(m)).await
    }

    /// Applies `change` to a stored message, given its channel as locked, and announces
    /// `message.updated` as done by `editor`. The message's channel is locked first, so
    /// concurrent changes of one message apply one after the other and none is lost; `change`
    /// may run more than once (a retried transaction). A message that is missing, hidden, in a
    /// deleted channel or before its channel's truncation is not found. Updates that arrive
    /// while others are being written are written together (`batch.rs`).
    pub async fn edit_message<F>(&self, id: &str, editor: Editor, change: F) -> Result<Message>
    where
        F: Fn(&mut Message, &Channel) -> offshoot_core::error::Result<()> + Send + Sync + 'static,
    {
        self.grouped(QueuedUpdate { id: id.to_string(), editor, change: std::sync::Arc::new(change) }).await
    }

    /// One update in a transaction of its own.
    pub(crate) async fn update_message_once(&self, id: &str, editor: &Editor, change: &ChangeFn) -> Result<Message> {
        let mut tx = self.begin().await?;
        let Some((mut ch, m)) = lock_message(&mut tx, id).await?.filter(|(ch, m)| writable(ch, m)) else {
            return not_found(format!("message with id {id:?} does not exist"));
        };
        ch.config = self.cache.types(&mut tx.tx).await?.get(&ch.kind).cloned();
        let changed = changed(&m, &ch, change)?;
        write_update(&mut tx, &ch, &m, &changed).await?;
        let mut out = vec![changed];
        hydrate_messages(&mut tx.tx, &mut out, &Viewer::Server, ch.truncated_at).await?;
        let m = out.pop().expect("one message in, one out");
        let named = named_editors(&mut tx.tx, [(editor, &m)]).await?;
        let mut ev = event_for("message.updated", &ch, Some(editor.user(&m, &named)));
        ev.message = Some(m.clone());
        tx.event(ev, to_watchers_and_hooks(&ch.cid)).await?;
        tx.commit(self).await?;
        Ok(m)
    }

    /// Several updates in one transaction (`batch.rs`): the channels of their messages locked
    /// in one statement (in cid order, so two groups never wait for each other in a cycle), the
    /// messages read in one, each update applied in order to the message as the updates before
    /// it left it and written, everything announced hydrated in one pass. An update whose
    /// message is missing or whose change refuses gets its error and writes nothing; an error of
    /// the database fails the whole transaction.
    pub(crate) async fn update_messages_once(&self, items: &[QueuedUpdate]) -> Result<Vec<Result<Message>>> {
        let mut tx = self.begin().await?;
        let mut ids: Vec<String> = items.iter().map(|u| u.id.clone()).collect();
        ids.sort();
        ids.dedup();
        let types = self.cache.types(&mut tx.tx).await?;
        let mut channels: HashMap<String, Channel> = HashMap::new();
        for mut c in crate::channels::lock_channels_of_messages(&mut tx, &ids).await? {
            c.config = types.get(&c.kind).cloned();
            channels.insert(c.cid.clone(), c);
        }
        let mut current: HashMap<String, Message> = HashMap::new();
        for (m, hidden) in load_messages(&mut tx.tx, &ids).await? {
            if !hidden && channels.get(&m.cid).is_some_and(|ch| writable(ch, &m)) {
                current.insert(m.id.clone(), m);
            }
        }
        // Each update's outcome: the index of its message among `written`, or its error.
        let mut outcomes: Vec<Result<usize>> = Vec::with_capacity(items.len());
        let mut written: Vec<Message> = Vec::new();
        // Messages changed but not written yet: their rows are written together, before any
        // update that moves a message's visibility (it recounts from the rows) and at the end.
        let mut unwritten: Vec<String> = Vec::new();
        for QueuedUpdate { id, change, .. } in items {
            let Some(before) = current.get(id) else {
                outcomes.push(not_found(format!("message with id {id:?} does not exist")));
                continue;
            };
            let ch = &channels[&before.cid];
            let m = match changed(before, ch, &**change) {
                Ok(m) => m,
                Err(e) => {
                    outcomes.push(Err(e));
                    continue;
                }
            };
            if moves_visibility(before, &m) {
                unwritten.retain(|u| *u != m.id);
                write_rows(&mut tx, &unwritten.drain(..).map(|u| &current[&u]).collect::<Vec<_>>()).await?;
                write_update(&mut tx, ch, before, &m).await?;
            } else if !unwritten.contains(&m.id) {
                unwritten.push(m.id.clone());
            }
            current.insert(m.id.clone(), m.clone());
            outcomes.push(Ok(written.len()));
            written.push(m);
        }
        write_rows(&mut tx, &unwritten.iter().map(|u| &current[u]).collect::<Vec<_>>()).await?;
        hydrate_messages_of(&mut tx.tx, &mut written, &Viewer::Server, &|cid| channels.get(cid).and_then(|c| c.truncated_at)).await?;
        let done = || items.iter().zip(&outcomes).filter_map(|(u, o)| o.as_ref().ok().map(|i| (&u.editor, &written[*i])));
        let named = named_editors(&mut tx.tx, done()).await?;
        for (editor, m) in done() {
            let mut ev = event_for("message.updated", &channels[&m.cid], Some(editor.user(m, &named)));
            ev.message = Some(m.clone());
            tx.event(ev, to_watchers_and_hooks(&m.cid)).await?;
        }
        tx.commit(self).await?;
        Ok(outcomes.into_iter().map(|o| o.map(|i| written[i].clone())).collect())
    }

    /// Soft delete marks the message `deleted`; hard delete removes it and its reactions.
    pub async fn delete_message(&self, id: &str, hard: bool, actor: Option<&User>) -> Result<Message> {
        self.retrying("delete_message", || self.delete_message_once(id, hard, actor)).await
    }

    async fn delete_message_once(&self, id: &str, hard: bool, actor: Option<&User>) -> Result<Message> {
        let mut tx = self.begin().await?;
        let Some((ch, mut m)) = lock_message(&mut tx, id).await? else {
            return not_found(format!("message with id {id:?} does not exist"));
        };
        let now = time::now();
        let was_deleted = m.deleted_at.is_some();
        crate::unread::uncount_message(&mut tx, &m, ch.truncated_at).await?;
        if hard {
            for sql in [
                "DELETE FROM reaction WHERE message_id = $1",
                "DELETE FROM message_restricted WHERE message_id = $1",
                "DELETE FROM upload_ref WHERE message_id = $1",
                "DELETE FROM message WHERE id = $1",
            ] {
                sqlx::query(sql).bind(id.to_string()).execute(crate::counted(&mut *tx.tx)).await?;
            }
            if let Some(p) = &m.parent_id {
                sqlx::query("UPDATE message SET reply_count = reply_count - 1 WHERE id = $1 AND reply_count > 0")
                    .bind(p.clone())
                    .execute(crate::counted(&mut *tx.tx))
                    .await?;
            }
        } else if !was_deleted {
            sqlx::query("UPDATE message SET deleted_at = $1, updated_at = $1, type = 'deleted' WHERE id = $2")
                .bind(now)
                .bind(id.to_string())
                .execute(crate::counted(&mut *tx.tx))
                .await?;
            if let Some(p) = &m.parent_id {
                sqlx::query("UPDATE message SET deleted_reply_count = deleted_reply_count + 1 WHERE id = $1")
                    .bind(p.clone())
                    .execute(crate::counted(&mut *tx.tx))
                    .await?;
            }
        }
        if !was_deleted || hard {
            m.deleted_at = Some(m.deleted_at.unwrap_or(now));
            m.kind = "deleted".into();
            m.updated_at = now;
            let mut out = vec![m];
            hydrate_messages(&mut tx.tx, &mut out, &Viewer::Server, None).await?;
            m = out.pop().expect("one message in, one out");
            let mut ev = event_for("message.deleted", &ch, actor.cloned().or_else(|| m.user.clone()));
            ev.message = Some(m.clone());
            ev.hard_delete = Some(hard);
            tx.event(ev, to_watchers_and_hooks(&ch.cid)).await?;
        }
        tx.commit(self).await?;
        Ok(m)
    }

    pub async fn add_reaction(
        &self,
        message_id: &str,
        reaction: &Reaction,
        enforce_unique: bool,
        user: &User,
    ) -> Result<(Message, Reaction)> {
        self.retrying("add_reaction", || self.add_reaction_once(message_id, reaction, enforce_unique, user)).await
    }

    async fn add_reaction_once(
        &self,
        message_id: &str,
        reaction: &Reaction,
        enforce_unique: bool,
        user: &User,
    ) -> Result<(Message, Reaction)> {
        let (mut tx, ch) = self.begin_on_message(message_id).await?;
        let user = ensure_user(&mut tx, user).await?;
        if enforce_unique {
            sqlx::query("DELETE FROM reaction WHERE message_id = $1 AND user_id = $2")
                .bind(message_id.to_string())
                .bind(user.id.clone())
                .execute(crate::counted(&mut *tx.tx))
                .await?;
        }
        let now = time::now();
        sqlx::query("INSERT INTO reaction (message_id, user_id, type, score, custom, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $6) ON CONFLICT (message_id, user_id, type) DO UPDATE SET score = $4, custom = $5, updated_at = $6")
            .bind(message_id.to_string())
            .bind(user.id.clone())
            .bind(reaction.kind.clone())
            .bind(reaction.score)
            .bind(serde_json::to_string(&reaction.custom)?)
            .bind(now)
            .execute(crate::counted(&mut *tx.tx))
            .await?;
        let (m, r) = self.reaction_event(&mut tx, &ch, message_id, &user, &reaction.kind, "reaction.new", None).await?;
        tx.commit(self).await?;
        Ok((m, r))
    }

    pub async fn remove_reaction(&self, message_id: &str, kind: &str, user: &User) -> Result<(Message, Reaction)> {
        self.retrying("remove_reaction", || self.remove_reaction_once(message_id, kind, user)).await
    }

    async fn remove_reaction_once(&self, message_id: &str, kind: &str, user: &User) -> Result<(Message, Reaction)> {
        let (mut tx, ch) = self.begin_on_message(message_id).await?;
        let Some(removed) = load_reaction(&mut tx.tx, message_id, &user.id, kind).await? else {
            return not_found(format!("reaction {kind:?} of user {:?} on message {message_id:?} does not exist", user.id));
        };
        sqlx::query("DELETE FROM reaction WHERE message_id = $1 AND user_id = $2 AND type = $3")
            .bind(message_id.to_string())
            .bind(user.id.clone())
            .bind(kind.to_string())
            .execute(crate::counted(&mut *tx.tx))
            .await?;
        // The event (and the answer) carry the message as it is without the reaction.
        let (m, r) = self.reaction_event(&mut tx, &ch, message_id, user, kind, "reaction.deleted", Some(removed)).await?;
        tx.commit(self).await?;
        Ok((m, r))
    }

    /// Opens a reaction write: a transaction holding the lock of the message's channel (crate
    /// doc, lock order), and that channel.
    async fn begin_on_message(&self, message_id: &str) -> Result<(Tx, Channel)> {
        let mut tx = self.begin().await?;
        match lock_message(&mut tx, message_id).await? {
            Some((ch, _)) => Ok((tx, ch)),
            None => not_found(format!("message with id {message_id:?} does not exist")),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn reaction_event(
        &self,
        tx: &mut Tx,
        ch: &Channel,
        message_id: &str,
        user: &User,
        kind: &str,
        event: &str,
        known: Option<Reaction>,
    ) -> Result<(Message, Reaction)> {
        let Some((mut m, _)) = load_message(&mut tx.tx, message_id).await? else {
            return not_found(format!("message with id {message_id:?} does not exist"));
        };
        let mut out = vec![m];
        hydrate_messages(&mut tx.tx, &mut out, &Viewer::Server, None).await?;
        m = out.pop().expect("one message in, one out");
        let now = time::now();
        let stored = match known {
            Some(r) => Some(r),
            None => load_reaction(&mut tx.tx, message_id, &user.id, kind).await?,
        };
        let mut r = match stored {
            Some(r) => r,
            None => Reaction {
                message_id: message_id.into(),
                user_id: user.id.clone(),
                kind: kind.into(),
                score: 1,
                created_at: now,
                updated_at: now,
                ..Default::default()
            },
        };
        r.user = Some(user.clone());
        let mut ev = event_for(event, ch, Some(user.clone()));
        ev.message = Some(m.clone());
        ev.reaction = Some(r.clone());
        tx.event(ev, to_watchers_and_hooks(&ch.cid)).await?;
        Ok((m, r))
    }

    // A channel update may post a system message, and a truncation may too: both write a
    // message, so they live with the message writes, above the channels.rs layer.
    /// Full update: replaces the custom data (and team when given), adds and removes members
    /// and posts the optional system message, all in one transaction.
    pub async fn update_channel(&self, cid: &str, update: &ChannelUpdate, actor: Option<&User>) -> Result<(Channel, Option<Message>)> {
        self.retrying("update_channel", || self.update_channel_once(cid, update, actor)).await
    }

    async fn update_channel_once(&self, cid: &str, update: &ChannelUpdate, actor: Option<&User>) -> Result<(Channel, Option<Message>)> {
        let mut tx = self.begin().await?;
        let Some(mut ch) = lock_and_load(&mut tx, cid).await? else { return not_found(format!("channel {cid:?} does not exist")) };
        if ch.deleted_at.is_some() {
            return not_found(format!("channel {cid:?} was deleted"));
        }
        if update.custom.is_some() || update.team.is_some() || update.frozen.is_some() {
            if let Some(c) = &update.custom {
                ch.custom = c.clone();
            }
            if let Some(t) = &update.team {
                ch.team = Some(t.clone());
            }
            if let Some(f) = update.frozen {
                ch.frozen = f;
            }
            write_channel_fields(&mut tx, &ch).await?;
            ch = reload(&mut tx, cid).await?;
            tx.event(event_for("channel.updated", &ch, actor.cloned()).with_channel(&ch), to_watchers_and_hooks(cid)).await?;
        }
        if !update.add_members.is_empty() {
            add_members_tx(&mut tx, &ch, &update.add_members, actor).await?;
        }
        if !update.remove_members.is_empty() {
            remove_members_tx(&mut tx, &ch, &update.remove_members, actor).await?;
        }
        let mut sys = None;
        if let Some((new, author)) = &update.message {
            let author = ensure_user(&mut tx, author).await?;
            let m = insert_new_message(&mut tx, &ch, new, &author).await?;
            let mut ev = event_for("message.new", &ch, Some(author));
            ev.message = Some(m.clone());
            tx.event(ev, to_watchers_and_hooks(cid)).await?;
            sys = Some(m);
        }
        let ch = reload(&mut tx, cid).await?;
        tx.commit(self).await?;
        let sys = match sys {
            Some(m) => Some(self.hydrated(m, ch.truncated_at).await?),
            None => None,
        };
        Ok((ch, sys))
    }

    /// Truncates a channel: hides (or, with `hard`, deletes) every message created up to
    /// `truncated_at` (default now), then adds the optional system message.
    pub async fn truncate_channel(
        &self,
        cid: &str,
        truncated_at: Option<i64>,
        hard: bool,
        actor: Option<&User>,
        message: Option<&NewMessage>,
    ) -> Result<(Channel, Option<Message>)> {
        self.retrying("truncate_channel", || self.truncate_channel_once(cid, truncated_at, hard, actor, message)).await
    }

    async fn truncate_channel_once(
        &self,
        cid: &str,
        truncated_at: Option<i64>,
        hard: bool,
        actor: Option<&User>,
        message: Option<&NewMessage>,
    ) -> Result<(Channel, Option<Message>)> {
        let mut tx = self.begin().await?;
        if lock_and_load(&mut tx, cid).await?.is_none() {
            return not_found(format!("channel {cid:?} does not exist"));
        }
        let now = time::now();
        let at = truncated_at.unwrap_or(now).min(now);
        if hard {
            for sql in [
                "DELETE FROM reaction WHERE message_id IN (SELECT id FROM message WHERE cid = $1 AND created_at <= $2)",
                "DELETE FROM message_restricted WHERE message_id IN (SELECT id FROM message WHERE cid = $1 AND created_at <= $2)",
                "DELETE FROM upload_ref WHERE message_id IN (SELECT id FROM message WHERE cid = $1 AND created_at <= $2)",
                "DELETE FROM message WHERE cid = $1 AND created_at <= $2",
            ] {
                sqlx::query(sql).bind(cid.to_string()).bind(at).execute(crate::counted(&mut *tx.tx)).await?;
            }
        }
        sqlx::query("UPDATE channel SET truncated_at = $1, truncated_by_id = $2, updated_at = $3 WHERE cid = $4")
            .bind(at)
            .bind(actor.map(|u| u.id.clone()))
            .bind(now)
            .bind(cid.to_string())
            .execute(crate::counted(&mut *tx.tx))
            .await?;
        crate::unread::recount(&mut tx, cid, None).await?;
        let ch = reload(&mut tx, cid).await?;
        let mut sys = None;
        if let Some(new) = message {
            let mut new = new.clone();
            new.kind = "system".into();
            new.created_at = Some(now.max(at) + 1_000);
            let author = match actor {
                Some(a) => ensure_user(&mut tx, a).await?,
                None => ensure_user(&mut tx, &User::placeholder(&new.user_id, "user")).await?,
            };
            sys = Some(insert_new_message(&mut tx, &ch, &new, &author).await?);
        }
        let mut ev = event_for("channel.truncated", &ch, actor.cloned());
        ev.channel = Some(ch.clone());
        ev.message = sys.clone();
        tx.event(ev, to_watchers_and_hooks(cid)).await?;
        tx.commit(self).await?;
        Ok((ch, sys))
    }

    /// Rewind: hides every message created after `message_id` (and it too when `inclusive`),
    /// top-level and replies, from every read.
    pub async fn rewind_channel(
        &self,
        cid: &str,
        message_id: &str,
        expected_last: &str,
        inclusive: bool,
        actor: Option<&User>,
    ) -> Result<Channel> {
        self.retrying("rewind_channel", || self.rewind_channel_once(cid, message_id, expected_last, inclusive, actor)).await
    }

    async fn rewind_channel_once(
        &self,
        cid: &str,
        message_id: &str,
        expected_last: &str,
        inclusive: bool,
        actor: Option<&User>,
    ) -> Result<Channel> {
        let mut tx = self.begin().await?;
        let Some(ch) = lock_and_load(&mut tx, cid).await? else { return not_found(format!("channel {cid:?} does not exist")) };
        if ch.deleted_at.is_some() {
            return not_found(format!("channel {cid:?} was deleted"));
        }
        if let Some(f) = &ch.fork {
            if f.status == ForkStatus::Backfilling {
                return domain(Error::new(
                    ErrorKind::ForkInProgress,
                    format!("channel {cid:?} is a fork whose history is still being copied; rewind it once channel.forked arrives"),
                ));
            }
        }
        let point = match load_message(&mut tx.tx, message_id).await? {
            Some((m, false))
                if m.cid == cid
                    && m.parent_id.is_none()
                    && m.deleted_at.is_none()
                    && !m.shadowed
                    && ch.truncated_at.is_none_or(|t| m.created_at > t) =>
            {
                m
            }
            _ => return domain(Error::input(format!("message_id {message_id:?} is not a visible top-level message of channel {cid:?}"))),
        };
        let newest = newest_visible_top_level(&mut tx.tx, &ch).await?;
        if newest.as_deref() != Some(expected_last) {
            return domain(Error::new(
                ErrorKind::RewindConflict,
                format!(
                    "expected_last_message_id {expected_last:?} is not the newest visible message of the channel (it is {:?})",
                    newest.unwrap_or_default()
                ),
            ));
        }
        let now = time::now();
        let op = if inclusive { ">=" } else { ">" };
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE message SET hidden_at = $1 WHERE cid = $2 AND hidden_at IS NULL AND (created_at, id) {op} ($3, $4)"
        )))
        .bind(now)
        .bind(cid.to_string())
        .bind(point.created_at)
        .bind(point.id.clone())
        .execute(crate::counted(&mut *tx.tx))
        .await?;
        // Replies created after the rewind point, and replies of hidden parents.
        sqlx::query("UPDATE message SET hidden_at = $1 WHERE cid = $2 AND hidden_at IS NULL AND parent_id IN (SELECT id FROM message WHERE cid = $2 AND hidden_at = $1)")
            .bind(now)
            .bind(cid.to_string())
            .execute(crate::counted(&mut *tx.tx))
            .await?;
        sqlx::query("UPDATE message SET reply_count = (SELECT COUNT(*) FROM message r WHERE r.parent_id = message.id AND r.hidden_at IS NULL) WHERE cid = $1 AND reply_count > 0")
            .bind(cid.to_string())
            .execute(crate::counted(&mut *tx.tx))
            .await?;
        sqlx::query("UPDATE channel SET updated_at = $1 WHERE cid = $2")
            .bind(now)
            .bind(cid.to_string())
            .execute(crate::counted(&mut *tx.tx))
            .await?;
        crate::unread::recount(&mut tx, cid, None).await?;
        let ch = reload(&mut tx, cid).await?;
        let mut ev = event_for("channel.rewound", &ch, actor.cloned());
        ev.channel = Some(ch.clone());
        ev.extra.insert("message_id".into(), message_id.into());
        ev.extra.insert("inclusive".into(), inclusive.into());
        tx.event(ev, to_watchers_and_hooks(cid)).await?;
        tx.commit(self).await?;
        Ok(ch)
    }

    /// Threads (parents with replies) in channels `user` is a member of, or in `cids`.
    pub async fn query_threads(
        &self,
        viewer: &Viewer,
        cids: Option<&[String]>,
        limit: i64,
        reply_limit: i64,
    ) -> Result<Vec<(Message, Vec<Message>, Channel)>> {
        let mut conn = self.pool().acquire().await?;
        let mut binds: Vec<Bind> = Vec::new();
        let mut sql = format!("SELECT {MESSAGE_COLS} FROM message m JOIN channel c ON c.cid = m.cid WHERE m.parent_id IS NULL AND m.reply_count > 0 AND m.hidden_at IS NULL AND c.deleted_at IS NULL AND (c.truncated_at IS NULL OR m.created_at > c.truncated_at)");
        if let Some(cids) = cids {
            if cids.is_empty() {
                return Ok(Vec::new());
            }
            sql.push_str(&format!(" AND m.cid IN ({})", placeholders(binds.len() + 1, cids.len())));
            binds.extend(cids.iter().map(|c| Bind::S(c.clone())));
        }
        if let Some(uid) = viewer.user_id() {
            if !viewer.is_admin() {
                binds.push(Bind::S(uid.to_string()));
                sql.push_str(&format!(" AND EXISTS (SELECT 1 FROM member mm WHERE mm.cid = m.cid AND mm.user_id = ${})", binds.len()));
            }
        }
        sql.push_str(&format!(" ORDER BY m.created_at DESC, m.id DESC LIMIT {}", limit.clamp(1, 100)));
        let rows: Vec<MessageRow> =
            sqlx::query_as_with(AssertSqlSafe(sql), arguments(&binds)?).fetch_all(crate::counted(&mut *conn)).await?;
        // The parents' channels, their replies and everything both show, each in a fixed number
        // of statements whatever the number of threads.
        let parents: Vec<Message> = rows::all(rows);
        let cids: Vec<String> = parents.iter().map(|p| p.cid.clone()).collect::<HashSet<_>>().into_iter().collect();
        let channels = load_channels(&mut conn, &self.cache, &cids).await?;
        let truncated_at = |cid: &str| channels.get(cid).and_then(|c| c.truncated_at);
        let mut parents: Vec<Message> =
            parents.into_iter().filter(|p| channels.contains_key(&p.cid) && is_visible(p, false, truncated_at(&p.cid), viewer)).collect();
        let mut binds = Vec::new();
        let mut conditions = Vec::with_capacity(parents.len());
        for p in &parents {
            binds.push(Bind::S(p.id.clone()));
            let at = binds.len();
            let vis = visible_to(viewer, truncated_at(&p.cid), &mut binds);
            conditions.push((p.id.clone(), format!("m.parent_id = ${at} AND {vis}")));
        }
        let mut replies =
            latest_pages(&mut conn, &conditions, &binds, reply_limit.clamp(0, 100), |m| m.parent_id.clone().unwrap_or_default()).await?;
        // Every parent and reply hydrated at once, then each thread given its part.
        let mut all: Vec<Message> = Vec::new();
        let mut lengths = Vec::with_capacity(parents.len());
        for p in &parents {
            let page = replies.remove(&p.id).unwrap_or_default();
            lengths.push(page.len());
            all.extend(page);
        }
        hydrate_messages_of(&mut conn, &mut parents, viewer, &truncated_at).await?;
        hydrate_messages_of(&mut conn, &mut all, viewer, &truncated_at).await?;
        let mut all = all.into_iter();
        Ok(parents
            .into_iter()
            .zip(lengths)
            .map(|(p, n)| {
                let ch = channels[&p.cid].clone();
                (p, all.by_ref().take(n).collect(), ch)
            })
            .collect())
    }
}

/// Locks the channel of message `id` (then reads the message under that lock): the lock order
/// for message writes is the channel row first (crate doc). The channel is found through the
/// message and locked in one statement (a message never changes channel), and comes without
/// its creator or type, which no message write reads. `None` when the message
/// does not exist or a rewind hid it.
pub(crate) async fn lock_message(tx: &mut Tx, id: &str) -> Result<Option<(Channel, Message)>> {
    let Some(ch) = crate::channels::lock_channel_row(tx, "c.cid = (SELECT m.cid FROM message m WHERE m.id = $1)", id).await? else {
        return Ok(None);
    };
    match load_message(&mut tx.tx, id).await? {
        Some((m, false)) if m.cid == ch.cid => Ok(Some((ch, m))),
        _ => Ok(None),
    }
}

/// Who changes a message, as its `message.updated` event names them.
#[derive(Debug, Clone)]
pub enum Editor {
    /// This user.
    User(User),
    /// The stored user with this id (a server-side request naming them), or a placeholder
    /// when there is none.
    Named(String),
    /// The message's author (a server-side request naming nobody).
    Author,
}

impl Editor {
    /// The id of who changes `m` (who pins it, when the change pins it).
    pub fn id_for<'a>(&'a self, m: &'a Message) -> &'a str {
        match self {
            Editor::User(u) => &u.id,
            Editor::Named(id) => id,
            Editor::Author => &m.user_id,
        }
    }

    /// The user `m`, hydrated, was changed by; `named` holds the named editors other than
    /// its author ([`named_editors`]).
    fn user(&self, m: &Message, named: &HashMap<String, User>) -> User {
        let author = || m.user.clone().unwrap_or_else(|| User::placeholder(&m.user_id, "user"));
        match self {
            Editor::User(u) => u.clone(),
            Editor::Named(id) if *id == m.user_id => author(),
            Editor::Named(id) => named.get(id).cloned().unwrap_or_else(|| User::placeholder(id, "user")),
            Editor::Author => author(),
        }
    }
}

/// The stored users that editors name who are not the authors of the (hydrated) messages they
/// changed: one statement, none when every editor is known or the author.
async fn named_editors<'a>(
    conn: &mut AnyConnection,
    changes: impl IntoIterator<Item = (&'a Editor, &'a Message)>,
) -> Result<HashMap<String, User>> {
    let mut ids: Vec<String> = changes
        .into_iter()
        .filter_map(|(e, m)| match e {
            Editor::Named(id) if *id != m.user_id => Some(id.clone()),
            _ => None,
        })
        .collect();
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    ids.sort();
    ids.dedup();
    load_users(conn, &ids).await
}

/// Whether a message (not hidden) of the locked `ch` may be changed: its channel is not
/// deleted and it is not before the channel's truncation.
fn writable(ch: &Channel, m: &Message) -> bool {
    ch.deleted_at.is_none() && is_visible(m, false, ch.truncated_at, &Viewer::Server)
}

/// `before` with `change` applied and stamped as updated now; nothing is written.
fn changed(before: &Message, ch: &Channel, change: &ChangeFn) -> Result<Message> {
    let mut m = before.clone();
    change(&mut m, ch)?;
    let now = time::now();
    m.updated_at = now;
    if m.text != before.text {
        m.message_text_updated_at = Some(now);
    }
    Ok(m)
}

/// Writes `m`, an update of the stored `before`, in `ch`'s locked transaction: the row, and
/// when its visibility changed, its restricted readers and the channel's unread counters.
async fn write_update(tx: &mut Tx, ch: &Channel, before: &Message, m: &Message) -> Result<()> {
    write_rows(tx, &[m]).await?;
    if moves_visibility(before, m) {
        if m.restricted_visibility != before.restricted_visibility {
            sqlx::query("DELETE FROM message_restricted WHERE message_id = $1")
                .bind(m.id.clone())
                .execute(crate::counted(&mut *tx.tx))
                .await?;
            insert_restricted(tx.backend, &mut tx.tx, std::slice::from_ref(m)).await?;
        }
        crate::unread::recount(tx, &ch.cid, None).await?;
    }
    Ok(())
}

/// Whether an update changes who sees the message (its readers, or whether it is in the
/// channel's list): more than its row is written.
fn moves_visibility(before: &Message, m: &Message) -> bool {
    m.restricted_visibility != before.restricted_visibility || m.show_in_channel != before.show_in_channel
}

/// The columns an update writes, in the order [`write_rows`] binds them, the id first.
const UPDATED_COLS: [&str; 18] = [
    "id",
    "text",
    "html",
    "mml",
    "attachments",
    "mentioned_users",
    "silent",
    "i18n",
    "custom",
    "pinned",
    "pinned_at",
    "pinned_by_id",
    "pin_expires",
    "updated_at",
    "message_text_updated_at",
    "restricted_visibility",
    "show_in_channel",
    "command",
];

/// [`write_rows`] for one message: a plain `UPDATE … WHERE id = $1`, built once.
static ONE_ROW: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let set: Vec<String> = UPDATED_COLS[1..].iter().enumerate().map(|(i, c)| format!("{c} = ${}", i + 2)).collect();
    format!("UPDATE message SET {} WHERE id = $1", set.join(", "))
});

/// Rows of a statement of [`write_rows`]: 18 parameters each, far below either engine's limit.
const ROWS_PER_UPDATE: usize = 100;

/// Writes the updated rows of messages (distinct ids), up to [`ROWS_PER_UPDATE`] in one
/// statement: one message is a plain `UPDATE … WHERE id`, several are an `UPDATE … FROM` a
/// list of values (both engines).
async fn write_rows(tx: &mut Tx, msgs: &[&Message]) -> Result<()> {
    crate::files::refer(tx, msgs.iter().copied()).await?;
    let n = UPDATED_COLS.len();
    for chunk in msgs.chunks(ROWS_PER_UPDATE) {
        let sql = match chunk {
            [_] => ONE_ROW.clone(),
            _ => {
                let values = rows::value_rows(tx.backend, 1, chunk.len(), n);
                let set: Vec<String> = UPDATED_COLS[1..].iter().map(|c| format!("{c} = v.{c}")).collect();
                format!(
                    "WITH v ({}) AS (VALUES {values}) UPDATE message SET {} FROM v WHERE message.id = v.id",
                    UPDATED_COLS.join(", "),
                    set.join(", ")
                )
            }
        };
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for m in chunk {
            q = q
                .bind(m.id.clone())
                .bind(m.text.clone())
                .bind(m.html.clone())
                .bind(m.mml.clone())
                .bind(serde_json::to_string(&m.attachments)?)
                .bind(serde_json::to_string(&m.mentioned_users)?)
                .bind(m.silent)
                .bind(m.i18n.as_ref().map(serde_json::to_string).transpose()?)
                .bind(serde_json::to_string(&m.custom)?)
                .bind(m.pinned)
                .bind(m.pinned_at)
                .bind(m.pinned_by_id.clone())
                .bind(m.pin_expires)
                .bind(m.updated_at)
                .bind(m.message_text_updated_at)
                .bind(serde_json::to_string(&m.restricted_visibility)?)
                .bind(m.show_in_channel)
                .bind(m.command.clone());
        }
        q.execute(crate::counted(&mut *tx.tx)).await?;
    }
    Ok(())
}

/// Messages by id (those that exist), each with whether a rewind hid it.
pub(crate) async fn load_messages(conn: &mut AnyConnection, ids: &[String]) -> Result<Vec<(Message, bool)>> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(500) {
        let sql = format!("SELECT {MESSAGE_COLS} FROM message m WHERE m.id IN ({})", placeholders(1, chunk.len()));
        let mut q = sqlx::query_as::<_, MessageRow>(AssertSqlSafe(sql));
        for id in chunk {
            q = q.bind(id.clone());
        }
        out.extend(q.fetch_all(crate::counted(&mut *conn)).await?.into_iter().map(MessageRow::with_hidden));
    }
    Ok(out)
}

pub(crate) async fn newest_visible_top_level(conn: &mut AnyConnection, ch: &Channel) -> Result<Option<String>> {
    Ok(sqlx::query_scalar("SELECT m.id FROM message m WHERE m.cid = $1 AND m.parent_id IS NULL AND m.hidden_at IS NULL AND m.deleted_at IS NULL AND m.shadowed = FALSE AND m.created_at > $2 ORDER BY m.created_at DESC, m.id DESC LIMIT 1")
        .bind(ch.cid.clone())
        .bind(ch.truncated_at.unwrap_or(i64::MIN))
        .fetch_optional(crate::counted(&mut *conn))
        .await?)
}

/// A send, in `tx`. What the channel lock serialises is kept to one statement per
/// step: the channel's update locks and reads it with its watcher count, the next statement
/// reads its fork summary, creator and the author, the message row's insert also checks
/// that its id is free, one update counts it unread for every member it is unread for, one
/// read gives every recipient's totals, and the events go to the outbox with its lock in one
/// statement.
async fn send_in(tx: &mut Tx, cid: &str, new: &NewMessage, author: &User) -> Result<(Message, Option<i64>)> {
    let now = time::now();
    let created_at = new.created_at.unwrap_or(now);
    let Some((ch, stored, watchers)) = lock_for_new_message(tx, cid, created_at, now, &author.id).await? else {
        return not_found(format!("channel {cid:?} does not exist"));
    };
    if ch.deleted_at.is_some() {
        return not_found(format!("channel {cid:?} was deleted"));
    }
    let author = match stored {
        Some(stored) => stored,
        None => ensure_user(tx, author).await?,
    };
    let m = write_new_message(tx, &ch, new, &author, now).await?;
    let unread = crate::unread::counts_of_members(&mut tx.tx, cid).await?;
    queue_message_new(tx, &ch, &m, Some(author), watchers, unread).await?;
    Ok((m, ch.truncated_at))
}

/// Queues a new message's `message.new` for its channel's watchers and webhooks, with the
/// channel's `watcher_count` (of every process's watches), and with it, in the same outbox row,
/// the `notification.message_new` (with the channel) that members who do not watch the channel
/// hear instead, as Stream sends it. Every member hears their counters `unread` with it.
pub(crate) async fn queue_message_new(
    tx: &mut Tx,
    ch: &Channel,
    m: &Message,
    author: Option<User>,
    watchers: i64,
    unread: BTreeMap<String, UnreadCounts>,
) -> Result<()> {
    let mut ev = event_for("message.new", ch, author);
    ev.message = Some(m.clone());
    ev.extra.insert("watcher_count".into(), watchers.into());
    let note = Note { kind: "notification.message_new".into(), users: unread.keys().cloned().collect(), channel: ch.clone() };
    tx.event_noted(ev, Audience { unread, ..to_watchers_and_hooks(&ch.cid) }, note).await
}

pub(crate) async fn insert_new_message(tx: &mut Tx, ch: &Channel, new: &NewMessage, author: &User) -> Result<Message> {
    let now = time::now();
    let m = write_new_message(tx, ch, new, author, now).await?;
    sqlx::query(AssertSqlSafe(format!("UPDATE channel SET {BUMP_CHANNEL} WHERE cid = $3")))
        .bind(m.created_at)
        .bind(now)
        .bind(ch.cid.clone())
        .execute(crate::counted(&mut *tx.tx))
        .await?;
    Ok(m)
}

/// Checks and writes a new message of `ch` (locked) with its unread counts and its parent's
/// reply count; the caller records it on the channel row ([`BUMP_CHANNEL`]).
async fn write_new_message(tx: &mut Tx, ch: &Channel, new: &NewMessage, author: &User, now: i64) -> Result<Message> {
    ch.check_text(&new.text)?;
    let id = if new.id.is_empty() { ids::new_id() } else { new.id.clone() };
    check_reserved(ch, &id)?;
    let parent = match &new.parent_id {
        Some(pid) => load_message(&mut tx.tx, pid).await?,
        None => None,
    };
    check_parent(ch, new, parent.as_ref())?;
    let quoted = match &new.quoted_message_id {
        Some(qid) => load_message(&mut tx.tx, qid).await?,
        None => None,
    };
    check_quote(ch, new, quoted.as_ref())?;
    let m = new_row(ch, new, author, id, now);
    // The insert is the check that the id is free: no read of the id first.
    if !insert_message_rows_with(tx, std::slice::from_ref(&m), " ON CONFLICT (id) DO NOTHING").await? {
        return domain(id_taken(&m.id));
    }
    crate::unread::count_new_message(tx, &m, ch.truncated_at).await?;
    if let Some(pid) = &m.parent_id {
        sqlx::query("UPDATE message SET reply_count = reply_count + 1 WHERE id = $1")
            .bind(pid.clone())
            .execute(crate::counted(&mut *tx.tx))
            .await?;
    }
    Ok(m)
}

/// A new message's id may not take the form of a fork's copy ids while that fork is copying.
pub(crate) fn check_reserved(ch: &Channel, id: &str) -> Result<()> {
    if let Some(f) = &ch.fork {
        if f.status == ForkStatus::Backfilling && ids::is_v5_uuid(id) {
            return domain(
                Error::new(ErrorKind::ForkMessageIdReserved, format!("message id {id:?} is a version 5 UUID, the form of the copy ids of fork {:?} which is still copying; use another id form or send it after channel.forked", ch.cid)),
            );
        }
    }
    Ok(())
}

/// A reply's parent (`parent`, as stored, hidden or not) is a top-level message of `ch`.
pub(crate) fn check_parent(ch: &Channel, new: &NewMessage, parent: Option<&(Message, bool)>) -> Result<()> {
    let Some(pid) = &new.parent_id else { return Ok(()) };
    match parent {
        Some((p, false)) if p.cid == ch.cid => {
            if p.parent_id.is_some() {
                return domain(Error::new(
                    ErrorKind::MultipleNesting,
                    format!("message {pid:?} is a reply; replies to replies are not allowed"),
                ));
            }
            Ok(())
        }
        _ => domain(Error::input(format!("parent message {pid:?} does not exist in channel {:?}", ch.cid))),
    }
}

/// A quoted message (`quoted`, as stored) is a visible message of `ch`.
pub(crate) fn check_quote(ch: &Channel, new: &NewMessage, quoted: Option<&(Message, bool)>) -> Result<()> {
    let Some(qid) = &new.quoted_message_id else { return Ok(()) };
    match quoted {
        Some((q, false)) if q.cid == ch.cid => Ok(()),
        _ => domain(Error::input(format!("quoted message {qid:?} does not exist in channel {:?}", ch.cid))),
    }
}

/// The refusal of a new message whose id is taken.
pub(crate) fn id_taken(id: &str) -> Error {
    Error::input(format!("a message with id {id:?} already exists"))
}

/// The row of a new message `id` of `ch` by `author`, checked already.
pub(crate) fn new_row(ch: &Channel, new: &NewMessage, author: &User, id: String, now: i64) -> Message {
    let kind = if new.parent_id.is_some() && new.kind == "regular" { "reply".to_string() } else { new.kind.clone() };
    let created_at = new.created_at.unwrap_or(now);
    Message {
        id,
        cid: ch.cid.clone(),
        user_id: author.id.clone(),
        user: Some(author.clone()),
        kind,
        text: new.text.clone(),
        html: new.html.clone(),
        mml: new.mml.clone(),
        command: new.command.clone(),
        parent_id: new.parent_id.clone(),
        show_in_channel: new.show_in_channel,
        quoted_message_id: new.quoted_message_id.clone(),
        attachments: new.attachments.clone(),
        mentioned_users: new.mentioned_users.clone(),
        restricted_visibility: new.restricted_visibility.clone(),
        silent: new.silent,
        i18n: new.i18n.clone(),
        custom: new.custom.clone(),
        shadowed: author.shadow_banned,
        pinned: new.pinned,
        pinned_at: new.pinned.then_some(now),
        pinned_by_id: new.pinned.then(|| author.id.clone()),
        pin_expires: new.pin_expires,
        created_at,
        updated_at: created_at.max(now),
        ..Default::default()
    }
}

const MESSAGE_INSERT_COLS: &str = "id, cid, user_id, type, text, html, mml, command, parent_id, show_in_channel, quoted_message_id, attachments, mentioned_users, restricted_visibility, silent, i18n, custom, shadowed, pinned, pinned_at, pinned_by_id, pin_expires, reply_count, deleted_reply_count, created_at, updated_at, deleted_at, message_text_updated_at, source_cid, source_message_id";
const MESSAGE_INSERT_N: usize = 30;

/// Inserts messages with multi-row statements (100 rows each): one round trip per 100 rows,
/// with `conflict` (an `ON CONFLICT` clause, or nothing) after each statement's `VALUES`. True
/// when every row was written.
async fn insert_message_rows_with(tx: &mut Tx, msgs: &[Message], conflict: &str) -> Result<bool> {
    let mut written = 0;
    for chunk in msgs.chunks(100) {
        written += insert_query(tx.backend, chunk, conflict)?.execute(crate::counted(&mut *tx.tx)).await?.rows_affected();
    }
    if written < msgs.len() as u64 {
        return Ok(false);
    }
    insert_restricted(tx.backend, &mut tx.tx, msgs).await?;
    crate::files::refer(tx, msgs).await?;
    Ok(true)
}

/// Inserts new messages whose ids may be taken, each row only where its id is free: the ids
/// written (and their restricted-visibility rows).
pub(crate) async fn insert_new_rows(tx: &mut Tx, msgs: &[Message]) -> Result<HashSet<String>> {
    let mut written = HashSet::new();
    for chunk in msgs.chunks(100) {
        let q = insert_query(tx.backend, chunk, " ON CONFLICT (id) DO NOTHING RETURNING id")?;
        for row in q.fetch_all(crate::counted(&mut *tx.tx)).await? {
            written.insert(sqlx::Row::try_get::<String, _>(&row, 0)?);
        }
    }
    let kept: Vec<Message> = msgs.iter().filter(|m| written.contains(&m.id) && !m.restricted_visibility.is_empty()).cloned().collect();
    insert_restricted(tx.backend, &mut tx.tx, &kept).await?;
    crate::files::refer(tx, msgs.iter().filter(|m| written.contains(&m.id))).await?;
    Ok(written)
}

/// The insert of `chunk` (at most 100 rows), with `tail` after its `VALUES`.
fn insert_query(backend: Backend, chunk: &[Message], tail: &str) -> Result<sqlx::query::Query<'static, sqlx::Any, AnyArguments>> {
    let values = rows::value_rows(backend, 1, chunk.len(), MESSAGE_INSERT_N);
    let sql = format!("INSERT INTO message ({MESSAGE_INSERT_COLS}) VALUES {values}{tail}");
    let mut q = sqlx::query(AssertSqlSafe(sql));
    for m in chunk {
        q = q
            .bind(m.id.clone())
            .bind(m.cid.clone())
            .bind(m.user_id.clone())
            .bind(m.kind.clone())
            .bind(m.text.clone())
            .bind(m.html.clone())
            .bind(m.mml.clone())
            .bind(m.command.clone())
            .bind(m.parent_id.clone())
            .bind(m.show_in_channel)
            .bind(m.quoted_message_id.clone())
            .bind(serde_json::to_string(&m.attachments)?)
            .bind(serde_json::to_string(&m.mentioned_users)?)
            .bind(serde_json::to_string(&m.restricted_visibility)?)
            .bind(m.silent)
            .bind(m.i18n.as_ref().map(serde_json::to_string).transpose()?)
            .bind(serde_json::to_string(&m.custom)?)
            .bind(m.shadowed)
            .bind(m.pinned)
            .bind(m.pinned_at)
            .bind(m.pinned_by_id.clone())
            .bind(m.pin_expires)
            .bind(m.reply_count)
            .bind(m.deleted_reply_count)
            .bind(m.created_at)
            .bind(m.updated_at)
            .bind(m.deleted_at)
            .bind(m.message_text_updated_at)
            .bind(m.source_cid.clone())
            .bind(m.source_message_id.clone());
    }
    Ok(q)
}

/// The (message, user) rows of restricted visibility, the exact form every read matches on.
pub(crate) async fn insert_restricted(backend: crate::Backend, conn: &mut AnyConnection, msgs: &[Message]) -> Result<()> {
    let pairs: Vec<(&str, &str, i64)> =
        msgs.iter().flat_map(|m| m.restricted_visibility.iter().map(move |u| (m.id.as_str(), u.as_str(), m.created_at))).collect();
    for chunk in pairs.chunks(300) {
        let values = rows::value_rows(backend, 1, chunk.len(), 4);
        let sql =
            format!("INSERT INTO message_restricted (message_id, user_id, created_at, updated_at) VALUES {values} ON CONFLICT DO NOTHING");
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for (mid, uid, at) in chunk {
            q = q.bind(mid.to_string()).bind(uid.to_string()).bind(*at).bind(*at);
        }
        q.execute(crate::counted(&mut *conn)).await?;
    }
    Ok(())
}

/// A stored message and whether a rewind hid it.
pub(crate) async fn load_message(conn: &mut AnyConnection, id: &str) -> Result<Option<(Message, bool)>> {
    let row: Option<MessageRow> = sqlx::query_as(AssertSqlSafe(format!("SELECT {MESSAGE_COLS} FROM message m WHERE m.id = $1")))
        .bind(id.to_string())
        .fetch_optional(crate::counted(&mut *conn))
        .await?;
    Ok(row.map(MessageRow::with_hidden))
}

/// One user's reaction of one type on a message.
async fn load_reaction(conn: &mut AnyConnection, message_id: &str, user_id: &str, kind: &str) -> Result<Option<Reaction>> {
    let row: Option<ReactionRow> =
        sqlx::query_as(AssertSqlSafe(format!("SELECT {REACTION_COLS} FROM reaction WHERE message_id = $1 AND user_id = $2 AND type = $3")))
            .bind(message_id.to_string())
            .bind(user_id.to_string())
            .bind(kind.to_string())
            .fetch_optional(crate::counted(&mut *conn))
            .await?;
    Ok(row.map(Reaction::from))
}

async fn paginate(conn: &mut AnyConnection, base: &str, mut binds: Vec<Bind>, page: &Page, scope: &str) -> Result<Vec<Message>> {
    let limit = page.limit.clamp(0, 300);
    // The reference message must be in the same scope (channel or thread); `scope` only
    // references $1.
    let anchor = match &page.dir {
        PageDir::Latest => None,
        PageDir::Before { id, .. } | PageDir::After { id, .. } | PageDir::Around { id } => {
            let row: Option<(i64, String)> =
                sqlx::query_as(AssertSqlSafe(format!("SELECT m.created_at, m.id FROM message m WHERE m.id = $2 AND {scope}")))
                    .bind(binds[0].clone_str())
                    .bind(id.clone())
                    .fetch_optional(crate::counted(&mut *conn))
                    .await?;
            match row {
                Some(position) => Some(position),
                None => return Ok(Vec::new()),
            }
        }
    };
    match (&page.dir, anchor) {
        (PageDir::Latest, _) | (_, None) => run_page(conn, base, String::new(), true, limit, binds).await,
        (PageDir::Before { inclusive, .. }, Some((ts, id))) => {
            binds.push(Bind::I(ts));
            binds.push(Bind::S(id));
            let op = if *inclusive { "<=" } else { "<" };
            let cond = format!(" AND (m.created_at, m.id) {op} (${}, ${})", binds.len() - 1, binds.len());
            run_page(conn, base, cond, true, limit, binds).await
        }
        (PageDir::After { inclusive, .. }, Some((ts, id))) => {
            binds.push(Bind::I(ts));
            binds.push(Bind::S(id));
            let op = if *inclusive { ">=" } else { ">" };
            let cond = format!(" AND (m.created_at, m.id) {op} (${}, ${})", binds.len() - 1, binds.len());
            run_page(conn, base, cond, false, limit, binds).await
        }
        (PageDir::Around { .. }, Some((ts, id))) => {
            let mut b = binds.clone();
            b.push(Bind::I(ts));
            b.push(Bind::S(id.clone()));
            let cond = format!(" AND (m.created_at, m.id) <= (${}, ${})", b.len() - 1, b.len());
            let before_n = (limit + 1) / 2;
            let mut before = run_page(conn, base, cond, true, before_n, b).await?;
            binds.push(Bind::I(ts));
            binds.push(Bind::S(id));
            let cond = format!(" AND (m.created_at, m.id) > (${}, ${})", binds.len() - 1, binds.len());
            let after = run_page(conn, base, cond, false, limit - before.len() as i64, binds).await?;
            before.extend(after);
            Ok(before)
        }
    }
}

/// The page of messages matching `cond`, newest (`desc`) or oldest first.
pub(crate) fn page_sql(cond: &str, desc: bool, lim: i64) -> String {
    format!(
        "SELECT {MESSAGE_COLS} FROM message m WHERE {cond} ORDER BY m.created_at {d}, m.id {d} LIMIT {lim}",
        d = if desc { "DESC" } else { "ASC" }
    )
}

/// The newest `lim` messages of each `(key, condition)` (conditions number their binds in
/// `binds`), oldest first, in one statement per 100 conditions.
pub(crate) async fn latest_pages(
    conn: &mut AnyConnection,
    conditions: &[(String, String)],
    binds: &[Bind],
    lim: i64,
    key_of: impl Fn(&Message) -> String,
) -> Result<HashMap<String, Vec<Message>>> {
    let mut pages: HashMap<String, Vec<Message>> = conditions.iter().map(|(k, _)| (k.clone(), Vec::new())).collect();
    for chunk in conditions.chunks(100) {
        let sql = union_all(&chunk.iter().map(|(_, cond)| page_sql(cond, true, lim)).collect::<Vec<_>>());
        for m in rows::fetch_messages(conn, &sql, arguments(binds)?).await? {
            pages.entry(key_of(&m)).or_default().push(m);
        }
    }
    for page in pages.values_mut() {
        rows::oldest_first(page);
    }
    Ok(pages)
}

async fn run_page(conn: &mut AnyConnection, base: &str, cond: String, desc: bool, lim: i64, binds: Vec<Bind>) -> Result<Vec<Message>> {
    let sql = page_sql(&format!("{base}{cond}"), desc, lim);
    let mut msgs = rows::fetch_messages(conn, &sql, arguments(&binds)?).await?;
    rows::oldest_first(&mut msgs);
    Ok(msgs)
}

/// Fills users, reactions, thread participants and quoted messages of a page of one channel
/// truncated at `truncated_at`.
pub(crate) async fn hydrate_messages(
    conn: &mut AnyConnection,
    msgs: &mut [Message],
    viewer: &Viewer,
    truncated_at: Option<i64>,
) -> Result<()> {
    hydrate_messages_of(conn, msgs, viewer, &|_| truncated_at).await
}

/// [`hydrate_messages`] for messages of several channels, `truncated_at` giving each
/// channel's truncation by cid: a fixed number of statements, whatever the number of messages
/// and channels.
pub(crate) async fn hydrate_messages_of(
    conn: &mut AnyConnection,
    msgs: &mut [Message],
    viewer: &Viewer,
    truncated_at: &(dyn Fn(&str) -> Option<i64> + Sync),
) -> Result<()> {
    if msgs.is_empty() {
        return Ok(());
    }
    // Each id once: a message can be on a page and among the pins, and a lookup per value
    // (`rows_with_one_of`) would read its reactions twice.
    let mut ids: Vec<String> = msgs.iter().map(|m| m.id.clone()).collect();
    ids.sort();
    ids.dedup();
    let quoted = visible_quotes(conn, msgs, viewer, truncated_at).await?;
    let reactions = reactions_of(conn, &ids).await?;
    let participants = thread_participants(conn, msgs).await?;
    let users = load_users(conn, &users_named(msgs, &quoted, &reactions, &participants)).await?;
    let user_of = |id: &str| users.get(id).cloned().unwrap_or_else(|| User::placeholder(id, "user"));
    let own = viewer.user_id();
    for m in msgs.iter_mut() {
        m.user = Some(user_of(&m.user_id));
        m.mentioned_user_objects = m.mentioned_users.iter().map(|u| user_of(u)).collect();
        if let Some(qid) = &m.quoted_message_id {
            m.quoted_message = quoted.get(qid).cloned().map(|mut q| {
                q.user = Some(user_of(&q.user_id));
                Box::new(q)
            });
        }
        fill_reactions(m, reactions.get(&m.id).map(Vec::as_slice).unwrap_or_default(), own, &user_of);
        m.thread_participants = participants.get(&m.id).map(|ps| ps.iter().map(|p| user_of(p)).collect()).unwrap_or_default();
    }
    Ok(())
}

/// The messages `msgs` quote (one level), by id: those deleted or not visible to `viewer` left
/// out.
async fn visible_quotes(
    conn: &mut AnyConnection,
    msgs: &[Message],
    viewer: &Viewer,
    truncated_at: &(dyn Fn(&str) -> Option<i64> + Sync),
) -> Result<HashMap<String, Message>> {
    let mut quoted_ids: Vec<String> = msgs.iter().filter_map(|m| m.quoted_message_id.clone()).collect();
    quoted_ids.sort();
    quoted_ids.dedup();
    let mut quoted: HashMap<String, Message> = HashMap::new();
    for (m, hidden) in load_messages(conn, &quoted_ids).await? {
        if m.deleted_at.is_none() && is_visible(&m, hidden, truncated_at(&m.cid), viewer) {
            quoted.insert(m.id.clone(), m);
        }
    }
    Ok(quoted)
}

/// The reactions of the messages `ids` (each once), newest first, by message id.
async fn reactions_of(conn: &mut AnyConnection, ids: &[String]) -> Result<HashMap<String, Vec<Reaction>>> {
    let backend = rows::backend_of(conn);
    let mut reactions: HashMap<String, Vec<Reaction>> = HashMap::new();
    for chunk in ids.chunks(300) {
        let select = rows::rows_with_one_of(backend, &format!("SELECT {REACTION_COLS} FROM reaction WHERE"), "message_id", chunk.len());
        let sql = format!("SELECT {REACTION_COLS} FROM ({select}) AS r ORDER BY created_at DESC");
        let mut q = sqlx::query_as::<_, ReactionRow>(AssertSqlSafe(sql));
        for id in chunk {
            q = q.bind(id.clone());
        }
        for r in q.fetch_all(crate::counted(&mut *conn)).await?.into_iter().map(Reaction::from) {
            reactions.entry(r.message_id.clone()).or_default().push(r);
        }
    }
    Ok(reactions)
}

/// The users who replied in the threads of `msgs` (those with replies), by parent id, in the
/// order of their first reply.
async fn thread_participants(conn: &mut AnyConnection, msgs: &[Message]) -> Result<HashMap<String, Vec<String>>> {
    let backend = rows::backend_of(conn);
    let mut parents: Vec<String> = msgs.iter().filter(|m| m.reply_count > 0).map(|m| m.id.clone()).collect();
    parents.sort();
    parents.dedup();
    let mut participants: HashMap<String, Vec<String>> = HashMap::new();
    for chunk in parents.chunks(300) {
        let select = rows::rows_with_one_of(
            backend,
            "SELECT parent_id, user_id, created_at FROM message WHERE hidden_at IS NULL AND",
            "parent_id",
            chunk.len(),
        );
        let sql = format!(
            "SELECT parent_id, user_id, MIN(created_at) AS first_at FROM ({select}) AS r GROUP BY parent_id, user_id ORDER BY first_at"
        );
        let mut q = sqlx::query_as::<_, (String, String, i64)>(AssertSqlSafe(sql));
        for id in chunk {
            q = q.bind(id.clone());
        }
        for (parent_id, user_id, _) in q.fetch_all(crate::counted(&mut *conn)).await? {
            participants.entry(parent_id).or_default().push(user_id);
        }
    }
    Ok(participants)
}

/// Every user the hydrated messages name: authors, mentions, pinners, quoted authors, reactors
/// and thread participants.
fn users_named(
    msgs: &[Message],
    quoted: &HashMap<String, Message>,
    reactions: &HashMap<String, Vec<Reaction>>,
    participants: &HashMap<String, Vec<String>>,
) -> Vec<String> {
    let mut user_ids: HashSet<String> = HashSet::new();
    for m in msgs {
        user_ids.insert(m.user_id.clone());
        user_ids.extend(m.mentioned_users.iter().cloned());
        if let Some(p) = &m.pinned_by_id {
            user_ids.insert(p.clone());
        }
    }
    for q in quoted.values() {
        user_ids.insert(q.user_id.clone());
    }
    for rs in reactions.values() {
        user_ids.extend(rs.iter().map(|r| r.user_id.clone()));
    }
    for ps in participants.values() {
        user_ids.extend(ps.iter().cloned());
    }
    user_ids.into_iter().collect()
}

/// Sets the reaction counts, scores, latest ten and `own` (the viewer's) reactions of `m` from
/// its reactions `rs` (newest first).
fn fill_reactions(m: &mut Message, rs: &[Reaction], own: Option<&str>, user_of: &impl Fn(&str) -> User) {
    m.reaction_counts.clear();
    m.reaction_scores.clear();
    m.latest_reactions.clear();
    m.own_reactions.clear();
    for r in rs {
        let c = m.reaction_counts.entry(r.kind.clone()).or_insert(0.into());
        *c = (c.as_i64().unwrap_or(0) + 1).into();
        let s = m.reaction_scores.entry(r.kind.clone()).or_insert(0.into());
        *s = (s.as_i64().unwrap_or(0) + r.score).into();
        let mut r = r.clone();
        r.user = Some(user_of(&r.user_id));
        if own == Some(r.user_id.as_str()) {
            m.own_reactions.push(r.clone());
        }
        if m.latest_reactions.len() < 10 {
            m.latest_reactions.push(r);
        }
    }
}

/// A change of a stored message, given its channel as locked (it may run more than once: a
/// retried or regrouped write).
pub(crate) type ChangeFn = dyn Fn(&mut Message, &Channel) -> offshoot_core::error::Result<()> + Send + Sync;

/// A queued change.
pub(crate) type Change = Arc<ChangeFn>;

/// An update of a stored message ([`Store::edit_message`]).
pub(crate) struct QueuedUpdate {
    pub(crate) id: String,
    pub(crate) editor: Editor,
    pub(crate) change: Change,
}

/// A new message ([`Store::send_message`]).
pub(crate) struct QueuedSend {
    pub(crate) cid: String,
    pub(crate) new: NewMessage,
    pub(crate) author: User,
}

impl Work for QueuedUpdate {
    type Output = Message;
    const KIND: &'static str = "update";

    fn groups(store: &Store) -> &Groups<Self> {
        &store.updates
    }

    fn key(&self) -> Option<&str> {
        Some(&self.id)
    }

    async fn alone(&self, store: &Store) -> Result<Message> {
        store.retrying("update_message", || store.update_message_once(&self.id, &self.editor, &*self.change)).await
    }

    async fn together(store: &Store, group: &[Self]) -> Result<Vec<Result<Message>>> {
        store.retrying("update_messages", || store.update_messages_once(group)).await
    }
}

impl Work for QueuedSend {
    /// The message as written, and its channel's truncation (to hydrate it).
    type Output = (Message, Option<i64>);
    const KIND: &'static str = "send";

    fn groups(store: &Store) -> &Groups<Self> {
        &store.sends
    }

    /// Two groups written at once never share a channel: neither waits for the other's channel
    /// locks, and a channel's sends are written in the order they arrived.
    fn key(&self) -> Option<&str> {
        Some(&self.cid)
    }

    async fn alone(&self, store: &Store) -> Result<(Message, Option<i64>)> {
        store.retrying("send_message", || store.send_message_once(&self.cid, &self.new, &self.author)).await
    }

    /// Each send is checked and refused alone (`sends.rs`); those it leaves (a reply to or a
    /// quote of a message of the same group, a second send of one id) are written alone after it.
    async fn together(store: &Store, group: &[Self]) -> Result<Vec<Result<(Message, Option<i64>)>>> {
        let outcomes = store.retrying("send_messages", || store.send_messages_once(group)).await?;
        let mut out = Vec::with_capacity(group.len());
        for (s, outcome) in group.iter().zip(outcomes) {
            out.push(match outcome {
                Some(outcome) => outcome,
                None => s.alone(store).await,
            });
        }
        Ok(out)
    }
}
