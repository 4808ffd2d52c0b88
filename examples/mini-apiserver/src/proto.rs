//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`), as kubectl and client-go
//! send them for built-in types: the magic `k8s\0`, then a `runtime.Unknown` whose `raw` is the
//! object's protobuf encoding (types from the `k8s-pb` crate). Decoded into the same JSON the
//! handlers work on.
//!
//! Served: Secrets, ConfigMaps and Leases (every field), with the `ObjectMeta` fields a client
//! sets on create and update. Not yet: Events (415, send JSON), protobuf responses (every answer
//! is JSON, which kubectl and client-go accept alongside protobuf).

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use prost::Message;
use serde_json::{Map, Value, json};

use crate::resource::Resource;
use crate::status::ApiError;

/// The content type of Kubernetes protobuf bodies.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// The 4 bytes every Kubernetes protobuf body starts with.
const MAGIC: &[u8] = b"k8s\0";

/// Decodes a protobuf body for `resource` into its JSON form.
///
/// # Errors
/// 400 for a body that is not a Kubernetes protobuf envelope or object, 415 for a kind this
/// server cannot decode from protobuf.
pub fn decode(resource: Resource, bytes: &[u8]) -> Result<Value, ApiError> {
    let mut unknown = unwrap_envelope(bytes)?;
    let raw = unknown.raw.take().unwrap_or_default();
    let malformed = |err: prost::DecodeError| {
        ApiError::bad_request(format!("malformed protobuf {}: {err}", resource.kind()))
    };
    let mut object = match resource {
        Resource::Secrets => {
            let secret =
                k8s_pb::api::core::v1::Secret::decode(raw.as_slice()).map_err(malformed)?;
            let mut object = Map::new();
            object.insert("metadata".into(), object_meta(secret.metadata));
            object.insert("data".into(), bytes_map(&secret.data));
            if !secret.string_data.is_empty() {
                object.insert("stringData".into(), json!(secret.string_data));
            }
            insert_opt(&mut object, "type", secret.r#type.map(Value::from));
            insert_opt(&mut object, "immutable", secret.immutable.map(Value::from));
            object
        }
        Resource::ConfigMaps => {
            let map =
                k8s_pb::api::core::v1::ConfigMap::decode(raw.as_slice()).map_err(malformed)?;
            let mut object = Map::new();
            object.insert("metadata".into(), object_meta(map.metadata));
            if !map.data.is_empty() {
                object.insert("data".into(), json!(map.data));
            }
            if !map.binary_data.is_empty() {
                object.insert("binaryData".into(), bytes_map(&map.binary_data));
            }
            insert_opt(&mut object, "immutable", map.immutable.map(Value::from));
            object
        }
        Resource::Leases => {
            let lease =
                k8s_pb::api::coordination::v1::Lease::decode(raw.as_slice()).map_err(malformed)?;
            let mut object = Map::new();
            object.insert("metadata".into(), object_meta(lease.metadata));
            if let Some(spec) = lease.spec {
                let mut out = Map::new();
                insert_opt(
                    &mut out,
                    "holderIdentity",
                    spec.holder_identity.map(Value::from),
                );
                insert_opt(
                    &mut out,
                    "leaseDurationSeconds",
                    spec.lease_duration_seconds.map(Value::from),
                );
                insert_opt(&mut out, "acquireTime", spec.acquire_time.map(micro_time));
                insert_opt(&mut out, "renewTime", spec.renew_time.map(micro_time));
                insert_opt(
                    &mut out,
                    "leaseTransitions",
                    spec.lease_transitions.map(Value::from),
                );
                insert_opt(&mut out, "strategy", spec.strategy.map(Value::from));
                insert_opt(
                    &mut out,
                    "preferredHolder",
                    spec.preferred_holder.map(Value::from),
                );
                object.insert("spec".into(), Value::Object(out));
            }
            object
        }
        Resource::Events => {
            return Err(ApiError::unsupported_media_type(
                "application/vnd.kubernetes.protobuf for events (send JSON)",
            ));
        }
    };
    if let Some(meta) = unknown.type_meta {
        insert_opt(&mut object, "apiVersion", meta.api_version.map(Value::from));
        insert_opt(&mut object, "kind", meta.kind.map(Value::from));
    }
    Ok(Value::Object(object))
}

/// The `runtime.Unknown` of a Kubernetes protobuf envelope (`k8s\0` + `runtime.Unknown`): type
/// and the object's bytes (`raw`).
///
/// # Errors
/// 400 for a body that is not such an envelope, 415 for an encoded (compressed) one.
pub fn unwrap_envelope(
    bytes: &[u8],
) -> Result<k8s_pb::apimachinery::pkg::runtime::Unknown, ApiError> {
    let body = bytes
        .strip_prefix(MAGIC)
        .ok_or_else(|| ApiError::bad_request("protobuf body without the k8s magic prefix"))?;
    let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown::decode(body)
        .map_err(|err| ApiError::bad_request(format!("malformed protobuf envelope: {err}")))?;
    if unknown
        .content_encoding
        .as_deref()
        .is_some_and(|e| !e.is_empty())
    {
        return Err(ApiError::unsupported_media_type("encoded protobuf"));
    }
    Ok(unknown)
}

fn insert_opt(object: &mut Map<String, Value>, key: &str, value: Option<Value>) {
    if let Some(value) = value {
        object.insert(key.to_owned(), value);
    }
}

fn bytes_map(map: &BTreeMap<String, Vec<u8>>) -> Value {
    Value::Object(
        map.iter()
            .map(|(k, v)| (k.clone(), json!(BASE64.encode(v))))
            .collect(),
    )
}

fn time(seconds: Option<i64>, nanos: Option<i32>, micros: bool) -> Value {
    let at = time::OffsetDateTime::from_unix_timestamp(seconds.unwrap_or(0))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let date = at
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    if micros {
        let micros = nanos.unwrap_or(0).clamp(0, 999_999_999) / 1000;
        json!(format!("{}.{micros:06}Z", date.trim_end_matches('Z')))
    } else {
        json!(date)
    }
}

fn micro_time(t: meta::MicroTime) -> Value {
    time(t.seconds, t.nanos, true)
}

/// The `ObjectMeta` fields a client sends; server-set fields (uid, creationTimestamp,
/// resourceVersion) pass through so preconditions and updates behave as with JSON.
fn object_meta(meta: Option<meta::ObjectMeta>) -> Value {
    let Some(meta) = meta else {
        return json!({});
    };
    let mut out = Map::new();
    for (key, value) in [
        ("name", meta.name),
        ("generateName", meta.generate_name),
        ("namespace", meta.namespace),
        ("uid", meta.uid),
        ("resourceVersion", meta.resource_version),
    ] {
        insert_opt(
            &mut out,
            key,
            value.filter(|v| !v.is_empty()).map(Value::from),
        );
    }
    insert_opt(
        &mut out,
        "creationTimestamp",
        meta.creation_timestamp
            .map(|t| time(t.seconds, t.nanos, false)),
    );
    if !meta.labels.is_empty() {
        out.insert("labels".into(), json!(meta.labels));
    }
    if !meta.annotations.is_empty() {
        out.insert("annotations".into(), json!(meta.annotations));
    }
    if !meta.finalizers.is_empty() {
        out.insert("finalizers".into(), json!(meta.finalizers));
    }
    if !meta.owner_references.is_empty() {
        let owners: Vec<Value> = meta
            .owner_references
            .into_iter()
            .map(|o| {
                let mut owner = Map::new();
                insert_opt(&mut owner, "apiVersion", o.api_version.map(Value::from));
                insert_opt(&mut owner, "kind", o.kind.map(Value::from));
                insert_opt(&mut owner, "name", o.name.map(Value::from));
                insert_opt(&mut owner, "uid", o.uid.map(Value::from));
                insert_opt(&mut owner, "controller", o.controller.map(Value::from));
                insert_opt(
                    &mut owner,
                    "blockOwnerDeletion",
                    o.block_owner_deletion.map(Value::from),
                );
                Value::Object(owner)
            })
            .collect();
        out.insert("ownerReferences".into(), Value::Array(owners));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(kind: &str, api_version: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown {
            type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        let mut bytes = MAGIC.to_vec();
        bytes.extend(unknown.encode_to_vec());
        bytes
    }

    #[test]
    fn a_protobuf_secret_decodes_to_its_json_form() {
        let secret = k8s_pb::api::core::v1::Secret {
            metadata: Some(meta::ObjectMeta {
                name: Some("tls".into()),
                labels: BTreeMap::from([("a".into(), "b".into())]),
                ..Default::default()
            }),
            data: BTreeMap::from([("tls.crt".into(), b"PEM".to_vec())]),
            r#type: Some("kubernetes.io/tls".into()),
            ..Default::default()
        };
        let object = decode(
            Resource::Secrets,
            &envelope("Secret", "v1", secret.encode_to_vec()),
        )
        .unwrap();
        assert_eq!(
            object,
            json!({"kind": "Secret", "apiVersion": "v1", "type": "kubernetes.io/tls",
                   "metadata": {"name": "tls", "labels": {"a": "b"}},
                   "data": {"tls.crt": "UEVN"}})
        );
    }

    #[test]
    fn a_protobuf_lease_keeps_its_micro_times() {
        let lease = k8s_pb::api::coordination::v1::Lease {
            metadata: Some(meta::ObjectMeta {
                name: Some("l".into()),
                ..Default::default()
            }),
            spec: Some(k8s_pb::api::coordination::v1::LeaseSpec {
                holder_identity: Some("me".into()),
                renew_time: Some(meta::MicroTime {
                    seconds: Some(0),
                    nanos: Some(5_000),
                }),
                ..Default::default()
            }),
        };
        let object = decode(
            Resource::Leases,
            &envelope("Lease", "coordination.k8s.io/v1", lease.encode_to_vec()),
        )
        .unwrap();
        assert_eq!(object["spec"]["renewTime"], "1970-01-01T00:00:00.000005Z");
        assert_eq!(object["spec"]["holderIdentity"], "me");
    }

    #[test]
    fn garbage_is_a_bad_request_and_events_are_unsupported() {
        for bytes in [&b""[..], b"k8s", b"k8s\0\xff\xff\xff", b"{\"kind\":1}"] {
            assert_eq!(decode(Resource::ConfigMaps, bytes).unwrap_err().code, 400);
        }
        assert_eq!(
            decode(Resource::Events, &envelope("Event", "v1", Vec::new()))
                .unwrap_err()
                .code,
            415
        );
    }
}
