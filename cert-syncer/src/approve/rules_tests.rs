//! One test per rule of [`super::decide`]: the CSR that passes every rule is approved, and each
//! refusal changes exactly one thing about it. The request's own reading (PEM framing, DER,
//! subject, attributes) is tested case by case in `request_tests.rs`; here each part maps to its
//! refusal kind.

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use testkit::csr::{RawRequest, certificate_request};
use testkit::pki::KeyKind;

use super::*;

const NODE: &str = "master-0";
/// The kubelet's certificate on disk expired at NOT_AFTER; requests come at NOW.
const NOT_AFTER: i64 = 1_700_000_000;
const NOW: i64 = NOT_AFTER + 3600;
const FINGERPRINT: &str = "ab12";

fn expired() -> KubeletCert {
    KubeletCert::Expired {
        not_after: NOT_AFTER,
        fingerprint: FINGERPRINT.to_owned(),
    }
}

fn policy() -> Policy {
    Policy {
        node_name: NODE.to_owned(),
        bootstrap_users: vec![
            BootstrapUser::new(
                "system:serviceaccount:openshift-machine-config-operator:node-bootstrapper",
                &[],
            )
            .unwrap(),
        ],
        clock_skew: CLOCK_SKEW,
    }
}

fn kubelet_request() -> String {
    RawRequest::kubelet(NODE).pem()
}

fn csr(request: &str) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some("csr-x".to_owned()),
            creation_timestamp: Some(at(NOW - 60)),
            ..Default::default()
        },
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

fn at(unix: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(unix).unwrap())
}

fn good() -> CertificateSigningRequest {
    csr(&kubelet_request())
}

fn created(mut csr: CertificateSigningRequest, unix: i64) -> CertificateSigningRequest {
    csr.metadata.creation_timestamp = Some(at(unix));
    csr
}

/// Decides about `csrs` (named `csr-0`, `csr-1`...).
fn decide_many(
    csrs: &[CertificateSigningRequest],
    disk: &KubeletCert,
    remembered: Option<&str>,
) -> Vec<Decision> {
    let map: BTreeMap<String, CertificateSigningRequest> = csrs
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("csr-{i}"), c.clone()))
        .collect();
    decide(&map, &policy(), disk, remembered, NOW)
        .into_values()
        .collect()
}

fn decide_one(csr: &CertificateSigningRequest, disk: &KubeletCert) -> Decision {
    decide_many(std::slice::from_ref(csr), disk, None).remove(0)
}

fn refused_as(csr: &CertificateSigningRequest, disk: &KubeletCert, kind: Kind, want: &str) {
    match decide_one(csr, disk) {
        Decision::Leave(refusal) => {
            assert_eq!(refusal.kind, kind, "{refusal:?}");
            assert!(refusal.text.contains(want), "{want:?} not in {refusal:?}");
        }
        Decision::Approve(message) => panic!("approved ({message}); wanted a refusal: {want}"),
    }
}

fn approved(decision: &Decision) -> &str {
    match decision {
        Decision::Approve(message) => message,
        Decision::Leave(refusal) => panic!("refused: {refusal:?}"),
    }
}

#[test]
fn the_kubelet_s_bootstrap_csr_is_approved_with_the_request_described_as_read() {
    let decision = decide_one(&good(), &expired());
    let message = approved(&decision);
    for part in [
        "subject O=system:nodes, CN=system:node:master-0",
        "ECDSA key",
        "usages digital signature, key encipherment, client auth",
        "the bootstrap token \"system:bootstrap:abcdef\"",
        "(sha256:ab12) is expired at 2023-11-14T22:13:20Z",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    // Absent: since the directory's last change.
    let absent = KubeletCert::Absent { since: NOT_AFTER };
    assert!(
        approved(&decide_one(&good(), &absent)).contains("is absent since 2023-11-14T22:13:20Z")
    );
    // An RSA key with the three usages (the 1.20 kubelet's shape for RSA).
    let rsa = csr(&certificate_request(
        &[("CN", "system:node:master-0"), ("O", "system:nodes")],
        &[],
        KeyKind::Rsa2048,
    ));
    assert!(approved(&decide_one(&rsa, &expired())).contains("RSA key"));
}

#[test]
fn each_part_of_the_request_maps_to_its_refusal() {
    refused_as(&csr("garbage"), &expired(), Kind::Request, "no PEM block");
    let two = format!(
        "x{}{}",
        kubelet_request(),
        RawRequest::kubelet("master-1").pem()
    );
    refused_as(&csr(&two), &expired(), Kind::Request, "text around");
    let other = csr(&RawRequest::kubelet("master-1").pem());
    refused_as(&other, &expired(), Kind::Subject, "another node");
    let san = csr(&certificate_request(
        &[("O", "system:nodes"), ("CN", "system:node:master-0")],
        &["master-0"],
        KeyKind::EcdsaP256,
    ));
    refused_as(
        &san,
        &expired(),
        Kind::Attributes,
        "subject alternative names",
    );
    let extension = csr(&testkit::csr::certificate_request_with_extension(
        &[("O", "system:nodes"), ("CN", "system:node:master-0")],
        KeyKind::EcdsaP256,
    ));
    refused_as(
        &extension,
        &expired(),
        Kind::Attributes,
        "asks for extensions",
    );
    let cert = testkit::pki::Ca::new("x").client("system:node:master-0");
    refused_as(
        &csr(&cert.cert_pem),
        &expired(),
        Kind::Request,
        "not CERTIFICATE REQUEST",
    );
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
        refused_as(
            &csr,
            &expired(),
            Kind::Signer,
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
        refused_as(&csr, &expired(), Kind::Usages, "are not the kubelet's");
    }
    // Without key encipherment: newer kubelets' ECDSA shape is accepted, for an RSA key not.
    let mut ecdsa = good();
    ecdsa.spec.usages = Some(vec![
        "digital signature".to_owned(),
        "client auth".to_owned(),
    ]);
    approved(&decide_one(&ecdsa, &expired()));
    let mut rsa = RawRequest::kubelet(NODE);
    rsa.key = KeyKind::Rsa2048;
    let mut rsa = csr(&rsa.pem());
    rsa.spec.usages = ecdsa.spec.usages.clone();
    refused_as(&rsa, &expired(), Kind::Usages, "are not the kubelet's");
}

#[test]
fn the_requester_and_its_groups_are_checked() {
    let node_bootstrapper =
        "system:serviceaccount:openshift-machine-config-operator:node-bootstrapper";
    let sa_groups = [
        "system:serviceaccounts",
        "system:serviceaccounts:openshift-machine-config-operator",
        "system:authenticated",
    ];
    let accepted: &[(&str, &[&str])] = &[
        (node_bootstrapper, &sa_groups),
        (
            "system:bootstrap:abcdef",
            &["system:bootstrappers", "system:authenticated"],
        ),
        (
            "system:bootstrap:abcdef",
            &[
                "system:bootstrappers",
                "system:bootstrappers:worker",
                "system:authenticated",
            ],
        ),
        (
            "system:node:master-0",
            &["system:nodes", "system:authenticated"],
        ),
    ];
    for (user, groups) in accepted {
        let mut csr = good();
        csr.spec.username = Some((*user).to_owned());
        csr.spec.groups = Some(groups.iter().map(|g| (*g).to_owned()).collect());
        approved(&decide_one(&csr, &expired()));
    }
    let refused: &[(&str, &[&str], &str)] = &[
        (
            "system:serviceaccount:default:builder",
            &["system:serviceaccounts"],
            "neither",
        ),
        ("alice", &["system:authenticated"], "neither"),
        // A bootstrap-looking name without the group, with another group, or a bad token id.
        (
            "system:bootstrap:abcdef",
            &["system:authenticated"],
            "neither",
        ),
        (
            "system:bootstrap:abcdef",
            &["system:bootstrappers", "system:masters"],
            "neither",
        ),
        (
            "system:bootstrap:ABCDEF",
            &["system:bootstrappers"],
            "neither",
        ),
        ("system:bootstrap:abc", &["system:bootstrappers"], "neither"),
        // The node-bootstrapper's name with other groups (another authenticator's user).
        (
            node_bootstrapper,
            &["system:authenticated"],
            "groups must be exactly",
        ),
        (
            node_bootstrapper,
            &[sa_groups[0], sa_groups[1], sa_groups[2], "system:masters"],
            "groups must be exactly",
        ),
        // Another node, or this node's name outside system:nodes or with more groups.
        (
            "system:node:master-1",
            &["system:nodes", "system:authenticated"],
            "neither",
        ),
        ("system:node:master-0", &["system:authenticated"], "neither"),
        (
            "system:node:master-0",
            &["system:nodes", "system:masters", "system:authenticated"],
            "neither",
        ),
    ];
    for (user, groups, want) in refused {
        let mut csr = good();
        csr.spec.username = Some((*user).to_owned());
        csr.spec.groups = Some(groups.iter().map(|g| (*g).to_owned()).collect());
        refused_as(&csr, &expired(), Kind::Requester, want);
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
        refused_as(&csr, &expired(), Kind::Decided, want);
    }
    let mut issued = good();
    issued.status = Some(CertificateSigningRequestStatus {
        certificate: Some(ByteString(b"x".to_vec())),
        ..Default::default()
    });
    refused_as(&issued, &expired(), Kind::Decided, "already issued");
}

#[test]
fn a_valid_or_unknown_certificate_on_disk_approves_nothing() {
    let valid = KubeletCert::Valid {
        not_after: NOW + 86400,
    };
    refused_as(&good(), &valid, Kind::NotARecovery, "not a recovery");
    let unknown = KubeletCert::Unknown("its directory is missing".to_owned());
    refused_as(&good(), &unknown, Kind::CannotTell, "cannot tell");
}

#[test]
fn only_requests_made_in_this_recovery_are_approved() {
    // Made before the certificate expired (less the margin): an old request waiting for it.
    let not_after = NOW - 600;
    let disk = KubeletCert::Expired {
        not_after,
        fingerprint: FINGERPRINT.to_owned(),
    };
    let early = created(good(), not_after - CLOCK_SKEW - 1);
    refused_as(
        &early,
        &disk,
        Kind::Window,
        "before the kubelet's certificate on disk expired",
    );
    approved(&decide_one(&created(good(), not_after - CLOCK_SKEW), &disk));
    // Older than the kubelet waits (15 min, plus the margin).
    let stale = created(good(), NOW - MAX_AGE - CLOCK_SKEW - 1);
    refused_as(&stale, &expired(), Kind::Window, "has given up on it");
    approved(&decide_one(
        &created(good(), NOW - MAX_AGE - CLOCK_SKEW),
        &expired(),
    ));
    // Absent: before the directory changed.
    let absent = KubeletCert::Absent { since: NOW - 120 };
    refused_as(
        &created(good(), NOW - 120 - CLOCK_SKEW - 1),
        &absent,
        Kind::Window,
        "went absent",
    );
    // No creation time.
    let mut timeless = good();
    timeless.metadata.creation_timestamp = None;
    refused_as(&timeless, &expired(), Kind::Window, "no creation time");
}

/// `csr` approved as we approve, for the certificate `key`.
fn approved_by_us(mut csr: CertificateSigningRequest, key: &str) -> CertificateSigningRequest {
    csr.status = Some(CertificateSigningRequestStatus {
        conditions: Some(vec![CertificateSigningRequestCondition {
            type_: "Approved".to_owned(),
            status: "True".to_owned(),
            reason: Some(REASON.to_owned()),
            message: Some(format!("... on disk ({key}) is expired at ...")),
            ..Default::default()
        }]),
        ..Default::default()
    });
    csr
}

#[test]
fn one_approval_per_certificate_on_disk_the_newest_request() {
    // Two at once: the newest (the live kubelet's) is approved, the other left alone.
    let decisions = decide_many(
        &[created(good(), NOW - 200), created(good(), NOW - 100)],
        &expired(),
        None,
    );
    let Decision::Leave(older) = &decisions[0] else {
        panic!("{decisions:?}")
    };
    assert_eq!(older.kind, Kind::OnePerCertificate);
    assert!(
        older.text.contains("csr-1 is the one for sha256:ab12"),
        "{older:?}"
    );
    approved(&decisions[1]);

    // Approved before for this certificate (read from the CSR we approved): no second one.
    let key = format!("sha256:{FINGERPRINT}");
    let decisions = decide_many(&[approved_by_us(good(), &key), good()], &expired(), None);
    let Decision::Leave(second) = &decisions[1] else {
        panic!("{decisions:?}")
    };
    assert!(second.text.contains("csr-0 is the one"), "{second:?}");
    // ...or remembered, the approved CSR gone.
    let decisions = decide_many(&[good()], &expired(), Some("csr-gone"));
    assert!(matches!(&decisions[0], Decision::Leave(r) if r.kind == Kind::OnePerCertificate));
    // Approved for an earlier certificate, by a human, or for another node: no bar.
    let mut by_human = approved_by_us(good(), &key);
    if let Some(c) = by_human.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        c[0].reason = Some("KubectlApprove".to_owned());
    }
    let other_node = approved_by_us(csr(&RawRequest::kubelet("master-1").pem()), &key);
    for earlier in [approved_by_us(good(), "sha256:0ld"), by_human, other_node] {
        let decisions = decide_many(&[earlier, good()], &expired(), None);
        approved(&decisions[1]);
    }
}

#[test]
fn a_flood_of_pending_requests_approves_none() {
    let many: Vec<_> = (0..=MAX_PENDING as i64)
        .map(|i| created(good(), NOW - 60 - i))
        .collect();
    for decision in decide_many(&many, &expired(), None) {
        assert!(
            matches!(&decision, Decision::Leave(r) if r.kind == Kind::TooManyPending),
            "{decision:?}"
        );
    }
    let decisions = decide_many(&many[..MAX_PENDING], &expired(), None);
    assert_eq!(
        decisions
            .iter()
            .filter(|d| matches!(d, Decision::Approve(_)))
            .count(),
        1
    );
    // Refused requests do not count toward the flood.
    let mut mixed = many[..MAX_PENDING].to_vec();
    mixed.push(csr(&RawRequest::kubelet("master-1").pem()));
    assert_eq!(
        decide_many(&mixed, &expired(), None)
            .iter()
            .filter(|d| matches!(d, Decision::Approve(_)))
            .count(),
        1
    );
}
