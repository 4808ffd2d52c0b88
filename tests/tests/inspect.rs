//! `cert-syncer inspect` as a process: directories of good, expired, mismatched, foreign and
//! garbage material, a kubelet `..data` layout, the JSON output, and the namespace mode against
//! `mini-apiserver` (compared with what `cert-syncer sync` writes from the same objects).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use e2e::syncer::{NS, bundle_config_map, tls_secret};
use e2e::{
    Backend, Ca, CertSpec, Syncer, TestApi, bin_path, both_backends, install_crypto_provider,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use serde_json::Value;
use testkit::files::rename_into;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// What one run printed.
struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

fn inspect(args: &[&str]) -> Outcome {
    let output = Command::new(bin_path("cert-syncer"))
        .arg("inspect")
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("cert-syncer runs");
    Outcome {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

/// `inspect --json` plus `args`: (exit code, rows, stderr).
fn inspect_json(args: &[&str]) -> (i32, Vec<Value>, String) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let outcome = inspect(&all);
    let rows: Vec<Value> = serde_json::from_str(&outcome.stdout)
        .unwrap_or_else(|err| panic!("stdout is not a JSON array ({err}): {}", outcome.stdout));
    (outcome.code, rows, outcome.stderr)
}

fn path(p: &Path) -> &str {
    p.to_str().expect("UTF-8 temporary paths")
}

/// The row whose source is `source` (the first certificate of it).
fn row<'a>(rows: &'a [Value], source: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["source"] == source && r["index"].as_u64().unwrap_or(0) == 0)
        .unwrap_or_else(|| panic!("no row for {source} in {rows:#?}"))
}

/// The table line that starts with `source` (followed by column padding).
fn line<'a>(table: &'a str, source: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.starts_with(&format!("{source} ")))
        .unwrap_or_else(|| panic!("no line for {source} in\n{table}"))
}

fn problem_kinds(row: &Value) -> Vec<&str> {
    row["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap())
        .collect()
}

/// Whole seconds, so the certificate's times are exactly what the test expects to read back.
fn at(offset: Duration, later: bool) -> OffsetDateTime {
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let offset = offset.as_secs() as i64;
    OffsetDateTime::from_unix_timestamp(if later { now + offset } else { now - offset }).unwrap()
}

const DAY: Duration = Duration::from_secs(86_400);

/// A server certificate valid for a month: far from the default seven-day warning.
fn month(names: &[&str]) -> CertSpec {
    CertSpec::server(names).valid(at(DAY, false), at(30 * DAY, true))
}

#[test]
fn good_material_exits_0_and_every_fact_is_read_back() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ca = Ca::default();
    let not_before = at(DAY, false);
    let not_after = at(30 * DAY, true);
    let issued =
        ca.issue(&CertSpec::server(&["api.example", "10.0.0.1"]).valid(not_before, not_after));
    rename_into(&dir.join("ca-bundle.crt"), ca.cert_pem.as_bytes());
    rename_into(&dir.join("serving.crt"), issued.cert_pem.as_bytes());
    rename_into(&dir.join("serving.key"), issued.key_pem.as_bytes());
    rename_into(&dir.join("token"), b"not certificate material");

    let table = inspect(&["--dir", path(dir)]);
    assert_eq!(table.code, 0, "{}{}", table.stdout, table.stderr);
    let serving = dir.join("serving.crt");
    let serving_line = line(&table.stdout, path(&serving));
    let not_after_text = not_after.format(&Rfc3339).unwrap();
    for expected in [
        "CN=api.example",
        "api.example,10.0.0.1",
        &not_after_text,
        &not_before.format(&Rfc3339).unwrap(),
    ] {
        assert!(
            serving_line.contains(expected),
            "{expected:?} missing from {serving_line:?}"
        );
    }
    // Thirty days less the seconds since issuing.
    assert!(
        serving_line.contains("  29d 23h  ") || serving_line.contains("  30d 0h  "),
        "{serving_line}"
    );
    let columns: Vec<&str> = serving_line.split_whitespace().collect();
    assert_eq!(
        columns[columns.len() - 3..],
        ["yes", "yes", "ok"],
        "{serving_line}"
    );
    assert!(table.stdout.lines().next().unwrap().starts_with("SOURCE"));
    assert!(!table.stdout.contains("token"), "{}", table.stdout);

    let (code, rows, _) = inspect_json(&["--dir", path(dir)]);
    assert_eq!(code, 0);
    assert_eq!(
        rows.len(),
        2,
        "the CA and the serving certificate: {rows:#?}"
    );
    let leaf = row(&rows, path(&serving));
    let facts = &leaf["certificate"];
    assert_eq!(facts["subject"], "CN=api.example");
    assert_eq!(facts["dns_names"], serde_json::json!(["api.example"]));
    assert_eq!(facts["ip_addresses"], serde_json::json!(["10.0.0.1"]));
    assert_eq!(facts["serial"], issued.serial.as_str());
    assert_eq!(facts["not_after"], not_after_text.as_str());
    let ca_subject = row(&rows, path(&dir.join("ca-bundle.crt")))["certificate"]["subject"].clone();
    assert_eq!(facts["issuer"], ca_subject);
    assert_eq!(leaf["role"], "leaf");
    assert_eq!(leaf["file"], path(&serving));
    assert_eq!(leaf["key"]["result"], "match");
    assert_eq!(leaf["key"]["source"], path(&dir.join("serving.key")));
    assert_eq!(leaf["chain"]["result"], "yes");
    assert_eq!(leaf["chain"]["bundle"], path(&dir.join("ca-bundle.crt")));
    assert_eq!(leaf["status"], "ok");
    let left = facts["seconds_left"].as_i64().unwrap();
    assert!((30 * 86_400 - 120..=30 * 86_400).contains(&left), "{left}");

    // The same material 40 days later: the certificate has expired.
    let later = at(40 * DAY, true).unix_timestamp().to_string();
    let (code, rows, stderr) = inspect_json(&["--dir", path(dir), "--now", &later]);
    assert_eq!(code, 1);
    assert_eq!(problem_kinds(row(&rows, path(&serving))), ["expired"]);
    assert!(
        stderr.contains(&format!("{}: expired at {not_after_text}", path(&serving))),
        "{stderr}"
    );
}

#[test]
fn an_expired_certificate_exits_1_and_its_row_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ca = Ca::default();
    let old = ca.issue(&CertSpec::server(&["old.example"]).expired(3));
    let fresh = ca.issue(&CertSpec::server(&["fresh.example"]));
    rename_into(&dir.join("ca.crt"), ca.cert_pem.as_bytes());
    rename_into(&dir.join("old.crt"), old.cert_pem.as_bytes());
    rename_into(&dir.join("old.key"), old.key_pem.as_bytes());
    rename_into(&dir.join("fresh.crt"), fresh.cert_pem.as_bytes());
    rename_into(&dir.join("fresh.key"), fresh.key_pem.as_bytes());

    let table = inspect(&["--dir", path(dir)]);
    assert_eq!(table.code, 1, "{}{}", table.stdout, table.stderr);
    let old_path = dir.join("old.crt");
    let old_line = line(&table.stdout, path(&old_path));
    assert!(old_line.contains("expired 3d"), "{old_line}");
    assert!(old_line.trim_end().ends_with("expired"), "{old_line}");
    // A day left of the fresh one: a warning, not a failure.
    assert!(line(&table.stdout, path(&dir.join("fresh.crt"))).ends_with("expiring"));
    assert!(
        table
            .stderr
            .contains(&format!("{}: expired at", path(&old_path))),
        "{}",
        table.stderr
    );
    assert!(
        table.stderr.contains("1 of 3 rows have problems"),
        "{}",
        table.stderr
    );

    let (code, rows, _) = inspect_json(&["--dir", path(dir)]);
    assert_eq!(code, 1);
    let old_row = row(&rows, path(&old_path));
    assert_eq!(old_row["status"], "problem");
    assert_eq!(problem_kinds(old_row), ["expired"]);
    assert!(old_row["certificate"]["seconds_left"].as_i64().unwrap() < -3 * 86_400 + 60);
    // Still signed by the bundle's CA: the chain column says so.
    assert_eq!(old_row["chain"]["result"], "yes");
    assert_eq!(
        row(&rows, path(&dir.join("fresh.crt")))["status"],
        "expiring"
    );

    // With a shorter warning window the fresh one is simply ok.
    let (_, rows, _) = inspect_json(&["--dir", path(dir), "--warn-within", "1h"]);
    assert_eq!(row(&rows, path(&dir.join("fresh.crt")))["status"], "ok");
}

#[test]
fn a_key_of_another_certificate_exits_1_naming_the_key_file() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ca = Ca::default();
    let a = ca.issue(&CertSpec::server(&["a.example"]));
    let b = ca.issue(&CertSpec::server(&["b.example"]));
    rename_into(&dir.join("ca-bundle.crt"), ca.cert_pem.as_bytes());
    rename_into(&dir.join("tls.crt"), a.cert_pem.as_bytes());
    rename_into(&dir.join("tls.key"), b.key_pem.as_bytes());

    let table = inspect(&["--dir", path(dir)]);
    assert_eq!(table.code, 1);
    let cert = dir.join("tls.crt");
    let columns: Vec<&str> = line(&table.stdout, path(&cert))
        .split_whitespace()
        .collect();
    assert_eq!(columns[columns.len() - 3..], ["NO", "yes", "key-mismatch"]);
    assert!(
        table.stderr.contains(&format!(
            "{}: the private key in {} does not match the certificate",
            path(&cert),
            path(&dir.join("tls.key"))
        )),
        "{}",
        table.stderr
    );
    let (_, rows, _) = inspect_json(&["--dir", path(dir)]);
    assert_eq!(row(&rows, path(&cert))["key"]["result"], "mismatch");
}

#[test]
fn garbage_is_reported_per_file_and_the_good_material_is_still_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ca = Ca::default();
    let good = ca.issue(&month(&["good.example"]));
    rename_into(&dir.join("ca-bundle.crt"), ca.cert_pem.as_bytes());
    rename_into(&dir.join("good.crt"), good.cert_pem.as_bytes());
    rename_into(&dir.join("good.key"), good.key_pem.as_bytes());
    // Text that is not PEM, PEM that is not base64, base64 that is not X.509, an empty file.
    rename_into(&dir.join("text.crt"), b"hello, I am not a certificate\n");
    rename_into(
        &dir.join("broken.crt"),
        b"-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n",
    );
    rename_into(
        &dir.join("notx509.crt"),
        b"-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n",
    );
    rename_into(&dir.join("empty.crt"), b"");
    // A certificate whose key file is garbage.
    let other = ca.issue(&CertSpec::server(&["other.example"]));
    rename_into(&dir.join("other.crt"), other.cert_pem.as_bytes());
    rename_into(
        &dir.join("other.key"),
        b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    );

    let table = inspect(&["--dir", path(dir)]);
    assert_eq!(table.code, 1, "{}{}", table.stdout, table.stderr);
    for (name, reason) in [
        ("text.crt", "no certificate found"),
        ("broken.crt", "malformed PEM"),
        ("notx509.crt", "certificate 0 cannot be parsed"),
        ("empty.crt", "the file is empty"),
    ] {
        let file = path(&dir.join(name)).to_owned();
        assert!(
            table.stderr.contains(&format!("{file}: {reason}")),
            "{file}: {reason} missing from\n{}",
            table.stderr
        );
        assert!(line(&table.stdout, &file).contains(&format!("unreadable: {reason}")));
    }
    assert!(
        table.stderr.contains(&format!(
            "{}: the private key in {} is unusable",
            path(&dir.join("other.crt")),
            path(&dir.join("other.key"))
        )),
        "{}",
        table.stderr
    );
    assert!(line(&table.stdout, path(&dir.join("good.crt"))).ends_with("ok"));

    let (code, rows, _) = inspect_json(&["--dir", path(dir)]);
    assert_eq!(code, 1);
    let text = row(&rows, path(&dir.join("text.crt")));
    assert_eq!(problem_kinds(text), ["unreadable"]);
    assert!(text["certificate"].is_null());
    assert_eq!(
        row(&rows, path(&dir.join("other.crt")))["key"]["result"],
        "unusable"
    );
    assert_eq!(row(&rows, path(&dir.join("good.crt")))["status"], "ok");
}

#[test]
fn a_certificate_of_another_ca_does_not_chain_to_the_bundle_beside_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("static-pod-resources");
    let ca = Ca::default();
    let other = Ca::default();
    let foreign = other.issue(&CertSpec::server(&["foreign.example"]));
    rename_into(&dir.join("ca-bundle.crt"), ca.cert_pem.as_bytes());
    rename_into(&dir.join("foreign.crt"), foreign.cert_pem.as_bytes());
    rename_into(&dir.join("foreign.key"), foreign.key_pem.as_bytes());
    let mine = ca.issue(&CertSpec::client("system:admin"));
    rename_into(&dir.join("admin.crt"), mine.cert_pem.as_bytes());
    rename_into(&dir.join("admin.key"), mine.key_pem.as_bytes());
    let other_bundle = tmp.path().join("other-ca.crt");
    rename_into(&other_bundle, other.cert_pem.as_bytes());

    let (code, rows, stderr) = inspect_json(&["--dir", path(&dir)]);
    assert_eq!(code, 1);
    let foreign_path = dir.join("foreign.crt");
    let foreign_row = row(&rows, path(&foreign_path));
    assert_eq!(foreign_row["chain"]["result"], "no");
    assert_eq!(foreign_row["chain"]["required"], true);
    assert_eq!(problem_kinds(foreign_row), ["no-chain"]);
    assert!(
        stderr.contains(&format!(
            "{}: does not chain to {}",
            path(&foreign_path),
            path(&dir.join("ca-bundle.crt"))
        )),
        "{stderr}"
    );
    // A client certificate chains as well as a serving one.
    assert_eq!(
        row(&rows, path(&dir.join("admin.crt")))["chain"]["result"],
        "yes"
    );

    // Told which bundle to use, the foreign one chains and the client certificate does not.
    let (code, rows, _) = inspect_json(&["--dir", path(&dir), "--ca-bundle", path(&other_bundle)]);
    assert_eq!(code, 1);
    assert_eq!(row(&rows, path(&foreign_path))["chain"]["result"], "yes");
    assert_eq!(
        row(&rows, path(&foreign_path))["chain"]["bundle"],
        path(&other_bundle)
    );
    assert_eq!(
        row(&rows, path(&dir.join("admin.crt")))["chain"]["result"],
        "no"
    );
}

#[test]
fn a_kubelet_layout_is_read_through_the_generation_data_points_to() {
    let tmp = tempfile::tempdir().unwrap();
    let object = tmp.path().join("secrets/serving-cert");
    let ca = Ca::default();
    let current = ca.issue(&CertSpec::server(&["current.example"]));
    let stale = ca.issue(&CertSpec::server(&["stale.example"]).expired(5));
    // A stale generation left on disk (by a writer killed before its prune); only the
    // one `..data` points to is read, under the names of the visible links.
    for (generation, issued) in [
        ("..2026_01_01_00_00_00.1", &stale),
        ("..2026_02_01_00_00_00.1", &current),
    ] {
        rename_into(
            &object.join(generation).join("tls.crt"),
            issued.cert_pem.as_bytes(),
        );
        rename_into(
            &object.join(generation).join("tls.key"),
            issued.key_pem.as_bytes(),
        );
    }
    std::os::unix::fs::symlink("..2026_02_01_00_00_00.1", object.join("..data")).unwrap();
    for key in ["tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(format!("..data/{key}"), object.join(key)).unwrap();
    }
    rename_into(
        &tmp.path().join("configmaps/client-ca/ca-bundle.crt"),
        ca.cert_pem.as_bytes(),
    );

    let (code, rows, stderr) = inspect_json(&["--dir", path(tmp.path())]);
    assert_eq!(code, 0, "{stderr}{rows:#?}");
    assert_eq!(rows.len(), 2, "{rows:#?}");
    let cert = row(&rows, path(&object.join("tls.crt")));
    assert_eq!(
        cert["certificate"]["dns_names"],
        serde_json::json!(["current.example"])
    );
    assert_eq!(cert["key"]["result"], "match");
    assert_eq!(cert["key"]["source"], path(&object.join("tls.key")));
    // No bundle in the object's own directory: every bundle found is searched.
    assert_eq!(cert["chain"]["result"], "yes");
    assert_eq!(cert["chain"]["required"], false);
    assert_eq!(
        cert["chain"]["bundle"],
        path(&tmp.path().join("configmaps/client-ca/ca-bundle.crt"))
    );
}

#[test]
fn the_json_rows_are_the_table_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ca = Ca::default();
    let old = ca.issue(&CertSpec::server(&["old.example"]).expired(1));
    let good = ca.issue(&CertSpec::server(&["good.example"]));
    rename_into(
        &dir.join("ca-bundle.crt"),
        format!("{}{}", ca.cert_pem, Ca::default().cert_pem).as_bytes(),
    );
    rename_into(&dir.join("a/old.crt"), old.cert_pem.as_bytes());
    rename_into(&dir.join("a/old.key"), old.key_pem.as_bytes());
    rename_into(
        &dir.join("b/good.cert_pem"),
        format!("{}{}", good.cert_pem, good.key_pem).as_bytes(),
    );
    rename_into(&dir.join("b/junk.crt"), b"junk");

    let table = inspect(&["--dir", path(dir)]);
    let (code, rows, _) = inspect_json(&["--dir", path(dir)]);
    assert_eq!((table.code, code), (1, 1));
    let lines: Vec<&str> = table.stdout.lines().skip(1).collect();
    assert_eq!(lines.len(), rows.len(), "{}\n{rows:#?}", table.stdout);
    for (line, row) in lines.iter().zip(&rows) {
        let mut source = row["source"].as_str().unwrap().to_owned();
        if let Some(index) = row["index"].as_u64().filter(|i| *i > 0) {
            source = format!("{source}[{index}]");
        }
        assert!(
            line.starts_with(&format!("{source} ")),
            "{line:?} vs {source}"
        );
        let status = match row["status"].as_str().unwrap() {
            "problem" => problem_kinds(row)[0].to_owned(),
            other => other.to_owned(),
        };
        assert!(line.contains(&status), "{line:?} vs {status}");
    }
    // The combined file pairs with itself.
    let combined = row(&rows, path(&dir.join("b/good.cert_pem")));
    assert_eq!(
        combined["key"]["source"],
        path(&dir.join("b/good.cert_pem"))
    );
    assert_eq!(combined["key"]["result"], "match");
    // Both CAs of the bundle are listed.
    assert_eq!(rows.iter().filter(|r| r["role"] == "ca").count(), 2);
}

#[test]
fn bad_flags_exit_2_naming_the_culprit() {
    let tmp = tempfile::tempdir().unwrap();
    let nothing = inspect(&[]);
    assert_eq!(nothing.code, 2, "{}", nothing.stderr);
    let missing = tmp.path().join("missing");
    let outcome = inspect(&["--dir", path(&missing)]);
    assert_eq!(outcome.code, 2);
    assert!(
        outcome.stderr.contains(path(&missing)),
        "{}",
        outcome.stderr
    );
    let garbage = tmp.path().join("garbage.crt");
    rename_into(&garbage, b"garbage");
    let outcome = inspect(&["--dir", path(tmp.path()), "--ca-bundle", path(&garbage)]);
    assert_eq!(outcome.code, 2);
    assert!(outcome.stderr.contains(&format!(
        "--ca-bundle {}: no certificate found",
        path(&garbage)
    )));
    let outcome = inspect(&["--dir", path(tmp.path()), "--warn-within", "soon"]);
    assert_eq!(outcome.code, 2);
    // An empty directory: nothing was checked, which is not a success.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let outcome = inspect(&["--dir", path(&empty)]);
    assert_eq!(outcome.code, 1);
    assert!(
        outcome.stderr.contains("no certificate found"),
        "{}",
        outcome.stderr
    );
}

// The API-side scenarios run against `mini-apiserver` and the real kube-apiserver.
both_backends!(
    a_namespace_is_inspected_through_the_api_as_its_synced_files_are,
    a_refused_connection_exits_1_with_the_reason,
);

async fn a_namespace_is_inspected_through_the_api_as_its_synced_files_are(backend: Backend) {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = TestApi::start_default(backend, tmp.path()).await;
    let client = api.recovery_client();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(client, NS);
    let ca = Ca::default();
    let good = ca.issue(&month(&["localhost", "127.0.0.1"]));
    let old = ca.issue(&CertSpec::server(&["old.example"]).expired(2));
    for (name, issued) in [("good-serving", &good), ("old-serving", &old)] {
        secrets
            .create(
                &PostParams::default(),
                &tls_secret(name, &issued.cert_pem, &issued.key_pem),
            )
            .await
            .unwrap();
    }
    config_maps
        .create(
            &PostParams::default(),
            &bundle_config_map("serving-ca", &ca.cert_pem),
        )
        .await
        .unwrap();
    // A Secret that holds no certificate material is not a row.
    let token = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("some-token".to_owned()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "token".to_owned(),
            k8s_openapi::ByteString(b"abc".to_vec()),
        )])),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &token)
        .await
        .unwrap();

    let recovery_ca = api.dir.join("recovery-ca.crt");
    let token_file = api.dir.join("token");
    let server = api.url();
    let connection = [
        "--server",
        server.as_str(),
        "--tls-server-name-override",
        "localhost-recovery",
        "--ca-file",
        path(&recovery_ca),
        "--token-file",
        path(&token_file),
        "--namespace",
        NS,
    ];
    // The children run while this runtime's other worker stays free.
    let (code, api_rows, stderr) = tokio::task::block_in_place(|| inspect_json(&connection));
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(api_rows.len(), 3, "{api_rows:#?}");
    let good_row = row(&api_rows, "secrets/good-serving/tls.crt");
    assert_eq!(good_row["object"]["kind"], "Secret");
    assert_eq!(good_row["object"]["namespace"], NS);
    assert_eq!(good_row["object"]["name"], "good-serving");
    assert_eq!(good_row["object"]["key"], "tls.crt");
    assert!(good_row["file"].is_null());
    assert_eq!(good_row["key"]["result"], "match");
    assert_eq!(good_row["key"]["source"], "secrets/good-serving/tls.key");
    assert_eq!(good_row["chain"]["result"], "yes");
    assert_eq!(
        good_row["chain"]["bundle"],
        "configmaps/serving-ca/ca-bundle.crt"
    );
    assert_eq!(good_row["certificate"]["serial"], good.serial.as_str());
    let old_row = row(&api_rows, "secrets/old-serving/tls.crt");
    assert_eq!(problem_kinds(old_row), ["expired"]);
    assert!(
        stderr.contains("secrets/old-serving/tls.crt: expired at"),
        "{stderr}"
    );
    assert_eq!(
        row(&api_rows, "configmaps/serving-ca/ca-bundle.crt")["role"],
        "ca"
    );

    // The table, too.
    let table = tokio::task::block_in_place(|| inspect(&connection));
    assert_eq!(table.code, 1);
    assert!(line(&table.stdout, "secrets/good-serving/tls.crt").ends_with("ok"));

    // The same objects synced to disk read the same: same certificates, same verdicts.
    let dest = tmp.path().join("resources");
    let _syncer = Syncer::start(
        &api,
        &dest,
        &[
            "--secrets",
            "good-serving,old-serving",
            "--configmaps",
            "serving-ca",
        ],
    );
    e2e::wait_until("the synced files", Duration::from_secs(20), || async {
        [
            "secrets/good-serving/tls.key",
            "secrets/old-serving/tls.key",
            "configmaps/serving-ca/ca-bundle.crt",
        ]
        .iter()
        .all(|f| dest.join(f).exists())
    })
    .await;
    let (code, dir_rows, _) = tokio::task::block_in_place(|| inspect_json(&["--dir", path(&dest)]));
    assert_eq!(code, 1);
    assert_eq!(dir_rows.len(), api_rows.len());
    for api_row in &api_rows {
        let source = api_row["source"].as_str().unwrap();
        let dir_row = row(&dir_rows, path(&dest.join(source)));
        assert_eq!(
            dir_row["certificate"]["sha256"],
            api_row["certificate"]["sha256"]
        );
        assert_eq!(dir_row["status"], api_row["status"]);
        assert_eq!(dir_row["key"]["result"], api_row["key"]["result"]);
        assert_eq!(dir_row["chain"]["result"], api_row["chain"]["result"]);
    }
}

async fn a_refused_connection_exits_1_with_the_reason(backend: Backend) {
    let tmp = tempfile::tempdir().unwrap();
    let api = TestApi::start_default(backend, tmp.path()).await;
    // The default serving CA does not sign the `localhost-recovery` certificate.
    let wrong_ca = api.dir.join("serving-ca.crt");
    let token_file = api.dir.join("token");
    let server = api.url();
    let outcome = tokio::task::block_in_place(|| {
        inspect(&[
            "--server",
            &server,
            "--tls-server-name-override",
            "localhost-recovery",
            "--ca-file",
            path(&wrong_ca),
            "--token-file",
            path(&token_file),
            "--namespace",
            NS,
        ])
    });
    assert_eq!(outcome.code, 1, "{}", outcome.stderr);
    assert!(
        outcome.stderr.contains("localhost-recovery"),
        "{}",
        outcome.stderr
    );
    assert!(outcome.stdout.is_empty());
}
