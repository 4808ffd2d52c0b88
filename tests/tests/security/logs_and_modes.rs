//! Secrets never reach logs, and every write path leaves the modes it promises: the whole
//! localhost flow (mini-apiserver, `cert-syncer sync` and `cert-syncer regenerate` at debug level)
//! runs, then every line they printed is searched for the token and for any private key.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use e2e::apiserver::ADMIN_TOKEN;
use e2e::syncer::{NS, bundle_config_map, regenerate_command, tls_secret};
use e2e::{ApiServer, Ca, CertSpec, Syncer, SyncerSpec, install_crypto_provider};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, PostParams};
use testkit::files::rename_into;
use time::OffsetDateTime;

/// The bound on each wait for the processes to act (a limit, not a delay).
const WITHIN: Duration = Duration::from_secs(20);

const CONFIG: &str = r#"
namespace: openshift-kube-apiserver
signers:
  - { name: serving-signer, validity: 30d, refresh: 15d }
bundles:
  - { name: serving-ca, signers: [serving-signer] }
targets:
  - name: serving-cert
    signer: serving-signer
    serving: { hostnames: [localhost] }
    validity: 10d
    refresh: 5d
"#;

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o777
}

/// Every file and directory under `dir` (not following symlinks) with its mode.
fn walk(dir: &Path, out: &mut Vec<(std::path::PathBuf, u32, bool)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = std::fs::symlink_metadata(entry.path()).unwrap();
        if meta.file_type().is_symlink() {
            continue;
        }
        out.push((
            entry.path(),
            meta.permissions().mode() & 0o777,
            meta.is_dir(),
        ));
        if meta.is_dir() {
            walk(&entry.path(), out);
        }
    }
}

/// 32-character pieces of the base64 body of a PEM private key: any one of them in a log means
/// key bytes leaked, whatever the framing.
fn key_fragments(pem: &str) -> BTreeSet<String> {
    pem.lines()
        .filter(|l| !l.starts_with("-----"))
        .flat_map(|line| {
            line.as_bytes()
                .chunks(32)
                .filter(|c| c.len() == 32)
                .map(|c| String::from_utf8(c.to_vec()).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_or_key_reaches_a_log_and_every_write_has_its_mode() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = ApiServer::start(tmp.path(), &[]);
    let client = api.client_with_token(ADMIN_TOKEN);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(client, NS);

    // An expired signer and leaf, so regenerate generates keys (and could log them).
    let now = OffsetDateTime::now_utc();
    let ca = Ca::with_validity(
        now - time::Duration::days(40),
        now - time::Duration::days(1),
    );
    let leaf = ca.issue(&CertSpec::server(&["localhost"]).valid(
        now - time::Duration::days(20),
        now - time::Duration::days(2),
    ));
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("serving-signer", &ca.cert_pem, &ca.key_pem()),
        )
        .await
        .unwrap();
    secrets
        .create(
            &PostParams::default(),
            &tls_secret("serving-cert", &leaf.cert_pem, &leaf.key_pem),
        )
        .await
        .unwrap();
    config_maps
        .create(
            &PostParams::default(),
            &bundle_config_map("serving-ca", &ca.cert_pem),
        )
        .await
        .unwrap();

    let dest = tmp.path().join("resources");
    let host_file = tmp.path().join("host/serving-ca.crt");
    std::fs::create_dir_all(host_file.parent().unwrap()).unwrap();
    let mut spec = SyncerSpec::new(
        &api,
        &dest,
        &[
            "--secrets",
            "serving-cert,serving-signer",
            "--configmaps",
            "serving-ca",
            "--file",
            &format!("configmap/serving-ca/ca-bundle.crt={}", host_file.display()),
        ],
    );
    spec.extra.push("--log-format".into());
    spec.extra.push("json".into());
    let mut command = spec.command();
    command.env("RUST_LOG", "debug");
    let syncer = Syncer {
        process: e2e::ChildProcess::start(command),
    };
    let config = tmp.path().join("rotation.yaml");
    rename_into(&config, CONFIG.as_bytes());
    let output = regenerate_command(&api, &config, &["--once"])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    assert!(output.status.success());
    let regenerated = secrets.get("serving-cert").await.unwrap();
    let new_key = String::from_utf8(regenerated.data.unwrap()["tls.key"].0.clone()).unwrap();
    let new_signer = secrets.get("serving-signer").await.unwrap();
    let new_signer_key = String::from_utf8(new_signer.data.unwrap()["tls.key"].0.clone()).unwrap();
    e2e::wait_until("the regenerated key on disk", WITHIN, || async {
        std::fs::read_to_string(dest.join("secrets/serving-cert/tls.key"))
            .ok()
            .as_deref()
            == Some(new_key.as_str())
    })
    .await;
    e2e::wait_until("the host file", WITHIN, || async { host_file.exists() }).await;

    // Logs: the token and every key, old and new, must be absent.
    let logs = [
        ("mini-apiserver", api.server.stderr_text()),
        ("cert-syncer sync", syncer.process.stderr_text()),
        (
            "cert-syncer regenerate",
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ),
        (
            "cert-syncer regenerate stdout",
            String::from_utf8_lossy(&output.stdout).into_owned(),
        ),
    ];
    let mut fragments = BTreeSet::new();
    for key in [&ca.key_pem(), &leaf.key_pem, &new_key, &new_signer_key] {
        fragments.extend(key_fragments(key));
    }
    assert!(fragments.len() > 10);
    let mut lines = 0;
    for (who, log) in &logs {
        lines += log.lines().count();
        assert!(!log.contains(ADMIN_TOKEN), "{who} logged the token");
        assert!(
            !log.contains("PRIVATE KEY"),
            "{who} logged a PEM private key"
        );
        for fragment in &fragments {
            assert!(
                !log.contains(fragment.as_str()),
                "{who} logged private key bytes"
            );
        }
    }
    assert!(lines > 20, "the logs are not empty ({lines} lines)");

    // Modes: secrets 0600, configmaps 0644, directories 0755, the host file 0644.
    let mut entries = Vec::new();
    walk(&dest, &mut entries);
    assert!(entries.len() > 8);
    for (path, mode, is_dir) in &entries {
        let text = path.display().to_string();
        let want = if *is_dir {
            0o755
        } else if text.contains("/secrets/") {
            0o600
        } else {
            0o644
        };
        assert_eq!(*mode, want, "{text}: {mode:o}");
    }
    assert_eq!(mode(&host_file), 0o644);
}
