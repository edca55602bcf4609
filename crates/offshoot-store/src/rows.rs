//! Row decoding shared by every table.

use crate::Result;
use offshoot_core::model::{Channel, ChannelType, Custom, ForkStatus, ForkSummary, Member, Message, Reaction, User};
use serde::de::DeserializeOwned;
use sqlx::any::AnyRow;
use sqlx::Row;

pub(crate) fn get_str(row: &AnyRow, col: &str) -> Result<String> {
    Ok(row.try_get::<String, _>(col)?)
}
pub(crate) fn get_opt_str(row: &AnyRow, col: &str) -> Result<Option<String>> {
    Ok(row.try_get::<Option<String>, _>(col)?)
}
pub(crate) fn get_i64(row: &AnyRow, col: &str) -> Result<i64> {
    Ok(row.try_get::<i64, _>(col)?)
}
pub(crate) fn get_opt_i64(row: &AnyRow, col: &str) -> Result<Option<i64>> {
    Ok(row.try_get::<Option<i64>, _>(col)?)
}
/// Flags are BOOLEAN on PostgreSQL and INTEGER on SQLite.
pub(crate) fn get_bool(row: &AnyRow, col: &str) -> Result<bool> {
    match row.try_get::<bool, _>(col) {
        Ok(b) => Ok(b),
        Err(_) => Ok(row.try_get::<i64, _>(col)? != 0),
    }
}
pub(crate) fn get_json<T: DeserializeOwned>(row: &AnyRow, col: &str) -> Result<T> {
    Ok(serde_json::from_str(&get_str(row, col)?)?)
}
pub(crate) fn get_opt_json<T: DeserializeOwned>(row: &AnyRow, col: &str) -> Result<Option<T>> {
    match get_opt_str(row, col)? {
        Some(s) => Ok(Some(serde_json::from_str(&s)?)),
        None => Ok(None),
    }
}

pub(crate) const USER_COLS: &str =
    "id, role, name, image, language, teams, custom, banned, shadow_banned, invisible, created_at, updated_at, deleted_at, last_active";

pub(crate) fn user(row: &AnyRow) -> Result<User> {
    Ok(User {
        id: get_str(row, "id")?,
        role: get_str(row, "role")?,
        name: get_opt_str(row, "name")?,
        image: get_opt_str(row, "image")?,
        language: get_opt_str(row, "language")?,
        teams: get_json(row, "teams")?,
        custom: get_json::<Custom>(row, "custom")?,
        banned: get_bool(row, "banned")?,
        shadow_banned: get_bool(row, "shadow_banned")?,
        invisible: get_bool(row, "invisible")?,
        created_at: get_i64(row, "created_at")?,
        updated_at: get_i64(row, "updated_at")?,
        deleted_at: get_opt_i64(row, "deleted_at")?,
        last_active: get_opt_i64(row, "last_active")?,
    })
}

pub(crate) const CHANNEL_COLS: &str = "c.cid, c.type, c.id, c.created_by_id, c.team, c.custom, c.frozen, c.disabled, c.created_at, c.updated_at, c.deleted_at, c.truncated_at, c.truncated_by_id, c.last_message_at, c.message_count, (SELECT COUNT(*) FROM member mm WHERE mm.cid = c.cid) AS member_count";

pub(crate) fn channel(row: &AnyRow) -> Result<Channel> {
    Ok(Channel {
        cid: get_str(row, "cid")?,
        kind: get_str(row, "type")?,
        id: get_str(row, "id")?,
        created_by_id: get_opt_str(row, "created_by_id")?,
        created_by: None,
        team: get_opt_str(row, "team")?,
        custom: get_json(row, "custom")?,
        frozen: get_bool(row, "frozen")?,
        disabled: get_bool(row, "disabled")?,
        created_at: get_i64(row, "created_at")?,
        updated_at: get_i64(row, "updated_at")?,
        deleted_at: get_opt_i64(row, "deleted_at")?,
        truncated_at: get_opt_i64(row, "truncated_at")?,
        truncated_by_id: get_opt_str(row, "truncated_by_id")?,
        last_message_at: get_opt_i64(row, "last_message_at")?,
        member_count: get_i64(row, "member_count")?,
        message_count: get_i64(row, "message_count")?,
        fork: None,
        config: None,
    })
}

pub(crate) const MEMBER_COLS: &str = "cid, user_id, channel_role, custom, created_at, updated_at";

pub(crate) fn member(row: &AnyRow) -> Result<Member> {
    Ok(Member {
        cid: get_str(row, "cid")?,
        user_id: get_str(row, "user_id")?,
        user: None,
        channel_role: get_str(row, "channel_role")?,
        custom: get_json(row, "custom")?,
        created_at: get_i64(row, "created_at")?,
        updated_at: get_i64(row, "updated_at")?,
    })
}

pub(crate) const MESSAGE_COLS: &str = "m.id, m.cid, m.user_id, m.type, m.text, m.html, m.mml, m.command, m.parent_id, m.show_in_channel, m.quoted_message_id, m.attachments, m.mentioned_users, m.restricted_visibility, m.silent, m.i18n, m.custom, m.shadowed, m.pinned, m.pinned_at, m.pinned_by_id, m.pin_expires, m.reply_count, m.deleted_reply_count, m.created_at, m.updated_at, m.deleted_at, m.message_text_updated_at, m.hidden_at, m.source_cid, m.source_message_id";

pub(crate) fn message(row: &AnyRow) -> Result<Message> {
    Ok(Message {
        id: get_str(row, "id")?,
        cid: get_str(row, "cid")?,
        user_id: get_str(row, "user_id")?,
        user: None,
        kind: get_str(row, "type")?,
        text: get_str(row, "text")?,
        html: get_str(row, "html")?,
        mml: get_opt_str(row, "mml")?,
        command: get_opt_str(row, "command")?,
        parent_id: get_opt_str(row, "parent_id")?,
        show_in_channel: get_bool(row, "show_in_channel")?,
        quoted_message_id: get_opt_str(row, "quoted_message_id")?,
        quoted_message: None,
        attachments: get_json(row, "attachments")?,
        mentioned_users: get_json(row, "mentioned_users")?,
        mentioned_user_objects: Vec::new(),
        restricted_visibility: get_json(row, "restricted_visibility")?,
        silent: get_bool(row, "silent")?,
        i18n: get_opt_json(row, "i18n")?,
        custom: get_json(row, "custom")?,
        shadowed: get_bool(row, "shadowed")?,
        pinned: get_bool(row, "pinned")?,
        pinned_at: get_opt_i64(row, "pinned_at")?,
        pinned_by_id: get_opt_str(row, "pinned_by_id")?,
        pin_expires: get_opt_i64(row, "pin_expires")?,
        reply_count: get_i64(row, "reply_count")?,
        deleted_reply_count: get_i64(row, "deleted_reply_count")?,
        created_at: get_i64(row, "created_at")?,
        updated_at: get_i64(row, "updated_at")?,
        deleted_at: get_opt_i64(row, "deleted_at")?,
        message_text_updated_at: get_opt_i64(row, "message_text_updated_at")?,
        reaction_counts: Default::default(),
        reaction_scores: Default::default(),
        latest_reactions: Vec::new(),
        own_reactions: Vec::new(),
        thread_participants: Vec::new(),
        source_cid: get_opt_str(row, "source_cid")?,
        source_message_id: get_opt_str(row, "source_message_id")?,
    })
}

pub(crate) fn reaction(row: &AnyRow) -> Result<Reaction> {
    Ok(Reaction {
        message_id: get_str(row, "message_id")?,
        user_id: get_str(row, "user_id")?,
        user: None,
        kind: get_str(row, "type")?,
        score: get_i64(row, "score")?,
        custom: get_json(row, "custom")?,
        created_at: get_i64(row, "created_at")?,
        updated_at: get_i64(row, "updated_at")?,
    })
}

pub(crate) const FORK_COLS: &str = "f.cid, f.source_cid, f.source_message_id, f.status, f.copied_message_count, f.total_message_count, f.truncated, f.oldest_source_message_id, f.failed_reason, f.task_id, f.created_by_id, f.created_at, f.updated_at";

pub(crate) fn fork(row: &AnyRow) -> Result<ForkSummary> {
    Ok(ForkSummary {
        channel_cid: get_str(row, "cid")?,
        source_channel_cid: get_str(row, "source_cid")?,
        source_message_id: get_str(row, "source_message_id")?,
        status: {
            let status = get_str(row, "status")?;
            match ForkStatus::parse(&status) {
                Some(s) => s,
                None => return Err(crate::StoreError::Db(sqlx::Error::Decode(format!("unknown fork status {status:?}").into()))),
            }
        },
        copied_message_count: get_i64(row, "copied_message_count")?,
        total_message_count: get_opt_i64(row, "total_message_count")?,
        truncated: get_bool(row, "truncated")?,
        oldest_source_message_id: get_opt_str(row, "oldest_source_message_id")?,
        failed_reason: get_opt_str(row, "failed_reason")?,
        task_id: get_opt_str(row, "task_id")?,
        created_by_id: get_opt_str(row, "created_by_id")?,
        created_at: get_i64(row, "created_at")?,
        updated_at: get_i64(row, "updated_at")?,
    })
}

pub(crate) fn channel_type(row: &AnyRow) -> Result<ChannelType> {
    Ok(ChannelType {
        name: get_str(row, "name")?,
        max_message_length: get_i64(row, "max_message_length")?,
        extra: get_json(row, "extra")?,
        created_at: get_i64(row, "created_at")?,
        updated_at: get_i64(row, "updated_at")?,
    })
}

/// `$first, $first+1, …` for `n` values.
pub(crate) fn placeholders(first: usize, n: usize) -> String {
    (first..first + n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}
