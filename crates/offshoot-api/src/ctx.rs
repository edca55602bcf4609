//! Request context: who is calling (from `api_key` and the raw-JWT `Authorization` header),
//! which dialect the path speaks, and the body as JSON with Stream-style errors.

use crate::error::ApiError;
use crate::state::ApiState;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use bytes::Bytes;
use offshoot_core::auth::{self, AppKeys, Caller, Credentials};
use offshoot_core::model::{User, Viewer};
use offshoot_core::render::Dialect;
use offshoot_core::{Error, ErrorKind};
use serde_json::{Map, Value};
use std::collections::HashMap;

pub struct Ctx {
    pub viewer: Viewer,
    /// The stored user behind a client-side token (role included).
    pub user: Option<User>,
    pub dialect: Dialect,
    pub query: HashMap<String, String>,
}

impl Ctx {
    pub fn q(&self, key: &str) -> Option<&str> {
        self.query.get(key).map(String::as_str)
    }

    pub fn q_bool(&self, key: &str) -> bool {
        matches!(self.q(key), Some("true") | Some("1"))
    }

    /// A success body: `value` plus `duration`.
    pub fn ok(&self, mut value: Value) -> axum::Json<Value> {
        if let Value::Object(o) = &mut value {
            o.insert("duration".into(), crate::duration().into());
        }
        axum::Json(value)
    }
}

fn parse_query(q: Option<&str>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    if let Some(q) = q {
        for pair in q.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            out.insert(decode(k), decode(v));
        }
    }
    out
}

/// Percent-decoding (and `+` as space) of one query component.
pub fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl FromRequestParts<ApiState> for Ctx {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Self::Rejection> {
        let dialect = parts.extensions.get::<Dialect>().copied().unwrap_or(Dialect::Legacy);
        let query = parse_query(parts.uri.query());
        if let Some(key) = query.iter().find(|(k, v)| k.contains('\0') || v.contains('\0')).map(|(k, _)| k.clone()) {
            return Err(Error::input(format!("query parameter {key:?} contains a NUL character")).field("field", key).into());
        }
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
        let auth_type = header("stream-auth-type").or(query.get("stream-auth-type").map(String::as_str));
        let creds = Credentials {
            api_key: query.get("api_key").map(String::as_str),
            token: header("authorization"),
            anonymous: auth_type.is_some_and(|t| t.eq_ignore_ascii_case("anonymous")),
            user_id: None,
        };
        let keys = AppKeys { api_key: &state.api_key, api_secret: &state.api_secret };
        let (viewer, user) = match auth::authenticate(&state.store, keys, creds).await? {
            Caller::Anonymous => {
                crate::ops::record_caller("anonymous");
                (Viewer::Anonymous { id: offshoot_core::ids::new_id() }, None)
            }
            Caller::Server => {
                crate::ops::record_caller("server");
                (Viewer::Server, None)
            }
            Caller::User { id, user } => {
                crate::ops::record_caller(&id);
                let user = user.unwrap_or_else(|| User::placeholder(&id, "user"));
                (Viewer::User { id, role: user.role.clone() }, Some(user))
            }
        };
        Ok(Ctx { viewer, user, dialect, query })
    }
}

/// The JSON body as an object. Empty bodies are `{}`; bad JSON, non-objects and oversized
/// bodies get Stream errors.
pub struct Body(pub Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError(Error::new(ErrorKind::PayloadTooBig, "the request body is over the size limit"))
            } else {
                ApiError(Error::input(format!("the request body could not be read: {e}")))
            }
        })?;
        if bytes.iter().all(|b| b.is_ascii_whitespace()) {
            return Ok(Body(Map::new()));
        }
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(o)) => {
                if let Some(field) = nul_field(&o) {
                    return Err(Error::input(format!("field {field:?} contains a NUL character (\\u0000), which Offshoot does not store"))
                        .field("field", field)
                        .into());
                }
                Ok(Body(o))
            }
            Ok(Value::Null) => Ok(Body(Map::new())),
            Ok(_) => Err(Error::input("the request body must be a JSON object").into()),
            Err(e) => Err(Error::input(format!("the request body is not valid JSON: {e}")).into()),
        }
    }
}

/// The path (`a.b[2].c`) of the first key or string in `o` that holds a NUL character.
/// PostgreSQL cannot store one in text and SQLite would truncate it in places, so both
/// backends refuse it at the edge alike.
fn nul_field(o: &Map<String, Value>) -> Option<String> {
    fn walk(v: &Value, path: &str) -> Option<String> {
        match v {
            Value::String(s) if s.contains('\0') => Some(path.to_string()),
            Value::Array(a) => a.iter().enumerate().find_map(|(i, v)| walk(v, &format!("{path}[{i}]"))),
            Value::Object(o) => o.iter().find_map(|(k, v)| {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                if k.contains('\0') {
                    Some(p)
                } else {
                    walk(v, &p)
                }
            }),
            _ => None,
        }
    }
    walk(&Value::Object(o.clone()), "")
}

/// Path parameters; a path that does not decode (bad percent-encoding, wrong arity) is a
/// Stream input error instead of axum's plain-text rejection.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        if let Ok(raw) = axum::extract::RawPathParams::from_request_parts(parts, state).await {
            if let Some((name, _)) = raw.iter().find(|(_, v)| v.contains('\0')) {
                return Err(Error::input(format!("path parameter {name:?} contains a NUL character")).field("field", name).into());
            }
        }
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(t)) => Ok(ApiPath(t)),
            Err(e) => Err(Error::input(format!("the request path is not valid: {e}")).into()),
        }
    }
}

/// `/channels/{type}/{id}/…`, validated: a channel type name and a channel id as Stream
/// allows them, and their cid.
pub struct ChannelPath {
    pub kind: String,
    pub id: String,
    pub cid: String,
}

impl<S: Send + Sync> FromRequestParts<S> for ChannelPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let ApiPath((kind, id)) = ApiPath::<(String, String)>::from_request_parts(parts, state).await?;
        let kind = offshoot_core::ids::parse_channel_type(&kind)?;
        let id = offshoot_core::ids::parse_channel_id(&id)?;
        let cid = offshoot_core::ids::cid(&kind, &id);
        Ok(ChannelPath { kind, id, cid })
    }
}
