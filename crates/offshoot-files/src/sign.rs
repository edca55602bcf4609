//! Signed links: `PATH?exp=UNIX_SECONDS&sig=HEX`, where `sig` is HMAC-SHA256 with the app's
//! secret over `PATH` (percent-encoded as it appears in the URL), a newline and `exp`. A link
//! works in `<img src>` and downloads without any header, until `exp`; changing a byte of the
//! path, the expiry or the signature makes it fail.

use hmac::{KeyInit, Mac};

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The query parameter that carries the signature.
pub const SIGNATURE_PARAM: &str = "sig";

#[derive(Clone)]
pub struct Signer {
    key: Vec<u8>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(<redacted>)")
    }
}

impl Signer {
    pub fn new(secret: &[u8]) -> Signer {
        Signer { key: secret.to_vec() }
    }

    fn mac(&self, path: &str, exp: i64) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC takes a key of any length");
        mac.update(path.as_bytes());
        mac.update(b"\n");
        mac.update(exp.to_string().as_bytes());
        mac
    }

    /// The signature of `path` until `exp` (Unix seconds), hex.
    pub fn sign(&self, path: &str, exp: i64) -> String {
        hex::encode(self.mac(path, exp).finalize().into_bytes())
    }

    /// `path?exp=…&sig=…`.
    pub fn signed_query(&self, path: &str, exp: i64) -> String {
        format!("exp={exp}&{SIGNATURE_PARAM}={}", self.sign(path, exp))
    }

    /// Whether `sig` signs `path` until `exp` and `exp` is not past `now` (Unix seconds). The
    /// comparison takes the same time whatever the bytes.
    pub fn verify(&self, path: &str, exp: i64, sig: &str, now: i64) -> bool {
        let Ok(raw) = hex::decode(sig) else { return false };
        self.mac(path, exp).verify_slice(&raw).is_ok() && exp >= now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_until_its_expiry_and_not_for_another_path_or_key() {
        let s = Signer::new(b"secret");
        let sig = s.sign("/uploads/a/b.png", 1000);
        assert!(s.verify("/uploads/a/b.png", 1000, &sig, 999));
        assert!(s.verify("/uploads/a/b.png", 1000, &sig, 1000));
        assert!(!s.verify("/uploads/a/b.png", 1000, &sig, 1001), "expired");
        assert!(!s.verify("/uploads/a/c.png", 1000, &sig, 0), "another path");
        assert!(!s.verify("/uploads/a/b.png", 2000, &sig, 0), "another expiry");
        assert!(!Signer::new(b"other").verify("/uploads/a/b.png", 1000, &sig, 0), "another key");
        assert!(!s.verify("/uploads/a/b.png", 1000, "zz", 0), "not hex");
    }
}
