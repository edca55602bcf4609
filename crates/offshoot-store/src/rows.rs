//! Row decoding: one `sqlx::FromRow` struct per row shape, turned into the domain type it
//! stands for. Columns decode through sqlx's `Any` driver, which knows booleans, integers,
//! floats, text and blobs only: JSON columns are text read through [`Json`], and flags go
//! through [`Flag`] because SQLite keeps them as INTEGER (see the crate doc).

use crate::StoreError;
use offshoot_core::model::{Channel, ChannelType, Custom, ForkStatus, ForkSummary, Member, Message, Reaction, User};
use serde::de::{self, DeserializeOwned, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use sqlx::any::AnyArguments;
use sqlx::any::{AnyTypeInfo, AnyTypeInfoKind};
use sqlx::error::BoxDynError;
use sqlx::{Any, AnyConnection, AssertSqlSafe, Decode, Type, ValueRef};

/// A JSON document kept in a text column.
#[derive(Debug, Clone, Default)]
pub(crate) struct Json<T>(pub T);

impl<T> Type<Any> for Json<T> {
    fn type_info() -> AnyTypeInfo {
        <String as Type<Any>>::type_info()
    }
    fn compatible(ty: &AnyTypeInfo) -> bool {
        <String as Type<Any>>::compatible(ty)
    }
}

impl<'r, T: DeserializeOwned> Decode<'r, Any> for Json<T> {
    fn decode(value: <Any as sqlx::Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
        let text = <&str as Decode<Any>>::decode(value)?;
        Ok(Json(serde_json::from_str(text)?))
    }
}

/// A JSON document kept in a text column, inside a row read as JSON ([`fetch_json`]): the
/// column's text as a JSON string.
impl<'de, T: DeserializeOwned> Deserialize<'de> for Json<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Text<T>(std::marker::PhantomData<T>);
        impl<T: DeserializeOwned> Visitor<'_> for Text<T> {
            type Value = Json<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON document as text")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> std::result::Result<Json<T>, E> {
                serde_json::from_str(text).map(Json).map_err(E::custom)
            }
        }
        d.deserialize_str(Text(std::marker::PhantomData))
    }
}

/// A flag column: BOOLEAN on PostgreSQL, INTEGER 0/1 on SQLite, where sqlx's `Any` driver
/// refuses columns declared BOOLEAN.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Flag(pub bool);

impl Type<Any> for Flag {
    fn type_info() -> AnyTypeInfo {
        <bool as Type<Any>>::type_info()
    }
    fn compatible(ty: &AnyTypeInfo) -> bool {
        <bool as Type<Any>>::compatible(ty) || <i64 as Type<Any>>::compatible(ty)
    }
}

/// A flag inside a row read as JSON ([`fetch_json`]): `0`/`1` as SQLite keeps it, or a boolean.
impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct F;
        impl Visitor<'_> for F {
            type Value = Flag;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a boolean or 0/1")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> std::result::Result<Flag, E> {
                Ok(Flag(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<Flag, E> {
                Ok(Flag(v != 0))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<Flag, E> {
                Ok(Flag(v != 0))
            }
        }
        d.deserialize_any(F)
    }
}

impl<'r> Decode<'r, Any> for Flag {
    fn decode(value: <Any as sqlx::Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
        if value.type_info().kind() == AnyTypeInfoKind::Bool {
            Ok(Flag(<bool as Decode<Any>>::decode(value)?))
        } else {
            Ok(Flag(<i64 as Decode<Any>>::decode(value)? != 0))
        }
    }
}

pub(crate) const USER_COLS: &str =
    "id, role, name, image, language, teams, custom, banned, shadow_banned, invisible, created_at, updated_at, deleted_at, last_active";

/// The `online` column read with [`USER_COLS`] from `app_user`: a visible user with a live
/// WebSocket connection on any process (`presence.rs`). Invisible users appear offline.
pub(crate) const USER_ONLINE: &str =
    "(app_user.invisible = FALSE AND EXISTS (SELECT 1 FROM ws_connection wc WHERE wc.user_id = app_user.id)) AS online";

/// A user row, read as sqlx columns ([`USER_COLS`] and [`USER_ONLINE`]) or as the JSON array of
/// [`user_json`].
#[derive(sqlx::FromRow, Deserialize)]
pub(crate) struct UserRow {
    id: String,
    role: String,
    name: Option<String>,
    image: Option<String>,
    language: Option<String>,
    teams: Json<Vec<String>>,
    custom: Json<Custom>,
    banned: Flag,
    shadow_banned: Flag,
    invisible: Flag,
    created_at: i64,
    updated_at: i64,
    deleted_at: Option<i64>,
    last_active: Option<i64>,
    online: Flag,
}

impl From<UserRow> for User {
    fn from(r: UserRow) -> User {
        User {
            id: r.id,
            role: r.role,
            name: r.name,
            image: r.image,
            language: r.language,
            teams: r.teams.0,
            custom: r.custom.0,
            banned: r.banned.0,
            shadow_banned: r.shadow_banned.0,
            invisible: r.invisible.0,
            created_at: r.created_at,
            updated_at: r.updated_at,
            deleted_at: r.deleted_at,
            last_active: r.last_active,
            online: r.online.0,
        }
    }
}

/// A scalar subquery giving the user whose id is `key` (an SQL expression) as a JSON array of
/// [`USER_COLS`] and its `online` flag, NULL when there is none: a user read inside another
/// statement ([`Nested`]).
pub(crate) fn user_json(backend: crate::Backend, key: &str) -> String {
    let cols: Vec<String> = USER_COLS.split(", ").map(|c| format!("u.{c}")).collect();
    let online = "(u.invisible = FALSE AND EXISTS (SELECT 1 FROM ws_connection wc WHERE wc.user_id = u.id))";
    let array = match backend {
        crate::Backend::Sqlite => format!("json_array({}, {online})", cols.join(", ")),
        crate::Backend::Postgres => format!("CAST(json_build_array({}, {online}) AS TEXT)", cols.join(", ")),
    };
    format!("(SELECT {array} FROM app_user u WHERE u.id = {key})")
}

/// A row read as a JSON array inside another statement ([`user_json`], [`fork_json`]) and turned
/// into its domain value; a value the conversion refuses (a fork status this version does not
/// know) fails the row's decoding, as it fails the row read as columns.
pub(crate) struct Nested<T>(pub T);

/// The domain values [`Nested`] reads: their row shape, and the conversion.
pub(crate) trait FromNested: Sized {
    type Row: DeserializeOwned;
    fn from_row(row: Self::Row) -> Result<Self, StoreError>;
}

impl FromNested for User {
    type Row = UserRow;
    fn from_row(row: UserRow) -> Result<User, StoreError> {
        Ok(User::from(row))
    }
}

impl FromNested for ForkSummary {
    type Row = ForkSummaryRow;
    fn from_row(row: ForkSummaryRow) -> Result<ForkSummary, StoreError> {
        ForkSummary::try_from(row)
    }
}

impl<T> Type<Any> for Nested<T> {
    fn type_info() -> AnyTypeInfo {
        <String as Type<Any>>::type_info()
    }
    fn compatible(ty: &AnyTypeInfo) -> bool {
        <String as Type<Any>>::compatible(ty)
    }
}

impl<'r, T: FromNested> Decode<'r, Any> for Nested<T> {
    fn decode(value: <Any as sqlx::Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
        let Json(row) = <Json<T::Row> as Decode<Any>>::decode(value)?;
        Ok(Nested(T::from_row(row)?))
    }
}

/// A scalar subquery giving the fork summary of channel `cid` (an SQL expression) as a JSON
/// array of [`FORK_COLS`], NULL when the channel is not a fork.
pub(crate) fn fork_json(backend: crate::Backend, cid: &str) -> String {
    let array = match backend {
        crate::Backend::Sqlite => format!("json_array({FORK_COLS})"),
        crate::Backend::Postgres => format!("CAST(json_build_array({FORK_COLS}) AS TEXT)"),
    };
    format!("(SELECT {array} FROM fork f WHERE f.cid = {cid})")
}

pub(crate) const CHANNEL_COLS: &str = "c.cid, c.type, c.id, c.created_by_id, c.team, c.custom, c.frozen, c.disabled, c.created_at, c.updated_at, c.deleted_at, c.truncated_at, c.truncated_by_id, c.last_message_at, c.message_count, (SELECT COUNT(*) FROM member mm WHERE mm.cid = c.cid) AS member_count";

/// The backend a connection speaks.
pub(crate) fn backend_of(conn: &AnyConnection) -> crate::Backend {
    match conn.backend_name() {
        "SQLite" => crate::Backend::Sqlite,
        _ => crate::Backend::Postgres,
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct ChannelRow {
    cid: String,
    #[sqlx(rename = "type")]
    kind: String,
    id: String,
    created_by_id: Option<String>,
    team: Option<String>,
    custom: Json<Custom>,
    frozen: Flag,
    disabled: Flag,
    created_at: i64,
    updated_at: i64,
    deleted_at: Option<i64>,
    truncated_at: Option<i64>,
    truncated_by_id: Option<String>,
    last_message_at: Option<i64>,
    message_count: i64,
    member_count: i64,
}

impl From<ChannelRow> for Channel {
    fn from(r: ChannelRow) -> Channel {
        Channel {
            cid: r.cid,
            kind: r.kind,
            id: r.id,
            created_by_id: r.created_by_id,
            created_by: None,
            team: r.team,
            custom: r.custom.0,
            frozen: r.frozen.0,
            disabled: r.disabled.0,
            created_at: r.created_at,
            updated_at: r.updated_at,
            deleted_at: r.deleted_at,
            truncated_at: r.truncated_at,
            truncated_by_id: r.truncated_by_id,
            last_message_at: r.last_message_at,
            member_count: r.member_count,
            message_count: r.message_count,
            fork: None,
            config: None,
        }
    }
}

pub(crate) const MEMBER_COLS: &str = "cid, user_id, channel_role, custom, created_at, updated_at";

/// A member row, read as sqlx columns or as a JSON array of [`MEMBER_COLS`] ([`fetch_json`]).
#[derive(sqlx::FromRow, Deserialize)]
pub(crate) struct MemberRow {
    cid: String,
    user_id: String,
    channel_role: String,
    custom: Json<Custom>,
    created_at: i64,
    updated_at: i64,
}

impl From<MemberRow> for Member {
    fn from(r: MemberRow) -> Member {
        Member {
            cid: r.cid,
            user_id: r.user_id,
            user: None,
            channel_role: r.channel_role,
            custom: r.custom.0,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

pub(crate) const MESSAGE_COLS: &str = "m.id, m.cid, m.user_id, m.type, m.text, m.html, m.mml, m.command, m.parent_id, m.show_in_channel, m.quoted_message_id, m.attachments, m.mentioned_users, m.restricted_visibility, m.silent, m.i18n, m.custom, m.shadowed, m.pinned, m.pinned_at, m.pinned_by_id, m.pin_expires, m.reply_count, m.deleted_reply_count, m.created_at, m.updated_at, m.deleted_at, m.message_text_updated_at, m.hidden_at, m.source_cid, m.source_message_id";

/// A message row, read as sqlx columns or as a JSON array of [`MESSAGE_COLS`] in this order
/// ([`fetch_messages`]).
#[derive(sqlx::FromRow, Deserialize)]
pub(crate) struct MessageRow {
    id: String,
    cid: String,
    user_id: String,
    #[sqlx(rename = "type")]
    kind: String,
    text: String,
    html: String,
    mml: Option<String>,
    command: Option<String>,
    parent_id: Option<String>,
    show_in_channel: Flag,
    quoted_message_id: Option<String>,
    attachments: Json<Vec<Value>>,
    mentioned_users: Json<Vec<String>>,
    restricted_visibility: Json<Vec<String>>,
    silent: Flag,
    i18n: Option<Json<Custom>>,
    custom: Json<Custom>,
    shadowed: Flag,
    pinned: Flag,
    pinned_at: Option<i64>,
    pinned_by_id: Option<String>,
    pin_expires: Option<i64>,
    reply_count: i64,
    deleted_reply_count: i64,
    created_at: i64,
    updated_at: i64,
    deleted_at: Option<i64>,
    message_text_updated_at: Option<i64>,
    hidden_at: Option<i64>,
    source_cid: Option<String>,
    source_message_id: Option<String>,
}

impl MessageRow {
    /// The message, and whether a rewind hid it.
    pub(crate) fn with_hidden(self) -> (Message, bool) {
        let hidden = self.hidden_at.is_some();
        (self.into(), hidden)
    }
}

impl From<MessageRow> for Message {
    fn from(r: MessageRow) -> Message {
        Message {
            id: r.id,
            cid: r.cid,
            user_id: r.user_id,
            user: None,
            kind: r.kind,
            text: r.text,
            html: r.html,
            mml: r.mml,
            command: r.command,
            parent_id: r.parent_id,
            show_in_channel: r.show_in_channel.0,
            quoted_message_id: r.quoted_message_id,
            quoted_message: None,
            attachments: r.attachments.0,
            mentioned_users: r.mentioned_users.0,
            mentioned_user_objects: Vec::new(),
            restricted_visibility: r.restricted_visibility.0,
            silent: r.silent.0,
            i18n: r.i18n.map(|j| j.0),
            custom: r.custom.0,
            shadowed: r.shadowed.0,
            pinned: r.pinned.0,
            pinned_at: r.pinned_at,
            pinned_by_id: r.pinned_by_id,
            pin_expires: r.pin_expires,
            reply_count: r.reply_count,
            deleted_reply_count: r.deleted_reply_count,
            created_at: r.created_at,
            updated_at: r.updated_at,
            deleted_at: r.deleted_at,
            message_text_updated_at: r.message_text_updated_at,
            reaction_counts: Default::default(),
            reaction_scores: Default::default(),
            latest_reactions: Vec::new(),
            own_reactions: Vec::new(),
            thread_participants: Vec::new(),
            source_cid: r.source_cid,
            source_message_id: r.source_message_id,
        }
    }
}

pub(crate) const REACTION_COLS: &str = "message_id, user_id, type, score, custom, created_at, updated_at";

#[derive(sqlx::FromRow)]
pub(crate) struct ReactionRow {
    message_id: String,
    user_id: String,
    #[sqlx(rename = "type")]
    kind: String,
    score: i64,
    custom: Json<Custom>,
    created_at: i64,
    updated_at: i64,
}

impl From<ReactionRow> for Reaction {
    fn from(r: ReactionRow) -> Reaction {
        Reaction {
            message_id: r.message_id,
            user_id: r.user_id,
            user: None,
            kind: r.kind,
            score: r.score,
            custom: r.custom.0,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

pub(crate) const FORK_COLS: &str = "f.cid, f.source_cid, f.source_message_id, f.status, f.copied_message_count, f.total_message_count, f.truncated, f.oldest_source_message_id, f.failed_reason, f.task_id, f.created_by_id, f.created_at, f.updated_at";

/// A fork row's summary columns ([`FORK_COLS`]), read as sqlx columns or as the JSON array of
/// [`fork_json`].
#[derive(sqlx::FromRow, Deserialize)]
pub(crate) struct ForkSummaryRow {
    cid: String,
    source_cid: String,
    source_message_id: String,
    status: String,
    copied_message_count: i64,
    total_message_count: Option<i64>,
    truncated: Flag,
    oldest_source_message_id: Option<String>,
    failed_reason: Option<String>,
    task_id: Option<String>,
    created_by_id: Option<String>,
    created_at: i64,
    updated_at: i64,
}

impl TryFrom<ForkSummaryRow> for ForkSummary {
    type Error = StoreError;

    fn try_from(r: ForkSummaryRow) -> Result<ForkSummary, StoreError> {
        let Some(status) = ForkStatus::parse(&r.status) else {
            return Err(StoreError::Db(sqlx::Error::Decode(format!("unknown fork status {:?}", r.status).into())));
        };
        Ok(ForkSummary {
            channel_cid: r.cid,
            source_channel_cid: r.source_cid,
            source_message_id: r.source_message_id,
            status,
            copied_message_count: r.copied_message_count,
            total_message_count: r.total_message_count,
            truncated: r.truncated.0,
            oldest_source_message_id: r.oldest_source_message_id,
            failed_reason: r.failed_reason,
            task_id: r.task_id,
            created_by_id: r.created_by_id,
            created_at: r.created_at,
            updated_at: r.updated_at,
        })
    }
}

pub(crate) const CHANNEL_TYPE_COLS: &str = "name, max_message_length, extra, created_at, updated_at";

#[derive(sqlx::FromRow)]
pub(crate) struct ChannelTypeRow {
    name: String,
    max_message_length: i64,
    extra: Json<Custom>,
    created_at: i64,
    updated_at: i64,
}

impl From<ChannelTypeRow> for ChannelType {
    fn from(r: ChannelTypeRow) -> ChannelType {
        ChannelType {
            name: r.name,
            max_message_length: r.max_message_length,
            extra: r.extra.0,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// Rows into domain values.
pub(crate) fn all<R, T: From<R>>(rows: Vec<R>) -> Vec<T> {
    rows.into_iter().map(T::from).collect()
}

/// Messages oldest first, as pages list them (`created_at`, then `id`).
pub(crate) fn oldest_first(msgs: &mut [Message]) {
    msgs.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
}

/// The rows of `sql`, whose select list is `select` (as written in it, `m.id, LENGTH(m.text) AS
/// n, …`: no commas inside an expression) in `T`'s field order, read on SQLite as one JSON array
/// of arrays that SQLite builds. sqlx's SQLite driver hands every row from its worker thread to
/// the task and its `Any` driver converts every column into an owned value: 10 of the 16 ms a
/// 750-message Query Channels page spent in its statement (docs/performance.md, "SQLite through sqlx"); one
/// text value crosses instead. PostgreSQL's rows decode in the task, and building the JSON there
/// was not faster (same place): columns, as usual. The order of the rows is not kept: callers
/// sort.
pub(crate) async fn fetch_json<T>(conn: &mut AnyConnection, sql: &str, select: &str, args: AnyArguments) -> Result<Vec<T>, StoreError>
where
    T: DeserializeOwned + for<'r> sqlx::FromRow<'r, sqlx::any::AnyRow> + Send + Unpin,
{
    if backend_of(conn) != crate::Backend::Sqlite {
        return Ok(sqlx::query_as_with(AssertSqlSafe(sql.to_string()), args).fetch_all(crate::counted(&mut *conn)).await?);
    }
    let values = select.split(", ").map(|c| format!("t.{}", output_name(c))).collect::<Vec<_>>().join(", ");
    let wrapped = format!("SELECT json_group_array(json_array({values})) FROM ({sql}) AS t");
    let text: String = sqlx::query_scalar_with(AssertSqlSafe(wrapped), args).fetch_one(crate::counted(&mut *conn)).await?;
    serde_json::from_str(&text).map_err(|e| StoreError::Db(sqlx::Error::Decode(Box::new(e))))
}

/// The name a select-list item gives its column: its alias, else the column without its table.
fn output_name(item: &str) -> &str {
    match item.rsplit_once(" AS ") {
        Some((_, alias)) => alias,
        None => item.rsplit_once('.').map_or(item, |(_, column)| column),
    }
}

/// The messages of `sql`, a statement whose columns are [`MESSAGE_COLS`], through [`fetch_json`].
pub(crate) async fn fetch_messages(conn: &mut AnyConnection, sql: &str, args: AnyArguments) -> Result<Vec<Message>, StoreError> {
    Ok(all(fetch_json::<MessageRow>(conn, sql, MESSAGE_COLS, args).await?))
}

/// `$first, $first+1, …` for `n` values.
pub(crate) fn placeholders(first: usize, n: usize) -> String {
    (first..first + n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

/// [`placeholders`] for a statement with many parameters, all numbered in order: on SQLite
/// they are anonymous `?` (the i-th is parameter i). SQLite finds a numbered parameter's name
/// by walking the list of every name, for each parameter bound and each one parsed, so binding
/// a statement of n numbered parameters costs n² steps: a group's 1,800 took a third of the
/// writer's time (docs/performance.md, "SQLite through sqlx").
pub(crate) fn many_placeholders(backend: crate::Backend, first: usize, n: usize) -> String {
    match backend {
        crate::Backend::Sqlite => vec!["?"; n].join(", "),
        crate::Backend::Postgres => placeholders(first, n),
    }
}

/// `inner` (which reads the row of `keys` as `k`, with `columns`) once per row of the `VALUES`
/// list `keys`, its rows joined: one statement, planned once (PostgreSQL).
pub(crate) fn lateral(keys: &str, columns: &str, inner: &str) -> String {
    format!("SELECT u.* FROM (VALUES {keys}) AS k({columns}) CROSS JOIN LATERAL ({inner}) AS u")
}

/// The rows of `select_from` (a `SELECT … FROM … WHERE` whose last condition is left open)
/// whose `column` is one of `n` values, the parameters `$1`…`$n`: an `IN` list on SQLite; on
/// PostgreSQL one index lookup per value (a [`lateral`] list, kept from being flattened into a
/// join by `OFFSET 0`). PostgreSQL without statistics for a table (never analysed: autovacuum
/// off, or not yet run) plans an `IN` list of hundreds of values as a scan of the whole table:
/// 64 ms for the thread participants of 100 messages in a table of 147,000, 2.7 ms this way
/// (docs/performance.md, "Query Channels").
pub(crate) fn rows_with_one_of(backend: crate::Backend, select_from: &str, column: &str, n: usize) -> String {
    match backend {
        crate::Backend::Sqlite => format!("{select_from} {column} IN ({})", placeholders(1, n)),
        crate::Backend::Postgres => lateral(&value_rows(backend, 1, n, 1), "v", &format!("{select_from} {column} = k.v OFFSET 0")),
    }
}

/// The rows of a `VALUES` list: `rows` rows of `width` parameters each, numbered from `first`
/// in order (row by row), as [`many_placeholders`] writes them: `(…), (…), …`.
pub(crate) fn value_rows(backend: crate::Backend, first: usize, rows: usize, width: usize) -> String {
    (0..rows).map(|i| format!("({})", many_placeholders(backend, first + i * width, width))).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Backend;

    #[test]
    fn value_rows_number_the_parameters_row_by_row_from_the_first() {
        assert_eq!(value_rows(Backend::Postgres, 2, 3, 2), "($2, $3), ($4, $5), ($6, $7)");
        assert_eq!(value_rows(Backend::Sqlite, 2, 2, 3), "(?, ?, ?), (?, ?, ?)");
    }

    #[test]
    fn rows_with_one_of_is_an_in_list_on_sqlite_and_a_lookup_per_value_on_postgres() {
        let select = "SELECT a, b FROM t WHERE x = 1 AND";
        assert_eq!(rows_with_one_of(Backend::Sqlite, select, "c", 2), "SELECT a, b FROM t WHERE x = 1 AND c IN ($1, $2)");
        assert_eq!(
            rows_with_one_of(Backend::Postgres, select, "c", 2),
            "SELECT u.* FROM (VALUES ($1), ($2)) AS k(v) CROSS JOIN LATERAL (SELECT a, b FROM t WHERE x = 1 AND c = k.v OFFSET 0) AS u"
        );
        assert_eq!(value_rows(Backend::Postgres, 1, 0, 4), "");
    }
}
