//! mini-apiserver's request decoders (`mini_apiserver::fuzz`): bodies as protobuf
//! (`proto::decode`), YAML and JSON; the create and merge-patch validation of the decoded
//! object; DeleteOptions; label and field selectors (`Selector::parse`).
//!
//! Input: the first byte picks the kind (low 2 bits) and the decoder (next 2 bits: protobuf,
//! JSON, YAML, selectors+DeleteOptions); the rest is the body, or for selectors two strings
//! (labels, fields) split at the first NUL byte.
//!
//! Properties, besides no panic:
//! - bad input is a client error: every `Status` is a 4xx, never a 5xx;
//! - a created object is a JSON object with the name it was created under;
//! - a selector that parses can be matched against any object without panicking.

#![no_main]

use mini_apiserver::fuzz::{RESOURCES, create_and_patch, delete_options, select};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let resource = RESOURCES[usize::from(head & 3)];
    let content_type = match (head >> 2) & 3 {
        0 => "application/vnd.kubernetes.protobuf",
        1 => "application/json",
        2 => "application/yaml",
        _ => {
            if let Err(err) = delete_options(rest) {
                assert!((400..500).contains(&err.code), "DeleteOptions: {err:?}");
            }
            let Ok(text) = std::str::from_utf8(rest) else {
                return;
            };
            let (labels, fields) = text.split_once('\0').unwrap_or((text, ""));
            let object = json!({"metadata": {"name": "n", "namespace": "ns",
                                             "labels": {"a": "b", "n": "1"}},
                                "type": "Opaque", "reason": "r"});
            if let Err(err) = select(resource, Some(labels), Some(fields), &object) {
                assert!((400..500).contains(&err.code), "selector: {err:?}");
            }
            return;
        }
    };
    match create_and_patch(resource, content_type, rest) {
        Ok(created) => {
            assert!(created.is_object());
            assert!(
                created["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| !n.is_empty())
            );
        }
        Err(err) => assert!((400..500).contains(&err.code), "{content_type}: {err:?}"),
    }
});
