//! `authorization.k8s.io/v1` SelfSubjectAccessReview and SelfSubjectRulesReview (`kubectl auth
//! can-i [--list]`): what the calling user may do, answered by the same [`Authorizer`] rules
//! that decide its requests. JSON or protobuf bodies (kubectl sends protobuf); 201 with the
//! review and its `status`, as kube-apiserver answers.

use examples::serve::Body;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use k8s_pb::api::authorization::v1 as pb;
use prost::Message;
use serde_json::{Value, json};

use super::body::{json_response, read_bytes};
use crate::auth::{Attributes, Authorizer, User};
use crate::status::ApiError;

/// Which review a path names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Review {
    Access,
    Rules,
}

impl Review {
    pub(super) fn from_plural(plural: &str) -> Option<Review> {
        match plural {
            "selfsubjectaccessreviews" => Some(Review::Access),
            "selfsubjectrulesreviews" => Some(Review::Rules),
            _ => None,
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Review::Access => "SelfSubjectAccessReview",
            Review::Rules => "SelfSubjectRulesReview",
        }
    }
}

/// The `authorization.k8s.io/v1` resource list (discovery).
pub(super) fn resource_list() -> Value {
    let resources: Vec<Value> = [Review::Access, Review::Rules]
        .into_iter()
        .map(|review| {
            json!({"name": format!("{}s", review.kind().to_ascii_lowercase()),
                   "singularName": "", "namespaced": false, "kind": review.kind(), "verbs": ["create"]})
        })
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1",
           "groupVersion": "authorization.k8s.io/v1", "resources": resources})
}

/// Answers one review request.
pub(super) async fn review(
    authorizer: &Authorizer,
    user: &User,
    request: Request<Incoming>,
    review: Review,
) -> Result<Response<Body>, ApiError> {
    if request.method() != Method::POST {
        return Err(ApiError::method_not_allowed(format!(
            "{} only supports create",
            review.kind()
        )));
    }
    let protobuf = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with(crate::proto::CONTENT_TYPE));
    let bytes = read_bytes(request).await?;
    let spec = if protobuf {
        spec_from_protobuf(review, &bytes)?
    } else {
        let body: Value = serde_json::from_slice(&bytes)
            .map_err(|err| ApiError::bad_request(format!("malformed JSON: {err}")))?;
        if !body.is_object() {
            return Err(ApiError::bad_request(format!(
                "the body of a {} must be an object",
                review.kind()
            )));
        }
        body.get("spec").cloned().unwrap_or_else(|| json!({}))
    };
    let status = match review {
        Review::Access => access_status(authorizer, user, &spec)?,
        Review::Rules => {
            let namespace = spec.get("namespace").and_then(Value::as_str).unwrap_or("");
            json!({"resourceRules": authorizer.rules_for(user, namespace), "nonResourceRules": [],
                   "incomplete": false})
        }
    };
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"kind": review.kind(), "apiVersion": "authorization.k8s.io/v1",
                "metadata": {"creationTimestamp": null}, "spec": spec, "status": status}),
    ))
}

fn access_status(authorizer: &Authorizer, user: &User, spec: &Value) -> Result<Value, ApiError> {
    let text = |object: &Value, key: &str| {
        object
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let allowed = if let Some(attributes) = spec.get("resourceAttributes") {
        let verb = text(attributes, "verb");
        let namespace = text(attributes, "namespace");
        let resource = text(attributes, "resource");
        authorizer.allows(
            user,
            &Attributes {
                verb: &verb,
                namespace: (!namespace.is_empty()).then_some(namespace.as_str()),
                resource: &resource,
            },
        )
    } else if spec.get("nonResourceAttributes").is_some() {
        // Non-resource URLs (`/healthz`, `/version`, `/metrics`) are open to every
        // authenticated user here.
        true
    } else {
        return Err(ApiError::invalid(
            Review::Access.kind(),
            "",
            "spec.resourceAttributes: Invalid value: null: exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    };
    Ok(json!({ "allowed": allowed }))
}

/// A protobuf review's `spec` in its JSON form.
fn spec_from_protobuf(review: Review, bytes: &[u8]) -> Result<Value, ApiError> {
    let raw = crate::proto::unwrap_envelope(bytes)?
        .raw
        .unwrap_or_default();
    let malformed =
        |err: prost::DecodeError| ApiError::bad_request(format!("malformed protobuf: {err}"));
    Ok(match review {
        Review::Access => {
            let spec = pb::SelfSubjectAccessReview::decode(raw.as_slice())
                .map_err(malformed)?
                .spec
                .unwrap_or_default();
            let mut out = json!({});
            if let Some(a) = spec.resource_attributes {
                out["resourceAttributes"] = json!({
                    "namespace": a.namespace, "verb": a.verb, "group": a.group,
                    "version": a.version, "resource": a.resource, "subresource": a.subresource,
                    "name": a.name,
                });
            }
            if let Some(a) = spec.non_resource_attributes {
                out["nonResourceAttributes"] = json!({"path": a.path, "verb": a.verb});
            }
            strip_nulls(out)
        }
        Review::Rules => {
            let spec = pb::SelfSubjectRulesReview::decode(raw.as_slice())
                .map_err(malformed)?
                .spec
                .unwrap_or_default();
            strip_nulls(json!({"namespace": spec.namespace}))
        }
    })
}

fn strip_nulls(mut value: Value) -> Value {
    if let Value::Object(map) = &mut value {
        map.retain(|_, v| !v.is_null());
        for v in map.values_mut() {
            *v = strip_nulls(std::mem::take(v));
        }
    }
    value
}
