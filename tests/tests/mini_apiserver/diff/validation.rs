//! The validation, finalizer and strategic-merge-patch part of the differential corpus
//! (Secrets and ConfigMaps).

use serde_json::json;

use super::case::{Case, NS, case};

/// Validation as kube-apiserver does it: TLS Secrets need both keys, a Secret's type and the
/// data of `immutable` objects never change, data is at most 1 MiB.
pub(crate) fn cases(cases: &mut Vec<Case>) {
    let (json, merge) = ("application/json", "application/merge-patch+json");
    let secrets = format!("/api/v1/namespaces/{NS}/secrets");
    let maps = format!("/api/v1/namespaces/{NS}/configmaps");
    let tls = "kubernetes.io/tls";
    let posts = [
        (
            &secrets,
            json!({"metadata": {"name": "v-tls"}, "type": tls, "data": {"tls.crt": "Yw=="}}),
        ),
        (
            &secrets,
            json!({"metadata": {"name": "v-tls2"}, "type": tls, "data": {}}),
        ),
        (
            &secrets,
            json!({"metadata": {"name": "v-type"}, "data": {"tls.crt": "Yw==", "tls.key": "aw=="}}),
        ),
        (
            &secrets,
            json!({"metadata": {"name": "v-imm"}, "immutable": true, "data": {"a": "Yg=="}}),
        ),
        (
            &maps,
            json!({"metadata": {"name": "v-imm"}, "immutable": true, "data": {"a": "b"}}),
        ),
        (
            &maps,
            json!({"metadata": {"name": "v-big"}, "data": {"a": "x".repeat(1024 * 1024 + 1)}}),
        ),
        (
            &maps,
            json!({"metadata": {"name": "v-max"}, "data": {"a": "x".repeat(1024 * 1024)}}),
        ),
        (
            &secrets,
            json!({"metadata": {"name": "v-big"}, "stringData": {"a": "x".repeat(1024 * 1024 + 1)}}),
        ),
    ];
    for (collection, body) in posts {
        cases.push(case("POST", collection.clone(), json, body));
    }
    let patches = [
        (&secrets, "v-type", json!({"type": tls})),
        (&secrets, "v-imm", json!({"data": {"a": "Yw=="}})),
        (&secrets, "v-imm", json!({"immutable": false})),
        (
            &secrets,
            "v-imm",
            json!({"metadata": {"labels": {"ok": "yes"}}}),
        ),
        (&maps, "v-imm", json!({"data": {"a": "c"}})),
        (&maps, "v-imm", json!({"binaryData": {"b": "Yg=="}})),
        (&maps, "v-imm", json!({"immutable": null})),
        (
            &maps,
            "v-imm",
            json!({"metadata": {"labels": {"ok": "yes"}}}),
        ),
    ];
    for (collection, name, body) in patches {
        cases.push(case("PATCH", format!("{collection}/{name}"), merge, body));
    }
    cases.push(case(
        "PUT",
        format!("{secrets}/v-type"),
        json,
        json!({"metadata": {"name": "v-type"}, "type": tls, "data": {"tls.crt": "Yw==", "tls.key": "aw=="}}),
    ));
    cases.push(case(
        "PUT",
        format!("{secrets}/v-type"),
        json,
        json!({"metadata": {"name": "v-type"}, "type": "Opaque", "data": {}}),
    ));
    // Finalizers: a delete marks the object, it stays until its finalizers are removed, and
    // no new ones may be added meanwhile.
    let object = format!("{maps}/v-fin");
    cases.push(case(
        "POST",
        maps.clone(),
        json,
        json!({"metadata": {"name": "v-fin", "finalizers": ["example.com/hold"]}}),
    ));
    for (method, body) in [
        ("DELETE", serde_json::Value::Null),
        ("GET", serde_json::Value::Null),
        ("DELETE", serde_json::Value::Null),
        (
            "PATCH",
            json!({"metadata": {"finalizers": ["example.com/hold", "example.com/new"]}}),
        ),
        ("PATCH", json!({"data": {"a": "b"}})),
        ("PATCH", json!({"metadata": {"finalizers": null}})),
        ("GET", serde_json::Value::Null),
    ] {
        let content_type = if method == "PATCH" { merge } else { json };
        cases.push(case(method, object.clone(), content_type, body));
    }
    strategic(cases);
}

/// Strategic merge patches: finalizers merge as a set, ownerReferences by uid, directives.
fn strategic(cases: &mut Vec<Case>) {
    let smp = "application/strategic-merge-patch+json";
    let maps = format!("/api/v1/namespaces/{NS}/configmaps");
    let object = format!("{maps}/v-smp");
    let owner = |uid: &str, name: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": uid});
    let (one, two) = (
        "11111111-1111-1111-1111-111111111111",
        "22222222-2222-2222-2222-222222222222",
    );
    cases.push(case(
        "POST",
        maps.clone(),
        "application/json",
        json!({"metadata": {"name": "v-smp", "finalizers": ["a.io/x"], "ownerReferences": [owner(one, "o")]},
               "data": {"k": "v", "l": "w"}}),
    ));
    for patch in [
        json!({"metadata": {"finalizers": ["b.io/y"]}}),
        json!({"metadata": {"$setElementOrder/finalizers": ["b.io/y", "a.io/x"], "finalizers": ["b.io/y"]}}),
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a.io/x"]}}),
        json!({"metadata": {"ownerReferences": [owner(two, "p")]}}),
        json!({"metadata": {"ownerReferences": [{"uid": one, "$patch": "delete"}]}}),
        json!({"metadata": {"ownerReferences": [{"uid": two, "name": "renamed"}]}}),
        json!({"data": {"$patch": "replace", "z": "1"}}),
        json!({"data": {"k": null, "z": "2"}}),
        json!({"metadata": {"finalizers": null}}),
        json!([]),
    ] {
        cases.push(case("PATCH", object.clone(), smp, patch));
    }
    cases.push(case(
        "GET",
        object,
        "application/json",
        serde_json::Value::Null,
    ));
}
