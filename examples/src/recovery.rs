//! The local recovery demo behind `recovery-demo`: a control plane whose serving signer and
//! serving certificate expired while it slept heals itself over localhost.
//!
//! 1. A PKI like the kube-apiserver's: the `localhost-serving-signer` and the serving
//!    certificate it issued are expired; the `localhost-recovery` signer and certificate are
//!    valid for ten years. The installer's resource directory holds the expired serving files.
//! 2. `mini-apiserver` plays the kube-apiserver: it serves the expired certificate by default and
//!    the `localhost-recovery` certificate by SNI, both from the resource directory, through
//!    reload-lib. Or ([`Apiserver::Real`]) a real kube-apiserver with etcd does, from the same
//!    files (`--tls-sni-cert-key`, `--client-ca-file` on the synced bundle), reloading them
//!    through its own file watches (`recovery/apiserver.rs`; the command lines are the test kit's, as in
//!    the e2e harness).
//! 3. `cert-syncer sync` and `cert-syncer regenerate` connect to `https://127.0.0.1:PORT` with
//!    SNI `localhost-recovery`, the recovery CA and a token.
//! 4. `regenerate` (expired-only) replaces the expired signer, updates the CA bundle and issues
//!    a new serving certificate; `sync` writes them to the resource directory; the apiserver
//!    reloads; a client that trusts only the synced CA bundle connects to `localhost`.
//!
//! Every step is printed on a timeline with its time since start.

mod apiserver;
mod names;
mod timeline;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use base64::Engine;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use testkit::pki::{Ca, CertSpec};
use testkit::process::Child as Proc;
use time::OffsetDateTime;

use apiserver::{start_mini, start_real};
pub use names::{NAMESPACE, OPERATOR_NAMESPACE};
use timeline::Timeline;

/// The rotation config the demo gives `cert-syncer regenerate` (also in
/// `manifests/regenerate-config.yaml` form for the static pod).
pub const ROTATION_CONFIG: &str = r#"namespace: openshift-kube-apiserver
signers:
  - { name: localhost-serving-signer, namespace: openshift-kube-apiserver-operator, validity: 10y, refresh: 8y }
  - { name: localhost-recovery-serving-signer, namespace: openshift-kube-apiserver-operator, validity: 10y, refresh: 8y }
bundles:
  - { name: localhost-serving-ca, signers: [localhost-serving-signer] }
  - { name: localhost-recovery-serving-ca, signers: [localhost-recovery-serving-signer] }
targets:
  - name: localhost-serving-cert-certkey
    signer: localhost-serving-signer
    serving: { hostnames: [localhost, 127.0.0.1] }
    validity: 30d
    refresh: 15d
  - name: localhost-recovery-serving-certkey
    signer: localhost-recovery-serving-signer
    serving: { hostnames: [localhost-recovery] }
    validity: 10y
    refresh: 8y
"#;

/// What the demo needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Directory holding `mini-apiserver` and `cert-syncer`.
    pub bin_dir: PathBuf,
    /// Work directory (default: a fresh one under the system temp dir, removed at the end).
    pub dir: Option<PathBuf>,
    /// Keep the work directory.
    pub keep: bool,
    /// Give up after this long.
    pub timeout: Duration,
    /// Which apiserver plays the control plane.
    pub apiserver: Apiserver,
}

/// Which apiserver the demo runs: ours, or a real kube-apiserver with etcd (the envtest
/// convention: a directory holding `kube-apiserver` and `etcd`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Apiserver {
    /// `mini-apiserver` from the bin dir.
    Mini,
    /// kube-apiserver and etcd from this directory.
    Real(PathBuf),
}

/// The real kube-apiserver's directory, if there is one: `KUBEBUILDER_ASSETS`, else what
/// `../shared/envtest/setup` prints (looked for beside the current directory and beside the
/// workspace this was built from).
pub fn find_envtest_assets() -> Option<PathBuf> {
    testkit::envtest::find_assets().ok()
}

/// The outcome of a successful run.
#[derive(Debug, Clone)]
pub struct Recovered {
    /// From the start of the processes to the first verified handshake with the new certificate.
    pub elapsed: Duration,
    /// Serial of the certificate served after recovery.
    pub serial: String,
    /// Every step of the timeline, with its time since the start.
    pub milestones: Vec<crate::milestones::Milestone>,
}

/// A key pair and its certificate, PEM.
struct Pair {
    cert: String,
    key: String,
}

/// A signer (a root CA) named `cn`, valid in the window, and its certificate and key as a pair.
fn signer(cn: &str, not_before: OffsetDateTime, not_after: OffsetDateTime) -> (Pair, Ca) {
    let ca = Ca::root(cn, not_before, not_after);
    let pair = Pair {
        cert: ca.cert_pem.clone(),
        key: ca.key_pem(),
    };
    (pair, ca)
}

/// A serving certificate of `ca` for `names` (CN = the first), valid in the window.
fn leaf(ca: &Ca, names: &[&str], not_before: OffsetDateTime, not_after: OffsetDateTime) -> Pair {
    let issued = ca.issue(&CertSpec::server(names).valid(not_before, not_after));
    Pair {
        cert: issued.cert_pem,
        key: issued.key_pem,
    }
}

fn tls_secret(namespace: &str, name: &str, pair: &Pair) -> serde_json::Value {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": { "name": name, "namespace": namespace },
        "data": { "tls.crt": b64(&pair.cert), "tls.key": b64(&pair.key) },
    })
}

fn bundle(namespace: &str, name: &str, pem: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": name, "namespace": namespace },
        "data": { "ca-bundle.crt": pem },
    })
}

/// Writes `files` as the installer would (atomic directory writer, `..data` layout).
fn install(dir: &Path, files: &[(&str, &str, u32)]) -> anyhow::Result<()> {
    let payload: BTreeMap<String, reload_lib::fs::FileContent> = files
        .iter()
        .map(|(key, text, mode)| {
            (
                (*key).to_owned(),
                reload_lib::fs::FileContent::new(text.as_bytes().to_vec(), *mode),
            )
        })
        .collect();
    reload_lib::fs::AtomicDirWriter::new(dir)
        .write(&payload)
        .with_context(|| format!("cannot write {}", dir.display()))?;
    Ok(())
}

fn random_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The work directory, removed on drop unless kept.
struct WorkDir {
    path: PathBuf,
    keep: bool,
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Runs the demo; prints the timeline on stdout.
///
/// # Errors
/// When a step fails or recovery does not happen within the timeout; the error has the reason
/// and the last log lines of every process.
pub fn run(options: &Options) -> anyhow::Result<Recovered> {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let work = WorkDir {
        path: options.dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("recovery-demo-{}", std::process::id()))
        }),
        keep: options.keep || options.dir.is_some(),
    };
    let dir = &work.path;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let resources = dir.join("resources");
    let seed = dir.join("seed");
    std::fs::create_dir_all(&seed)?;

    // The PKI of a cluster that slept for a month past its serving certificate's expiry.
    let now = OffsetDateTime::now_utc();
    let day = time::Duration::days(1);
    let (serving_signer, serving_issuer) = signer(
        "openshift-kube-apiserver-operator_localhost-serving-signer@1",
        now - day * 400,
        now - day * 35,
    );
    let serving = leaf(
        &serving_issuer,
        &["localhost", "127.0.0.1"],
        now - day * 65,
        now - day * 35,
    );
    let (recovery_signer, recovery_issuer) = signer(
        "openshift-kube-apiserver-operator_localhost-recovery-serving-signer@1",
        now - day * 400,
        now + day * 3250,
    );
    let recovery = leaf(
        &recovery_issuer,
        &["localhost-recovery"],
        now - day * 400,
        now + day * 3250,
    );
    let recovery_serial = serial(&recovery.cert)?;
    let token = random_token()?;

    // The apiserver's objects (its etcd), and the installer's resource directory.
    let objects = serde_json::json!({ "kind": "List", "items": [
        tls_secret(OPERATOR_NAMESPACE, "localhost-serving-signer", &serving_signer),
        tls_secret(OPERATOR_NAMESPACE, "localhost-recovery-serving-signer", &recovery_signer),
        bundle(NAMESPACE, "localhost-serving-ca", &serving_signer.cert),
        bundle(NAMESPACE, "localhost-recovery-serving-ca", &recovery_signer.cert),
        tls_secret(NAMESPACE, "localhost-serving-cert-certkey", &serving),
        tls_secret(NAMESPACE, "localhost-recovery-serving-certkey", &recovery),
    ]});
    std::fs::write(
        seed.join("objects.json"),
        serde_json::to_vec_pretty(&objects)?,
    )?;
    let serving_dir = resources.join("secrets/localhost-serving-cert-certkey");
    let recovery_dir = resources.join("secrets/localhost-recovery-serving-certkey");
    let bundle_file = resources.join("configmaps/localhost-serving-ca/ca-bundle.crt");
    install(
        &serving_dir,
        &[
            ("tls.crt", &serving.cert, 0o600),
            ("tls.key", &serving.key, 0o600),
        ],
    )?;
    install(
        &recovery_dir,
        &[
            ("tls.crt", &recovery.cert, 0o600),
            ("tls.key", &recovery.key, 0o600),
        ],
    )?;
    install(
        &resources.join("configmaps/localhost-serving-ca"),
        &[("ca-bundle.crt", &serving_signer.cert, 0o644)],
    )?;
    std::fs::write(dir.join("recovery-ca.crt"), &recovery_signer.cert)?;
    reload_lib::fs::write_file_atomic(&dir.join("token"), token.as_bytes(), 0o600)?;
    reload_lib::fs::write_file_atomic(
        &dir.join("tokens.csv"),
        format!("{token},system:admin,0,\"system:masters\"\n").as_bytes(),
        0o600,
    )?;
    std::fs::write(dir.join("rotation.yaml"), ROTATION_CONFIG)?;

    let timeline = Timeline::new();
    timeline.mark(&format!(
        "PKI ready in {}: serving signer and serving certificate expired {} days ago; localhost-recovery valid for 10 years",
        dir.display(),
        35
    ));

    // The apiserver, serving the expired certificate for `localhost`.
    let (mut servers, addr) = match &options.apiserver {
        Apiserver::Mini => start_mini(
            &options.bin_dir,
            dir,
            &serving_dir,
            &recovery_dir,
            &seed,
            &timeline,
        )?,
        Apiserver::Real(assets) => start_real(
            assets,
            dir,
            &serving_dir,
            &recovery_dir,
            &bundle_file,
            &objects,
            &token,
            &recovery_signer.cert,
            &timeline,
        )?,
    };
    match handshake(addr, "localhost", &std::fs::read(&bundle_file)?) {
        Ok(_) => bail!("the apiserver's certificate should be expired at the start"),
        Err(err) => timeline.mark(&format!("client -> https://localhost: refused ({err})")),
    }

    // The two sidecars over the recovery connection.
    let connection = |command: &mut Command| {
        command
            .args(["--server", &format!("https://{addr}")])
            .args(["--tls-server-name-override", "localhost-recovery"])
            .arg("--ca-file")
            .arg(dir.join("recovery-ca.crt"))
            .arg("--token-file")
            .arg(dir.join("token"));
    };
    let mut sync_command = Command::new(options.bin_dir.join("cert-syncer"));
    sync_command.arg("sync");
    connection(&mut sync_command);
    sync_command
        .args(["--namespace", NAMESPACE, "--destination-dir"])
        .arg(&resources)
        .args([
            "--secrets",
            "localhost-serving-cert-certkey,localhost-recovery-serving-certkey",
        ])
        .args([
            "--configmaps",
            "localhost-serving-ca,localhost-recovery-serving-ca",
        ]);
    let marks = timeline.clone();
    let mut sync = Proc::spawn_logging("cert-syncer sync", sync_command, move |line| {
        // Writes before the regeneration only align the installer's files with the API.
        if line.contains(" written ") && marks.has("regenerate: serving certificate re-issued") {
            if line.contains("secret/localhost-serving-cert-certkey") {
                marks.mark_once("sync: wrote the new serving certificate to the resource dir");
            }
            if line.contains("configmap/localhost-serving-ca") {
                marks.mark_once("sync: wrote the new CA bundle to the resource dir");
            }
        }
    })
    .map_err(anyhow::Error::msg)?;
    let mut regenerate_command = Command::new(options.bin_dir.join("cert-syncer"));
    regenerate_command.arg("regenerate");
    connection(&mut regenerate_command);
    regenerate_command
        .arg("--config")
        .arg(dir.join("rotation.yaml"));
    let marks = timeline.clone();
    let mut regenerate = Proc::spawn_logging(
        "cert-syncer regenerate",
        regenerate_command,
        move |line| {
            if line.contains("regenerated") && line.contains("localhost-serving-signer") {
                marks.mark_once("regenerate: expired signer replaced");
            }
            if line.contains("CA bundle updated") && line.contains("localhost-serving-ca") {
                marks.mark_once("regenerate: CA bundle updated (new CA added; the expired one is pruned once no managed certificate chains to it)");
            }
            if line.contains("regenerated") && line.contains("localhost-serving-cert-certkey") {
                marks.mark_once("regenerate: serving certificate re-issued");
            }
        },
    )
    .map_err(anyhow::Error::msg)?;
    timeline.mark("cert-syncer sync and regenerate started (SNI localhost-recovery, token)");
    let sidecars_started = Instant::now();

    // Recovered when a client that trusts only the synced bundle connects to `localhost`.
    let deadline = Instant::now() + options.timeout;
    let outcome = loop {
        if let Ok(bundle) = std::fs::read(&bundle_file)
            && let Ok(serial) = handshake(addr, "localhost", &bundle)
        {
            break Ok(serial);
        }
        for proc in servers.iter_mut().chain([&mut sync, &mut regenerate]) {
            if let Ok(Some(status)) = proc.child.try_wait() {
                bail!(
                    "{} exited ({status}) before recovery:\n{}",
                    proc.name,
                    proc.tail(20)
                );
            }
        }
        if Instant::now() >= deadline {
            break Err(anyhow::anyhow!(
                "not recovered within {:?}\n{}{}{}",
                options.timeout,
                servers.iter().map(|p| p.tail(15)).collect::<String>(),
                sync.tail(15),
                regenerate.tail(15)
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let serial = outcome?;
    let elapsed = timeline.start.elapsed();
    timeline.mark(&format!(
        "client -> https://localhost: verified with the synced CA bundle, serial {serial}: RECOVERED"
    ));
    if serial_of_file(&recovery_dir.join("tls.crt"))? == recovery_serial {
        timeline.mark("localhost-recovery certificate untouched (still valid: expired-only mode)");
    } else {
        bail!("the valid localhost-recovery certificate was replaced");
    }
    // The sidecars' and the server's own log lines for the same moment may still be in flight.
    let settle = Instant::now() + Duration::from_secs(2);
    while Instant::now() < settle
        && !(timeline.has("sync: wrote the new serving certificate to the resource dir")
            && (options.apiserver != Apiserver::Mini
                || timeline.has("mini-apiserver: reloaded the new serving certificate")))
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("recovered in {} ms", elapsed.as_millis());
    println!(
        "recovered {} ms after the sidecars started",
        (elapsed - (sidecars_started - timeline.start)).as_millis()
    );
    drop((regenerate, sync, servers));
    Ok(Recovered {
        elapsed,
        serial,
        milestones: timeline.milestones(),
    })
}

fn serial(pem: &str) -> anyhow::Result<String> {
    let der = CertificateDer::from_pem_slice(pem.as_bytes())?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)?;
    Ok(cert.raw_serial_as_string())
}

fn serial_of_file(path: &Path) -> anyhow::Result<String> {
    serial(&std::fs::read_to_string(path)?)
}

/// A full TLS handshake to `addr` for `name`, trusting only `bundle`; the served serial.
fn handshake(addr: SocketAddr, name: &str, bundle: &[u8]) -> anyhow::Result<String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(bundle) {
        roots.add(cert?)?;
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut connection =
        rustls::ClientConnection::new(Arc::new(config), ServerName::try_from(name.to_owned())?)?;
    let mut tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(2)))?;
    while connection.is_handshaking() {
        connection.complete_io(&mut tcp).map_err(|err| {
            match err
                .get_ref()
                .and_then(|e| e.downcast_ref::<rustls::Error>())
            {
                Some(tls) => anyhow::anyhow!("{tls}"),
                None => anyhow::anyhow!(err),
            }
        })?;
    }
    let leaf = connection
        .peer_certificates()
        .and_then(|c| c.first())
        .context("no certificate")?
        .clone();
    let _ = tcp.flush();
    let (_, cert) = x509_parser::parse_x509_certificate(&leaf)?;
    Ok(cert.raw_serial_as_string())
}
