//! Entry points for the fuzz target `mini_apiserver_requests` in `fuzz/` (see `fuzz/README.md`):
//! what mini-apiserver does with the untrusted parts of a request — the body (JSON, YAML,
//! protobuf), DeleteOptions, label and field selectors — and the validation a create and a
//! merge patch apply to the decoded object, on an in-memory store without sockets or a runtime.
//! Not part of the API: hidden from the docs, may change or go away in any release.

use serde_json::Value;

use crate::resource::Resource;
use crate::routes;
use crate::select::Selector;
use crate::status::ApiError;
use crate::store::{PatchKind, Store};

/// The served kinds, for targets that pick one by index.
pub const RESOURCES: [Resource; 4] = [
    Resource::Secrets,
    Resource::ConfigMaps,
    Resource::Events,
    Resource::Leases,
];

/// Decodes `body` as a request of `content_type` (e.g. `application/vnd.kubernetes.protobuf`,
/// `application/yaml`, `application/json`), then creates it in a fresh in-memory store and
/// strategic-merge- and merge-patches the created object with the same body, and looks for
/// undeclared fields in it. Returns the created object.
///
/// # Errors
/// The `Status` error the server would answer (a 4xx for any bad input; a 5xx is a bug).
pub fn create_and_patch(
    resource: Resource,
    content_type: &str,
    body: &[u8],
) -> Result<Value, ApiError> {
    let value = routes::body::decode_body(resource, content_type, body)?;
    let store = Store::open(None, 16).map_err(|err| ApiError::internal(err.to_string()))?;
    let created = store.create(resource, "fuzz", value.clone())?;
    let name = created["metadata"]["name"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    let _ = store.patch(resource, "fuzz", &name, PatchKind::Strategic, value.clone());
    let _ = store.patch(resource, "fuzz", &name, PatchKind::Merge, value.clone());
    // Undeclared fields (`fieldValidation=Strict`) over the same body.
    let _ = crate::openapi::unknown_fields(resource, &value);
    Ok(created)
}

/// Parses a DeleteOptions body; returns whether it asks for a dry run.
///
/// # Errors
/// The 4xx the server would answer.
pub fn delete_options(body: &[u8]) -> Result<bool, ApiError> {
    routes::body::parse_delete_options(body).map(|(_, mode)| mode == crate::store::Mode::DryRun)
}

/// Parses label and field selectors for `resource` and matches them against `object`.
///
/// # Errors
/// The 400 the server would answer for a bad selector.
pub fn select(
    resource: Resource,
    labels: Option<&str>,
    fields: Option<&str>,
    object: &Value,
) -> Result<bool, ApiError> {
    Ok(Selector::parse(resource, labels, fields)?.matches(object))
}
