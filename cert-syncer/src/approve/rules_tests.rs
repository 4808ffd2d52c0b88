//! One test per rule of [`super::decide`]: the CSR that passes every rule is approved, and each
//! refusal changes exactly one thing about it.

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
};
use testkit::csr::certificate_request;
use testkit::pki::KeyKind;

use super::*;

const NODE: &str = "master-0";

fn policy() -> Policy {
    Policy {
        node_name: NODE.to_owned(),
        bootstrap_users: vec!["kubelet-bootstrap".to_owned()],
    }
}

fn kubelet_request() -> String {
    certificate_request(
        &[("O", "system:nodes"), ("CN", "system:node:master-0")],
        &[],
        KeyKind::EcdsaP256,
    )
}

fn csr(request: &str) -> CertificateSigningRequest {
    CertificateSigningRequest {
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.as_bytes().to_vec()),
            signer_name: SIGNER.to_owned(),
            usages: Some(
                ["digital signature", "key encipherment", "client auth"]
                    .map(str::to_owned)
                    .to_vec(),
            ),
            username: Some("system:bootstrap:abcdef".to_owned()),
            groups: Some(vec![
                "system:bootstrappers".to_owned(),
                "system:authenticated".to_owned(),
            ]),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn good() -> CertificateSigningRequest {
    csr(&kubelet_request())
}

const EXPIRED: KubeletCert = KubeletCert::Expired { not_after: 1 };

fn refused(csr: &CertificateSigningRequest, disk: &KubeletCert, want: &str) {
    match decide(csr, &policy(), disk) {
        Decision::Leave(reason) => assert!(reason.contains(want), "{want:?} not in {reason:?}"),
        Decision::Approve(message) => panic!("approved ({message}); wanted a refusal: {want}"),
    }
}

#[test]
fn the_kubelet_s_bootstrap_csr_is_approved_while_its_certificate_is_expired_or_absent() {
    for disk in [EXPIRED, KubeletCert::Absent] {
        let Decision::Approve(message) = decide(&good(), &policy(), &disk) else {
            panic!("{disk:?}: not approved")
        };
        assert!(
            message.contains("system:bootstrap:abcdef")
                && message.contains("CN=system:node:master-0"),
            "{message}"
        );
    }
    // An RSA key with the three usages (the 1.20 kubelet's shape for RSA).
    let rsa = csr(&certificate_request(
        &[("CN", "system:node:master-0"), ("O", "system:nodes")],
        &[],
        KeyKind::Rsa2048,
    ));
    assert!(matches!(
        decide(&rsa, &policy(), &EXPIRED),
        Decision::Approve(_)
    ));
}

#[test]
fn the_node_itself_and_a_configured_bootstrap_user_may_request() {
    let mut csr = good();
    csr.spec.username = Some("system:node:master-0".to_owned());
    csr.spec.groups = Some(vec!["system:nodes".to_owned()]);
    assert!(matches!(
        decide(&csr, &policy(), &EXPIRED),
        Decision::Approve(_)
    ));
    csr.spec.username = Some("kubelet-bootstrap".to_owned());
    csr.spec.groups = Some(vec![]);
    assert!(matches!(
        decide(&csr, &policy(), &EXPIRED),
        Decision::Approve(_)
    ));
}

#[test]
fn a_valid_or_unknown_certificate_on_disk_approves_nothing() {
    refused(
        &good(),
        &KubeletCert::Valid {
            not_after: i64::MAX / 2,
        },
        "not a recovery",
    );
    refused(
        &good(),
        &KubeletCert::Unknown("no CERTIFICATE block".to_owned()),
        "cannot tell",
    );
}

#[test]
fn another_node_is_refused() {
    let other = csr(&certificate_request(
        &[("O", "system:nodes"), ("CN", "system:node:master-1")],
        &[],
        KeyKind::EcdsaP256,
    ));
    refused(&other, &EXPIRED, "another node");
    // The node's own name as a requester does not help another node's subject either.
    let mut as_us = other.clone();
    as_us.spec.username = Some("system:node:master-0".to_owned());
    as_us.spec.groups = Some(vec!["system:nodes".to_owned()]);
    refused(&as_us, &EXPIRED, "another node");
}

#[test]
fn another_signer_is_refused() {
    for signer in [
        "kubernetes.io/kube-apiserver-client",
        "kubernetes.io/kubelet-serving",
        "example.com/kube-apiserver-client-kubelet",
    ] {
        let mut csr = good();
        csr.spec.signer_name = signer.to_owned();
        refused(
            &csr,
            &EXPIRED,
            "is not kubernetes.io/kube-apiserver-client-kubelet",
        );
    }
}

#[test]
fn extra_or_missing_usages_are_refused() {
    let cases: &[&[&str]] = &[
        &[
            "digital signature",
            "key encipherment",
            "client auth",
            "server auth",
        ],
        &[
            "digital signature",
            "key encipherment",
            "client auth",
            "cert sign",
        ],
        &["digital signature", "key encipherment"],
        &["key encipherment", "client auth"],
        &["client auth"],
        &[],
    ];
    for usages in cases {
        let mut csr = good();
        csr.spec.usages = Some(usages.iter().map(|u| (*u).to_owned()).collect());
        refused(&csr, &EXPIRED, "are not the kubelet's");
    }
    // Without key encipherment: newer kubelets' ECDSA shape is accepted, for an RSA key not.
    let mut ecdsa = good();
    ecdsa.spec.usages = Some(vec![
        "digital signature".to_owned(),
        "client auth".to_owned(),
    ]);
    assert!(matches!(
        decide(&ecdsa, &policy(), &EXPIRED),
        Decision::Approve(_)
    ));
    let mut rsa = csr(&certificate_request(
        &[("CN", "system:node:master-0"), ("O", "system:nodes")],
        &[],
        KeyKind::Rsa2048,
    ));
    rsa.spec.usages = ecdsa.spec.usages.clone();
    refused(&rsa, &EXPIRED, "are not the kubelet's");
}

#[test]
fn an_extra_subject_field_a_wrong_organization_or_a_san_is_refused() {
    // (subject, DNS SANs, the refusal's words)
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], &'a str);
    let cases: &[Case<'_>] = &[
        (
            &[
                ("O", "system:nodes"),
                ("CN", "system:node:master-0"),
                ("OU", "x"),
            ],
            &[],
            "other than CN and O",
        ),
        (
            &[
                ("O", "system:nodes"),
                ("CN", "system:node:master-0"),
                ("C", "US"),
            ],
            &[],
            "other than CN and O",
        ),
        (
            &[("O", "system:masters"), ("CN", "system:node:master-0")],
            &[],
            "subject O",
        ),
        (&[("CN", "system:node:master-0")], &[], "subject O"),
        (&[("O", "system:nodes")], &[], "subject CN"),
        (
            &[("O", "system:nodes"), ("CN", "system:node:master-0")],
            &["master-0"],
            "subject alternative names",
        ),
    ];
    for (subject, sans, want) in cases {
        let csr = csr(&certificate_request(subject, sans, KeyKind::EcdsaP256));
        refused(&csr, &EXPIRED, want);
    }
}

#[test]
fn any_other_requested_extension_is_refused() {
    let request = testkit::csr::certificate_request_with_extension(
        &[("O", "system:nodes"), ("CN", "system:node:master-0")],
        KeyKind::EcdsaP256,
    );
    refused(&csr(&request), &EXPIRED, "asks for extensions");
}

#[test]
fn a_request_that_is_not_a_signed_pkcs10_is_refused() {
    refused(&csr("garbage"), &EXPIRED, "not PEM");
    let cert = testkit::pki::Ca::new("x").client("system:node:master-0");
    refused(&csr(&cert.cert_pem), &EXPIRED, "not CERTIFICATE REQUEST");
    // A flipped byte in the signature: the requester does not hold the key.
    let pem = ::pem::parse(kubelet_request()).unwrap();
    let mut der = pem.contents().to_vec();
    let last = der.len() - 1;
    der[last] ^= 1;
    let tampered = ::pem::encode(&::pem::Pem::new("CERTIFICATE REQUEST", der));
    refused(&csr(&tampered), &EXPIRED, "request");
}

#[test]
fn another_requester_is_refused() {
    let cases: &[(&str, &[&str])] = &[
        (
            "system:serviceaccount:default:builder",
            &["system:serviceaccounts"],
        ),
        ("alice", &["system:authenticated"]),
        // A bootstrap-looking name without the group, or a malformed token id.
        ("system:bootstrap:abcdef", &["system:authenticated"]),
        ("system:bootstrap:ABCDEF", &["system:bootstrappers"]),
        ("system:bootstrap:abc", &["system:bootstrappers"]),
        // Another node, or this node's name outside system:nodes.
        ("system:node:master-1", &["system:nodes"]),
        ("system:node:master-0", &["system:authenticated"]),
    ];
    for (user, groups) in cases {
        let mut csr = good();
        csr.spec.username = Some((*user).to_owned());
        csr.spec.groups = Some(groups.iter().map(|g| (*g).to_owned()).collect());
        refused(
            &csr,
            &EXPIRED,
            "neither the bootstrap identity nor this node",
        );
    }
}

#[test]
fn an_approved_denied_failed_or_issued_csr_is_left_alone() {
    for (kind, want) in [
        ("Approved", "already approved"),
        ("Denied", "already denied"),
        ("Failed", "already failed"),
    ] {
        let mut csr = good();
        csr.status = Some(CertificateSigningRequestStatus {
            conditions: Some(vec![CertificateSigningRequestCondition {
                type_: kind.to_owned(),
                status: "True".to_owned(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        refused(&csr, &EXPIRED, want);
    }
    let mut issued = good();
    issued.status = Some(CertificateSigningRequestStatus {
        certificate: Some(ByteString(b"x".to_vec())),
        ..Default::default()
    });
    refused(&issued, &EXPIRED, "already issued");
}
