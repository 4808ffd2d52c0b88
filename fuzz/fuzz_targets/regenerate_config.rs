//! The rotation config parser of `cert-syncer regenerate`
//! (`cert_syncer::regenerate::config::parse`): YAML that an operator writes, item by item.
//!
//! Input: the bytes as UTF-8 text (other inputs are skipped: the file is read as a string).
//!
//! Properties, besides no panic (the YAML parser and our item validation both see the input):
//! - an error has a message;
//! - what parses is valid: every bundle's and target's signer index points at a signer; every
//!   validity is at least 1 minute and every refresh above zero and at most its validity; no
//!   object (kind, namespace, name) is declared twice; names and namespaces are non-empty, at
//!   most 253 / 63 bytes, lowercase, without `/`; serving hostnames and client groups are
//!   sorted and deduplicated;
//! - every skipped item says which item and why;
//! - parsing is deterministic (same text → same outcome).

#![no_main]

use std::collections::BTreeSet;
use std::time::Duration;

use cert_syncer::regenerate::config::{Identity, ObjectRef, Rotation, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse(text) {
        Err(err) => {
            assert!(!err.0.trim().is_empty(), "an error without a message");
            assert_eq!(parse(text).unwrap_err().0, err.0, "not deterministic");
        }
        Ok(rotation) => {
            check(&rotation);
            let again = parse(text).expect("parsed once, fails the second time");
            assert_eq!(format!("{again:?}"), format!("{rotation:?}"), "not deterministic");
        }
    }
});

fn check(rotation: &Rotation) {
    let signers = rotation.signers.len();
    for bundle in &rotation.bundles {
        check_object(&bundle.object);
        assert!(bundle.signers.iter().all(|&i| i < signers), "{bundle:?}");
    }
    for signer in &rotation.signers {
        check_object(&signer.object);
        check_periods(signer.validity, signer.refresh);
    }
    for target in &rotation.targets {
        check_object(&target.object);
        assert!(target.signer < signers, "{target:?}");
        check_periods(target.validity, target.refresh);
        match &target.identity {
            Identity::Serving { hostnames } => assert_sorted_unique(hostnames),
            Identity::Client { groups, .. } => assert_sorted_unique(groups),
        }
    }
    let mut seen = BTreeSet::new();
    for (kind, object) in rotation.objects() {
        assert!(
            seen.insert((kind, object.clone())),
            "{object} declared twice"
        );
    }
    for broken in &rotation.broken {
        assert!(!broken.item.is_empty() && !broken.reason.trim().is_empty(), "{broken:?}");
    }
}

fn check_object(object: &ObjectRef) {
    for (part, max) in [(&object.namespace, 63), (&object.name, 253)] {
        assert!(!part.is_empty() && part.len() <= max, "{object:?}");
        assert!(
            part.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'),
            "{object:?}"
        );
    }
}

fn check_periods(validity: Duration, refresh: Duration) {
    assert!(validity >= Duration::from_secs(60), "validity {validity:?}");
    assert!(!refresh.is_zero() && refresh <= validity, "refresh {refresh:?} of {validity:?}");
}

fn assert_sorted_unique(items: &[String]) {
    assert!(items.windows(2).all(|w| w[0] < w[1]), "{items:?}");
}
