//! The chat model, one shape for both wire dialects. Custom data is kept apart from the known
//! fields (`custom`); renderers flatten it (legacy) or nest it (v2).

use crate::time::Ts;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

pub type Custom = Map<String, Value>;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct User {
    pub id: String,
    pub role: String,
    pub name: Option<String>,
    pub image: Option<String>,
    pub language: Option<String>,
    #[serde(default)]
    pub teams: Vec<String>,
    #[serde(default)]
    pub custom: Custom,
    #[serde(default)]
    pub banned: bool,
    #[serde(default)]
    pub shadow_banned: bool,
    #[serde(default)]
    pub invisible: bool,
    pub created_at: Ts,
    pub updated_at: Ts,
    pub deleted_at: Option<Ts>,
    pub last_active: Option<Ts>,
    /// Whether the user has a live WebSocket connection and is not invisible, as read with the
    /// user (never stored on the user row).
    #[serde(default)]
    pub online: bool,
}

impl User {
    /// A user record for an id the store does not know (anonymous callers, dangling authors).
    pub fn placeholder(id: &str, role: &str) -> User {
        User { id: id.to_string(), role: role.to_string(), ..Default::default() }
    }
}

/// A channel type's `max_message_length` when it sets none (Stream's default).
pub const DEFAULT_MAX_MESSAGE_LENGTH: i64 = 5000;

/// Configuration of a channel type.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChannelType {
    pub name: String,
    pub max_message_length: i64,
    #[serde(default)]
    pub extra: Custom,
    pub created_at: Ts,
    pub updated_at: Ts,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ForkSummary {
    pub channel_cid: String,
    pub source_channel_cid: String,
    pub source_message_id: String,
    pub status: ForkStatus,
    pub copied_message_count: i64,
    pub total_message_count: Option<i64>,
    pub truncated: bool,
    pub oldest_source_message_id: Option<String>,
    pub failed_reason: Option<String>,
    pub task_id: Option<String>,
    pub created_by_id: Option<String>,
    pub created_at: Ts,
    pub updated_at: Ts,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ForkStatus {
    Backfilling,
    Completed,
    Failed,
}

impl ForkStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ForkStatus::Backfilling => "backfilling",
            ForkStatus::Completed => "completed",
            ForkStatus::Failed => "failed",
        }
    }
    /// `None` for a status this version does not know (written by a newer one, or by hand).
    pub fn parse(s: &str) -> Option<ForkStatus> {
        match s {
            "backfilling" => Some(ForkStatus::Backfilling),
            "completed" => Some(ForkStatus::Completed),
            "failed" => Some(ForkStatus::Failed),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Channel {
    pub cid: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub id: String,
    pub created_by_id: Option<String>,
    pub created_by: Option<User>,
    pub team: Option<String>,
    #[serde(default)]
    pub custom: Custom,
    #[serde(default)]
    pub frozen: bool,
    #[serde(default)]
    pub disabled: bool,
    pub created_at: Ts,
    pub updated_at: Ts,
    pub deleted_at: Option<Ts>,
    pub truncated_at: Option<Ts>,
    pub truncated_by_id: Option<String>,
    pub last_message_at: Option<Ts>,
    #[serde(default)]
    pub member_count: i64,
    #[serde(default)]
    pub message_count: i64,
    pub fork: Option<ForkSummary>,
    pub config: Option<ChannelType>,
}

impl Channel {
    /// Its type's `max_message_length`, or the default when the type is not loaded.
    pub fn max_message_length(&self) -> i64 {
        self.config.as_ref().map_or(DEFAULT_MAX_MESSAGE_LENGTH, |c| c.max_message_length)
    }

    /// A message text fits its type's `max_message_length` ([`check_text_length`]).
    pub fn check_text(&self, text: &str) -> Result<(), crate::Error> {
        check_text_length(text, self.max_message_length())
    }
}

/// A message text is at most `max_text` characters (a channel type's `max_message_length`).
pub fn check_text_length(text: &str, max_text: i64) -> Result<(), crate::Error> {
    if text.chars().count() as i64 > max_text {
        return Err(crate::Error::new(
            crate::ErrorKind::MessageTooLong,
            format!("message text is longer than {max_text} characters, the channel type's max_message_length"),
        ));
    }
    Ok(())
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Member {
    pub cid: String,
    pub user_id: String,
    pub user: Option<User>,
    pub channel_role: String,
    #[serde(default)]
    pub custom: Custom,
    pub created_at: Ts,
    pub updated_at: Ts,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Reaction {
    pub message_id: String,
    pub user_id: String,
    pub user: Option<User>,
    #[serde(rename = "type")]
    pub kind: String,
    pub score: i64,
    #[serde(default)]
    pub custom: Custom,
    pub created_at: Ts,
    pub updated_at: Ts,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Message {
    pub id: String,
    pub cid: String,
    pub user_id: String,
    pub user: Option<User>,
    #[serde(rename = "type")]
    pub kind: String,
    pub text: String,
    pub html: String,
    pub mml: Option<String>,
    pub command: Option<String>,
    pub parent_id: Option<String>,
    #[serde(default)]
    pub show_in_channel: bool,
    pub quoted_message_id: Option<String>,
    pub quoted_message: Option<Box<Message>>,
    #[serde(default)]
    pub attachments: Vec<Value>,
    #[serde(default)]
    pub mentioned_users: Vec<String>,
    #[serde(default)]
    pub mentioned_user_objects: Vec<User>,
    #[serde(default)]
    pub restricted_visibility: Vec<String>,
    #[serde(default)]
    pub silent: bool,
    pub i18n: Option<Custom>,
    #[serde(default)]
    pub custom: Custom,
    #[serde(default)]
    pub shadowed: bool,
    #[serde(default)]
    pub pinned: bool,
    pub pinned_at: Option<Ts>,
    pub pinned_by_id: Option<String>,
    pub pin_expires: Option<Ts>,
    #[serde(default)]
    pub reply_count: i64,
    #[serde(default)]
    pub deleted_reply_count: i64,
    pub created_at: Ts,
    pub updated_at: Ts,
    pub deleted_at: Option<Ts>,
    pub message_text_updated_at: Option<Ts>,
    #[serde(default)]
    pub reaction_counts: Map<String, Value>,
    #[serde(default)]
    pub reaction_scores: Map<String, Value>,
    #[serde(default)]
    pub latest_reactions: Vec<Reaction>,
    #[serde(default)]
    pub own_reactions: Vec<Reaction>,
    #[serde(default)]
    pub thread_participants: Vec<User>,
    pub source_cid: Option<String>,
    pub source_message_id: Option<String>,
}

/// A message as sent: everything the sender controls.
#[derive(Debug, Clone, Default)]
pub struct NewMessage {
    pub id: String,
    pub user_id: String,
    pub kind: String,
    pub text: String,
    pub html: String,
    pub mml: Option<String>,
    pub command: Option<String>,
    pub parent_id: Option<String>,
    pub show_in_channel: bool,
    pub quoted_message_id: Option<String>,
    pub attachments: Vec<Value>,
    pub mentioned_users: Vec<String>,
    pub restricted_visibility: Vec<String>,
    pub silent: bool,
    pub i18n: Option<Custom>,
    pub custom: Custom,
    pub pinned: bool,
    pub pin_expires: Option<Ts>,
    pub created_at: Option<Ts>,
}

/// Who is asking: decides what a read returns and what a write may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Viewer {
    /// Server-side calls see everything that is stored and not hidden.
    Server,
    User {
        id: String,
        role: String,
    },
    Anonymous {
        id: String,
    },
}

impl Viewer {
    pub fn user_id(&self) -> Option<&str> {
        match self {
            Viewer::Server => None,
            Viewer::User { id, .. } | Viewer::Anonymous { id } => Some(id),
        }
    }
    pub fn is_server(&self) -> bool {
        matches!(self, Viewer::Server)
    }
    pub fn is_admin(&self) -> bool {
        match self {
            Viewer::Server => true,
            Viewer::User { role, .. } => role == "admin",
            Viewer::Anonymous { .. } => false,
        }
    }
}

/// An event as written to the outbox. Object snapshots are in the internal model and rendered
/// per dialect at delivery.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: String,
    pub cid: Option<String>,
    pub channel_type: Option<String>,
    pub channel_id: Option<String>,
    pub user: Option<User>,
    pub channel: Option<Channel>,
    pub message: Option<Message>,
    pub member: Option<Member>,
    pub reaction: Option<Reaction>,
    pub fork: Option<ForkSummary>,
    pub hard_delete: Option<bool>,
    /// Other keys sent as they are (custom events, `ai_state`, …).
    #[serde(default)]
    pub extra: Custom,
    pub created_at: Ts,
}

/// Who an outbox event goes to.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Audience {
    /// Connections watching this channel.
    pub watchers_of: Option<String>,
    /// These users, on every connection they hold.
    #[serde(default)]
    pub users: Vec<String>,
    /// Whether webhooks receive it.
    pub webhooks: bool,
    /// Connections watching this channel are left out (they hear the channel's own event):
    /// `notification.*` events for members who do not watch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub except_watchers_of: Option<String>,
    /// Each recipient's unread counters at the time of the event, added to what they receive
    /// (`total_unread_count`, `unread_count`, `unread_channels`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unread: BTreeMap<String, UnreadCounts>,
    /// These WebSocket connections (by id, on whichever process holds them): presence events
    /// for the connections that watch a channel of the user with `presence: true`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<String>,
}

/// A user's unread counters, as `me` and events carry them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnreadCounts {
    /// Unread messages over all the user's channels (`total_unread_count`, `unread_count`).
    pub total: i64,
    /// Channels with at least one unread message (`unread_channels`).
    pub channels: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEvent {
    pub seq: i64,
    pub event: Event,
    pub audience: Audience,
}

/// Application settings kept by the server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AppSettings {
    #[serde(default = "yes")]
    pub fork_enabled: bool,
    #[serde(default)]
    pub webhook_url: Option<String>,
    #[serde(default)]
    pub webhook_events: Vec<String>,
    #[serde(default)]
    pub event_hooks: Vec<Value>,
    /// `legacy` (RFC 3339, flat custom) or `v2` (nanoseconds, nested custom).
    #[serde(default = "legacy")]
    pub webhook_dialect: String,
    #[serde(default)]
    pub disable_auth_checks: bool,
    #[serde(default)]
    pub revoke_tokens_issued_before: Option<Ts>,
    /// Anything else the SDKs store and read back.
    #[serde(default)]
    pub extra: Custom,
}

fn yes() -> bool {
    true
}
fn legacy() -> String {
    "legacy".into()
}

impl Default for AppSettings {
    fn default() -> Self {
        serde_json::from_value(Value::Object(Map::new())).expect("defaults deserialize")
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub id: String,
    pub status: String,
    pub result: Value,
    pub error: Option<Value>,
    pub created_at: Ts,
    pub updated_at: Ts,
}

/// The WebSocket role's registry of watched channels, as the API needs it (a channel query
/// with `watch: true` and a `connection_id` subscribes that connection). Implemented by
/// `offshoot-ws`; the API holds it as a trait object so it does not depend on the ws crate.
///
/// `owner` is the user the request acts for: a user may only (un)subscribe connections of
/// their own, and a connection of another user is left as it is. `None` (a server-side request)
/// may act on any connection.
pub trait Watchers: Send + Sync {
    /// Subscribes `connection_id` to `cid`. False when this process holds no such connection.
    fn watch(&self, connection_id: &str, owner: Option<&str>, cid: &str) -> bool;
    /// Unsubscribes; false when this process holds no such connection.
    fn unwatch(&self, connection_id: &str, owner: Option<&str>, cid: &str) -> bool;
}

/// Outbox events that carry watch registrations to the WebSocket role when it runs in another
/// process (`extra.connection_id`, `cid`, and `extra.user_id` when a user asked: the owner the
/// connection must have). They are never delivered to clients or webhooks.
pub const WATCH_EVENT: &str = "offshoot.watch";
pub const UNWATCH_EVENT: &str = "offshoot.unwatch";

/// No WebSocket role in this process: watching is a no-op.
pub struct NoWatchers;

impl Watchers for NoWatchers {
    fn watch(&self, _: &str, _: Option<&str>, _: &str) -> bool {
        false
    }
    fn unwatch(&self, _: &str, _: Option<&str>, _: &str) -> bool {
        false
    }
}
