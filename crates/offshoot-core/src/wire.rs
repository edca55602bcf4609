//! Shapes of request fields that the REST API (offshoot-api) and the WebSocket's
//! `user_details` (offshoot-ws) share: Stream's custom data, flat or nested under `custom`, and
//! the user fields the server owns. Request types flatten these (`#[serde(flatten)]`), so the
//! keys a type names decide what is custom data (docs/compatibility.md).

use crate::model::Custom;
use crate::Error;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{Map, Value};

/// Stream's custom data: the keys the enclosing struct does not name, merged with the nested
/// `custom` object (which wins). Flattened last into every type that carries custom data.
#[derive(Debug, Default, Deserialize)]
pub struct Extra {
    custom: Option<Map<String, Value>>,
    #[serde(flatten)]
    flat: Map<String, Value>,
}

impl Extra {
    pub fn into_custom(self) -> Custom {
        let mut out = self.flat;
        out.extend(self.custom.unwrap_or_default());
        out
    }

    /// The custom data, limited like messages' (5 KiB serialised).
    pub fn limited(self, what: &str) -> Result<Custom, Error> {
        let custom = self.into_custom();
        let size = serde_json::to_vec(&custom).map(|v| v.len()).unwrap_or(usize::MAX);
        if size > crate::fork::MAX_CUSTOM_BYTES {
            return Err(Error::input(format!("{what} custom data is {size} bytes; at most {} are allowed", crate::fork::MAX_CUSTOM_BYTES)));
        }
        Ok(custom)
    }
}

impl From<Custom> for Extra {
    fn from(custom: Custom) -> Self {
        Extra { custom: None, flat: custom }
    }
}

/// User fields the server sets (or Offshoot does not store); a client's copy is dropped.
#[derive(Debug, Default, Deserialize)]
#[allow(dead_code)] // named only to keep these keys out of custom data
pub struct UserReadOnly {
    #[serde(default)]
    anon: IgnoredAny,
    #[serde(default)]
    total_unread_count: IgnoredAny,
    #[serde(default)]
    unread_channels: IgnoredAny,
    #[serde(default)]
    unread_count: IgnoredAny,
    #[serde(default)]
    unread_threads: IgnoredAny,
    #[serde(default)]
    channel_mutes: IgnoredAny,
    #[serde(default)]
    mutes: IgnoredAny,
    #[serde(default)]
    devices: IgnoredAny,
    #[serde(default)]
    created_at: IgnoredAny,
    #[serde(default)]
    updated_at: IgnoredAny,
    #[serde(default)]
    deleted_at: IgnoredAny,
    #[serde(default)]
    last_active: IgnoredAny,
    #[serde(default)]
    online: IgnoredAny,
    #[serde(default)]
    banned: IgnoredAny,
    #[serde(default)]
    shadow_banned: IgnoredAny,
    #[serde(default)]
    privacy_settings: IgnoredAny,
    #[serde(default)]
    teams_role: IgnoredAny,
    #[serde(default)]
    blocked_user_ids: IgnoredAny,
    #[serde(default)]
    revoke_tokens_issued_before: IgnoredAny,
}
