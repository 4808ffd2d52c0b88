//! The reload engine without the reload task: passes run by hand over real files, checking what
//! each pass reads, parses, rejects, retries and publishes.

use std::collections::HashSet;
use std::path::Path;

use rcgen::{CertificateParams, KeyPair};
use rustls_pki_types::pem::PemObject as _;

use super::*;
use crate::reload::unix_now;

/// A self-signed pair for `name`, valid from an hour ago for `days` days (negative: expired).
fn pair(name: &str, days: i64) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(days.abs() + 1);
    params.not_after = now + time::Duration::days(days);
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

struct Files {
    _dir: tempfile::TempDir,
    default: CertKeyPaths,
    sni: CertKeyPaths,
}

impl Files {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        let files = Files {
            default: CertKeyPaths::new(path("tls.crt"), path("tls.key")),
            sni: CertKeyPaths::new(path("sni.crt"), path("sni.key")),
            _dir: dir,
        };
        files.write(&files.default, &pair("api.example", 30));
        files.write(&files.sni, &pair("sni.example", 30));
        files
    }

    fn write(&self, paths: &CertKeyPaths, (cert, key): &(String, String)) {
        std::fs::write(paths.key(), key).unwrap();
        std::fs::write(paths.cert(), cert).unwrap();
    }

    fn material(&self) -> ServingMaterial {
        ServingMaterial::new(
            self.default.clone(),
            vec![SniEntry {
                names: SniNames::Explicit(vec!["sni.example".to_owned()]),
                paths: self.sni.clone(),
            }],
            None,
            settings(),
        )
    }
}

fn settings() -> Settings {
    Settings {
        provider: Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
        alpn: Vec::new(),
        configure: None,
        session_cache_size: 16,
        max_file_size: crate::read::DEFAULT_MAX_FILE_SIZE,
    }
}

/// What a watch event naming `file` marks.
fn marked(file: &Path) -> Dirty {
    Dirty {
        files: HashSet::from([watch_path(file)]),
        ..Dirty::default()
    }
}

/// Runs the start-up pass.
fn started(material: &mut ServingMaterial) -> ServingSnapshot {
    let pass = material.load(None, Dirty::all(), unix_now());
    assert!(pass.rejected.is_none(), "{:?}", pass.rejected);
    assert_eq!((pass.sources_read, pass.sources_parsed), (2, 2));
    pass.snapshot.expect("start-up publishes")
}

#[test]
fn a_pass_reads_only_the_marked_sources_and_parses_only_changed_bytes() {
    let files = Files::new();
    let mut material = files.material();
    let first = started(&mut material);

    // Nothing marked: nothing read.
    let idle = material.load(Some(&first), Dirty::default(), unix_now());
    assert_eq!(idle.sources_read, 0);
    assert!(idle.snapshot.is_none() && idle.rejected.is_none());

    // Marked but unchanged: read, not parsed, nothing published.
    let same = material.load(Some(&first), marked(files.sni.cert()), unix_now());
    assert_eq!((same.sources_read, same.sources_parsed), (1, 0));
    assert!(same.snapshot.is_none());

    // The SNI pair changes: only it is replaced; the default entry is shared.
    files.write(&files.sni, &pair("sni.example", 30));
    let pass = material.load(Some(&first), marked(files.sni.key()), unix_now());
    assert_eq!((pass.sources_read, pass.sources_parsed), (1, 1));
    let second = pass.snapshot.expect("a changed pair is published");
    assert_eq!(second.generation, 2);
    assert!(Arc::ptr_eq(
        first.certified_key_for(None),
        second.certified_key_for(None)
    ));
    assert!(!Arc::ptr_eq(
        first.certified_key_for(Some("sni.example")),
        second.certified_key_for(Some("sni.example"))
    ));
    assert_eq!(pass.newly_served.len(), 1);
    assert_eq!(pass.newly_served[0].source, "sni:sni.example");
}

#[test]
fn a_rejected_source_keeps_its_entry_and_is_re_read_until_accepted() {
    let files = Files::new();
    let mut material = files.material();
    let first = started(&mut material);

    std::fs::write(files.default.cert(), "garbage").unwrap();
    let pass = material.load(Some(&first), marked(files.default.cert()), unix_now());
    assert!(pass.snapshot.is_none());
    assert!(matches!(pass.rejected, Some(Error::InvalidMaterial { .. })));
    assert_eq!(material.failing, BTreeSet::from([0]));

    // No event: the retry re-reads the rejected source on its own, and accepts it once good.
    let next = pair("api.example", 30);
    files.write(&files.default, &next);
    let retried = material.load(Some(&first), Dirty::default(), unix_now());
    assert_eq!(retried.sources_read, 1);
    assert!(retried.rejected.is_none());
    let snapshot = retried
        .snapshot
        .expect("the retry publishes the fixed pair");
    assert_eq!(
        snapshot.certified_key_for(None).cert[0].as_ref(),
        rustls_pki_types::CertificateDer::from_pem_slice(next.0.as_bytes())
            .unwrap()
            .as_ref()
    );
    assert!(material.failing.is_empty());
}

#[test]
fn the_policy_refuses_an_expired_certificate_over_a_valid_one_and_names_not_covered() {
    let files = Files::new();
    let mut material = files.material();
    let first = started(&mut material);

    files.write(&files.default, &pair("api.example", -1));
    let expired = material.load(Some(&first), marked(files.default.cert()), unix_now());
    assert!(matches!(
        expired.rejected.as_ref().and_then(Error::invalid_material),
        Some(InvalidMaterial::Expired { .. })
    ));

    // A fresh set (the expired default would be re-read, and rejected first, in every pass).
    let files = Files::new();
    let mut material = files.material();
    let first = started(&mut material);
    files.write(&files.sni, &pair("other.example", 30));
    let uncovered = material.load(Some(&first), marked(files.sni.cert()), unix_now());
    assert!(matches!(
        uncovered.rejected.as_ref().and_then(Error::invalid_material),
        Some(InvalidMaterial::NameNotCovered(name)) if name == "sni.example"
    ));
    assert!(uncovered.snapshot.is_none());
}

#[test]
fn a_failed_publish_commits_nothing_and_is_retried() {
    let files = Files::new();
    let mut material = files.material();
    let first = started(&mut material);

    // A provider no `ServerConfig` can be built with: the pair parses, the snapshot fails.
    let good = Arc::clone(&material.settings.provider);
    material.settings.provider = Arc::new(rustls::crypto::CryptoProvider {
        cipher_suites: Vec::new(),
        ..(*good).clone()
    });
    files.write(&files.sni, &pair("sni.example", 30));
    let failed = material.load(Some(&first), marked(files.sni.cert()), unix_now());
    assert!(failed.snapshot.is_none() && failed.newly_served.is_empty());
    assert!(
        matches!(failed.rejected, Some(Error::BuildConfig { .. })),
        "{:?}",
        failed.rejected
    );
    // Nothing committed: the source is still at its old digest and is retried.
    assert_eq!(material.failing, BTreeSet::from([1]));

    material.settings.provider = good;
    let retried = material.load(Some(&first), Dirty::default(), unix_now());
    assert_eq!((retried.sources_read, retried.sources_parsed), (1, 1));
    assert!(retried.rejected.is_none());
    let second = retried.snapshot.expect("the retry publishes");
    assert!(!Arc::ptr_eq(
        first.certified_key_for(Some("sni.example")),
        second.certified_key_for(Some("sni.example"))
    ));
    assert!(material.failing.is_empty());
}

/// A certificate for `name` signed with `key`, PEM.
fn cert_for(name: &str, key: &KeyPair, serial: u64) -> String {
    let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
    params.serial_number = Some(serial.into());
    params.self_signed(key).unwrap().pem()
}

#[test]
fn a_certificate_renewed_for_the_same_key_reuses_the_loaded_key_and_a_torn_pair_is_told_apart() {
    let files = Files::new();
    let key = KeyPair::generate().unwrap();
    let key_pem = key.serialize_pem();
    files.write(
        &files.default,
        &(cert_for("api.example", &key, 1), key_pem.clone()),
    );
    let mut material = files.material();
    let first = started(&mut material);

    // Only the certificate changed: the served key is reused, not parsed and checked again.
    std::fs::write(files.default.cert(), cert_for("api.example", &key, 2)).unwrap();
    let pass = material.load(Some(&first), marked(files.default.cert()), unix_now());
    assert!(pass.rejected.is_none(), "{:?}", pass.rejected);
    let second = pass.snapshot.expect("the renewal is published");
    let (before, after) = (
        first.certified_key_for(None),
        second.certified_key_for(None),
    );
    assert!(!Arc::ptr_eq(before, after), "a new certificate");
    assert!(Arc::ptr_eq(&before.key, &after.key), "the same signing key");

    // A certificate for another key alone: rejected, and recognised as a pair half written.
    let other = KeyPair::generate().unwrap();
    std::fs::write(files.default.cert(), cert_for("api.example", &other, 3)).unwrap();
    let torn = material.load(Some(&second), marked(files.default.cert()), unix_now());
    assert_eq!(
        torn.rejected.as_ref().and_then(Error::invalid_material),
        Some(&InvalidMaterial::KeyMismatch)
    );
    assert!(material.rejected_mid_write());

    // Its key arrives: published, with the new key loaded.
    std::fs::write(files.default.key(), other.serialize_pem()).unwrap();
    let pass = material.load(Some(&second), marked(files.default.key()), unix_now());
    assert!(pass.rejected.is_none(), "{:?}", pass.rejected);
    let third = pass.snapshot.expect("the completed pair is published");
    assert!(!Arc::ptr_eq(&after.key, &third.certified_key_for(None).key));

    // Both files replaced by a pair that does not match: not a pair half written.
    let (stranger, _) = pair("api.example", 30);
    std::fs::write(files.default.cert(), stranger).unwrap();
    std::fs::write(files.default.key(), key_pem).unwrap();
    let both = material.load(Some(&third), marked(files.default.cert()), unix_now());
    assert_eq!(
        both.rejected.as_ref().and_then(Error::invalid_material),
        Some(&InvalidMaterial::KeyMismatch)
    );
    assert!(!material.rejected_mid_write());
}
