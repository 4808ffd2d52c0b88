//! PKCS#10 certificate requests (rcgen), for the kubelet CSR approver's tests.

use rcgen::{CertificateParams, DnType};

use crate::pki::KeyKind;

/// A PKCS#10 certificate request (PEM, `CERTIFICATE REQUEST`) such as the kubelet sends: the
/// subject's attributes in order (`("CN", …)`, `("O", …)`, `("OU", …)`), DNS SANs if any, a
/// fresh key of `kind`.
///
/// # Panics
/// On an unknown attribute name or a SAN rcgen refuses (a test bug).
pub fn certificate_request(subject: &[(&str, &str)], dns_sans: &[&str], kind: KeyKind) -> String {
    let key = kind.generate();
    let mut params =
        CertificateParams::new(dns_sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
            .expect("valid SANs");
    params.distinguished_name = rcgen::DistinguishedName::new();
    for (name, value) in subject {
        let kind = match *name {
            "CN" => DnType::CommonName,
            "O" => DnType::OrganizationName,
            "OU" => DnType::OrganizationalUnitName,
            "C" => DnType::CountryName,
            other => panic!("attribute {other}"),
        };
        params.distinguished_name.push(kind, *value);
    }
    params
        .serialize_request(&key)
        .expect("a certificate request")
        .pem()
        .expect("PEM")
}

/// [`certificate_request`] that also asks for one extension the kubelet never asks for (an
/// arbitrary private OID with a NULL value).
///
/// # Panics
/// As [`certificate_request`].
pub fn certificate_request_with_extension(subject: &[(&str, &str)], kind: KeyKind) -> String {
    let key = kind.generate();
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("no SANs");
    params.distinguished_name = rcgen::DistinguishedName::new();
    for (name, value) in subject {
        let kind = match *name {
            "CN" => DnType::CommonName,
            "O" => DnType::OrganizationName,
            other => panic!("attribute {other}"),
        };
        params.distinguished_name.push(kind, *value);
    }
    params
        .custom_extensions
        .push(rcgen::CustomExtension::from_oid_content(
            &[1, 3, 6, 1, 4, 1, 55555, 1],
            vec![0x05, 0x00],
        ));
    params
        .serialize_request(&key)
        .expect("a certificate request")
        .pem()
        .expect("PEM")
}

/// UTF8String, the type Go and rcgen write subject values in.
pub const UTF8_STRING: u8 = 0x0c;
/// PrintableString.
pub const PRINTABLE_STRING: u8 = 0x13;
/// IA5String.
pub const IA5_STRING: u8 = 0x16;
/// BMPString (UTF-16BE).
pub const BMP_STRING: u8 = 0x1e;
/// TeletexString (T61).
pub const T61_STRING: u8 = 0x14;
/// CN.
pub const CN: &str = "2.5.4.3";
/// O.
pub const O: &str = "2.5.4.10";
/// OU.
pub const OU: &str = "2.5.4.11";
/// PKCS#9 extensionRequest.
pub const EXTENSION_REQUEST: &str = "1.2.840.113549.1.9.14";
/// PKCS#9 challengePassword.
pub const CHALLENGE_PASSWORD: &str = "1.2.840.113549.1.9.7";
/// subjectAltName.
pub const SUBJECT_ALT_NAME: &str = "2.5.29.17";

/// One subject attribute: its OID (dotted), the DER tag of its value and the value's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Atv {
    /// Dotted OID.
    pub oid: String,
    /// The value's tag ([`UTF8_STRING`]...).
    pub tag: u8,
    /// The value's content.
    pub value: Vec<u8>,
}

impl Atv {
    /// `oid` = `value` as a UTF8String.
    pub fn utf8(oid: &str, value: &str) -> Atv {
        Atv {
            oid: oid.to_owned(),
            tag: UTF8_STRING,
            value: value.as_bytes().to_vec(),
        }
    }
}

/// A PKCS#10 request assembled element by element, for the requests rcgen will not write
/// (several CNs, multi-valued RDNs, other string types, any attribute, several values, elements
/// Go ignores), signed by a fresh key so that kube-apiserver's signature check passes.
#[derive(Debug, Clone)]
pub struct RawRequest {
    /// The version INTEGER's one content byte (0 is v1).
    pub version: u8,
    /// The subject's RDNs, each with its attributes.
    pub subject: Vec<Vec<Atv>>,
    /// The attributes: (OID, each value whole as DER).
    pub attributes: Vec<(String, Vec<Vec<u8>>)>,
    /// Elements appended inside certificationRequestInfo after the attributes (Go's reader
    /// ignores them).
    pub info_trailer: Vec<u8>,
    /// The key.
    pub key: KeyKind,
}

impl RawRequest {
    /// The kubelet's request for `node`: `O=system:nodes`, `CN=system:node:<node>` (UTF8Strings,
    /// one RDN each, as Go writes them), no attributes, ECDSA P-256.
    pub fn kubelet(node: &str) -> RawRequest {
        RawRequest {
            version: 0,
            subject: vec![
                vec![Atv::utf8(O, "system:nodes")],
                vec![Atv::utf8(CN, &format!("system:node:{node}"))],
            ],
            attributes: Vec::new(),
            info_trailer: Vec::new(),
            key: KeyKind::EcdsaP256,
        }
    }

    /// The signed request (DER).
    ///
    /// # Panics
    /// When signing fails (no randomness).
    pub fn der(&self) -> Vec<u8> {
        use crate::der::{oid, tlv};
        use rcgen::{PublicKeyData, SigningKey};
        let key = self.key.generate();
        let subject: Vec<u8> = self
            .subject
            .iter()
            .map(|rdn| {
                let atvs: Vec<u8> = rdn
                    .iter()
                    .flat_map(|a| tlv(0x30, &[oid(&a.oid), tlv(a.tag, &a.value)].concat()))
                    .collect();
                tlv(0x31, &atvs)
            })
            .collect::<Vec<_>>()
            .concat();
        let attributes: Vec<u8> = self
            .attributes
            .iter()
            .flat_map(|(id, values)| tlv(0x30, &[oid(id), tlv(0x31, &values.concat())].concat()))
            .collect();
        let info = tlv(
            0x30,
            &[
                tlv(0x02, &[self.version]),
                tlv(0x30, &subject),
                key.subject_public_key_info(),
                tlv(0xa0, &attributes),
                self.info_trailer.clone(),
            ]
            .concat(),
        );
        let algorithm = match self.key {
            KeyKind::EcdsaP256 => tlv(0x30, &oid("1.2.840.10045.4.3.2")),
            KeyKind::Rsa2048 => tlv(
                0x30,
                &[oid("1.2.840.113549.1.1.11"), vec![0x05, 0x00]].concat(),
            ),
        };
        let mut bits = vec![0x00];
        bits.extend(key.sign(&info).expect("signing"));
        tlv(0x30, &[info, algorithm, tlv(0x03, &bits)].concat())
    }

    /// [`RawRequest::der`] as `CERTIFICATE REQUEST` PEM (LF, 64 columns), as the kubelet writes it.
    pub fn pem(&self) -> String {
        request_pem(&self.der())
    }
}

/// `der` as one `CERTIFICATE REQUEST` PEM block (LF line ends, 64 columns).
pub fn request_pem(der: &[u8]) -> String {
    pem::encode_config(
        &pem::Pem::new("CERTIFICATE REQUEST", der.to_vec()),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

/// An extensionRequest value: `SEQUENCE OF Extension` of (OID, critical, extnValue content).
pub fn extension_request_value(extensions: &[(&str, bool, Vec<u8>)]) -> Vec<u8> {
    use crate::der::{oid, tlv};
    let list: Vec<u8> = extensions
        .iter()
        .flat_map(|(id, critical, value)| {
            let critical = if *critical {
                vec![0x01, 0x01, 0xff]
            } else {
                Vec::new()
            };
            tlv(0x30, &[oid(id), critical, tlv(0x04, value)].concat())
        })
        .collect();
    tlv(0x30, &list)
}

/// A subjectAltName extension's value: GeneralNames of DNS names.
pub fn dns_names(names: &[&str]) -> Vec<u8> {
    let names: Vec<u8> = names
        .iter()
        .flat_map(|n| crate::der::tlv(0x82, n.as_bytes()))
        .collect();
    crate::der::tlv(0x30, &names)
}

/// A DER element (tag, content): for attribute values and trailers.
pub fn element(tag: u8, content: &[u8]) -> Vec<u8> {
    crate::der::tlv(tag, content)
}
