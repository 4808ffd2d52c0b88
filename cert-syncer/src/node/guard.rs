//! The last check before the host file is replaced. Every node runs node mode at once, so a
//! source that parses but is wrong (every certificate expired, no CA at all, or an unrelated
//! bundle put in the ConfigMap by mistake) would take the kubelet's trust away on every node at
//! the same moment. Such a bundle is refused and the file keeps what it holds:
//!
//! - the new bundle must hold at least one unexpired CA certificate (basicConstraints cA);
//! - when the file holds unexpired certificates, the new bundle must keep at least one of them
//!   (a rotation overlaps: the old signer stays in the bundle until the new one is in use).
//!
//! To replace a bundle wholesale on purpose, remove the file (or let it expire): the second rule
//! then has nothing to protect.

use super::bundle::Certificate;

/// Why a bundle was refused. Never quotes certificate bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No certificate of the bundle is an unexpired CA.
    #[error(
        "it holds no unexpired CA certificate ({certificates} certificates: {expired} expired, \
         {not_ca} not a CA)"
    )]
    NoUnexpiredCa {
        certificates: usize,
        expired: usize,
        not_ca: usize,
    },
    /// The file holds unexpired certificates and the bundle keeps none of them.
    #[error(
        "it would remove every unexpired certificate the file holds ({held} there, none of them \
         in the new bundle)"
    )]
    RemovesEveryUnexpired { held: usize },
}

impl Refusal {
    /// A short label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NoUnexpiredCa { .. } => "no-unexpired-ca",
            Refusal::RemovesEveryUnexpired { .. } => "removes-every-unexpired",
        }
    }
}

/// Whether `desired` may replace a file holding `held`, at `now` (seconds since the epoch).
pub fn check(desired: &[Certificate], held: &[Certificate], now: i64) -> Result<(), Refusal> {
    let unexpired = |c: &&Certificate| c.not_after > now;
    if !desired.iter().filter(unexpired).any(|c| c.is_ca) {
        return Err(Refusal::NoUnexpiredCa {
            certificates: desired.len(),
            expired: desired.iter().filter(|c| c.not_after <= now).count(),
            not_ca: desired.iter().filter(|c| !c.is_ca).count(),
        });
    }
    let held_unexpired: Vec<&Certificate> = held.iter().filter(unexpired).collect();
    if !held_unexpired.is_empty()
        && !held_unexpired
            .iter()
            .any(|h| desired.iter().any(|d| d.der == h.der))
    {
        return Err(Refusal::RemovesEveryUnexpired {
            held: held_unexpired.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    fn cert(name: u8, not_after: i64, is_ca: bool) -> Certificate {
        Certificate {
            der: vec![name],
            not_after,
            is_ca,
        }
    }

    #[test]
    fn a_bundle_without_an_unexpired_ca_is_refused() {
        let expired_ca = cert(1, NOW - 1, true);
        let leaf = cert(2, NOW + 3600, false);
        assert_eq!(
            check(&[expired_ca.clone(), leaf.clone()], &[], NOW),
            Err(Refusal::NoUnexpiredCa {
                certificates: 2,
                expired: 1,
                not_ca: 1
            })
        );
        assert!(check(&[leaf], &[], NOW).is_err(), "not a CA");
        assert!(check(&[expired_ca], &[], NOW).is_err(), "all expired");
        // Expiring exactly now is expired.
        assert!(check(&[cert(3, NOW, true)], &[], NOW).is_err());
        assert_eq!(check(&[cert(4, NOW + 1, true)], &[], NOW), Ok(()));
    }

    #[test]
    fn a_bundle_that_drops_everything_the_file_trusts_is_refused_and_an_overlap_is_not() {
        let (a, b, c) = (
            cert(1, NOW + 10, true),
            cert(2, NOW + 10, true),
            cert(3, NOW + 10, true),
        );
        // Unrelated: every unexpired certificate of the file would go.
        assert_eq!(
            check(std::slice::from_ref(&c), &[a.clone(), b.clone()], NOW),
            Err(Refusal::RemovesEveryUnexpired { held: 2 })
        );
        // A rotation: b stays, a goes, c comes.
        assert_eq!(check(&[b.clone(), c.clone()], &[a.clone(), b], NOW), Ok(()));
        // The file holds only expired certificates (or nothing): nothing to protect.
        assert_eq!(
            check(std::slice::from_ref(&c), &[cert(9, NOW - 5, true)], NOW),
            Ok(())
        );
        assert_eq!(check(&[c], &[], NOW), Ok(()));
    }
}
