//! Request and response bodies: reading a body within its size and time limits, decoding it
//! (JSON, YAML, protobuf) and DeleteOptions, and JSON answers.

use std::time::Duration;

use examples::serve::{Body, full};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;

use super::api::MAX_BODY;
use crate::resource::Resource;
use crate::status::ApiError;
use crate::store::{Mode, Preconditions};

/// `DeleteOptions.preconditions` from a DELETE body (an empty body means none).
/// The DeleteOptions body of a delete: its preconditions, and whether it asks for a dry run
/// (`"dryRun": ["All"]`, which is where kube-rs and client-go put it for deletes).
pub(super) async fn delete_options(
    request: Request<Incoming>,
) -> Result<(Preconditions, Mode), ApiError> {
    parse_delete_options(&read_bytes(request).await?)
}

/// `delete_options` of the body bytes. Public for the fuzz targets ([`crate::fuzz`]).
///
/// # Errors
/// 400 for a body that is not a JSON object, 422 for an unknown `dryRun`.
pub fn parse_delete_options(body: &[u8]) -> Result<(Preconditions, Mode), ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok((Preconditions::default(), Mode::Commit));
    }
    let options: Value = serde_json::from_slice(body)
        .map_err(|err| ApiError::bad_request(format!("malformed DeleteOptions: {err}")))?;
    if !options.is_object() {
        return Err(ApiError::bad_request(
            "malformed DeleteOptions: expected an object",
        ));
    }
    let field = |name: &str| {
        options["preconditions"][name]
            .as_str()
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    let mode = match &options["dryRun"] {
        Value::Null => Mode::Commit,
        Value::Array(values) if values.is_empty() => Mode::Commit,
        Value::Array(values) if values.iter().all(|v| v == "All") => Mode::DryRun,
        other => {
            return Err(ApiError::invalid(
                "DeleteOptions.meta.k8s.io",
                "",
                format!("dryRun: Unsupported value: {other}: supported values: \"All\""),
            ));
        }
    };
    let preconditions = Preconditions {
        resource_version: field("resourceVersion"),
        uid: field("uid"),
    };
    Ok((preconditions, mode))
}

/// How much of an oversized body is read and thrown away before answering 413, so that the
/// client finishes sending and reads the answer instead of a connection reset.
const DRAIN_LIMIT: usize = 16 * 1024 * 1024;
/// How long a client may take to send a request body.
const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long draining an oversized body may take.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The request body, at most [`MAX_BODY`] bytes (413 above).
pub(super) async fn read_bytes(request: Request<Incoming>) -> Result<bytes::Bytes, ApiError> {
    let declared = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|len| len > MAX_BODY + DRAIN_LIMIT) {
        // Too big to be worth draining: answer now (the client may see a reset instead).
        return Err(ApiError::too_large(MAX_BODY));
    }
    let mut body = request.into_body();
    let mut bytes = Vec::new();
    let deadline = tokio::time::Instant::now() + BODY_TIMEOUT;
    while let Some(frame) = tokio::time::timeout_at(deadline, body.frame())
        .await
        .map_err(|_| ApiError::new(408, "Timeout", "timed out reading the request body"))?
    {
        let frame =
            frame.map_err(|err| ApiError::bad_request(format!("cannot read the body: {err}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if bytes.len() + data.len() > MAX_BODY {
            let drain = async {
                let mut drained = bytes.len() + data.len();
                while drained <= MAX_BODY + DRAIN_LIMIT
                    && let Some(Ok(frame)) = body.frame().await
                {
                    drained += frame.data_ref().map_or(0, |d| d.len());
                }
            };
            let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
            return Err(ApiError::too_large(MAX_BODY));
        }
        bytes.extend_from_slice(&data);
    }
    Ok(bytes.into())
}

/// The body of a create, update or patch as JSON: JSON, YAML where the content type says so,
/// or Kubernetes protobuf (see [`crate::proto`]). Creates and updates in any other content type
/// get 415, as from kube-apiserver (patches check their own types).
pub(super) async fn read_body(
    request: Request<Incoming>,
    resource: Resource,
) -> Result<Value, ApiError> {
    let content_type = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let is_patch = request.method() == Method::PATCH;
    let is_yaml = content_type.contains("yaml");
    if !is_patch
        && !is_yaml
        && !matches!(
            content_type.as_str(),
            "" | "application/json" | crate::proto::CONTENT_TYPE
        )
    {
        return Err(ApiError::unsupported_media_type(&content_type));
    }
    let bytes = read_bytes(request).await?;
    decode_body(resource, &content_type, &bytes)
}

/// A request body as JSON, by its (lower-case, parameter-free) content type: protobuf, YAML
/// (when it is not JSON) or JSON. Public for the fuzz targets ([`crate::fuzz`]).
///
/// # Errors
/// 400 for bytes that do not decode.
pub fn decode_body(
    resource: Resource,
    content_type: &str,
    bytes: &[u8],
) -> Result<Value, ApiError> {
    let is_yaml = content_type.contains("yaml");
    if content_type == crate::proto::CONTENT_TYPE {
        return crate::proto::decode(resource, bytes);
    }
    if is_yaml && serde_json::from_slice::<Value>(bytes).is_err() {
        serde_norway::from_slice::<Value>(bytes)
            .map_err(|err| ApiError::bad_request(format!("malformed YAML: {err}")))
    } else {
        serde_json::from_slice::<Value>(bytes)
            .map_err(|err| ApiError::bad_request(format!("malformed JSON: {err}")))
    }
}

pub(super) fn json_ok(value: &Value) -> Response<Body> {
    json_response(StatusCode::OK, value)
}

pub(super) fn json_response(status: StatusCode, value: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(full(serde_json::to_vec(value).unwrap_or_default()))
        .expect("static response parts are valid")
}
