//! Query Channels and Query Users filters (`offshoot_core::query`) as SQL conditions with bind
//! values. Field names never reach the SQL text: built-in fields map to fixed column
//! expressions, custom fields are bound as JSON keys; every value is a bind parameter.

use crate::sql::Bind;
use crate::Backend;
use offshoot_core::query::{ChannelField, ChannelSortField, Filter, Op, Scalar, Sort, UserField, UserSortField};
use offshoot_core::Error;
use serde_json::Value;

/// Builds SQL text and its binds; placeholders are numbered as binds are pushed.
pub(crate) struct SqlBuilder {
    pub(crate) backend: Backend,
    pub(crate) binds: Vec<Bind>,
}

impl SqlBuilder {
    pub(crate) fn new(backend: Backend, binds: Vec<Bind>) -> SqlBuilder {
        SqlBuilder { backend, binds }
    }

    /// Pushes a bind and returns its placeholder.
    pub(crate) fn bind(&mut self, b: Bind) -> String {
        self.binds.push(b);
        format!("${}", self.binds.len())
    }

    fn scalar(&mut self, s: &Scalar) -> String {
        match s {
            Scalar::Str(v) => self.bind(Bind::S(v.clone())),
            Scalar::Int(v) => self.bind(Bind::I(*v)),
            Scalar::Bool(true) => "TRUE".into(),
            Scalar::Bool(false) => "FALSE".into(),
            Scalar::Json(v) => self.json_value(v),
        }
    }

    /// A custom field of the JSON text column `col`, as a comparable SQL expression.
    fn custom(&mut self, col: &str, key: &str) -> String {
        match self.backend {
            Backend::Postgres => {
                let k = self.bind(Bind::S(key.to_string()));
                format!("({col}::jsonb -> {k})")
            }
            Backend::Sqlite => {
                let p = self.bind(Bind::S(format!("$.\"{key}\"")));
                format!("({col} ->> {p})")
            }
        }
    }

    /// A custom field as text (for `$autocomplete`).
    fn custom_text(&mut self, col: &str, key: &str) -> String {
        match self.backend {
            Backend::Postgres => {
                let k = self.bind(Bind::S(key.to_string()));
                format!("({col}::jsonb ->> {k})")
            }
            Backend::Sqlite => {
                let p = self.bind(Bind::S(format!("$.\"{key}\"")));
                format!("({col} ->> {p})")
            }
        }
    }

    fn custom_exists(&mut self, col: &str, key: &str) -> String {
        match self.backend {
            Backend::Postgres => {
                let k = self.bind(Bind::S(key.to_string()));
                format!("jsonb_exists({col}::jsonb, {k})")
            }
            Backend::Sqlite => {
                let p = self.bind(Bind::S(format!("$.\"{key}\"")));
                format!("(json_type({col}, {p}) IS NOT NULL)")
            }
        }
    }

    /// A JSON scalar in the form [`SqlBuilder::custom`] compares with.
    fn json_value(&mut self, v: &Value) -> String {
        match self.backend {
            Backend::Postgres => {
                let p = self.bind(Bind::S(v.to_string()));
                format!("CAST({p} AS jsonb)")
            }
            // `->>` gives SQLite values: text, integer, real, and 1/0 for booleans.
            Backend::Sqlite => match v {
                Value::String(s) => self.bind(Bind::S(s.clone())),
                Value::Bool(b) => if *b { "1" } else { "0" }.to_string(),
                Value::Number(n) => match n.as_i64() {
                    Some(i) => self.bind(Bind::I(i)),
                    None => self.bind(Bind::F(n.as_f64().unwrap_or(0.0))),
                },
                _ => "NULL".into(),
            },
        }
    }

    /// `$autocomplete`: some word of `expr` starts with `text` (case-insensitive).
    fn autocomplete(&mut self, expr: &str, text: &str) -> String {
        let escaped = text.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_").to_lowercase();
        let start = self.bind(Bind::S(format!("{escaped}%")));
        let word = self.bind(Bind::S(format!("% {escaped}%")));
        format!("(LOWER({expr}) LIKE {start} ESCAPE '\\' OR LOWER({expr}) LIKE {word} ESCAPE '\\')")
    }

    /// The generic comparison of `expr` (a column or custom field expression) with `op`.
    pub(crate) fn compare(&mut self, expr: &str, op: &Op, nullable: bool) -> String {
        let list = |b: &mut SqlBuilder, items: &[Scalar]| -> String {
            if items.is_empty() {
                return String::new();
            }
            items.iter().map(|s| b.scalar(s)).collect::<Vec<_>>().join(", ")
        };
        match op {
            Op::Eq(s) => format!("{expr} = {}", self.scalar(s)),
            Op::Ne(s) => {
                let v = self.scalar(s);
                if nullable {
                    format!("({expr} <> {v} OR {expr} IS NULL)")
                } else {
                    format!("{expr} <> {v}")
                }
            }
            Op::In(items) => match list(self, items) {
                l if l.is_empty() => "1 = 0".into(),
                l => format!("{expr} IN ({l})"),
            },
            Op::Nin(items) => match list(self, items) {
                l if l.is_empty() => "1 = 1".into(),
                l if nullable => format!("({expr} NOT IN ({l}) OR {expr} IS NULL)"),
                l => format!("{expr} NOT IN ({l})"),
            },
            Op::Gt(s) => format!("{expr} > {}", self.scalar(s)),
            Op::Gte(s) => format!("{expr} >= {}", self.scalar(s)),
            Op::Lt(s) => format!("{expr} < {}", self.scalar(s)),
            Op::Lte(s) => format!("{expr} <= {}", self.scalar(s)),
            Op::Exists(true) => format!("{expr} IS NOT NULL"),
            Op::Exists(false) => format!("{expr} IS NULL"),
            Op::Autocomplete(t) => self.autocomplete(expr, t),
        }
    }

    pub(crate) fn tree<F>(
        &mut self,
        f: &Filter<F>,
        leaf: &mut dyn FnMut(&mut SqlBuilder, &F, &Op) -> Result<String, Error>,
    ) -> Result<String, Error> {
        let join = |b: &mut SqlBuilder,
                    parts: &[Filter<F>],
                    sep: &str,
                    empty: &str,
                    leaf: &mut dyn FnMut(&mut SqlBuilder, &F, &Op) -> Result<String, Error>| {
            if parts.is_empty() {
                return Ok(empty.to_string());
            }
            let mut out = Vec::with_capacity(parts.len());
            for p in parts {
                out.push(b.tree(p, leaf)?);
            }
            Ok::<_, Error>(format!("({})", out.join(sep)))
        };
        match f {
            Filter::And(parts) => join(self, parts, " AND ", "1 = 1", leaf),
            Filter::Or(parts) => join(self, parts, " OR ", "1 = 0", leaf),
            // A condition on a missing field is NULL, not false; `$nor` must still match it.
            Filter::Nor(parts) => Ok(format!("NOT COALESCE({}, FALSE)", join(self, parts, " OR ", "(1 = 0)", leaf)?)),
            Filter::Cond(field, op) => leaf(self, field, op),
        }
    }
}

/// Condition on channel alias `c` for one filter tree. `user` is the caller, for `joined` and
/// `has_unread` (both refused without one).
pub(crate) fn channel_condition(b: &mut SqlBuilder, f: &Filter<ChannelField>, user: Option<&str>) -> Result<String, Error> {
    b.tree(f, &mut |b, field, op| channel_leaf(b, field, op, user))
}

fn channel_leaf(b: &mut SqlBuilder, field: &ChannelField, op: &Op, user: Option<&str>) -> Result<String, Error> {
    let col = |c: &str| c.to_string();
    Ok(match field {
        ChannelField::Cid => b.compare(&col("c.cid"), op, false),
        ChannelField::Type => b.compare(&col("c.type"), op, false),
        ChannelField::Id => b.compare(&col("c.id"), op, false),
        ChannelField::CreatedById => b.compare(&col("c.created_by_id"), op, true),
        ChannelField::Team => b.compare(&col("c.team"), op, true),
        ChannelField::CreatedAt => b.compare(&col("c.created_at"), op, false),
        ChannelField::UpdatedAt => b.compare(&col("c.updated_at"), op, false),
        ChannelField::LastMessageAt => b.compare(&col("c.last_message_at"), op, true),
        ChannelField::Frozen => b.compare(&col("c.frozen"), op, false),
        ChannelField::Disabled => b.compare(&col("c.disabled"), op, false),
        ChannelField::MemberCount => b.compare("(SELECT COUNT(*) FROM member mc WHERE mc.cid = c.cid)", op, false),
        // Offshoot has no hidden channels: `hidden: false` matches every channel.
        ChannelField::Hidden => match op {
            Op::Eq(Scalar::Bool(h)) | Op::Ne(Scalar::Bool(h)) => {
                let hidden_wanted = matches!(op, Op::Eq(_)) == *h;
                if hidden_wanted { "1 = 0" } else { "1 = 1" }.to_string()
            }
            _ => return Err(Error::input("hidden takes true or false").field("field", "hidden")),
        },
        ChannelField::Joined | ChannelField::HasUnread => {
            let Some(uid) = user else {
                return Err(Error::input("filtering on joined or has_unread needs a user: call with a user token or user_id")
                    .field("field", if *field == ChannelField::Joined { "joined" } else { "has_unread" }));
            };
            let want = match op {
                Op::Eq(Scalar::Bool(v)) => *v,
                Op::Ne(Scalar::Bool(v)) => !*v,
                _ => return Err(Error::input("joined and has_unread take true or false").field("field", "joined")),
            };
            let u = b.bind(Bind::S(uid.to_string()));
            let cond = if *field == ChannelField::Joined {
                format!("EXISTS (SELECT 1 FROM member mj WHERE mj.cid = c.cid AND mj.user_id = {u})")
            } else {
                // The counter the `unread` module keeps.
                format!("EXISTS (SELECT 1 FROM member mb WHERE mb.cid = c.cid AND mb.user_id = {u} AND mb.unread_count > 0)")
            };
            if want {
                cond
            } else {
                format!("NOT {cond}")
            }
        }
        ChannelField::Members => members_condition(b, op)?,
        ChannelField::Custom(key) => custom_leaf(b, "c.custom", key, op),
    })
}

fn members_condition(b: &mut SqlBuilder, op: &Op) -> Result<String, Error> {
    let ids = |s: &[Scalar]| -> Result<Vec<String>, Error> {
        s.iter()
            .map(|x| match x {
                Scalar::Str(v) => Ok(v.clone()),
                Scalar::Json(Value::String(v)) => Ok(v.clone()),
                _ => Err(Error::input("members takes user ids").field("field", "members")),
            })
            .collect()
    };
    let any_of = |b: &mut SqlBuilder, ids: &[String]| -> String {
        if ids.is_empty() {
            return "1 = 0".into();
        }
        let ps: Vec<String> = ids.iter().map(|i| b.bind(Bind::S(i.clone()))).collect();
        format!("EXISTS (SELECT 1 FROM member mf WHERE mf.cid = c.cid AND mf.user_id IN ({}))", ps.join(", "))
    };
    Ok(match op {
        Op::In(items) => any_of(b, &ids(items)?),
        Op::Nin(items) => format!("NOT {}", any_of(b, &ids(items)?)),
        Op::Eq(Scalar::Json(Value::Array(items))) => {
            let list: Vec<String> = items
                .iter()
                .map(|v| v.as_str().map(str::to_string).ok_or_else(|| Error::input("members takes user ids")))
                .collect::<Result<_, _>>()?;
            if list.is_empty() {
                return Ok("1 = 0".into());
            }
            let parts: Vec<String> = list
                .iter()
                .map(|uid| {
                    let p = b.bind(Bind::S(uid.clone()));
                    format!("EXISTS (SELECT 1 FROM member ma WHERE ma.cid = c.cid AND ma.user_id = {p})")
                })
                .collect();
            format!("({})", parts.join(" AND "))
        }
        _ => return Err(Error::input("members supports $in, $nin and $eq (a list: all of them)").field("field", "members")),
    })
}

pub(crate) fn custom_leaf(b: &mut SqlBuilder, col: &str, key: &str, op: &Op) -> String {
    match op {
        Op::Exists(e) => {
            let c = b.custom_exists(col, key);
            if *e {
                c
            } else {
                format!("NOT {c}")
            }
        }
        Op::Autocomplete(t) => {
            let expr = b.custom_text(col, key);
            b.autocomplete(&expr, t)
        }
        other => {
            let expr = b.custom(col, key);
            b.compare(&expr, other, true)
        }
    }
}

/// Condition on user alias `u`.
pub(crate) fn user_condition(b: &mut SqlBuilder, f: &Filter<UserField>) -> Result<String, Error> {
    b.tree(f, &mut |b, field, op| {
        Ok(match field {
            UserField::Id => b.compare("u.id", op, false),
            UserField::Role => b.compare("u.role", op, false),
            UserField::Name => b.compare("u.name", op, true),
            UserField::Banned => b.compare("u.banned", op, false),
            UserField::ShadowBanned => b.compare("u.shadow_banned", op, false),
            UserField::CreatedAt => b.compare("u.created_at", op, false),
            UserField::UpdatedAt => b.compare("u.updated_at", op, false),
            UserField::LastActive => b.compare("u.last_active", op, true),
            UserField::Custom(key) => custom_leaf(b, "u.custom", key, op),
        })
    })
}

/// `ORDER BY` terms for channel alias `c` (NULLs last on both engines), ending in `c.cid`.
pub(crate) fn channel_order(b: &mut SqlBuilder, sort: &[Sort<ChannelSortField>]) -> String {
    let mut terms: Vec<String> = sort
        .iter()
        .map(|s| {
            let expr = match &s.field {
                ChannelSortField::CreatedAt => "c.created_at".to_string(),
                ChannelSortField::UpdatedAt => "c.updated_at".to_string(),
                ChannelSortField::LastMessageAt => "c.last_message_at".to_string(),
                ChannelSortField::LastUpdated => "COALESCE(c.last_message_at, c.updated_at)".to_string(),
                ChannelSortField::Cid => "c.cid".to_string(),
                ChannelSortField::Id => "c.id".to_string(),
                ChannelSortField::Type => "c.type".to_string(),
                ChannelSortField::MemberCount => "member_count".to_string(),
                ChannelSortField::Custom(key) => b.custom("c.custom", key),
            };
            format!("{expr} {} NULLS LAST", if s.desc { "DESC" } else { "ASC" })
        })
        .collect();
    terms.push("c.cid ASC".into());
    terms.join(", ")
}

pub(crate) fn user_order(b: &mut SqlBuilder, sort: &[Sort<UserSortField>]) -> String {
    let mut terms: Vec<String> = sort
        .iter()
        .map(|s| {
            let expr = match &s.field {
                UserSortField::Id => "u.id".to_string(),
                UserSortField::Name => "u.name".to_string(),
                UserSortField::Role => "u.role".to_string(),
                UserSortField::CreatedAt => "u.created_at".to_string(),
                UserSortField::UpdatedAt => "u.updated_at".to_string(),
                UserSortField::LastActive => "u.last_active".to_string(),
                UserSortField::Custom(key) => b.custom("u.custom", key),
            };
            format!("{expr} {} NULLS LAST", if s.desc { "DESC" } else { "ASC" })
        })
        .collect();
    terms.push("u.id ASC".into());
    terms.join(", ")
}
