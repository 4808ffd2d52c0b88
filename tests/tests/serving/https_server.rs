//! `https-server` flags: mTLS with `/whoami`, the `--static` baseline, metrics, bad input.

use std::process::Command;
use std::sync::Arc;

use e2e::{Ca, Server, bin, https_get};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

fn write(dir: &std::path::Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path.to_str().unwrap().to_owned()
}

fn with_identity(ca: &Ca, cert: &str, key: &str) -> Arc<rustls::ClientConfig> {
    let mut config = (*ca.client_config()).clone();
    let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.cert_pem.as_bytes()).unwrap())
        .unwrap();
    config = rustls::ClientConfig::builder_with_provider(config.crypto_provider().clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    Arc::new(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whoami_returns_the_client_certificate_subject_in_reloading_and_static_modes() {
    let ca = Ca::default();
    let tmp = tempfile::tempdir().unwrap();
    let (cert, key, _) = ca.localhost_leaf();
    let cert = write(tmp.path(), "tls.crt", &cert);
    let key = write(tmp.path(), "tls.key", &key);
    let client_ca = write(tmp.path(), "client-ca.crt", &ca.cert_pem);
    let (client_cert, client_key) = ca.client_leaf("alice");
    let alice = with_identity(&ca, &client_cert, &client_key);

    for extra in [&[][..], &["--static"][..]] {
        let mut command = Command::new(bin("https-server"));
        command
            .args([
                "--listen",
                "127.0.0.1:0",
                "--cert",
                &cert,
                "--key",
                &key,
                "--client-ca",
                &client_ca,
                "--client-auth",
                "optional",
            ])
            .args(extra);
        let server = Server::start(command);
        let (status, body) = https_get(server.addr, "localhost", alice.clone(), "/whoami")
            .await
            .unwrap();
        assert_eq!((status, body.trim()), (200, "CN=alice"), "{extra:?}");
        let (status, _) = https_get(server.addr, "localhost", ca.client_config(), "/whoami")
            .await
            .unwrap();
        assert_eq!(status, 401, "{extra:?}: anonymous client");
        let (status, body) = https_get(server.addr, "localhost", ca.client_config(), "/")
            .await
            .unwrap();
        assert_eq!((status, body.as_str()), (200, "ok\n"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_served_and_bad_start_up_material_is_refused_with_the_file_named() {
    let ca = Ca::default();
    let tmp = tempfile::tempdir().unwrap();
    let (cert, key, _) = ca.localhost_leaf();
    let cert_path = write(tmp.path(), "tls.crt", &cert);
    let key_path = write(tmp.path(), "tls.key", &key);
    let mut command = Command::new(bin("https-server"));
    command.args([
        "--listen",
        "127.0.0.1:0",
        "--cert",
        &cert_path,
        "--key",
        &key_path,
        "--metrics-listen",
        "127.0.0.1:0",
    ]);
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines: Vec<String> = std::io::BufRead::lines(std::io::BufReader::new(stdout))
        .take(2)
        .map(Result::unwrap)
        .collect();
    let metrics_addr = lines
        .iter()
        .find_map(|l| l.strip_prefix("metrics on "))
        .expect("metrics address");
    let body = e2e::plain_http_get(metrics_addr, "/metrics").1;
    assert!(
        body.contains(r#"reload_reloads_total{set="https-server",result="ok"} 1"#),
        "{body}"
    );
    assert!(
        body.contains("reload_certificate_not_after_timestamp_seconds"),
        "{body}"
    );
    let _ = child.kill();
    let _ = child.wait();

    // A key that does not match: exit 1 and the culprit named.
    let (_, other_key, _) = ca.localhost_leaf();
    let other_key_path = write(tmp.path(), "other.key", &other_key);
    let output = Command::new(bin("https-server"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--cert",
            &cert_path,
            "--key",
            &other_key_path,
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&cert_path) && stderr.contains("does not match"),
        "{stderr}"
    );
    // A missing flag: exit 2 (usage).
    let output = Command::new(bin("https-server"))
        .args(["--cert", &cert_path])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}

/// SIGTERM while a client holds a connection in its TLS handshake (connected, no ClientHello
/// sent, as a stalled or slow client does): the server drops that connection and exits at once,
/// instead of holding the drain until the 10 s handshake timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_stalled_handshake_exits_at_once() {
    let ca = Ca::default();
    let tmp = tempfile::tempdir().unwrap();
    let (cert, key, _) = ca.localhost_leaf();
    let cert = write(tmp.path(), "tls.crt", &cert);
    let key = write(tmp.path(), "tls.key", &key);
    for extra in [&[][..], &["--static"][..]] {
        let mut command = Command::new(bin("https-server"));
        // One serving thread: one listener, connections accepted in the order they came.
        command
            .args(["--listen", "127.0.0.1:0", "--cert", &cert, "--key", &key])
            .args(["--workers", "1"])
            .args(extra);
        let mut server = Server::start(command);
        let stalled = std::net::TcpStream::connect(server.addr).unwrap();
        // A request on a later connection answered: the stalled one was accepted before it and
        // waits in its handshake.
        let (status, _) = https_get(server.addr, "localhost", ca.client_config(), "/")
            .await
            .unwrap();
        assert_eq!(status, 200);
        let started = std::time::Instant::now();
        let exited = server.terminate(std::time::Duration::from_secs(5));
        assert!(
            exited.is_some_and(|status| status.success()),
            "{extra:?}: not exited cleanly within 5 s of SIGTERM ({exited:?}, {:?})",
            started.elapsed()
        );
        drop(stalled);
    }
}
