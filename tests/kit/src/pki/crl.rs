//! CRLs of a [`Ca`]: revoking chosen serials, fresh or stale, whole or partitioned (an issuing
//! distribution point), numbered in the order they are made.

use rcgen::{CertificateRevocationListParams, KeyIdMethod, RevocationReason, RevokedCertParams};
use time::{Duration, OffsetDateTime};

use super::{Ca, next_serial};

impl Ca {
    /// A CRL (PEM) revoking `serials`, next update in a day.
    pub fn crl(&self, serials: &[u64]) -> String {
        self.crl_next_update(serials, Duration::days(1))
    }

    /// The same CRL in DER.
    ///
    /// # Panics
    /// When rcgen cannot sign the CRL.
    pub fn crl_der(&self, serials: &[u64]) -> Vec<u8> {
        crl_params(serials, Duration::days(1), None)
            .signed_by(&self.issuer)
            .expect("signing the CRL")
            .der()
            .to_vec()
    }

    /// A CRL (PEM) whose nextUpdate is `next_update` from now (negative: stale).
    ///
    /// # Panics
    /// When rcgen cannot sign the CRL.
    pub fn crl_next_update(&self, serials: &[u64], next_update: Duration) -> String {
        crl_params(serials, next_update, None)
            .signed_by(&self.issuer)
            .expect("signing the CRL")
            .pem()
            .expect("encoding the CRL")
    }

    /// A partitioned CRL (PEM) revoking `serials`, next update in a day: its issuing
    /// distribution point is `uri`, so it covers the certificates whose CRL distribution point
    /// is `uri` (see [`CertSpec::crl_distribution_point`](super::CertSpec::crl_distribution_point)).
    ///
    /// # Panics
    /// When rcgen cannot sign the CRL.
    pub fn crl_scoped(&self, serials: &[u64], uri: &str) -> String {
        crl_params(serials, Duration::days(1), Some(uri))
            .signed_by(&self.issuer)
            .expect("signing the CRL")
            .pem()
            .expect("encoding the CRL")
    }
}

fn crl_params(
    serials: &[u64],
    next_update: Duration,
    scope: Option<&str>,
) -> CertificateRevocationListParams {
    let now = OffsetDateTime::now_utc();
    // thisUpdate before nextUpdate, also for a stale CRL.
    let this_update = (now - Duration::minutes(5)).min(now + next_update - Duration::days(1));
    CertificateRevocationListParams {
        this_update,
        next_update: now + next_update,
        crl_number: next_serial().into(),
        issuing_distribution_point: scope.map(|uri| rcgen::CrlIssuingDistributionPoint {
            distribution_point: rcgen::CrlDistributionPoint {
                uris: vec![uri.to_owned()],
            },
            scope: None,
        }),
        revoked_certs: serials
            .iter()
            .map(|serial| RevokedCertParams {
                serial_number: (*serial).into(),
                revocation_time: now - Duration::minutes(1),
                reason_code: Some(RevocationReason::KeyCompromise),
                invalidity_date: None,
            })
            .collect(),
        key_identifier_method: KeyIdMethod::Sha256,
    }
}
