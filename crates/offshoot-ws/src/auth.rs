//! Who a new connection is: the app key, the user token (or anonymous), and the user record,
//! created or updated from the `user_details` the client sends, as Stream's `connectUser` does.

use crate::Hub;
use offshoot_core::auth::{self, AppKeys, Caller};
use offshoot_core::model::{Custom, User};
use offshoot_core::wire::{Extra, UserReadOnly};
use offshoot_core::{time, Error};
use offshoot_store::UserInput;
use secrecy::ExposeSecret;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{Map, Value};

/// What a client presents when it connects, from either endpoint.
#[derive(Debug, Default)]
pub(crate) struct Credentials {
    pub api_key: Option<String>,
    pub anonymous: bool,
    pub token: String,
    /// The user the client says it is (`json.user_id` / `user_details.id`).
    pub user_id: Option<String>,
    pub user_details: Option<Map<String, Value>>,
}

/// `user_details` as a client sends them: the fields it may set about itself; the id, role,
/// teams and the fields the server owns are dropped; every other key is custom data.
#[derive(Debug, Default, Deserialize)]
struct UserDetails {
    name: Option<String>,
    image: Option<String>,
    language: Option<String>,
    invisible: Option<bool>,
    #[serde(flatten)]
    _not_settable: NotSettable,
    #[serde(flatten)]
    _read_only: UserReadOnly,
    #[serde(flatten)]
    custom: Extra,
}

/// User fields a client may not set about itself on connect.
#[derive(Debug, Default, Deserialize)]
#[allow(dead_code)] // named only to keep these keys out of custom data
struct NotSettable {
    #[serde(default)]
    id: IgnoredAny,
    #[serde(default)]
    role: IgnoredAny,
    #[serde(default)]
    teams: IgnoredAny,
}

pub(crate) async fn authenticate(hub: &Hub, creds: Credentials) -> Result<User, Error> {
    let presented = auth::Credentials {
        api_key: creds.api_key.as_deref(),
        token: Some(&creds.token),
        anonymous: creds.anonymous,
        user_id: creds.user_id.as_deref(),
    };
    let keys = AppKeys { api_key: &hub.api_key, api_secret: hub.api_secret.expose_secret() };
    match auth::authenticate(&hub.store, keys, presented).await? {
        Caller::Anonymous => {
            // Never trust a client-chosen id here: events addressed to that user would leak.
            let now = time::now();
            let id = uuid::Uuid::new_v4().to_string();
            Ok(User { created_at: now, updated_at: now, ..User::placeholder(&id, "anonymous") })
        }
        Caller::Server => Err(Error::input("user_id is missing: connect with a user token or name the user")),
        Caller::User { id, user } => upsert_on_connect(hub, &id, user.map(|u| *u), creds.user_details.as_ref()).await,
    }
}

/// Creates the user on first connect and applies the fields `user_details` sets. Unlike the
/// upsert endpoint, fields the details leave out keep their stored values, and the role,
/// teams and ban flags are never taken from the client.
async fn upsert_on_connect(hub: &Hub, user_id: &str, existing: Option<User>, details: Option<&Map<String, Value>>) -> Result<User, Error> {
    let details = match details {
        Some(d) => UserDetails::deserialize(Value::Object(d.clone()))
            .map_err(|e| Error::input(format!("user_details is not valid: {e}")).field("field", "user_details"))?,
        None => UserDetails::default(),
    };
    let mut custom: Custom = existing.as_ref().map(|u| u.custom.clone()).unwrap_or_default();
    custom.extend(details.custom.into_custom());
    let input = UserInput {
        id: user_id.to_string(),
        role: None,
        name: details.name.or_else(|| existing.as_ref().and_then(|u| u.name.clone())),
        image: details.image.or_else(|| existing.as_ref().and_then(|u| u.image.clone())),
        language: details.language,
        teams: None,
        invisible: details.invisible,
        custom,
    };
    if let Some(u) = &existing {
        let unchanged = input.name == u.name
            && input.image == u.image
            && input.language.as_ref().is_none_or(|l| Some(l) == u.language.as_ref())
            && input.invisible.is_none_or(|i| i == u.invisible)
            && input.custom == u.custom;
        if unchanged {
            return Ok(u.clone());
        }
    }
    let mut users = hub.store.upsert_users(&[input]).await.map_err(Error::from)?;
    users.pop().ok_or_else(Error::internal)
}
