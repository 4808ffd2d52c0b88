//! The CRL rules on hand-made facts (the API tests in `tests/hardening.rs` and
//! `tests/crl_history.rs` make real CRLs; rcgen always writes a cRLNumber, so CRLs without one
//! are shown here).

use super::*;

const ISSUER: &[u8] = b"client-ca";

fn crl(number: Option<u32>, this_update: i64, signer: &[u8]) -> CrlInfo {
    CrlInfo {
        path: "client-ca.crl".into(),
        index: 0,
        issuer: "CN=client-ca".to_owned(),
        issuer_raw: ISSUER.to_vec(),
        this_update,
        next_update: None,
        number: number.map(x509_parser::num_bigint::BigUint::from),
        scope: None,
        signer_spki: Some(signer.to_vec()),
    }
}

fn scoped(mut crl: CrlInfo, scope: &[u8]) -> CrlInfo {
    crl.scope = Some(scope.to_vec());
    crl
}

fn bundle(crl_infos: Vec<CrlInfo>) -> ParsedBundle {
    ParsedBundle {
        certs: Vec::new(),
        infos: Vec::new(),
        crls: Vec::new(),
        crl_infos,
    }
}

/// A history that accepted `bundles`, in order.
fn history(bundles: &[Vec<CrlInfo>]) -> CrlHistory {
    let mut history = CrlHistory::default();
    for crls in bundles {
        history.record(&bundle(crls.clone()));
    }
    history
}

fn replaces(new: CrlInfo, served: CrlInfo) -> Result<()> {
    may_replace_crls(&bundle(vec![new]), None, &history(&[vec![served]]), 0)
}

#[test]
fn without_numbers_an_earlier_this_update_is_older() {
    let err = replaces(crl(None, 100, b"k"), crl(None, 200, b"k")).unwrap_err();
    assert!(
        matches!(err.invalid_material(), Some(InvalidMaterial::CrlOlder { position, served, .. })
            if position.starts_with("thisUpdate") && served.starts_with("thisUpdate")),
        "{err}"
    );
    replaces(crl(None, 200, b"k"), crl(None, 200, b"k")).unwrap();
    replaces(crl(None, 300, b"k"), crl(None, 200, b"k")).unwrap();
    // One side numbered, the other not: thisUpdate decides.
    assert!(replaces(crl(Some(9), 100, b"k"), crl(None, 200, b"k")).is_err());
    replaces(crl(None, 300, b"k"), crl(Some(9), 200, b"k")).unwrap();
}

#[test]
fn numbers_decide_over_this_update_and_a_re_keyed_ca_starts_a_new_series() {
    // A lower number is older even with a later thisUpdate (the issuer's clock).
    assert!(replaces(crl(Some(4), 300, b"k"), crl(Some(5), 200, b"k")).is_err());
    replaces(crl(Some(6), 100, b"k"), crl(Some(5), 200, b"k")).unwrap();
    // The same name under another key: its numbers are its own.
    replaces(crl(Some(1), 100, b"new key"), crl(Some(5), 200, b"k")).unwrap();
}

#[test]
fn every_scope_is_its_own_series_and_each_is_compared() {
    let (a, b) = (b"idp a".as_slice(), b"idp b".as_slice());
    let seen = history(&[vec![
        scoped(crl(Some(5), 0, b"k"), a),
        scoped(crl(Some(7), 0, b"k"), b),
    ]]);
    // The second partition rolled back while the first moves on: refused.
    let err = may_replace_crls(
        &bundle(vec![
            scoped(crl(Some(6), 0, b"k"), a),
            scoped(crl(Some(3), 0, b"k"), b),
        ]),
        None,
        &seen,
        0,
    )
    .unwrap_err();
    assert!(
        matches!(err.invalid_material(), Some(InvalidMaterial::CrlOlder { position, served, .. })
            if position == "cRLNumber 3" && served == "cRLNumber 7"),
        "{err}"
    );
    // Numbers of different scopes are not compared with each other.
    may_replace_crls(
        &bundle(vec![
            scoped(crl(Some(5), 0, b"k"), a),
            scoped(crl(Some(8), 0, b"k"), b),
        ]),
        None,
        &seen,
        0,
    )
    .unwrap();
}

#[test]
fn a_series_outlives_its_ca_leaving_the_bundle() {
    let other = || {
        let mut crl = crl(Some(1), 0, b"other key");
        crl.issuer_raw = b"other-ca".to_vec();
        crl
    };
    // Accepted: CRL 5; then a bundle without that CA at all.
    let seen = history(&[vec![crl(Some(5), 0, b"k")], vec![other()]]);
    let back = |number| {
        may_replace_crls(
            &bundle(vec![crl(Some(number), 0, b"k"), other()]),
            None,
            &seen,
            0,
        )
    };
    assert!(matches!(
        back(4).unwrap_err().invalid_material(),
        Some(InvalidMaterial::CrlOlder { .. })
    ));
    back(5).unwrap();
}

#[test]
fn a_new_series_may_not_take_the_lead_from_one_still_in_the_bundle() {
    let (a, b) = (b"idp a".as_slice(), b"idp b".as_slice());
    let seen = history(&[vec![scoped(crl(Some(5), 0, b"k"), a)]]);
    let new = |crls| may_replace_crls(&bundle(crls), None, &seen, 0);
    // After the series that led: fine.
    new(vec![
        scoped(crl(Some(5), 0, b"k"), a),
        scoped(crl(Some(1), 0, b"k"), b),
    ])
    .unwrap();
    // Before it (or a CRL of every scope before it): refused.
    for first in [scoped(crl(Some(1), 0, b"k"), b), crl(Some(1), 0, b"k")] {
        let err = new(vec![first, scoped(crl(Some(5), 0, b"k"), a)]).unwrap_err();
        assert!(
            matches!(err.invalid_material(), Some(InvalidMaterial::CrlReordered { served, .. })
                if served == "cRLNumber 5"),
            "{err}"
        );
    }
    // The series that led gone with its CA (another key): the new one leads.
    new(vec![scoped(crl(Some(1), 0, b"new key"), b)]).unwrap();
}

#[test]
fn the_history_forgets_the_least_recently_seen_series_beyond_its_bound() {
    let series = |n: u32| {
        let mut crl = crl(Some(1), 0, b"k");
        crl.issuer_raw = format!("ca {n}").into_bytes();
        crl
    };
    let mut history = CrlHistory::default();
    // A bundle of 3 series in force, then 5 bundles of one series each, bound 2.
    history.record(&bundle(vec![series(100), series(101), series(102)]));
    history.forget_beyond(2);
    assert_eq!(history.len(), 3, "the series in force are never forgotten");
    for n in 0..5 {
        history.record(&bundle(vec![series(n)]));
        history.forget_beyond(2);
    }
    // In force: 4; remembered beyond it: 2, the most recently seen (2 and 3).
    assert_eq!(history.len(), 3);
    let known = |n| history.series.contains_key(&SeriesKey::of(&series(n)));
    assert!(known(4) && known(3) && known(2));
    assert!(!known(1) && !known(0) && !known(100));
    // The bound of the real history.
    for n in 0..(CRL_HISTORY_BOUND as u32 + 10) {
        history.record(&bundle(vec![series(1000 + n)]));
    }
    assert_eq!(history.len(), CRL_HISTORY_BOUND + 1);
}
