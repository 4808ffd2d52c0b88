//! The shipped alert rules in a real Prometheus (Debian's `prometheus`, started here on
//! 127.0.0.1 with its own data directory; skips where it is not installed, `E2E_PROMETHEUS` names
//! another binary), scraping a running `cert-syncer sync` and `regenerate` on mini-apiserver
//! every second: the expiry alerts fire for a real expired and a real expiring certificate (read
//! from `/api/v1/alerts`, their labels and descriptions naming the object), and the expired one
//! resolves once `regenerate` replaced it and `sync` wrote it; the alert for an optional
//! object's expired certificate resolves when the object is deleted (its files and its series go).
//!
//! `for:` durations: the shipped rule file is loaded unchanged and its alerts are asserted
//! `pending` (the expression matched real metrics; its `for:` holds them, which promtool's tests
//! prove to the minute); a copy made here from it differs only in `for: 0s` and a label
//! `e2e_rules="for-0s"`, and its alerts are asserted `firing`. Nothing of the shipped rules is
//! weakened, and the test takes seconds, not the rules' 5 minutes to an hour.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use e2e::apiserver::ADMIN_TOKEN;
use e2e::monitoring::{self, RULE_FILE, RuleFile};
use e2e::prometheus::{Alert, Prometheus};
use e2e::syncer::{NS, bundle_config_map, regenerate_command, tls_secret};
use e2e::{Backend, Ca, CertSpec, ChildProcess, Syncer, TestApi, install_crypto_provider};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use time::OffsetDateTime;

/// A signer, its bundle and two targets: `expired-cert` (expired a day ago: the recovery's
/// case) and `soon-cert` (three days left: expired-only leaves it to the operator).
const REGENERATE_CONFIG: &str = r#"
namespace: openshift-kube-apiserver
signers:
  - { name: serving-signer, validity: 200d, refresh: 150d }
bundles:
  - { name: serving-ca, signers: [serving-signer] }
targets:
  - name: expired-cert
    signer: serving-signer
    serving: { hostnames: [localhost, 127.0.0.1] }
    validity: 100d
    refresh: 50d
  - name: soon-cert
    signer: serving-signer
    serving: { hostnames: [localhost, 127.0.0.1] }
    validity: 100d
    refresh: 50d
"#;

const EXPIRED: &str = "CertReloadCertificateExpired";
const SOON: &str = "CertReloadCertificateExpiresSoon";
/// The label that marks the `for: 0s` copy's alerts.
const COPY_LABEL: (&str, &str) = ("e2e_rules", "for-0s");
/// How long Prometheus gets to scrape, evaluate and settle (1 s intervals).
const SETTLE: Duration = Duration::from_secs(60);

/// The shipped rule file with `for:` removed from every rule and [`COPY_LABEL`] added.
fn for_zero_copy() -> String {
    let text = std::fs::read_to_string(monitoring::dir().join(RULE_FILE)).unwrap();
    let mut rules: RuleFile = serde_norway::from_str(&text).unwrap();
    for group in &mut rules.groups {
        group.name.push_str("-for-0s");
        for rule in &mut group.rules {
            rule.for_ = None;
            rule.labels
                .insert(COPY_LABEL.0.to_owned(), COPY_LABEL.1.to_owned());
        }
    }
    serde_norway::to_string(&rules).unwrap()
}

/// Prometheus' config: both rule files, a 1 s scrape and evaluation, and one job per sidecar
/// whose targets are a file the test writes (`file_sd`: re-read when it changes).
const PROMETHEUS_CONFIG: &str = r#"
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [shipped.rules.yaml, for-0s.rules.yaml]
scrape_configs:
  - job_name: cert-syncer-sync
    file_sd_configs: [{ files: [sync.targets.json], refresh_interval: 1s }]
  - job_name: cert-syncer-regenerate
    file_sd_configs: [{ files: [regenerate.targets.json], refresh_interval: 1s }]
"#;

fn write_targets(dir: &Path, job: &str, addr: Option<&str>) {
    let targets = match addr {
        Some(addr) => serde_json::json!([{ "targets": [addr] }]),
        None => serde_json::json!([]),
    };
    let path = dir.join(format!("{job}.targets.json"));
    testkit::files::rename_into(&path, targets.to_string().as_bytes());
}

/// An alert as the test compares it: (copy or shipped, name, object, state).
fn key(alert: &Alert) -> (bool, String, String, String) {
    let object = if alert.label("object").is_empty() {
        format!(
            "{}/{} {}",
            alert.label("kind"),
            alert.label("name"),
            alert.label("key")
        )
    } else {
        format!("{} {}", alert.label("kind"), alert.label("object"))
    };
    (
        alert.label(COPY_LABEL.0) == COPY_LABEL.1,
        alert.label("alertname").to_owned(),
        object,
        alert.state.clone(),
    )
}

fn keys(alerts: &[Alert]) -> BTreeSet<(bool, String, String, String)> {
    alerts.iter().map(key).collect()
}

fn expected(entries: &[(bool, &str, &str, &str)]) -> BTreeSet<(bool, String, String, String)> {
    entries
        .iter()
        .map(|(copy, name, object, state)| {
            (
                *copy,
                (*name).to_owned(),
                (*object).to_owned(),
                (*state).to_owned(),
            )
        })
        .collect()
}

/// Polls Prometheus' alerts until they are exactly `want` (every 200 ms, at most [`SETTLE`]).
async fn alerts_become(
    prometheus: &Prometheus,
    want: &BTreeSet<(bool, String, String, String)>,
) -> Vec<Alert> {
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        let alerts = prometheus.alerts();
        if keys(&alerts) == *want {
            return alerts;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "alerts after {SETTLE:?}:\n{:#?}\nwanted:\n{want:#?}\ntargets: {:?}",
            keys(&alerts),
            prometheus.target_health()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn find<'a>(alerts: &'a [Alert], copy: bool, name: &str, object: &str) -> &'a Alert {
    alerts
        .iter()
        .find(|a| {
            let (c, n, o, _) = key(a);
            c == copy && n == name && o == object
        })
        .unwrap_or_else(|| panic!("no {name} for {object} in {alerts:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_expiry_alerts_fire_for_real_certificates_and_the_expired_one_resolves_after_the_recovery()
 {
    let binary = e2e::require_prometheus!();
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = TestApi::start_default(Backend::Mini, tmp.path()).await;
    let client = api.client_with_token(ADMIN_TOKEN);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(client, NS);

    // The slept state: a valid signer and bundle, one target expired a day ago, one with three
    // days left.
    let now = OffsetDateTime::now_utc();
    let day = time::Duration::days(1);
    let signer = Ca::new("serving-signer");
    let leaf = |not_after| {
        signer
            .issue(&CertSpec::server(&["localhost", "127.0.0.1"]).valid(now - day * 30, not_after))
    };
    let (expired, soon, gone) = (leaf(now - day), leaf(now + day * 3), leaf(now - day * 2));
    let create = PostParams::default();
    for secret in [
        tls_secret("serving-signer", &signer.cert_pem, &signer.key_pem()),
        tls_secret("expired-cert", &expired.cert_pem, &expired.key_pem),
        tls_secret("soon-cert", &soon.cert_pem, &soon.key_pem),
        tls_secret("gone-cert", &gone.cert_pem, &gone.key_pem),
    ] {
        secrets.create(&create, &secret).await.unwrap();
    }
    config_maps
        .create(&create, &bundle_config_map("serving-ca", &signer.cert_pem))
        .await
        .unwrap();

    // sync mirrors the two targets and the bundle, as the static pod's sidecar does, and an
    // optional user certificate (expired: its owner will delete it rather than renew it).
    let dest = tmp.path().join("resources");
    let sync = Syncer::start(
        &api,
        &dest,
        &[
            "--secrets",
            "expired-cert,soon-cert",
            "--configmaps",
            "serving-ca",
            "--optional-secrets",
            "gone-cert",
        ],
    );
    e2e::wait_until("sync wrote the expired certificate", SETTLE, || async {
        std::fs::read_to_string(dest.join("secrets/expired-cert/tls.crt")).ok()
            == Some(expired.cert_pem.clone())
    })
    .await;

    // Prometheus with the shipped rules and their `for: 0s` copy, scraping sync.
    let prom_dir = tmp.path().join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    std::fs::copy(
        monitoring::dir().join(RULE_FILE),
        prom_dir.join("shipped.rules.yaml"),
    )
    .unwrap();
    std::fs::write(prom_dir.join("for-0s.rules.yaml"), for_zero_copy()).unwrap();
    write_targets(&prom_dir, "sync", Some(&sync.metrics_addr()));
    write_targets(&prom_dir, "regenerate", None);
    let prometheus = Prometheus::start(&binary, &prom_dir, PROMETHEUS_CONFIG);

    // The slept state seen: the expired key and the expiring one, each firing in the copy and
    // pending (its `for:`) in the shipped rules; nothing about the bundle.
    let expired_key = "secret/expired-cert tls.crt";
    let soon_key = "secret/soon-cert tls.crt";
    let gone_key = "secret/gone-cert tls.crt";
    let alerts = alerts_become(
        &prometheus,
        &expected(&[
            (true, EXPIRED, expired_key, "firing"),
            (true, EXPIRED, gone_key, "firing"),
            (true, SOON, soon_key, "firing"),
            (false, EXPIRED, expired_key, "pending"),
            (false, EXPIRED, gone_key, "pending"),
            (false, SOON, soon_key, "pending"),
        ]),
    )
    .await;
    let fired = find(&alerts, true, EXPIRED, expired_key);
    let since_expiry: f64 = fired.value.parse().unwrap();
    assert!(
        (86_400.0..86_400.0 + 300.0).contains(&since_expiry),
        "seconds since the expiry: {since_expiry}"
    );
    let description = &fired.annotations["description"];
    assert!(
        description.starts_with(&format!(
            "The secret expired-cert (key tls.crt, as synced by cert-syncer sync) on {} expired 1d ",
            sync.metrics_addr()
        )),
        "{description}"
    );
    assert_eq!(fired.labels["severity"], "critical");
    assert_eq!(fired.labels["job"], "cert-syncer-sync");
    let warned = find(&alerts, true, SOON, soon_key);
    assert!(
        warned.annotations["description"].contains("secret soon-cert (key tls.crt"),
        "{warned:?}"
    );
    assert_eq!(warned.labels["severity"], "warning");
    assert!(
        find(&alerts, false, EXPIRED, expired_key)
            .active_at
            .is_some(),
        "the shipped rule's alert is pending since the first evaluation"
    );

    // The user deletes the optional object; the recovery: regenerate (expired-only) replaces
    // the expired target, sync writes it.
    secrets
        .delete("gone-cert", &Default::default())
        .await
        .unwrap();
    let regenerate = ChildProcess::start(regenerate_command(
        &api,
        &{
            let path = tmp.path().join("regenerate.yaml");
            std::fs::write(&path, REGENERATE_CONFIG).unwrap();
            path
        },
        &["--metrics-listen", "127.0.0.1:0"],
    ));
    write_targets(&prom_dir, "regenerate", Some(&regenerate.addr.to_string()));

    // Both expired alerts resolve (in both rule files); the expiring certificate, which
    // expired-only leaves alone, now warns from both sidecars: the key sync wrote and the target
    // regenerate manages.
    let target = format!("target {NS}/soon-cert");
    let alerts = alerts_become(
        &prometheus,
        &expected(&[
            (true, SOON, soon_key, "firing"),
            (true, SOON, &target, "firing"),
            (false, SOON, soon_key, "pending"),
            (false, SOON, &target, "pending"),
        ]),
    )
    .await;
    let from_regenerate = find(&alerts, true, SOON, &target);
    assert!(
        from_regenerate.annotations["description"].starts_with(&format!(
            "The target {NS}/soon-cert (managed by cert-syncer regenerate) on {} expires in 2d ",
            regenerate.addr
        )),
        "{from_regenerate:?}"
    );
    let on_disk = std::fs::read_to_string(dest.join("secrets/expired-cert/tls.crt")).unwrap();
    assert_ne!(
        on_disk, expired.cert_pem,
        "sync wrote the regenerated certificate"
    );
    assert!(
        !dest.join("secrets/gone-cert").exists(),
        "the optional object's files went"
    );
    assert_eq!(
        prometheus.target_health().values().collect::<Vec<_>>(),
        ["up", "up"]
    );
}
