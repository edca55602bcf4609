//! Stream's error envelope for every error: `code`, `message`, `StatusCode`, `duration`,
//! `more_info`, `details`, `exception_fields`, `unrecoverable`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use offshoot_core::{Error, ErrorKind};
use serde_json::json;

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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let e = self.0;
        let status = StatusCode::from_u16(e.kind.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if e.kind == ErrorKind::Internal {
            tracing::error!(message = %e.message, "internal error");
        }
        let body = json!({
            "code": e.kind.code(),
            "message": e.message,
            "StatusCode": e.kind.status(),
            "duration": crate::duration(),
            "more_info": "https://getstream.io/chat/docs/api_errors_response",
            "details": [],
            "exception_fields": e.fields,
            "unrecoverable": false,
        });
        let mut response = (status, axum::Json(body)).into_response();
        if e.kind == ErrorKind::Unavailable {
            // Nothing was written: the client may send the same request again.
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        response
    }
}
