//! The web console: a static page at `/console` and its assets under `/console/…`, embedded in
//! the binary. The page holds no secret: it reads the public API with the token it finds in its
//! URL fragment (README, "Console"). Its responses carry a strict Content-Security-Policy (only
//! this origin's scripts, styles and API; nothing inline), `nosniff` and no referrer.

use crate::ApiError;
use axum::extract::Path;
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// Only this origin's files and API; no inline script or style, no frames, no forms posting away.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The embedded files: name under `/console/`, media type, content.
const ASSETS: &[(&str, &str, &str)] = &[
    ("console.css", "text/css; charset=utf-8", include_str!("../console/console.css")),
    ("console.js", "text/javascript; charset=utf-8", include_str!("../console/console.js")),
    ("api.js", "text/javascript; charset=utf-8", include_str!("../console/api.js")),
    ("view.js", "text/javascript; charset=utf-8", include_str!("../console/view.js")),
    ("icon.svg", "image/svg+xml", include_str!("../console/icon.svg")),
];

const INDEX: &str = include_str!("../console/index.html");

/// `GET /console` (the page) and `GET /console/{file}` (its assets). Public: the page and its
/// assets carry no data; everything the page shows comes from the API with the caller's token.
pub fn router() -> Router {
    Router::new()
        .route("/console", get(index).fallback(crate::method_not_allowed))
        .route("/console/", get(index).fallback(crate::method_not_allowed))
        .route("/console/{file}", get(asset).fallback(crate::method_not_allowed))
}

async fn index() -> Response {
    serve("text/html; charset=utf-8", INDEX)
}

async fn asset(Path(file): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == file) {
        Some((_, media_type, body)) => serve(media_type, body),
        None => ApiError(offshoot_core::Error::not_found(format!("no console file {file:?}"))).into_response(),
    }
}

fn serve(media_type: &'static str, body: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(media_type));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // The files change with the binary only; `no-cache` makes a browser ask again after an upgrade.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(HeaderName::from_static("cross-origin-opener-policy"), HeaderValue::from_static("same-origin"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_embedded_assets_and_nothing_inline() {
        for (name, _, _) in ASSETS.iter().filter(|(n, _, _)| n.ends_with(".js") || n.ends_with(".css")) {
            let in_page = INDEX.contains(&format!("/console/{name}"));
            let imported = ASSETS.iter().any(|(_, _, body)| body.contains(&format!("./{name}")));
            assert!(in_page || imported, "{name} is embedded but nothing loads it");
        }
        assert!(
            !INDEX.contains("<script>") && !INDEX.contains("style=") && !INDEX.contains("<style"),
            "the page has inline script or style"
        );
        let scripts_and_styles = ASSETS.iter().filter(|(n, _, _)| !n.ends_with(".svg")).map(|(_, _, b)| *b);
        for body in scripts_and_styles.chain([INDEX]) {
            assert!(
                !body.contains("http://") && !body.contains("https://") && !body.contains("src=\"//"),
                "an absolute URL in a console file"
            );
        }
    }
}
