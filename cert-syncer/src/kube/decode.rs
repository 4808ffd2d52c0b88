//! Objects read from the API are decoded here, one at a time, never by kube-client.
//!
//! kube-client decodes a response into the typed object in one go and, when that fails, logs
//! the whole response body at WARN (`Client::request`) — for a list of Secrets that is every
//! private key of the namespace, at every retry — and one undecodable object fails the whole
//! list. So every list, watch and get goes through [`Raw`]: it decodes any JSON object (only
//! malformed JSON fails, which no apiserver sends), and [`Raw::decode`] turns it into the typed
//! object with an error that names the field and never carries a value.

use std::borrow::Cow;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// An object of kind `K` as the apiserver sent it: its metadata (best effort) and the JSON.
pub struct Raw<K> {
    metadata: ObjectMeta,
    value: Value,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Raw<K> {
    fn clone(&self) -> Self {
        Raw {
            metadata: self.metadata.clone(),
            value: self.value.clone(),
            kind: PhantomData,
        }
    }
}

impl<K> std::fmt::Debug for Raw<K> {
    // The JSON may hold key bytes: only the name and version are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Raw")
            .field("name", &self.metadata.name)
            .field("resource_version", &self.metadata.resource_version)
            .finish_non_exhaustive()
    }
}

impl<'de, K> serde::Deserialize<'de> for Raw<K> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        let metadata = value
            .get("metadata")
            .and_then(|m| serde_json::from_value::<ObjectMeta>(m.clone()).ok())
            .unwrap_or_else(|| lenient_metadata(&value));
        Ok(Raw {
            metadata,
            value,
            kind: PhantomData,
        })
    }
}

/// Name, namespace and resourceVersion when the metadata as a whole does not decode (the
/// object is then reported as undecodable by [`Raw::decode`], by name).
fn lenient_metadata(value: &Value) -> ObjectMeta {
    let text = |field: &str| {
        value
            .get("metadata")
            .and_then(|m| m.get(field))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    ObjectMeta {
        name: text("name"),
        namespace: text("namespace"),
        resource_version: text("resourceVersion"),
        ..ObjectMeta::default()
    }
}

impl<K> kube::Resource for Raw<K>
where
    K: kube::Resource<DynamicType = ()>,
{
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Why an object does not decode: the field and what is wrong, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {reason}")]
pub struct DecodeError {
    /// The top-level field that does not decode (`data`, `immutable`, ...), or `(object)`.
    pub field: String,
    /// serde's message with every quoted value removed.
    pub reason: String,
}

impl<K: DeserializeOwned> Raw<K> {
    /// The typed object, or the field that does not decode.
    pub fn decode(&self) -> Result<K, DecodeError> {
        let err = match serde_json::from_value::<K>(self.value.clone()) {
            Ok(object) => return Ok(object),
            Err(err) => err,
        };
        let reason = crate::base::error::redact_parse_error(&err.to_string());
        // Which field: decode each top-level field alone (with the type fields).
        let field = self.value.as_object().and_then(|map| {
            map.keys()
                .filter(|key| *key != "apiVersion" && *key != "kind")
                .find(|key| {
                    let mut alone = serde_json::Map::new();
                    for keep in ["apiVersion", "kind", key.as_str()] {
                        if let Some(value) = map.get(keep) {
                            alone.insert(keep.to_owned(), value.clone());
                        }
                    }
                    serde_json::from_value::<K>(Value::Object(alone)).is_err()
                })
                .cloned()
        });
        Err(DecodeError {
            field: field.unwrap_or_else(|| "(object)".to_owned()),
            reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Secret;

    const KEY: &str = "LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JR0hBZ0VBTUJNR0J5cUdTTTQ5";

    #[test]
    fn a_bad_field_is_named_without_any_value_and_the_name_survives() {
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "serving-cert", "resourceVersion": "7"},
            "immutable": "yes",
            "data": {"tls.key": KEY},
        });
        let raw: Raw<Secret> = serde_json::from_value(json).unwrap();
        assert_eq!(
            kube::Resource::meta(&raw).name.as_deref(),
            Some("serving-cert")
        );
        let err = raw.decode().unwrap_err();
        assert_eq!(err.field, "immutable");
        let text = format!("{err} {err:?} {raw:?}");
        assert!(!text.contains(KEY) && !text.contains("yes"), "{text}");
        // `data` as a string (it should be a map): named, and the value is not in the message.
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "s", "labels": 5},
            "data": KEY,
        });
        let raw: Raw<Secret> = serde_json::from_value(json).unwrap();
        assert_eq!(kube::Resource::meta(&raw).name.as_deref(), Some("s"));
        let err = raw.decode().unwrap_err();
        assert!(!err.to_string().contains(KEY), "{err}");
        // A good one decodes.
        let json =
            serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ok"}});
        let raw: Raw<Secret> = serde_json::from_value(json).unwrap();
        assert_eq!(raw.decode().unwrap().metadata.name.as_deref(), Some("ok"));
    }
}
