//! File and image uploads as Stream has them: `POST /channels/{type}/{id}/file` and `/image`
//! (the SDKs' multipart form: `file`, optional `user`), `DELETE` of each with `?url=`, and the
//! signed links that serve the stored bytes (`GET /uploads/{id}/{name}?exp=…&sig=…`).
//!
//! The body is streamed from the socket to the storage (`offshoot-files`) and never held whole:
//! the upload routes are exempt from the request-body buffering of every other route
//! ([`streams_body`]) and the byte count is checked as the parts arrive. Links are signed with
//! the app's secret and re-signed whenever a message is read ([`resign`], called by
//! `Ctx::ok`), so a stored link never goes stale for a reader. Which files exist and which
//! messages refer to them is the store's (`files.rs` there); a file is freed when the last
//! message referring to it goes, by the worker's files job.

use crate::channels::load_bare;
use crate::ctx::{ApiPath, ApiQuery, ChannelPath, Ctx};
use crate::error::{ApiError, ApiResult};
use crate::state::ApiState;
use axum::body::Body;
use axum::extract::multipart::{Field, MultipartRejection};
use axum::extract::{Multipart, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use offshoot_core::model::{AppSettings, Viewer};
use offshoot_core::{perm, time, Error, ErrorKind};
use offshoot_files::{Files, FilesError, Signer};
use offshoot_store::{Release, Upload, UPLOAD_PATH};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::time::Duration;

/// Stream's limit on one file: 100 MB.
pub const DEFAULT_MAX_UPLOAD: u64 = 100 * 1024 * 1024;
/// How long a link stays valid after it was (re-)signed: Stream's CDN links last 14 days.
pub const LINK_TTL: Duration = Duration::from_secs(14 * 24 * 3600);
/// The bytes of an image read before its type is decided.
const SNIFF_BYTES: usize = 512;

/// What the upload routes need: the storage, the signer and the limits.
pub struct Uploads {
    pub files: Files,
    pub signer: Signer,
    /// Bytes one file may have at most.
    pub max_bytes: u64,
    /// `scheme://host[:port]` that links start with; without it, the request's `Host`.
    pub public_url: Option<String>,
}

/// Whether a request's body is streamed to its handler instead of read whole first: the two
/// upload routes, in both dialects.
pub fn streams_body(method: &axum::http::Method, path: &str) -> bool {
    if method != axum::http::Method::POST {
        return false;
    }
    let path = path.strip_prefix("/api/v2/chat").unwrap_or(path);
    let parts: Vec<&str> = path.split('/').collect();
    matches!(parts.as_slice(), ["", "channels", _, _, "file" | "image"])
}

/// An app's `file_upload_config` / `image_upload_config` (`PATCH /app`), as Stream has it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UploadConfig {
    #[serde(default)]
    pub allowed_file_extensions: Vec<String>,
    #[serde(default)]
    pub blocked_file_extensions: Vec<String>,
    #[serde(default)]
    pub allowed_mime_types: Vec<String>,
    #[serde(default)]
    pub blocked_mime_types: Vec<String>,
    /// Bytes; 0 is the server's limit. Never above it.
    #[serde(default)]
    pub size_limit: u64,
}

impl UploadConfig {
    /// Extensions lower-case with their dot, MIME types lower-case, duplicates dropped.
    pub fn normalized(&self) -> UploadConfig {
        fn norm(v: &[String], dot: bool) -> Vec<String> {
            let mut out: Vec<String> = v
                .iter()
                .map(|s| s.trim().to_ascii_lowercase())
                .filter(|s| !s.is_empty())
                .map(|s| if dot && !s.starts_with('.') { format!(".{s}") } else { s })
                .collect();
            out.sort();
            out.dedup();
            out
        }
        UploadConfig {
            allowed_file_extensions: norm(&self.allowed_file_extensions, true),
            blocked_file_extensions: norm(&self.blocked_file_extensions, true),
            allowed_mime_types: norm(&self.allowed_mime_types, false),
            blocked_mime_types: norm(&self.blocked_mime_types, false),
            size_limit: self.size_limit,
        }
    }

    /// Whether a file named `name` of type `mime` passes the lists: an allow list, when not
    /// empty, must name it; a block list must not.
    fn admits(&self, name: &str, mime: &str) -> Result<(), Error> {
        let ext = extension(name);
        let mime = mime.to_ascii_lowercase();
        let listed = |list: &[String], v: &str| list.iter().any(|x| x == v);
        if listed(&self.blocked_file_extensions, &ext)
            || (!self.allowed_file_extensions.is_empty() && !listed(&self.allowed_file_extensions, &ext))
        {
            return Err(Error::input(format!("file extension {ext:?} is not allowed")).field("field", "file"));
        }
        if listed(&self.blocked_mime_types, &mime) || (!self.allowed_mime_types.is_empty() && !listed(&self.allowed_mime_types, &mime)) {
            return Err(Error::input(format!("file type {mime:?} is not allowed")).field("field", "file"));
        }
        Ok(())
    }
}

/// The app's stored config of `key`, or the empty one.
fn stored_config(s: &AppSettings, key: &str) -> UploadConfig {
    s.extra.get(key).and_then(|v| serde_json::from_value(v.clone()).ok()).unwrap_or_default()
}

/// Puts both upload configs into a rendered app, `size_limit` filled with the limit in force.
pub(crate) fn render_upload_configs(app: &mut Value, s: &AppSettings, uploads: Option<&Uploads>) {
    let max = uploads.map_or(0, |u| u.max_bytes);
    for key in ["file_upload_config", "image_upload_config"] {
        let mut c = stored_config(s, key);
        c.size_limit = effective_limit(&c, max);
        if let Value::Object(o) = app {
            o.insert(key.into(), serde_json::to_value(c).unwrap_or_else(|_| json!({})));
        }
    }
}

fn effective_limit(c: &UploadConfig, max: u64) -> u64 {
    if c.size_limit == 0 {
        max
    } else {
        c.size_limit.min(max)
    }
}

/// `.ext` of a file name, lower-case (empty when it has none).
fn extension(name: &str) -> String {
    match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() && !ext.is_empty() => format!(".{}", ext.to_ascii_lowercase()),
        _ => String::new(),
    }
}

/// A file name safe in a URL path and a `Content-Disposition` header: letters, digits, `.`,
/// `-`, `_`; at most 100 bytes; never empty.
fn safe_name(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let mut out: String = base.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' }).collect();
    while out.starts_with('.') {
        out.remove(0);
    }
    if out.len() > 100 {
        let ext = extension(&out);
        out.truncate(100 - ext.len().min(20));
        out.push_str(&ext[..ext.len().min(20)]);
    }
    if out.is_empty() {
        "file".into()
    } else {
        out
    }
}

/// The MIME type a file's extension suggests, for a file part sent without one.
fn mime_of(name: &str) -> &'static str {
    match extension(name).as_str() {
        ".txt" => "text/plain",
        ".md" => "text/markdown",
        ".csv" => "text/csv",
        ".json" => "application/json",
        ".pdf" => "application/pdf",
        ".zip" => "application/zip",
        ".png" => "image/png",
        ".jpg" | ".jpeg" => "image/jpeg",
        ".gif" => "image/gif",
        ".webp" => "image/webp",
        ".svg" => "image/svg+xml",
        ".mp3" => "audio/mpeg",
        ".mp4" => "video/mp4",
        ".html" | ".htm" => "text/html",
        _ => "application/octet-stream",
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Image,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::File => "file",
            Kind::Image => "image",
        }
    }
    fn config_key(self) -> &'static str {
        match self {
            Kind::File => "file_upload_config",
            Kind::Image => "image_upload_config",
        }
    }
}

fn uploads_of(st: &ApiState) -> Result<&Uploads, Error> {
    st.uploads.as_deref().ok_or_else(|| Error::new(ErrorKind::NotAllowed, "uploads are not enabled on this server"))
}

/// `POST /channels/{type}/{id}/file`.
pub async fn upload_file(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    headers: HeaderMap,
    form: Result<Multipart, MultipartRejection>,
) -> ApiResult<Json<Value>> {
    upload(st, ctx, path, headers, form, Kind::File).await
}

/// `POST /channels/{type}/{id}/image`.
pub async fn upload_image(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    headers: HeaderMap,
    form: Result<Multipart, MultipartRejection>,
) -> ApiResult<Json<Value>> {
    upload(st, ctx, path, headers, form, Kind::Image).await
}

/// The stored file of an upload in progress, removed again if the upload fails after it.
struct Stored {
    key: String,
    name: String,
    mime: String,
    size: u64,
}

async fn upload(
    st: ApiState,
    ctx: Ctx,
    path: ChannelPath,
    headers: HeaderMap,
    form: Result<Multipart, MultipartRejection>,
    kind: Kind,
) -> ApiResult<Json<Value>> {
    let uploads = uploads_of(&st)?;
    let ch = load_bare(&st, &path.cid).await?;
    match &ctx.viewer {
        Viewer::Server => {}
        Viewer::User { id, .. } => {
            let member = st.store.is_member(&ch.cid, id).await?;
            if !perm::may_write(&ctx.viewer, member) {
                return Err(
                    Error::not_allowed(format!("you are not allowed to upload to channel {:?}: only its members can", ch.cid)).into()
                );
            }
        }
        Viewer::Anonymous { .. } => return Err(Error::not_allowed("anonymous users cannot upload files").into()),
    }
    let mut form = form.map_err(|e| Error::input(format!("the request is not a multipart form: {}", e.body_text())))?;
    let settings = st.store.app_settings().await?;
    let config = stored_config(&settings, kind.config_key());
    let limit = effective_limit(&config, uploads.max_bytes);
    let id = uuid::Uuid::new_v4().simple().to_string();
    let mut stored: Option<Stored> = None;
    let mut user: Option<String> = None;
    let outcome: Result<(), ApiError> = async {
        while let Some(field) = form.next_field().await.map_err(|e| multipart_error(&e, limit))? {
            match field.name() {
                Some("file") if stored.is_none() => {
                    stored = Some(store_field(uploads, field, &id, kind, &config, limit).await?);
                }
                Some("file") => return Err(Error::input("the form has more than one file").field("field", "file").into()),
                Some("user") => {
                    let mut field = field;
                    let mut text = Vec::new();
                    while let Some(c) = field.chunk().await.map_err(|e| multipart_error(&e, limit))? {
                        text.extend_from_slice(&c);
                        if text.len() > 64 * 1024 {
                            return Err(Error::input("the user part is too large").field("field", "user").into());
                        }
                    }
                    user = Some(parse_user(&String::from_utf8_lossy(&text))?);
                }
                // Other fields (the SDKs send none) are read and dropped.
                _ => {
                    let mut field = field;
                    while field.chunk().await.map_err(|e| multipart_error(&e, limit))?.is_some() {}
                }
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = outcome {
        if let Some(s) = &stored {
            let _ = uploads.files.delete(&s.key).await;
        }
        if e.0.kind == ErrorKind::PayloadTooBig {
            // Read the rest of the body away (bounded), so the client reads the answer instead
            // of a reset connection.
            let _ = tokio::time::timeout(Duration::from_secs(10), async {
                while let Ok(Some(mut f)) = form.next_field().await {
                    while let Ok(Some(_)) = f.chunk().await {}
                }
            })
            .await;
        }
        return Err(e);
    }
    let Some(s) = stored else {
        return Err(Error::input("the form has no file part named \"file\"").field("field", "file").into());
    };
    let owner = match (&ctx.viewer, user) {
        (Viewer::User { id, .. }, _) => id.clone(),
        (_, Some(u)) => u,
        _ => String::new(),
    };
    let record = Upload {
        id: id.clone(),
        object_key: s.key.clone(),
        cid: ch.cid.clone(),
        user_id: owner,
        kind: kind.name().into(),
        name: s.name.clone(),
        mime_type: s.mime.clone(),
        size: s.size as i64,
        referenced: false,
        created_at: time::now(),
    };
    if let Err(e) = st.store.record_upload(&record).await {
        let _ = uploads.files.delete(&s.key).await;
        return Err(e.into());
    }
    let url = format!("{}{}", base_url(uploads, &headers), signed_path(&uploads.signer, &link_path(&id, &s.name)));
    let mut body = json!({"file": url});
    if kind == Kind::Image {
        body["thumb_url"] = json!(url);
    }
    Ok(ctx.ok(body))
}

/// Streams the `file` part to storage after checking its name and type.
async fn store_field(
    uploads: &Uploads,
    mut field: Field<'_>,
    id: &str,
    kind: Kind,
    config: &UploadConfig,
    limit: u64,
) -> ApiResult<Stored> {
    let name = safe_name(field.file_name().unwrap_or("file"));
    let declared = field.content_type().map(|m| m.split(';').next().unwrap_or(m).trim().to_ascii_lowercase());
    // The first bytes decide an image's type; they are kept and sent on first.
    let mut head = Vec::new();
    while head.len() < SNIFF_BYTES {
        match field.chunk().await.map_err(|e| multipart_error(&e, limit))? {
            Some(c) => head.extend_from_slice(&c),
            None => break,
        }
    }
    let mime = match kind {
        Kind::Image => match offshoot_files::sniff_image(&head) {
            Some(m) => m.to_string(),
            None => {
                return Err(Error::input(format!(
                    "the file is not an image of a supported type ({})",
                    offshoot_files::IMAGE_MIME_TYPES.join(", ")
                ))
                .field("field", "file")
                .into())
            }
        },
        Kind::File => declared.filter(|m| !m.is_empty() && m.contains('/')).unwrap_or_else(|| mime_of(&name).to_string()),
    };
    config.admits(&name, &mime)?;
    let key = format!("{id}/{name}");
    let first = stream::iter(Some(Ok::<Bytes, axum::extract::multipart::MultipartError>(Bytes::from(head))));
    let rest = stream::unfold(field, |mut f| async move {
        match f.chunk().await {
            Ok(Some(c)) => Some((Ok(c), f)),
            Ok(None) => None,
            Err(e) => Some((Err(e), f)),
        }
    });
    match uploads.files.put_stream(&key, first.chain(rest), limit).await {
        Ok(size) => Ok(Stored { key, name, mime, size }),
        Err(FilesError::TooLarge { limit }) => Err(too_large(limit).into()),
        Err(FilesError::Body(e)) => Err(Error::input(format!("the upload could not be read: {e}")).into()),
        Err(e) => {
            tracing::error!(error = %e, "storing an upload failed");
            Err(Error::internal().into())
        }
    }
}

fn too_large(limit: u64) -> Error {
    Error::new(ErrorKind::PayloadTooBig, format!("the file is larger than the upload limit of {limit} bytes")).field("field", "file")
}

fn multipart_error(e: &axum::extract::multipart::MultipartError, limit: u64) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return too_large(limit).into();
    }
    Error::input(format!("the multipart form could not be read: {}", e.body_text())).into()
}

/// The `user` part: a user object as JSON (`{"id": …}`, the SDKs' form) or a bare id.
fn parse_user(text: &str) -> Result<String, Error> {
    let id = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(o)) => o.get("id").and_then(Value::as_str).map(str::to_string),
        Ok(Value::String(s)) => Some(s),
        _ => Some(text.trim().to_string()),
    };
    let id = id.filter(|s| !s.is_empty()).ok_or_else(|| Error::input("user must name a user id").field("field", "user"))?;
    offshoot_core::ids::parse_user_id(&id)
}

/// `scheme://host` that links start with.
fn base_url(uploads: &Uploads, headers: &HeaderMap) -> String {
    if let Some(u) = &uploads.public_url {
        return u.trim_end_matches('/').to_string();
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("localhost");
    let proto = headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()).filter(|p| *p == "https").unwrap_or("http");
    format!("{proto}://{host}")
}

/// `/uploads/{id}/{name}`.
fn link_path(id: &str, name: &str) -> String {
    format!("{UPLOAD_PATH}{id}/{name}")
}

/// `path?exp=…&sig=…`, valid for [`LINK_TTL`] from now.
fn signed_path(signer: &Signer, path: &str) -> String {
    let exp = time::now() / 1_000_000_000 + LINK_TTL.as_secs() as i64;
    format!("{path}?{}", signer.signed_query(path, exp))
}

/// Re-signs every link to an upload inside the `attachments` of `value` (at any depth), so a
/// link read from a stored message is valid for [`LINK_TTL`] from now.
pub(crate) fn resign(value: &mut Value, signer: &Signer) {
    match value {
        Value::Object(o) => {
            for (k, v) in o.iter_mut() {
                if k == "attachments" {
                    if let Value::Array(atts) = v {
                        for a in atts {
                            resign_strings(a, signer);
                        }
                    }
                } else if v.is_object() || v.is_array() {
                    resign(v, signer);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|v| resign(v, signer)),
        _ => {}
    }
}

fn resign_strings(v: &mut Value, signer: &Signer) {
    match v {
        Value::String(s) => {
            if let Some(fresh) = resigned(s, signer) {
                *s = fresh;
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|v| resign_strings(v, signer)),
        Value::Object(o) => o.values_mut().for_each(|v| resign_strings(v, signer)),
        _ => {}
    }
}

/// `url` with a fresh signature, when it is a signed link to an upload.
fn resigned(url: &str, signer: &Signer) -> Option<String> {
    let at = url.find(UPLOAD_PATH)?;
    let (before, rest) = url.split_at(at);
    let (path, query) = rest.split_once('?')?;
    if !query.split('&').any(|p| p.starts_with("sig=")) {
        return None;
    }
    Some(format!("{before}{}", signed_path(signer, path)))
}

#[derive(Deserialize)]
pub struct DeleteQuery {
    url: Option<String>,
}

/// `DELETE /channels/{type}/{id}/file?url=…`.
pub async fn delete_file(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    ApiQuery(q): ApiQuery<DeleteQuery>,
) -> ApiResult<Json<Value>> {
    delete(st, ctx, path, q).await
}

/// `DELETE /channels/{type}/{id}/image?url=…`.
pub async fn delete_image(
    State(st): State<ApiState>,
    ctx: Ctx,
    path: ChannelPath,
    ApiQuery(q): ApiQuery<DeleteQuery>,
) -> ApiResult<Json<Value>> {
    delete(st, ctx, path, q).await
}

/// Deletes an upload of this channel: its uploader, an admin or server-side may. The file is
/// removed now when no message refers to it; otherwise when the last message that does goes.
async fn delete(st: ApiState, ctx: Ctx, path: ChannelPath, q: DeleteQuery) -> ApiResult<Json<Value>> {
    let uploads = uploads_of(&st)?;
    let url = q.url.filter(|u| !u.is_empty()).ok_or_else(|| Error::input("url is required").field("field", "url"))?;
    let not_ours = || Error::not_found(format!("no upload of channel {:?} at {url:?}", path.cid));
    let id = offshoot_store::upload_ids(&[json!(url)]).into_iter().next().ok_or_else(not_ours)?;
    let up = st.store.upload(&id).await?.filter(|u| u.cid == path.cid).ok_or_else(not_ours)?;
    let own = ctx.viewer.user_id().is_some_and(|uid| uid == up.user_id);
    if !(ctx.viewer.is_admin() || own) {
        return Err(Error::not_allowed("only the uploader, an admin or a server-side request may delete a file").into());
    }
    match st.store.release_upload(&id).await? {
        Release::Freed(key) => {
            if let Err(e) = uploads.files.delete(&key).await {
                tracing::warn!(error = %e, key, "removing a freed upload from storage failed");
            }
        }
        Release::Kept => after_hard_delete(&st, true).await,
        Release::Missing => return Err(not_ours().into()),
    }
    Ok(ctx.ok(json!({})))
}

/// After a write that may have dropped the last reference to a file (`hard`): queues the files
/// job. A failed push is logged; the next files job frees what this one would have.
pub(crate) async fn after_hard_delete(st: &ApiState, hard: bool) {
    if hard && st.uploads.is_some() {
        if let Err(e) = st.jobs.enqueue_files().await {
            tracing::warn!(error = %e.message, "queueing the files job failed");
        }
    }
}

#[derive(Deserialize)]
pub struct LinkQuery {
    exp: Option<String>,
    sig: Option<String>,
}

/// `GET /uploads/{id}/{name}?exp=…&sig=…`: the stored bytes, to anyone holding a valid link.
pub async fn serve_upload(
    State(st): State<ApiState>,
    ApiPath((id, _name)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<LinkQuery>,
    uri: Uri,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let uploads = uploads_of(&st)?;
    let refused = || Error::not_allowed("the link is expired or its signature is not valid");
    let exp: i64 = q.exp.as_deref().and_then(|e| e.parse().ok()).ok_or_else(refused)?;
    let sig = q.sig.ok_or_else(refused)?;
    if !uploads.signer.verify(uri.path(), exp, &sig, time::now() / 1_000_000_000) {
        return Err(refused().into());
    }
    let up = st.store.upload(&id).await?.ok_or_else(|| Error::not_found("the file no longer exists"))?;
    let range = headers.get(header::RANGE).and_then(|v| v.to_str().ok()).and_then(offshoot_files::parse_range);
    let blob = match uploads.files.get(&up.object_key, range).await {
        Ok(b) => b,
        Err(FilesError::NotFound(_)) => return Err(Error::not_found("the file no longer exists").into()),
        Err(FilesError::BadRange { size }) => {
            let mut r = crate::error::envelope(StatusCode::RANGE_NOT_SATISFIABLE, 4, "the range is outside the file", &Default::default());
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                r.headers_mut().insert(header::CONTENT_RANGE, v);
            }
            return Ok(r);
        }
        Err(e) => {
            tracing::error!(error = %e, "reading an upload failed");
            return Err(Error::internal().into());
        }
    };
    let partial = range.is_some();
    let len = blob.range.end - blob.range.start;
    let mut response = Response::new(Body::from_stream(blob.stream));
    *response.status_mut() = if partial { StatusCode::PARTIAL_CONTENT } else { StatusCode::OK };
    let h = response.headers_mut();
    let mime = HeaderValue::from_str(&up.mime_type).unwrap_or(HeaderValue::from_static("application/octet-stream"));
    h.insert(header::CONTENT_TYPE, mime);
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'; sandbox"));
    let disposition = if inline_safe(&up.mime_type) { "inline" } else { "attachment" };
    if let Ok(v) = HeaderValue::from_str(&format!("{disposition}; filename=\"{}\"", up.name)) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!("private, max-age={}", (exp - time::now() / 1_000_000_000).max(0))) {
        h.insert(header::CACHE_CONTROL, v);
    }
    if partial {
        if let Ok(v) = HeaderValue::from_str(&format!("bytes {}-{}/{}", blob.range.start, blob.range.end.saturating_sub(1), blob.size)) {
            h.insert(header::CONTENT_RANGE, v);
        }
    }
    Ok(response.into_response())
}

/// Types a browser may show inline on the server's origin: raster images, audio, video, PDF and
/// plain text. Everything else, SVG and HTML above all (they can run script), is an attachment.
fn inline_safe(mime: &str) -> bool {
    (mime.starts_with("image/") && mime != "image/svg+xml")
        || mime.starts_with("audio/")
        || mime.starts_with("video/")
        || mime == "application/pdf"
        || mime == "text/plain"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_upload_routes_stream_their_bodies() {
        use axum::http::Method;
        assert!(streams_body(&Method::POST, "/channels/messaging/c1/file"));
        assert!(streams_body(&Method::POST, "/api/v2/chat/channels/messaging/c1/image"));
        assert!(!streams_body(&Method::DELETE, "/channels/messaging/c1/file"));
        assert!(!streams_body(&Method::POST, "/channels/messaging/c1/message"));
        assert!(!streams_body(&Method::POST, "/channels/messaging/c1/file/x"));
    }

    #[test]
    fn names_are_made_safe_and_lists_admit_by_extension_and_type() {
        assert_eq!(safe_name("../../etc/pass wd.txt"), "pass_wd.txt");
        assert_eq!(safe_name(".htaccess"), "htaccess");
        assert_eq!(safe_name(""), "file");
        let c = UploadConfig { blocked_file_extensions: vec!["EXE".into()], allowed_mime_types: vec![], ..Default::default() }.normalized();
        assert!(c.admits("a.exe", "application/octet-stream").is_err());
        assert!(c.admits("a.txt", "text/plain").is_ok());
        let c = UploadConfig { allowed_mime_types: vec!["image/png".into()], ..Default::default() }.normalized();
        assert!(c.admits("a.png", "image/png").is_ok());
        assert!(c.admits("a.png", "image/gif").is_err());
    }

    #[test]
    fn a_stored_link_is_resigned_and_other_links_are_left_alone() {
        let s = Signer::new(b"k");
        let id = "0123456789abcdef0123456789abcdef";
        let mut v = json!({"messages": [{"attachments": [{"asset_url": format!("http://h/uploads/{id}/a.txt?exp=1&sig=00"), "og": "https://x/y"}]}]});
        resign(&mut v, &s);
        let url = v["messages"][0]["attachments"][0]["asset_url"].as_str().unwrap().to_string();
        let (path, query) = url.trim_start_matches("http://h").split_once('?').unwrap();
        let exp: i64 = query.split('&').find_map(|p| p.strip_prefix("exp=")).unwrap().parse().unwrap();
        let sig = query.split('&').find_map(|p| p.strip_prefix("sig=")).unwrap();
        assert!(s.verify(path, exp, sig, time::now() / 1_000_000_000), "{url}");
        assert_eq!(v["messages"][0]["attachments"][0]["og"], json!("https://x/y"));
    }
}
