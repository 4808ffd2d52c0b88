//! Admission: what an object must be to enter the store. Completes `kind`, `apiVersion` and
//! `namespace`, checks names and keys, turns Secret `stringData` into `data`, and rejects
//! what kube-apiserver rejects (400 for bodies that do not decode, 422 Invalid for values),
//! before the store takes its lock-held decisions (resourceVersion, conflicts, history).

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Value, json};

use crate::resource::{Resource, is_dns_subdomain};
use crate::status::ApiError;

/// Validates and completes an object for `resource` in `namespace`: kind and apiVersion, name
/// (must equal `path_name` when given), namespace, Secret `stringData` and base64 `data`.
pub fn normalize(
    resource: Resource,
    namespace: &str,
    body: Value,
    path_name: Option<&str>,
) -> Result<Value, ApiError> {
    let Value::Object(mut object) = body else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    match object.get("kind") {
        None => {}
        Some(Value::String(kind)) if kind == resource.kind() => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "the kind {other} does not match the resource {} (expected {})",
                resource.plural(),
                resource.kind()
            )));
        }
    }
    match object.get("apiVersion") {
        None => {}
        Some(Value::String(v)) if v == resource.api_version() => {}
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "the apiVersion {other} does not match {}",
                resource.api_version()
            )));
        }
    }
    object.insert("kind".into(), json!(resource.kind()));
    object.insert("apiVersion".into(), json!(resource.api_version()));
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(metadata) = metadata else {
        return Err(ApiError::bad_request("metadata must be an object"));
    };
    match metadata.get("namespace") {
        None => {}
        Some(Value::String(ns)) if ns == namespace => {}
        Some(_) => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    metadata.insert("namespace".into(), json!(namespace));
    if let Some(path_name) = path_name {
        match metadata.get("name") {
            None => {
                metadata.insert("name".into(), json!(path_name));
            }
            Some(Value::String(name)) if name == path_name => {}
            Some(_) => {
                return Err(ApiError::bad_request(
                    "the name of the object does not match the name on the URL",
                ));
            }
        }
    }
    for field in ["labels", "annotations"] {
        // Empty and null maps are not stored (Go's omitempty in kube-apiserver).
        if metadata
            .get(field)
            .is_some_and(|m| m.is_null() || m.as_object().is_some_and(Map::is_empty))
        {
            metadata.remove(field);
        }
        if let Some(map) = metadata.get(field)
            && !(map.is_null()
                || map
                    .as_object()
                    .is_some_and(|m| m.values().all(Value::is_string)))
        {
            // A decoding error in kube-apiserver (the field is a map of strings): 400.
            return Err(ApiError::bad_request(format!(
                "metadata.{field}: values must be strings"
            )));
        }
    }
    let name = metadata
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    match resource {
        Resource::Secrets => normalize_secret(&mut object, &name)?,
        Resource::ConfigMaps => normalize_config_map(&object, &name)?,
        Resource::Events => {
            // The fields kube-apiserver always writes out (Go zero values).
            for (key, empty) in [
                ("eventTime", Value::Null),
                ("firstTimestamp", Value::Null),
                ("lastTimestamp", Value::Null),
                ("reportingComponent", json!("")),
                ("reportingInstance", json!("")),
                ("source", json!({})),
            ] {
                object.entry(key).or_insert(empty);
            }
        }
        Resource::Leases => {}
    }
    Ok(Value::Object(object))
}

fn normalize_secret(object: &mut Map<String, Value>, name: &str) -> Result<(), ApiError> {
    let invalid = |message: String| ApiError::invalid("Secret", name, message);
    let mut data = match object.remove("data") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(data)) => data,
        Some(_) => return Err(invalid("data: must be a map of base64 strings".to_owned())),
    };
    for (key, value) in &data {
        let decodes = value.as_str().is_some_and(|v| BASE64.decode(v).is_ok());
        if !decodes {
            return Err(invalid(format!(
                "data[{key}]: must be a base64-encoded string"
            )));
        }
    }
    match object.remove("stringData") {
        None | Some(Value::Null) => {}
        Some(Value::Object(strings)) => {
            for (key, value) in strings {
                let Value::String(text) = value else {
                    return Err(invalid(format!("stringData[{key}]: must be a string")));
                };
                data.insert(key, json!(BASE64.encode(text)));
            }
        }
        Some(_) => return Err(invalid("stringData: must be a map of strings".to_owned())),
    }
    for key in data.keys() {
        if !is_config_key(key) {
            return Err(invalid(format!(
                "data[{key}]: a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
            )));
        }
    }
    let size: usize = data
        .values()
        .filter_map(|v| v.as_str().and_then(|v| BASE64.decode(v).ok()))
        .map(|bytes| bytes.len())
        .sum();
    if size > MAX_DATA_SIZE {
        return Err(invalid(format!(
            "data: Too long: must have at most {MAX_DATA_SIZE} bytes"
        )));
    }
    // kubernetes.io/tls Secrets must carry both halves of the pair (ValidateSecret).
    if object.get("type").and_then(Value::as_str) == Some("kubernetes.io/tls") {
        let missing: Vec<String> = ["tls.crt", "tls.key"]
            .into_iter()
            .filter(|key| !data.contains_key(*key))
            .map(|key| format!("data[{key}]: Required value"))
            .collect();
        if !missing.is_empty() {
            return Err(invalid(joined(missing)));
        }
    }
    // An empty map is omitted, as kube-apiserver's encoding omits it.
    if !data.is_empty() {
        object.insert("data".into(), Value::Object(data));
    }
    object.entry("type").or_insert_with(|| json!("Opaque"));
    Ok(())
}

/// kube-apiserver's limit on a Secret's or ConfigMap's data (`core.MaxSecretSize`, 1 MiB).
pub const MAX_DATA_SIZE: usize = 1024 * 1024;

/// Several field errors as kube-apiserver prints them: one alone, else `[a, b]`.
fn joined(errors: Vec<String>) -> String {
    if errors.len() == 1 {
        errors.into_iter().next().unwrap_or_default()
    } else {
        format!("[{}]", errors.join(", "))
    }
}

/// An object's `metadata.finalizers`, when it is a list.
pub fn finalizers(object: &Value) -> Option<&[Value]> {
    object["metadata"]["finalizers"]
        .as_array()
        .map(Vec::as_slice)
}

/// `deletionTimestamp` is the server's: an update keeps `current`'s mark (and cannot set one);
/// while the object is being deleted it may remove finalizers, not add any. Returns whether
/// the object is being deleted.
///
/// # Errors
/// 422 for new finalizers on an object being deleted.
pub fn keep_deletion_mark(
    resource: Resource,
    name: &str,
    current: &Value,
    object: &mut Value,
) -> Result<bool, ApiError> {
    let deleting = current["metadata"].get("deletionTimestamp").cloned();
    check_finalizers(resource, name, current, object, deleting.is_some())?;
    if let Some(metadata) = object["metadata"].as_object_mut() {
        metadata.remove("deletionTimestamp");
        metadata.remove("deletionGracePeriodSeconds");
        if let Some(timestamp) = &deleting {
            metadata.insert("deletionTimestamp".into(), timestamp.clone());
            metadata.insert("deletionGracePeriodSeconds".into(), json!(0));
        }
    }
    Ok(deleting.is_some())
}

/// While an object is being deleted, an update may remove finalizers but not add any (422, as
/// kube-apiserver's ValidateObjectMetaUpdate).
///
/// # Errors
/// 422 Invalid naming the new finalizers.
fn check_finalizers(
    resource: Resource,
    name: &str,
    current: &Value,
    object: &Value,
    deleting: bool,
) -> Result<(), ApiError> {
    let before = finalizers(current).unwrap_or_default();
    let added: Vec<&str> = finalizers(object)
        .unwrap_or_default()
        .iter()
        .filter(|f| !before.contains(f))
        .filter_map(Value::as_str)
        .collect();
    if deleting && !added.is_empty() {
        return Err(ApiError::invalid(
            resource.kind(),
            name,
            format!(
                "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                added
                    .iter()
                    .map(|f| format!("{f:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    Ok(())
}

/// Checks an update from `current` to `object` as kube-apiserver's update validation does: a
/// Secret's `type` never changes, and the data of a Secret or ConfigMap with `immutable: true`
/// (and the flag itself) never change.
///
/// # Errors
/// 422 Invalid naming the fields.
pub fn check_update(
    resource: Resource,
    name: &str,
    current: &Value,
    object: &Value,
) -> Result<(), ApiError> {
    let mut errors = Vec::new();
    if resource == Resource::Secrets && current.get("type") != object.get("type") {
        errors.push(format!(
            "type: Invalid value: {}: field is immutable",
            object.get("type").unwrap_or(&Value::Null)
        ));
    }
    if matches!(resource, Resource::Secrets | Resource::ConfigMaps)
        && current.get("immutable") == Some(&Value::Bool(true))
    {
        let forbidden =
            |field: &str| format!("{field}: Forbidden: field is immutable when `immutable` is set");
        if object.get("immutable") != Some(&Value::Bool(true)) {
            errors.push(forbidden("immutable"));
        }
        let empty = Value::Object(Map::new());
        let fields: &[&str] = if resource == Resource::Secrets {
            &["data"]
        } else {
            &["data", "binaryData"]
        };
        for field in fields {
            let before = current
                .get(*field)
                .filter(|v| !v.is_null())
                .unwrap_or(&empty);
            let after = object
                .get(*field)
                .filter(|v| !v.is_null())
                .unwrap_or(&empty);
            if before != after {
                errors.push(forbidden(field));
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(resource.kind(), name, joined(errors)))
    }
}

fn normalize_config_map(object: &Map<String, Value>, name: &str) -> Result<(), ApiError> {
    let invalid = |message: String| ApiError::invalid("ConfigMap", name, message);
    if let Some(data) = object.get("data").filter(|d| !d.is_null()) {
        let Some(data) = data.as_object() else {
            return Err(invalid("data: must be a map of strings".to_owned()));
        };
        for (key, value) in data {
            if !value.is_string() || !is_config_key(key) {
                return Err(invalid(format!(
                    "data[{key}]: invalid key or non-string value"
                )));
            }
        }
    }
    let text_size: usize = object
        .get("data")
        .and_then(Value::as_object)
        .map_or(0, |d| {
            d.values().filter_map(Value::as_str).map(str::len).sum()
        });
    let binary_size: usize = object
        .get("binaryData")
        .and_then(Value::as_object)
        .map_or(0, |d| {
            d.values()
                .filter_map(|v| v.as_str().and_then(|v| BASE64.decode(v).ok()))
                .map(|b| b.len())
                .sum()
        });
    if text_size + binary_size > MAX_DATA_SIZE {
        return Err(invalid(format!(
            "[]: Too long: must have at most {MAX_DATA_SIZE} bytes"
        )));
    }
    if let Some(binary) = object.get("binaryData").filter(|d| !d.is_null()) {
        let Some(binary) = binary.as_object() else {
            return Err(invalid(
                "binaryData: must be a map of base64 strings".to_owned(),
            ));
        };
        for (key, value) in binary {
            if value.as_str().is_none_or(|v| BASE64.decode(v).is_err()) || !is_config_key(key) {
                return Err(invalid(format!(
                    "binaryData[{key}]: invalid key or not base64"
                )));
            }
        }
    }
    Ok(())
}

/// What the apiserver accepts as a Secret or ConfigMap key: `[-._a-zA-Z0-9]+`, at most 253
/// characters. (`..data` passes here, as it does in Kubernetes: rejecting it is the writer's job.)
fn is_config_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && key != "."
        && key != ".."
}

/// Checks an object name for `resource`: a DNS subdomain (Event names: only a valid path
/// segment, as kube-apiserver checks them).
pub fn check_name(resource: Resource, name: &str) -> Result<(), ApiError> {
    // kube-apiserver checks Event names only as path segments.
    let valid = if resource == Resource::Events {
        !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '%'])
    } else {
        is_dns_subdomain(name)
    };
    if valid {
        Ok(())
    } else {
        Err(ApiError::invalid(
            resource.kind(),
            name,
            "metadata.name: Invalid value: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'",
        ))
    }
}
