//! The OpenAPI 3.1 document, generated from the route table itself: every route is
//! registered through [`Routes::op`], which adds the handler to the router and its operation
//! to the document in one call, so neither can list a route the other lacks. Nesting (the
//! `/api/v2/chat` and `/api/v2` mirrors) prefixes both alike.
//!
//! Request and response bodies are free-form JSON objects except where a schema is given:
//! the fork endpoints (request, summary, task, lookup, lineage) are fully described, and every
//! error answer is Stream's envelope ([`ErrorEnvelope`]).

#![allow(dead_code)] // the schema types below exist for their derived schemas only

use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{on, MethodFilter};
use axum::Router;
use serde_json::Value;
use std::collections::BTreeMap;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn, PathItem};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{
    ComponentsBuilder, ContentBuilder, InfoBuilder, OpenApi, OpenApiBuilder, PathsBuilder, Ref, RefOr, Required, ResponseBuilder,
    ResponsesBuilder,
};
use utoipa::{PartialSchema, ToSchema};

/// How one operation is described.
#[derive(Clone)]
pub(crate) struct Doc {
    summary: &'static str,
    tag: &'static str,
    body: Option<RefOr<Schema>>,
    ok: RefOr<Schema>,
    query: Vec<(&'static str, Type, &'static str)>,
    /// Needs no `api_key` / token (health, metrics, this document).
    public: bool,
    /// The body is a `multipart/form-data` form with a `file` part and an optional `user`.
    multipart: bool,
}

impl Doc {
    /// An operation whose bodies are free-form JSON objects (a success body carries `duration`).
    pub(crate) fn new(tag: &'static str, summary: &'static str) -> Doc {
        Doc { summary, tag, body: None, ok: schema_ref("Response"), query: Vec::new(), public: false, multipart: false }
    }
    /// A JSON object request body.
    pub(crate) fn body(mut self) -> Doc {
        self.body = Some(free_object());
        self
    }
    /// A `multipart/form-data` body: `file` (the bytes, with a file name) and `user` (optional,
    /// server-side: a user object as JSON, or an id).
    pub(crate) fn multipart(mut self) -> Doc {
        self.multipart = true;
        self.body = Some(
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .property(
                    "file",
                    ObjectBuilder::new().schema_type(Type::String).format(Some(utoipa::openapi::SchemaFormat::Custom("binary".into()))),
                )
                .property(
                    "user",
                    ObjectBuilder::new().schema_type(Type::String).description(Some("Server-side: the uploading user (JSON object or id)")),
                )
                .required("file")
                .into(),
        );
        self
    }
    pub(crate) fn body_of<T: ToSchema>(mut self) -> Doc {
        self.body = Some(schema_ref(&T::name()));
        self
    }
    pub(crate) fn ok_of<T: ToSchema>(mut self) -> Doc {
        self.ok = schema_ref(&T::name());
        self
    }
    pub(crate) fn query(mut self, name: &'static str, kind: Type, description: &'static str) -> Doc {
        self.query.push((name, kind, description));
        self
    }
    pub(crate) fn public(mut self, ok: RefOr<Schema>) -> Doc {
        self.public = true;
        self.ok = ok;
        self
    }
}

struct Entry {
    method: Method,
    path: String,
    doc: Doc,
}

/// A router and the document of its routes, built together.
pub(crate) struct Routes<S> {
    router: Router<S>,
    entries: Vec<Entry>,
}

impl<S: Clone + Send + Sync + 'static> Routes<S> {
    pub(crate) fn new() -> Self {
        Routes { router: Router::new(), entries: Vec::new() }
    }

    /// Registers `handler` for `method` on `path` and documents it.
    pub(crate) fn op<H, T>(mut self, method: Method, path: &str, handler: H, doc: Doc) -> Self
    where
        H: Handler<T, S>,
        T: 'static,
    {
        let filter = MethodFilter::try_from(method.clone()).expect("a method axum can route");
        self.router = self.router.route(path, on(filter, handler));
        self.entries.push(Entry { method, path: path.to_string(), doc });
        self
    }

    pub(crate) fn merge(mut self, other: Routes<S>) -> Self {
        self.router = self.router.merge(other.router);
        self.entries.extend(other.entries);
        self
    }

    pub(crate) fn nest(mut self, prefix: &str, other: Routes<S>) -> Self {
        self.router = self.router.nest(prefix, other.router);
        self.entries.extend(other.entries.into_iter().map(|e| Entry { path: format!("{prefix}{}", e.path), ..e }));
        self
    }

    /// Every documented (method, path), for tests.
    pub(crate) fn operations(&self) -> Vec<(Method, String)> {
        self.entries.iter().map(|e| (e.method.clone(), e.path.clone())).collect()
    }

    pub(crate) fn into_parts(self) -> (Router<S>, OpenApi) {
        let doc = document(&self.entries);
        (self.router, doc)
    }
}

fn schema_ref(name: &str) -> RefOr<Schema> {
    RefOr::Ref(Ref::from_schema_name(name))
}

fn free_object() -> RefOr<Schema> {
    ObjectBuilder::new().schema_type(Type::Object).into()
}

fn http_method(m: &Method) -> HttpMethod {
    match *m {
        Method::GET => HttpMethod::Get,
        Method::POST => HttpMethod::Post,
        Method::PUT => HttpMethod::Put,
        Method::PATCH => HttpMethod::Patch,
        Method::DELETE => HttpMethod::Delete,
        Method::HEAD => HttpMethod::Head,
        Method::OPTIONS => HttpMethod::Options,
        _ => HttpMethod::Trace,
    }
}

/// `get_channels_type_id` for `GET /channels/{type}/{id}`: unique across both dialects.
fn operation_id(method: &Method, path: &str) -> String {
    let mut id = method.as_str().to_ascii_lowercase();
    for part in path.split('/').filter(|p| !p.is_empty()) {
        id.push('_');
        id.extend(part.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).filter(|c| *c != '_' || !part.starts_with('{')));
    }
    id.replace("__", "_")
}

fn json_content(schema: RefOr<Schema>) -> utoipa::openapi::Content {
    ContentBuilder::new().schema(Some(schema)).build()
}

fn document(entries: &[Entry]) -> OpenApi {
    let mut paths = PathsBuilder::new();
    let mut by_path: BTreeMap<&str, Vec<&Entry>> = BTreeMap::new();
    for e in entries {
        by_path.entry(e.path.as_str()).or_default().push(e);
    }
    for (path, entries) in by_path {
        for e in entries {
            let dialect = if path.starts_with("/api/v2/") {
                "v2 dialect (nanosecond timestamps, custom fields under `custom`)"
            } else {
                "legacy dialect (RFC 3339 timestamps, flat custom fields)"
            };
            let mut op = OperationBuilder::new()
                .summary(Some(e.doc.summary))
                .description(Some(format!("{} ({dialect}).", e.doc.summary)))
                .operation_id(Some(operation_id(&e.method, path)))
                .tag(e.doc.tag);
            // Path parameters, from the route template.
            for name in path.split('/').filter_map(|p| p.strip_prefix('{').and_then(|p| p.strip_suffix('}'))) {
                op = op.parameter(
                    ParameterBuilder::new().name(name).parameter_in(ParameterIn::Path).required(Required::True).schema(Some(
                        ObjectBuilder::new()
                            .schema_type(Type::String)
                            .min_length(Some(1))
                            .max_length(Some(64))
                            .pattern(Some("^[A-Za-z0-9_!-]+$")),
                    )),
                );
            }
            for (name, kind, description) in &e.doc.query {
                op = op.parameter(
                    ParameterBuilder::new()
                        .name(*name)
                        .parameter_in(ParameterIn::Query)
                        .required(Required::False)
                        .description(Some(*description))
                        .schema(Some(ObjectBuilder::new().schema_type(kind.clone()))),
                );
            }
            if let Some(body) = &e.doc.body {
                op = op.request_body(Some(
                    RequestBodyBuilder::new()
                        .content(if e.doc.multipart { "multipart/form-data" } else { "application/json" }, json_content(body.clone()))
                        .required(Some(Required::False))
                        .build(),
                ));
            }
            let ok = ResponseBuilder::new().description("Success").content("application/json", json_content(e.doc.ok.clone())).build();
            let error = ResponseBuilder::new()
                .description("An error, in Stream's envelope")
                .content("application/json", json_content(schema_ref("ErrorEnvelope")))
                .build();
            let responses = ResponsesBuilder::new().response("200", ok).response("default", error);
            if e.doc.public {
                op = op.securities(Some(Vec::<SecurityRequirement>::new()));
            }
            paths = paths.path(path, PathItem::new(http_method(&e.method), op.responses(responses.build()).build()));
        }
    }
    let mut components = ComponentsBuilder::new()
        .security_scheme("api_key", SecurityScheme::ApiKey(ApiKey::Query(ApiKeyValue::with_description("api_key", "The app's API key"))))
        .security_scheme(
            "token",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "Authorization",
                "A raw HS256 JWT (no `Bearer` prefix) signed with the API secret; without `user_id` it is server-side",
            ))),
        )
        .schema(
            "Response",
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .description(Some("A success body; every one carries `duration`"))
                .property("duration", ObjectBuilder::new().schema_type(Type::String))
                .required("duration"),
        );
    let mut schemas = Vec::new();
    for (name, schema) in [
        (ErrorEnvelope::name(), ErrorEnvelope::schema()),
        (Timestamp::name(), Timestamp::schema()),
        (ForkRequest::name(), ForkRequest::schema()),
        (ForkTarget::name(), ForkTarget::schema()),
        (ForkSummary::name(), ForkSummary::schema()),
        (ForkResponse::name(), ForkResponse::schema()),
        (ForkLookupRequest::name(), ForkLookupRequest::schema()),
        (ForkLookupResponse::name(), ForkLookupResponse::schema()),
        (ForkLineage::name(), ForkLineage::schema()),
        (ForkTree::name(), ForkTree::schema()),
        (ForkTreeNode::name(), ForkTreeNode::schema()),
        (ForkTreeFork::name(), ForkTreeFork::schema()),
        (TaskResponse::name(), TaskResponse::schema()),
        (TaskError::name(), TaskError::schema()),
    ] {
        schemas.push((name.to_string(), schema));
    }
    for (name, schema) in schemas {
        components = components.schema(name, schema);
    }
    OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("Offshoot")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "Stream Chat's REST protocol with forks. Every path exists in the legacy dialect and under /api/v2 (chat resources under /api/v2/chat). Authenticate with ?api_key= and a raw JWT in Authorization.",
                ))
                .build(),
        )
        .paths(paths.build())
        .components(Some(components.build()))
        .security(Some(vec![SecurityRequirement::new("api_key", Vec::<String>::new()).add("token", Vec::<String>::new())]))
        .build()
}

// ------------------------------------------------------------------------------------------
// Schemas (documentation only: the handlers read and write JSON values).

/// Stream's error envelope: the body of every error answer.
#[derive(ToSchema)]
#[allow(non_snake_case)]
pub(crate) struct ErrorEnvelope {
    /// Stream's error code (4 input, 16 not found, 17 not allowed, 22 body too large, 23 timeout, 127–131 fork errors, -1 internal or unavailable, …).
    code: i64,
    message: String,
    /// The HTTP status, repeated.
    StatusCode: i64,
    duration: String,
    more_info: String,
    details: Vec<Value>,
    /// Machine-readable details, e.g. `reason` (`fork_target_exists`, `too_many_forks`, …).
    exception_fields: BTreeMap<String, String>,
    unrecoverable: Option<bool>,
}

/// A time: an RFC 3339 string in the legacy dialect, integer Unix nanoseconds in v2.
pub(crate) struct Timestamp;

impl PartialSchema for Timestamp {
    fn schema() -> RefOr<Schema> {
        utoipa::openapi::schema::OneOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(Type::String))
            .item(ObjectBuilder::new().schema_type(Type::Integer))
            .description(Some("RFC 3339 (legacy dialect) or Unix nanoseconds (v2 dialect)"))
            .into()
    }
}

impl ToSchema for Timestamp {}

/// `POST /channels/{type}/{id}/fork`.
#[derive(ToSchema)]
pub(crate) struct ForkRequest {
    /// The top-level regular or system message to fork at; it and everything before it is copied.
    message_id: String,
    channel: ForkTarget,
    /// `true`: the copies carry no attachments.
    exclude_attachments: Option<bool>,
    /// Server-side only: the user who forks (default: the source's creator).
    user_id: Option<String>,
    /// Custom keys of the source channel the fork keeps.
    inherit_data: Option<Vec<String>>,
    /// Refuse (409 `fork_point_generating`) a fork point the agent is still writing.
    require_finished: Option<bool>,
}

/// The new channel of a fork.
#[derive(ToSchema)]
pub(crate) struct ForkTarget {
    /// The id of the new agent channel; must not exist yet.
    id: String,
    /// Data of the new channel (name, image, custom fields, `team`).
    data: Option<BTreeMap<String, Value>>,
    /// Up to 100 members: user ids or `{"user_id", "channel_role"}`. Default: the source's.
    #[schema(max_items = 100)]
    members: Option<Vec<Value>>,
}

/// A fork's summary (`fork` on the fork response, `channel.fork`, the lineage).
#[derive(ToSchema)]
pub(crate) struct ForkSummary {
    channel_cid: String,
    source_channel_cid: String,
    source_message_id: String,
    /// `backfilling`, `completed` or `failed`.
    status: String,
    /// Set once the fork is finished (0 while backfilling).
    copied_message_count: i64,
    #[schema(value_type = Timestamp)]
    created_at: Value,
    truncated: Option<bool>,
    oldest_source_message_id: Option<String>,
    /// `fork_message_id_taken` or `message_too_large`.
    failed_reason: Option<String>,
    /// The backfill's task (`GET /tasks/{id}`).
    task_id: Option<String>,
    /// Source id → copy id of the newest page (the fork response only).
    message_id_map: Option<BTreeMap<String, String>>,
}

/// The fork's channel state (as a channel query returns it), its summary and `duration`.
#[derive(ToSchema)]
pub(crate) struct ForkResponse {
    channel: BTreeMap<String, Value>,
    messages: Vec<Value>,
    members: Vec<Value>,
    fork: ForkSummary,
    duration: String,
}

/// `POST /channels/{type}/{id}/fork/message_ids`, called on the fork.
#[derive(ToSchema)]
pub(crate) struct ForkLookupRequest {
    #[schema(max_items = 1000)]
    source_message_ids: Vec<String>,
}

#[derive(ToSchema)]
pub(crate) struct ForkLookupResponse {
    /// Source id → copy id for the copies the fork holds.
    message_id_map: BTreeMap<String, String>,
    duration: String,
}

/// `GET /channels/{type}/{id}/forks`: the channel's forks, newest first, and its own source.
#[derive(ToSchema)]
pub(crate) struct ForkLineage {
    forks: Vec<ForkSummary>,
    source: Option<ForkSummary>,
    duration: String,
}

/// `GET /channels/{type}/{id}/lineage`: the whole fork tree, breadth first.
#[derive(ToSchema)]
pub(crate) struct ForkTree {
    /// The channel asked about.
    cid: String,
    /// The oldest ancestor reachable by `source` links (a hard-deleted one shows as a node with
    /// `deleted: true`).
    root_cid: String,
    /// More nodes than `max_nodes` exist; the deepest, newest were left out.
    truncated_tree: bool,
    nodes: Vec<ForkTreeNode>,
    duration: String,
}

/// One channel of a fork tree. A node the caller may not read carries `cid`, `parent_cid`,
/// `depth`, `readable: false` and `fork.status` only.
#[derive(ToSchema)]
pub(crate) struct ForkTreeNode {
    cid: String,
    parent_cid: Option<String>,
    depth: i64,
    readable: bool,
    name: Option<String>,
    member_count: Option<i64>,
    #[schema(value_type = Option<Timestamp>)]
    created_at: Value,
    /// Soft- or hard-deleted.
    deleted: Option<bool>,
    /// `null` for the root.
    fork: Option<ForkTreeFork>,
}

/// A fork tree node's fork summary, with the live progress of a backfill.
#[derive(ToSchema)]
pub(crate) struct ForkTreeFork {
    /// `backfilling`, `completed` or `failed`.
    status: String,
    /// Live while backfilling, as `GET /tasks/{id}` reports it.
    copied_message_count: Option<i64>,
    total_message_count: Option<i64>,
    truncated: Option<bool>,
    source_message_id: Option<String>,
    /// The first 140 characters of the message the fork was made at.
    fork_point_text: Option<String>,
    task_id: Option<String>,
    #[schema(value_type = Option<Timestamp>)]
    created_at: Value,
    failed_reason: Option<String>,
}

/// `GET /tasks/{id}`: the backfill of a fork.
#[derive(ToSchema)]
pub(crate) struct TaskResponse {
    task_id: String,
    /// `pending`, `running`, `completed` or `failed`.
    status: String,
    #[schema(value_type = Timestamp)]
    created_at: Value,
    #[schema(value_type = Timestamp)]
    updated_at: Value,
    /// Progress: `copied_message_count`, `total_message_count`, `fork_status`, `truncated`, …
    result: BTreeMap<String, Value>,
    error: Option<TaskError>,
    duration: String,
}

#[derive(ToSchema)]
pub(crate) struct TaskError {
    r#type: String,
    description: String,
}

/// `{"status": "ok"}`.
pub(crate) fn health_schema() -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("status", ObjectBuilder::new().schema_type(Type::String))
        .required("status")
        .into()
}

/// Any body (the metrics text, this document).
pub(crate) fn any_schema() -> RefOr<Schema> {
    <Value as PartialSchema>::schema()
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    fn document() -> Value {
        serde_json::to_value(crate::openapi()).expect("the document serialises")
    }

    #[test]
    fn every_routed_operation_is_in_the_document_in_both_dialects() {
        let doc = document();
        assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.1")), "{}", doc["openapi"]);
        let ops = crate::api_operations();
        assert!(ops.len() >= 80, "both dialects: {}", ops.len());
        for (method, path) in &ops {
            let op = &doc["paths"][path][method.as_str().to_ascii_lowercase()];
            assert!(op.is_object(), "{method} {path} is routed but not documented");
            assert!(op["responses"]["default"].is_object(), "{method} {path} documents its error envelope");
        }
        for legacy in ops.iter().filter(|(_, p)| !p.starts_with("/api/v2")) {
            let mirrored = ops
                .iter()
                .any(|(m, p)| m == legacy.0 && (p == &format!("/api/v2/chat{}", legacy.1) || p == &format!("/api/v2{}", legacy.1)));
            assert!(mirrored, "{} {} has a v2 mirror", legacy.0, legacy.1);
        }
    }

    #[test]
    fn operation_ids_are_unique_and_every_reference_resolves() {
        let doc = document();
        let text = doc.to_string();
        let mut ids = std::collections::HashSet::new();
        for item in doc["paths"].as_object().unwrap().values() {
            for op in item.as_object().unwrap().values() {
                let id = op["operationId"].as_str().expect("an operationId").to_string();
                assert!(ids.insert(id.clone()), "duplicate operationId {id}");
            }
        }
        for part in text.split("\"#/components/schemas/").skip(1) {
            let name = &part[..part.find('"').unwrap()];
            assert!(doc["components"]["schemas"][name].is_object(), "dangling reference to {name}");
        }
    }
}
