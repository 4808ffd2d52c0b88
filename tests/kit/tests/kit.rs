//! The kit's own promises: what it issues is what was asked for (read back with reload-lib's
//! parser), keys are written private, the kubelet swap leaves the kubelet's layout, child
//! processes report their address and are reaped.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use reload_lib::CertInfo;
use testkit::files::{PairDir, Writer, kubelet_swap};
use testkit::pki::{Ca, CertSpec, KeyKind, TempPki};

fn now() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp()
}

#[test]
fn issued_certificates_carry_the_names_validity_serial_and_issuer_asked_for() {
    let ca = Ca::new("kit test ca");
    let leaf = ca.issue(&CertSpec::server(&["localhost", "127.0.0.1"]).serial(0xabcd));
    let info = CertInfo::from_der(&leaf.der).unwrap();
    assert_eq!(info.serial, "abcd");
    assert_eq!(leaf.serial, "abcd");
    assert_eq!(info.dns_names, ["localhost"]);
    assert_eq!(
        info.ip_addresses,
        ["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    assert!(info.issuer.contains("kit test ca"), "{}", info.issuer);
    assert!(info.not_before < now() && now() < info.not_after);

    let expired = CertInfo::from_der(&ca.leaf(&["localhost"], -1).der).unwrap();
    assert!(expired.not_after < now());
    let not_yet = ca.leaf_between(
        &["localhost"],
        time::Duration::days(1),
        time::Duration::days(2),
    );
    assert!(CertInfo::from_der(&not_yet.der).unwrap().not_before > now());

    let other = ca.leaf(&["localhost"], 1);
    assert_ne!(
        other.serial,
        ca.leaf(&["localhost"], 1).serial,
        "serials are unique"
    );
    let intermediate = ca.intermediate("kit intermediate", 10);
    let chained = intermediate.leaf(&["localhost"], 1);
    assert!(
        CertInfo::from_der(&chained.der)
            .unwrap()
            .issuer
            .contains("kit intermediate")
    );
}

#[test]
fn rsa_and_ecdsa_keys_are_generated_as_asked() {
    let ca = Ca::default();
    let rsa = ca.issue(&CertSpec::server(&["localhost"]).key(KeyKind::Rsa2048));
    let ecdsa = ca.issue(&CertSpec::server(&["localhost"]));
    // PKCS#8 PEM of an RSA 2048 key is about 1.7 kB, of a P-256 key about 240 bytes.
    assert!(rsa.key_pem.len() > 1500, "{}", rsa.key_pem.len());
    assert!(ecdsa.key_pem.len() < 400, "{}", ecdsa.key_pem.len());
    // Both are usable by rustls: a client trusting the CA accepts a config built with them.
    let _ = testkit::tls::client_config_with_pems(&[&ca.cert_pem], &rsa.cert_pem, &rsa.key_pem);
}

#[test]
fn written_keys_are_private_and_certificates_readable() {
    let pki = TempPki::new();
    let (ca, ca_path) = pki.ca("ca");
    let files = pki.issue(&ca, "server", &CertSpec::server(&["localhost"]));
    let mode =
        |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&files.key), 0o600);
    assert_ne!(
        mode(&files.cert) & 0o044,
        0,
        "certificate readable by others"
    );
    assert_eq!(std::fs::read_to_string(&ca_path).unwrap(), ca.cert_pem);
    assert_eq!(
        std::fs::read_to_string(&files.cert).unwrap(),
        files.issued.cert_pem
    );
}

#[test]
fn the_kubelet_swap_leaves_the_kubelets_layout_and_removes_the_old_generation() {
    let dir = tempfile::tempdir().unwrap();
    kubelet_swap(dir.path(), 1, &[("tls.crt", b"one")]);
    let first = std::fs::read_link(dir.path().join("..data")).unwrap();
    kubelet_swap(dir.path(), 2, &[("tls.crt", b"two")]);
    let second = std::fs::read_link(dir.path().join("..data")).unwrap();
    assert_ne!(first, second);
    assert!(!dir.path().join(&first).exists(), "old generation removed");
    assert_eq!(
        std::fs::read_link(dir.path().join("tls.crt")).unwrap(),
        std::path::Path::new("..data/tls.crt")
    );
    assert_eq!(std::fs::read(dir.path().join("tls.crt")).unwrap(), b"two");

    let ca = Ca::default();
    let mut pair = PairDir::new(
        &dir.path().join("pair"),
        Writer::Rename,
        &ca.leaf(&["a"], 1),
    );
    let next = ca.leaf(&["a"], 1);
    pair.write(&next);
    assert_eq!(std::fs::read_to_string(pair.cert()).unwrap(), next.cert_pem);
    assert_eq!(std::fs::read_to_string(pair.key()).unwrap(), next.key_pem);
}

#[test]
fn a_child_reports_its_address_its_logs_and_is_reaped_on_drop() {
    let mut command = Command::new("sh");
    command.args([
        "-c",
        "echo starting >&2; echo 'listening on 127.0.0.1:4242'; exec sleep 600",
    ]);
    let mut child = testkit::process::Child::spawn(Some("sh"), command, |_, _| {}).unwrap();
    let addr = child.wait_listening(Duration::from_secs(10)).unwrap();
    assert_eq!(addr, "127.0.0.1:4242".parse().unwrap());
    assert!(child.has_exited().is_none());
    let seen = testkit::wait::poll_until(Duration::from_secs(10), || {
        child.stderr_text().contains("starting").then_some(())
    });
    assert!(seen.is_some(), "stderr captured: {:?}", child.stderr_text());
    let pid = child.child.id();
    drop(child);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "killed and reaped"
    );

    let mut silent = Command::new("sh");
    silent.args(["-c", "echo broken >&2; exit 3"]);
    let mut child = testkit::process::Child::spawn(None, silent, |_, _| {}).unwrap();
    let err = child.wait_listening(Duration::from_secs(10)).unwrap_err();
    assert!(
        err.contains("exited before") && err.contains("broken"),
        "{err}"
    );
}
