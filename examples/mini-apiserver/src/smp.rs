//! Strategic merge patch (`application/strategic-merge-patch+json`) for the served kinds.
//!
//! Like a JSON merge patch, except for the lists that have a patch strategy in the Kubernetes
//! types (the only lists of Secrets, ConfigMaps, Leases and Events are in `ObjectMeta`):
//! `metadata.finalizers` merges as a set, `metadata.ownerReferences` merges by `uid`. The
//! directives are applied, never stored: `$patch: replace|delete` on a map or list element,
//! `$retainKeys`, `$deleteFromPrimitiveList/<field>`, `$setElementOrder/<field>` (orders the
//! merged list).

use serde_json::{Map, Value};

use crate::status::ApiError;

/// How a list field merges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListMerge {
    /// Replaced by the patch's list (no strategy).
    Replace,
    /// A set of scalars: the patch's values are added.
    Set,
    /// Elements matched by this key: merged, added, or deleted by `$patch: delete`.
    ByKey(&'static str),
}

/// The patch strategy of the list at `path` (the merge keys of `ObjectMeta`).
fn strategy(path: &[&str]) -> ListMerge {
    match path {
        ["metadata", "finalizers"] => ListMerge::Set,
        ["metadata", "ownerReferences"] => ListMerge::ByKey("uid"),
        _ => ListMerge::Replace,
    }
}

/// Applies `patch` to `target`.
///
/// # Errors
/// 400 for a patch that is not an object or a malformed directive.
pub fn apply(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let Value::Object(patch) = patch else {
        return Err(ApiError::bad_request(
            "a strategic merge patch must be a JSON object",
        ));
    };
    merge_map(target, patch, &mut Vec::new())
}

fn merge_map<'a>(
    target: &mut Value,
    patch: &'a Map<String, Value>,
    path: &mut Vec<&'a str>,
) -> Result<(), ApiError> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replaced = patch.clone();
            replaced.remove("$patch");
            *target = Value::Object(replaced);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Null;
            return Ok(());
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unknown patch directive $patch: {other}"
            )));
        }
        None => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(object) = target else {
        unreachable!("made an object above");
    };
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            let remove = value.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(list)) = object.get_mut(field) {
                list.retain(|item| !remove.contains(item));
            }
            continue;
        }
        if key.starts_with('$') {
            continue;
        }
        path.push(key);
        match value {
            Value::Null => {
                object.remove(key);
            }
            Value::Object(child) => {
                let slot = object.entry(key.clone()).or_insert(Value::Null);
                merge_map(slot, child, path)?;
                if slot.is_null() {
                    object.remove(key);
                }
            }
            Value::Array(items) => {
                let merged = merge_list(object.get(key), items, strategy(path));
                object.insert(key.clone(), Value::Array(merged));
            }
            scalar => {
                object.insert(key.clone(), scalar.clone());
            }
        }
        path.pop();
    }
    // `$setElementOrder/<field>`: the merged list in the patch's order, the rest after.
    for (key, order) in patch {
        if let (Some(field), Some(order)) =
            (key.strip_prefix("$setElementOrder/"), order.as_array())
            && let Some(Value::Array(list)) = object.get_mut(field)
        {
            let rank = |item: &Value| {
                order
                    .iter()
                    .position(|o| o == item || (o.is_object() && item_matches(item, o)))
                    .unwrap_or(order.len())
            };
            list.sort_by_key(rank);
        }
    }
    // `$retainKeys`: only the listed fields remain.
    if let Some(Value::Array(keep)) = patch.get("$retainKeys") {
        object.retain(|key, _| keep.iter().any(|k| k.as_str() == Some(key)));
    }
    Ok(())
}

/// Whether `item` has every key-value of `keys` (a `$setElementOrder` entry names the merge key).
fn item_matches(item: &Value, keys: &Value) -> bool {
    keys.as_object()
        .is_some_and(|keys| keys.iter().all(|(k, v)| item.get(k) == Some(v)))
}

/// Merges a list by its strategy. As kube-apiserver orders the result (without
/// `$setElementOrder`): the patch's elements first, in its order, then the current elements the
/// patch does not name, in theirs.
fn merge_list(current: Option<&Value>, patch: &[Value], merge: ListMerge) -> Vec<Value> {
    let current = current
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    match merge {
        ListMerge::Replace => patch.to_vec(),
        ListMerge::Set => {
            let mut merged: Vec<Value> = Vec::new();
            for item in patch.iter().chain(&current) {
                if !merged.contains(item) {
                    merged.push(item.clone());
                }
            }
            merged
        }
        ListMerge::ByKey(key) => {
            let mut merged = Vec::new();
            let named: Vec<&Value> = patch.iter().filter_map(|item| item.get(key)).collect();
            for item in patch {
                let Some(id) = item.get(key) else {
                    continue;
                };
                if item.get("$patch").and_then(Value::as_str) == Some("delete") {
                    continue;
                }
                let mut element = current
                    .iter()
                    .find(|c| c.get(key) == Some(id))
                    .cloned()
                    .unwrap_or_else(|| Value::Object(Map::new()));
                if let Value::Object(fields) = item {
                    let _ = merge_map(&mut element, fields, &mut Vec::new());
                }
                merged.push(element);
            }
            merged.extend(
                current
                    .into_iter()
                    .filter(|c| c.get(key).is_none_or(|id| !named.contains(&id))),
            );
            merged
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn patched(target: Value, patch: Value) -> Value {
        let mut target = target;
        apply(&mut target, &patch).unwrap();
        target
    }

    #[test]
    fn finalizers_merge_as_a_set_and_directives_are_not_stored() {
        let object =
            json!({"metadata": {"name": "c", "finalizers": ["a", "b"]}, "data": {"k": "v"}});
        let result = patched(
            object.clone(),
            json!({"metadata": {"finalizers": ["c", "a"], "$setElementOrder/finalizers": ["c", "a", "b"]}}),
        );
        assert_eq!(result["metadata"]["finalizers"], json!(["c", "a", "b"]));
        assert!(!result.to_string().contains('$'), "{result}");
        let removed = patched(
            object.clone(),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        );
        assert_eq!(removed["metadata"]["finalizers"], json!(["b"]));
        let replaced = patched(object, json!({"data": {"$patch": "replace", "x": "y"}}));
        assert_eq!(replaced["data"], json!({"x": "y"}));
    }

    #[test]
    fn owner_references_merge_by_uid() {
        let object = json!({"metadata": {"ownerReferences": [
            {"uid": "1", "name": "one", "kind": "K", "apiVersion": "v1"},
            {"uid": "2", "name": "two", "kind": "K", "apiVersion": "v1"}]}});
        let result = patched(
            object,
            json!({"metadata": {"ownerReferences": [
                {"uid": "2", "name": "renamed"},
                {"uid": "1", "$patch": "delete"},
                {"uid": "3", "name": "three", "kind": "K", "apiVersion": "v1"}]}}),
        );
        let owners = &result["metadata"]["ownerReferences"];
        assert_eq!(owners.as_array().unwrap().len(), 2, "{owners}");
        // The patch's elements first (kube-apiserver's order), merged with the current ones.
        assert_eq!(owners[0]["name"], "renamed");
        assert_eq!(owners[0]["kind"], "K");
        assert_eq!(owners[1]["uid"], "3");
    }

    #[test]
    fn retain_keys_and_nulls_remove_fields() {
        let lease = json!({"spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "leaseTransitions": 2}});
        let result = patched(
            lease,
            json!({"spec": {"$retainKeys": ["holderIdentity", "leaseTransitions"], "holderIdentity": "b", "leaseTransitions": null}}),
        );
        assert_eq!(result["spec"], json!({"holderIdentity": "b"}));
        assert!(apply(&mut json!({}), &json!([])).is_err());
        assert!(apply(&mut json!({}), &json!({"$patch": "merge-sideways"})).is_err());
    }
}
