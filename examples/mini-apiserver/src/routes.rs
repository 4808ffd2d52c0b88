//! HTTP → verbs: the router (path → `Route`), authentication, then `objects` (the verbs on
//! objects), `discovery`, [`body`] (reading and decoding bodies) and `query`.
//!
//! Paths: `/api/v1[/watch][/namespaces/NS]/{secrets,configmaps,events}[/NAME]` and
//! `/apis/coordination.k8s.io/v1[/watch][/namespaces/NS]/leases[/NAME]` (`/watch/`: the legacy
//! watch paths); discovery at `/api`, `/api/v1`, `/apis`, `/apis/coordination.k8s.io[/v1]`,
//! `/apis/authorization.k8s.io[/v1]` (whose `selfsubject{access,rules}reviews` (`routes/review.rs`)
//! answers); `/openapi/v2`, `/openapi/v3[/GROUP-VERSION]` ([`crate::openapi`]);
//! `/healthz`, `/readyz`, `/livez` and (for clients without credentials) `/version` without
//! authentication; `/metrics` for any authenticated user (see [`crate::metrics`]). Bodies are JSON (YAML accepted where the content type says
//! so), at most [`MAX_BODY`] bytes. Lists are served from the newest state: a `continue` token
//! is a position (namespace, name), so later pages reflect later changes (kube-apiserver keeps
//! the first page's snapshot instead).

mod api;
pub mod body;
mod discovery;
mod objects;
mod query;
mod review;

use std::sync::Arc;

use examples::serve::{Body, full};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;

use crate::auth::User;
use crate::listener::Conn;
use crate::resource::Resource;
use crate::status::ApiError;
pub use api::{Api, MAX_BODY};
use body::{json_ok, json_response};
use discovery::{group_json, resource_list, version};
use objects::{Target, objects};
use query::Query;

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
    /// `/apis/authorization.k8s.io/v1/selfsubject{access,rules}reviews`.
    Review(review::Review),
    /// `/openapi/v2`.
    OpenApiV2,
    /// `/openapi/v3`: the list of group-version documents.
    OpenApiV3Root,
    /// `/openapi/v3/api/v1` etc.
    OpenApiV3(String),
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
        ["openapi", "v2"] => Some(Route::OpenApiV2),
        ["openapi", "v3"] => Some(Route::OpenApiV3Root),
        ["openapi", "v3", rest @ ..] => Some(Route::OpenApiV3(rest.join("/"))),
        ["api"] => Some(Route::CoreVersions),
        ["api", "v1"] => Some(Route::CoreResources),
        ["api", "v1", rest @ ..] => objects("", rest),
        ["apis"] => Some(Route::Groups),
        ["apis", "authorization.k8s.io", "v1", plural] => {
            review::Review::from_plural(plural).map(Route::Review)
        }
        ["apis", group] if *group == "coordination.k8s.io" || *group == "authorization.k8s.io" => {
            Some(Route::Group((*group).to_owned()))
        }
        ["apis", group, "v1"]
            if *group == "coordination.k8s.io" || *group == "authorization.k8s.io" =>
        {
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
            "groups": [group_json("coordination.k8s.io"), group_json("authorization.k8s.io")]
        }))),
        Route::Group(group) => Ok(json_ok(&group_json(&group))),
        Route::GroupResources(group) if group == "authorization.k8s.io" => {
            Ok(json_ok(&review::resource_list()))
        }
        Route::GroupResources(group) => Ok(json_ok(&resource_list(&format!("{group}/v1")))),
        Route::Review(kind) => review::review(&api.authorizer, &user, request, kind).await,
        Route::OpenApiV2 => {
            // kube-apiserver also serves the protobuf form; clients that ask only for it get
            // 406 and fall back (kubectl to the v3 documents).
            let accept = request
                .headers()
                .get(http::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if accept.contains("protobuf") && !accept.contains("json") && !accept.contains("*/*") {
                return Err(ApiError::new(
                    406,
                    "NotAcceptable",
                    "only application/json is served for /openapi/v2",
                ));
            }
            Ok(json_ok(&crate::openapi::v2()))
        }
        Route::OpenApiV3Root => Ok(json_ok(&crate::openapi::v3_root())),
        Route::OpenApiV3(path) => crate::openapi::v3(&path)
            .map(|doc| json_ok(&doc))
            .ok_or_else(|| ApiError::no_route(request.uri().path())),
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

#[cfg(test)]
mod tests;
