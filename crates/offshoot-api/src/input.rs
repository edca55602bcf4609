//! The request types: one `Deserialize` struct per body and query string, in the polymorphic
//! shapes the three SDKs send (docs/compatibility.md): members as strings or objects, the actor
//! as `user_id`, `user.id` or `user: "id"`, custom data nested under `custom` or flat (the
//! keys a struct does not name, through `#[serde(flatten)]`), `null` for absent, booleans and
//! integers also as strings. A bad field is an input error that names it ([`crate::ctx::Body`]).

use offshoot_core::model::{Custom, NewMessage, User, Viewer};
pub use offshoot_core::wire::{Extra, UserReadOnly};
use offshoot_core::{ids, time, Error};
use offshoot_store::{MemberInput, Page, PageDir};
use serde::de::{Deserializer, IgnoredAny};
use serde::Deserialize;
use serde_json::{Map, Value};

pub type Obj = Map<String, Value>;
type R<T> = Result<T, Error>;

/// Field deserializers for the lenient scalars the SDKs send.
pub mod de {
    use super::*;

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum BoolOrText {
        Bool(bool),
        Text(String),
    }

    /// `true`, `"true"`, `"1"` (query strings), or absent / `null`.
    pub fn opt_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
        match Option::<BoolOrText>::deserialize(d)? {
            None => Ok(None),
            Some(BoolOrText::Bool(b)) => Ok(Some(b)),
            Some(BoolOrText::Text(s)) => match s.as_str() {
                "true" | "1" => Ok(Some(true)),
                "false" | "0" => Ok(Some(false)),
                _ => Err(serde::de::Error::custom(format!("expected a boolean, got {s:?}"))),
            },
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum IntOrText {
        Int(i64),
        Text(String),
    }

    /// An integer, also as a string (query strings, some SDK payloads), or absent / `null`.
    pub fn opt_i64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        match Option::<IntOrText>::deserialize(d)? {
            None => Ok(None),
            Some(IntOrText::Int(n)) => Ok(Some(n)),
            Some(IntOrText::Text(s)) => {
                s.parse().map(Some).map_err(|_| serde::de::Error::custom(format!("expected an integer, got {s:?}")))
            }
        }
    }

    /// A key that is present, even as `null` (`Some(None)`), against one that is absent
    /// (`None`, with `#[serde(default)]`).
    pub fn some<'de, T: Deserialize<'de>, D: Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
        T::deserialize(d).map(Some)
    }

    /// [`opt_bool`], keeping a present `null` apart from an absent key.
    pub fn some_bool<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<bool>>, D::Error> {
        opt_bool(d).map(Some)
    }

    /// [`opt_ts`], keeping a present `null` apart from an absent key.
    pub fn some_ts<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<i64>>, D::Error> {
        opt_ts(d).map(Some)
    }

    /// An RFC 3339 timestamp or Unix nanoseconds, or absent / `null`.
    pub fn opt_ts<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        match Option::<Value>::deserialize(d)? {
            None => Ok(None),
            Some(v) => time::parse(&v).map(Some).ok_or_else(|| serde::de::Error::custom("expected an RFC 3339 timestamp")),
        }
    }
}

/// `field` of a request, which must be there and not empty.
pub fn required<T>(value: Option<T>, field: &str) -> R<T>
where
    T: AsRef<str>,
{
    value.filter(|v| !v.as_ref().is_empty()).ok_or_else(|| Error::input(format!("field {field:?} is required")).field("field", field))
}

/// `field`, which must be there.
pub fn present<T>(value: Option<T>, field: &str) -> R<T> {
    value.ok_or_else(|| Error::input(format!("field {field:?} is required")).field("field", field))
}

/// `?limit=&offset=` of a list endpoint; `limit` defaults to 25.
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    #[serde(default, deserialize_with = "de::opt_i64")]
    limit: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    offset: Option<i64>,
}

impl ListQuery {
    /// `limit` in 1..=`max` and `offset` ≥ 0.
    pub fn limit_offset(&self, max: i64) -> R<(i64, i64)> {
        let (limit, offset) = (self.limit.unwrap_or(25), self.offset.unwrap_or(0));
        if !(1..=max).contains(&limit) || offset < 0 {
            return Err(Error::input(format!("limit must be 1..{max} and offset ≥ 0")));
        }
        Ok((limit, offset))
    }
}

/// A user named by id, as a string or an object with an `id`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum UserRef {
    Id(String),
    Object { id: Option<String> },
}

impl UserRef {
    pub fn id(&self) -> Option<&str> {
        match self {
            UserRef::Id(id) => Some(id),
            UserRef::Object { id } => id.as_deref(),
        }
    }
}

/// Who a server-side request acts as: `user_id`, `user.id` or `user: "id"`.
#[derive(Debug, Default, Deserialize)]
pub struct Actor {
    user_id: Option<String>,
    user: Option<UserRef>,
}

impl Actor {
    /// The named user id, validated.
    pub fn id(&self) -> R<Option<String>> {
        match self.user_id.as_deref().or(self.user.as_ref().and_then(UserRef::id)) {
            Some(id) => Ok(Some(ids::parse_user_id(id)?)),
            None => Ok(None),
        }
    }

    /// The user a write acts as: a client-side caller is itself; a server-side call names one.
    pub fn acting(&self, viewer: &Viewer, me: Option<&User>, required: bool) -> R<Option<User>> {
        match viewer {
            Viewer::Server => match self.id()? {
                Some(id) => Ok(Some(User::placeholder(&id, "user"))),
                None if required => Err(Error::input("a server-side request must name the acting user with user_id or user.id")),
                None => Ok(None),
            },
            Viewer::User { id, role } => Ok(Some(me.cloned().unwrap_or_else(|| User::placeholder(id, role)))),
            Viewer::Anonymous { .. } => Err(Error::not_allowed("anonymous users cannot do this")),
        }
    }
}

/// A member as a user id or `{user_id | user.id, channel_role, custom…}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum MemberRef {
    Id(String),
    Member(Box<MemberObject>),
}

#[derive(Debug, Deserialize)]
pub struct MemberObject {
    user_id: Option<String>,
    user: Option<UserRef>,
    channel_role: Option<String>,
    #[serde(flatten)]
    _read_only: MemberReadOnly,
    #[serde(flatten)]
    custom: Extra,
}

/// Member fields the server sets; a client's copy is dropped.
#[derive(Debug, Default, Deserialize)]
#[allow(dead_code)] // named only to keep these keys out of custom data
struct MemberReadOnly {
    #[serde(default)]
    role: IgnoredAny,
    #[serde(default)]
    created_at: IgnoredAny,
    #[serde(default)]
    updated_at: IgnoredAny,
}

/// Members as sent, validated and without repeats; `field` names the list in errors.
pub fn members(list: Vec<MemberRef>, field: &str) -> R<Vec<MemberInput>> {
    let mut out: Vec<MemberInput> = Vec::with_capacity(list.len());
    for item in list {
        let m = match item {
            MemberRef::Id(s) => MemberInput { user_id: ids::parse_user_id(&s)?, ..Default::default() },
            MemberRef::Member(m) => {
                let m = *m;
                let Some(uid) = m.user_id.clone().or_else(|| m.user.as_ref().and_then(|u| u.id().map(str::to_string))) else {
                    return Err(Error::input(format!("every entry of {field:?} needs a user_id")).field("field", field));
                };
                MemberInput { user_id: ids::parse_user_id(&uid)?, channel_role: m.channel_role, custom: m.custom.into_custom() }
            }
        };
        if !out.iter().any(|x| x.user_id == m.user_id) {
            out.push(m);
        }
    }
    Ok(out)
}

/// Message pagination: `{limit, id_lt, id_lte, id_gt, id_gte, id_around}`.
#[derive(Debug, Default, Deserialize)]
pub struct PageInput {
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub limit: Option<i64>,
    pub id_lt: Option<String>,
    pub id_lte: Option<String>,
    pub id_gt: Option<String>,
    pub id_gte: Option<String>,
    pub id_around: Option<String>,
}

impl PageInput {
    pub fn page(self, default_limit: i64) -> R<Page> {
        let limit = self.limit.unwrap_or(default_limit);
        if !(0..=300).contains(&limit) {
            return Err(Error::input("messages.limit must be between 0 and 300"));
        }
        let dir = if let Some(id) = self.id_lt {
            PageDir::Before { id, inclusive: false }
        } else if let Some(id) = self.id_lte {
            PageDir::Before { id, inclusive: true }
        } else if let Some(id) = self.id_gt {
            PageDir::After { id, inclusive: false }
        } else if let Some(id) = self.id_gte {
            PageDir::After { id, inclusive: true }
        } else if let Some(id) = self.id_around {
            PageDir::Around { id }
        } else {
            PageDir::Latest
        };
        Ok(Page { limit, dir })
    }
}

/// `{limit, offset}` of a list inside a request (`members`, `watchers`).
#[derive(Debug, Default, Deserialize)]
pub struct LimitInput {
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub limit: Option<i64>,
    #[serde(default, deserialize_with = "de::opt_i64")]
    pub offset: Option<i64>,
}

/// `set` / `unset` of a partial update.
#[derive(Debug, Default, Deserialize)]
pub struct Patch {
    pub set: Option<Obj>,
    pub unset: Option<Vec<String>>,
}

impl Patch {
    pub fn into_parts(self) -> (Obj, Vec<String>) {
        (self.set.unwrap_or_default(), self.unset.unwrap_or_default())
    }
}

/// A message as sent.
#[derive(Debug, Default, Deserialize)]
pub struct MessageInput {
    id: Option<String>,
    text: Option<String>,
    html: Option<String>,
    mml: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    parent_id: Option<String>,
    #[serde(default, deserialize_with = "de::opt_bool")]
    show_in_channel: Option<bool>,
    quoted_message_id: Option<String>,
    attachments: Option<Vec<Obj>>,
    mentioned_users: Option<Vec<UserRef>>,
    restricted_visibility: Option<Vec<String>>,
    #[serde(default, deserialize_with = "de::opt_bool")]
    silent: Option<bool>,
    #[serde(default, deserialize_with = "de::opt_bool")]
    pinned: Option<bool>,
    #[serde(default, deserialize_with = "de::opt_ts")]
    pin_expires: Option<i64>,
    command: Option<String>,
    i18n: Option<Obj>,
    #[serde(default, deserialize_with = "de::opt_ts")]
    created_at: Option<i64>,
    #[serde(flatten)]
    pub actor: Actor,
    #[serde(flatten)]
    _read_only: MessageReadOnly,
    #[serde(flatten)]
    custom: Extra,
}

/// Message fields the server sets (or Offshoot does not store); a client's copy is dropped
/// instead of landing in custom data.
#[derive(Debug, Default, Deserialize)]
#[allow(dead_code)] // named only to keep these keys out of custom data
struct MessageReadOnly {
    #[serde(default)]
    pinned_at: IgnoredAny,
    #[serde(default)]
    poll_id: IgnoredAny,
    #[serde(default)]
    updated_at: IgnoredAny,
    #[serde(default)]
    cid: IgnoredAny,
    #[serde(default)]
    latest_reactions: IgnoredAny,
    #[serde(default)]
    own_reactions: IgnoredAny,
    #[serde(default)]
    reaction_counts: IgnoredAny,
    #[serde(default)]
    reaction_scores: IgnoredAny,
    #[serde(default)]
    reaction_groups: IgnoredAny,
    #[serde(default)]
    reply_count: IgnoredAny,
    #[serde(default)]
    deleted_reply_count: IgnoredAny,
    #[serde(default)]
    shadowed: IgnoredAny,
    #[serde(default)]
    mentioned_channel: IgnoredAny,
    #[serde(default)]
    mentioned_here: IgnoredAny,
    #[serde(default)]
    thread_participants: IgnoredAny,
    #[serde(default)]
    quoted_message: IgnoredAny,
    #[serde(default)]
    deleted_at: IgnoredAny,
    #[serde(default)]
    pinned_by: IgnoredAny,
    #[serde(default)]
    message_text_updated_at: IgnoredAny,
    #[serde(default)]
    member: IgnoredAny,
    #[serde(default)]
    channel: IgnoredAny,
    #[serde(default)]
    deleted_for_me: IgnoredAny,
    #[serde(default)]
    status: IgnoredAny,
    #[serde(default)]
    args: IgnoredAny,
    #[serde(default)]
    before_message_send_failed: IgnoredAny,
}

/// Escapes text into the minimal HTML Stream renders for plain text.
pub fn html_of(text: &str) -> String {
    if text.is_empty() {
        return String::new();
    }
    let esc = text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    format!("<p>{}</p>\n", esc.replace('\n', "<br/>"))
}

/// User ids of `mentioned_users` (strings or user objects).
/// An optional message id from a client (empty = none), checked like a message's own id: it is
/// looked up in indexed columns, where PostgreSQL refuses an over-long key with a 500.
pub fn opt_message_id(id: Option<String>, field: &str) -> R<Option<String>> {
    match id {
        Some(id) if !id.is_empty() => Ok(Some(ids::parse_message_id(&id).map_err(|e| e.field("field", field))?)),
        _ => Ok(None),
    }
}

/// User ids from a client, each checked as a user id (they key indexed rows).
pub fn user_ids(list: Vec<String>, field: &str) -> R<Vec<String>> {
    list.iter().map(|u| ids::parse_user_id(u).map_err(|e| e.field("field", field))).collect()
}

pub fn mentioned(list: Option<Vec<UserRef>>) -> R<Vec<String>> {
    list.unwrap_or_default().iter().map(|u| required(u.id().map(str::to_string), "mentioned_users.id")).collect()
}

pub use offshoot_core::model::check_text_length as check_length;

/// The error of more attachments than a message may carry.
pub fn check_attachments(n: usize) -> R<()> {
    if n > offshoot_core::fork::MAX_ATTACHMENTS {
        return Err(Error::input(format!("a message can have at most {} attachments", offshoot_core::fork::MAX_ATTACHMENTS)));
    }
    Ok(())
}

/// The error of message custom data over the size limit.
pub fn check_custom(custom: &Custom) -> R<()> {
    if serde_json::to_vec(custom).map(|v| v.len()).unwrap_or(0) > offshoot_core::fork::MAX_CUSTOM_BYTES {
        return Err(Error::input(format!("message custom data is larger than {} bytes", offshoot_core::fork::MAX_CUSTOM_BYTES)));
    }
    Ok(())
}

impl MessageInput {
    /// The message to store. `max_text` is the channel type's `max_message_length`.
    pub fn into_new(self, server_side: bool, max_text: i64) -> R<NewMessage> {
        let text = self.text.unwrap_or_default();
        check_length(&text, max_text)?;
        let id = match self.id {
            Some(id) if !id.is_empty() => ids::parse_message_id(&id)?,
            _ => String::new(),
        };
        let kind = self.kind.unwrap_or_else(|| "regular".into());
        if !matches!(kind.as_str(), "regular" | "system" | "ephemeral" | "error") {
            return Err(Error::input(format!("message type {kind:?} cannot be sent: use regular, system, ephemeral or error"))
                .field("field", "message.type"));
        }
        if kind != "regular" && !server_side {
            return Err(Error::not_allowed(format!("only server-side requests can send {kind} messages")));
        }
        let attachments: Vec<Value> = self.attachments.unwrap_or_default().into_iter().map(Value::Object).collect();
        check_attachments(attachments.len())?;
        let custom = self.custom.into_custom();
        check_custom(&custom)?;
        if self.created_at.is_some() && !server_side {
            return Err(Error::not_allowed("only server-side requests can set created_at"));
        }
        let parent_id = opt_message_id(self.parent_id, "message.parent_id")?;
        let quoted_message_id = opt_message_id(self.quoted_message_id, "message.quoted_message_id")?;
        let restricted_visibility = user_ids(self.restricted_visibility.unwrap_or_default(), "message.restricted_visibility")?;
        Ok(NewMessage {
            id,
            user_id: String::new(),
            kind,
            html: self.html.filter(|h| !h.is_empty() && server_side).unwrap_or_else(|| html_of(&text)),
            text,
            mml: self.mml,
            command: self.command,
            show_in_channel: parent_id.is_some() && self.show_in_channel.unwrap_or(false),
            parent_id,
            quoted_message_id,
            attachments,
            mentioned_users: mentioned(self.mentioned_users)?,
            restricted_visibility,
            silent: self.silent.unwrap_or(false),
            i18n: self.i18n,
            custom,
            pinned: self.pinned.unwrap_or(false),
            pin_expires: self.pin_expires,
            created_at: self.created_at,
        })
    }
}

/// A channel's `data`: known fields, read-only ones dropped, the rest custom data.
#[derive(Debug, Default, Deserialize)]
pub struct ChannelData {
    pub created_by_id: Option<String>,
    pub created_by: Option<UserRef>,
    pub members: Option<Vec<MemberRef>>,
    pub team: Option<String>,
    #[serde(default, deserialize_with = "de::opt_bool")]
    pub frozen: Option<bool>,
    #[serde(flatten)]
    _read_only: ChannelReadOnly,
    #[serde(flatten)]
    pub custom: Extra,
}

/// Channel fields the server sets (or Offshoot does not store); a client's copy is dropped.
#[derive(Debug, Default, Deserialize)]
#[allow(dead_code)] // named only to keep these keys out of custom data
struct ChannelReadOnly {
    #[serde(default)]
    disabled: IgnoredAny,
    #[serde(default)]
    config_overrides: IgnoredAny,
    #[serde(default)]
    filter_tags: IgnoredAny,
    #[serde(default)]
    invites: IgnoredAny,
    #[serde(default)]
    id: IgnoredAny,
    #[serde(default, rename = "type")]
    kind: IgnoredAny,
    #[serde(default)]
    cid: IgnoredAny,
    #[serde(default)]
    created_at: IgnoredAny,
    #[serde(default)]
    updated_at: IgnoredAny,
    #[serde(default)]
    own_capabilities: IgnoredAny,
    #[serde(default)]
    member_count: IgnoredAny,
    #[serde(default)]
    auto_translation_enabled: IgnoredAny,
    #[serde(default)]
    auto_translation_language: IgnoredAny,
    #[serde(default)]
    fork: IgnoredAny,
    #[serde(default)]
    truncated_at: IgnoredAny,
    #[serde(default)]
    deleted_at: IgnoredAny,
}

impl ChannelData {
    /// The creator it names: `created_by_id` or `created_by.id`.
    pub fn creator(&self) -> Option<&str> {
        self.created_by_id.as_deref().or(self.created_by.as_ref().and_then(UserRef::id))
    }
}

/// `watch` / `presence` and the connection to watch with.
#[derive(Debug, Default, Deserialize)]
pub struct WatchInput {
    #[serde(default, deserialize_with = "de::opt_bool")]
    pub watch: Option<bool>,
    #[serde(default, deserialize_with = "de::opt_bool")]
    pub presence: Option<bool>,
    pub connection_id: Option<String>,
}

impl WatchInput {
    pub fn asked(&self) -> bool {
        self.watch.unwrap_or(false) || self.presence.unwrap_or(false)
    }
}

/// `?connection_id=` of the channel queries.
#[derive(Debug, Default, Deserialize)]
pub struct ConnectionQuery {
    pub connection_id: Option<String>,
}

/// A user of `POST /users` and `POST /guest`: known fields, read-only ones dropped, the rest
/// custom data.
#[derive(Debug, Deserialize)]
pub struct UserBody {
    id: Option<String>,
    role: Option<String>,
    name: Option<String>,
    image: Option<String>,
    language: Option<String>,
    teams: Option<Vec<String>>,
    #[serde(default, deserialize_with = "de::opt_bool")]
    invisible: Option<bool>,
    #[serde(flatten)]
    _read_only: UserReadOnly,
    #[serde(flatten)]
    custom: Extra,
}

impl UserBody {
    pub fn into_input(self) -> R<offshoot_store::UserInput> {
        let id = ids::parse_user_id(&required(self.id, "id")?)?;
        if self.name.as_ref().is_some_and(|n| n.chars().count() > 1000) {
            return Err(Error::input("user name is longer than 1000 characters"));
        }
        Ok(offshoot_store::UserInput {
            id,
            role: self.role,
            name: self.name,
            image: self.image,
            language: self.language,
            teams: self.teams,
            invisible: self.invisible,
            custom: self.custom.limited("user")?,
        })
    }
}

/// `users` of `POST /users`: an object keyed by user id (Stream's shape) or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Users {
    Map(std::collections::BTreeMap<String, UserBody>),
    List(Vec<UserBody>),
}
