//! Request context: who is calling (from `api_key` and the raw-JWT `Authorization` header),
//! which dialect the path speaks, and the body as JSON with Stream-style errors.

use crate::error::ApiError;
use crate::state::ApiState;
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::request::Parts;
use bytes::Bytes;
use offshoot_core::auth::{self, AppKeys, Caller, Credentials};
use offshoot_core::model::{User, Viewer};
use offshoot_core::render::Dialect;
use offshoot_core::{Error, ErrorKind};
use secrecy::ExposeSecret;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value};

pub struct Ctx {
    pub viewer: Viewer,
    /// The stored user behind a client-side token (role included).
    pub user: Option<User>,
    pub dialect: Dialect,
    /// Re-signs links to uploads in success bodies (`files.rs`).
    uploads: Option<std::sync::Arc<crate::files::Uploads>>,
}

/// A success body serialised straight from its views, with no `serde_json::Value` tree built
/// in between: the answers to a message sent or updated, which an agent streaming its answer
/// asks for twenty times a second, each carrying the whole text so far (docs/performance.md,
/// "Agent streaming").
pub struct Answer(Vec<u8>);

impl axum::response::IntoResponse for Answer {
    fn into_response(self) -> axum::response::Response {
        ([(axum::http::header::CONTENT_TYPE, "application/json")], self.0).into_response()
    }
}

impl Ctx {
    /// `{"message": …, "duration": …}`, as [`Ctx::ok`] would give it, without the `Value`.
    pub fn message_answer(&self, m: &offshoot_core::model::Message) -> Answer {
        #[derive(serde::Serialize)]
        struct MessageAnswer<'a> {
            message: offshoot_core::render::MessageOut<'a>,
            duration: String,
        }
        let body = MessageAnswer { message: offshoot_core::render::MessageOut(self.dialect, m), duration: crate::duration() };
        Answer(serde_json::to_vec(&body).expect("a view serialises: its keys are strings"))
    }

    /// A success body: `value` plus `duration`.
    pub fn ok(&self, mut value: Value) -> axum::Json<Value> {
        if let Some(u) = &self.uploads {
            crate::files::resign(&mut value, &u.signer);
        }
        if let Value::Object(o) = &mut value {
            o.insert("duration".into(), crate::duration().into());
        }
        axum::Json(value)
    }
}

/// What authentication reads from the query string.
#[derive(Deserialize)]
struct AuthQuery {
    api_key: Option<String>,
    #[serde(rename = "stream-auth-type")]
    auth_type: Option<String>,
}

/// The query string decoded (axum's `Query`), with Stream errors: a parameter holding a NUL
/// character is refused like a body field holding one.
fn query<T: DeserializeOwned>(parts: &Parts) -> Result<T, Error> {
    let pairs = Query::<Vec<(String, String)>>::try_from_uri(&parts.uri).map(|Query(p)| p).unwrap_or_default();
    if let Some((key, _)) = pairs.iter().find(|(k, v)| k.contains('\0') || v.contains('\0')) {
        return Err(Error::input(format!("query parameter {key:?} contains a NUL character")).field("field", key));
    }
    let raw = parts.uri.query().unwrap_or_default();
    serde_path_to_error::deserialize(serde_urlencoded::Deserializer::new(form_urlencoded::parse(raw.as_bytes())))
        .map_err(|e| field_error(&e, "query parameter"))
}

/// The input error of a field that does not deserialize, naming it in `exception_fields`.
fn field_error<E: std::fmt::Display>(e: &serde_path_to_error::Error<E>, what: &str) -> Error {
    let path = e.path().to_string();
    if path == "." {
        return Error::input(format!("the {what} is not valid: {}", e.inner()));
    }
    Error::input(format!("{what} {path:?} is not valid: {}", e.inner())).field("field", path)
}

/// A query string as its request type; a bad parameter is an input error that names it.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(ApiQuery(query(parts)?))
    }
}

impl FromRequestParts<ApiState> for Ctx {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ApiState) -> Result<Self, Self::Rejection> {
        let dialect = parts.extensions.get::<Dialect>().copied().unwrap_or(Dialect::Legacy);
        let q: AuthQuery = query(parts)?;
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
        let auth_type = header("stream-auth-type").or(q.auth_type.as_deref());
        let creds = Credentials {
            api_key: q.api_key.as_deref(),
            token: header("authorization"),
            anonymous: auth_type.is_some_and(|t| t.eq_ignore_ascii_case("anonymous")),
            user_id: None,
        };
        let keys = AppKeys { api_key: &state.api_key, api_secret: state.api_secret.expose_secret() };
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
                let user = user.map_or_else(|| User::placeholder(&id, "user"), |u| *u);
                (Viewer::User { id, role: user.role.clone() }, Some(user))
            }
        };
        Ok(Ctx { viewer, user, dialect, uploads: state.uploads.clone() })
    }
}

/// The JSON body as the endpoint's request type. An empty body or `null` is `{}`; bad JSON,
/// non-objects, oversized bodies and fields that do not fit the type get Stream errors, the
/// last naming the field (`exception_fields.field`).
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError(Error::new(ErrorKind::PayloadTooBig, "the request body is over the size limit"))
            } else {
                ApiError(Error::input(format!("the request body could not be read: {e}")))
            }
        })?;
        let object = if bytes.iter().all(|b| b.is_ascii_whitespace()) {
            Map::new()
        } else {
            match serde_json::from_slice::<Value>(&bytes) {
                Ok(Value::Object(o)) => o,
                Ok(Value::Null) => Map::new(),
                Ok(_) => return Err(Error::input("the request body must be a JSON object").into()),
                Err(e) => return Err(Error::input(format!("the request body is not valid JSON: {e}")).into()),
            }
        };
        if let Some(field) = nul_field(&object) {
            return Err(Error::input(format!("field {field:?} contains a NUL character (\\u0000), which Offshoot does not store"))
                .field("field", field)
                .into());
        }
        match serde_path_to_error::deserialize(Value::Object(object)) {
            Ok(t) => Ok(Body(t)),
            Err(e) => Err(field_error(&e, "field").into()),
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
