//! The real `kubectl` against mini-apiserver: it sends protobuf bodies for built-in
//! types, uses short names and field selectors. Skipped with a message when `kubectl` is not on
//! `PATH`.

use std::path::Path;
use std::process::Command;

use e2e::ApiServer;

/// Writes a kubeconfig for the admin token, the default certificate's CA, namespace `ns`.
fn kubeconfig(server: &ApiServer, dir: &Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    let config = format!(
        "apiVersion: v1\nkind: Config\n\
         clusters: [{{name: m, cluster: {{server: \"{}\", certificate-authority: \"{}\"}}}}]\n\
         users: [{{name: u, user: {{token: \"{}\"}}}}]\n\
         contexts: [{{name: c, context: {{cluster: m, user: u, namespace: ns}}}}]\n\
         current-context: c\n",
        server.url(),
        dir.join("serving-ca.crt").display(),
        server.token
    );
    std::fs::write(&path, config).unwrap();
    path
}

/// Runs kubectl; returns stdout, panics with stderr on failure.
fn kubectl(config: &Path, args: &[&str]) -> String {
    let output = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(config)
        .args(["--request-timeout", "30s"])
        .args(args)
        .output()
        .expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn kubectl_creates_secrets_and_config_maps_and_reads_them_back() {
    if Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: kubectl is not on PATH");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // cert-syncer (`syncer-token`) may only read: `auth can-i` must say so.
    let server = ApiServer::start(tmp.path(), &["--read-only-user", "cert-syncer"]);
    let config = kubeconfig(&server, tmp.path());
    let dir = tmp.path();
    let (crt, key) = (dir.join("serving.crt"), dir.join("serving.key"));

    // Protobuf bodies (kubectl's typed clients).
    kubectl(
        &config,
        &["create", "secret", "generic", "plain", "--from-literal=a=b"],
    );
    kubectl(
        &config,
        &[
            "create",
            "secret",
            "tls",
            "serving",
            "--cert",
            crt.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ],
    );
    kubectl(
        &config,
        &["create", "configmap", "settings", "--from-literal=k=v"],
    );

    assert_eq!(
        kubectl(
            &config,
            &["get", "secret", "plain", "-o", "jsonpath={.data.a}"]
        ),
        "Yg=="
    );
    assert_eq!(
        kubectl(
            &config,
            &["get", "secret", "serving", "-o", "jsonpath={.type}"]
        ),
        "kubernetes.io/tls"
    );
    let served_crt = kubectl(
        &config,
        &[
            "get",
            "secret",
            "serving",
            "-o",
            "go-template={{index .data \"tls.crt\" | base64decode}}",
        ],
    );
    assert_eq!(served_crt, std::fs::read_to_string(&crt).unwrap());
    // Short name and default columns.
    let listed = kubectl(&config, &["get", "cm"]);
    assert!(listed.contains("settings"), "{listed}");
    // describe lists the object's Events with an involvedObject field selector.
    let described = kubectl(&config, &["describe", "configmap", "settings"]);
    assert!(
        described.contains("Name:") && described.contains("settings"),
        "{described}"
    );
    // Set-based label selectors.
    kubectl(&config, &["label", "configmap", "settings", "tier=cp"]);
    let selected = kubectl(
        &config,
        &["get", "cm", "-l", "tier in (cp,dp)", "-o", "name"],
    );
    assert_eq!(selected.trim(), "configmap/settings");
    let none = kubectl(
        &config,
        &["get", "cm", "-l", "tier notin (cp)", "-o", "name"],
    );
    assert_eq!(none.trim(), "");
    kubectl(&config, &["delete", "secret", "plain"]);
    let left = kubectl(&config, &["get", "secrets", "-o", "name"]);
    assert_eq!(left.trim(), "secret/serving");
    manifests_with_validation_dry_runs_and_diff(&config, dir);
    auth_can_i(&config);
}

/// `kubectl auth can-i` (SelfSubjectAccessReview, protobuf body) and `--list`
/// (SelfSubjectRulesReview), for the admin and for a read-only user.
fn auth_can_i(config: &Path) {
    assert_eq!(
        kubectl(config, &["auth", "can-i", "delete", "secrets"]).trim(),
        "yes"
    );
    let read_only = |args: &[&str]| {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(config)
            .args(["--token", "syncer-token", "auth", "can-i"])
            .args(args)
            .output()
            .unwrap()
    };
    let denied = read_only(&["create", "secrets"]);
    assert_eq!(String::from_utf8_lossy(&denied.stdout).trim(), "no");
    assert_eq!(denied.status.code(), Some(1));
    let allowed = read_only(&["watch", "leases.coordination.k8s.io", "-n", "kube-system"]);
    assert_eq!(String::from_utf8_lossy(&allowed.stdout).trim(), "yes");
    let listed = read_only(&["--list"]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("[get list watch]"), "{listed}");
}

fn write_config_map(path: &Path, value: &str) {
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: fromfile, labels: {{a: b}}}}\n\
             data: {{k: {value}}}\n"
        ),
    )
    .unwrap();
}

fn data_k(config: &Path) -> String {
    kubectl(
        config,
        &["get", "cm", "fromfile", "-o", "jsonpath={.data.k}"],
    )
}

/// `create -f`, `apply -f` (client- and server-side) with kubectl's default (strict)
/// validation, which needs the OpenAPI v3 documents; `diff` and `--dry-run=server` change
/// nothing; `events --for`.
fn manifests_with_validation_dry_runs_and_diff(config: &Path, dir: &Path) {
    let manifest = dir.join("cm.yaml");
    let file = manifest.to_str().unwrap();
    write_config_map(&manifest, "v");
    kubectl(config, &["create", "-f", file]);
    kubectl(config, &["apply", "-f", file]);
    write_config_map(&manifest, "w");
    let diff = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(config)
        .args(["diff", "-f", file])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&diff.stdout);
    // Exit code 1: differences found (>1 would be an error).
    assert_eq!(
        diff.status.code(),
        Some(1),
        "{shown}{}",
        String::from_utf8_lossy(&diff.stderr)
    );
    assert!(
        shown.contains("-  k: v") && shown.contains("+  k: w"),
        "{shown}"
    );
    assert_eq!(data_k(config), "v", "kubectl diff changed the object");
    kubectl(config, &["apply", "-f", file, "--dry-run=server"]);
    assert_eq!(data_k(config), "v", "apply --dry-run=server persisted");
    kubectl(
        config,
        &[
            "create",
            "configmap",
            "dry",
            "--from-literal=a=b",
            "--dry-run=server",
        ],
    );
    kubectl(config, &["delete", "cm", "fromfile", "--dry-run=server"]);
    let names = kubectl(config, &["get", "cm", "-o", "name"]);
    assert!(
        names.contains("configmap/fromfile") && !names.contains("configmap/dry"),
        "{names}"
    );
    kubectl(config, &["apply", "-f", file]);
    assert_eq!(data_k(config), "w");
    write_config_map(&manifest, "x");
    kubectl(
        config,
        &["apply", "--server-side", "--force-conflicts", "-f", file],
    );
    assert_eq!(data_k(config), "x");
    kubectl(config, &["replace", "-f", file]);
    // kubectl's default validation is the server's (`fieldValidation=Strict`): a typo fails.
    let typo = dir.join("typo.yaml");
    std::fs::write(
        &typo,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: typo}\ndatta: {k: v}\n",
    )
    .unwrap();
    let refused = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(config)
        .args(["create", "-f", typo.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("unknown field \"datta\""),
        "{stderr}"
    );
    let explained = kubectl(config, &["explain", "configmap.data"]);
    assert!(explained.contains("map[string]string"), "{explained}");

    let event = dir.join("event.yaml");
    std::fs::write(
        &event,
        "apiVersion: v1\nkind: Event\nmetadata: {name: fromfile.1}\n\
         involvedObject: {apiVersion: v1, kind: ConfigMap, name: fromfile, namespace: ns}\n\
         reason: Rotated\nmessage: certificate rotated\ntype: Normal\n",
    )
    .unwrap();
    kubectl(config, &["create", "-f", event.to_str().unwrap()]);
    let events = kubectl(config, &["events", "--for", "configmap/fromfile"]);
    assert!(
        events.contains("Rotated") && events.contains("certificate rotated"),
        "{events}"
    );
    let none = kubectl(config, &["events", "--for", "configmap/settings"]);
    assert!(!none.contains("Rotated"), "{none}");
}
