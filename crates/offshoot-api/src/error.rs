//! Stream's error envelope for every error: `code`, `message`, `StatusCode`, `duration`,
//! `more_info`, `details`, `exception_fields`, `unrecoverable`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use offshoot_core::render::{error_body, ErrorCode};
use offshoot_core::{Error, ErrorKind};
use std::collections::BTreeMap;

#[derive(Debug)]
pub struct ApiError(pub Error);

pub type ApiResult<T> = Result<T, ApiError>;

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError(e)
    }
}

impl From<offshoot_store::StoreError> for ApiError {
    fn from(e: offshoot_store::StoreError) -> Self {
        ApiError(e.into())
    }
}

/// An error answer with Stream's envelope; the code also goes into the response's extensions
/// for the request log.
pub fn envelope(status: StatusCode, code: i64, message: &str, fields: &BTreeMap<String, String>) -> Response {
    let body = error_body(code, status.as_u16(), message, &crate::duration(), fields);
    let mut response = (status, axum::Json(body)).into_response();
    response.extensions_mut().insert(ErrorCode(code));
    response
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let e = self.0;
        let status = StatusCode::from_u16(e.kind.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if e.kind == ErrorKind::Internal {
            tracing::error!(message = %e.message, "internal error");
        }
        let mut response = envelope(status, e.kind.code(), &e.message, &e.fields);
        if e.kind == ErrorKind::Unavailable {
            // Nothing was written: the client may send the same request again.
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}
