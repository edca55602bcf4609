//! Identifiers: validation as Stream enforces it, channel cids and fork copy ids.

use crate::error::{Error, Result};
use uuid::Uuid;

pub const MAX_ID_LEN: usize = 64;
pub const MAX_MESSAGE_ID_LEN: usize = 255;

/// Channel ids: letters, digits, `-`, `_`, `!`; at most 64 characters.
pub fn parse_channel_id(id: &str) -> Result<String> {
    if id.is_empty() {
        return Err(Error::input("channel id must not be empty"));
    }
    if id.chars().count() > MAX_ID_LEN {
        return Err(Error::input(format!("channel id is longer than {MAX_ID_LEN} characters")));
    }
    if !id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '!')) {
        return Err(Error::input(format!("channel id {id:?} has illegal characters: use letters, digits, '-', '_' and '!'")));
    }
    Ok(id.to_string())
}

/// Channel type names: lower-case letters, digits, `-` and `_`.
pub fn parse_channel_type(name: &str) -> Result<String> {
    if name.is_empty() || name.len() > MAX_ID_LEN || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_')) {
        return Err(Error::input(format!("channel type {name:?} is not a valid channel type name")));
    }
    Ok(name.to_string())
}

/// User ids: letters, digits and `@ _ - . !`; at most 255 characters.
pub fn parse_user_id(id: &str) -> Result<String> {
    if id.is_empty() {
        return Err(Error::input("user id must not be empty"));
    }
    if id.len() > MAX_MESSAGE_ID_LEN {
        return Err(Error::input("user id is longer than 255 characters"));
    }
    if !id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '@' | '_' | '-' | '.' | '!')) {
        return Err(Error::input(format!("user id {id:?} has illegal characters: use letters, digits and @ _ - . !")));
    }
    Ok(id.to_string())
}

/// Message ids chosen by clients: non-empty, at most 255 characters, no whitespace or control
/// characters (they appear in URL paths).
pub fn parse_message_id(id: &str) -> Result<String> {
    if id.is_empty() {
        return Err(Error::input("message id must not be empty"));
    }
    if id.len() > MAX_MESSAGE_ID_LEN {
        return Err(Error::input("message id is longer than 255 characters"));
    }
    if id.chars().any(|c| c.is_whitespace() || c.is_control() || matches!(c, '/' | '?' | '#' | '%')) {
        return Err(Error::input(format!("message id {id:?} has illegal characters")));
    }
    Ok(id.to_string())
}

pub fn cid(channel_type: &str, id: &str) -> String {
    format!("{channel_type}:{id}")
}

/// Splits `type:id`.
pub fn parse_cid(cid: &str) -> Result<(String, String)> {
    let (t, id) = cid.split_once(':').ok_or_else(|| Error::input(format!("{cid:?} is not a cid of the form type:id")))?;
    Ok((parse_channel_type(t)?, parse_channel_id(id)?))
}

/// The id of the copy of `source_message_id` in the fork `fork_cid`. Public formula, so
/// clients can compute copy ids without a lookup:
/// `uuid_v5(NAMESPACE_URL, "offshoot:fork:{fork_cid}:{source_message_id}")`.
pub fn copy_id(fork_cid: &str, source_message_id: &str) -> String {
    Uuid::new_v5(&Uuid::NAMESPACE_URL, format!("offshoot:fork:{fork_cid}:{source_message_id}").as_bytes()).to_string()
}

/// Whether `id` is a version 5 UUID (the form copy ids take), in any letter case.
pub fn is_v5_uuid(id: &str) -> bool {
    Uuid::try_parse(id).map(|u| u.get_version_num() == 5).unwrap_or(false)
}

pub fn new_id() -> String {
    Uuid::new_v4().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_ids_follow_streams_alphabet() {
        assert!(parse_channel_id("conversation-1_b!x").is_ok());
        assert!(parse_channel_id("has space").is_err());
        assert!(parse_channel_id("a:b").is_err());
        assert!(parse_channel_id(&"x".repeat(64)).is_ok());
        assert!(parse_channel_id(&"x".repeat(65)).is_err());
    }

    #[test]
    fn copy_ids_are_deterministic_v5_uuids() {
        let a = copy_id("agent:b", "m1");
        assert_eq!(a, copy_id("agent:b", "m1"));
        assert_ne!(a, copy_id("agent:c", "m1"));
        assert!(is_v5_uuid(&a));
        assert!(is_v5_uuid(&a.to_uppercase()));
        assert!(!is_v5_uuid(&new_id()));
        assert_eq!(a, Uuid::new_v5(&Uuid::NAMESPACE_URL, b"offshoot:fork:agent:b:m1").to_string());
    }
}
