//! The kubelet's request for this node, and every request Go could read otherwise refused, by
//! part: the PEM framing, the subject, the attributes.

use testkit::csr::{
    Atv, BMP_STRING, CHALLENGE_PASSWORD, CN, EXTENSION_REQUEST, IA5_STRING, O, OU,
    PRINTABLE_STRING, RawRequest, SUBJECT_ALT_NAME, T61_STRING, dns_names, element,
    extension_request_value,
};
use testkit::pki::KeyKind;

use super::*;

fn refused(pem: &str, part: Part, want: &str) {
    match kubelet_request(pem.as_bytes(), "node-a") {
        Err(refusal) => {
            assert_eq!(refusal.part, part, "{refusal:?}");
            assert!(refusal.reason.contains(want), "{want:?} not in {refusal:?}");
        }
        Ok(read) => panic!("accepted ({read:?}); wanted a refusal: {want}"),
    }
}

#[test]
fn the_kubelet_s_request_is_read_with_its_subject_and_key() {
    let read = kubelet_request(RawRequest::kubelet("node-a").pem().as_bytes(), "node-a").unwrap();
    assert_eq!(read.subject, "O=system:nodes, CN=system:node:node-a");
    assert_eq!((read.key.as_str(), read.rsa), ("ECDSA", false));
    let mut printable = RawRequest::kubelet("node-a");
    printable.subject.reverse();
    for rdn in &mut printable.subject {
        rdn[0].tag = PRINTABLE_STRING;
    }
    printable.key = KeyKind::Rsa2048;
    let read = kubelet_request(printable.pem().as_bytes(), "node-a").unwrap();
    assert_eq!(read.subject, "CN=system:node:node-a, O=system:nodes");
    assert!(read.rsa);
    // An empty extensionRequest asks for nothing.
    let mut empty = RawRequest::kubelet("node-a");
    empty.attributes = vec![(
        EXTENSION_REQUEST.to_owned(),
        vec![extension_request_value(&[])],
    )];
    assert!(kubelet_request(empty.pem().as_bytes(), "node-a").is_ok());
}

#[test]
fn two_blocks_read_differently_by_go_are_refused() {
    // Issue 35: a reader that finds BEGIN anywhere reads node-a; Go reads node-b.
    let a = RawRequest::kubelet("node-a").pem();
    let b = RawRequest::kubelet("node-b").pem();
    refused(&format!("x{a}{b}"), Part::Request, "text around");
    refused(&format!("{a}{b}"), Part::Request, "2 PEM blocks");
    refused(&format!("{b}{a}"), Part::Request, "2 PEM blocks");
    // A first block Go skips, then node-b.
    let broken = a.replacen("\nM", "\n!", 1);
    refused(&format!("{broken}{b}"), Part::Request, "skipped by Go");
    refused(&a.replace('\n', "\r\n"), Part::Request, "carriage return");
    refused(
        &a.replacen("-----\n", "-----\nX-Note: y\n", 1),
        Part::Request,
        "headers",
    );
}

#[test]
fn a_subject_go_reads_otherwise_is_refused() {
    let cases: Vec<(Vec<Vec<Atv>>, &str)> = vec![
        // Two CNs: Go keeps the last.
        (
            vec![
                vec![Atv::utf8(O, "system:nodes")],
                vec![Atv::utf8(CN, "system:node:node-a")],
                vec![Atv::utf8(CN, "system:node:node-b")],
            ],
            "2 CNs",
        ),
        // Two Os: Go keeps both (`O=system:masters` would be cluster-admin).
        (
            vec![
                vec![Atv::utf8(O, "system:nodes")],
                vec![Atv::utf8(O, "system:masters")],
                vec![Atv::utf8(CN, "system:node:node-a")],
            ],
            "subject O",
        ),
        // A multi-valued RDN.
        (
            vec![vec![
                Atv::utf8(O, "system:nodes"),
                Atv::utf8(CN, "system:node:node-a"),
            ]],
            "RDN of 2 attributes",
        ),
        (
            vec![
                vec![Atv::utf8(O, "system:nodes")],
                vec![Atv::utf8(CN, "system:node:node-a")],
                vec![Atv::utf8(OU, "x")],
            ],
            "other than CN and O",
        ),
        (
            vec![
                vec![Atv::utf8(O, "system:nodes")],
                vec![Atv::utf8(CN, "system:node:node-b")],
            ],
            "another node",
        ),
        (vec![vec![Atv::utf8(O, "system:nodes")]], "no CN"),
        (vec![vec![Atv::utf8(CN, "system:node:node-a")]], "subject O"),
        (vec![], "no CN"),
    ];
    for (subject, want) in cases {
        let mut raw = RawRequest::kubelet("node-a");
        raw.subject = subject;
        refused(&raw.pem(), Part::Subject, want);
    }
    // Other string types (Go decodes BMP and T61 to the same text, IA5 too).
    for tag in [BMP_STRING, T61_STRING, IA5_STRING] {
        let mut raw = RawRequest::kubelet("node-a");
        raw.subject[1][0].tag = tag;
        if tag == BMP_STRING {
            raw.subject[1][0].value = "system:node:node-a"
                .encode_utf16()
                .flat_map(u16::to_be_bytes)
                .collect();
        }
        refused(
            &raw.pem(),
            Part::Subject,
            "not UTF8String or PrintableString",
        );
    }
    // A control character in another node's name is escaped in the reason.
    let mut raw = RawRequest::kubelet("node-a");
    raw.subject[1][0] = Atv::utf8(CN, "system:node:x\n level=error forged");
    let err = kubelet_request(raw.pem().as_bytes(), "node-a").unwrap_err();
    assert!(!err.reason.contains('\n'), "{err:?}");
}

#[test]
fn every_attribute_is_read_and_any_extension_or_other_attribute_refused() {
    let san = extension_request_value(&[(SUBJECT_ALT_NAME, false, dns_names(&["node-a"]))]);
    let empty = extension_request_value(&[]);
    let other = extension_request_value(&[("1.3.6.1.4.1.55555.1", true, vec![0x05, 0x00])]);
    let request = |attributes: Vec<(&str, Vec<Vec<u8>>)>| {
        let mut raw = RawRequest::kubelet("node-a");
        raw.attributes = attributes
            .into_iter()
            .map(|(oid, values)| (oid.to_owned(), values))
            .collect();
        raw.pem()
    };
    let cases: Vec<(String, &str)> = vec![
        // A SAN in the first, the only or a later extensionRequest attribute.
        (
            request(vec![(EXTENSION_REQUEST, vec![san.clone()])]),
            "subject alternative names",
        ),
        (
            request(vec![
                (EXTENSION_REQUEST, vec![empty.clone()]),
                (EXTENSION_REQUEST, vec![san.clone()]),
            ]),
            "more than once",
        ),
        // In a second value (Go reads only the first).
        (
            request(vec![(EXTENSION_REQUEST, vec![empty.clone(), san.clone()])]),
            "2 values",
        ),
        (request(vec![(EXTENSION_REQUEST, vec![])]), "0 values"),
        (
            request(vec![(EXTENSION_REQUEST, vec![other])]),
            "1.3.6.1.4.1.55555.1 (critical)",
        ),
        (
            request(vec![(CHALLENGE_PASSWORD, vec![element(0x0c, b"pw")])]),
            "challengePassword",
        ),
        // An extensionRequest value that is not a list of extensions (Go: an error).
        (
            request(vec![(EXTENSION_REQUEST, vec![element(0x05, &[])])]),
            "malformed",
        ),
    ];
    for (pem, want) in cases {
        refused(&pem, Part::Attributes, want);
    }
}
