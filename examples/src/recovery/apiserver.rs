//! The apiserver of the demo: `mini-apiserver` on the resource directory's files, or etcd and a
//! real kube-apiserver on the same files; and requests to it over the recovery connection.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use testkit::process::Child as Proc;

use super::names::{NAMESPACE, OPERATOR_NAMESPACE};
use super::timeline::Timeline;

/// `mini-apiserver` on the resource directory's files, seeded with `seed/objects.json`.
pub(super) fn start_mini(
    bin_dir: &Path,
    dir: &Path,
    serving_dir: &Path,
    recovery_dir: &Path,
    seed: &Path,
    timeline: &Timeline,
) -> anyhow::Result<(Vec<Proc>, SocketAddr)> {
    let mut apiserver_command = Command::new(bin_dir.join("mini-apiserver"));
    apiserver_command
        .args(["--listen", "127.0.0.1:0", "--cert"])
        .arg(serving_dir.join("tls.crt"))
        .arg("--key")
        .arg(serving_dir.join("tls.key"))
        .arg("--sni")
        .arg(format!(
            "localhost-recovery={},{}",
            recovery_dir.join("tls.crt").display(),
            recovery_dir.join("tls.key").display()
        ))
        .arg("--token-auth-file")
        .arg(dir.join("tokens.csv"))
        .arg("--seed-dir")
        .arg(seed);
    let reloads = timeline.clone();
    let loads = std::sync::atomic::AtomicUsize::new(0);
    let mut apiserver = Proc::spawn_logging("mini-apiserver", apiserver_command, move |line| {
        if line.contains("now serving") && line.contains("localhost-serving-cert-certkey") {
            // The first load is the start-up; the next one is the reload after the sync.
            if loads.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
                reloads.mark("mini-apiserver: loaded the expired serving certificate");
            } else {
                reloads.mark_once("mini-apiserver: reloaded the new serving certificate");
            }
        }
    })
    .map_err(anyhow::Error::msg)?;
    let addr = apiserver
        .wait_listening(Duration::from_secs(10))
        .map_err(anyhow::Error::msg)?;
    timeline.mark(&format!("mini-apiserver listening on {addr}"));
    Ok((vec![apiserver], addr))
}

/// etcd and a real kube-apiserver that serve the expired pair for `localhost`
/// (`--tls-sni-cert-key`, from the resource directory) and the recovery pair for
/// `localhost-recovery`, read `--client-ca-file` from the synced bundle, and hold `objects`
/// (created through the API once it is ready). Its certificate files are reloaded by its own
/// file watches, so it is the consumer of what `sync` writes.
#[allow(clippy::too_many_arguments)]
pub(super) fn start_real(
    assets: &Path,
    dir: &Path,
    serving_dir: &Path,
    recovery_dir: &Path,
    bundle_file: &Path,
    objects: &serde_json::Value,
    token: &str,
    recovery_ca: &str,
    timeline: &Timeline,
) -> anyhow::Result<(Vec<Proc>, SocketAddr)> {
    let [etcd_port, peer_port, port] = testkit::envtest::free_ports::<3>();
    let etcd = Proc::spawn_logging(
        "etcd",
        testkit::envtest::etcd_command(assets, &dir.join("etcd"), etcd_port, peer_port),
        |_| {},
    )
    .map_err(anyhow::Error::msg)?;
    // The service-account token signer kube-apiserver insists on.
    let (sa_key, sa_pub) = testkit::pki::key_pair_pem(testkit::pki::KeyKind::EcdsaP256);
    reload_lib::fs::write_file_atomic(&dir.join("sa.key"), sa_key.as_bytes(), 0o600)?;
    std::fs::write(dir.join("sa.pub"), sa_pub)?;
    let serving = (serving_dir.join("tls.crt"), serving_dir.join("tls.key"));
    let files = testkit::envtest::ApiserverFiles {
        serving: serving.clone(),
        sni: vec![
            (serving.0, serving.1, "localhost".to_owned()),
            (
                recovery_dir.join("tls.crt"),
                recovery_dir.join("tls.key"),
                "localhost-recovery".to_owned(),
            ),
        ],
        client_ca: bundle_file.to_owned(),
        tokens: dir.join("tokens.csv"),
        service_account: (dir.join("sa.key"), dir.join("sa.pub")),
    };
    let command = testkit::envtest::kube_apiserver_command(assets, &files, etcd_port, port);
    let apiserver =
        Proc::spawn_logging("kube-apiserver", command, |_| {}).map_err(anyhow::Error::msg)?;
    let mut servers = vec![apiserver, etcd];
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok((200, _)) = recovery_request(addr, recovery_ca, token, "GET", "/readyz", None) {
            break;
        }
        for proc in &mut servers {
            if let Ok(Some(status)) = proc.child.try_wait() {
                bail!("{} exited ({status}):\n{}", proc.name, proc.tail(20));
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "kube-apiserver not ready within 60 s:\n{}",
                servers[0].tail(20)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    timeline.mark(&format!(
        "kube-apiserver (real, with etcd) listening on {addr}: serving the expired certificate for localhost"
    ));
    // Its objects: the namespaces, then every Secret and ConfigMap of the seed list.
    for namespace in [NAMESPACE, OPERATOR_NAMESPACE] {
        let body = serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": namespace },
        });
        create(addr, recovery_ca, token, "/api/v1/namespaces", &body)?;
    }
    for item in objects["items"].as_array().into_iter().flatten() {
        let namespace = item["metadata"]["namespace"].as_str().unwrap_or_default();
        let plural = match item["kind"].as_str() {
            Some("Secret") => "secrets",
            _ => "configmaps",
        };
        create(
            addr,
            recovery_ca,
            token,
            &format!("/api/v1/namespaces/{namespace}/{plural}"),
            item,
        )?;
    }
    Ok((servers, addr))
}

/// POSTs `body` to `path` over the recovery connection; an existing object is fine.
fn create(
    addr: SocketAddr,
    recovery_ca: &str,
    token: &str,
    path: &str,
    body: &serde_json::Value,
) -> anyhow::Result<()> {
    let (status, text) = recovery_request(addr, recovery_ca, token, "POST", path, Some(body))?;
    anyhow::ensure!(
        status == 201 || status == 409,
        "POST {path}: {status} {text}"
    );
    Ok(())
}

/// One HTTP/1.1 request over a fresh TLS connection with SNI `localhost-recovery`, trusting
/// `recovery_ca`, with the bearer `token`; returns (status, body).
pub(super) fn recovery_request(
    addr: SocketAddr,
    recovery_ca: &str,
    token: &str,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> anyhow::Result<(u16, String)> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(recovery_ca.as_bytes()) {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connection = rustls::ClientConnection::new(
        Arc::new(config),
        ServerName::try_from("localhost-recovery")?,
    )?;
    let tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    let body = body
        .map(serde_json::to_vec)
        .transpose()?
        .unwrap_or_default();
    write!(
        tls,
        "{method} {path} HTTP/1.1\r\nHost: localhost-recovery\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    tls.write_all(&body)?;
    let mut response = Vec::new();
    if let Err(err) = tls.read_to_end(&mut response)
        && response.is_empty()
    {
        return Err(err.into());
    }
    Ok(testkit::http::RawResponse::parse(&response).status_and_body())
}
