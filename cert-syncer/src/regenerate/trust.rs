//! The rule of issue 35 item 5, checked: nothing is issued by, or published for, a CA that
//! the bundles its consumers verify with do not hold yet. A write that issues from a CA (a
//! target, an intermediate CA) or publishes one first checks every bundle the graph lists for
//! it (`graph::Graph::trust`) *as stored*: a bundle whose write the brake held, that failed,
//! or that this pass could not read does not count as written. The write then waits
//! (`report.held`, `HeldBy::Trust`), and is made by the pass after the bundle holds the CA.

use std::time::Duration;

use super::config::ObjectRef;
use crate::pki::Cert;

/// A CA bundle as a step of the pass left it (a declared bundle, the one collecting an
/// intermediate, a union, a ConfigMap copy): what the object holds now, as far as this pass
/// knows, and why it may not hold what the pass wanted.
#[derive(Debug, Clone)]
pub(super) struct BundleState {
    pub object: ObjectRef,
    /// Its CAs as stored (read after its step; `Err`: unreadable).
    pub stored: Result<Vec<Cert>, String>,
    /// Why its step did not write what it wanted, if it did not.
    pub not_written: Option<NotWritten>,
}

/// Why a bundle's step did not write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum NotWritten {
    /// The brake held the write, until then (from the pass).
    Held(Option<Duration>),
    /// The step failed (or was skipped), why.
    Failed(String),
}

/// A write that must wait: what for, and when that may change (if known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Untrusted {
    pub waits_for: String,
    pub release_in: Option<Duration>,
}

/// The CAs the bundles that list a signer hold: what a certificate it issued must chain to.
pub(super) fn roots(bundles: &[&BundleState]) -> Result<Vec<Cert>, String> {
    let mut roots = Vec::new();
    for bundle in bundles {
        let certs = bundle
            .stored
            .as_ref()
            .map_err(|_| "skipped, its signer's CA bundle is unavailable".to_owned())?;
        roots.extend(certs.iter().cloned());
    }
    Ok(roots)
}

/// `Ok` when every one of `bundles` holds `ca` (`what`: "its signer's CA", "the CA").
pub(super) fn check(ca: &Cert, what: &str, bundles: &[&BundleState]) -> Result<(), Untrusted> {
    for bundle in bundles {
        let why = match &bundle.stored {
            Ok(certs) if certs.iter().any(|c| c.der == ca.der) => continue,
            Ok(_) => match &bundle.not_written {
                Some(NotWritten::Held(release_in)) => {
                    return Err(Untrusted {
                        waits_for: format!(
                            "configmap {} to hold {what} (its write is held by the brake: \
                             RegenerationLoop)",
                            bundle.object
                        ),
                        release_in: *release_in,
                    });
                }
                Some(NotWritten::Failed(why)) => format!("its write failed: {why}"),
                None => "not written in this pass".to_owned(),
            },
            Err(why) => format!("unreadable: {why}"),
        };
        return Err(Untrusted {
            waits_for: format!("configmap {} to hold {what} ({why})", bundle.object),
            release_in: None,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki;

    fn ca(cn: &str) -> Cert {
        pki::new_signer(
            cn,
            1_800_000_000,
            Duration::ZERO,
            Duration::from_secs(86_400),
        )
        .unwrap()
        .cert()
        .clone()
    }

    fn state(name: &str, certs: Vec<Cert>, not_written: Option<NotWritten>) -> BundleState {
        BundleState {
            object: ObjectRef {
                namespace: "ns".into(),
                name: name.into(),
            },
            stored: Ok(certs),
            not_written,
        }
    }

    /// Held, failed and unreadable bundles do not count as written; the hold says when it
    /// ends.
    #[test]
    fn only_a_bundle_that_holds_the_ca_as_stored_counts() {
        let (old, new) = (ca("old"), ca("new"));
        let written = state("a", vec![old.clone(), new.clone()], None);
        assert_eq!(check(&new, "the CA", &[&written]), Ok(()));
        let held = state(
            "b",
            vec![old.clone()],
            Some(NotWritten::Held(Some(Duration::from_secs(570)))),
        );
        let waits = check(&new, "its signer's CA", &[&written, &held]).unwrap_err();
        assert_eq!(waits.release_in, Some(Duration::from_secs(570)));
        assert!(
            waits
                .waits_for
                .contains("configmap ns/b to hold its signer's CA")
                && waits.waits_for.contains("RegenerationLoop"),
            "{waits:?}"
        );
        let failed = state(
            "c",
            vec![old.clone()],
            Some(NotWritten::Failed("500".into())),
        );
        assert!(
            check(&new, "the CA", &[&failed])
                .unwrap_err()
                .waits_for
                .contains("failed: 500")
        );
        let unreadable = BundleState {
            stored: Err("403".into()),
            ..state("d", Vec::new(), None)
        };
        assert!(check(&old, "the CA", &[&unreadable]).is_err());
        // A held bundle that already holds the CA is no reason to wait.
        assert_eq!(check(&old, "the CA", &[&held]), Ok(()));
    }
}
