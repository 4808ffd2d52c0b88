//! `cert-syncer sync` with more named objects than `--namespace-watch-threshold`: one
//! namespace-wide watch per kind instead of one per object, one list at start-up, no GET per
//! object, work only for objects that changed (also across a relist), and the per-object
//! behaviour (required/optional, key pruning, host files, readiness) unchanged. Correctness
//! only; the figures (time, memory, CPU) come from `sync-load`. Both scenarios run against
//! `mini-apiserver` and the real kube-apiserver (`e2e::both_backends!`); request and watch
//! counts come from mini's `/metrics` and the real one's audit log (its own metrics count its
//! internal informers' requests too), open watches from each one's `/metrics` over the
//! apiserver's own baseline.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use e2e::syncer::{NS, bundle_config_map, read};
use e2e::{
    ApiOptions, Backend, Ca, Syncer, TestApi, both_backends, install_crypto_provider, metric_sum,
    wait_until,
};
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, PostParams};

const REQUIRED: usize = 250;
const OPTIONAL: usize = 50;
/// Named optional Secrets that never exist.
const NEVER: usize = 3;
/// Secrets of the namespace that are not named.
const UNNAMED: usize = 5;
const TIMEOUT: Duration = Duration::from_secs(60);

fn required_name(i: usize) -> String {
    format!("required-{i:03}")
}

fn optional_name(i: usize) -> String {
    format!("optional-{i:03}")
}

/// A Secret whose two keys say which object and which generation they belong to.
fn secret(name: &str, generation: u32) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (
                "tls.crt".to_owned(),
                ByteString(format!("crt {name} {generation}").into_bytes()),
            ),
            (
                "tls.key".to_owned(),
                ByteString(format!("key {name} {generation}").into_bytes()),
            ),
        ])),
        ..Default::default()
    }
}

async fn create_all(secrets: &Api<Secret>, names: &[String]) {
    futures::stream::iter(names)
        .map(|name| async move {
            secrets
                .create(&PostParams::default(), &secret(name, 1))
                .await
                .unwrap_or_else(|err| panic!("create {name}: {err}"))
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
}

fn synced(dest: &Path, name: &str, generation: u32) -> bool {
    let dir = dest.join("secrets").join(name);
    read(&dir.join("tls.crt")).as_deref() == Some(format!("crt {name} {generation}").as_str())
        && read(&dir.join("tls.key")).as_deref()
            == Some(format!("key {name} {generation}").as_str())
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Where each object's `..data` points and when that link was made: a rewrite changes both.
fn generations(dest: &Path, names: &[String]) -> BTreeMap<String, (PathBuf, SystemTime)> {
    names
        .iter()
        .map(|name| {
            let link = dest.join("secrets").join(name).join("..data");
            let target = std::fs::read_link(&link).unwrap();
            let made = std::fs::symlink_metadata(&link)
                .unwrap()
                .modified()
                .unwrap();
            (name.clone(), (target, made))
        })
        .collect()
}

/// Requests with `verb` on Secrets made with the admin token (the syncer's and this test's):
/// mini's `/metrics` (reset on restart), or the real one's audit log (kept across restarts;
/// its `/metrics` also count kube-apiserver's own informers).
async fn admin_requests(api: &TestApi, verb: &str) -> f64 {
    match api.backend {
        Backend::Mini => api.request_count(verb, "secrets").await,
        Backend::Real => api
            .audit_records()
            .iter()
            .filter(|r| r.user == "admin" && r.verb == verb && r.resource == "secrets")
            .count() as f64,
    }
}

both_backends!(
    three_hundred_secrets_sync_through_one_watch_and_only_changes_are_written,
    the_namespace_wide_path_keeps_the_per_object_behaviour
);

async fn three_hundred_secrets_sync_through_one_watch_and_only_changes_are_written(
    backend: Backend,
) {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state.json");
    // Mini: a short history and no bookmarks, so after a restart the syncer's resourceVersion
    // has left the history and its watcher must relist. The real one keeps objects in etcd;
    // its watch cache restarts at etcd's current revision, so a resume from before the churn
    // below is "too old" (410) there too.
    let options = ApiOptions {
        mini_args: [
            "--state-file",
            state.to_str().unwrap(),
            "--history",
            "20",
            "--bookmark-interval",
            "3600",
        ]
        .map(str::to_owned)
        .to_vec(),
        audit: true,
        ..ApiOptions::default()
    };
    let mut api = TestApi::start(backend, tmp.path(), &options).await;
    let secrets: Api<Secret> = Api::namespaced(api.recovery_client(), NS);
    let required: Vec<String> = (0..REQUIRED).map(required_name).collect();
    let optional: Vec<String> = (0..OPTIONAL).map(optional_name).collect();
    let never: Vec<String> = (0..NEVER).map(|i| format!("never-{i}")).collect();
    let unnamed: Vec<String> = (0..UNNAMED).map(|i| format!("unnamed-{i}")).collect();
    create_all(&secrets, &required).await;
    create_all(&secrets, &optional).await;
    create_all(&secrets, &unnamed).await;
    let present: Vec<String> = required.iter().chain(&optional).cloned().collect();

    // kube-apiserver watches Secrets itself (its service-account token authenticator's
    // informer): count the syncer's watches over that baseline.
    let own_watches = api.open_watches("secrets").await;
    let dest = tmp.path().join("resources");
    let optional_flag = optional
        .iter()
        .chain(&never)
        .cloned()
        .collect::<Vec<_>>()
        .join(",");
    let mut syncer = Syncer::start(
        &api,
        &dest,
        &[
            "--secrets",
            &required.join(","),
            "--optional-secrets",
            &optional_flag,
            "--namespace-watch-threshold",
            "100",
        ],
    );
    wait_until("every Secret synced", TIMEOUT, || async {
        present.iter().all(|name| synced(&dest, name, 1))
    })
    .await;
    wait_until("ready", TIMEOUT, || async { syncer.readyz().0 == 200 }).await;
    for name in &present {
        assert_eq!(
            mode(&dest.join("secrets").join(name).join("tls.key")),
            0o600
        );
    }
    for name in unnamed.iter().chain(&never) {
        assert!(!dest.join("secrets").join(name).exists(), "{name}");
    }

    // One watch connection, one list, no GET per object.
    assert_eq!(
        api.open_watches("secrets").await - own_watches,
        1.0,
        "watches"
    );
    assert_eq!(admin_requests(&api, "list").await, 1.0, "lists");
    assert_eq!(admin_requests(&api, "get").await, 0.0, "gets");
    let written = |text: &str| {
        metric_sum(
            text,
            "cert_syncer_syncs_total",
            &["kind=\"secret\"", "result=\"written\""],
        )
    };
    let unchanged_writes = |text: &str| {
        metric_sum(
            text,
            "cert_syncer_syncs_total",
            &["kind=\"secret\"", "result=\"unchanged\""],
        )
    };
    let skipped = |text: &str| {
        metric_sum(
            text,
            "cert_syncer_namespace_watch_events_total",
            &["kind=\"secret\"", "result=\"unchanged\""],
        )
    };
    let before = syncer.metrics();
    assert_eq!(written(&before), present.len() as f64, "{before}");
    assert_eq!(skipped(&before), 0.0, "{before}");
    let generations_before = generations(&dest, &present);

    // Move the history past the syncer's resourceVersion (changes it does not watch), then
    // crash and restart the apiserver: the watcher's resume gets 410 and it relists.
    let config_maps: Api<ConfigMap> = Api::namespaced(api.recovery_client(), NS);
    config_maps
        .create(&PostParams::default(), &bundle_config_map("churn", "0"))
        .await
        .unwrap();
    for i in 1..=30 {
        let mut churn = config_maps.get("churn").await.unwrap();
        churn.data = bundle_config_map("churn", &i.to_string()).data;
        config_maps
            .replace("churn", &PostParams::default(), &churn)
            .await
            .unwrap();
    }
    api.restart().await;
    // Every named object comes back in the relist with the version already written: no work.
    wait_until("the relist seen as unchanged", TIMEOUT, || async {
        skipped(&syncer.metrics()) >= (present.len() + NEVER) as f64
    })
    .await;
    let after_relist = syncer.metrics();
    assert_eq!(
        skipped(&after_relist),
        (present.len() + NEVER) as f64,
        "{after_relist}"
    );
    // Mini's counters restarted with it; the audit log did not: the relist is the second.
    let lists_after_relist = match backend {
        Backend::Mini => 1.0,
        Backend::Real => 2.0,
    };
    assert_eq!(admin_requests(&api, "list").await, lists_after_relist);

    // One update: only that object is rewritten.
    let updated = &required[7];
    let mut current = secrets.get(updated).await.unwrap();
    current.data = secret(updated, 2).data;
    secrets
        .replace(updated, &PostParams::default(), &current)
        .await
        .unwrap();
    wait_until("the update written", TIMEOUT, || async {
        synced(&dest, updated, 2)
    })
    .await;
    let generations_after = generations(&dest, &present);
    for name in &present {
        let changed = generations_before[name] != generations_after[name];
        assert_eq!(changed, name == updated, "{name}: rewritten = {changed}");
    }
    // The counter follows the write that made the files visible.
    wait_until("the write counted", TIMEOUT, || async {
        written(&syncer.metrics()) >= present.len() as f64 + 1.0
    })
    .await;
    let after_update = syncer.metrics();
    assert_eq!(
        written(&after_update),
        present.len() as f64 + 1.0,
        "{after_update}"
    );
    assert_eq!(unchanged_writes(&after_update), 0.0, "{after_update}");
    // The test's own GET above is the only one.
    assert_eq!(admin_requests(&api, "get").await, 1.0);

    // An optional Secret deleted: its directory goes, after one confirming GET.
    let removed = &optional[3];
    secrets
        .delete(removed, &DeleteParams::default())
        .await
        .unwrap();
    wait_until("the optional directory removed", TIMEOUT, || async {
        !dest.join("secrets").join(removed).exists()
    })
    .await;
    assert_eq!(admin_requests(&api, "get").await, 2.0);
    // A required one deleted: files kept, not ready, named.
    let kept = &required[11];
    secrets
        .delete(kept, &DeleteParams::default())
        .await
        .unwrap();
    wait_until("not ready", TIMEOUT, || async { syncer.readyz().0 == 503 }).await;
    assert!(synced(&dest, kept, 1));
    assert!(syncer.readyz().1.contains(&format!("secret/{kept}")));

    assert_eq!(api.open_watches("secrets").await - own_watches, 1.0);
    let status = syncer.process.terminate(Duration::from_secs(10));
    assert!(
        status.is_some_and(|s| s.success()),
        "exit after SIGTERM: {status:?}\n{}",
        syncer.process.stderr_text()
    );
}

/// The namespace-wide path for both kinds (threshold 0), with what the per-object tests check:
/// a host file, key pruning, a required object deleted and recreated.
async fn the_namespace_wide_path_keeps_the_per_object_behaviour(backend: Backend) {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = TestApi::start_default(backend, tmp.path()).await;
    let client = api.recovery_client();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(client, NS);
    let ca = Ca::default();
    secrets
        .create(&PostParams::default(), &secret("serving-cert", 1))
        .await
        .unwrap();
    config_maps
        .create(
            &PostParams::default(),
            &bundle_config_map("client-ca", &ca.cert_pem),
        )
        .await
        .unwrap();
    // The apiserver's own watches (the real one has informers of its own): the baseline.
    let mut own_watches = BTreeMap::new();
    for resource in ["secrets", "configmaps"] {
        own_watches.insert(resource, api.open_watches(resource).await);
    }
    let dest = tmp.path().join("resources");
    let host_file = tmp.path().join("host/ca.crt");
    std::fs::create_dir_all(host_file.parent().unwrap()).unwrap();
    let syncer = Syncer::start(
        &api,
        &dest,
        &[
            "--secrets",
            "serving-cert",
            "--configmaps",
            "client-ca",
            "--file",
            &format!("configmap/client-ca/ca-bundle.crt={}", host_file.display()),
            "--namespace-watch-threshold",
            "0",
        ],
    );
    wait_until("ready", TIMEOUT, || async { syncer.readyz().0 == 200 }).await;
    assert!(synced(&dest, "serving-cert", 1));
    assert_eq!(
        read(&dest.join("configmaps/client-ca/ca-bundle.crt")).as_deref(),
        Some(ca.cert_pem.as_str())
    );
    assert_eq!(
        mode(&dest.join("configmaps/client-ca/ca-bundle.crt")),
        0o644
    );
    wait_until("the host file", TIMEOUT, || async {
        read(&host_file).as_deref() == Some(ca.cert_pem.as_str())
    })
    .await;
    for resource in ["secrets", "configmaps"] {
        // The real apiserver counts a watch once its first event went out: wait for the count
        // to settle on exactly one, then check it stays there.
        wait_until(&format!("one {resource} watch"), TIMEOUT, || async {
            api.open_watches(resource).await - own_watches[resource] == 1.0
        })
        .await;
        assert_eq!(
            api.open_watches(resource).await - own_watches[resource],
            1.0,
            "{resource} watches"
        );
    }

    // A key added then removed: its file appears, then is pruned.
    let mut current = config_maps.get("client-ca").await.unwrap();
    current
        .data
        .as_mut()
        .unwrap()
        .insert("extra".to_owned(), "x".to_owned());
    config_maps
        .replace("client-ca", &PostParams::default(), &current)
        .await
        .unwrap();
    wait_until("the new key", TIMEOUT, || async {
        read(&dest.join("configmaps/client-ca/extra")).is_some()
    })
    .await;
    let mut current = config_maps.get("client-ca").await.unwrap();
    current.data.as_mut().unwrap().remove("extra");
    config_maps
        .replace("client-ca", &PostParams::default(), &current)
        .await
        .unwrap();
    wait_until("the key pruned", TIMEOUT, || async {
        std::fs::symlink_metadata(dest.join("configmaps/client-ca/extra")).is_err()
    })
    .await;

    // The required Secret deleted: files kept, not ready; recreated: written, ready again.
    secrets
        .delete("serving-cert", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("not ready", TIMEOUT, || async { syncer.readyz().0 == 503 }).await;
    assert!(synced(&dest, "serving-cert", 1));
    secrets
        .create(&PostParams::default(), &secret("serving-cert", 2))
        .await
        .unwrap();
    wait_until("the recreated Secret written", TIMEOUT, || async {
        synced(&dest, "serving-cert", 2)
    })
    .await;
    wait_until("ready again", TIMEOUT, || async {
        syncer.readyz().0 == 200
    })
    .await;
}
