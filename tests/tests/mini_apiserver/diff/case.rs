//! One request of the differential corpus, and the namespace the corpus works in.

use serde_json::Value;

/// One request of the corpus.
pub(crate) struct Case {
    pub(crate) method: &'static str,
    pub(crate) path: String,
    pub(crate) content_type: &'static str,
    pub(crate) body: String,
}

pub(crate) fn case(
    method: &'static str,
    path: String,
    content_type: &'static str,
    body: Value,
) -> Case {
    Case {
        method,
        path,
        content_type,
        body: if body.is_null() {
            String::new()
        } else {
            body.to_string()
        },
    }
}

pub(crate) const NS: &str = "diff";
