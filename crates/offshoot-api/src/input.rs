//! Parsing the polymorphic inputs the three SDKs send (docs/compatibility.md): members as strings
//! or objects, the actor as `user_id`, `user.id` or `created_by.id`, custom data nested under
//! `custom` or flat, `null` for absent. Wrong types are input errors that name the field.

use offshoot_core::model::{Custom, NewMessage, User, Viewer};
use offshoot_core::{ids, time, Error};
use offshoot_store::MemberInput;
use serde_json::{Map, Value};

pub type Obj = Map<String, Value>;
type R<T> = Result<T, Error>;

fn wrong(field: &str, want: &str) -> Error {
    Error::input(format!("field {field:?} must be {want}"))
}

pub fn get<'a>(o: &'a Obj, key: &str) -> Option<&'a Value> {
    o.get(key).filter(|v| !v.is_null())
}

pub fn str_opt(o: &Obj, key: &str) -> R<Option<String>> {
    match get(o, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(wrong(key, "a string")),
    }
}

pub fn str_req(o: &Obj, key: &str) -> R<String> {
    match str_opt(o, key)? {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(Error::input(format!("field {key:?} is required"))),
    }
}

pub fn bool_opt(o: &Obj, key: &str) -> R<Option<bool>> {
    match get(o, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(Value::String(s)) if s == "true" || s == "false" => Ok(Some(s == "true")),
        Some(_) => Err(wrong(key, "a boolean")),
    }
}

pub fn i64_opt(o: &Obj, key: &str) -> R<Option<i64>> {
    match get(o, key) {
        None => Ok(None),
        Some(Value::Number(n)) => n.as_i64().map(Some).ok_or_else(|| wrong(key, "an integer")),
        Some(Value::String(s)) => s.parse().map(Some).map_err(|_| wrong(key, "an integer")),
        Some(_) => Err(wrong(key, "an integer")),
    }
}

pub fn obj_opt<'a>(o: &'a Obj, key: &str) -> R<Option<&'a Obj>> {
    match get(o, key) {
        None => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(_) => Err(wrong(key, "an object")),
    }
}

pub fn arr_opt<'a>(o: &'a Obj, key: &str) -> R<Option<&'a Vec<Value>>> {
    match get(o, key) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(_) => Err(wrong(key, "an array")),
    }
}

pub fn str_list(o: &Obj, key: &str) -> R<Option<Vec<String>>> {
    match arr_opt(o, key)? {
        None => Ok(None),
        Some(a) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(|| wrong(key, "an array of strings")))
            .collect::<R<Vec<_>>>()
            .map(Some),
    }
}

pub fn ts_opt(o: &Obj, key: &str) -> R<Option<i64>> {
    match get(o, key) {
        None => Ok(None),
        Some(v) => time::parse(v).map(Some).ok_or_else(|| wrong(key, "an RFC 3339 timestamp")),
    }
}

/// Custom data: the `custom` object merged with every key not in `known`.
pub fn custom(o: &Obj, known: &[&str]) -> R<Custom> {
    let mut out = Custom::new();
    for (k, v) in o {
        if k == "custom" || known.contains(&k.as_str()) {
            continue;
        }
        out.insert(k.clone(), v.clone());
    }
    if let Some(c) = obj_opt(o, "custom")? {
        for (k, v) in c {
            out.insert(k.clone(), v.clone());
        }
    }
    Ok(out)
}

/// Custom data of users and channels is limited like messages' (5 KiB serialised).
pub fn limited(custom: Custom, what: &str) -> R<Custom> {
    let size = serde_json::to_vec(&custom).map(|v| v.len()).unwrap_or(usize::MAX);
    if size > offshoot_core::fork::MAX_CUSTOM_BYTES {
        return Err(Error::input(format!(
            "{what} custom data is {size} bytes; at most {} are allowed",
            offshoot_core::fork::MAX_CUSTOM_BYTES
        )));
    }
    Ok(custom)
}

/// `user_id`, `user.id` or `user: "id"`, validated.
pub fn actor_id(o: &Obj) -> R<Option<String>> {
    if let Some(id) = str_opt(o, "user_id")? {
        return Ok(Some(ids::parse_user_id(&id)?));
    }
    match get(o, "user") {
        Some(Value::Object(u)) => str_opt(u, "id")?.map(|id| ids::parse_user_id(&id)).transpose(),
        Some(Value::String(s)) => Ok(Some(ids::parse_user_id(s)?)),
        Some(_) => Err(wrong("user", "an object with an id")),
        None => Ok(None),
    }
}

/// The user a write acts as: a client-side caller is itself; a server-side call names one.
pub fn acting_user(viewer: &Viewer, me: Option<&User>, body: &Obj, required: bool) -> R<Option<User>> {
    match viewer {
        Viewer::Server => match actor_id(body)? {
            Some(id) => Ok(Some(User::placeholder(&id, "user"))),
            None if required => Err(Error::input("a server-side request must name the acting user with user_id or user.id")),
            None => Ok(None),
        },
        Viewer::User { id, role } => Ok(Some(me.cloned().unwrap_or_else(|| User::placeholder(id, role)))),
        Viewer::Anonymous { .. } => Err(Error::not_allowed("anonymous users cannot do this")),
    }
}

/// Members as strings or `{user_id, channel_role, custom…}` objects.
pub fn members(v: &Value, field: &str) -> R<Vec<MemberInput>> {
    let Value::Array(a) = v else { return Err(wrong(field, "an array of user ids or member objects")) };
    let mut out: Vec<MemberInput> = Vec::with_capacity(a.len());
    for item in a {
        let m = match item {
            Value::String(s) => MemberInput { user_id: ids::parse_user_id(s)?, ..Default::default() },
            Value::Object(o) => {
                let uid = match str_opt(o, "user_id")? {
                    Some(u) => u,
                    None => match obj_opt(o, "user")? {
                        Some(u) => str_req(u, "id")?,
                        None => return Err(Error::input(format!("every entry of {field:?} needs a user_id"))),
                    },
                };
                MemberInput {
                    user_id: ids::parse_user_id(&uid)?,
                    channel_role: str_opt(o, "channel_role")?,
                    custom: custom(o, &["user_id", "user", "channel_role", "role", "created_at", "updated_at"])?,
                }
            }
            _ => return Err(wrong(field, "an array of user ids or member objects")),
        };
        if !out.iter().any(|x| x.user_id == m.user_id) {
            out.push(m);
        }
    }
    Ok(out)
}

const MESSAGE_KNOWN: &[&str] = &[
    "id",
    "text",
    "html",
    "mml",
    "type",
    "parent_id",
    "show_in_channel",
    "quoted_message_id",
    "attachments",
    "mentioned_users",
    "silent",
    "pinned",
    "pin_expires",
    "pinned_at",
    "restricted_visibility",
    "poll_id",
    "user_id",
    "user",
    "custom",
    "i18n",
    "created_at",
    "updated_at",
    "cid",
    "command",
    "latest_reactions",
    "own_reactions",
    "reaction_counts",
    "reaction_scores",
    "reply_count",
    "deleted_reply_count",
    "shadowed",
    "mentioned_channel",
    "mentioned_here",
    "thread_participants",
    "quoted_message",
    "deleted_at",
    "pinned_by",
    "reaction_groups",
    "message_text_updated_at",
    "member",
    "channel",
    "deleted_for_me",
    "status",
    "args",
    "before_message_send_failed",
    "show_in_channel",
];

pub fn message_custom(o: &Obj) -> R<Custom> {
    custom(o, MESSAGE_KNOWN)
}

/// Escapes text into the minimal HTML Stream renders for plain text.
pub fn html_of(text: &str) -> String {
    if text.is_empty() {
        return String::new();
    }
    let esc = text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    format!("<p>{}</p>\n", esc.replace('\n', "<br/>"))
}

pub fn mentioned(o: &Obj) -> R<Vec<String>> {
    match arr_opt(o, "mentioned_users")? {
        None => Ok(Vec::new()),
        Some(a) => a
            .iter()
            .map(|v| match v {
                Value::String(s) => Ok(s.clone()),
                Value::Object(u) => str_req(u, "id"),
                _ => Err(wrong("mentioned_users", "an array of user ids")),
            })
            .collect(),
    }
}

/// A message body as sent. `max_text` is the channel type's `max_message_length`.
pub fn new_message(o: &Obj, server_side: bool, max_text: i64) -> R<NewMessage> {
    let text = str_opt(o, "text")?.unwrap_or_default();
    if text.chars().count() as i64 > max_text {
        return Err(Error::new(
            offshoot_core::ErrorKind::MessageTooLong,
            format!("message text is longer than {max_text} characters, the channel type's max_message_length"),
        ));
    }
    let id = match str_opt(o, "id")? {
        Some(id) if !id.is_empty() => ids::parse_message_id(&id)?,
        _ => String::new(),
    };
    let kind = str_opt(o, "type")?.unwrap_or_else(|| "regular".into());
    if !matches!(kind.as_str(), "regular" | "system" | "ephemeral" | "error") {
        return Err(Error::input(format!("message type {kind:?} cannot be sent: use regular, system, ephemeral or error"))
            .field("field", "message.type"));
    }
    if kind != "regular" && !server_side {
        return Err(Error::not_allowed(format!("only server-side requests can send {kind} messages")));
    }
    let attachments = match arr_opt(o, "attachments")? {
        None => Vec::new(),
        Some(a) => {
            if a.iter().any(|v| !v.is_object()) {
                return Err(wrong("attachments", "an array of objects"));
            }
            a.clone()
        }
    };
    if attachments.len() > offshoot_core::fork::MAX_ATTACHMENTS {
        return Err(Error::input(format!("a message can have at most {} attachments", offshoot_core::fork::MAX_ATTACHMENTS)));
    }
    let custom = message_custom(o)?;
    if serde_json::to_vec(&custom).map(|v| v.len()).unwrap_or(0) > offshoot_core::fork::MAX_CUSTOM_BYTES {
        return Err(Error::input(format!("message custom data is larger than {} bytes", offshoot_core::fork::MAX_CUSTOM_BYTES)));
    }
    let created_at = ts_opt(o, "created_at")?;
    if created_at.is_some() && !server_side {
        return Err(Error::not_allowed("only server-side requests can set created_at"));
    }
    let i18n = obj_opt(o, "i18n")?.cloned();
    let parent_id = str_opt(o, "parent_id")?.filter(|p| !p.is_empty());
    Ok(NewMessage {
        id,
        user_id: String::new(),
        kind,
        html: str_opt(o, "html")?.filter(|h| !h.is_empty() && server_side).unwrap_or_else(|| html_of(&text)),
        text,
        mml: str_opt(o, "mml")?,
        command: str_opt(o, "command")?,
        show_in_channel: parent_id.is_some() && bool_opt(o, "show_in_channel")?.unwrap_or(false),
        parent_id,
        quoted_message_id: str_opt(o, "quoted_message_id")?.filter(|q| !q.is_empty()),
        attachments,
        mentioned_users: mentioned(o)?,
        restricted_visibility: str_list(o, "restricted_visibility")?.unwrap_or_default(),
        silent: bool_opt(o, "silent")?.unwrap_or(false),
        i18n,
        custom,
        pinned: bool_opt(o, "pinned")?.unwrap_or(false),
        pin_expires: ts_opt(o, "pin_expires")?,
        created_at,
    })
}
