//! Intermediate CAs (library-go's `SignerRotation`, the kube-controller-manager's `csr-signer`)
//! and what is built from them: the decisions and the generation, as pure functions of what was
//! read and the time (the I/O is `phases::intermediates`).
//!
//! OpenShift's chain (cluster-kube-controller-manager-operator, `CSRSigningCert` rotator and
//! `CSRController`): the self-signed `csr-signer-signer` issues the intermediate `csr-signer`
//! (CN `kube-csr-signer_@<unix>`, `tls.crt` = the CA then its issuer); `csr-signer-ca` collects
//! every unexpired CA `csr-signer`'s `tls.crt` held (so kubelet certificates from the previous
//! CA stay trusted); `csr-controller-ca` is the union of `csr-signer-ca` and
//! `csr-controller-signer-ca`; and the kube-controller-manager gets a copy of the CA
//! (`tls.crt` = the CA alone) only 5 minutes after the new CA was made, so that its trust has
//! reached the kube-apiserver's `client-ca` before the first certificate it signs is presented
//! — at once when the copy is missing or already expired.
//!
//! Ours measures the delay from the CA's notBefore plus the config's `backdate` (ours start
//! `backdate` in the past, library-go's 1 s): a CA library-go made is published by ours at most
//! `backdate` later than by library-go, never earlier, so the two never disagree about a copy
//! the other has just written.

use std::time::Duration;

use rcgen::Issuer;

use super::config::Intermediate;
use super::decide::{self, Mode, Reason, Stored};
#[cfg(test)]
use crate::pki::KeyType;
use crate::pki::{self, Cert, KeyPairPem};

/// Whether the intermediate must be regenerated: missing or unusable, not a CA, expired, named
/// for another signer name, or no longer chaining to its signer's bundle (`roots`, as it will
/// be after this pass); in rotate mode also past 80 % of its lifetime, or past its refresh time
/// once the current signer (`signer`) has been out a tenth of the refresh period
/// ([`decide::rotation_due`], as for a target).
pub fn decide(
    found: &Stored,
    config: &Intermediate,
    roots: &[Cert],
    signer: &Cert,
    mode: Mode,
    now: i64,
) -> Option<Reason> {
    let cert = match decide::usable_ca(found, now) {
        Ok(cert) => cert,
        Err(reason) => return Some(reason),
    };
    let prefix = format!("{}_@", config.common_name);
    if !cert
        .common_name
        .as_deref()
        .is_some_and(|cn| cn.starts_with(&prefix))
    {
        return Some(Reason::Unusable(format!(
            "its CN {:?} is not {prefix}<time>",
            cert.common_name.as_deref().unwrap_or_default()
        )));
    }
    if let Err(why) = pki::chains_to(std::slice::from_ref(cert), roots, now) {
        return Some(Reason::ChainBroken(why.to_string()));
    }
    decide::rotation_due(cert, config.refresh, Some(signer), mode, now)
}

/// What to do with the published copy of an intermediate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Publication {
    /// The copy holds the current CA: nothing to write.
    Current,
    /// Write the current CA now (`label`: metrics; `reason`: the log line).
    Now { label: &'static str, reason: String },
    /// The copy is a valid older CA: keep it until `until` (Unix seconds), then publish.
    Wait { until: i64 },
}

/// Whether to publish `source` (the intermediate as stored now) over `published`.
pub fn publication(
    source: &Cert,
    published: &Stored,
    delay: Duration,
    backdate: Duration,
    now: i64,
) -> Publication {
    let current = match published {
        Stored::Missing => {
            return Publication::Now {
                label: "missing",
                reason: "missing".to_owned(),
            };
        }
        Stored::Unusable(why) => {
            return Publication::Now {
                label: "unusable",
                reason: format!("unusable: {why}"),
            };
        }
        Stored::Usable(pair) => pair.cert(),
    };
    if current.der == source.der {
        return Publication::Current;
    }
    if current.is_expired_at(now) {
        return Publication::Now {
            label: "expired",
            reason: format!(
                "the published CA expired at {}",
                crate::base::time::rfc3339(current.not_after)
            ),
        };
    }
    let until = publish_at(source, delay, backdate);
    if now >= until {
        Publication::Now {
            label: "delay-passed",
            reason: format!(
                "a new CA, made at {}, has had {}s to reach every bundle",
                crate::base::time::rfc3339(source.not_before + backdate.as_secs() as i64),
                delay.as_secs()
            ),
        }
    } else {
        Publication::Wait { until }
    }
}

/// When a new CA may replace a valid published one: made (notBefore + `backdate`) + `delay`.
pub fn publish_at(source: &Cert, delay: Duration, backdate: Duration) -> i64 {
    source.not_before + backdate.as_secs() as i64 + delay.as_secs() as i64
}

/// A union bundle's content: the unexpired CAs of `sources`, in source order, each once (by
/// DER), as library-go's `CombineCABundleConfigMaps` builds it.
pub fn union(sources: &[&[Cert]], now: i64) -> Vec<Cert> {
    let mut certs: Vec<Cert> = Vec::new();
    for cert in sources.iter().flat_map(|s| s.iter()) {
        // Only CAs: a leaf in a source bundle is no trust anchor anyone meant to share.
        if cert.is_ca && !cert.is_expired_at(now) && !certs.iter().any(|c| c.der == cert.der) {
            certs.push(cert.clone());
        }
    }
    certs
}

/// What an intermediate's bundle collects from its `tls.crt`: the CA itself and, when the next
/// certificate is a CA that verifiably issued it, that issuer — never anything else the chain
/// holds (library-go appends every certificate of `tls.crt`; a stray leaf or unrelated CA put
/// there would become trusted for every client certificate).
pub fn collected(pair: &KeyPairPem) -> Vec<&Cert> {
    let mut out: Vec<&Cert> = Vec::new();
    if let Some(ca) = pair.chain.first().filter(|c| c.is_ca) {
        out.push(ca);
        if let Some(issuer) = pair.chain.get(1)
            && issuer.is_ca
            && pki::issued_by(ca, issuer)
        {
            out.push(issuer);
        }
    }
    out
}

/// A new intermediate CA with a `key_type` key, signed by `signer`, CN `<name>_@<now>`, valid
/// from `now - backdate` for `validity` but never past the signer's notAfter; its chain is the
/// CA then the signer's chain, as library-go writes `tls.crt`.
#[cfg(test)]
pub fn generate(
    key_type: KeyType,
    signer: &KeyPairPem,
    name: &str,
    now: i64,
    backdate: Duration,
    validity: Duration,
) -> Result<KeyPairPem, String> {
    generate_with(key_type.generate()?, signer, name, now, backdate, validity)
}

/// [`generate`] with a key made beforehand (`keys`).
pub fn generate_with(
    key: rcgen::KeyPair,
    signer: &KeyPairPem,
    name: &str,
    now: i64,
    backdate: Duration,
    validity: Duration,
) -> Result<KeyPairPem, String> {
    let ca_key = pki::signing_key(&signer.key_pem)?;
    let issuer = Issuer::from_ca_cert_der(&signer.cert().der, ca_key)
        .map_err(|e| format!("signer certificate: {e}"))?;
    let mut params = pki::ca_params(
        &format!("{name}_@{now}"),
        now - backdate.as_secs() as i64,
        (now + validity.as_secs() as i64).min(signer.cert().not_after),
    )?;
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, &issuer).map_err(|e| e.to_string())?;
    let mut chain = vec![Cert::from_der(cert.der().clone())?];
    chain.extend(signer.chain.iter().cloned());
    Ok(KeyPairPem {
        chain,
        key_pem: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::Identity;
    use crate::regenerate::config::ObjectRef;

    const DAY: i64 = 86_400;
    const NOW: i64 = 1_800_000_000;

    fn config() -> Intermediate {
        Intermediate {
            object: ObjectRef {
                namespace: "op".into(),
                name: "csr-signer".into(),
            },
            signer: 0,
            common_name: "kube-csr-signer".into(),
            validity: Duration::from_secs(30 * DAY as u64),
            refresh: Duration::from_secs(15 * DAY as u64),
            bundle: None,
            publish: None,
            priority: None,
        }
    }

    fn root(issued: i64) -> KeyPairPem {
        pki::new_signer(
            "op_csr-signer-signer@1",
            issued,
            Duration::ZERO,
            Duration::from_secs(60 * DAY as u64),
        )
        .unwrap()
    }

    fn intermediate(signer: &KeyPairPem, issued: i64) -> KeyPairPem {
        generate(
            KeyType::EcdsaP256,
            signer,
            "kube-csr-signer",
            issued,
            Duration::ZERO,
            Duration::from_secs(30 * DAY as u64),
        )
        .unwrap()
    }

    #[test]
    fn an_intermediate_is_a_ca_named_as_library_go_names_it_and_issues_leaves_that_verify() {
        let signer = root(NOW);
        let pair = intermediate(&signer, NOW);
        let cert = pair.cert();
        assert!(cert.is_ca);
        assert_eq!(
            cert.common_name.as_deref(),
            Some(format!("kube-csr-signer_@{NOW}").as_str())
        );
        assert!(pki::issued_by(cert, signer.cert()));
        assert_eq!(pair.chain.len(), 2, "tls.crt: the CA, then its issuer");
        // A leaf from the intermediate verifies against the root alone, with the chain served.
        let identity = Identity::Client {
            user: "system:node:n1".into(),
            groups: vec!["system:nodes".into()],
        };
        let mut leaf = pki::new_leaf(
            &pair,
            &identity,
            NOW,
            Duration::ZERO,
            Duration::from_secs(DAY as u64),
        )
        .unwrap();
        leaf.chain.push(cert.clone());
        pki::verify::verify_chain(&leaf, &[signer.cert().clone()], &identity, NOW + 1).unwrap();
        // Never outlives its signer.
        let late = intermediate(&signer, NOW + 50 * DAY);
        assert_eq!(late.cert().not_after, signer.cert().not_after);
    }

    #[test]
    fn expired_only_keeps_a_valid_intermediate_and_rotate_moves_it_after_the_signer_settles() {
        let signer = root(NOW - 20 * DAY);
        let roots = [signer.cert().clone()];
        let found = Stored::Usable(intermediate(&signer, NOW - 16 * DAY));
        let cfg = config();
        assert_eq!(
            decide(&found, &cfg, &roots, signer.cert(), Mode::ExpiredOnly, NOW),
            None
        );
        // Past notBefore + 15 d, the signer out for 20 d > 1.5 d: rotate.
        assert!(matches!(
            decide(&found, &cfg, &roots, signer.cert(), Mode::Rotate, NOW),
            Some(Reason::PastRefresh { .. })
        ));
        // A signer made an hour ago has not settled: wait.
        let fresh = root(NOW - 3600);
        let both = [signer.cert().clone(), fresh.cert().clone()];
        assert_eq!(
            decide(&found, &cfg, &both, fresh.cert(), Mode::Rotate, NOW),
            None
        );
        // Expired, missing, not a CA, a stranger's, another name: regenerated in either mode.
        let later = NOW + 30 * DAY;
        assert!(matches!(
            decide(
                &found,
                &cfg,
                &roots,
                signer.cert(),
                Mode::ExpiredOnly,
                later
            ),
            Some(Reason::Expired { .. })
        ));
        assert_eq!(
            decide(
                &Stored::Missing,
                &cfg,
                &roots,
                signer.cert(),
                Mode::ExpiredOnly,
                NOW
            ),
            Some(Reason::Missing)
        );
        let stranger = root(NOW - DAY);
        assert!(matches!(
            decide(
                &found,
                &cfg,
                &[stranger.cert().clone()],
                stranger.cert(),
                Mode::ExpiredOnly,
                NOW
            ),
            Some(Reason::ChainBroken(_))
        ));
        let leaf = pki::new_leaf(
            &signer,
            &Identity::Client {
                user: "u".into(),
                groups: vec![],
            },
            NOW - DAY,
            Duration::ZERO,
            Duration::from_secs(10 * DAY as u64),
        )
        .unwrap();
        assert_eq!(
            decide(
                &Stored::Usable(leaf),
                &cfg,
                &roots,
                signer.cert(),
                Mode::ExpiredOnly,
                NOW
            ),
            Some(Reason::NotACa)
        );
        let mut renamed = cfg.clone();
        renamed.common_name = "other-signer".into();
        assert!(matches!(
            decide(
                &found,
                &renamed,
                &roots,
                signer.cert(),
                Mode::ExpiredOnly,
                NOW
            ),
            Some(Reason::Unusable(_))
        ));
    }

    #[test]
    fn a_new_ca_is_published_after_the_delay_at_once_over_a_missing_or_expired_copy() {
        let signer = root(NOW - 40 * DAY);
        let old = intermediate(&signer, NOW - 20 * DAY);
        let new = intermediate(&signer, NOW);
        let delay = Duration::from_secs(300);
        let backdate = Duration::from_secs(60);
        let published = Stored::Usable(old);
        // Made at NOW - 0 (backdate 0 in the fixture, 60 s in the config): until NOW + 360.
        assert_eq!(
            publication(new.cert(), &published, delay, backdate, NOW),
            Publication::Wait { until: NOW + 360 }
        );
        assert_eq!(
            publication(new.cert(), &published, delay, backdate, NOW + 359),
            Publication::Wait { until: NOW + 360 }
        );
        assert!(matches!(
            publication(new.cert(), &published, delay, backdate, NOW + 360),
            Publication::Now {
                label: "delay-passed",
                ..
            }
        ));
        // The old copy has expired (10 d later): at once, whatever the delay.
        let much_later = NOW + 10 * DAY + 1;
        let fresh = intermediate(&signer, much_later);
        assert!(matches!(
            publication(fresh.cert(), &published, delay, backdate, much_later),
            Publication::Now {
                label: "expired",
                ..
            }
        ));
        assert!(matches!(
            publication(new.cert(), &Stored::Missing, delay, backdate, NOW),
            Publication::Now {
                label: "missing",
                ..
            }
        ));
        assert!(matches!(
            publication(
                new.cert(),
                &Stored::Unusable("garbage".into()),
                delay,
                backdate,
                NOW
            ),
            Publication::Now {
                label: "unusable",
                ..
            }
        ));
        // The same CA: nothing to do (however long it has been).
        let same = Stored::Usable(KeyPairPem {
            chain: vec![new.cert().clone()],
            key_pem: new.key_pem.clone(),
        });
        assert_eq!(
            publication(new.cert(), &same, delay, backdate, NOW + DAY),
            Publication::Current
        );
    }

    /// On tokio's paused clock: a pass that finds a new CA and a valid older copy sleeps until
    /// the publication time (the deadline it reports), then publishes — not a second earlier.
    #[tokio::test(start_paused = true)]
    async fn the_publication_deadline_wakes_the_loop_exactly_when_the_delay_has_passed() {
        let signer = root(NOW - 40 * DAY);
        let published = Stored::Usable(intermediate(&signer, NOW - 20 * DAY));
        let new = intermediate(&signer, NOW);
        let (delay, backdate) = (Duration::from_secs(300), Duration::ZERO);
        let start = tokio::time::Instant::now();
        let clock = || NOW + start.elapsed().as_secs() as i64;
        let Publication::Wait { until } =
            publication(new.cert(), &published, delay, backdate, clock())
        else {
            panic!("a valid older copy must wait")
        };
        tokio::time::sleep(Duration::from_secs((until - clock()) as u64)).await;
        assert!(matches!(
            publication(new.cert(), &published, delay, backdate, clock()),
            Publication::Now { .. }
        ));
        assert_eq!(start.elapsed(), delay);
        assert!(matches!(
            publication(new.cert(), &published, delay, backdate, clock() - 1),
            Publication::Wait { .. }
        ));
    }

    #[test]
    fn a_union_is_its_sources_unexpired_cas_in_source_order_each_once() {
        let a = root(NOW - DAY);
        let b = root(NOW - 2 * DAY);
        let expired = root(NOW - 61 * DAY);
        let first = [a.cert().clone(), expired.cert().clone()];
        let second = [b.cert().clone(), a.cert().clone()];
        let got = union(&[&first, &second], NOW);
        let ders: Vec<_> = got.iter().map(|c| c.der.clone()).collect();
        assert_eq!(ders, vec![a.cert().der.clone(), b.cert().der.clone()]);
        assert!(union(&[&[], &[expired.cert().clone()]], NOW).is_empty());
    }
}
