//! OpenAPI v2 (`/openapi/v2`, JSON) and v3 (`/openapi/v3` and one document per group
//! version) documents for the served kinds, as kube-apiserver publishes them.
//!
//! The schemas come from the Kubernetes types' own JSON schemas (k8s-openapi's `schemars`
//! implementations, named `io.k8s.api.core.v1.ConfigMap` etc. as upstream names them); this
//! module only adds what those schemas leave out: the `x-kubernetes-group-version-kind` of each
//! kind, the patch strategies of `ObjectMeta`'s lists (Go struct tags upstream), the list kinds,
//! and the paths with their verbs and query parameters.
//!
//! kubectl reads the v3 documents to decide whether the server validates fields itself
//! (`fieldValidation` on the PATCH operation of the kind) and which strategic-merge patch
//! strategies a kind's lists have (`kubectl apply`). The protobuf form of v2 is not served
//! (406, as kube-apiserver answers to an `Accept` it cannot produce): kubectl then uses v3.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ListMeta, Status};
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};

use crate::resource::Resource;

/// Which OpenAPI version a document is for (where references point, how parameters look).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V2,
    V3,
}

impl Version {
    fn definitions(self) -> &'static str {
        match self {
            Version::V2 => "#/definitions/",
            Version::V3 => "#/components/schemas/",
        }
    }

    fn reference(self, name: &str) -> Value {
        json!({ "$ref": format!("{}{name}", self.definitions()) })
    }
}

/// The upstream name of a kind's schema.
fn schema_name(resource: Resource) -> String {
    let package = match resource {
        Resource::Leases => "io.k8s.api.coordination.v1",
        _ => "io.k8s.api.core.v1",
    };
    format!("{package}.{}", resource.kind())
}

fn gvk(resource: Resource, kind: &str) -> Value {
    let version = resource
        .api_version()
        .rsplit('/')
        .next()
        .unwrap_or("v1")
        .to_owned();
    json!([{ "group": resource.group(), "version": version, "kind": kind }])
}

/// The schemas of the given kinds and everything they reference, their lists, `Status` and
/// `DeleteOptions`.
fn schemas(version: Version, resources: &[Resource]) -> Map<String, Value> {
    let settings = match version {
        Version::V2 => SchemaSettings::draft07(),
        Version::V3 => SchemaSettings::openapi3(),
    };
    let mut generator = SchemaGenerator::new(settings);
    generator.subschema_for::<Status>();
    generator.subschema_for::<DeleteOptions>();
    generator.subschema_for::<ListMeta>();
    for resource in resources {
        match resource {
            Resource::Secrets => generator.subschema_for::<Secret>(),
            Resource::ConfigMaps => generator.subschema_for::<ConfigMap>(),
            Resource::Events => generator.subschema_for::<Event>(),
            Resource::Leases => generator.subschema_for::<Lease>(),
        };
    }
    let mut definitions = generator.take_definitions(true);
    for resource in resources {
        let name = schema_name(*resource);
        if let Some(Value::Object(schema)) = definitions.get_mut(&name) {
            schema.insert(
                "x-kubernetes-group-version-kind".into(),
                gvk(*resource, resource.kind()),
            );
        }
        let list_kind = format!("{}List", resource.kind());
        definitions.insert(
            format!("{name}List"),
            json!({
                "description": format!("{list_kind} is a list of {}s.", resource.kind()),
                "type": "object",
                "required": ["items"],
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "items": {"type": "array", "items": version.reference(&name)},
                    "metadata": version.reference("io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"),
                },
                "x-kubernetes-group-version-kind": gvk(*resource, &list_kind),
            }),
        );
    }
    // ObjectMeta's patch strategies (`patchStrategy`/`patchMergeKey` struct tags upstream).
    if let Some(properties) = definitions
        .get_mut("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")
        .and_then(|meta| meta.get_mut("properties"))
    {
        if let Some(Value::Object(finalizers)) = properties.get_mut("finalizers") {
            finalizers.insert("x-kubernetes-patch-strategy".into(), "merge".into());
        }
        if let Some(Value::Object(owners)) = properties.get_mut("ownerReferences") {
            owners.insert("x-kubernetes-patch-strategy".into(), "merge".into());
            owners.insert("x-kubernetes-patch-merge-key".into(), "uid".into());
        }
    }
    definitions
}

/// A query parameter in the given version's form.
fn query_param(version: Version, name: &str, kind: &str, description: &str) -> Value {
    match version {
        Version::V2 => {
            json!({"name": name, "in": "query", "type": kind, "uniqueItems": true, "description": description})
        }
        Version::V3 => {
            json!({"name": name, "in": "query", "schema": {"type": kind, "uniqueItems": true}, "description": description})
        }
    }
}

fn write_params(version: Version) -> Vec<Value> {
    vec![
        query_param(
            version,
            "dryRun",
            "string",
            "When present, indicates that modifications should not be persisted.",
        ),
        query_param(
            version,
            "fieldManager",
            "string",
            "A name associated with the actor or entity that is making these changes.",
        ),
        query_param(
            version,
            "fieldValidation",
            "string",
            "How the server handles unknown or duplicate fields: Ignore, Warn or Strict.",
        ),
    ]
}

/// One operation: `action` is the `x-kubernetes-action`, `body` the media types it accepts.
fn operation(
    version: Version,
    resource: Resource,
    action: &str,
    mut parameters: Vec<Value>,
    body: &[&str],
    response: &str,
) -> Value {
    let kind = resource.kind();
    let mut op = json!({
        "description": format!("{action} {kind}"),
        "operationId": format!("{action}{kind}"),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk(resource, kind).as_array().map(|a| a[0].clone()),
    });
    let response_schema = version.reference(response);
    match version {
        Version::V2 => {
            if !body.is_empty() {
                parameters.push(json!({"name": "body", "in": "body", "required": true, "schema": {"type": "object"}}));
                op["consumes"] = json!(body);
            }
            op["produces"] = json!(["application/json", "application/yaml"]);
            op["responses"] = json!({"200": {"description": "OK", "schema": response_schema}});
        }
        Version::V3 => {
            if !body.is_empty() {
                let content: Map<String, Value> = body
                    .iter()
                    .map(|t| ((*t).to_owned(), json!({"schema": {"type": "object"}})))
                    .collect();
                op["requestBody"] = json!({"content": content, "required": true});
            }
            op["responses"] = json!({"200": {"description": "OK", "content": {
                "application/json": {"schema": response_schema.clone()},
                "application/yaml": {"schema": response_schema},
            }}});
        }
    }
    op["parameters"] = Value::Array(parameters);
    op
}

fn path_params(version: Version, names: &[&str]) -> Vec<Value> {
    names
        .iter()
        .map(|name| match version {
            Version::V2 => {
                json!({"name": name, "in": "path", "required": true, "type": "string", "uniqueItems": true})
            }
            Version::V3 => {
                json!({"name": name, "in": "path", "required": true, "schema": {"type": "string", "uniqueItems": true}})
            }
        })
        .collect()
}

const PATCH_TYPES: [&str; 4] = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/apply-patch+yaml",
];

/// The paths of one resource: collection, namespaced collection, one object.
fn paths(version: Version, resource: Resource) -> Map<String, Value> {
    let prefix = match resource.group() {
        "" => "/api/v1".to_owned(),
        group => format!("/apis/{group}/v1"),
    };
    let name = schema_name(resource);
    let list = format!("{name}List");
    let status = "io.k8s.apimachinery.pkg.apis.meta.v1.Status";
    let plural = resource.plural();
    let mut paths = Map::new();
    let json_body = ["application/json", "application/yaml"];
    paths.insert(
        format!("{prefix}/{plural}"),
        json!({"get": operation(version, resource, "list", vec![], &[], &list)}),
    );
    let mut collection = json!({
        "get": operation(version, resource, "list", vec![], &[], &list),
        "post": operation(version, resource, "post", write_params(version), &json_body, &name),
        "delete": operation(version, resource, "deletecollection", vec![query_param(version, "dryRun", "string", "")], &json_body, status),
    });
    collection["parameters"] = json!(path_params(version, &["namespace"]));
    paths.insert(
        format!("{prefix}/namespaces/{{namespace}}/{plural}"),
        collection,
    );
    let mut patch_params = write_params(version);
    patch_params.push(query_param(
        version,
        "force",
        "boolean",
        "Force is going to \"force\" Apply requests.",
    ));
    let mut object = json!({
        "get": operation(version, resource, "get", vec![], &[], &name),
        "put": operation(version, resource, "put", write_params(version), &json_body, &name),
        "patch": operation(version, resource, "patch", patch_params, &PATCH_TYPES, &name),
        "delete": operation(version, resource, "delete", vec![query_param(version, "dryRun", "string", "")], &json_body, status),
    });
    object["parameters"] = json!(path_params(version, &["name", "namespace"]));
    paths.insert(
        format!("{prefix}/namespaces/{{namespace}}/{plural}/{{name}}"),
        object,
    );
    paths
}

/// The v2 document of every served kind.
pub fn v2() -> Value {
    let mut all_paths = Map::new();
    for resource in Resource::ALL {
        all_paths.extend(paths(Version::V2, resource));
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": all_paths,
        "definitions": schemas(Version::V2, &Resource::ALL),
    })
}

/// The v3 document of one group version (`api/v1`, `apis/coordination.k8s.io/v1`), `None` for
/// one not served.
pub fn v3(group_version_path: &str) -> Option<Value> {
    let resources: Vec<Resource> = Resource::ALL
        .into_iter()
        .filter(|r| group_version_path_of(*r) == group_version_path)
        .collect();
    if resources.is_empty() {
        return None;
    }
    let mut all_paths = Map::new();
    for resource in &resources {
        all_paths.extend(paths(Version::V3, *resource));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": all_paths,
        "components": {"schemas": schemas(Version::V3, &resources)},
    }))
}

fn group_version_path_of(resource: Resource) -> String {
    match resource.group() {
        "" => "api/v1".to_owned(),
        group => format!("apis/{group}/v1"),
    }
}

/// The v3 discovery document: each group version's document with a hash of its content
/// (clients cache by it, as with kube-apiserver's).
pub fn v3_root() -> Value {
    let mut paths = BTreeMap::new();
    for resource in Resource::ALL {
        let path = group_version_path_of(resource);
        if paths.contains_key(&path) {
            continue;
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        v3(&path).map(|doc| doc.to_string()).hash(&mut hasher);
        let url = format!("/openapi/v3/{path}?hash={:016X}", hasher.finish());
        paths.insert(path, json!({"serverRelativeURL": url}));
    }
    json!({ "paths": paths })
}

/// The fields of `object` (a `resource` object or a merge patch of one) that its schema does
/// not declare, as dotted paths (`spec.foo`, `metadata.ownerReferences[0].bar`):
/// `fieldValidation=Strict` refuses them. `$` directives of strategic-merge patches are not
/// fields.
pub fn unknown_fields(resource: Resource, object: &Value) -> Vec<String> {
    static SCHEMAS: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    let schemas = SCHEMAS.get_or_init(|| schemas(Version::V3, &Resource::ALL));
    let mut unknown = Vec::new();
    if let Some(schema) = schemas.get(&schema_name(resource)) {
        walk(schemas, schema, object, "", &mut unknown);
    }
    unknown
}

fn walk(
    schemas: &Map<String, Value>,
    schema: &Value,
    value: &Value,
    path: &str,
    unknown: &mut Vec<String>,
) {
    let mut schema = schema;
    // A reference (at most a few levels: the schemas are not recursive where values are).
    for _ in 0..8 {
        match schema
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/components/schemas/"))
            .and_then(|name| schemas.get(name))
        {
            Some(target) => schema = target,
            None => break,
        }
    }
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        for part in all {
            walk(schemas, part, value, path, unknown);
        }
        return;
    }
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match value {
        Value::Object(map) => {
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                for (key, child) in map.iter().filter(|(k, _)| !k.starts_with('$')) {
                    match properties.get(key) {
                        Some(child_schema) => {
                            walk(schemas, child_schema, child, &join(key), unknown);
                        }
                        None => unknown.push(join(key)),
                    }
                }
            } else if let Some(values) =
                schema.get("additionalProperties").filter(|a| a.is_object())
            {
                for (key, child) in map {
                    walk(schemas, values, child, &join(key), unknown);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter().enumerate() {
                    walk(
                        schemas,
                        item_schema,
                        item,
                        &format!("{path}[{index}]"),
                        unknown,
                    );
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v3_documents_describe_each_served_kind_with_resolvable_references() {
        for path in ["api/v1", "apis/coordination.k8s.io/v1"] {
            let doc = v3(path).unwrap();
            let text = doc.to_string();
            let schemas = doc["components"]["schemas"].as_object().unwrap();
            // Every reference points at a schema of the same document.
            for reference in text.split("\"$ref\":\"").skip(1) {
                let target = reference.split('"').next().unwrap();
                let name = target.strip_prefix("#/components/schemas/").unwrap();
                assert!(schemas.contains_key(name), "{path}: dangling {target}");
            }
        }
        let core = v3("api/v1").unwrap();
        let config_map = &core["components"]["schemas"]["io.k8s.api.core.v1.ConfigMap"];
        assert_eq!(
            config_map["x-kubernetes-group-version-kind"][0]["kind"],
            "ConfigMap"
        );
        assert_eq!(
            config_map["properties"]["data"]["additionalProperties"]["type"],
            "string"
        );
        let patch = &core["paths"]["/api/v1/namespaces/{namespace}/secrets/{name}"]["patch"];
        assert_eq!(patch["x-kubernetes-group-version-kind"]["kind"], "Secret");
        assert!(
            patch["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation")
        );
        assert!(v3("apis/apps/v1").is_none());
        let root = v3_root();
        assert!(
            root["paths"]["apis/coordination.k8s.io/v1"]["serverRelativeURL"]
                .as_str()
                .unwrap()
                .starts_with("/openapi/v3/apis/coordination.k8s.io/v1?hash=")
        );
    }

    #[test]
    fn unknown_fields_are_found_at_any_depth_and_declared_ones_pass() {
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "l", "labels": {"any": "x"}, "labelz": {},
                         "ownerReferences": [{"uid": "u", "name": "n", "kind": "K", "apiVersion": "v1", "colour": 1}]},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "holder": "b"},
            "$setElementOrder/finalizers": [],
        });
        assert_eq!(
            unknown_fields(Resource::Leases, &lease),
            [
                "metadata.labelz",
                "metadata.ownerReferences[0].colour",
                "spec.holder"
            ]
        );
        let map = json!({"kind": "ConfigMap", "data": {"k": "v"}, "immutable": true, "metadata": {"name": "c"}});
        assert!(unknown_fields(Resource::ConfigMaps, &map).is_empty());
        let event = json!({"involvedObject": {"kind": "ConfigMap"}, "reason": "r", "series": {"count": 1, "bogus": 2}});
        assert_eq!(unknown_fields(Resource::Events, &event), ["series.bogus"]);
    }

    #[test]
    fn v2_definitions_reference_definitions() {
        let doc = v2();
        let definitions = doc["definitions"].as_object().unwrap();
        for name in [
            "io.k8s.api.core.v1.Secret",
            "io.k8s.api.core.v1.EventList",
            "io.k8s.api.coordination.v1.Lease",
        ] {
            assert!(definitions.contains_key(name), "{name}");
        }
        let text = doc.to_string();
        for reference in text.split("\"$ref\":\"").skip(1) {
            let target = reference.split('"').next().unwrap();
            let name = target.strip_prefix("#/definitions/").unwrap();
            assert!(definitions.contains_key(name), "dangling {target}");
        }
    }
}
