//! Message search (`GET /search?payload=…`) as Stream clients send it, parsed into a typed
//! request: the channel filter (Query Channels' filter tree), the full-text term that ranks the
//! hits, the other message conditions as a filter tree over [`MessageField`], the sort, and
//! the page (an offset, or a cursor from an earlier answer's `next` / `previous`).
//!
//! A `text` condition is a full-text match: `{"text": "hello"}` (what the UI kit's search box
//! sends), `{"text": {"$q": "hello"}}` and the `query` parameter match messages holding every
//! word; `{"text": {"$autocomplete": "hel"}}` matches messages with words starting with each.
//! Words are the runs of letters and digits ([`words`]), matched without case and diacritics
//! by the store's full-text indexes.

use crate::error::{Error, Result};
use crate::query::{self, ChannelField, Filter, FilterField, Kind, Op, Scalar, Sort};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Most results a page holds.
pub const MAX_LIMIT: i64 = 100;
/// Results a page holds when the request names no limit (Stream's default).
pub const DEFAULT_LIMIT: i64 = 100;
/// Largest offset (Stream's): deeper pages are reached with `next`.
pub const MAX_OFFSET: i64 = 1_000;
/// Most channels one search looks in (Stream's).
pub const MAX_CHANNELS: i64 = 500;
/// Longest full-text term, in characters.
pub const MAX_QUERY_CHARS: usize = 1_000;
/// Most words of one full-text term that are matched; the rest are ignored.
pub const MAX_WORDS: usize = 32;

/// A message field of `message_filter_conditions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageField {
    Id,
    /// Full text (see the module doc).
    Text,
    UserId,
    Type,
    ParentId,
    CreatedAt,
    UpdatedAt,
    /// `attachments: {$exists: bool}`.
    Attachments,
    /// The `type` of any of the message's attachments.
    AttachmentType,
    Pinned,
    ReplyCount,
    Custom(String),
}

impl FilterField for MessageField {
    fn builtin(key: &str) -> Option<Self> {
        Some(match key {
            "id" => MessageField::Id,
            "text" => MessageField::Text,
            "user.id" | "user_id" => MessageField::UserId,
            "type" => MessageField::Type,
            "parent_id" => MessageField::ParentId,
            "created_at" => MessageField::CreatedAt,
            "updated_at" => MessageField::UpdatedAt,
            "attachments" => MessageField::Attachments,
            "attachments.type" => MessageField::AttachmentType,
            "pinned" => MessageField::Pinned,
            "reply_count" => MessageField::ReplyCount,
            _ => return None,
        })
    }
    fn custom(key: String) -> Self {
        MessageField::Custom(key)
    }
    fn kind(&self) -> Kind {
        match self {
            MessageField::Id | MessageField::Text | MessageField::UserId | MessageField::Type | MessageField::ParentId => Kind::Text,
            MessageField::AttachmentType => Kind::Text,
            MessageField::CreatedAt | MessageField::UpdatedAt => Kind::Time,
            MessageField::Pinned => Kind::Bool,
            MessageField::ReplyCount => Kind::Int,
            // Only `$exists` is taken (the store refuses the rest, naming the field).
            MessageField::Attachments => Kind::Custom,
            MessageField::Custom(_) => Kind::Custom,
        }
    }
}

/// A full-text term: messages holding every word (or, for `prefix`, a word starting with each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FullText {
    pub words: Vec<String>,
    pub prefix: bool,
}

impl FullText {
    /// The term of `text`; `None` when it holds no word (it then matches nothing).
    pub fn parse(text: &str, prefix: bool) -> Result<Option<FullText>> {
        if text.chars().count() > MAX_QUERY_CHARS {
            return Err(Error::input(format!("a search text takes at most {MAX_QUERY_CHARS} characters")).field("field", "query"));
        }
        let words = words(text);
        Ok((!words.is_empty()).then_some(FullText { words, prefix }))
    }
}

/// Longest word matched, in bytes: PostgreSQL refuses longer words in a `tsquery` (from 2,048
/// bytes) and leaves them out of the indexed documents, so they could never match there.
pub const MAX_WORD_BYTES: usize = 255;

/// The words of `text`: its runs of letters and digits, lower-cased, at most [`MAX_WORDS`];
/// longer words than [`MAX_WORD_BYTES`] are left out. SQLite's `unicode61` tokenizer splits
/// text the same way.
pub fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty() && w.len() <= MAX_WORD_BYTES)
        .take(MAX_WORDS)
        .map(str::to_lowercase)
        .collect()
}

/// What the hits are sorted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageSortField {
    Relevance,
    Id,
    CreatedAt,
    UpdatedAt,
    ReplyCount,
}

pub fn message_sort_field(name: &str) -> Option<MessageSortField> {
    Some(match name {
        "relevance" => MessageSortField::Relevance,
        "id" => MessageSortField::Id,
        "created_at" => MessageSortField::CreatedAt,
        "updated_at" => MessageSortField::UpdatedAt,
        "reply_count" => MessageSortField::ReplyCount,
        _ => return None,
    })
}

/// Where a page starts: after (`Next`) or before (`Previous`) the hit whose sort key is `key`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cursor {
    /// The sort the cursor was made for (it travels with it, as on Stream).
    pub sort: Vec<(MessageSortField, bool)>,
    /// The sort key of the hit the page starts next to: one value per sort field.
    pub key: Vec<Value>,
    pub previous: bool,
}

impl Cursor {
    /// The opaque string clients pass back as `next` (hex of JSON).
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        json.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn decode(s: &str) -> Result<Cursor> {
        let bad = || Error::input("next is not a cursor this server gave").field("field", "next");
        if !s.len().is_multiple_of(2) || s.len() > 8_192 {
            return Err(bad());
        }
        let bytes: Vec<u8> = (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(s.get(i..i + 2).unwrap_or("zz"), 16))
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?;
        let c: Cursor = serde_json::from_slice(&bytes).map_err(|_| bad())?;
        if c.sort.is_empty() || c.sort.len() != c.key.len() || c.sort.last().map(|s| s.0) != Some(MessageSortField::Id) {
            return Err(bad());
        }
        Ok(c)
    }
}

/// The search request as Stream's `payload` holds it.
#[derive(Debug, Default, Deserialize)]
pub struct SearchPayload {
    pub filter_conditions: Option<Value>,
    pub query: Option<Value>,
    pub message_filter_conditions: Option<Value>,
    pub sort: Option<Value>,
    pub limit: Option<Value>,
    pub offset: Option<Value>,
    pub next: Option<Value>,
    pub previous: Option<Value>,
    /// Offshoot's extension: one hit per source message across a source and its forks.
    pub dedupe_copies: Option<Value>,
}

/// A parsed search.
#[derive(Debug, Clone, PartialEq)]
pub struct Search {
    pub channels: Filter<ChannelField>,
    /// The cids the channel filter names (`cid` with `$eq` / `$in` / a list), in the order it
    /// names them: a hit in the first of them is the one kept by `dedupe_copies`.
    pub listed_cids: Vec<String>,
    /// The term that ranks the hits (`query`, or a `text` condition of the top level).
    pub text: Option<FullText>,
    /// Set when the ranking term holds no word: nothing matches.
    pub matches_nothing: bool,
    pub filter: Option<Filter<MessageField>>,
    /// Ends with `id` (the tie-breaker).
    pub sort: Vec<Sort<MessageSortField>>,
    pub limit: i64,
    pub offset: i64,
    pub cursor: Option<Cursor>,
    pub dedupe_copies: bool,
}

fn int(v: &Option<Value>, name: &str) -> Result<Option<i64>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            n.as_i64().map(Some).ok_or_else(|| Error::input(format!("{name} must be an integer")).field("field", name))
        }
        Some(Value::String(s)) => s.parse().map(Some).map_err(|_| Error::input(format!("{name} must be an integer")).field("field", name)),
        Some(_) => Err(Error::input(format!("{name} must be an integer")).field("field", name)),
    }
}

fn object<'a>(v: &'a Option<Value>, name: &str) -> Result<Option<&'a Map<String, Value>>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o)) => Ok(Some(o)),
        Some(_) => Err(Error::input(format!("{name} must be an object")).field("field", name)),
    }
}

/// `{"text": {"$q": …}}` as the bare form `{"text": …}`, anywhere in the tree, so that the
/// generic filter parser reads it as an equality (a full-text match here).
fn normalise_text(o: &Map<String, Value>) -> Map<String, Value> {
    o.iter()
        .map(|(k, v)| {
            let v = match (k.as_str(), v) {
                ("$and" | "$or" | "$nor", Value::Array(items)) => Value::Array(
                    items.iter().map(|i| if let Value::Object(io) = i { Value::Object(normalise_text(io)) } else { i.clone() }).collect(),
                ),
                ("text", Value::Object(ops)) => {
                    Value::Object(ops.iter().map(|(op, a)| (if op == "$q" { "$eq".to_string() } else { op.clone() }, a.clone())).collect())
                }
                _ => v.clone(),
            };
            (k.clone(), v)
        })
        .collect()
}

/// The term of a top-level text condition that can rank hits.
fn ranking_term(f: &Filter<MessageField>) -> Option<(String, bool)> {
    match f {
        Filter::Cond(MessageField::Text, Op::Eq(Scalar::Str(s))) => Some((s.clone(), false)),
        Filter::Cond(MessageField::Text, Op::Autocomplete(s)) => Some((s.clone(), true)),
        _ => None,
    }
}

/// Takes the first top-level text condition out of `filter`, as the ranking term.
fn take_ranking_term(filter: Filter<MessageField>) -> (Option<(String, bool)>, Option<Filter<MessageField>>) {
    if let Some(t) = ranking_term(&filter) {
        return (Some(t), None);
    }
    match filter {
        Filter::And(mut parts) => match parts.iter().position(|p| ranking_term(p).is_some()) {
            Some(i) => {
                let t = ranking_term(&parts.remove(i));
                (t, if parts.is_empty() { None } else { Some(Filter::And(parts)) })
            }
            None => (None, Some(Filter::And(parts))),
        },
        other => (None, Some(other)),
    }
}

/// The cids a channel filter names at its top level, in order.
fn listed_cids(o: &Map<String, Value>) -> Vec<String> {
    let mut out = Vec::new();
    let mut push = |v: &Value| match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => out.extend(items.iter().filter_map(|i| i.as_str().map(str::to_string))),
        _ => {}
    };
    match o.get("cid") {
        Some(Value::Object(ops)) => {
            for op in ["$eq", "$in"] {
                if let Some(v) = ops.get(op) {
                    push(v);
                }
            }
        }
        Some(v) => push(v),
        None => {}
    }
    if let Some(Value::Array(parts)) = o.get("$and") {
        for p in parts {
            if let Value::Object(po) = p {
                out.extend(listed_cids(po));
            }
        }
    }
    out
}

impl Search {
    pub fn parse(p: &SearchPayload) -> Result<Search> {
        let channels = match object(&p.filter_conditions, "filter_conditions")? {
            Some(o) if !o.is_empty() => o,
            _ => return Err(Error::input("filter_conditions is required: the channels to search in").field("field", "filter_conditions")),
        };
        let listed = listed_cids(channels);
        let channel_filter = query::parse_filter::<ChannelField>(channels)?;
        let query_text = match &p.query {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(Error::input("query must be a string").field("field", "query")),
        };
        let filter = match object(&p.message_filter_conditions, "message_filter_conditions")? {
            Some(o) if !o.is_empty() => Some(query::parse_filter::<MessageField>(&normalise_text(o))?),
            _ => None,
        };
        if query_text.is_none() && filter.is_none() {
            return Err(Error::input("either query or message_filter_conditions must be set").field("field", "query"));
        }
        let (term, filter) = match (query_text, filter) {
            (Some(q), f) => (Some((q, false)), f),
            (None, Some(f)) => take_ranking_term(f),
            (None, None) => (None, None),
        };
        let (text, matches_nothing) = match term {
            Some((t, prefix)) => match FullText::parse(&t, prefix)? {
                Some(ft) => (Some(ft), false),
                None => (None, true),
            },
            None => (None, false),
        };
        let limit = int(&p.limit, "limit")?.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(Error::input(format!("limit must be between 1 and {MAX_LIMIT}")).field("field", "limit"));
        }
        let offset = int(&p.offset, "offset")?.unwrap_or(0);
        if !(0..=MAX_OFFSET).contains(&offset) {
            return Err(
                Error::input(format!("offset must be between 0 and {MAX_OFFSET}: use next for deeper pages")).field("field", "offset")
            );
        }
        let cursor = match (&p.next, &p.previous) {
            (Some(Value::String(s)), _) | (None | Some(Value::Null), Some(Value::String(s))) if !s.is_empty() => Some(Cursor::decode(s)?),
            (None | Some(Value::Null) | Some(Value::String(_)), None | Some(Value::Null) | Some(Value::String(_))) => None,
            _ => return Err(Error::input("next must be a string").field("field", "next")),
        };
        let asked_sort = query::parse_sort(p.sort.as_ref(), message_sort_field).map_err(|e| {
            if e.fields.contains_key("field") {
                Error::input(format!("{} (message search sorts on relevance, id, created_at, updated_at and reply_count)", e.message))
                    .field("field", "sort")
            } else {
                e
            }
        })?;
        if offset > 0 && (!asked_sort.is_empty() || cursor.is_some()) {
            return Err(Error::input("a non-zero offset cannot be combined with sort or next: page with next").field("field", "offset"));
        }
        let mut sort = match &cursor {
            Some(c) => c.sort.iter().map(|(field, desc)| Sort { field: *field, desc: *desc }).collect(),
            None if asked_sort.is_empty() => vec![Sort { field: MessageSortField::Relevance, desc: true }],
            None => asked_sort,
        };
        if let Some(i) = sort.iter().position(|s| s.field == MessageSortField::Id) {
            sort.truncate(i + 1);
        } else {
            sort.push(Sort { field: MessageSortField::Id, desc: false });
        }
        let dedupe_copies = match &p.dedupe_copies {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(Error::input("dedupe_copies takes true or false").field("field", "dedupe_copies")),
        };
        Ok(Search {
            channels: channel_filter,
            listed_cids: listed,
            text,
            matches_nothing,
            filter,
            sort,
            limit,
            offset,
            cursor,
            dedupe_copies,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Search> {
        Search::parse(&serde_json::from_value(v).expect("payload"))
    }

    #[test]
    fn the_ui_kit_s_plain_text_is_the_ranking_term_and_its_type_a_condition() {
        let s = parse(json!({
            "filter_conditions": {"members": {"$in": ["amy"]}}, "limit": 10,
            "sort": [{"field": "created_at", "direction": -1}],
            "message_filter_conditions": {"type": "regular", "text": "Café au lait"}
        }))
        .unwrap();
        assert_eq!(s.text, Some(FullText { words: vec!["café".into(), "au".into(), "lait".into()], prefix: false }));
        assert_eq!(s.filter, Some(Filter::And(vec![Filter::Cond(MessageField::Type, Op::Eq(Scalar::Str("regular".into())))])));
        assert_eq!(
            s.sort.iter().map(|s| (s.field, s.desc)).collect::<Vec<_>>(),
            vec![(MessageSortField::CreatedAt, true), (MessageSortField::Id, false)]
        );
    }

    #[test]
    fn q_and_autocomplete_inside_or_stay_conditions() {
        let s = parse(json!({"filter_conditions": {"cid": {"$in": ["agent:b", "agent:a"]}},
            "message_filter_conditions": {"$or": [{"text": {"$q": "hello"}}, {"text": {"$autocomplete": "wor"}}]}}))
        .unwrap();
        assert_eq!(s.text, None);
        assert_eq!(s.listed_cids, vec!["agent:b".to_string(), "agent:a".to_string()]);
        let Some(Filter::Or(parts)) = s.filter else { panic!("{:?}", s.filter) };
        assert_eq!(parts[0], Filter::Cond(MessageField::Text, Op::Eq(Scalar::Str("hello".into()))));
        assert_eq!(parts[1], Filter::Cond(MessageField::Text, Op::Autocomplete("wor".into())));
    }

    #[test]
    fn bad_requests_are_refused_naming_the_field() {
        for (bad, field) in [
            (json!({"query": "x"}), "filter_conditions"),
            (json!({"filter_conditions": {"type": "agent"}}), "query"),
            (json!({"filter_conditions": {"type": "agent"}, "query": "x", "limit": 101}), "limit"),
            (json!({"filter_conditions": {"type": "agent"}, "query": "x", "offset": 1001}), "offset"),
            (json!({"filter_conditions": {"type": "agent"}, "query": "x", "offset": 5, "sort": [{"field": "id"}]}), "offset"),
            (json!({"filter_conditions": {"type": "agent"}, "query": "x", "sort": [{"field": "text"}]}), "sort"),
            (json!({"filter_conditions": {"type": "agent"}, "query": "x", "next": "zz"}), "next"),
            (json!({"filter_conditions": {"type": "agent"}, "query": 5}), "query"),
            (json!({"filter_conditions": {"type": "agent"}, "message_filter_conditions": {"pinned": "yes"}}), "field"),
        ] {
            let e = parse(bad.clone()).expect_err("refused");
            assert!(e.fields.values().any(|v| v == field) || field == "field" && e.fields.contains_key("field"), "{bad}: {e:?}");
        }
    }

    #[test]
    fn a_cursor_round_trips_and_carries_its_sort() {
        let c = Cursor {
            sort: vec![(MessageSortField::Relevance, true), (MessageSortField::Id, false)],
            key: vec![json!(0.25), json!("m1")],
            previous: false,
        };
        let s = parse(json!({"filter_conditions": {"type": "agent"}, "query": "x", "next": c.encode()})).unwrap();
        assert_eq!(s.cursor, Some(c));
        assert_eq!(s.sort.len(), 2);
    }

    #[test]
    fn words_are_runs_of_letters_and_digits() {
        assert_eq!(words("Hello, wörld! it's 2024-01"), vec!["hello", "wörld", "it", "s", "2024", "01"]);
        assert!(words(" !? ").is_empty());
        assert_eq!(words(&format!("short {}", "é".repeat(200))), vec!["short"], "a word PostgreSQL cannot match is left out");
    }
}
