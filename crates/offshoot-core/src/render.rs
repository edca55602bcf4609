//! The two wire dialects. Legacy: RFC 3339 timestamps, custom fields flat on the object. v2:
//! Unix-nanosecond timestamps, custom fields nested under `custom`. One model, two renderers.

use crate::model::{Channel, Event, ForkStatus, ForkSummary, Member, Message, Reaction, User};
use crate::time::{to_rfc3339, Ts};
use serde_json::{json, Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Legacy,
    V2,
}

impl Dialect {
    pub fn ts(self, ts: Ts) -> Value {
        match self {
            Dialect::Legacy => Value::String(to_rfc3339(ts)),
            Dialect::V2 => Value::from(ts),
        }
    }

    pub fn opt_ts(self, ts: Option<Ts>) -> Value {
        ts.map(|t| self.ts(t)).unwrap_or(Value::Null)
    }

    /// Puts custom data flat (legacy; known keys win) or under `custom` (v2).
    pub fn with_custom(self, mut obj: Map<String, Value>, custom: &Map<String, Value>) -> Value {
        match self {
            Dialect::Legacy => {
                for (k, v) in custom {
                    obj.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            Dialect::V2 => {
                obj.insert("custom".into(), Value::Object(custom.clone()));
            }
        }
        Value::Object(obj)
    }
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn put_opt_ts(d: Dialect, o: &mut Map<String, Value>, key: &str, ts: Option<Ts>) {
    if let Some(t) = ts {
        o.insert(key.into(), d.ts(t));
    }
}

pub fn user(d: Dialect, u: &User) -> Value {
    let mut o = obj(json!({
        "id": u.id,
        "role": u.role,
        "teams": u.teams,
        "banned": u.banned,
        "shadow_banned": u.shadow_banned,
        "online": u.online,
        "invisible": u.invisible,
        "language": u.language.clone().unwrap_or_default(),
        "blocked_user_ids": [],
        "created_at": d.ts(u.created_at),
        "updated_at": d.ts(u.updated_at),
    }));
    if let Some(n) = &u.name {
        o.insert("name".into(), n.clone().into());
    }
    if let Some(i) = &u.image {
        o.insert("image".into(), i.clone().into());
    }
    put_opt_ts(d, &mut o, "last_active", u.last_active);
    put_opt_ts(d, &mut o, "deleted_at", u.deleted_at);
    d.with_custom(o, &u.custom)
}

/// A user as the users endpoints answer it (Stream's full user): the user, their unread
/// counters, and the lists Offshoot does not keep (mutes, devices), empty.
pub fn full_user(d: Dialect, u: &User, unread: crate::model::UnreadCounts) -> Value {
    let mut v = user(d, u);
    if let Value::Object(o) = &mut v {
        o.insert("total_unread_count".into(), unread.total.into());
        o.insert("unread_count".into(), unread.total.into());
        o.insert("unread_channels".into(), unread.channels.into());
        o.insert("unread_threads".into(), 0.into());
        for list in ["mutes", "channel_mutes", "devices"] {
            o.insert(list.into(), json!([]));
        }
    }
    v
}

fn user_or_id(d: Dialect, u: Option<&User>, id: &str) -> Value {
    match u {
        Some(u) => user(d, u),
        None => user(d, &User::placeholder(id, "user")),
    }
}

/// The fork summary as `channel.fork` and event `fork` carry it (no `message_id_map`).
pub fn fork(d: Dialect, f: &ForkSummary) -> Value {
    let mut o = obj(json!({
        "channel_cid": f.channel_cid,
        "source_channel_cid": f.source_channel_cid,
        "source_message_id": f.source_message_id,
        "status": f.status.as_str(),
        // Set once the fork is finished; while backfilling the task reports progress.
        "copied_message_count": if f.status == ForkStatus::Backfilling { 0 } else { f.copied_message_count },
        "created_at": d.ts(f.created_at),
    }));
    if f.truncated && f.status != ForkStatus::Backfilling {
        o.insert("truncated".into(), true.into());
        if let Some(id) = &f.oldest_source_message_id {
            o.insert("oldest_source_message_id".into(), id.clone().into());
        }
    }
    if let Some(r) = &f.failed_reason {
        o.insert("failed_reason".into(), r.clone().into());
    }
    if let Some(t) = &f.task_id {
        o.insert("task_id".into(), t.clone().into());
    }
    Value::Object(o)
}

pub fn channel(d: Dialect, ch: &Channel, own_capabilities: &[&str]) -> Value {
    let mut o = obj(json!({
        "id": ch.id,
        "type": ch.kind,
        "cid": ch.cid,
        "created_at": d.ts(ch.created_at),
        "updated_at": d.ts(ch.updated_at),
        "frozen": ch.frozen,
        "disabled": ch.disabled,
        "member_count": ch.member_count,
        "message_count": ch.message_count,
        "own_capabilities": own_capabilities,
        "hidden": false,
        "cooldown": 0,
        "filter_tags": [],
    }));
    if let Some(u) = &ch.created_by {
        o.insert("created_by".into(), user(d, u));
    } else if let Some(id) = &ch.created_by_id {
        o.insert("created_by".into(), user_or_id(d, None, id));
    }
    if let Some(t) = &ch.team {
        o.insert("team".into(), t.clone().into());
    }
    put_opt_ts(d, &mut o, "last_message_at", ch.last_message_at);
    put_opt_ts(d, &mut o, "deleted_at", ch.deleted_at);
    put_opt_ts(d, &mut o, "truncated_at", ch.truncated_at);
    if let Some(t) = &ch.truncated_by_id {
        o.insert("truncated_by_id".into(), t.clone().into());
        o.insert("truncated_by".into(), user_or_id(d, None, t));
    }
    if let Some(f) = &ch.fork {
        o.insert("fork".into(), fork(d, f));
    }
    if let Some(c) = &ch.config {
        let mut cfg = obj(json!({
            "name": c.name,
            "typing_events": true, "read_events": true, "connect_events": true, "search": true,
            "reactions": true, "replies": true, "quotes": true, "mutes": true, "uploads": true,
            "url_enrichment": false, "custom_events": true, "push_notifications": true,
            "count_messages": true, "delivery_events": false, "polls": false, "reminders": false, "user_message_reminders": false,
            "shared_locations": false, "mark_messages_pending": false, "skip_last_msg_update_for_system_msgs": false,
            "message_retention": "infinite", "max_message_length": c.max_message_length,
            "automod": "disabled", "automod_behavior": "flag", "commands": [],
            "created_at": d.ts(c.created_at), "updated_at": d.ts(c.updated_at),
        }));
        for (k, v) in &c.extra {
            cfg.insert(k.clone(), v.clone());
        }
        o.insert("config".into(), Value::Object(cfg));
    }
    d.with_custom(o, &ch.custom)
}

pub fn member(d: Dialect, m: &Member) -> Value {
    let o = obj(json!({
        "user_id": m.user_id,
        "user": user_or_id(d, m.user.as_ref(), &m.user_id),
        "channel_role": m.channel_role,
        "role": if m.channel_role == "channel_moderator" { "moderator" } else { "member" },
        "banned": false,
        "shadow_banned": false,
        "notifications_muted": false,
        "created_at": d.ts(m.created_at),
        "updated_at": d.ts(m.updated_at),
    }));
    d.with_custom(o, &m.custom)
}

pub fn reaction(d: Dialect, r: &Reaction) -> Value {
    let o = obj(json!({
        "message_id": r.message_id,
        "user_id": r.user_id,
        "user": user_or_id(d, r.user.as_ref(), &r.user_id),
        "type": r.kind,
        "score": r.score,
        "created_at": d.ts(r.created_at),
        "updated_at": d.ts(r.updated_at),
    }));
    d.with_custom(o, &r.custom)
}

pub fn message(d: Dialect, m: &Message) -> Value {
    let mut o = obj(json!({
        "id": m.id,
        "cid": m.cid,
        "text": m.text,
        "html": m.html,
        "type": m.kind,
        "user": user_or_id(d, m.user.as_ref(), &m.user_id),
        "attachments": m.attachments,
        "latest_reactions": m.latest_reactions.iter().map(|r| reaction(d, r)).collect::<Vec<_>>(),
        "own_reactions": m.own_reactions.iter().map(|r| reaction(d, r)).collect::<Vec<_>>(),
        "reaction_counts": m.reaction_counts,
        "reaction_scores": m.reaction_scores,
        "reaction_groups": null,
        "reply_count": m.reply_count,
        "deleted_reply_count": m.deleted_reply_count,
        "created_at": d.ts(m.created_at),
        "updated_at": d.ts(m.updated_at),
        "shadowed": m.shadowed,
        "mentioned_users": m.mentioned_user_objects.iter().map(|u| user(d, u)).collect::<Vec<_>>(),
        "silent": m.silent,
        "pinned": m.pinned,
        "pinned_at": d.opt_ts(m.pinned_at),
        "pin_expires": d.opt_ts(m.pin_expires),
        "restricted_visibility": m.restricted_visibility,
        "mentioned_channel": false,
        "mentioned_here": false,
        "thread_participants": m.thread_participants.iter().map(|u| user(d, u)).collect::<Vec<_>>(),
    }));
    if let Some(p) = &m.pinned_by_id {
        o.insert("pinned_by".into(), user_or_id(d, None, p));
    }
    if let Some(p) = &m.parent_id {
        o.insert("parent_id".into(), p.clone().into());
        o.insert("show_in_channel".into(), m.show_in_channel.into());
    }
    if let Some(q) = &m.quoted_message_id {
        o.insert("quoted_message_id".into(), q.clone().into());
        if let Some(qm) = &m.quoted_message {
            o.insert("quoted_message".into(), message(d, qm));
        }
    }
    if let Some(x) = &m.mml {
        o.insert("mml".into(), x.clone().into());
    }
    if let Some(x) = &m.command {
        o.insert("command".into(), x.clone().into());
    }
    if let Some(x) = &m.i18n {
        o.insert("i18n".into(), Value::Object(x.clone()));
    }
    put_opt_ts(d, &mut o, "deleted_at", m.deleted_at);
    put_opt_ts(d, &mut o, "message_text_updated_at", m.message_text_updated_at);
    d.with_custom(o, &m.custom)
}

pub fn event(d: Dialect, e: &Event) -> Value {
    let mut o = Map::new();
    o.insert("type".into(), e.kind.clone().into());
    if let Some(c) = &e.cid {
        o.insert("cid".into(), c.clone().into());
    }
    if let Some(c) = &e.channel_type {
        o.insert("channel_type".into(), c.clone().into());
    }
    if let Some(c) = &e.channel_id {
        o.insert("channel_id".into(), c.clone().into());
    }
    if let Some(u) = &e.user {
        o.insert("user".into(), user(d, u));
    }
    if let Some(c) = &e.channel {
        o.insert("channel".into(), channel(d, c, &[]));
    }
    if let Some(m) = &e.message {
        o.insert("message_id".into(), m.id.clone().into());
        o.insert("message".into(), message(d, m));
    }
    if let Some(m) = &e.member {
        o.insert("member".into(), member(d, m));
    }
    if let Some(r) = &e.reaction {
        o.insert("reaction".into(), reaction(d, r));
    }
    if let Some(f) = &e.fork {
        o.insert("fork".into(), fork(d, f));
    }
    if let Some(h) = e.hard_delete {
        o.insert("hard_delete".into(), h.into());
    }
    for (k, v) in &e.extra {
        o.entry(k.clone()).or_insert_with(|| v.clone());
    }
    o.insert("created_at".into(), d.ts(e.created_at));
    if e.kind == "message.new" {
        o.entry("watcher_count").or_insert(0.into());
    }
    Value::Object(o)
}

/// Stream's error envelope (`code`, `message`, `StatusCode`, `duration`, `more_info`,
/// `details`, `exception_fields`, `unrecoverable`): the body of every error answer, whichever
/// part of the server gives it (API, WebSocket upgrade, limits).
pub fn error_body(code: i64, status: u16, message: &str, duration: &str, fields: &std::collections::BTreeMap<String, String>) -> Value {
    json!({
        "code": code,
        "message": message,
        "StatusCode": status,
        "duration": duration,
        "more_info": "https://getstream.io/chat/docs/api_errors_response",
        "details": [],
        "exception_fields": fields,
        "unrecoverable": false,
    })
}

/// The Stream error code of an error answer, left in the response's extensions for the
/// request log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode(pub i64);
