//! `regenerate`'s start when kube-apiserver cannot be reached as configured (issue 35 item 7):
//! a CA file that does not trust the apiserver's certificate, and a server name that does not
//! resolve, are said in the log (once) and on `/readyz`, in the words `sync` and `inspect` use
//! ("… is not trusted by CA_FILE …"), instead of being waited for in silence as "not up yet";
//! a CA file fixed in place is taken at once (reload-lib follows it) and the pass runs.
//!
//! The first test needs the real kube-apiserver (skips, passing, without it); the second needs
//! no apiserver at all.

use std::process::Command;
use std::time::Duration;

use e2e::{ApiEndpoint, Backend, Ca, ChildProcess, bin_path, metric_sum};
use testkit::files::rename_into;

use super::fixture::{fixture, metrics_of};

mod a_ca_file_that_does_not_trust_the_apiserver_is_said_once_and_a_fixed_one_heals {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real() {
        e2e::require_real_apiserver!();
        super::a_ca_file_that_does_not_trust_the_apiserver_is_said_once_and_a_fixed_one_heals()
            .await;
    }
}

/// `regenerate` against `server` with `ca_file` (and the config, token of `dir`).
fn regenerate(server: &str, ca_file: &std::path::Path, dir: &std::path::Path) -> ChildProcess {
    let mut command = Command::new(bin_path("cert-syncer"));
    command
        .arg("regenerate")
        .args(["--server", server])
        .args(["--tls-server-name-override", "localhost-recovery"])
        .arg("--ca-file")
        .arg(ca_file)
        .arg("--token-file")
        .arg(dir.join("token"))
        .arg("--config")
        .arg(dir.join("rotation.yaml"))
        .args(["--metrics-listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info");
    ChildProcess::start(command)
}

async fn readyz_says(process: &ChildProcess, what: &str) -> String {
    let readyz = || e2e::plain_http_get(&process.addr.to_string(), "/readyz");
    e2e::wait_until(what, Duration::from_secs(15), || async {
        let (code, body) = readyz();
        code == 503 && body.contains(what)
    })
    .await;
    readyz().1
}

async fn a_ca_file_that_does_not_trust_the_apiserver_is_said_once_and_a_fixed_one_heals() {
    let f = fixture(Backend::Real).await;
    // The fixture's directory: its token and config; a CA file of our own beside them.
    let dir = f.api.dir().to_owned();
    assert_eq!(f.config, dir.join("rotation.yaml"));
    let ca_file = dir.join("wrong-recovery-ca.crt");
    rename_into(
        &ca_file,
        Ca::new("not the apiserver's CA").cert_pem.as_bytes(),
    );
    let process = regenerate(&f.api.url(), &ca_file, &dir);

    let said = format!("is not trusted by {}", ca_file.display());
    let body = readyz_says(&process, &said).await;
    assert!(body.starts_with("apiserver: TLS to "), "{body}");
    // Past one retry (every 10 s, or when the CA file changes): still said once.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let log = process.stderr_text();
    assert_eq!(log.matches(&said).count(), 1, "said once:\n{log}");
    assert!(
        !log.contains("does not answer yet") && log.contains("cannot be reached as configured"),
        "a certificate that is not trusted is not \"not up yet\":\n{log}"
    );

    // Fixed in place: taken at once, and the pass runs.
    rename_into(&ca_file, f.api.recovery_ca().as_bytes());
    e2e::wait_until("the first pass", Duration::from_secs(10), || async {
        metric_sum(
            &metrics_of(&process),
            "cert_regenerate_regenerations_total",
            &[],
        ) >= 3.0
    })
    .await;
    e2e::wait_until("ready", Duration::from_secs(10), || async {
        e2e::plain_http_get(&process.addr.to_string(), "/readyz").0 == 200
    })
    .await;
}

/// No apiserver needed: a name that does not resolve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_name_that_does_not_resolve_is_said_on_readyz() {
    e2e::install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("token"), "not-a-real-token").unwrap();
    std::fs::set_permissions(
        dir.join("token"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    rename_into(
        &dir.join("rotation.yaml"),
        super::fixture::CONFIG.as_bytes(),
    );
    let ca_file = dir.join("ca.crt");
    rename_into(&ca_file, Ca::new("some CA").cert_pem.as_bytes());
    let process = regenerate("https://cert-reload-test.invalid:6443", &ca_file, dir);
    let body = readyz_says(
        &process,
        "cannot resolve the host of https://cert-reload-test.invalid:6443",
    )
    .await;
    assert!(body.starts_with("apiserver: "), "{body}");
}
