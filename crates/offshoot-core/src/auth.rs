//! Who is calling: the one check of the app key and the token that the REST API (`api_key`
//! query parameter, `Authorization` header) and the WebSocket (`api_key`, `authorization` or
//! the v2 auth frame) both go through, so the two answer a bad credential alike
//! (docs/compatibility.md, "Wire").

use crate::jobs::BoxFuture;
use crate::model::User;
use crate::{ids, time, token, Error, ErrorKind};

/// What a caller presents, from either transport.
#[derive(Debug, Clone, Copy, Default)]
pub struct Credentials<'a> {
    /// The `api_key` query parameter.
    pub api_key: Option<&'a str>,
    /// The raw JWT as Stream sends it; a `Bearer ` prefix is taken off. Empty counts as none.
    pub token: Option<&'a str>,
    /// `stream-auth-type: anonymous`: without a token the caller is anonymous.
    pub anonymous: bool,
    /// The user the caller says it is (a WebSocket's `user_id` / `user_details.id`; REST names
    /// none). A user token must be for this user; a server token acts as this user.
    pub user_id: Option<&'a str>,
}

/// The app's key pair, as the server holds it.
#[derive(Clone, Copy)]
pub struct AppKeys<'a> {
    pub api_key: &'a str,
    pub api_secret: &'a str,
}

/// Who the caller is.
#[derive(Debug, Clone, PartialEq)]
pub enum Caller {
    /// No token, `stream-auth-type: anonymous`.
    Anonymous,
    /// A server token that names no user.
    Server,
    /// A user token, or a server token acting as the user the caller named. `user` is the
    /// stored record, `None` when the user does not exist yet.
    User { id: String, user: Option<Box<User>> },
}

/// What authentication reads: the app's token revocation time and the caller's user record.
pub trait Directory: Sync {
    /// The app's `revoke_tokens_issued_before` (Unix nanoseconds).
    fn revoke_tokens_issued_before(&self) -> BoxFuture<'_, Result<Option<i64>, Error>>;
    fn user<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<User>, Error>>;
}

/// Checks the app key, then the token (signature, `exp` / `nbf` with leeway), the user it
/// names against the one the caller claims, the user id's form, the app's revocation time
/// (`iat` saturating) and the user's ban.
pub async fn authenticate(dir: &impl Directory, app: AppKeys<'_>, creds: Credentials<'_>) -> Result<Caller, Error> {
    match creds.api_key.filter(|k| !k.is_empty()) {
        None => return Err(Error::new(ErrorKind::BadApiKey, "api_key is missing: add ?api_key=<your key> to the request")),
        Some(k) if k != app.api_key => return Err(Error::new(ErrorKind::BadApiKey, format!("api_key {k:?} is not valid"))),
        Some(_) => {}
    }
    let token = creds.token.map(str::trim).map(|t| t.strip_prefix("Bearer ").unwrap_or(t)).filter(|t| !t.is_empty());
    let Some(token) = token else {
        if creds.anonymous {
            return Ok(Caller::Anonymous);
        }
        return Err(Error::new(
            ErrorKind::Auth,
            "the token is missing: send the raw JWT (no Bearer prefix) as the Authorization header (REST) or the authorization \
             parameter (WebSocket), or connect with stream-auth-type: anonymous",
        ));
    };
    let claims = token::verify(token, app.api_secret, time::now() / 1_000_000_000)?;
    let user_id = match (claims.user_id.as_deref(), creds.user_id) {
        (Some(t), Some(claimed)) if t != claimed => {
            return Err(Error::new(ErrorKind::Auth, format!("the token is for user {t:?}, not for {claimed:?}")));
        }
        (Some(id), _) | (None, Some(id)) => ids::parse_user_id(id)?,
        (None, None) => return Ok(Caller::Server),
    };
    if dir.revoke_tokens_issued_before().await?.is_some_and(|before| claims.issued_before(before)) {
        return Err(Error::new(ErrorKind::Auth, "the token was revoked: it was issued before the app's revoke_tokens_issued_before"));
    }
    let user = dir.user(&user_id).await?;
    if user.as_ref().is_some_and(|u| u.banned) {
        return Err(Error::not_allowed(format!("user {user_id:?} is banned")));
    }
    Ok(Caller::User { id: user_id, user: user.map(Box::new) })
}
