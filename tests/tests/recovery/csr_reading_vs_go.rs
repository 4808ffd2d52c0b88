//! Our reading of CSRs against Go's, over hand-made and generated odd requests (issue 35): each
//! request is created in the real kube-apiserver 1.20 (whose validation reads it with Go's
//! `pem.Decode` and `x509.ParseCertificateRequest` and checks its signature, as
//! kube-controller-manager's signer will), and `kubectl describe csr` prints what Go read.
//!
//! Asserted for every request:
//! - whenever the approver's reading (`cert_syncer::kubelet_csr::kubelet_request`) accepts it as
//!   node-x's kubelet request, kube-apiserver accepted it and Go read exactly that: subject
//!   `CN=system:node:node-x`, `O=system:nodes` and nothing else, no SAN (so every request the
//!   API rejects, we reject too);
//! - whenever kube-apiserver accepted it, the first block our PEM reader
//!   (`cert_syncer::kubelet_csr::go_first_block`, the reader every certificate and bundle reader
//!   uses) finds is the one Go read: a `CERTIFICATE REQUEST` whose subject, read Go's way (last
//!   CN, every O), is the subject kubectl prints.
//!
//! The generated requests combine a DER variant (subject shapes, string types, attributes,
//! elements Go ignores) with a PEM variant (text around, several blocks, line ends, headers,
//! blanks in the base64), drawn from a fixed seed. Real kube-apiserver only; Go's view needs
//! `kubectl` (both skip with a printed reason).

mod our_csr_reading_agrees_with_go_s {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real() {
        super::differential().await;
    }
}

use std::collections::BTreeMap;

use e2e::envtest::{RealApiServer, RealOptions};
use e2e::{install_crypto_provider, require_real_apiserver};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use testkit::csr::{
    Atv, BMP_STRING, CHALLENGE_PASSWORD, CN, EXTENSION_REQUEST, IA5_STRING, O, OU,
    PRINTABLE_STRING, RawRequest, SUBJECT_ALT_NAME, T61_STRING, dns_names, element,
    extension_request_value,
};

const NODE: &str = "node-x";
/// Generated requests (besides the hand-made ones).
const GENERATED: usize = 160;
/// The generator's seed (fixed: a failure reproduces).
const SEED: u64 = 0x35_35_35_35;

/// One DER variant: a name and the request.
type DerVariant = (&'static str, fn() -> RawRequest);

fn ders() -> Vec<DerVariant> {
    fn kubelet() -> RawRequest {
        RawRequest::kubelet(NODE)
    }
    fn with_attributes(attributes: Vec<(&str, Vec<Vec<u8>>)>) -> RawRequest {
        let mut raw = kubelet();
        raw.attributes = attributes
            .into_iter()
            .map(|(oid, values)| (oid.to_owned(), values))
            .collect();
        raw
    }
    fn san() -> Vec<u8> {
        extension_request_value(&[(SUBJECT_ALT_NAME, false, dns_names(&["node-x.example"]))])
    }
    fn retyped(tag: u8) -> RawRequest {
        let mut raw = kubelet();
        for rdn in &mut raw.subject {
            rdn[0].tag = tag;
            if tag == BMP_STRING {
                let text = String::from_utf8(rdn[0].value.clone()).unwrap();
                rdn[0].value = text.encode_utf16().flat_map(u16::to_be_bytes).collect();
            }
        }
        raw
    }
    vec![
        ("kubelet", kubelet),
        ("kubelet-reversed", || {
            let mut raw = kubelet();
            raw.subject.reverse();
            raw
        }),
        ("printable", || retyped(PRINTABLE_STRING)),
        ("ia5", || retyped(IA5_STRING)),
        ("bmp", || retyped(BMP_STRING)),
        ("t61", || retyped(T61_STRING)),
        ("two-cns-other-last", || {
            let mut raw = kubelet();
            raw.subject.push(vec![Atv::utf8(CN, "system:node:node-y")]);
            raw
        }),
        ("two-cns-ours-last", || {
            let mut raw = kubelet();
            raw.subject
                .insert(0, vec![Atv::utf8(CN, "system:node:node-y")]);
            raw
        }),
        ("two-os", || {
            let mut raw = kubelet();
            raw.subject.push(vec![Atv::utf8(O, "system:masters")]);
            raw
        }),
        ("multi-valued-rdn", || {
            let mut raw = kubelet();
            let cn = raw.subject.remove(1);
            raw.subject[0].extend(cn);
            raw
        }),
        ("ou", || {
            let mut raw = kubelet();
            raw.subject.push(vec![Atv::utf8(OU, "x")]);
            raw
        }),
        ("other-node", || RawRequest::kubelet("node-y")),
        ("version-1", || {
            let mut raw = kubelet();
            raw.version = 1;
            raw
        }),
        ("trailing-element", || {
            let mut raw = kubelet();
            raw.info_trailer = element(0x05, &[]);
            raw
        }),
        ("empty-extension-request", || {
            with_attributes(vec![(
                EXTENSION_REQUEST,
                vec![extension_request_value(&[])],
            )])
        }),
        ("san", || {
            with_attributes(vec![(EXTENSION_REQUEST, vec![san()])])
        }),
        ("san-in-second-attribute", || {
            with_attributes(vec![
                (EXTENSION_REQUEST, vec![extension_request_value(&[])]),
                (EXTENSION_REQUEST, vec![san()]),
            ])
        }),
        ("san-in-second-value", || {
            with_attributes(vec![(
                EXTENSION_REQUEST,
                vec![extension_request_value(&[]), san()],
            )])
        }),
        ("critical-unknown-extension", || {
            with_attributes(vec![(
                EXTENSION_REQUEST,
                vec![extension_request_value(&[(
                    "1.3.6.1.4.1.55555.1",
                    true,
                    vec![0x05, 0x00],
                )])],
            )])
        }),
        ("two-san-extensions", || {
            with_attributes(vec![(
                EXTENSION_REQUEST,
                vec![extension_request_value(&[
                    (SUBJECT_ALT_NAME, false, dns_names(&["a.example"])),
                    (SUBJECT_ALT_NAME, false, dns_names(&["b.example"])),
                ])],
            )])
        }),
        ("challenge-password", || {
            with_attributes(vec![(CHALLENGE_PASSWORD, vec![element(0x0c, b"pw")])])
        }),
        ("garbage-attribute-value", || {
            with_attributes(vec![(EXTENSION_REQUEST, vec![element(0x05, &[])])])
        }),
    ]
}

/// One PEM variant: a name and how it frames the request's DER (the other node's request at
/// hand for the variants with two blocks).
type PemVariant = (&'static str, fn(&[u8], &[u8]) -> String);

fn pem_of(der: &[u8]) -> String {
    testkit::csr::request_pem(der)
}

fn body_lines(der: &[u8], width: usize, sep: &str) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    b64.as_bytes()
        .chunks(width)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect::<Vec<_>>()
        .join(sep)
}

fn framed(label: &str, body: &str) -> String {
    format!("-----BEGIN {label}-----\n{body}\n-----END {label}-----\n")
}

fn pems() -> Vec<PemVariant> {
    vec![
        ("canonical", |der, _| pem_of(der)),
        ("blank-lines-around", |der, _| {
            format!("\n \t\n{}\n\n", pem_of(der))
        }),
        ("no-final-newline", |der, _| {
            pem_of(der).trim_end().to_owned()
        }),
        ("one-line", |der, _| {
            framed("CERTIFICATE REQUEST", &body_lines(der, 100_000, "\n"))
        }),
        ("76-columns", |der, _| {
            framed("CERTIFICATE REQUEST", &body_lines(der, 76, "\n"))
        }),
        ("crlf", |der, _| pem_of(der).replace('\n', "\r\n")),
        ("cr-after-begin", |der, _| {
            pem_of(der).replacen('\n', "\r", 1)
        }),
        ("cr-in-body", |der, _| {
            framed("CERTIFICATE REQUEST", &body_lines(der, 64, "\r"))
        }),
        ("cr-after-end", |der, _| {
            format!("{}\r", pem_of(der).trim_end())
        }),
        ("text-before", |der, _| format!("junk\n{}", pem_of(der))),
        ("text-after", |der, _| format!("{}junk\n", pem_of(der))),
        ("begin-mid-line", |der, _| format!("x{}", pem_of(der))),
        ("leading-space", |der, _| format!(" {}", pem_of(der))),
        ("second-block-after", |der, other| {
            format!("{}{}", pem_of(der), pem_of(other))
        }),
        ("second-block-before", |der, other| {
            format!("{}{}", pem_of(other), pem_of(der))
        }),
        ("mid-line-then-other", |der, other| {
            format!("x{}{}", pem_of(der), pem_of(other))
        }),
        ("broken-then-other", |der, other| {
            format!("{}{}", pem_of(der).replacen("\nM", "\n!", 1), pem_of(other))
        }),
        ("torn-then-other", |der, other| {
            format!(
                "-----BEGIN CERTIFICATE REQUEST-----\n{}\n{}",
                &body_lines(der, 64, "\n")[..40],
                pem_of(other)
            )
        }),
        ("headers", |der, _| {
            pem_of(der).replacen("-----\n", "-----\nProc-Type: 4,ENCRYPTED\n", 1)
        }),
        ("blank-line-after-headers", |der, _| {
            pem_of(der).replacen("-----\n", "-----\nX: y\n\n", 1)
        }),
        ("spaces-in-base64", |der, _| {
            framed("CERTIFICATE REQUEST", &body_lines(der, 8, " "))
        }),
        ("tabs-in-base64", |der, _| {
            framed("CERTIFICATE REQUEST", &body_lines(der, 16, "\t\n"))
        }),
        ("empty-line-in-body", |der, _| {
            framed("CERTIFICATE REQUEST", &body_lines(der, 64, "\n\n"))
        }),
        ("blanks-after-begin", |der, _| {
            pem_of(der).replacen("-----\n", "----- \t\n", 1)
        }),
        ("blanks-after-end", |der, _| {
            format!("{} \t\n", pem_of(der).trim_end())
        }),
        ("new-label", |der, _| {
            pem_of(der).replace("CERTIFICATE REQUEST", "NEW CERTIFICATE REQUEST")
        }),
        ("certificate-label", |der, _| {
            pem_of(der).replace("CERTIFICATE REQUEST", "CERTIFICATE")
        }),
        ("end-label-mismatch", |der, _| {
            pem_of(der).replacen("END CERTIFICATE REQUEST", "END CERTIFICATE", 1)
        }),
        ("unused-bits-set", |der, _| {
            // The last base64 character before the padding with its unused bits set: Go
            // decodes the same bytes; no encoder writes it.
            let body = body_lines(der, 64, "\n");
            let trimmed = body.trim_end_matches('=');
            let pad = body.len() - trimmed.len();
            if pad == 0 {
                return framed("CERTIFICATE REQUEST", &body);
            }
            let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            let last = trimmed.as_bytes()[trimmed.len() - 1];
            let index = alphabet.iter().position(|c| *c == last).unwrap();
            let mask = if pad == 1 { 0b11 } else { 0b1111 };
            let odd = alphabet[index | mask] as char;
            framed(
                "CERTIFICATE REQUEST",
                &format!("{}{odd}{}", &trimmed[..trimmed.len() - 1], "=".repeat(pad)),
            )
        }),
    ]
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// The requests: every DER variant framed canonically, every PEM variant of the kubelet's
/// request, then [`GENERATED`] random pairs (half of them with a canonical side, so that
/// acceptances occur).
fn requests() -> Vec<(String, String)> {
    let ders = ders();
    let pems = pems();
    let other = RawRequest::kubelet("node-y").der();
    let mut out = Vec::new();
    for (name, build) in &ders {
        out.push((format!("der {name}"), pem_of(&build().der())));
    }
    for (name, frame) in &pems {
        out.push((
            format!("pem {name}"),
            frame(&RawRequest::kubelet(NODE).der(), &other),
        ));
    }
    let mut rng = Rng(SEED);
    for _ in 0..GENERATED {
        let (der_name, build) = if rng.below(2) == 0 {
            &ders[0]
        } else {
            &ders[rng.below(ders.len())]
        };
        let (pem_name, frame) = if rng.below(2) == 0 {
            &pems[0]
        } else {
            &pems[rng.below(pems.len())]
        };
        out.push((
            format!("{der_name} / {pem_name}"),
            frame(&build().der(), &other),
        ));
    }
    out
}

/// A subject as Go keeps it: the last CN, every O.
type GoSubject = (String, Vec<String>);

/// What our readers make of one request.
struct Ours {
    /// The approver's verdict.
    accepted: Result<(), String>,
    /// Go's way on the first block our PEM reader finds: (type, CN, Os) when it parses.
    first_block: Option<(String, Option<GoSubject>)>,
}

fn ours(request: &str) -> Ours {
    let accepted = cert_syncer::kubelet_csr::kubelet_request(request.as_bytes(), NODE)
        .map(|_| ())
        .map_err(|refused| refused.reason);
    let first_block = cert_syncer::kubelet_csr::go_first_block(request.as_bytes())
        .map(|(label, der)| (label, go_subject(&der)));
    Ours {
        accepted,
        first_block,
    }
}

/// The subject as Go's `pkix.Name` keeps it: the last CN, every O in order (strings of any
/// type: Go's `encoding/asn1` reads BMPString as UTF-16, T61String as its bytes). `None` when
/// x509-parser cannot read the request (it is stricter than Go about some elements Go ignores;
/// the first assertion covers those).
fn go_subject(der: &[u8]) -> Option<GoSubject> {
    use x509_parser::prelude::FromDer;
    let (_, request) =
        x509_parser::certification_request::X509CertificationRequest::from_der(der).ok()?;
    let text = |attribute: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        let value = attribute.attr_value();
        if value.tag().0 == 30 {
            let units: Vec<u16> = value
                .data
                .chunks(2)
                .map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))
                .collect();
            String::from_utf16_lossy(&units)
        } else {
            String::from_utf8_lossy(value.data).into_owned()
        }
    };
    let (mut common_name, mut organizations) = (String::new(), Vec::new());
    for attribute in request.certification_request_info.subject.iter_attributes() {
        match attribute.attr_type().to_id_string().as_str() {
            CN => common_name = text(attribute),
            O => organizations.push(text(attribute)),
            _ => {}
        }
    }
    Some((common_name, organizations))
}

async fn differential() {
    require_real_apiserver!();
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = RealApiServer::start_with(&tmp.path().join("apiserver"), &RealOptions::default());
    let csrs = Api::<CertificateSigningRequest>::all(api.client_with_token(&api.token));
    let requests = requests();
    let mut created = Vec::new();
    let mut rejected = BTreeMap::new();
    for (index, (_, request)) in requests.iter().enumerate() {
        let name = format!("d-{index}");
        let csr = CertificateSigningRequest {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(request.clone().into_bytes()),
                signer_name: "kubernetes.io/kube-apiserver-client-kubelet".to_owned(),
                usages: Some(
                    ["digital signature", "key encipherment", "client auth"]
                        .map(str::to_owned)
                        .to_vec(),
                ),
                ..CertificateSigningRequestSpec::default()
            },
            status: None,
        };
        match csrs.create(&PostParams::default(), &csr).await {
            Ok(_) => created.push(name),
            Err(kube::Error::Api(status)) if status.code == 422 => {
                // Its message quotes the request's bytes: the reason is at its end.
                let message = status.message;
                let tail: String = message.chars().rev().take(120).collect();
                rejected.insert(index, tail.chars().rev().collect::<String>());
            }
            Err(err) => panic!("creating {name}: {err}"),
        }
    }
    let go = match e2e::go_csr::skip_reason() {
        Some(reason) => {
            eprintln!("SKIP (Go's view of the accepted requests): {reason}");
            None
        }
        None => {
            let names: Vec<&str> = created.iter().map(String::as_str).collect();
            Some(e2e::go_csr::describe(&api, &names))
        }
    };

    let (mut we_accept, mut api_only, mut both_refuse, mut framing_compared) = (0, 0, 0, 0);
    let mut failures = Vec::new();
    for (index, (what, request)) in requests.iter().enumerate() {
        let name = format!("d-{index}");
        let ours = ours(request);
        let api_accepted = !rejected.contains_key(&index);
        let view = go.as_ref().map(|views| views.get(&name));
        match (&ours.accepted, api_accepted) {
            (Ok(()), false) => failures.push(format!(
                "{what}: we accept what kube-apiserver rejects ({})",
                rejected[&index]
            )),
            (Ok(()), true) => {
                we_accept += 1;
                if let Some(view) = view {
                    let view = view.and_then(|v| v.as_ref().ok());
                    let expected = BTreeMap::from([(
                        "Organization".to_owned(),
                        vec!["system:nodes".to_owned()],
                    )]);
                    match view {
                        Some(v)
                            if v.common_name == format!("system:node:{NODE}")
                                && v.subject == expected
                                && v.sans.is_empty() => {}
                        other => failures.push(format!(
                            "{what}: we accept it, Go reads otherwise: {other:?}"
                        )),
                    }
                }
            }
            (Err(_), true) => api_only += 1,
            (Err(_), false) => both_refuse += 1,
        }
        // Our PEM reader's first block is the one Go read.
        if let (true, Some(Some(Ok(view)))) = (api_accepted, view) {
            let go_organizations = view
                .subject
                .get("Organization")
                .cloned()
                .unwrap_or_default();
            match &ours.first_block {
                Some((label, Some((cn, organizations))))
                    if label == "CERTIFICATE REQUEST"
                        && *cn == view.common_name
                        && *organizations == go_organizations =>
                {
                    framing_compared += 1;
                }
                Some((label, None)) if label == "CERTIFICATE REQUEST" => {}
                other => failures.push(format!(
                    "{what}: our PEM reader's first block {other:?}, Go read {view:?}"
                )),
            }
        }
    }
    eprintln!(
        "{} requests: we accept {we_accept} (kube-apiserver too, Go reads the same), \
         kube-apiserver alone accepts {api_only}, both refuse {both_refuse}; our PEM reader's \
         first block compared with Go's for {framing_compared}",
        requests.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The check has teeth: requests of every kind were made.
    assert!(we_accept >= 10, "we accept only {we_accept}");
    assert!(
        api_only >= 20,
        "kube-apiserver alone accepts only {api_only}"
    );
    assert!(both_refuse >= 10, "both refuse only {both_refuse}");
    if go.is_some() {
        assert!(
            framing_compared >= 100,
            "framing compared for {framing_compared} only"
        );
    }
}
