//! The differential test: one corpus of requests replayed, in order, against
//! mini-apiserver and the real kube-apiserver (v1.20.2 from `../shared/envtest`), comparing
//! status codes and normalized bodies (resourceVersion, uid, timestamps, managedFields masked;
//! for errors the `Status` code and reason, not the wording of the message). Prints the
//! agreement rate and every difference. Skips with a printed reason when the real apiserver's
//! assets are missing.
//!
//! Asserted: mini-apiserver never answers 5xx and never drops a connection on any corpus
//! request, and agrees on at least 95 % of them (the differences kept on purpose are listed in
//! `mini_apiserver`'s docs).

use std::time::Duration;

use e2e::ApiServer;
use e2e::envtest::{RealApiServer, skip_reason};
use rustls_pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod case;
mod validation;

use case::{Case, NS, case};

/// The corpus: every verb and option on every served kind, good and bad input.
fn corpus() -> Vec<Case> {
    let json = "application/json";
    let merge = "application/merge-patch+json";
    let mut cases = Vec::new();
    for path in [
        "/api",
        "/api/v1",
        "/apis",
        "/apis/coordination.k8s.io/v1",
        "/nope",
    ] {
        cases.push(case("GET", path.to_owned(), json, Value::Null));
    }
    let kinds: [(&str, &str, &str, Value); 4] = [
        (
            "/api/v1",
            "secrets",
            "Secret",
            json!({"data": {"k": "dg=="}}),
        ),
        (
            "/api/v1",
            "configmaps",
            "ConfigMap",
            json!({"data": {"k": "v"}}),
        ),
        (
            "/apis/coordination.k8s.io/v1",
            "leases",
            "Lease",
            json!({"spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}}),
        ),
        (
            "/api/v1",
            "events",
            "Event",
            json!({"involvedObject": {"kind": "ConfigMap", "name": "c", "namespace": NS},
                   "reason": "Tested", "message": "m", "type": "Normal"}),
        ),
    ];
    for (prefix, plural, kind, payload) in kinds {
        let api_version = if prefix == "/api/v1" {
            "v1".to_owned()
        } else {
            prefix.trim_start_matches("/apis/").to_owned()
        };
        let collection = format!("{prefix}/namespaces/{NS}/{plural}");
        let object = |name: &str, labels: Value| {
            let mut o = payload.clone();
            o["apiVersion"] = json!(api_version);
            o["kind"] = json!(kind);
            o["metadata"] = json!({"name": name, "labels": labels});
            o
        };
        for i in 0..10 {
            let labels = json!({"app": "diff", "n": i.to_string()});
            cases.push(case(
                "POST",
                collection.clone(),
                json,
                object(&format!("o{i}"), labels),
            ));
        }
        // Duplicates, bad names, kind and namespace mismatches, bodies that are not objects.
        cases.push(case(
            "POST",
            collection.clone(),
            json,
            object("o0", json!({})),
        ));
        cases.push(case(
            "POST",
            collection.clone(),
            json,
            object("Bad_Name", json!({})),
        ));
        let mut wrong_kind = object("wk", json!({}));
        wrong_kind["kind"] = json!("Pod");
        cases.push(case("POST", collection.clone(), json, wrong_kind));
        let mut wrong_ns = object("wn", json!({}));
        wrong_ns["metadata"]["namespace"] = json!("elsewhere");
        cases.push(case("POST", collection.clone(), json, wrong_ns));
        cases.push(case("POST", collection.clone(), json, json!("text")));
        cases.push(case("POST", collection.clone(), json, json!([1, 2])));
        let mut nameless = object("x", json!({}));
        nameless["metadata"] = json!({});
        cases.push(case("POST", collection.clone(), json, nameless));
        let mut generated = object("x", json!({}));
        generated["metadata"] = json!({"generateName": "gen-"});
        cases.push(case("POST", collection.clone(), json, generated));
        let mut bad_label = object("bl", json!({}));
        bad_label["metadata"]["labels"] = json!({"a": 1});
        cases.push(case("POST", collection.clone(), json, bad_label));
        cases.push(Case {
            method: "POST",
            path: collection.clone(),
            content_type: json,
            body: "{not json".into(),
        });
        cases.push(Case {
            method: "POST",
            path: collection.clone(),
            content_type: "text/plain",
            body: object("tp", json!({})).to_string(),
        });
        // Reads.
        for name in ["o0", "o1", "o5", "o6", "o7", "o8", "o9", "missing"] {
            cases.push(case(
                "GET",
                format!("{collection}/{name}"),
                json,
                Value::Null,
            ));
        }
        for query in [
            "",
            "?labelSelector=n%3D1",
            "?labelSelector=n!%3D1",
            "?labelSelector=n+in+(1,2)",
            "?labelSelector=n+notin+(1,2)",
            "?labelSelector=app",
            "?labelSelector=!app",
            "?labelSelector=n+in+1",
            "?fieldSelector=metadata.name%3Do2",
            "?fieldSelector=metadata.name!%3Do2",
            "?fieldSelector=spec.nothing%3Dx",
            "?fieldSelector=type%3DOpaque",
            "?limit=2",
            "?limit=abc",
            "?resourceVersion=0",
            "?resourceVersion=abc",
            "?continue=%21%21",
            "?limit=1",
            "?limit=5&labelSelector=app%3Ddiff",
            "?labelSelector=n%3D7,app",
            "?labelSelector=a%3Db%3Dc",
            "?fieldSelector=metadata.namespace%3Ddiff",
            "?fieldSelector=reason%3DTested",
            "?fieldSelector=involvedObject.name%3Dc",
            "?fieldSelector=bad",
        ] {
            cases.push(case(
                "GET",
                format!("{collection}{query}"),
                json,
                Value::Null,
            ));
        }
        // Updates: current, stale, missing, name mismatch.
        let mut update = object("o1", json!({"updated": "yes"}));
        cases.push(case(
            "PUT",
            format!("{collection}/o1"),
            json,
            update.clone(),
        ));
        update["metadata"]["resourceVersion"] = json!("1");
        cases.push(case(
            "PUT",
            format!("{collection}/o1"),
            json,
            update.clone(),
        ));
        cases.push(case(
            "PUT",
            format!("{collection}/missing"),
            json,
            object("missing", json!({})),
        ));
        cases.push(case(
            "PUT",
            format!("{collection}/o1"),
            json,
            object("other", json!({})),
        ));
        // Patches.
        cases.push(case(
            "PATCH",
            format!("{collection}/o2"),
            merge,
            json!({"metadata": {"labels": {"patched": "yes"}}}),
        ));
        cases.push(case(
            "PATCH",
            format!("{collection}/o2"),
            "application/json-patch+json",
            json!([{"op": "add", "path": "/metadata/labels/j", "value": "p"}]),
        ));
        cases.push(case(
            "PATCH",
            format!("{collection}/o2"),
            "application/json-patch+json",
            json!([{"op": "remove", "path": "/nope"}]),
        ));
        cases.push(case(
            "PATCH",
            format!("{collection}/o2"),
            "application/strategic-merge-patch+json",
            json!({"metadata": {"annotations": {"s": "m"}}}),
        ));
        cases.push(case(
            "PATCH",
            format!("{collection}/o2"),
            "text/plain",
            json!({}),
        ));
        cases.push(case(
            "PATCH",
            format!("{collection}/missing"),
            merge,
            json!({"metadata": {"labels": {"a": "b"}}}),
        ));
        cases.push(case(
            "PATCH",
            format!("{collection}/o2"),
            merge,
            json!({"metadata": {"labels": {"bad": 7}}}),
        ));
        // dryRun=All: validated and answered, nothing stored (the GETs after each show it).
        cases.push(case(
            "POST",
            format!("{collection}?dryRun=All"),
            json,
            object("dry", json!({"dry": "run"})),
        ));
        cases.push(case("GET", format!("{collection}/dry"), json, Value::Null));
        cases.push(case(
            "POST",
            format!("{collection}?dryRun=All"),
            json,
            object("Bad_Name", json!({})),
        ));
        cases.push(case(
            "POST",
            format!("{collection}?dryRun=o0"),
            json,
            object("dry", json!({})),
        ));
        cases.push(case(
            "POST",
            format!("{collection}?dryRun=All"),
            json,
            object("o0", json!({})),
        ));
        cases.push(case(
            "PUT",
            format!("{collection}/o1?dryRun=All"),
            json,
            object("o1", json!({"dry": "put"})),
        ));
        cases.push(case(
            "PATCH",
            format!("{collection}/o2?dryRun=All"),
            merge,
            json!({"metadata": {"labels": {"dry": "patch"}}}),
        ));
        cases.push(case(
            "PATCH",
            format!("{collection}/o2?dryRun=All"),
            merge,
            json!({"metadata": {"labels": {"bad": 7}}}),
        ));
        cases.push(case(
            "DELETE",
            format!("{collection}/o5?dryRun=All"),
            json,
            Value::Null,
        ));
        cases.push(case(
            "DELETE",
            format!("{collection}/o5"),
            json,
            json!({"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]}),
        ));
        cases.push(case(
            "DELETE",
            format!("{collection}/missing?dryRun=All"),
            json,
            Value::Null,
        ));
        for name in ["o1", "o2", "o5"] {
            cases.push(case(
                "GET",
                format!("{collection}/{name}"),
                json,
                Value::Null,
            ));
        }
        // Deletes: precondition mismatch, good, gone, collection.
        cases.push(case(
            "DELETE",
            format!("{collection}/o3"),
            json,
            json!({"kind": "DeleteOptions", "apiVersion": "v1",
                   "preconditions": {"uid": "not-the-uid"}}),
        ));
        cases.push(case(
            "DELETE",
            format!("{collection}/o3"),
            json,
            Value::Null,
        ));
        cases.push(case(
            "DELETE",
            format!("{collection}/o3"),
            json,
            Value::Null,
        ));
        cases.push(case("DELETE", format!("{collection}/o4"), json, json!("x")));
        cases.push(case(
            "PUT",
            format!("{collection}/o5"),
            json,
            object("o5", json!({"app": "diff", "n": "5"})),
        ));
        for name in ["o6", "o7", "o8", "o9"] {
            cases.push(case(
                "DELETE",
                format!("{collection}/{name}"),
                json,
                Value::Null,
            ));
        }
        cases.push(case("GET", collection.clone(), json, Value::Null));
        cases.push(case(
            "GET",
            format!("{prefix}/{plural}?labelSelector=app%3Ddiff"),
            json,
            Value::Null,
        ));
        // Legacy watch paths (a 1 s watch from now: no events, the stream just ends).
        for path in [
            format!("{prefix}/watch/namespaces/{NS}/{plural}?timeoutSeconds=1"),
            format!("{prefix}/watch/namespaces/{NS}/{plural}/o0?timeoutSeconds=1"),
        ] {
            cases.push(case("GET", path, json, Value::Null));
        }
        // deletecollection: dry run, by label, the rest; the list after each.
        for query in [
            "?labelSelector=app%3Ddiff&dryRun=All",
            "?labelSelector=n%3D5",
            "?labelSelector=n+in+(0,1)",
            "",
            "",
        ] {
            cases.push(case(
                "DELETE",
                format!("{collection}{query}"),
                json,
                Value::Null,
            ));
            cases.push(case("GET", collection.clone(), json, Value::Null));
        }
    }
    // `kubectl auth can-i`: SelfSubjectAccessReviews (the admin may do anything), a review
    // without attributes, and the group's discovery.
    let reviews = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";
    for spec in [
        json!({"resourceAttributes": {"namespace": NS, "verb": "get", "resource": "secrets"}}),
        json!({"resourceAttributes": {"namespace": NS, "verb": "create", "group": "coordination.k8s.io", "resource": "leases"}}),
        json!({"nonResourceAttributes": {"path": "/healthz", "verb": "get"}}),
        json!({}),
    ] {
        cases.push(case(
            "POST",
            reviews.to_owned(),
            json,
            json!({"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1", "spec": spec}),
        ));
    }
    cases.push(case("POST", reviews.to_owned(), json, json!([])));
    validation::cases(&mut cases);
    cases
}

/// One request over a fresh TLS connection (SNI `localhost-recovery`); (status, body).
async fn send(addr: std::net::SocketAddr, ca: &str, token: &str, case: &Case) -> (u16, String) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(e2e::tls::client_config(ca))
        .connect(ServerName::try_from("localhost-recovery").unwrap(), tcp)
        .await
        .unwrap();
    let request = format!(
        "{} {} HTTP/1.1\r\nHost: localhost-recovery\r\nAuthorization: Bearer {token}\r\nAccept: application/json\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        case.method,
        case.path,
        case.content_type,
        case.body.len(),
        case.body
    );
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut response)).await;
    let testkit::http::RawResponse { status, head, body } =
        testkit::http::RawResponse::parse(&response);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(&body)
    } else {
        body
    };
    (status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// What is compared of an answer.
fn normalize(body: &str) -> Value {
    let Ok(mut value) = serde_json::from_str::<Value>(body) else {
        return json!({"non-json": true});
    };
    if value["kind"] == "Status" {
        return json!({"kind": "Status", "code": value["code"], "reason": value["reason"],
                      "status": value["status"]});
    }
    mask(&mut value);
    // List order is unspecified for resourceVersion=0 (kube-apiserver's watch cache).
    if let Some(Value::Array(items)) = value.get_mut("items") {
        items.sort_by_key(|item| {
            (
                item["metadata"]["namespace"].to_string(),
                item["metadata"]["name"].to_string(),
            )
        });
    }
    value
}

fn mask(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for key in [
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "managedFields",
                "selfLink",
                "continue",
                "remainingItemCount",
                "serverAddressByClientCIDRs",
                "storageVersionHash",
            ] {
                map.remove(key);
            }
            if let Some(timestamp) = map.get_mut("deletionTimestamp") {
                *timestamp = json!("set");
            }
            if let Some(Value::String(name)) = map.get_mut("name")
                && name.starts_with("gen-")
            {
                *name = "gen-*".into();
            }
            for child in map.values_mut() {
                mask(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(mask),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mini_apiserver_answers_the_corpus_as_kube_apiserver_does() {
    e2e::install_crypto_provider();
    let cases = corpus();
    eprintln!("corpus: {} requests", cases.len());
    let tmp = tempfile::tempdir().unwrap();
    let mini = ApiServer::start(&tmp.path().join("mini"), &[]);
    let mut mini_answers = Vec::new();
    for case in &cases {
        let answer = send(mini.server.addr, &mini.recovery_ca, &mini.token, case).await;
        assert!(
            answer.0 != 0 && answer.0 < 500,
            "mini-apiserver: {} {} -> {} {}",
            case.method,
            case.path,
            answer.0,
            answer.1
        );
        mini_answers.push(answer);
    }
    if let Some(reason) = skip_reason() {
        eprintln!("SKIPPED the real side: {reason}");
        return;
    }
    let real = RealApiServer::start(&tmp.path().join("real"));
    real.create_namespace(NS).await;
    let mut agree = 0;
    let mut differences = Vec::new();
    for (case, mini_answer) in cases.iter().zip(&mini_answers) {
        let real_answer = send(real.addr(), &real.recovery_ca, &real.token, case).await;
        let (mini_norm, real_norm) = (normalize(&mini_answer.1), normalize(&real_answer.1));
        if mini_answer.0 == real_answer.0 && mini_norm == real_norm {
            agree += 1;
        } else {
            differences.push(format!(
                "{} {} [{}]\n    mini {} {}\n    real {} {}",
                case.method,
                case.path,
                case.content_type,
                mini_answer.0,
                mini_norm,
                real_answer.0,
                real_norm
            ));
        }
    }
    for difference in &differences {
        eprintln!("DIFF {difference}");
    }
    let rate = 100.0 * agree as f64 / cases.len() as f64;
    eprintln!("AGREEMENT: {agree}/{} = {rate:.1} %", cases.len());
    assert!(rate >= 95.0, "agreement {rate:.1} % is below 95 %");
}
