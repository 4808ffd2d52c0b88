//! Unit tests of the router: paths, watch and list parameters, client certificates, queries.

use super::*;
use crate::auth::{Authorizer, Tokens};
use crate::store::Store;
use crate::watch::Start;
use objects::{check_list_version, watch_request};
use query::{Query, percent_decode};
use serde_json::json;
use std::time::Duration;

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
        metrics: crate::metrics::Metrics::default(),
        audit: None,
    }
}

#[test]
fn watch_parameters_choose_where_the_stream_starts() {
    let api = api();
    let start = |query: &str| {
        watch_request(&Query::parse(query), Resource::Secrets, None, None, &api).map(|w| w.start)
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
    let cert = testkit::pki::self_signed(
        &testkit::pki::CertSpec::client("system:admin").organization("system:masters"),
    );
    let user = user_from_certificate(&cert.der).unwrap();
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
