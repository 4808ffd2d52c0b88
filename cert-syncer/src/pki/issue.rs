//! New certificates (rcgen): self-signed signers, CA parameters for intermediates, leaves for a
//! serving or client [`Identity`], in the key type asked for ([`keys`]), with the subject of a
//! client of several groups written by [`subject`].

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls_pki_types::CertificateDer;
use time::OffsetDateTime;

use super::parse::{Cert, KeyPairPem, parse_key};
use super::verify::{Identity, reference_name};

pub(crate) mod keys;
mod subject;

pub use keys::KeyType;

/// [`new_signer_of`] with an ECDSA P-256 key (cheap: tests and `inspect`'s fixtures).
#[cfg(test)]
pub fn new_signer(
    common_name: &str,
    now: i64,
    backdate: std::time::Duration,
    validity: std::time::Duration,
) -> Result<KeyPairPem, String> {
    new_signer_of(KeyType::EcdsaP256, common_name, now, backdate, validity)
}

/// The parameters of a CA certificate as library-go issues them (CA without a path length;
/// keyCertSign, cRLSign, digitalSignature) named `common_name`, valid from `not_before` to
/// `not_after` (unix seconds): for self-signed signers and intermediate CAs alike.
pub fn ca_params(
    common_name: &str,
    not_before: i64,
    not_after: i64,
) -> Result<CertificateParams, String> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.not_before = at(not_before)?;
    params.not_after = at(not_after)?;
    Ok(params)
}

/// [`new_signer_with`] with a new `key_type` key (tests; `regenerate` makes its keys ahead).
#[cfg(test)]
pub fn new_signer_of(
    key_type: KeyType,
    common_name: &str,
    now: i64,
    backdate: std::time::Duration,
    validity: std::time::Duration,
) -> Result<KeyPairPem, String> {
    new_signer_with(key_type.generate()?, common_name, now, backdate, validity)
}

/// A new self-signed CA with `key` (made beforehand: `regenerate` makes keys ahead, in
/// parallel), valid from `now - backdate` for `validity`; CN as library-go names it:
/// `<namespace>_<name>@<unix seconds>`.
pub fn new_signer_with(
    key: KeyPair,
    common_name: &str,
    now: i64,
    backdate: std::time::Duration,
    validity: std::time::Duration,
) -> Result<KeyPairPem, String> {
    let params = ca_params(
        common_name,
        now - backdate.as_secs() as i64,
        now + validity.as_secs() as i64,
    )?;
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    let cert = Cert::from_der(cert.der().clone())?;
    Ok(KeyPairPem {
        chain: vec![cert],
        key_pem: key.serialize_pem(),
    })
}

/// [`new_leaf_of`] with an ECDSA P-256 key (cheap: tests and `inspect`'s fixtures).
#[cfg(test)]
pub fn new_leaf(
    signer: &KeyPairPem,
    identity: &Identity,
    now: i64,
    backdate: std::time::Duration,
    validity: std::time::Duration,
) -> Result<KeyPairPem, String> {
    new_leaf_of(
        KeyType::EcdsaP256,
        signer,
        identity,
        now,
        backdate,
        validity,
    )
}

/// [`new_leaf_with`] with a new `key_type` key (tests; `regenerate` makes its keys ahead).
#[cfg(test)]
pub fn new_leaf_of(
    key_type: KeyType,
    signer: &KeyPairPem,
    identity: &Identity,
    now: i64,
    backdate: std::time::Duration,
    validity: std::time::Duration,
) -> Result<KeyPairPem, String> {
    let key = key_type.generate_leaf()?;
    new_leaf_with(key, signer, identity, now, backdate, validity)
}

/// A new leaf for `identity` with `key` (made beforehand: `regenerate` makes keys ahead, in
/// parallel), signed by `signer` (with the signer key's algorithm: SHA-256 with RSA for an RSA
/// signer), valid from `now - backdate` for `validity` but never past the signer's own
/// notAfter.
pub fn new_leaf_with(
    key: KeyPair,
    signer: &KeyPairPem,
    identity: &Identity,
    now: i64,
    backdate: std::time::Duration,
    validity: std::time::Duration,
) -> Result<KeyPairPem, String> {
    let ca_key = signing_key(&signer.key_pem)?;
    let issuer = Issuer::from_ca_cert_der(&signer.cert().der, ca_key)
        .map_err(|e| format!("signer certificate: {e}"))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    match identity {
        Identity::Serving { hostnames } => {
            for name in hostnames {
                params
                    .subject_alt_names
                    .push(match name.parse::<std::net::IpAddr>() {
                        Ok(ip) => SanType::IpAddress(ip),
                        Err(_) => SanType::DnsName(
                            name.clone()
                                .try_into()
                                .map_err(|e| format!("{name}: {e}"))?,
                        ),
                    });
            }
            params
                .distinguished_name
                .push(DnType::CommonName, hostnames[0].as_str());
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        }
        Identity::Client { user, groups } => {
            params
                .distinguished_name
                .push(DnType::CommonName, user.as_str());
            for group in groups {
                params
                    .distinguished_name
                    .push(DnType::OrganizationName, group.as_str());
            }
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        }
    }
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.use_authority_key_identifier_extension = true;
    params.not_before = at(now - backdate.as_secs() as i64)?;
    let not_after = (now + validity.as_secs() as i64).min(signer.cert().not_after);
    params.not_after = at(not_after)?;
    let cert = params.signed_by(&key, &issuer).map_err(|e| e.to_string())?;
    let der = match identity {
        // rcgen keeps one O: the subject with every group is written by `subject`.
        Identity::Client { user, groups } if groups.len() > 1 => CertificateDer::from(
            subject::with_groups(cert.der(), user, groups, &signing_key(&signer.key_pem)?)?,
        ),
        _ => cert.der().clone(),
    };
    Ok(KeyPairPem {
        chain: vec![Cert::from_der(der)?],
        key_pem: key.serialize_pem(),
    })
}

/// The signer's key as rcgen signs with it: the key block [`key_fits`] checked (the first
/// private key of the PEM, whatever precedes it, such as OpenSSL's `EC PARAMETERS`), not the
/// first PEM block.
pub fn signing_key(key_pem: &str) -> Result<KeyPair, String> {
    let key = parse_key(key_pem.as_bytes()).map_err(|e| format!("signer key: {e}"))?;
    KeyPair::try_from(&key).map_err(|e| format!("signer key: {e}"))
}

fn at(unix: i64) -> Result<OffsetDateTime, String> {
    OffsetDateTime::from_unix_timestamp(unix).map_err(|e| e.to_string())
}

/// Whether a serving certificate for `hostnames` is one every verifier takes: rcgen issues it,
/// webpki accepts each name as issued (a wildcard for a name it covers), and the names read
/// back from the certificate are exactly `hostnames` (sorted, deduplicated, as the config
/// gives them). Checked once at config load with a throwaway certificate, so a hostname no
/// verifier accepts is a config error instead of a certificate that never settles.
pub fn check_serving_names(hostnames: &[String]) -> Result<(), String> {
    let key = KeyPair::generate().map_err(|e| e.to_string())?;
    let signer = {
        let params = ca_params("hostname check", 0, 4_000_000_000)?;
        let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
        KeyPairPem {
            chain: vec![Cert::from_der(cert.der().clone())?],
            key_pem: key.serialize_pem(),
        }
    };
    let identity = Identity::Serving {
        hostnames: hostnames.to_vec(),
    };
    let leaf = new_leaf_with(
        KeyType::EcdsaP256.generate_leaf()?,
        &signer,
        &identity,
        1,
        std::time::Duration::ZERO,
        std::time::Duration::from_secs(3600),
    )?;
    if leaf.cert().hostnames != hostnames {
        return Err(format!(
            "the certificate would carry {:?}, not {hostnames:?}",
            leaf.cert().hostnames
        ));
    }
    let end_entity = webpki::EndEntityCert::try_from(&leaf.cert().der)
        .map_err(|err| format!("not a certificate webpki accepts: {err}"))?;
    for name in hostnames {
        let reference = reference_name(std::slice::from_ref(name))?;
        end_entity
            .verify_is_valid_for_subject_name(&reference)
            .map_err(|err| format!("{name}: webpki refuses it ({err})"))?;
    }
    Ok(())
}
