//! Unit tests of [`super::inspect`]: pairing, bundles, chains and problems per row.

use super::*;
use crate::regenerate::config::Identity;
use std::path::PathBuf;

const NOW: i64 = 1_900_000_000;
const DAY: i64 = 86_400;
const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);

fn signer(name: &str) -> pki::KeyPairPem {
    pki::new_signer(
        name,
        NOW,
        HOUR,
        std::time::Duration::from_secs(365 * 86_400),
    )
    .unwrap()
}

fn serving(signer: &pki::KeyPairPem, days: u64, at: i64) -> pki::KeyPairPem {
    let identity = Identity::Serving {
        hostnames: vec!["api.example".to_owned(), "10.0.0.1".to_owned()],
    };
    pki::new_leaf(
        signer,
        &identity,
        at,
        HOUR,
        std::time::Duration::from_secs(days * 86_400),
    )
    .unwrap()
}

fn group(entries: &[(&str, &str)]) -> Group {
    Group {
        origin: Origin::Dir(PathBuf::from("/d")),
        entries: entries
            .iter()
            .map(|(name, text)| Entry {
                name: (*name).to_owned(),
                bytes: Ok(text.as_bytes().to_vec()),
            })
            .collect(),
    }
}

fn run(groups: &[Group]) -> Vec<Row> {
    inspect(groups, &[], NOW, std::time::Duration::from_secs(7 * 86_400))
}

fn kinds(row: &Row) -> Vec<ProblemKind> {
    row.problems.iter().map(|p| p.kind).collect()
}

#[test]
fn a_pair_beside_its_bundle_matches_and_chains() {
    let ca = signer("ca");
    let leaf = serving(&ca, 30, NOW);
    let rows = run(&[group(&[
        ("ca-bundle.crt", &ca.cert_pem()),
        ("serving.crt", &leaf.cert_pem()),
        ("serving.key", &leaf.key_pem),
        ("token", "not material"),
    ])]);
    assert_eq!(rows.len(), 2, "{rows:#?}");
    assert_eq!(rows[0].role, Some(Role::Ca));
    assert_eq!(rows[1].source, "/d/serving.crt");
    assert_eq!(rows[1].role, Some(Role::Leaf));
    assert_eq!(rows[1].key.as_ref().unwrap().result, KeyResult::Match);
    let chain = rows[1].chain.as_ref().unwrap();
    assert_eq!(chain.result, ChainResult::Yes);
    assert_eq!(chain.bundle.as_deref(), Some("/d/ca-bundle.crt"));
    assert!(chain.required);
    assert_eq!(rows[1].status, Status::Ok);
    let facts = rows[1].certificate.as_ref().unwrap();
    assert_eq!(facts.dns_names, ["api.example"]);
    assert_eq!(facts.ip_addresses, ["10.0.0.1"]);
    assert_eq!(facts.seconds_left, 30 * DAY);
}

#[test]
fn expiry_mismatch_and_foreign_issuers_are_problems_named_per_row() {
    let ca = signer("ca");
    let other = signer("other");
    let old = serving(&ca, 1, NOW - 10 * DAY);
    let a = serving(&ca, 30, NOW);
    let b = serving(&ca, 30, NOW);
    let foreign = serving(&other, 30, NOW);
    let rows = run(&[group(&[
        ("ca.crt", &ca.cert_pem()),
        ("a.crt", &a.cert_pem()),
        ("a.key", &b.key_pem),
        ("foreign.crt", &foreign.cert_pem()),
        ("foreign.key", &foreign.key_pem),
        ("old.crt", &old.cert_pem()),
        ("old.key", &old.key_pem),
    ])]);
    let by_source = |name: &str| {
        rows.iter()
            .find(|r| r.source == format!("/d/{name}"))
            .unwrap()
    };
    assert_eq!(kinds(by_source("a.crt")), [ProblemKind::KeyMismatch]);
    assert!(by_source("a.crt").problems[0].message.contains("/d/a.key"));
    assert_eq!(kinds(by_source("foreign.crt")), [ProblemKind::NoChain]);
    let old = by_source("old.crt");
    // Expired, but still signed by the bundle's CA: reported once, as expired.
    assert_eq!(kinds(old), [ProblemKind::Expired]);
    assert_eq!(old.chain.as_ref().unwrap().result, ChainResult::Yes);
    assert!(
        old.certificate
            .as_ref()
            .unwrap()
            .time_left
            .starts_with("expired 9d")
    );
}

#[test]
fn without_a_local_bundle_every_bundle_is_searched_and_an_unknown_issuer_is_no_problem() {
    let ca = signer("ca");
    let other = signer("other");
    let mine = serving(&ca, 30, NOW);
    let stranger = serving(&other, 30, NOW);
    let rows = run(&[
        Group {
            origin: Origin::Dir(PathBuf::from("/r/configmaps/client-ca")),
            ..group(&[("ca-bundle.crt", &ca.cert_pem())])
        },
        Group {
            origin: Origin::Dir(PathBuf::from("/r/secrets/mine")),
            ..group(&[("tls.crt", &mine.cert_pem()), ("tls.key", &mine.key_pem)])
        },
        Group {
            origin: Origin::Dir(PathBuf::from("/r/secrets/stranger")),
            ..group(&[
                ("tls.crt", &stranger.cert_pem()),
                ("tls.key", &stranger.key_pem),
            ])
        },
    ]);
    let mine = rows[1].chain.as_ref().unwrap();
    assert_eq!(mine.result, ChainResult::Yes);
    assert_eq!(
        mine.bundle.as_deref(),
        Some("/r/configmaps/client-ca/ca-bundle.crt")
    );
    assert!(!mine.required);
    assert_eq!(
        rows[2].chain.as_ref().unwrap().result,
        ChainResult::UnknownIssuer
    );
    assert!(rows[2].problems.is_empty());
}

#[test]
fn garbage_is_a_row_naming_what_is_wrong_and_unrelated_files_are_skipped() {
    let ca = signer("ca");
    let rows = run(&[group(&[
        (
            "garbage.crt",
            "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
        ),
        ("empty.crt", ""),
        ("lonely.key", "not a key"),
        ("signing.key", &ca.key_pem),
        (
            "service-account.pub",
            "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
        ),
        ("kubeconfig", "apiVersion: v1"),
    ])]);
    let sources: Vec<&str> = rows.iter().map(|r| r.source.as_str()).collect();
    assert_eq!(sources, ["/d/garbage.crt", "/d/empty.crt", "/d/lonely.key"]);
    assert!(rows.iter().all(|r| kinds(r) == [ProblemKind::Unreadable]));
    assert!(
        rows[0].problems[0].message.contains("PEM"),
        "{:?}",
        rows[0].problems
    );
    assert_eq!(rows[1].problems[0].message, "the file is empty");
    assert_eq!(rows[2].problems[0].message, "no private key found");
}

#[test]
fn a_signer_pair_chains_when_its_ca_is_in_a_bundle() {
    let ca = signer("signer");
    let rows = run(&[
        group(&[("tls.crt", &ca.cert_pem()), ("tls.key", &ca.key_pem)]),
        Group {
            origin: Origin::Dir(PathBuf::from("/b")),
            ..group(&[("ca-bundle.crt", &ca.cert_pem())])
        },
    ]);
    assert_eq!(rows[0].role, Some(Role::Leaf));
    assert_eq!(rows[0].key.as_ref().unwrap().result, KeyResult::Match);
    assert_eq!(rows[0].chain.as_ref().unwrap().result, ChainResult::Yes);
}

#[test]
fn a_combined_file_pairs_with_itself_and_a_chain_file_lists_its_intermediates() {
    let root = signer("root");
    let leaf = serving(&root, 3, NOW);
    let combined = format!("{}{}{}", leaf.cert_pem(), root.cert_pem(), leaf.key_pem);
    let rows = run(&[group(&[("server.pem", &combined)])]);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].key.as_ref().unwrap().source, "/d/server.pem");
    assert_eq!(rows[0].key.as_ref().unwrap().result, KeyResult::Match);
    assert_eq!(rows[1].role, Some(Role::Intermediate));
    assert_eq!(rows[1].index, Some(1));
    // Three days left, within the seven-day warning.
    assert_eq!(rows[0].status, Status::Expiring);
}
