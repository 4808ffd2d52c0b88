//! HTTP → verbs: path and query parsing, authentication, discovery, CRUD, list and watch.
//!
//! Paths: `/api/v1[/watch][/namespaces/NS]/{secrets,configmaps,events}[/NAME]` and
//! `/apis/coordination.k8s.io/v1[/watch][/namespaces/NS]/leases[/NAME]` (`/watch/`: the legacy
//! watch paths); discovery at `/api`, `/api/v1`, `/apis`, `/apis/coordination.k8s.io[/v1]`;
//! `/healthz`, `/readyz`, `/livez` and (for clients without credentials) `/version` without
//! authentication; `/metrics` for any authenticated user (see [`super::metrics`]). Bodies are JSON (YAML accepted where the content type says
//! so), at most [`MAX_BODY`] bytes. Lists are served from the newest state: a `continue` token
//! is a position (namespace, name), so later pages reflect later changes (kube-apiserver keeps
//! the first page's snapshot instead).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::audit::{self, AuditLog};
use super::auth::{Attributes, Authorizer, Tokens, User};
use super::listener::Conn;
use super::resource::Resource;
use super::select::Selector;
use super::status::ApiError;
use super::store::{Mode, PatchKind, Preconditions, Store, meta_str};
use super::watch::{self, Start, WatchRequest};
use crate::serve::{Body, full};

/// Request bodies above this size are refused (the apiserver's own limit is about 3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// Everything a request handler needs.
#[derive(Debug)]
pub struct Api {
    /// The objects.
    pub store: Arc<Store>,
    /// Who is calling.
    pub tokens: Tokens,
    /// What they may do.
    pub authorizer: Authorizer,
    /// Whether TLS client certificates (verified against `--client-ca`) authenticate users.
    pub client_cert_auth: bool,
    /// Time between watch bookmarks.
    pub bookmark_interval: Duration,
    /// Cancelled when the server shuts down: open watches end.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// Open watches and requests, served at `/metrics`.
    pub metrics: super::metrics::Metrics,
    /// `--audit-log`: every authenticated request on objects, as the authorizer sees it.
    pub audit: Option<AuditLog>,
}

/// Where a request goes.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Version,
    Health,
    Metrics,
    CoreVersions,
    CoreResources,
    Groups,
    Group(String),
    GroupResources(String),
    Objects {
        resource: Resource,
        namespace: Option<String>,
        name: Option<String>,
        /// A legacy `/watch/` path (`/api/v1/watch/namespaces/NS/secrets[/NAME]`): a watch
        /// whatever the query says.
        watch_path: bool,
    },
}

fn parse_route(path: &str) -> Option<Route> {
    let parts: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|p| !p.is_empty())
        .collect();
    let objects = |group: &str, rest: &[&str]| -> Option<Route> {
        let (watch_path, rest) = match rest {
            ["watch", rest @ ..] => (true, rest),
            rest => (false, rest),
        };
        let (namespace, plural, name) = match rest {
            ["namespaces", ns, plural] => (Some(*ns), *plural, None),
            ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
            [plural] => (None, *plural, None),
            _ => return None,
        };
        Some(Route::Objects {
            resource: Resource::from_plural(group, plural)?,
            namespace: namespace.map(str::to_owned),
            name: name.map(str::to_owned),
            watch_path,
        })
    };
    match parts.as_slice() {
        ["version"] => Some(Route::Version),
        ["healthz" | "readyz" | "livez"] => Some(Route::Health),
        ["metrics"] => Some(Route::Metrics),
        ["api"] => Some(Route::CoreVersions),
        ["api", "v1"] => Some(Route::CoreResources),
        ["api", "v1", rest @ ..] => objects("", rest),
        ["apis"] => Some(Route::Groups),
        ["apis", group] if *group == "coordination.k8s.io" => {
            Some(Route::Group((*group).to_owned()))
        }
        ["apis", group, "v1"] if *group == "coordination.k8s.io" => {
            Some(Route::GroupResources((*group).to_owned()))
        }
        ["apis", group, "v1", rest @ ..] => objects(group, rest),
        _ => None,
    }
}

/// Handles one request; errors become `Status` bodies.
pub async fn handle(api: Arc<Api>, conn: Arc<Conn>, request: Request<Incoming>) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    match route(&api, &conn, request).await {
        Ok(response) => response,
        Err(err) => {
            if err.code >= 500 {
                tracing::error!(%method, %path, code = err.code, message = %err.message, "request failed");
            } else {
                tracing::debug!(%method, %path, code = err.code, reason = err.reason, "request refused");
            }
            json_response(
                StatusCode::from_u16(err.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                &err.to_status(),
            )
        }
    }
}

async fn route(
    api: &Api,
    conn: &Conn,
    request: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let route = parse_route(request.uri().path())
        .ok_or_else(|| ApiError::no_route(request.uri().path()))?;
    if route == Route::Health {
        return Ok(Response::new(full("ok")));
    }
    // kube-apiserver lets anonymous clients read `/version` (system:public-info-viewer); a
    // client that presented credentials that fail gets its 401 all the same.
    if route == Route::Version
        && !request.headers().contains_key(http::header::AUTHORIZATION)
        && !matches!(
            conn.client_identity,
            reload_lib::ClientIdentity::Rejected { .. }
        )
    {
        return Ok(version());
    }
    let user = authenticate(api, conn, &request).ok_or_else(ApiError::unauthorized)?;
    conn.authenticated();
    let query = Query::parse(request.uri().query().unwrap_or(""));
    match route {
        Route::Health => unreachable!("answered above"),
        Route::Metrics => Ok(Response::new(full(api.metrics.encode()))),
        Route::Version => Ok(version()),
        Route::CoreVersions => Ok(json_ok(&json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]
        }))),
        Route::CoreResources => Ok(json_ok(&resource_list("v1"))),
        Route::Groups => Ok(json_ok(&json!({
            "kind": "APIGroupList", "apiVersion": "v1",
            "groups": [group_json("coordination.k8s.io")]
        }))),
        Route::Group(group) => Ok(json_ok(&group_json(&group))),
        Route::GroupResources(group) => Ok(json_ok(&resource_list(&format!("{group}/v1")))),
        Route::Objects {
            resource,
            namespace,
            name,
            watch_path,
        } => {
            let target = Target {
                resource,
                namespace,
                name,
                watch_path,
            };
            objects(api, conn, &user, request, &query, target).await
        }
    }
}

fn version() -> Response<Body> {
    json_ok(&json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-mini-apiserver",
        "platform": "linux/amd64", "goVersion": "n/a", "compiler": "rustc",
        "gitCommit": "", "gitTreeState": "clean", "buildDate": ""
    }))
}

fn authenticate(api: &Api, conn: &Conn, request: &Request<Incoming>) -> Option<User> {
    // kube-apiserver's union authenticator: the x509 authenticator first, then the token. A
    // certificate that did not verify (expired, unknown issuer) is an error of the x509
    // authenticator only; the request still authenticates with its token.
    if api.client_cert_auth
        && let reload_lib::ClientIdentity::Verified(_) = &conn.client_identity
        && let Some(leaf) = conn.info.peer_certs.first()
        && let Some(user) = user_from_certificate(leaf)
    {
        return Some(user);
    }
    let header = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    api.tokens.authenticate(header)
}

/// The user a client certificate names: CN as user, O values as groups (kube-apiserver's rule).
fn user_from_certificate(der: &[u8]) -> Option<User> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject.iter_common_name().next()?.as_str().ok()?.to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    (!name.is_empty()).then_some(User { name, groups })
}

/// The objects a request is about.
struct Target {
    resource: Resource,
    namespace: Option<String>,
    name: Option<String>,
    watch_path: bool,
}

async fn objects(
    api: &Api,
    conn: &Conn,
    user: &User,
    request: Request<Incoming>,
    query: &Query,
    target: Target,
) -> Result<Response<Body>, ApiError> {
    let Target {
        resource,
        namespace,
        name,
        watch_path,
    } = target;
    let watching = watch_path || query.flag("watch");
    let verb = match (request.method(), &name, watching) {
        (&Method::GET, _, true) => "watch",
        (&Method::GET, None, false) => "list",
        (&Method::DELETE, None, _) => "deletecollection",
        (&Method::GET, Some(_), _) => "get",
        (&Method::POST, None, _) => "create",
        (&Method::PUT, Some(_), _) => "update",
        (&Method::PATCH, Some(_), _) => "patch",
        (&Method::DELETE, Some(_), _) => "delete",
        (method, _, _) => {
            return Err(ApiError::method_not_allowed(format!(
                "{method} is not supported here"
            )));
        }
    };
    let attributes = Attributes {
        verb,
        namespace: namespace.as_deref(),
        resource: resource.plural(),
    };
    api.metrics.request(verb, resource);
    let audit_record = api.audit.as_ref().map(|_| audit::Record {
        user: user.name.clone(),
        verb: verb.to_owned(),
        api_group: resource.group().to_owned(),
        resource: resource.plural().to_owned(),
        namespace: namespace.clone(),
        name: match verb {
            "list" | "watch" if name.is_none() => {
                audit::name_from_field_selector(query.get("fieldSelector"))
            }
            _ => name.clone(),
        },
        code: 0,
    });
    let outcome = if api.authorizer.allows(user, &attributes) {
        let target = Target {
            resource,
            namespace: namespace.clone(),
            name,
            watch_path,
        };
        serve_objects(api, conn, request, query, verb, target).await
    } else {
        Err(ApiError::forbidden(format!(
            "User \"{}\" cannot {verb} resource \"{}\" in namespace \"{}\"",
            user.name,
            resource.plural(),
            namespace.as_deref().unwrap_or("")
        )))
    };
    if let (Some(log), Some(mut record)) = (&api.audit, audit_record) {
        record.code = match &outcome {
            Ok(response) => response.status().as_u16(),
            Err(err) => err.code,
        };
        log.record(&record);
    }
    outcome
}

/// An authorized request on objects.
async fn serve_objects(
    api: &Api,
    conn: &Conn,
    request: Request<Incoming>,
    query: &Query,
    verb: &str,
    target: Target,
) -> Result<Response<Body>, ApiError> {
    let Target {
        resource,
        namespace,
        name,
        watch_path: _,
    } = target;
    let namespaced = |ns: &Option<String>| {
        ns.clone()
            .ok_or_else(|| ApiError::method_not_allowed(format!("{verb} needs a namespace")))
    };
    let store = &api.store;
    let mode = write_mode(query, verb)?;
    match verb {
        "list" => list(store, query, resource, namespace.as_deref()),
        "watch" => Ok(watch::respond(
            store,
            watch_request(query, resource, namespace, name.as_deref(), api)?,
            api.metrics.watch_opened(resource),
            conn.abort.clone(),
        )),
        "get" => Ok(json_ok(&store.get(
            resource,
            &namespaced(&namespace)?,
            name.as_deref().unwrap_or(""),
        )?)),
        "create" => {
            let ns = namespaced(&namespace)?;
            let body = read_body(request, resource).await?;
            let object = store.create_in(mode, resource, &ns, body)?;
            log_change(mode, "created", resource, &object);
            Ok(json_response(StatusCode::CREATED, &object))
        }
        "update" => {
            let ns = namespaced(&namespace)?;
            let body = read_body(request, resource).await?;
            let name = name.as_deref().unwrap_or("");
            // Leases and Events are created by an update when missing (kube-apiserver's
            // AllowCreateOnUpdate for these kinds).
            if creates_on_update(resource)
                && store.get(resource, &ns, name).is_err_and(|e| e.code == 404)
            {
                let mut body = body;
                if let Some(metadata) = body
                    .as_object_mut()
                    .map(|o| o.entry("metadata").or_insert_with(|| json!({})))
                    && metadata.is_object()
                    && metadata.get("name").is_none()
                {
                    metadata["name"] = json!(name);
                }
                let object = store.create_in(mode, resource, &ns, body)?;
                log_change(mode, "created", resource, &object);
                return Ok(json_response(StatusCode::CREATED, &object));
            }
            if resource == Resource::Leases
                && meta_str(&body, "resourceVersion").is_empty()
                && [String::new(), name.to_owned()].contains(&meta_str(&body, "name"))
            {
                // Leases allow no unconditional update.
                return Err(ApiError::invalid(
                    resource.kind(),
                    name,
                    "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
                ));
            }
            let object = store.update_in(mode, resource, &ns, name, body)?;
            log_change(mode, "updated", resource, &object);
            Ok(json_ok(&object))
        }
        "patch" => {
            let ns = namespaced(&namespace)?;
            let content_type = request
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_owned();
            let kind = match content_type.as_str() {
                "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
                    PatchKind::Merge
                }
                "application/json-patch+json" => PatchKind::Json,
                "application/apply-patch+yaml" | "application/apply-patch+json" => PatchKind::Apply,
                other => return Err(ApiError::unsupported_media_type(other)),
            };
            let body = read_body(request, resource).await?;
            let name = name.as_deref().unwrap_or("");
            if kind == PatchKind::Merge
                && creates_on_update(resource)
                && body.is_object()
                && store.get(resource, &ns, name).is_err_and(|e| e.code == 404)
            {
                let mut object = json!({"metadata": {"name": name}});
                json_patch::merge(&mut object, &body);
                let object = store.create_in(mode, resource, &ns, object)?;
                log_change(mode, "created", resource, &object);
                return Ok(json_ok(&object));
            }
            let object = store.patch_in(mode, resource, &ns, name, kind, body)?;
            log_change(mode, "patched", resource, &object);
            Ok(json_ok(&object))
        }
        "delete" => {
            let ns = namespaced(&namespace)?;
            let (preconditions, body_mode) = delete_options(request).await?;
            let mode = if body_mode == Mode::DryRun {
                Mode::DryRun
            } else {
                mode
            };
            let object = store.delete_in(
                mode,
                resource,
                &ns,
                name.as_deref().unwrap_or(""),
                &preconditions,
            )?;
            log_change(mode, "deleted", resource, &object);
            // kube-apiserver answers a completed delete of these kinds with a Status.
            Ok(json_ok(&json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {
                    "name": meta_str(&object, "name"),
                    "kind": resource.plural(),
                    "uid": meta_str(&object, "uid"),
                }
            })))
        }
        "deletecollection" => {
            let ns = namespaced(&namespace)?;
            let (preconditions, body_mode) = delete_options(request).await?;
            let mode = if body_mode == Mode::DryRun {
                Mode::DryRun
            } else {
                mode
            };
            delete_collection(store, query, mode, resource, &ns, &preconditions)
        }
        _ => unreachable!("verbs are enumerated above"),
    }
}

/// Kinds whose update (PUT, merge PATCH) creates a missing object, as in kube-apiserver.
fn creates_on_update(resource: Resource) -> bool {
    matches!(resource, Resource::Leases | Resource::Events)
}

/// `?dryRun=All` (the only value kube-apiserver knows; any other makes the request's options
/// invalid: 422, as kube-apiserver answers). Reads ignore it.
fn write_mode(query: &Query, verb: &str) -> Result<Mode, ApiError> {
    let options = match verb {
        "create" => "CreateOptions.meta.k8s.io",
        "update" => "UpdateOptions.meta.k8s.io",
        "patch" => "PatchOptions.meta.k8s.io",
        "delete" | "deletecollection" => "DeleteOptions.meta.k8s.io",
        _ => return Ok(Mode::Commit),
    };
    match query.get("dryRun") {
        None | Some("") => Ok(Mode::Commit),
        Some("All") => Ok(Mode::DryRun),
        Some(other) => Err(ApiError::invalid(
            options,
            "",
            format!("dryRun: Unsupported value: []string{{{other:?}}}: supported values: \"All\""),
        )),
    }
}

fn log_change(mode: Mode, what: &str, resource: Resource, object: &Value) {
    if mode == Mode::DryRun {
        tracing::debug!(kind = resource.kind(), name = %meta_str(object, "name"), "dry run: {what}");
        return;
    }
    // Names and versions only: data may be Secret material.
    tracing::info!(
        kind = resource.kind(),
        namespace = %meta_str(object, "namespace"),
        name = %meta_str(object, "name"),
        resource_version = %meta_str(object, "resourceVersion"),
        "{what}"
    );
}

fn list(
    store: &Store,
    query: &Query,
    resource: Resource,
    namespace: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let selector = Selector::parse(
        resource,
        query.get("labelSelector"),
        query.get("fieldSelector"),
    )?;
    let limit = match query.get("limit") {
        None | Some("0") => None,
        Some(text) => Some(
            text.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit {text:?}")))?,
        ),
    };
    let after = match query.get("continue").filter(|c| !c.is_empty()) {
        None => None,
        Some(token) => Some(
            decode_continue(token)
                .ok_or_else(|| ApiError::bad_request("invalid continue token"))?,
        ),
    };
    check_list_version(store, query)?;
    let (items, rv, next) = store.list(resource, namespace, &selector, limit, after.as_ref());
    let mut metadata = json!({ "resourceVersion": rv.to_string() });
    if let Some((ns, name)) = next {
        metadata["continue"] = json!(URL_SAFE_NO_PAD.encode(format!("{ns}/{name}")));
    }
    Ok(json_ok(&json!({
        "kind": format!("{}List", resource.kind()),
        "apiVersion": resource.api_version(),
        "metadata": metadata,
        // Items carry no kind and apiVersion, as from kube-apiserver (the list says them).
        "items": items.into_iter().map(|mut item| {
            if let Some(map) = item.as_object_mut() {
                map.remove("kind");
                map.remove("apiVersion");
            }
            item
        }).collect::<Vec<_>>(),
    })))
}

/// DELETE on a collection: deletes the objects the label and field selectors match (all of
/// them without selectors) and answers the list of deleted objects, as kube-apiserver does.
fn delete_collection(
    store: &Store,
    query: &Query,
    mode: Mode,
    resource: Resource,
    namespace: &str,
    preconditions: &Preconditions,
) -> Result<Response<Body>, ApiError> {
    let selector = Selector::parse(
        resource,
        query.get("labelSelector"),
        query.get("fieldSelector"),
    )?;
    let (matching, _, _) = store.list(resource, Some(namespace), &selector, None, None);
    let mut deleted = Vec::with_capacity(matching.len());
    for object in matching {
        let name = meta_str(&object, "name");
        match store.delete_in(mode, resource, namespace, &name, preconditions) {
            Ok(mut object) => {
                log_change(mode, "deleted", resource, &object);
                // Items carry no kind and apiVersion, as in a list.
                if let Some(map) = object.as_object_mut() {
                    map.remove("kind");
                    map.remove("apiVersion");
                }
                deleted.push(object);
            }
            // Deleted meanwhile by another request: not ours to report.
            Err(err) if err.code == 404 => {}
            Err(err) => return Err(err),
        }
    }
    Ok(json_ok(&json!({
        "kind": format!("{}List", resource.kind()),
        "apiVersion": resource.api_version(),
        "metadata": { "resourceVersion": store.resource_version().to_string() },
        "items": deleted,
    })))
}

fn decode_continue(token: &str) -> Option<(String, String)> {
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(token).ok()?).ok()?;
    let (ns, name) = text.split_once('/')?;
    Some((ns.to_owned(), name.to_owned()))
}

/// A list is always served from the newest state. That satisfies `resourceVersion` unset, `"0"`
/// and `NotOlderThan` any version this server has reached; an exact older version (or one from
/// the future) cannot be served: 410 Expired (clients then list without it), and
/// "Too large resource version" (504, as kube-apiserver) for one from the future.
fn check_list_version(store: &Store, query: &Query) -> Result<(), ApiError> {
    let Some(text) = query.get("resourceVersion").filter(|v| !v.is_empty()) else {
        return Ok(());
    };
    let wanted = parse_version(text)?;
    let current = store.resource_version();
    if wanted > current {
        return Err(ApiError::too_large_resource_version(wanted, current));
    }
    if query.get("resourceVersionMatch") == Some("Exact") && wanted != current {
        return Err(ApiError::expired(format!(
            "too old resource version: {wanted} ({current})"
        )));
    }
    Ok(())
}

fn parse_version(text: &str) -> Result<u64, ApiError> {
    text.parse::<u64>()
        .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {text:?}")))
}

/// The watch parameters of a request.
fn watch_request(
    query: &Query,
    resource: Resource,
    namespace: Option<String>,
    name: Option<&str>,
    api: &Api,
) -> Result<WatchRequest, ApiError> {
    // A watch on a named path watches that object: kube-apiserver adds `metadata.name=NAME` to
    // the field selector.
    let fields = match (name, query.get("fieldSelector").filter(|f| !f.is_empty())) {
        (None, fields) => fields.map(str::to_owned),
        (Some(name), None) => Some(format!("metadata.name={name}")),
        (Some(name), Some(fields)) => Some(format!("{fields},metadata.name={name}")),
    };
    let selector = Selector::parse(resource, query.get("labelSelector"), fields.as_deref())?;
    let bookmarks = query.flag("allowWatchBookmarks");
    let start = if query.flag("sendInitialEvents") {
        if !bookmarks || query.get("resourceVersionMatch") != Some("NotOlderThan") {
            return Err(ApiError::invalid(
                "ListOptions",
                "",
                "sendInitialEvents needs allowWatchBookmarks=true and resourceVersionMatch=NotOlderThan",
            ));
        }
        Start::InitialEvents
    } else {
        match query.get("resourceVersion") {
            None | Some("" | "0") => Start::Current,
            Some(text) => Start::After(parse_version(text)?),
        }
    };
    let timeout = match query.get("timeoutSeconds") {
        None => Duration::from_secs(1800),
        Some(text) => Duration::from_secs(
            text.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {text:?}")))?,
        ),
    };
    Ok(WatchRequest {
        resource,
        namespace,
        selector,
        start,
        timeout,
        bookmarks,
        bookmark_interval: api.bookmark_interval,
        shutdown: api.shutdown.clone(),
    })
}

/// `DeleteOptions.preconditions` from a DELETE body (an empty body means none).
/// The DeleteOptions body of a delete: its preconditions, and whether it asks for a dry run
/// (`"dryRun": ["All"]`, which is where kube-rs and client-go put it for deletes).
async fn delete_options(request: Request<Incoming>) -> Result<(Preconditions, Mode), ApiError> {
    parse_delete_options(&read_bytes(request).await?)
}

/// `delete_options` of the body bytes. Public for the fuzz targets ([`super::fuzz`]).
///
/// # Errors
/// 400 for a body that is not a JSON object, 422 for an unknown `dryRun`.
pub fn parse_delete_options(body: &[u8]) -> Result<(Preconditions, Mode), ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok((Preconditions::default(), Mode::Commit));
    }
    let options: Value = serde_json::from_slice(body)
        .map_err(|err| ApiError::bad_request(format!("malformed DeleteOptions: {err}")))?;
    if !options.is_object() {
        return Err(ApiError::bad_request(
            "malformed DeleteOptions: expected an object",
        ));
    }
    let field = |name: &str| {
        options["preconditions"][name]
            .as_str()
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let mode = match &options["dryRun"] {
        Value::Null => Mode::Commit,
        Value::Array(values) if values.is_empty() => Mode::Commit,
        Value::Array(values) if values.iter().all(|v| v == "All") => Mode::DryRun,
        other => {
            return Err(ApiError::invalid(
                "DeleteOptions.meta.k8s.io",
                "",
                format!("dryRun: Unsupported value: {other}: supported values: \"All\""),
            ));
        }
    };
    let preconditions = Preconditions {
        resource_version: field("resourceVersion"),
        uid: field("uid"),
    };
    Ok((preconditions, mode))
}

/// How much of an oversized body is read and thrown away before answering 413, so that the
/// client finishes sending and reads the answer instead of a connection reset.
const DRAIN_LIMIT: usize = 16 * 1024 * 1024;
/// How long a client may take to send a request body.
const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long draining an oversized body may take.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The request body, at most [`MAX_BODY`] bytes (413 above).
async fn read_bytes(request: Request<Incoming>) -> Result<bytes::Bytes, ApiError> {
    let declared = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > MAX_BODY + DRAIN_LIMIT) {
        // Too big to be worth draining: answer now (the client may see a reset instead).
        return Err(ApiError::too_large(MAX_BODY));
    }
    let mut body = request.into_body();
    let mut bytes = Vec::new();
    let deadline = tokio::time::Instant::now() + BODY_TIMEOUT;
    while let Some(frame) = tokio::time::timeout_at(deadline, body.frame())
        .await
        .map_err(|_| ApiError::new(408, "Timeout", "timed out reading the request body"))?
    {
        let frame =
            frame.map_err(|err| ApiError::bad_request(format!("cannot read the body: {err}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if bytes.len() + data.len() > MAX_BODY {
            let drain = async {
                let mut drained = bytes.len() + data.len();
                while drained <= MAX_BODY + DRAIN_LIMIT
                    && let Some(Ok(frame)) = body.frame().await
                {
                    drained += frame.data_ref().map_or(0, |d| d.len());
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
            return Err(ApiError::too_large(MAX_BODY));
        }
        bytes.extend_from_slice(&data);
    }
    Ok(bytes.into())
}

/// The body of a create, update or patch as JSON: JSON, YAML where the content type says so,
/// or Kubernetes protobuf (see [`super::proto`]). Creates and updates in any other content type
/// get 415, as from kube-apiserver (patches check their own types).
async fn read_body(request: Request<Incoming>, resource: Resource) -> Result<Value, ApiError> {
    let content_type = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let is_patch = request.method() == Method::PATCH;
    let is_yaml = content_type.contains("yaml");
    if !is_patch
        && !is_yaml
        && !matches!(
            content_type.as_str(),
            "" | "application/json" | super::proto::CONTENT_TYPE
        )
    {
        return Err(ApiError::unsupported_media_type(&content_type));
    }
    let bytes = read_bytes(request).await?;
    decode_body(resource, &content_type, &bytes)
}

/// A request body as JSON, by its (lower-case, parameter-free) content type: protobuf, YAML
/// (when it is not JSON) or JSON. Public for the fuzz targets ([`super::fuzz`]).
///
/// # Errors
/// 400 for bytes that do not decode.
pub fn decode_body(
    resource: Resource,
    content_type: &str,
    bytes: &[u8],
) -> Result<Value, ApiError> {
    let is_yaml = content_type.contains("yaml");
    if content_type == super::proto::CONTENT_TYPE {
        return super::proto::decode(resource, bytes);
    }
    if is_yaml && serde_json::from_slice::<Value>(bytes).is_err() {
        serde_norway::from_slice::<Value>(bytes)
            .map_err(|err| ApiError::bad_request(format!("malformed YAML: {err}")))
    } else {
        serde_json::from_slice::<Value>(bytes)
            .map_err(|err| ApiError::bad_request(format!("malformed JSON: {err}")))
    }
}

fn json_ok(value: &Value) -> Response<Body> {
    json_response(StatusCode::OK, value)
}

fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(full(serde_json::to_vec(value).unwrap_or_default()))
        .expect("static response parts are valid")
}

fn resource_list(group_version: &str) -> Value {
    let resources: Vec<Value> = Resource::ALL
        .into_iter()
        .filter(|r| r.api_version() == group_version)
        .map(|r| {
            let mut resource = json!({
                "name": r.plural(), "singularName": r.kind().to_ascii_lowercase(), "namespaced": true,
                "kind": r.kind(),
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
            });
            // As kube-apiserver lists them (`kubectl get cm`, `kubectl get ev`).
            let short_names: &[&str] = match r {
                Resource::ConfigMaps => &["cm"],
                Resource::Events => &["ev"],
                _ => &[],
            };
            if !short_names.is_empty() {
                resource["shortNames"] = json!(short_names);
            }
            resource
        })
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}

fn group_json(group: &str) -> Value {
    let version = json!({"groupVersion": format!("{group}/v1"), "version": "v1"});
    json!({"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": [version.clone()], "preferredVersion": version})
}

/// Decoded query parameters.
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(query: &str) -> Query {
        Query(
            query
                .split('&')
                .filter(|p| !p.is_empty())
                .map(|pair| {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    (percent_decode(k), percent_decode(v))
                })
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("1" | "true"))
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                    16,
                ) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_routes() {
        assert_eq!(
            parse_route("/api/v1/namespaces/ns/secrets/a"),
            Some(Route::Objects {
                resource: Resource::Secrets,
                namespace: Some("ns".into()),
                name: Some("a".into()),
                watch_path: false,
            })
        );
        assert_eq!(
            parse_route("/apis/coordination.k8s.io/v1/namespaces/ns/leases"),
            Some(Route::Objects {
                resource: Resource::Leases,
                namespace: Some("ns".into()),
                name: None,
                watch_path: false,
            })
        );
        assert_eq!(
            parse_route("/api/v1/configmaps"),
            Some(Route::Objects {
                resource: Resource::ConfigMaps,
                namespace: None,
                name: None,
                watch_path: false,
            })
        );
        assert_eq!(
            parse_route("/api/v1/watch/namespaces/ns/secrets/a"),
            Some(Route::Objects {
                resource: Resource::Secrets,
                namespace: Some("ns".into()),
                name: Some("a".into()),
                watch_path: true,
            })
        );
        assert_eq!(parse_route("/api/v1/watch"), None);
        assert_eq!(parse_route("/api/v1/namespaces/ns/pods"), None);
        assert_eq!(
            parse_route("/apis/coordination.k8s.io/v1/namespaces/ns/secrets"),
            None
        );
    }

    fn api() -> Api {
        Api {
            store: Arc::new(Store::open(None, 100).unwrap()),
            tokens: Tokens::parse("t,u,1").unwrap(),
            authorizer: Authorizer::default(),
            client_cert_auth: false,
            bookmark_interval: Duration::from_secs(5),
            shutdown: tokio_util::sync::CancellationToken::new(),
            metrics: super::super::metrics::Metrics::default(),
            audit: None,
        }
    }

    #[test]
    fn watch_parameters_choose_where_the_stream_starts() {
        let api = api();
        let start = |query: &str| {
            watch_request(&Query::parse(query), Resource::Secrets, None, None, &api)
                .map(|w| w.start)
        };
        assert_eq!(start("watch=1").unwrap(), Start::Current);
        assert_eq!(start("watch=1&resourceVersion=0").unwrap(), Start::Current);
        assert_eq!(start("watch=1&resourceVersion=7").unwrap(), Start::After(7));
        assert_eq!(
            start("sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&resourceVersion=0")
                .unwrap(),
            Start::InitialEvents
        );
        assert_eq!(
            start("sendInitialEvents=true&resourceVersionMatch=NotOlderThan")
                .unwrap_err()
                .code,
            422
        );
        assert_eq!(start("resourceVersion=abc").unwrap_err().code, 400);
        assert_eq!(start("timeoutSeconds=-1").unwrap_err().code, 400);
    }

    #[test]
    fn list_versions_are_checked_against_the_store() {
        let api = api();
        api.store
            .create(
                Resource::ConfigMaps,
                "ns",
                json!({"metadata": {"name": "a"}}),
            )
            .unwrap();
        let check = |query: &str| check_list_version(&api.store, &Query::parse(query));
        assert!(check("").is_ok());
        assert!(check("resourceVersion=0").is_ok());
        assert!(check("resourceVersion=1&resourceVersionMatch=Exact").is_ok());
        assert_eq!(
            check("resourceVersion=0&resourceVersionMatch=Exact")
                .unwrap_err()
                .code,
            410
        );
        assert_eq!(check("resourceVersion=9").unwrap_err().code, 504);
    }

    #[test]
    fn client_certificates_name_the_user_and_groups() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:admin");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        let cert = params.self_signed(&key).unwrap();
        let user = user_from_certificate(cert.der()).unwrap();
        assert_eq!(user.name, "system:admin");
        assert_eq!(user.groups, ["system:masters"]);
        assert!(user_from_certificate(b"not a certificate").is_none());
    }

    #[test]
    fn query_values_are_percent_decoded() {
        let query = Query::parse("fieldSelector=metadata.name%3Dserving-cert&watch=true&x");
        assert_eq!(
            query.get("fieldSelector"),
            Some("metadata.name=serving-cert")
        );
        assert!(query.flag("watch"));
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
