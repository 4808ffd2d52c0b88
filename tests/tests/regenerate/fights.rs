//! Fights, on the real kube-apiserver (issue 35 items 5 and 6): what the brake holds is not
//! written, and what depends on it waits; every write is bounded, creations of an object
//! someone keeps deleting included; and the brake's memory outlives the process.
//!
//! 1. Another writer keeps taking our signer's CA out of the bundle: ours re-adds it three
//!    times, then the brake holds the bundle — and the leaf, whose chain the bundle no longer
//!    carries, is not re-issued by a signer no bundle trusts: it waits (`WaitingForTrust`,
//!    `cert_regenerate_writes_waiting_total`, a `trust:` line on `/readyz`). Before, a held
//!    bundle counted as written and the leaf was re-issued up to its own budget.
//! 2. Another controller deletes the leaf as soon as it exists: at most three creations, then
//!    held (before: "missing" was exempt, one new key per deletion at watch speed). The record
//!    is kept on the Lease (`cert-reload.io/regenerate-brake`): the process is stopped and a
//!    new one started, and the new one still holds the object (before: a restart started
//!    afresh).
//!
//! Skips (passing, `SKIP: <reason>`) without the real kube-apiserver.

use std::time::Duration;

use e2e::apiserver::ADMIN_TOKEN;
use e2e::syncer::{NS, bundle_config_map, regenerate_command};
use e2e::{Backend, Ca, ChildProcess};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, PostParams};

use super::fixture::{
    Fixture, controller, event_reasons, fixture, keep_writing, metrics_of, object_metric,
};

// `<scenario>::real`: .config/nextest.toml gives real-apiserver tests a longer leash.
mod a_leaf_waits_while_a_fight_holds_its_bundle {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real() {
        e2e::require_real_apiserver!();
        super::a_leaf_waits_while_a_fight_holds_its_bundle().await;
    }
}

mod a_deleted_object_meets_the_brake_and_a_restart_does_not_reset_it {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real() {
        e2e::require_real_apiserver!();
        super::a_deleted_object_meets_the_brake_and_a_restart_does_not_reset_it().await;
    }
}

async fn wait_for_target(process: &ChildProcess) {
    e2e::wait_until("the first pass", Duration::from_secs(20), || async {
        object_metric(
            &metrics_of(process),
            "cert_regenerate_regenerations_total",
            "serving-cert",
        ) >= 1.0
    })
    .await;
}

async fn a_leaf_waits_while_a_fight_holds_its_bundle() {
    let f = fixture(Backend::Real).await;
    let process = controller(&f);
    wait_for_target(&process).await;
    // Theirs: a bundle of another CA only, put back whenever ours holds more.
    let other = Ca::new("another writer's CA");
    let fights = keep_writing(8, Duration::from_millis(200), || async {
        let mut map = f.config_maps.get("serving-ca").await.unwrap();
        if map.data.as_ref().unwrap()["ca-bundle.crt"] == other.cert_pem {
            return false;
        }
        map.data = bundle_config_map("serving-ca", &other.cert_pem).data;
        f.config_maps
            .replace("serving-ca", &PostParams::default(), &map)
            .await
            .is_ok()
    })
    .await;
    let metrics = metrics_of(&process);
    let bundle_writes = object_metric(
        &metrics,
        "cert_regenerate_regenerations_total",
        "serving-ca",
    );
    let held = object_metric(&metrics, "cert_regenerate_writes_held_total", "serving-ca");
    let leaf_writes = object_metric(
        &metrics,
        "cert_regenerate_regenerations_total",
        "serving-cert",
    );
    let waiting = object_metric(
        &metrics,
        "cert_regenerate_writes_waiting_total",
        "serving-cert",
    );
    eprintln!(
        "the other writer wrote {fights} times; ours: bundle {bundle_writes} (held {held}), \
         leaf {leaf_writes} (waiting {waiting})"
    );
    assert!(fights >= 3, "the other writer kept writing ({fights})");
    assert!(bundle_writes <= 3.0 && held >= 1.0, "the bundle is braked");
    assert_eq!(
        leaf_writes, 1.0,
        "the leaf is never re-issued by a signer its bundle does not hold"
    );
    assert!(waiting >= 1.0, "the leaf's write waits");
    let (code, body) = e2e::plain_http_get(&process.addr.to_string(), "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("trust:")
            && body.contains("serving-cert waits for configmap")
            && body.contains("loop:"),
        "{body}"
    );
    assert!(
        event_reasons(&f)
            .await
            .contains(&"WaitingForTrust".to_owned())
    );
}

/// A controller with leader election (its brake kept on the Lease) and a fixed identity, as a
/// static pod's replica restarted by the kubelet has.
fn leader(f: &Fixture) -> ChildProcess {
    let mut command = regenerate_command(
        &f.api,
        &f.config,
        &[
            "--leader-elect",
            "--leader-elect-lease-name",
            "brake-test-lock",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    );
    command
        .env("RUST_LOG", "info")
        .env("POD_NAME", "regeneration-0")
        .env("POD_NAMESPACE", NS);
    ChildProcess::start(command)
}

async fn a_deleted_object_meets_the_brake_and_a_restart_does_not_reset_it() {
    let f = fixture(Backend::Real).await;
    let first = leader(&f);
    wait_for_target(&first).await;
    // Deletes the leaf whenever it exists.
    let deleted = keep_writing(6, Duration::from_millis(100), || async {
        f.secrets
            .delete("serving-cert", &DeleteParams::default())
            .await
            .is_ok()
    })
    .await;
    let metrics = metrics_of(&first);
    let created = object_metric(
        &metrics,
        "cert_regenerate_regenerations_total",
        "serving-cert",
    );
    let held = object_metric(
        &metrics,
        "cert_regenerate_writes_held_total",
        "serving-cert",
    );
    eprintln!("deleted {deleted} times; ours created it {created} times, held {held}");
    assert!(
        deleted >= 2,
        "the other controller kept deleting ({deleted})"
    );
    assert!(created <= 3.0, "at most the budget of creations: {created}");
    assert!(held >= 1.0, "held: {held}");
    let leases: Api<Lease> = Api::namespaced(f.api.client_with_token(ADMIN_TOKEN), NS);
    let lease = leases.get("brake-test-lock").await.unwrap();
    let record = lease
        .metadata
        .annotations
        .unwrap_or_default()
        .remove("cert-reload.io/regenerate-brake")
        .expect("the brake's record on the Lease");
    assert!(
        record.contains("target/openshift-kube-apiserver/serving-cert"),
        "{record}"
    );

    // The process is stopped (the kubelet would restart it) and a new one takes the Lease.
    drop(first);
    let second = leader(&f);
    e2e::wait_until(
        "the new process to lead",
        Duration::from_secs(20),
        || async { second.stderr_text().contains("became leader") },
    )
    .await;
    e2e::wait_until(
        "the new process to hold the deleted object",
        Duration::from_secs(20),
        || async {
            object_metric(
                &metrics_of(&second),
                "cert_regenerate_writes_held_total",
                "serving-cert",
            ) >= 1.0
        },
    )
    .await;
    assert!(
        second
            .stderr_text()
            .contains("the brake's record taken over from the lease"),
        "the record was read"
    );
    assert_eq!(
        object_metric(
            &metrics_of(&second),
            "cert_regenerate_regenerations_total",
            "serving-cert"
        ),
        0.0,
        "a restart does not reset the fight"
    );
    assert!(f.secrets.get_opt("serving-cert").await.unwrap().is_none());
}
