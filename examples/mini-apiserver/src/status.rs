//! Kubernetes `Status` objects for every error.

use serde_json::{Value, json};

/// An API error: HTTP code, reason and message, rendered as a `Status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Machine-readable reason (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `details` (name and kind of the object concerned), when known.
    pub details: Option<(String, String)>,
}

impl ApiError {
    /// An error with any code and reason.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn about(mut self, kind: &str, name: &str) -> ApiError {
        self.details = Some((name.to_owned(), kind.to_owned()));
        self
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// 401 Unauthorized.
    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 Forbidden.
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(403, "Forbidden", message)
    }

    /// 404 NotFound for an object.
    pub fn not_found(plural: &str, kind: &str, name: &str) -> ApiError {
        ApiError::new(404, "NotFound", format!("{plural} \"{name}\" not found")).about(kind, name)
    }

    /// 404 NotFound for a path.
    pub fn no_route(path: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> ApiError {
        ApiError::new(405, "MethodNotAllowed", message)
    }

    /// 409 AlreadyExists.
    pub fn already_exists(plural: &str, kind: &str, name: &str) -> ApiError {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{plural} \"{name}\" already exists"),
        )
        .about(kind, name)
    }

    /// 409 Conflict (stale resourceVersion).
    pub fn conflict(plural: &str, kind: &str, name: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {plural} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        )
        .about(kind, name)
    }

    /// 410 Expired (watch from a resourceVersion no longer in history).
    pub fn expired(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    /// 504 Timeout "Too large resource version": a list asked for a state this server has not
    /// reached (kube-apiserver's answer; clients retry or list without a version).
    pub fn too_large_resource_version(wanted: u64, current: u64) -> ApiError {
        ApiError::new(
            504,
            "Timeout",
            format!("Too large resource version: {wanted}, current: {current}"),
        )
    }

    /// 413 RequestEntityTooLarge.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("the request body is larger than {limit} bytes"),
        )
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(content_type: &str) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the content type {content_type:?} is not supported"),
        )
    }

    /// 422 Invalid.
    pub fn invalid(kind: &str, name: &str, message: impl Into<String>) -> ApiError {
        ApiError::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {}", message.into()),
        )
        .about(kind, name)
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "InternalError", message)
    }

    /// The `Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some((name, kind)) = &self.details {
            status["details"] = json!({ "name": name, "kind": kind });
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_names_the_object_and_carries_reason_and_code() {
        let status = ApiError::conflict("secrets", "Secret", "a").to_status();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["status"], "Failure");
        assert_eq!(status["reason"], "Conflict");
        assert_eq!(status["code"], 409);
        assert_eq!(status["details"], json!({"name": "a", "kind": "Secret"}));
        let decoded: k8s_openapi::apimachinery::pkg::apis::meta::v1::Status =
            serde_json::from_value(status).unwrap();
        assert_eq!(decoded.code, Some(409));
    }
}
