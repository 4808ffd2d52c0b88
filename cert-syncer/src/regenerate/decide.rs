// Over 600 lines because the decision rules and their unit tests (more than half the file) stay
// side by side: each rule is read next to the cases that pin it down.
//! The decisions, as pure functions of what was read and the time: whether a signer or a target
//! must be regenerated (and why), what a CA bundle must hold, and whether the local clock can
//! be trusted. No I/O here, so every rule has a unit test.
//!
//! Decisions read the certificates themselves. Annotations are written for interoperability
//! with library-go, never trusted: missing, corrupt or mismatched data counts as missing.

use std::fmt;

use super::config::{Identity, Signer, Target};
use crate::pki::{Cert, KeyPairPem};
use crate::time::rfc3339;

/// When to act.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Only expired or missing material (and serving hostname or client identity drift, and a
    /// chain that no longer reaches the bundle): never fights the normal rotation operator.
    ExpiredOnly,
    /// Also rotate past 80 % of the lifetime or past notBefore + refresh, as library-go does.
    Rotate,
}

/// Why an object must be (re)generated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    Missing,
    Unusable(String),
    NotACa,
    Expired {
        not_after: i64,
    },
    PastLifetimeFraction {
        at: i64,
    },
    PastRefresh {
        at: i64,
    },
    HostnamesChanged {
        want: Vec<String>,
        have: Vec<String>,
    },
    IdentityChanged,
    ChainBroken(String),
    /// Written by a regenerate whose clock was ahead: not valid now, by our clock and the
    /// apiserver's alike.
    NotYetValid {
        not_before: i64,
    },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Missing => write!(f, "missing"),
            Reason::Unusable(why) => write!(f, "unusable: {why}"),
            Reason::NotACa => write!(f, "the certificate is not a CA"),
            Reason::Expired { not_after } => {
                write!(f, "expired at {}", rfc3339(*not_after))
            }
            Reason::PastLifetimeFraction { at } => {
                write!(f, "past 80% of its lifetime (since {})", rfc3339(*at))
            }
            Reason::PastRefresh { at } => {
                write!(f, "past its refresh time ({})", rfc3339(*at))
            }
            Reason::HostnamesChanged { want, have } => write!(
                f,
                "hostnames changed: want {}, have {}",
                want.join(","),
                have.join(",")
            ),
            Reason::IdentityChanged => write!(f, "client user or groups changed"),
            Reason::ChainBroken(why) => write!(f, "does not chain to the CA bundle: {why}"),
            Reason::NotYetValid { not_before } => write!(
                f,
                "not valid before {} (written while a clock was ahead)",
                rfc3339(*not_before)
            ),
        }
    }
}

impl Reason {
    /// A short label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Reason::Missing => "missing",
            Reason::Unusable(_) => "unusable",
            Reason::NotACa => "not-ca",
            Reason::Expired { .. } => "expired",
            Reason::PastLifetimeFraction { .. } => "lifetime",
            Reason::PastRefresh { .. } => "refresh",
            Reason::HostnamesChanged { .. } => "hostnames",
            Reason::IdentityChanged => "identity",
            Reason::ChainBroken(_) => "chain",
            Reason::NotYetValid { .. } => "not-yet-valid",
        }
    }
}

/// What was found in a Secret's `tls.crt`/`tls.key`.
pub type Found = Option<Result<KeyPairPem, String>>;

/// The 80 % point of a certificate's lifetime.
fn lifetime_fraction_point(cert: &Cert) -> i64 {
    cert.not_after - (cert.not_after - cert.not_before) / 5
}

/// Whether the signer must be regenerated.
pub fn signer(found: &Found, config: &Signer, mode: Mode, now: i64) -> Option<Reason> {
    let pair = match found {
        None => return Some(Reason::Missing),
        Some(Err(why)) => return Some(Reason::Unusable(why.clone())),
        Some(Ok(pair)) => pair,
    };
    let cert = pair.cert();
    if !cert.is_ca {
        return Some(Reason::NotACa);
    }
    if cert.is_expired_at(now) {
        return Some(Reason::Expired {
            not_after: cert.not_after,
        });
    }
    if mode == Mode::ExpiredOnly {
        return None;
    }
    let at = lifetime_fraction_point(cert);
    if now > at {
        return Some(Reason::PastLifetimeFraction { at });
    }
    let at = cert.not_before + config.refresh.as_secs() as i64;
    if now > at {
        return Some(Reason::PastRefresh { at });
    }
    None
}

/// Whether the target must be regenerated. `roots` is the target's CA bundle as it will be
/// after this pass; `signer` is the current signer.
pub fn target(
    found: &Found,
    config: &Target,
    roots: &[Cert],
    signer: &Cert,
    mode: Mode,
    now: i64,
) -> Option<Reason> {
    let pair = match found {
        None => return Some(Reason::Missing),
        Some(Err(why)) => return Some(Reason::Unusable(why.clone())),
        Some(Ok(pair)) => pair,
    };
    let cert = pair.cert();
    if cert.is_expired_at(now) {
        return Some(Reason::Expired {
            not_after: cert.not_after,
        });
    }
    match &config.identity {
        Identity::Serving { hostnames } => {
            if cert.hostnames != *hostnames {
                return Some(Reason::HostnamesChanged {
                    want: hostnames.clone(),
                    have: cert.hostnames.clone(),
                });
            }
        }
        Identity::Client { user, groups } => {
            if cert.common_name.as_deref() != Some(user.as_str()) || cert.organizations != *groups {
                return Some(Reason::IdentityChanged);
            }
        }
    }
    // A certificate nothing trusts is as good as expired, in either mode. The rotation
    // operator keeps old CAs in the bundle until they expire, so this never fights it.
    if let Err(why) = crate::pki::verify_chain(pair, roots, &config.identity, now) {
        return Some(Reason::ChainBroken(why));
    }
    if mode == Mode::ExpiredOnly {
        return None;
    }
    let at = lifetime_fraction_point(cert);
    if now > at {
        return Some(Reason::PastLifetimeFraction { at });
    }
    // Past its refresh time, but only once the current signer has been published for a tenth
    // of the refresh period, so clients have the new CA before servers present leaves from it.
    let at = cert.not_before + config.refresh.as_secs() as i64;
    let signer_settled = signer.not_before + (config.refresh.as_secs() / 10) as i64;
    if now > at && now > signer_settled {
        return Some(Reason::PastRefresh { at });
    }
    None
}

/// The bundle's content after this pass: every CA already in it that has not expired, plus the
/// current signers; deduplicated, ordered by DER bytes so every replica computes the same text.
///
/// An expired CA is still kept while a managed certificate in `in_use` (the targets as read at
/// the start of the pass) was issued by it: this pass re-issues that certificate, and the next
/// pass prunes the CA. "Expired" is only as good as the clock, so trust is never removed from
/// under a certificate that is still being served.
pub fn bundle(existing: &[Cert], signers: &[&Cert], in_use: &[&Cert], now: i64) -> Vec<Cert> {
    let mut certs: Vec<Cert> = existing
        .iter()
        .chain(signers.iter().copied())
        .filter(|c| {
            !c.is_expired_at(now) || in_use.iter().any(|leaf| crate::pki::issued_by(leaf, c))
        })
        .cloned()
        .collect();
    certs.sort_by(|a, b| a.der.as_ref().cmp(b.der.as_ref()));
    certs.dedup_by(|a, b| a.der.as_ref() == b.der.as_ref());
    certs
}

/// The time decisions use: the local clock, but never later than the apiserver's (the `Date`
/// of one of its answers in this pass). A local clock that jumped ahead therefore expires
/// nothing that is still valid at the apiserver's time; a local clock that is behind stays the
/// earlier of the two and is caught by [`clock_check`]. Without an answer, the local clock.
pub fn trusted_now(local: i64, apiserver: Option<i64>) -> i64 {
    apiserver.map_or(local, |at| local.min(at))
}

/// Whether a certificate starts later than `now` plus the backdate margin: valid at neither
/// clock (`now` is [`trusted_now`]). [`clock_check`] has already refused the pass if only the
/// local clock thinks so, so what is left was written by a regenerate whose clock was ahead.
pub fn not_yet_valid(found: &Found, margin: std::time::Duration, now: i64) -> Option<Reason> {
    match found {
        Some(Ok(pair)) if pair.cert().not_before > now + margin.as_secs() as i64 => {
            Some(Reason::NotYetValid {
                not_before: pair.cert().not_before,
            })
        }
        _ => None,
    }
}

/// Refuses when the local clock is clearly behind: earlier than a certificate's notBefore by
/// more than the backdate margin (our own certificates start `backdate` in the past, so a
/// correct clock never sees that), while the apiserver's clock is not. Returns the offending
/// object and its notBefore.
///
/// A certificate that starts in the future by the apiserver's clock too is no evidence against
/// ours: it was written by a clock that was ahead, is valid at neither, and is regenerated
/// ([`not_yet_valid`]) instead of blocking every pass until its notBefore comes. Without an
/// apiserver time (`None`), any such certificate refuses, as before.
pub fn clock_check<'a>(
    seen: impl IntoIterator<Item = (&'a str, &'a Cert)>,
    margin: std::time::Duration,
    now: i64,
    apiserver: Option<i64>,
) -> Result<(), String> {
    let margin_secs = margin.as_secs() as i64;
    let newest = seen
        .into_iter()
        .filter(|(_, cert)| apiserver.is_none_or(|at| cert.not_before <= at + margin_secs))
        .max_by_key(|(_, cert)| cert.not_before);
    if let Some((object, cert)) = newest
        && now + margin_secs < cert.not_before
    {
        return Err(format!(
            "the local clock ({}) is {}s earlier than the notBefore ({}) of {object}, more than \
             the {}s margin{}: refusing to regenerate anything until the clock is fixed",
            rfc3339(now),
            cert.not_before - now,
            rfc3339(cert.not_before),
            margin.as_secs(),
            match apiserver {
                Some(at) => format!(", while the apiserver's clock ({}) is not", rfc3339(at)),
                None => String::new(),
            }
        ));
    }
    Ok(())
}

/// The times at which a decision about `cert` can change by time alone: its expiry and, in
/// rotate mode, its 80 % point and its refresh time (each plus one second, as the rules use
/// "after").
pub fn deadlines(cert: &Cert, refresh: std::time::Duration, mode: Mode) -> Vec<i64> {
    let mut points = vec![cert.not_after];
    if mode == Mode::Rotate {
        points.push(lifetime_fraction_point(cert) + 1);
        points.push(cert.not_before + refresh.as_secs() as i64 + 1);
    }
    points
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::pki;
    use crate::regenerate::config::ObjectRef;

    const DAY: i64 = 86_400;

    fn object(name: &str) -> ObjectRef {
        ObjectRef {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn signer_config() -> Signer {
        Signer {
            object: object("signer"),
            validity: Duration::from_secs(100 * DAY as u64),
            refresh: Duration::from_secs(50 * DAY as u64),
        }
    }

    fn serving_target() -> Target {
        Target {
            object: object("serving"),
            signer: 0,
            identity: Identity::Serving {
                hostnames: vec!["127.0.0.1".into(), "localhost".into()],
            },
            validity: Duration::from_secs(100 * DAY as u64),
            refresh: Duration::from_secs(50 * DAY as u64),
        }
    }

    /// A signer issued at `issued` for 100 days (no backdate).
    fn ca(issued: i64) -> KeyPairPem {
        pki::new_signer(
            "ns_signer@1",
            issued,
            Duration::ZERO,
            Duration::from_secs(100 * DAY as u64),
        )
        .unwrap()
    }

    #[test]
    fn expired_only_leaves_a_signer_at_99_percent_alone_and_rotate_replaces_it() {
        let now = 1_800_000_000;
        let config = signer_config();
        let found = Some(Ok(ca(now - 99 * DAY)));
        assert_eq!(signer(&found, &config, Mode::ExpiredOnly, now), None);
        assert!(matches!(
            signer(&found, &config, Mode::Rotate, now),
            Some(Reason::PastLifetimeFraction { .. })
        ));
        let expired = Some(Ok(ca(now - 101 * DAY)));
        assert!(matches!(
            signer(&expired, &config, Mode::ExpiredOnly, now),
            Some(Reason::Expired { .. })
        ));
        assert_eq!(
            signer(&None, &config, Mode::ExpiredOnly, now),
            Some(Reason::Missing)
        );
        let garbage = Some(Err("tls.crt is not PEM".to_owned()));
        assert!(matches!(
            signer(&garbage, &config, Mode::ExpiredOnly, now),
            Some(Reason::Unusable(_))
        ));
        // Rotate: past notBefore + refresh (50 d) but before 80 %.
        let refreshed = Some(Ok(ca(now - 60 * DAY)));
        assert!(matches!(
            signer(&refreshed, &config, Mode::Rotate, now),
            Some(Reason::PastRefresh { .. })
        ));
        assert_eq!(signer(&refreshed, &config, Mode::ExpiredOnly, now), None);
    }

    #[test]
    fn a_leaf_is_judged_by_its_certificate_chain_and_names() {
        let now = 1_800_000_000;
        let config = serving_target();
        let signer_pair = ca(now - DAY);
        let roots = vec![signer_pair.cert().clone()];
        let leaf = |issued: i64| {
            pki::new_leaf(
                &signer_pair,
                &config.identity,
                issued,
                Duration::ZERO,
                Duration::from_secs(100 * DAY as u64),
            )
            .unwrap()
        };
        // Fresh leaf: kept in both modes.
        let fresh = Some(Ok(leaf(now - 1)));
        assert_eq!(
            target(
                &fresh,
                &config,
                &roots,
                signer_pair.cert(),
                Mode::Rotate,
                now
            ),
            None
        );
        // A leaf never outlives its signer.
        let Some(Ok(pair)) = &fresh else {
            unreachable!()
        };
        assert_eq!(pair.cert().not_after, signer_pair.cert().not_after);
        // Hostnames drift: replaced even in expired-only mode.
        let mut other = config.clone();
        other.identity = Identity::Serving {
            hostnames: vec!["api.example".into()],
        };
        assert!(matches!(
            target(
                &fresh,
                &other,
                &roots,
                signer_pair.cert(),
                Mode::ExpiredOnly,
                now
            ),
            Some(Reason::HostnamesChanged { .. })
        ));
        // Issued by a CA that is not in the bundle: the chain is broken.
        let stranger = ca(now - DAY);
        assert!(matches!(
            target(
                &fresh,
                &config,
                &[stranger.cert().clone()],
                signer_pair.cert(),
                Mode::ExpiredOnly,
                now
            ),
            Some(Reason::ChainBroken(_))
        ));
        // Expired (checked at a later "now").
        let later = now + 200 * DAY;
        assert!(matches!(
            target(
                &fresh,
                &config,
                &roots,
                signer_pair.cert(),
                Mode::ExpiredOnly,
                later
            ),
            Some(Reason::Expired { .. })
        ));
    }

    #[test]
    fn rotate_mode_waits_for_the_new_signer_to_settle_before_moving_leaves() {
        let now = 1_800_000_000;
        let config = serving_target();
        let old_signer = ca(now - 70 * DAY);
        let leaf = pki::new_leaf(
            &old_signer,
            &config.identity,
            now - 60 * DAY,
            Duration::ZERO,
            Duration::from_secs(100 * DAY as u64),
        )
        .unwrap();
        let found = Some(Ok(leaf));
        let new_signer = ca(now - DAY);
        let roots = vec![old_signer.cert().clone(), new_signer.cert().clone()];
        // The new signer is 1 day old; refresh/10 = 5 days: wait.
        assert_eq!(
            target(
                &found,
                &config,
                &roots,
                new_signer.cert(),
                Mode::Rotate,
                now
            ),
            None
        );
        let settled = ca(now - 6 * DAY);
        let roots = vec![old_signer.cert().clone(), settled.cert().clone()];
        assert!(matches!(
            target(&found, &config, &roots, settled.cert(), Mode::Rotate, now),
            Some(Reason::PastRefresh { .. })
        ));
        assert_eq!(
            target(
                &found,
                &config,
                &roots,
                settled.cert(),
                Mode::ExpiredOnly,
                now
            ),
            None
        );
    }

    #[test]
    fn bundles_keep_unexpired_cas_drop_expired_ones_dedupe_and_sort() {
        let now = 1_800_000_000;
        let old = ca(now - 50 * DAY);
        let expired = ca(now - 150 * DAY);
        let new = ca(now);
        let existing = vec![
            old.cert().clone(),
            expired.cert().clone(),
            new.cert().clone(),
        ];
        let result = bundle(&existing, &[new.cert()], &[], now);
        assert_eq!(result.len(), 2);
        let again = bundle(
            &[new.cert().clone(), old.cert().clone()],
            &[new.cert()],
            &[],
            now,
        );
        let der = |v: &[Cert]| v.iter().map(|c| c.der.to_vec()).collect::<Vec<_>>();
        assert_eq!(
            der(&result),
            der(&again),
            "the order does not depend on the input order"
        );
    }

    #[test]
    fn a_clock_behind_the_newest_not_before_is_refused() {
        let now = 1_800_000_000;
        let pair = ca(now);
        let seen = [("secret ns/signer", pair.cert())];
        let margin = Duration::from_secs(300);
        assert!(clock_check(seen, margin, now, None).is_ok());
        assert!(clock_check(seen, margin, now - 299, None).is_ok());
        let err = clock_check(seen, margin, now - DAY, None).unwrap_err();
        assert!(
            err.contains("secret ns/signer") && err.contains("refusing"),
            "{err}"
        );
    }

    #[test]
    fn deadlines_are_the_expiry_and_in_rotate_mode_the_rotation_points() {
        let now = 1_800_000_000;
        let pair = ca(now - 10 * DAY);
        let cert = pair.cert();
        let refresh = Duration::from_secs(50 * DAY as u64);
        assert_eq!(
            deadlines(cert, refresh, Mode::ExpiredOnly),
            vec![cert.not_after]
        );
        assert_eq!(
            deadlines(cert, refresh, Mode::Rotate),
            vec![
                cert.not_after,
                lifetime_fraction_point(cert) + 1,
                cert.not_before + 50 * DAY + 1
            ]
        );
    }

    const YEAR: i64 = 365 * DAY;

    #[test]
    fn a_local_clock_three_years_ahead_expires_nothing_still_valid_at_the_apiservers_time() {
        let real = 1_800_000_000;
        let ahead = real + 3 * YEAR;
        let config = signer_config();
        let pair = ca(real - 10 * DAY);
        let cert = pair.cert().clone();
        let found = Some(Ok(pair));
        // The local clock alone would call it expired and prune it from the bundle.
        assert!(matches!(
            signer(&found, &config, Mode::ExpiredOnly, ahead),
            Some(Reason::Expired { .. })
        ));
        assert!(bundle(std::slice::from_ref(&cert), &[], &[], ahead).is_empty());
        // Checked against the apiserver's clock, nothing is expired and nothing is pruned.
        let now = trusted_now(ahead, Some(real));
        assert_eq!(now, real);
        assert_eq!(signer(&found, &config, Mode::ExpiredOnly, now), None);
        assert_eq!(bundle(std::slice::from_ref(&cert), &[], &[], now).len(), 1);
        // A local clock behind the apiserver's stays the earlier one (the clock check's job).
        assert_eq!(trusted_now(real - DAY, Some(real)), real - DAY);
        assert_eq!(trusted_now(ahead, None), ahead);
    }

    #[test]
    fn an_expired_ca_a_managed_leaf_was_issued_by_stays_in_the_bundle_until_it_is_reissued() {
        let now = 1_800_000_000;
        let expired = ca(now - 150 * DAY);
        let valid = ca(now - DAY);
        let issue = |signer: &KeyPairPem| {
            pki::new_leaf(
                signer,
                &serving_target().identity,
                now - 150 * DAY,
                Duration::ZERO,
                Duration::from_secs(100 * DAY as u64),
            )
            .unwrap()
        };
        let old_leaf = issue(&expired);
        let existing = [expired.cert().clone(), valid.cert().clone()];
        let kept = bundle(&existing, &[valid.cert()], &[old_leaf.cert()], now);
        assert_eq!(kept.len(), 2, "the old leaf still chains to the expired CA");
        assert!(kept.iter().any(|c| c.der == expired.cert().der));
        // Once the leaf is re-issued by the current signer, the expired CA goes.
        let new_leaf = issue(&valid);
        let pruned = bundle(&existing, &[valid.cert()], &[new_leaf.cert()], now);
        assert_eq!(pruned.len(), 1);
        assert_eq!(pruned[0].der, valid.cert().der);
        // A leaf of another CA with the same name does not keep it: the signature decides.
        let twin = ca(now - 150 * DAY);
        let twin_leaf = issue(&twin);
        assert!(pki::issued_by(twin_leaf.cert(), twin.cert()));
        assert!(!pki::issued_by(twin_leaf.cert(), expired.cert()));
        assert_eq!(
            bundle(&existing, &[valid.cert()], &[twin_leaf.cert()], now).len(),
            1
        );
    }

    #[test]
    fn a_certificate_in_the_future_by_both_clocks_is_regenerated_not_proof_of_a_wrong_clock() {
        let real = 1_800_000_000;
        let margin = Duration::from_secs(300);
        // Written by a regenerate whose clock was three years ahead.
        let from_the_future = ca(real + 3 * YEAR);
        let cert = from_the_future.cert().clone();
        let seen = [("secret ns/signer", &cert)];
        let found = Some(Ok(from_the_future));
        // Without the apiserver's clock: refused, as before (cannot tell the two apart).
        assert!(clock_check(seen, margin, real, None).is_err());
        // The apiserver agrees with the local clock: the certificate is what is wrong.
        assert!(clock_check(seen, margin, real, Some(real)).is_ok());
        assert!(matches!(
            not_yet_valid(&found, margin, real),
            Some(Reason::NotYetValid { .. })
        ));
        // A local clock behind the apiserver's is still refused: our own fresh certificate
        // is valid at the apiserver's time, so nothing valid is replaced.
        let fresh = ca(real);
        let seen = [("secret ns/signer", fresh.cert())];
        let err = clock_check(seen, margin, real - DAY, Some(real)).unwrap_err();
        assert!(
            err.contains("apiserver") && err.contains("refusing"),
            "{err}"
        );
        assert_eq!(not_yet_valid(&Some(Ok(fresh)), margin, real), None);
    }
}
