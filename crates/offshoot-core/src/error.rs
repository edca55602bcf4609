//! Error kinds of the Stream wire protocol, in one table (`error_kinds!`): each kind has one
//! Stream `code`, one HTTP status and at most one fork-document reason.

use std::collections::BTreeMap;
use std::fmt;

/// The error table: each kind with its Stream `code`, HTTP status and, where the fork document
/// names one, the machine-readable `exception_fields.reason`, in one row, so the three cannot
/// drift apart.
macro_rules! error_kinds {
    ($( $(#[$doc:meta])* $kind:ident => ($code:expr, $status:expr, $reason:expr) ),+ $(,)?) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum ErrorKind {
            $( $(#[$doc])* $kind, )+
        }

        impl ErrorKind {
            /// Every kind, in table order.
            pub const ALL: &'static [ErrorKind] = &[$(ErrorKind::$kind),+];

            pub fn code(self) -> i64 {
                match self { $( ErrorKind::$kind => $code, )+ }
            }

            pub fn status(self) -> u16 {
                match self { $( ErrorKind::$kind => $status, )+ }
            }

            /// `exception_fields.reason` of this kind (`None`: no reason of its own).
            pub fn reason(self) -> Option<&'static str> {
                match self { $( ErrorKind::$kind => $reason, )+ }
            }
        }
    };
}

error_kinds! {
    /// The request is malformed or names something invalid.
    Input => (4, 400, None),
    /// Message text longer than the channel type allows.
    MessageTooLong => (20, 400, None),
    /// A reply to a reply.
    MultipleNesting => (21, 400, None),
    /// The request body is over the size limit.
    PayloadTooBig => (22, 413, None),
    /// Missing or unknown `api_key`.
    BadApiKey => (2, 401, None),
    /// Missing or malformed token.
    Auth => (5, 401, None),
    /// The token has expired.
    TokenExpired => (40, 401, None),
    /// The token is not valid yet.
    TokenNotValidYet => (41, 401, None),
    /// The token signature does not verify.
    TokenSignature => (43, 401, None),
    /// The caller may not do this.
    NotAllowed => (17, 403, None),
    /// The resource does not exist.
    NotFound => (16, 404, None),
    /// `expected_last_message_id` of a rewind is not the newest message.
    RewindConflict => (4, 409, Some("rewind_conflict")),
    /// The source already has 100 forks that did not fail.
    TooManyForks => (130, 400, Some("too_many_forks")),
    /// Another visible message has the fork point's `created_at`.
    ForkPointAmbiguous => (127, 409, Some("fork_point_ambiguous")),
    /// The target channel is already a fork of another message.
    ForkTargetConflict => (129, 409, Some("fork_target_conflict")),
    /// The channel is a fork still backfilling.
    ForkInProgress => (131, 409, Some("fork_in_progress")),
    /// `require_finished` and the fork point is still being written.
    ForkPointGenerating => (4, 409, Some("fork_point_generating")),
    /// The fork's target channel exists and is not this fork.
    ForkTargetExists => (4, 400, Some("fork_target_exists")),
    /// A message sent into a backfilling fork has a version 5 UUID id.
    ForkMessageIdReserved => (4, 400, Some("fork_message_id_reserved")),
    /// The path exists but not with this method.
    MethodNotAllowed => (4, 405, None),
    /// The database is unreachable or a transaction kept losing to concurrent writers; nothing
    /// was written and the request can be retried as it is.
    Unavailable => (-1, 503, None),
    /// Something broke inside; the message never leaks details.
    Internal => (-1, 500, None),
}

/// A domain error: a kind, a message for the caller, and Stream's `exception_fields`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind`; its table reason, if any, is set as `exception_fields.reason`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        let mut fields = BTreeMap::new();
        if let Some(r) = kind.reason() {
            fields.insert("reason".to_string(), r.to_string());
        }
        Error { kind, message: message.into(), fields }
    }
    pub fn input(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Input, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    pub fn not_allowed(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotAllowed, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }
    pub fn internal() -> Self {
        Self::new(ErrorKind::Internal, "internal error, the server logged the cause")
    }
    /// Sets `exception_fields.reason`, the machine-readable cause the fork document names.
    pub fn reason(self, reason: &str) -> Self {
        self.field("reason", reason)
    }
    pub fn field(mut self, key: &str, value: impl Into<String>) -> Self {
        self.fields.insert(key.to_string(), value.into());
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_a_stream_code_an_error_status_and_its_reason_set_by_new() {
        for &kind in ErrorKind::ALL {
            assert!((400..600).contains(&kind.status()), "{kind:?}");
            let e = Error::new(kind, "x");
            assert_eq!(e.fields.get("reason").map(String::as_str), kind.reason(), "{kind:?}");
        }
        assert_eq!((ErrorKind::ForkInProgress.code(), ErrorKind::ForkInProgress.status()), (131, 409));
        assert_eq!(ErrorKind::Unavailable.status(), 503);
    }
}
