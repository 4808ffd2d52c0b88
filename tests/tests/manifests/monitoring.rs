//! `manifests/monitoring/` checked as data: the two rule files are what `rules.src.yaml` renders
//! (`cargo run --bin monitoring-rules` writes them) and hold the same groups; every metric a rule
//! selects is registered by our code (`cert-syncer/src`, `reload-lib/src`) with the labels its
//! matchers use, or is one of the few named below (kube-state-metrics, metrics another change
//! brings); the promtool tests' series have the labels our code gives them, and every alert has a
//! test where it fires and one where it stays silent; every alert has a runbook section; the
//! readiness alert names exactly the containers that run `cert-syncer` in `manifests/`; the
//! PrometheusRule is in a kustomization. (`bash scripts/check-alerts` runs promtool on them;
//! `alerts.rs` runs them in a real Prometheus.)

use std::collections::{BTreeMap, BTreeSet};

use e2e::manifests;
use e2e::monitoring::{
    self, PROMETHEUS_RULE, RULE_FILE, RUNBOOKS, Registered, RuleFile, Selector, selectors,
};

/// Metrics the rules use that no code of ours registers, with their labels and who exports them.
const EXTERNAL: &[(&str, &[&str], &str)] = &[(
    "kube_pod_container_status_ready",
    &["namespace", "pod", "container", "uid"],
    "kube-state-metrics",
)];

/// Metrics the rules use for work that is landing in another change, with their labels. Each
/// must not be registered yet: once it is, this entry goes (and the catalog checks it).
const PENDING: &[(&str, &[&str], &str)] = &[];

/// Labels a scrape adds to a series (static targets, Kubernetes service discovery), which the
/// tests' series may carry besides the metric's own; `exported_namespace` is a metric's
/// `namespace` renamed by a scrape that sets its own.
const TARGET_LABELS: &[&str] = &[
    "instance",
    "job",
    "namespace",
    "pod",
    "container",
    "exported_namespace",
];

fn rule_file() -> RuleFile {
    let path = monitoring::dir().join(RULE_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_norway::from_str(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// The label names each metric the rules may use has: ours, the external and the pending ones.
fn catalog() -> BTreeMap<String, BTreeSet<String>> {
    let registered = monitoring::registered_metrics().unwrap();
    let mut all: BTreeMap<String, BTreeSet<String>> = registered
        .iter()
        .map(|(name, r)| (name.clone(), r.labels.clone()))
        .collect();
    for (name, labels, _) in EXTERNAL.iter().chain(PENDING) {
        all.insert(
            (*name).to_owned(),
            labels.iter().map(|l| (*l).to_owned()).collect(),
        );
    }
    all
}

#[test]
fn the_rule_files_are_what_the_source_renders() {
    for (name, expected) in monitoring::generated().unwrap() {
        let path = monitoring::dir().join(name);
        let actual = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            actual == expected,
            "{} is stale: run `cargo run --bin monitoring-rules` (it renders {} into it)",
            path.display(),
            monitoring::SOURCE
        );
    }
}

#[test]
fn the_prometheus_rule_holds_the_rule_files_groups() {
    let docs = manifests::documents(&monitoring::dir().join(PROMETHEUS_RULE));
    assert_eq!(docs.len(), 1);
    let object = &docs[0];
    assert_eq!(object["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(object["kind"], "PrometheusRule");
    assert!(object["metadata"]["name"].is_string() && object["metadata"]["namespace"].is_string());
    let spec: RuleFile = serde_json::from_value(object["spec"].clone()).unwrap();
    assert_eq!(spec, rule_file());
    // `kubectl apply -k manifests/monitoring` applies it (not the cluster kustomization: the
    // CRD may be absent).
    let kustomization = manifests::documents(&monitoring::dir().join("kustomization.yaml"));
    assert_eq!(
        kustomization[0]["resources"],
        serde_json::json!([PROMETHEUS_RULE])
    );
}

#[test]
fn our_code_registers_the_metrics_we_know() {
    let registered = monitoring::registered_metrics().unwrap();
    // The catalog reader itself: a family of each kind, with its labels.
    let expect = |name: &str, kind: &str, labels: &[&str]| {
        let found = registered
            .get(name)
            .unwrap_or_else(|| panic!("{name} not found in {:?}", registered.keys()));
        assert_eq!(found.kind, kind, "{name}");
        let labels: BTreeSet<String> = labels.iter().map(|l| (*l).to_owned()).collect();
        assert_eq!(found.labels, labels, "{name}");
    };
    expect(
        "cert_syncer_syncs_total",
        "counter",
        &["kind", "name", "result"],
    );
    expect(
        "cert_syncer_certificate_not_after_timestamp_seconds",
        "gauge",
        &["kind", "name", "key"],
    );
    expect("cert_regenerate_failures_total", "counter", &[]);
    expect("cert_regenerate_last_pass_timestamp_seconds", "gauge", &[]);
    expect(
        "cert_syncer_kubelet_csr_decisions_total",
        "counter",
        &["reason", "result"],
    );
    expect(
        "reload_certificate_not_after_timestamp_seconds",
        "gauge",
        &["set", "source"],
    );
    expect(
        "cert_syncer_node_source_valid",
        "gauge",
        &["path", "kind", "namespace", "name", "key"],
    );
    assert!(registered.len() >= 30, "{registered:#?}");
}

#[test]
fn every_metric_a_rule_selects_is_registered_with_the_labels_it_matches() {
    let registered = monitoring::registered_metrics().unwrap();
    for (name, _, what) in PENDING {
        assert!(
            !registered.contains_key(*name),
            "{name} ({what}) is registered now: remove it from PENDING so the catalog checks it"
        );
    }
    let catalog = catalog();
    let mut used = BTreeSet::new();
    for group in rule_file().groups {
        for rule in group.rules {
            let found = selectors(&rule.expr).unwrap_or_else(|err| panic!("{}: {err}", rule.alert));
            assert!(!found.is_empty(), "{} selects no metric", rule.alert);
            for Selector { metric, matchers } in found {
                let labels = catalog.get(&metric).unwrap_or_else(|| {
                    panic!(
                        "{}: {metric} is not registered by {:?} (renamed?), nor listed as external or pending",
                        rule.alert,
                        monitoring::REGISTERING_CODE
                    )
                });
                for (label, _, _) in matchers {
                    assert!(
                        labels.contains(&label),
                        "{}: {metric} has no label {label:?} (it has {labels:?})",
                        rule.alert
                    );
                }
                used.insert(metric);
            }
        }
    }
    // What the issue asks the rules to watch, by metric.
    for metric in [
        "cert_syncer_certificate_not_after_timestamp_seconds",
        "cert_regenerate_certificate_not_after_timestamp_seconds",
        "reload_certificate_not_after_timestamp_seconds",
        "cert_regenerate_writes_held_total",
        "cert_regenerate_last_pass_timestamp_seconds",
        "cert_syncer_resyncs_total",
        "cert_syncer_node_bundle_refused",
        "cert_syncer_node_source_valid",
        "cert_syncer_kubelet_csr_decisions_total",
        "cert_syncer_container_restarts_total",
        "cert_syncer_container_restarts_held_total",
        "kube_pod_container_status_ready",
    ] {
        assert!(used.contains(metric), "no rule uses {metric}");
    }
}

/// The promtool test files and their parsed content.
fn promtool_tests() -> Vec<(String, serde_json::Value)> {
    let dir = monitoring::dir().join("tests");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".test.yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no promtool tests in {}", dir.display());
    files
        .into_iter()
        .map(|path| {
            let doc = manifests::documents(&path).remove(0);
            (path.display().to_string(), doc)
        })
        .collect()
}

/// `name{a="x",b="y"}` → (name, {a, b}).
fn parse_series(series: &str) -> (String, BTreeSet<String>) {
    let selector = selectors(series)
        .unwrap_or_else(|err| panic!("{series}: {err}"))
        .remove(0);
    let labels = selector.matchers.into_iter().map(|(l, _, _)| l).collect();
    (selector.metric, labels)
}

#[test]
fn the_promtool_tests_use_series_shaped_as_our_code_exports_them() {
    let catalog = catalog();
    for (file, doc) in promtool_tests() {
        assert_eq!(
            doc["rule_files"],
            serde_json::json!([format!("../{RULE_FILE}")]),
            "{file}"
        );
        for test in doc["tests"].as_array().unwrap() {
            for input in test["input_series"].as_array().unwrap() {
                let (metric, labels) = parse_series(input["series"].as_str().unwrap());
                let own = catalog
                    .get(&metric)
                    .unwrap_or_else(|| panic!("{file}: {metric} is not a metric of the catalog"));
                let missing: Vec<_> = own.difference(&labels).collect();
                let extra: Vec<_> = labels
                    .difference(own)
                    .filter(|l| !TARGET_LABELS.contains(&l.as_str()))
                    .collect();
                assert!(
                    missing.is_empty() && extra.is_empty(),
                    "{file}: {metric} series lacks {missing:?} / has unknown {extra:?}"
                );
            }
        }
    }
}

#[test]
fn every_alert_has_a_test_where_it_fires_and_one_where_it_stays_silent() {
    let mut fires = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for (_, doc) in promtool_tests() {
        for test in doc["tests"].as_array().unwrap() {
            for case in test["alert_rule_test"].as_array().into_iter().flatten() {
                let name = case["alertname"].as_str().unwrap().to_owned();
                let expected = case["exp_alerts"].as_array().map_or(0, Vec::len);
                if expected == 0 {
                    silent.insert(name);
                } else {
                    fires.insert(name);
                }
            }
        }
    }
    for group in rule_file().groups {
        for rule in group.rules {
            assert!(
                fires.contains(&rule.alert),
                "no promtool test fires {}",
                rule.alert
            );
            assert!(
                silent.contains(&rule.alert),
                "no promtool test where {} stays silent",
                rule.alert
            );
        }
    }
}

#[test]
fn every_alert_names_its_object_and_has_a_runbook_section() {
    let root = manifests::dir().parent().unwrap().to_owned();
    let runbooks = std::fs::read_to_string(root.join(RUNBOOKS)).unwrap();
    let source = monitoring::Source::load().unwrap();
    for group in rule_file().groups {
        for rule in group.rules {
            let name = &rule.alert;
            assert!(
                rule.annotations["description"].contains("$labels."),
                "{name}: the description names no object"
            );
            assert_eq!(
                rule.annotations["runbook_url"],
                format!("{}#{}", source.runbooks, monitoring::anchor(name))
            );
            let heading = format!("\n## {name}\n");
            let start = runbooks
                .find(&heading)
                .unwrap_or_else(|| panic!("{RUNBOOKS} has no section `## {name}`"));
            let section = &runbooks[start + heading.len()..];
            let section = &section[..section.find("\n## ").unwrap_or(section.len())];
            for part in ["**Meaning.**", "**What to check.**", "**How to fix.**"] {
                assert!(
                    section.contains(part),
                    "{RUNBOOKS} `## {name}` lacks {part}"
                );
            }
        }
    }
}

#[test]
fn the_readiness_alert_names_exactly_the_containers_that_run_cert_syncer() {
    let rule = rule_file()
        .groups
        .into_iter()
        .flat_map(|g| g.rules)
        .find(|r| r.alert == "CertReloadSidecarNotReady")
        .unwrap();
    let selector = selectors(&rule.expr).unwrap().remove(0);
    let (_, op, regex) = selector
        .matchers
        .iter()
        .find(|(label, _, _)| label == "container")
        .unwrap()
        .clone();
    assert_eq!(op, "=~");
    let in_rule: BTreeSet<String> = regex.split('|').map(str::to_owned).collect();
    let mut shipped = BTreeSet::new();
    for file in manifests::object_files()
        .into_iter()
        .chain([std::path::PathBuf::from("node/node-mode/daemonset.yaml")])
    {
        for doc in manifests::documents(&manifests::dir().join(&file)) {
            let spec = match doc["kind"].as_str() {
                Some("Pod") => &doc["spec"],
                Some("DaemonSet") => &doc["spec"]["template"]["spec"],
                _ => continue,
            };
            for container in spec["containers"].as_array().into_iter().flatten() {
                let image = container["image"].as_str().unwrap_or_default();
                if image.starts_with("localhost/cert-reload/cert-syncer") {
                    shipped.insert(container["name"].as_str().unwrap().to_owned());
                }
            }
        }
    }
    assert_eq!(in_rule, shipped);
}

#[test]
fn the_catalog_reads_every_file_that_registers_metrics() {
    let registered: BTreeMap<String, Registered> = monitoring::registered_metrics().unwrap();
    let files: BTreeSet<&str> = registered.values().map(|r| r.file.as_str()).collect();
    for file in [
        "cert-syncer/src/sync/metrics.rs",
        "cert-syncer/src/regenerate/metrics.rs",
        "cert-syncer/src/node/metrics.rs",
        "cert-syncer/src/approve/mod.rs",
        "reload-lib/src/metrics.rs",
    ] {
        assert!(
            files.contains(file),
            "nothing registered in {file}: {files:?}"
        );
    }
}
