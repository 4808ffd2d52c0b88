//! The localhost recovery flow end to end, as processes: `recovery-demo` starts
//! `mini-apiserver` with an expired serving certificate and a valid `localhost-recovery` SNI
//! certificate, then `cert-syncer sync` and `cert-syncer regenerate` over the recovery
//! connection; it exits 0 only once a client trusting the synced CA bundle verifies the new
//! certificate for `localhost`. Run with `--apiserver mini` and `--apiserver real` (a real
//! kube-apiserver with etcd, which then also serves from the synced files; skipped with a
//! printed reason when there is none).

use std::process::Command;

use e2e::{Backend, bin_path, both_backends};

both_backends!(expired_serving_certificates_heal_themselves_over_localhost);

async fn expired_serving_certificates_heal_themselves_over_localhost(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(bin_path("recovery-demo"));
    match backend {
        Backend::Mini => command.args(["--apiserver", "mini"]),
        Backend::Real => command
            .args(["--apiserver", "real"])
            .env("KUBEBUILDER_ASSETS", e2e::envtest::assets().unwrap()),
    };
    let output = command
        .arg("--bin-dir")
        .arg(bin_path("cert-syncer").parent().unwrap())
        .arg("--dir")
        .arg(dir.path())
        .output()
        .expect("recovery-demo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let which = match backend {
        Backend::Mini => "apiserver: mini-apiserver",
        Backend::Real => "apiserver: real kube-apiserver",
    };
    assert!(
        stdout.contains(which),
        "says which apiserver it used:\n{stdout}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}\n{stderr}");
    assert!(
        output.status.success(),
        "recovery failed:\n{stdout}\n{stderr}"
    );

    // The steps happened, in causal order.
    let order = [
        "refused (invalid peer certificate: certificate expired",
        "regenerate: expired signer replaced",
        "regenerate: CA bundle updated",
        "regenerate: serving certificate re-issued",
        "RECOVERED",
        "localhost-recovery certificate untouched",
    ];
    let positions: Vec<usize> = order
        .iter()
        .map(|step| {
            stdout
                .find(step)
                .unwrap_or_else(|| panic!("missing step {step:?}:\n{stdout}"))
        })
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "steps out of order:\n{stdout}"
    );
    // The sync and the server log from their own processes, so their lines may land on either
    // side of the demo's own RECOVERED line; they must follow the re-issue.
    // (kube-apiserver's reload shows as the RECOVERED handshake itself.)
    let server_steps: &[&str] = match backend {
        Backend::Mini => &[
            "sync: wrote the new serving certificate",
            "mini-apiserver: reloaded the new serving certificate",
        ],
        Backend::Real => &["sync: wrote the new serving certificate"],
    };
    for step in server_steps {
        let at = stdout
            .find(step)
            .unwrap_or_else(|| panic!("missing step {step:?}:\n{stdout}"));
        assert!(positions[3] < at, "{step:?} before the re-issue:\n{stdout}");
    }
    let millis: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("recovered in "))
        .and_then(|l| l.strip_suffix(" ms"))
        .and_then(|n| n.parse().ok())
        .expect("a recovered-in line");
    eprintln!("recovery flow: start -> recovered in {millis} ms (debug build)");
    // The resource dir now holds the new certificate, synced through the `..data` layout.
    let synced = dir
        .path()
        .join("resources/secrets/localhost-serving-cert-certkey/..data");
    assert!(
        std::fs::symlink_metadata(synced)
            .unwrap()
            .file_type()
            .is_symlink()
    );
}
