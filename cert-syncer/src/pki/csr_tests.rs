//! The strict CSR reader: what it hands over (every RDN, every attribute with all its values),
//! and the DER it refuses where Go's `encoding/asn1` would read something.

use testkit::csr::{Atv, CN, EXTENSION_REQUEST, O, RawRequest, element};

use super::*;

#[test]
fn a_kubelet_request_reads_whole_and_its_signature_verifies() {
    let der = RawRequest::kubelet("n1").der();
    let request = CertificateRequest::parse(&der).unwrap();
    assert_eq!(request.subject.len(), 2);
    assert_eq!(request.subject[0][0].oid, OID_ORGANIZATION);
    assert_eq!(request.subject[0][0].value, b"system:nodes");
    assert_eq!(request.subject[1][0].oid, OID_COMMON_NAME);
    assert_eq!(request.subject[1][0].tag, 0x0c);
    assert_eq!(request.key_algorithm, "1.2.840.10045.2.1");
    assert!(request.attributes.is_empty());
    // rcgen's own requests read the same way.
    let rcgen = testkit::csr::certificate_request(
        &[("CN", "system:node:n1"), ("O", "system:nodes")],
        &["n1"],
        testkit::pki::KeyKind::Rsa2048,
    );
    let der = crate::pki::pem::sole_block(rcgen.as_bytes(), "CERTIFICATE REQUEST").unwrap();
    let request = CertificateRequest::parse(&der).unwrap();
    assert_eq!(request.key_algorithm, OID_RSA);
    let [attribute] = request.attributes.as_slice() else {
        panic!("{:?}", request.attributes)
    };
    assert_eq!(attribute.oid, OID_EXTENSION_REQUEST);
    let extensions = extensions(attribute.values[0]).unwrap();
    assert_eq!(extensions[0].oid, OID_SUBJECT_ALT_NAME);
}

#[test]
fn every_rdn_attribute_and_value_is_handed_over() {
    let mut raw = RawRequest::kubelet("n1");
    raw.subject
        .push(vec![Atv::utf8(CN, "system:node:n2"), Atv::utf8(O, "x")]);
    let value = element(0x30, &[]);
    raw.attributes = vec![
        (
            EXTENSION_REQUEST.to_owned(),
            vec![value.clone(), value.clone()],
        ),
        (EXTENSION_REQUEST.to_owned(), vec![value.clone()]),
        (
            "1.2.840.113549.1.9.7".to_owned(),
            vec![element(0x0c, b"pw")],
        ),
    ];
    let der = raw.der();
    let request = CertificateRequest::parse(&der).unwrap();
    assert_eq!(request.subject[2].len(), 2, "the multi-valued RDN, whole");
    let values: Vec<usize> = request.attributes.iter().map(|a| a.values.len()).collect();
    assert_eq!(values, [2, 1, 1]);
    assert_eq!(request.attributes[0].values[1], value.as_slice());
}

#[test]
fn what_go_reads_leniently_is_malformed_here() {
    // An element after the attributes (Go: "extra bytes at the end of the SEQUENCE" allowed).
    let mut raw = RawRequest::kubelet("n1");
    raw.info_trailer = element(0x05, &[]);
    let err = CertificateRequest::parse(&raw.der()).unwrap_err();
    assert!(err.contains("more elements"), "{err}");
    // Trailing bytes after the request.
    let mut der = RawRequest::kubelet("n1").der();
    der.push(0);
    assert!(
        CertificateRequest::parse(&der)
            .unwrap_err()
            .contains("more elements")
    );
    // Version 1 (Go does not check it).
    let mut raw = RawRequest::kubelet("n1");
    raw.version = 1;
    assert!(
        CertificateRequest::parse(&raw.der())
            .unwrap_err()
            .contains("version")
    );
    // A flipped bit in the signature.
    let mut der = RawRequest::kubelet("n1").der();
    let last = der.len() - 1;
    der[last] ^= 1;
    assert!(
        CertificateRequest::parse(&der)
            .unwrap_err()
            .contains("signature")
    );
}

#[test]
fn der_is_read_strictly() {
    let der = RawRequest::kubelet("n1").der();
    // Indefinite length.
    let mut ber = der.clone();
    ber[1] = 0x80;
    assert!(
        CertificateRequest::parse(&ber)
            .unwrap_err()
            .contains("indefinite")
    );
    // A long-form length with a leading zero byte (the outer length is 0x81/0x82 LL...).
    let (header, len) = match der[1] {
        0x81 => (3, usize::from(der[2])),
        0x82 => (4, usize::from(der[2]) << 8 | usize::from(der[3])),
        other => panic!("length byte {other:#x}"),
    };
    let mut padded = vec![0x30, 0x83, 0x00];
    padded.extend_from_slice(&(len as u16).to_be_bytes());
    padded.extend_from_slice(&der[header..]);
    assert!(
        CertificateRequest::parse(&padded)
            .unwrap_err()
            .contains("leading zero")
    );
    // Truncated.
    assert!(
        CertificateRequest::parse(&der[..der.len() - 3])
            .unwrap_err()
            .contains("truncated")
    );
    assert!(CertificateRequest::parse(&[]).is_err());
    // OIDs with a non-minimal arc.
    assert!(oid_string(&[0x55, 0x04, 0x03]).is_ok());
    assert!(oid_string(&[0x55, 0x80, 0x04]).is_err());
    assert!(oid_string(&[0x55, 0x84]).is_err());
    assert_eq!(
        oid_string(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x0e]).unwrap(),
        OID_EXTENSION_REQUEST
    );
}
