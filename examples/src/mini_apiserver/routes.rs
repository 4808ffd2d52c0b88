//! HTTP → verbs: path and query parsing, authentication, discovery, CRUD, list and watch.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::auth::{Tokens, User};
use super::resource::Resource;
use super::select::Selector;
use super::status::ApiError;
use super::store::{PatchKind, Store, meta_str};
use crate::serve::{Body, ConnInfo, full};

/// Request bodies above this size are refused (the apiserver's own limit is about 3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// Everything a request handler needs.
#[derive(Debug)]
pub struct Api {
    /// The objects.
    pub store: Arc<Store>,
    /// Who may call.
    pub tokens: Tokens,
    /// Whether TLS client certificates (verified against `--client-ca`) authenticate users.
    pub client_cert_auth: bool,
}

/// Where a request goes.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Version,
    Health,
    CoreVersions,
    CoreResources,
    Groups,
    Group(String),
    GroupResources(String),
    Objects {
        resource: Resource,
        namespace: Option<String>,
        name: Option<String>,
    },
}

fn parse_route(path: &str) -> Option<Route> {
    let parts: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|p| !p.is_empty())
        .collect();
    let objects = |group: &str, rest: &[&str]| -> Option<Route> {
        match rest {
            ["namespaces", ns, plural] => Some(Route::Objects {
                resource: Resource::from_plural(group, plural)?,
                namespace: Some((*ns).to_owned()),
                name: None,
            }),
            ["namespaces", ns, plural, name] => Some(Route::Objects {
                resource: Resource::from_plural(group, plural)?,
                namespace: Some((*ns).to_owned()),
                name: Some((*name).to_owned()),
            }),
            [plural] => Some(Route::Objects {
                resource: Resource::from_plural(group, plural)?,
                namespace: None,
                name: None,
            }),
            _ => None,
        }
    };
    match parts.as_slice() {
        ["version"] => Some(Route::Version),
        ["healthz" | "readyz" | "livez"] => Some(Route::Health),
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
pub async fn handle(
    api: Arc<Api>,
    conn: Arc<ConnInfo>,
    request: Request<Incoming>,
) -> Response<Body> {
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
    conn: &ConnInfo,
    request: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let route = parse_route(request.uri().path())
        .ok_or_else(|| ApiError::no_route(request.uri().path()))?;
    if route == Route::Health {
        return Ok(Response::new(full("ok")));
    }
    let user = authenticate(api, conn, &request).ok_or_else(ApiError::unauthorized)?;
    let query = Query::parse(request.uri().query().unwrap_or(""));
    match route {
        Route::Health => unreachable!("answered above"),
        Route::Version => Ok(json_ok(&json!({
            "major": "1", "minor": "33", "gitVersion": "v1.33.0-mini-apiserver",
            "platform": "linux/amd64", "goVersion": "n/a", "compiler": "rustc",
            "gitCommit": "", "gitTreeState": "clean", "buildDate": ""
        }))),
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
        } => objects(api, &user, request, &query, resource, namespace, name).await,
    }
}

fn authenticate(api: &Api, conn: &ConnInfo, request: &Request<Incoming>) -> Option<User> {
    let header = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if let Some(user) = api.tokens.authenticate(header) {
        return Some(user);
    }
    // The TLS layer verified the chain against --client-ca before we get here.
    if api.client_cert_auth
        && let Some(leaf) = conn.peer_certs.first()
        && let Ok(info) = reload_lib::CertInfo::from_der(leaf)
    {
        let name = info
            .subject
            .split(',')
            .find_map(|rdn| rdn.trim().strip_prefix("CN="))
            .unwrap_or("");
        if !name.is_empty() {
            return Some(User {
                name: name.to_owned(),
                groups: Vec::new(),
            });
        }
    }
    None
}

#[allow(clippy::too_many_arguments)]
async fn objects(
    api: &Api,
    user: &User,
    request: Request<Incoming>,
    query: &Query,
    resource: Resource,
    namespace: Option<String>,
    name: Option<String>,
) -> Result<Response<Body>, ApiError> {
    let watching = query.flag("watch");
    let verb = match (request.method(), &name, watching) {
        (&Method::GET, None, true) => "watch",
        (&Method::GET, None, false) => "list",
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
    if !api.tokens.allows(user, verb) {
        return Err(ApiError::forbidden(format!(
            "User \"{}\" cannot {verb} resource \"{}\" in namespace \"{}\"",
            user.name,
            resource.plural(),
            namespace.as_deref().unwrap_or("")
        )));
    }
    let namespaced = |ns: &Option<String>| {
        ns.clone()
            .ok_or_else(|| ApiError::method_not_allowed(format!("{verb} needs a namespace")))
    };
    let store = &api.store;
    match verb {
        "list" => list(store, query, resource, namespace.as_deref()),
        "watch" => watch(store, query, resource, namespace),
        "get" => Ok(json_ok(&store.get(
            resource,
            &namespaced(&namespace)?,
            name.as_deref().unwrap_or(""),
        )?)),
        "create" => {
            let ns = namespaced(&namespace)?;
            let body = read_body(request).await?;
            let object = store.create(resource, &ns, body)?;
            log_change("created", resource, &object);
            Ok(json_response(StatusCode::CREATED, &object))
        }
        "update" => {
            let ns = namespaced(&namespace)?;
            let body = read_body(request).await?;
            let object = store.update(resource, &ns, name.as_deref().unwrap_or(""), body)?;
            log_change("updated", resource, &object);
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
            let body = read_body(request).await?;
            let object = store.patch(resource, &ns, name.as_deref().unwrap_or(""), kind, body)?;
            log_change("patched", resource, &object);
            Ok(json_ok(&object))
        }
        "delete" => {
            let ns = namespaced(&namespace)?;
            let object = store.delete(resource, &ns, name.as_deref().unwrap_or(""))?;
            log_change("deleted", resource, &object);
            Ok(json_ok(&object))
        }
        _ => unreachable!("verbs are enumerated above"),
    }
}

fn log_change(what: &str, resource: Resource, object: &Value) {
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
    let selector = Selector::parse(query.get("labelSelector"), query.get("fieldSelector"))?;
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
    let (items, rv, next) = store.list(resource, namespace, &selector, limit, after.as_ref());
    let mut metadata = json!({ "resourceVersion": rv.to_string() });
    if let Some((ns, name)) = next {
        metadata["continue"] = json!(URL_SAFE_NO_PAD.encode(format!("{ns}/{name}")));
    }
    Ok(json_ok(&json!({
        "kind": format!("{}List", resource.kind()),
        "apiVersion": resource.api_version(),
        "metadata": metadata,
        "items": items,
    })))
}

fn decode_continue(token: &str) -> Option<(String, String)> {
    let text = String::from_utf8(URL_SAFE_NO_PAD.decode(token).ok()?).ok()?;
    let (ns, name) = text.split_once('/')?;
    Some((ns.to_owned(), name.to_owned()))
}

/// Streams watch events as JSON lines until `timeoutSeconds`, the client leaving, or a 410.
fn watch(
    store: &Arc<Store>,
    query: &Query,
    resource: Resource,
    namespace: Option<String>,
) -> Result<Response<Body>, ApiError> {
    let selector = Selector::parse(query.get("labelSelector"), query.get("fieldSelector"))?;
    let from = match query.get("resourceVersion") {
        None | Some("") | Some("0") => None,
        Some(text) => Some(
            text.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {text:?}")))?,
        ),
    };
    let timeout = match query.get("timeoutSeconds") {
        None => Duration::from_secs(1800),
        Some(text) => Duration::from_secs(
            text.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {text:?}")))?,
        ),
    };
    let bookmarks = query.flag("allowWatchBookmarks");
    // A start that is already too old is reported like the apiserver does: HTTP 200 and an
    // ERROR event with a 410 Status, which is what makes clients relist.
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let store = Arc::clone(store);
    tokio::spawn(async move {
        let filter = WatchFilter {
            resource,
            namespace,
            selector,
        };
        if let Err(err) = stream_events(&store, &filter, from, timeout, bookmarks, &tx).await {
            let _ = tx
                .send(line(&json!({"type": "ERROR", "object": err.to_status()})))
                .await;
        }
    });
    let body = StreamBody::new(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, std::io::Error>(Frame::data(bytes)), rx))
    }));
    Ok(Response::builder()
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(BodyExt::boxed(body))
        .expect("static response parts are valid"))
}

struct WatchFilter {
    resource: Resource,
    namespace: Option<String>,
    selector: Selector,
}

impl WatchFilter {
    fn matches(&self, resource: Resource, object: &Value) -> bool {
        resource == self.resource
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| ns == meta_str(object, "namespace"))
            && self.selector.matches(object)
    }
}

/// The watch loop. Reads the history after the last resourceVersion sent, so a slow client
/// delays only itself, and nothing is lost or repeated.
async fn stream_events(
    store: &Store,
    filter: &WatchFilter,
    from: Option<u64>,
    timeout: Duration,
    bookmarks: bool,
    tx: &mpsc::Sender<Bytes>,
) -> Result<(), ApiError> {
    let mut latest = store.subscribe();
    latest.borrow_and_update();
    let mut last = match from {
        Some(from) => from,
        None => {
            // No starting point: the current state as ADDED events, then changes.
            let (items, rv, _) = store.list(
                filter.resource,
                filter.namespace.as_deref(),
                &filter.selector,
                None,
                None,
            );
            for item in items {
                if tx
                    .send(line(&json!({"type": "ADDED", "object": item})))
                    .await
                    .is_err()
                {
                    return Ok(());
                }
            }
            rv
        }
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let mut bookmark_timer = tokio::time::interval(Duration::from_secs(5));
    bookmark_timer.tick().await;
    loop {
        for change in store.changes_since(last)? {
            if filter.matches(change.resource, &change.object) {
                let event = json!({"type": change.kind.event_type(), "object": change.object});
                if tx.send(line(&event)).await.is_err() {
                    return Ok(());
                }
            }
            last = change.rv;
        }
        tokio::select! {
            changed = latest.changed() => if changed.is_err() { return Ok(()) },
            () = tokio::time::sleep_until(deadline) => return Ok(()),
            _ = bookmark_timer.tick(), if bookmarks => {
                let bookmark = json!({"type": "BOOKMARK", "object": {
                    "kind": filter.resource.kind(), "apiVersion": filter.resource.api_version(),
                    "metadata": {"resourceVersion": last.to_string()}
                }});
                if tx.send(line(&bookmark)).await.is_err() {
                    return Ok(());
                }
            }
            () = tx.closed() => return Ok(()),
        }
    }
}

fn line(value: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

async fn read_body(request: Request<Incoming>) -> Result<Value, ApiError> {
    let is_yaml = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.contains("yaml"));
    let bytes = Limited::new(request.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|err| {
            if err
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                ApiError::too_large(MAX_BODY)
            } else {
                ApiError::bad_request(format!("cannot read the body: {err}"))
            }
        })?
        .to_bytes();
    if is_yaml && serde_json::from_slice::<Value>(&bytes).is_err() {
        serde_norway::from_slice::<Value>(&bytes)
            .map_err(|err| ApiError::bad_request(format!("malformed YAML: {err}")))
    } else {
        serde_json::from_slice::<Value>(&bytes)
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
            json!({
                "name": r.plural(), "singularName": r.kind().to_ascii_lowercase(), "namespaced": true,
                "kind": r.kind(),
                "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]
            })
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
                name: Some("a".into())
            })
        );
        assert_eq!(
            parse_route("/apis/coordination.k8s.io/v1/namespaces/ns/leases"),
            Some(Route::Objects {
                resource: Resource::Leases,
                namespace: Some("ns".into()),
                name: None
            })
        );
        assert_eq!(
            parse_route("/api/v1/configmaps"),
            Some(Route::Objects {
                resource: Resource::ConfigMaps,
                namespace: None,
                name: None
            })
        );
        assert_eq!(parse_route("/api/v1/namespaces/ns/pods"), None);
        assert_eq!(
            parse_route("/apis/coordination.k8s.io/v1/namespaces/ns/secrets"),
            None
        );
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
