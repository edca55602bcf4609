//! Error kinds of the Stream wire protocol. Each kind has one Stream `code` and one HTTP status;
//! the mapping is an exhaustive match so a new kind cannot be forgotten.

use std::collections::BTreeMap;
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400, code 4: the request is malformed or names something invalid.
    Input,
    /// 400, code 20: message text longer than the channel type allows.
    MessageTooLong,
    /// 400, code 21: a reply to a reply.
    MultipleNesting,
    /// 413, code 22: the request body is over the size limit.
    PayloadTooBig,
    /// 401, code 2: missing or unknown `api_key`.
    BadApiKey,
    /// 401, code 5: missing or malformed token.
    Auth,
    /// 401, code 40: the token has expired.
    TokenExpired,
    /// 401, code 41: the token is not valid yet.
    TokenNotValidYet,
    /// 401, code 43: the token signature does not verify.
    TokenSignature,
    /// 403, code 17: the caller may not do this.
    NotAllowed,
    /// 404, code 16: the resource does not exist.
    NotFound,
    /// 409, code 4: `rewind_conflict`.
    RewindConflict,
    /// 400, code 130: `too_many_forks`.
    TooManyForks,
    /// 409, code 127: `fork_point_ambiguous`.
    ForkPointAmbiguous,
    /// 409, code 129: `fork_target_conflict`.
    ForkTargetConflict,
    /// 409, code 131: `fork_in_progress`.
    ForkInProgress,
    /// 409, code 4: `fork_point_generating` (the fork point is still being written).
    ForkPointGenerating,
    /// 405, code 4: the path exists but not with this method.
    MethodNotAllowed,
    /// 503, code -1: the database is unreachable or a transaction kept losing to concurrent
    /// writers; nothing was written and the request can be retried as it is.
    Unavailable,
    /// 500, code -1: something broke inside; the message never leaks details.
    Internal,
}

impl ErrorKind {
    pub fn code(self) -> i64 {
        match self {
            ErrorKind::Input => 4,
            ErrorKind::MessageTooLong => 20,
            ErrorKind::MultipleNesting => 21,
            ErrorKind::PayloadTooBig => 22,
            ErrorKind::BadApiKey => 2,
            ErrorKind::Auth => 5,
            ErrorKind::TokenExpired => 40,
            ErrorKind::TokenNotValidYet => 41,
            ErrorKind::TokenSignature => 43,
            ErrorKind::NotAllowed => 17,
            ErrorKind::NotFound => 16,
            ErrorKind::RewindConflict => 4,
            ErrorKind::TooManyForks => 130,
            ErrorKind::ForkPointAmbiguous => 127,
            ErrorKind::ForkTargetConflict => 129,
            ErrorKind::ForkInProgress => 131,
            ErrorKind::ForkPointGenerating => 4,
            ErrorKind::MethodNotAllowed => 4,
            ErrorKind::Unavailable => -1,
            ErrorKind::Internal => -1,
        }
    }

    pub fn status(self) -> u16 {
        match self {
            ErrorKind::Input => 400,
            ErrorKind::MessageTooLong => 400,
            ErrorKind::MultipleNesting => 400,
            ErrorKind::PayloadTooBig => 413,
            ErrorKind::BadApiKey => 401,
            ErrorKind::Auth => 401,
            ErrorKind::TokenExpired => 401,
            ErrorKind::TokenNotValidYet => 401,
            ErrorKind::TokenSignature => 401,
            ErrorKind::NotAllowed => 403,
            ErrorKind::NotFound => 404,
            ErrorKind::RewindConflict => 409,
            ErrorKind::TooManyForks => 400,
            ErrorKind::ForkPointAmbiguous => 409,
            ErrorKind::ForkTargetConflict => 409,
            ErrorKind::ForkInProgress => 409,
            ErrorKind::ForkPointGenerating => 409,
            ErrorKind::MethodNotAllowed => 405,
            ErrorKind::Unavailable => 503,
            ErrorKind::Internal => 500,
        }
    }
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
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error { kind, message: message.into(), fields: BTreeMap::new() }
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
