//! Query Channels and Query Users filters and sorts as Stream clients send them, parsed into a
//! typed tree that the store turns into SQL. Unknown operators, and values of the wrong type
//! for a built-in field, are refused with an error that names them; a field that is not
//! built in is a custom field.

use crate::error::{Error, Result};
use serde_json::{Map, Value};

/// A value of a condition, typed by the field it applies to.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    Str(String),
    /// Integers, and timestamps as Unix nanoseconds.
    Int(i64),
    Bool(bool),
    /// A custom field's value as the client sent it (string, number, boolean).
    Json(Value),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    Eq(Scalar),
    Ne(Scalar),
    In(Vec<Scalar>),
    Nin(Vec<Scalar>),
    Gt(Scalar),
    Gte(Scalar),
    Lt(Scalar),
    Lte(Scalar),
    Exists(bool),
    /// Matches when a word of the field starts with this text (case-insensitive).
    Autocomplete(String),
}

/// A filter tree over fields `F`.
#[derive(Debug, Clone, PartialEq)]
pub enum Filter<F> {
    And(Vec<Filter<F>>),
    Or(Vec<Filter<F>>),
    Nor(Vec<Filter<F>>),
    Cond(F, Op),
}

/// How a field's values are typed and which operators it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Text,
    Time,
    Int,
    Bool,
    /// Member user ids: `$in` (any of), `$eq` / a list (all of), `$nin` (none of).
    Members,
    Custom,
}

pub trait FilterField: Sized + Clone {
    /// The field a filter key names (`None`: not built in, a custom field).
    fn builtin(key: &str) -> Option<Self>;
    fn custom(key: String) -> Self;
    fn kind(&self) -> Kind;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelField {
    Cid,
    Type,
    Id,
    Members,
    CreatedById,
    CreatedAt,
    UpdatedAt,
    LastMessageAt,
    Frozen,
    Disabled,
    Team,
    Hidden,
    Joined,
    HasUnread,
    MemberCount,
    Custom(String),
}

impl FilterField for ChannelField {
    fn builtin(key: &str) -> Option<Self> {
        Some(match key {
            "cid" => ChannelField::Cid,
            "type" => ChannelField::Type,
            "id" => ChannelField::Id,
            "members" => ChannelField::Members,
            "created_by_id" => ChannelField::CreatedById,
            "created_at" => ChannelField::CreatedAt,
            "updated_at" => ChannelField::UpdatedAt,
            "last_message_at" => ChannelField::LastMessageAt,
            "frozen" => ChannelField::Frozen,
            "disabled" => ChannelField::Disabled,
            "team" => ChannelField::Team,
            "hidden" => ChannelField::Hidden,
            "joined" => ChannelField::Joined,
            "has_unread" => ChannelField::HasUnread,
            "member_count" => ChannelField::MemberCount,
            _ => return None,
        })
    }
    fn custom(key: String) -> Self {
        ChannelField::Custom(key)
    }
    fn kind(&self) -> Kind {
        match self {
            ChannelField::Cid | ChannelField::Type | ChannelField::Id | ChannelField::CreatedById | ChannelField::Team => Kind::Text,
            ChannelField::CreatedAt | ChannelField::UpdatedAt | ChannelField::LastMessageAt => Kind::Time,
            ChannelField::Frozen | ChannelField::Disabled | ChannelField::Hidden | ChannelField::Joined | ChannelField::HasUnread => {
                Kind::Bool
            }
            ChannelField::MemberCount => Kind::Int,
            ChannelField::Members => Kind::Members,
            ChannelField::Custom(_) => Kind::Custom,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserField {
    Id,
    Role,
    Name,
    Banned,
    ShadowBanned,
    CreatedAt,
    UpdatedAt,
    LastActive,
    Custom(String),
}

impl FilterField for UserField {
    fn builtin(key: &str) -> Option<Self> {
        Some(match key {
            "id" => UserField::Id,
            "role" => UserField::Role,
            "name" => UserField::Name,
            "banned" => UserField::Banned,
            "shadow_banned" => UserField::ShadowBanned,
            "created_at" => UserField::CreatedAt,
            "updated_at" => UserField::UpdatedAt,
            "last_active" => UserField::LastActive,
            _ => return None,
        })
    }
    fn custom(key: String) -> Self {
        UserField::Custom(key)
    }
    fn kind(&self) -> Kind {
        match self {
            UserField::Id | UserField::Role | UserField::Name => Kind::Text,
            UserField::Banned | UserField::ShadowBanned => Kind::Bool,
            UserField::CreatedAt | UserField::UpdatedAt | UserField::LastActive => Kind::Time,
            UserField::Custom(_) => Kind::Custom,
        }
    }
}

/// A sort key: a field and its direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sort<F> {
    pub field: F,
    pub desc: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelSortField {
    CreatedAt,
    UpdatedAt,
    LastMessageAt,
    /// `last_message_at`, or `updated_at` for a channel without messages (Stream's default).
    LastUpdated,
    Cid,
    Id,
    Type,
    MemberCount,
    Custom(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserSortField {
    Id,
    Name,
    Role,
    CreatedAt,
    UpdatedAt,
    LastActive,
    Custom(String),
}

/// A custom field name must be a plain key: it is used as a JSON path.
fn custom_key(key: &str) -> Result<String> {
    if key.is_empty() || key.len() > 255 || key.starts_with('$') || key.chars().any(|c| c == '"' || c == '\\' || c.is_control()) {
        return Err(Error::input(format!("filter field {key:?} is not a valid field name")).field("field", key));
    }
    Ok(key.to_string())
}

/// Parses a filter object (`filter_conditions`).
pub fn parse_filter<F: FilterField>(o: &Map<String, Value>) -> Result<Filter<F>> {
    let mut parts = Vec::with_capacity(o.len());
    for (k, v) in o {
        parts.push(match k.as_str() {
            "$and" | "$or" | "$nor" => {
                let Value::Array(items) = v else { return Err(Error::input(format!("{k} takes a list of filters")).field("field", k)) };
                let mut subs = Vec::with_capacity(items.len());
                for item in items {
                    let Value::Object(io) = item else { return Err(Error::input(format!("{k} takes a list of filter objects"))) };
                    subs.push(parse_filter(io)?);
                }
                match k.as_str() {
                    "$and" => Filter::And(subs),
                    "$or" => Filter::Or(subs),
                    _ => Filter::Nor(subs),
                }
            }
            key if key.starts_with('$') => {
                return Err(
                    Error::input(format!("unknown filter operator {key:?}: use $and, $or or $nor at this level")).field("field", key)
                )
            }
            key => {
                let field = match F::builtin(key) {
                    Some(f) => f,
                    None => F::custom(custom_key(key)?),
                };
                parse_field(key, field, v)?
            }
        });
    }
    Ok(if parts.len() == 1 { parts.pop().expect("one part") } else { Filter::And(parts) })
}

fn parse_field<F: FilterField>(key: &str, field: F, v: &Value) -> Result<Filter<F>> {
    let kind = field.kind();
    let ops = match v {
        Value::Object(o) if o.keys().any(|k| k.starts_with('$')) => o,
        // A bare value is `$eq`; a bare list is `$in`, except for members (all of them).
        Value::Array(items) if kind == Kind::Members => {
            return Ok(Filter::Cond(field, Op::Eq(Scalar::Json(Value::Array(items.clone())))));
        }
        Value::Array(items) => return Ok(Filter::Cond(field.clone(), Op::In(scalars(key, kind, items)?))),
        other => return Ok(Filter::Cond(field.clone(), Op::Eq(scalar(key, kind, other)?))),
    };
    let mut conds = Vec::with_capacity(ops.len());
    for (op, arg) in ops {
        let list = |arg: &Value| -> Result<Vec<Scalar>> {
            match arg {
                Value::Array(items) => scalars(key, kind, items),
                _ => Err(Error::input(format!("{op} on {key:?} takes a list")).field("field", key)),
            }
        };
        let parsed = match op.as_str() {
            "$eq" if kind == Kind::Members => match arg {
                Value::Array(_) => Op::Eq(Scalar::Json(arg.clone())),
                other => Op::Eq(Scalar::Json(Value::Array(vec![other.clone()]))),
            },
            "$eq" => Op::Eq(scalar(key, kind, arg)?),
            "$ne" => Op::Ne(scalar(key, kind, arg)?),
            "$in" => Op::In(list(arg)?),
            "$nin" => Op::Nin(list(arg)?),
            "$gt" | "$gte" | "$lt" | "$lte" => {
                if matches!(kind, Kind::Bool | Kind::Members) {
                    return Err(Error::input(format!("{op} does not apply to {key:?}")).field("field", key));
                }
                let s = scalar(key, kind, arg)?;
                match op.as_str() {
                    "$gt" => Op::Gt(s),
                    "$gte" => Op::Gte(s),
                    "$lt" => Op::Lt(s),
                    _ => Op::Lte(s),
                }
            }
            "$exists" => match arg {
                Value::Bool(b) => Op::Exists(*b),
                _ => return Err(Error::input(format!("$exists on {key:?} takes true or false")).field("field", key)),
            },
            "$autocomplete" => match (arg, kind) {
                (Value::String(s), Kind::Text | Kind::Custom) if !s.is_empty() => Op::Autocomplete(s.clone()),
                _ => return Err(Error::input(format!("$autocomplete on {key:?} takes a non-empty string")).field("field", key)),
            },
            other => {
                return Err(Error::input(format!("unknown filter operator {other:?} on {key:?}")).field("field", key));
            }
        };
        conds.push(Filter::Cond(field.clone(), parsed));
    }
    Ok(if conds.len() == 1 { conds.pop().expect("one condition") } else { Filter::And(conds) })
}

fn scalars(key: &str, kind: Kind, items: &[Value]) -> Result<Vec<Scalar>> {
    if items.len() > 1000 {
        return Err(Error::input(format!("a filter on {key:?} takes at most 1,000 values")).field("field", key));
    }
    items.iter().map(|v| scalar(key, kind, v)).collect()
}

fn scalar(key: &str, kind: Kind, v: &Value) -> Result<Scalar> {
    let wrong = |what: &str| Error::input(format!("filter {key:?} takes {what}, not {v}")).field("field", key);
    match kind {
        Kind::Text | Kind::Members => v.as_str().map(|s| Scalar::Str(s.to_string())).ok_or_else(|| wrong("a string")),
        Kind::Time => crate::time::parse(v).map(Scalar::Int).ok_or_else(|| wrong("an RFC 3339 time")),
        Kind::Int => v.as_i64().map(Scalar::Int).ok_or_else(|| wrong("an integer")),
        Kind::Bool => v.as_bool().map(Scalar::Bool).ok_or_else(|| wrong("true or false")),
        Kind::Custom => match v {
            Value::String(_) | Value::Number(_) | Value::Bool(_) => Ok(Scalar::Json(v.clone())),
            _ => Err(wrong("a string, number or boolean")),
        },
    }
}

/// Parses `sort` (`[{field, direction}]` or one object); `direction` below 0 is descending.
pub fn parse_sort<S>(v: Option<&Value>, field: impl Fn(&str) -> Option<S>) -> Result<Vec<Sort<S>>> {
    let items = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a.clone(),
        Some(Value::Object(o)) => vec![Value::Object(o.clone())],
        Some(_) => return Err(Error::input("sort must be a list of {field, direction}")),
    };
    let mut out = Vec::with_capacity(items.len());
    for item in &items {
        let Value::Object(o) = item else { return Err(Error::input("sort must be a list of {field, direction}")) };
        let Some(name) = o.get("field").and_then(Value::as_str) else { return Err(Error::input("every sort entry needs a field")) };
        let desc = match o.get("direction") {
            None | Some(Value::Null) => false,
            Some(d) => d.as_i64().ok_or_else(|| Error::input("sort direction must be 1 or -1"))? < 0,
        };
        let Some(f) = field(name) else { return Err(Error::input(format!("cannot sort on {name:?}")).field("field", name)) };
        out.push(Sort { field: f, desc });
    }
    Ok(out)
}

pub fn channel_sort_field(name: &str) -> Option<ChannelSortField> {
    Some(match name {
        "created_at" => ChannelSortField::CreatedAt,
        "updated_at" => ChannelSortField::UpdatedAt,
        "last_message_at" => ChannelSortField::LastMessageAt,
        "last_updated" => ChannelSortField::LastUpdated,
        "cid" => ChannelSortField::Cid,
        "id" => ChannelSortField::Id,
        "type" => ChannelSortField::Type,
        "member_count" => ChannelSortField::MemberCount,
        other => ChannelSortField::Custom(custom_key(other).ok()?),
    })
}

pub fn user_sort_field(name: &str) -> Option<UserSortField> {
    Some(match name {
        "id" => UserSortField::Id,
        "name" => UserSortField::Name,
        "role" => UserSortField::Role,
        "created_at" => UserSortField::CreatedAt,
        "updated_at" => UserSortField::UpdatedAt,
        "last_active" => UserSortField::LastActive,
        other => UserSortField::Custom(custom_key(other).ok()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn channel(v: Value) -> Result<Filter<ChannelField>> {
        parse_filter(v.as_object().expect("object"))
    }

    #[test]
    fn bare_values_lists_and_operators_parse_into_typed_conditions() {
        assert_eq!(channel(json!({"type": "agent"})).unwrap(), Filter::Cond(ChannelField::Type, Op::Eq(Scalar::Str("agent".into()))));
        assert_eq!(channel(json!({"frozen": {"$ne": true}})).unwrap(), Filter::Cond(ChannelField::Frozen, Op::Ne(Scalar::Bool(true))));
        assert_eq!(
            channel(json!({"created_at": {"$gt": "2024-01-01T00:00:00Z"}})).unwrap(),
            Filter::Cond(ChannelField::CreatedAt, Op::Gt(Scalar::Int(1_704_067_200_000_000_000)))
        );
        assert_eq!(
            channel(json!({"tier": {"$in": ["a", 2]}})).unwrap(),
            Filter::Cond(ChannelField::Custom("tier".into()), Op::In(vec![Scalar::Json(json!("a")), Scalar::Json(json!(2))]))
        );
        let Filter::Or(parts) = channel(json!({"$or": [{"id": "a"}, {"name": {"$autocomplete": "ro"}}]})).unwrap() else { panic!() };
        assert_eq!(parts.len(), 2);
    }

    #[test]
    fn unknown_operators_and_wrongly_typed_values_are_refused_naming_the_field() {
        for bad in [
            json!({"type": {"$regex": "a"}}),
            json!({"$xor": []}),
            json!({"frozen": "yes"}),
            json!({"created_at": {"$gt": "yesterday"}}),
            json!({"frozen": {"$gt": true}}),
            json!({"weird\"key": 1}),
            json!({"tier": {"$eq": {"nested": 1}}}),
        ] {
            let e = channel(bad.clone()).expect_err("refused");
            assert!(e.fields.contains_key("field") || e.message.contains("list"), "{bad}: {e}");
        }
    }

    #[test]
    fn sorts_take_built_in_and_custom_fields_and_refuse_bad_names() {
        let s =
            parse_sort(Some(&json!([{"field": "last_message_at", "direction": -1}, {"field": "priority"}])), channel_sort_field).unwrap();
        assert_eq!(
            s,
            vec![
                Sort { field: ChannelSortField::LastMessageAt, desc: true },
                Sort { field: ChannelSortField::Custom("priority".into()), desc: false }
            ]
        );
        assert!(parse_sort(Some(&json!([{"field": "a\"b"}])), channel_sort_field).is_err());
    }
}
