//! Requests on objects: the verb from method and path, authorization and audit, then get, list,
//! watch, create, update, patch, delete and deletecollection on the store.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use examples::serve::Body;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::{Value, json};

use super::api::Api;
use super::body::{delete_options, json_ok, json_response, read_body};
use super::query::Query;
use crate::audit;
use crate::auth::{Attributes, User};
use crate::listener::Conn;
use crate::meta::meta_str;
use crate::resource::Resource;
use crate::select::Selector;
use crate::status::ApiError;
use crate::store::{Mode, PatchKind, Preconditions, Store};
use crate::watch::{self, Start, WatchRequest};

/// The objects a request is about.
pub(super) struct Target {
    pub(super) resource: Resource,
    pub(super) namespace: Option<String>,
    pub(super) name: Option<String>,
    pub(super) watch_path: bool,
}

pub(super) async fn objects(
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
            check_fields(query, resource, &body, true)?;
            let object = store.create_in(mode, resource, &ns, body)?;
            log_change(mode, "created", resource, &object);
            Ok(json_response(StatusCode::CREATED, &object))
        }
        "update" => {
            let ns = namespaced(&namespace)?;
            let body = read_body(request, resource).await?;
            check_fields(query, resource, &body, true)?;
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
                "application/merge-patch+json" => PatchKind::Merge,
                "application/strategic-merge-patch+json" => PatchKind::Strategic,
                "application/json-patch+json" => PatchKind::Json,
                "application/apply-patch+yaml" | "application/apply-patch+json" => PatchKind::Apply,
                other => return Err(ApiError::unsupported_media_type(other)),
            };
            let body = read_body(request, resource).await?;
            if kind != PatchKind::Json {
                check_fields(query, resource, &body, false)?;
            }
            let name = name.as_deref().unwrap_or("");
            if matches!(kind, PatchKind::Merge | PatchKind::Strategic)
                && creates_on_update(resource)
                && body.is_object()
                && store.get(resource, &ns, name).is_err_and(|e| e.code == 404)
            {
                let mut object = json!({"metadata": {"name": name}});
                if kind == PatchKind::Strategic {
                    crate::smp::apply(&mut object, &body)?;
                } else {
                    json_patch::merge(&mut object, &body);
                }
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
            if object["metadata"].get("deletionTimestamp").is_some() {
                // Finalizers pending: the object stays; the answer is its state.
                log_change(mode, "marked for deletion", resource, &object);
                return Ok(json_ok(&object));
            }
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
/// `fieldValidation=Strict`: 400 for fields the kind's schema does not declare, worded as
/// kube-apiserver words it (the default, `Warn`, and `Ignore` accept them).
fn check_fields(
    query: &Query,
    resource: Resource,
    body: &Value,
    whole_object: bool,
) -> Result<(), ApiError> {
    if query.get("fieldValidation") != Some("Strict") {
        return Ok(());
    }
    let unknown = crate::openapi::unknown_fields(resource, body);
    if unknown.is_empty() {
        return Ok(());
    }
    let fields: Vec<String> = unknown
        .iter()
        .map(|field| format!("unknown field \"{field}\""))
        .collect();
    let kind = resource.kind();
    let prefix = if whole_object {
        let version = resource.api_version().rsplit('/').next().unwrap_or("v1");
        format!("{kind} in version \"{version}\" cannot be handled as a {kind}: ")
    } else {
        String::new()
    };
    Err(ApiError::bad_request(format!(
        "{prefix}strict decoding error: {}",
        fields.join(", ")
    )))
}

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
pub(super) fn check_list_version(store: &Store, query: &Query) -> Result<(), ApiError> {
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
pub(super) fn watch_request(
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
