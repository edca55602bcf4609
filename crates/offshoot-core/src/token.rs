//! Stream's JWTs: HS256 signed with the API secret, sent raw in `Authorization`. A token
//! without `user_id` is server-side (getstream 7 signs `{}`; JS and stream-chat sign
//! `{"server": true}`).

use crate::error::{Error, ErrorKind};
use jsonwebtoken::{decode, encode, errors::ErrorKind as JwtKind, Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Claims {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<bool>,
}

impl Claims {
    /// Whether the token was issued before `ns` (Unix nanoseconds), the app's
    /// `revoke_tokens_issued_before`. The conversion of `iat` saturates instead of overflowing.
    pub fn issued_before(&self, ns: i64) -> bool {
        self.iat.is_some_and(|iat| iat.saturating_mul(1_000_000_000) < ns)
    }
}

/// Verifies signature and times (`exp`, `nbf`; with 5 s of leeway) of a raw JWT.
pub fn verify(token: &str, secret: &str, now_secs: i64) -> Result<Claims, Error> {
    let mut v = Validation::new(Algorithm::HS256);
    v.required_spec_claims.clear();
    v.validate_exp = false;
    v.validate_nbf = false;
    v.validate_aud = false;
    let key = DecodingKey::from_secret(secret.as_bytes()).map_err(|_| Error::internal())?;
    let data = decode::<Claims>(token, &key, &v).map_err(|e| match e.kind() {
        JwtKind::InvalidSignature => {
            Error::new(ErrorKind::TokenSignature, "the token signature is invalid: it was not signed with this app's secret")
        }
        JwtKind::InvalidAlgorithm => Error::new(ErrorKind::Auth, "the token must be signed with HS256"),
        _ => Error::new(ErrorKind::Auth, format!("the Authorization header is not a valid JWT: {e}")),
    })?;
    let c = data.claims;
    if c.exp.is_some_and(|exp| exp + 5 < now_secs) {
        return Err(Error::new(ErrorKind::TokenExpired, "the token has expired"));
    }
    if c.nbf.is_some_and(|nbf| nbf > now_secs + 5) {
        return Err(Error::new(ErrorKind::TokenNotValidYet, "the token is not valid yet"));
    }
    if let Some(uid) = &c.user_id {
        if uid.is_empty() {
            return Err(Error::new(ErrorKind::Auth, "the token's user_id is empty"));
        }
    }
    Ok(c)
}

pub fn sign(claims: &Claims, secret: &str) -> String {
    let key = EncodingKey::from_secret(secret.as_bytes()).expect("an HMAC key accepts any secret");
    encode(&Header::new(Algorithm::HS256), claims, &key).expect("HS256 signing cannot fail")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_before_saturates_instead_of_overflowing() {
        let at = |iat| Claims { iat: Some(iat), ..Default::default() };
        assert!(at(1).issued_before(2_000_000_000));
        assert!(!at(3).issued_before(2_000_000_000));
        assert!(!at(i64::MAX).issued_before(i64::MAX - 1));
        assert!(at(i64::MIN).issued_before(0));
        assert!(!Claims::default().issued_before(i64::MAX));
    }

    #[test]
    fn server_and_user_tokens_verify_and_forged_ones_do_not() {
        let server = sign(&Claims::default(), "s");
        assert_eq!(verify(&server, "s", 0).unwrap().user_id, None);
        let user = sign(&Claims { user_id: Some("u1".into()), exp: Some(100), ..Default::default() }, "s");
        assert_eq!(verify(&user, "s", 50).unwrap().user_id.as_deref(), Some("u1"));
        assert_eq!(verify(&user, "s", 200).unwrap_err().kind, ErrorKind::TokenExpired);
        assert_eq!(verify(&user, "other", 50).unwrap_err().kind, ErrorKind::TokenSignature);
        assert_eq!(verify("garbage", "s", 50).unwrap_err().kind, ErrorKind::Auth);
    }
}
