//! Unit tests of the store.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::*;

fn secret(name: &str) -> Value {
    json!({"metadata": {"name": name}, "stringData": {"tls.crt": "pem"}})
}

#[test]
fn every_change_gets_the_next_resource_version_and_lands_in_history() {
    let store = Store::open(None, 100).unwrap();
    let created = store.create(Resource::Secrets, "ns", secret("a")).unwrap();
    assert_eq!(created["metadata"]["resourceVersion"], "1");
    assert_eq!(created["data"]["tls.crt"], BASE64.encode("pem"));
    assert!(created.get("stringData").is_none());
    let mut changed = created.clone();
    changed["data"]["x"] = json!(BASE64.encode("y"));
    store.update(Resource::Secrets, "ns", "a", changed).unwrap();
    store
        .delete(Resource::Secrets, "ns", "a", &Preconditions::default())
        .unwrap();
    let kinds: Vec<_> = store
        .changes_since(0)
        .unwrap()
        .iter()
        .map(|c| (c.rv, c.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            (1, ChangeKind::Added),
            (2, ChangeKind::Modified),
            (3, ChangeKind::Deleted)
        ]
    );
}

#[test]
fn a_stale_update_conflicts_and_a_duplicate_create_already_exists() {
    let store = Store::open(None, 100).unwrap();
    let created = store.create(Resource::Secrets, "ns", secret("a")).unwrap();
    let mut first = created.clone();
    first["data"]["x"] = json!("eA==");
    store.update(Resource::Secrets, "ns", "a", first).unwrap();
    let mut stale = created;
    stale["data"]["y"] = json!("eQ==");
    assert_eq!(
        store
            .update(Resource::Secrets, "ns", "a", stale)
            .unwrap_err()
            .code,
        409
    );
    assert_eq!(
        store
            .create(Resource::Secrets, "ns", secret("a"))
            .unwrap_err()
            .reason,
        "AlreadyExists"
    );
}

#[test]
fn merge_and_json_patches_apply_and_apply_creates() {
    let store = Store::open(None, 100).unwrap();
    store
        .create(
            Resource::ConfigMaps,
            "ns",
            json!({"metadata": {"name": "a"}, "data": {"x": "1"}}),
        )
        .unwrap();
    let merged = store
        .patch(
            Resource::ConfigMaps,
            "ns",
            "a",
            PatchKind::Merge,
            json!({"data": {"y": "2"}}),
        )
        .unwrap();
    assert_eq!(merged["data"], json!({"x": "1", "y": "2"}));
    let patched = store
        .patch(
            Resource::ConfigMaps,
            "ns",
            "a",
            PatchKind::Json,
            json!([{"op": "remove", "path": "/data/x"}]),
        )
        .unwrap();
    assert_eq!(patched["data"], json!({"y": "2"}));
    let bad = store.patch(
        Resource::ConfigMaps,
        "ns",
        "a",
        PatchKind::Json,
        json!([{"op": "remove", "path": "/nope"}]),
    );
    assert_eq!(bad.unwrap_err().code, 422);
    let applied = store
        .patch(
            Resource::ConfigMaps,
            "ns",
            "b",
            PatchKind::Apply,
            json!({"data": {"z": "3"}}),
        )
        .unwrap();
    assert_eq!(applied["metadata"]["name"], "b");
    assert_eq!(
        store
            .patch(Resource::ConfigMaps, "ns", "c", PatchKind::Merge, json!({}))
            .unwrap_err()
            .code,
        404
    );
}

#[test]
fn history_beyond_capacity_expires() {
    let store = Store::open(None, 2).unwrap();
    for name in ["a", "b", "c"] {
        store
            .create(
                Resource::ConfigMaps,
                "ns",
                json!({"metadata": {"name": name}}),
            )
            .unwrap();
    }
    assert_eq!(store.changes_since(0).unwrap_err().code, 410);
    assert_eq!(store.changes_since(1).unwrap().len(), 2);
}

#[test]
fn bad_input_is_rejected_without_a_state_change() {
    let store = Store::open(None, 100).unwrap();
    let cases = [
        json!({"metadata": {"name": "Bad_Name"}}),
        json!({"kind": "ConfigMap", "metadata": {"name": "a"}}),
        json!({"metadata": {"name": "a"}, "data": {"k": "not base64!"}}),
        json!({"metadata": {"name": "a", "namespace": "other"}}),
        json!("not an object"),
    ];
    for body in cases {
        assert!(
            store.create(Resource::Secrets, "ns", body.clone()).is_err(),
            "{body}"
        );
    }
    assert_eq!(store.resource_version(), 0);
}

#[test]
fn state_and_history_survive_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("state.json");
    let store = Store::open(Some(path.clone()), 100).unwrap();
    store.create(Resource::Secrets, "ns", secret("a")).unwrap();
    store.create(Resource::Secrets, "ns", secret("b")).unwrap();
    drop(store);
    let store = Store::open(Some(path.clone()), 100).unwrap();
    assert_eq!(store.resource_version(), 2);
    assert!(store.get(Resource::Secrets, "ns", "b").is_ok());
    let resumed = store.changes_since(1).unwrap();
    assert_eq!(resumed.len(), 1);
    assert_eq!(resumed[0].rv, 2);
    assert_eq!(store.changes_since(0).unwrap().len(), 2);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[test]
fn only_the_newest_history_is_saved_and_older_versions_expire_after_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("state.json");
    let store = Store::open(Some(path.clone()), 10_000).unwrap();
    let total = PERSISTED_HISTORY as u64 + 10;
    for i in 0..total {
        store
            .create(
                Resource::ConfigMaps,
                "ns",
                json!({"metadata": {"name": format!("c{i}")}}),
            )
            .unwrap();
    }
    assert!(store.changes_since(0).is_ok(), "in memory: all of it");
    drop(store);
    let store = Store::open(Some(path), 10_000).unwrap();
    assert_eq!(store.changes_since(9).unwrap_err().code, 410);
    let mut replayed = 0;
    let mut since = 10;
    while let Some(last) = store.changes_since(since).unwrap().last() {
        replayed += store.changes_since(since).unwrap().len();
        since = last.rv;
    }
    assert_eq!(replayed, PERSISTED_HISTORY, "the saved tail");
}

#[test]
fn a_version_newer_than_the_store_is_expired_not_waited_for() {
    let store = Store::open(None, 100).unwrap();
    store.create(Resource::Secrets, "ns", secret("a")).unwrap();
    assert_eq!(store.changes_since(1).unwrap().len(), 0);
    let err = store.changes_since(50).unwrap_err();
    assert_eq!((err.code, err.reason), (410, "Expired"));
}

#[test]
fn an_apply_to_a_missing_object_with_a_non_object_body_is_refused_not_a_panic() {
    let store = Store::open(None, 100).unwrap();
    for body in [
        json!("text"),
        json!([1]),
        json!(7),
        json!({"metadata": "x"}),
    ] {
        let err = store
            .patch(Resource::ConfigMaps, "ns", "a", PatchKind::Apply, body)
            .unwrap_err();
        assert_eq!(err.code, 400);
    }
    assert!(store.get(Resource::ConfigMaps, "ns", "a").is_err());
}

#[test]
fn delete_preconditions_conflict_when_they_do_not_hold() {
    let store = Store::open(None, 100).unwrap();
    let created = store.create(Resource::Secrets, "ns", secret("a")).unwrap();
    let stale = Preconditions {
        resource_version: Some("99".into()),
        uid: None,
    };
    assert_eq!(
        store
            .delete(Resource::Secrets, "ns", "a", &stale)
            .unwrap_err()
            .code,
        409
    );
    let current = Preconditions {
        resource_version: Some(meta_str(&created, "resourceVersion")),
        uid: Some(meta_str(&created, "uid")),
    };
    let deleted = store
        .delete(Resource::Secrets, "ns", "a", &current)
        .unwrap();
    assert_eq!(deleted["metadata"]["resourceVersion"], "2");
}

#[test]
fn watch_lines_are_encoded_once_as_json() {
    let store = Store::open(None, 100).unwrap();
    store.create(Resource::Secrets, "ns", secret("a")).unwrap();
    let change = &store.changes_since(0).unwrap()[0];
    assert!(change.line.ends_with(b"\n"));
    let event: Value = serde_json::from_slice(&change.line).unwrap();
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"], *change.object);
}

#[test]
fn an_object_with_finalizers_stays_marked_until_they_are_removed() {
    let store = Store::open(None, 100).unwrap();
    let hold = json!({"metadata": {"name": "c", "finalizers": ["example.com/hold"]}});
    store.create(Resource::ConfigMaps, "ns", hold).unwrap();
    let marked = store
        .delete(Resource::ConfigMaps, "ns", "c", &Preconditions::default())
        .unwrap();
    let timestamp = marked["metadata"]["deletionTimestamp"].clone();
    assert!(timestamp.is_string(), "{marked}");
    let kept = store.get(Resource::ConfigMaps, "ns", "c").unwrap();
    assert_eq!(kept["metadata"]["deletionTimestamp"], timestamp);
    // No new finalizers while being deleted; other changes are fine and keep the mark.
    let more = json!({"metadata": {"finalizers": ["example.com/hold", "example.com/new"]}});
    let refused = store
        .patch(Resource::ConfigMaps, "ns", "c", PatchKind::Merge, more)
        .unwrap_err();
    assert_eq!(refused.code, 422);
    let data = json!({"data": {"k": "v"}, "metadata": {"deletionTimestamp": null}});
    let changed = store
        .patch(Resource::ConfigMaps, "ns", "c", PatchKind::Merge, data)
        .unwrap();
    assert_eq!(changed["metadata"]["deletionTimestamp"], timestamp);
    let release = json!({"metadata": {"finalizers": null}});
    store
        .patch(Resource::ConfigMaps, "ns", "c", PatchKind::Merge, release)
        .unwrap();
    assert_eq!(
        store.get(Resource::ConfigMaps, "ns", "c").unwrap_err().code,
        404
    );
    let last = store.changes_since(0).unwrap();
    assert_eq!(last.last().map(|c| c.kind), Some(ChangeKind::Deleted));
}
