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
