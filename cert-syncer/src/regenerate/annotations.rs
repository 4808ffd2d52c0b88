//! The labels and annotations OpenShift's library-go (`pkg/operator/certrotation`) reads and
//! writes, and how ours uses them.
//!
//! Written on every write, exactly as library-go writes them, so that OpenShift's own
//! controllers find nothing to change on an object we made: the certificate's dates and issuer
//! (`auth.openshift.io/certificate-*`), the serving hostnames (sorted, comma-separated), the
//! refresh period as a Go duration (`6h0m0s`), the managed-type label, and the per-object
//! metadata the config declares (`openshift.io/owning-component`, `openshift.io/description`,
//! `certificates.openshift.io/test-name`, `certificates.openshift.io/auto-regenerate-after-offline-expiry`).
//! library-go rewrites an object whose metadata differs from its own (its
//! `EnsureTLSMetadataUpdate`), so a profile meant to live next to OpenShift's controller must
//! declare the same values (the built-in profiles do).
//!
//! Read for one decision only, as library-go does: a signer or target Secret that carries
//! OpenShift's managed-type label but whose `certificate-not-after` / `-not-before` annotation is
//! missing or unparsable needs a new pair — OpenShift's documented manual rotation trigger
//! (remove the annotation, save). library-go checks this before its `RefreshOnlyWhenExpired`
//! test, so its recovery controller regenerates in that mode too (observed: the
//! `kube-apiserver-to-kubelet-signer` experiment in `manifests/openshift/observed-pki.md`); ours
//! does the same in both modes. `auto-regenerate-after-offline-expiry` carries no behaviour in
//! library-go (a link for OpenShift's test suite, which checks that artifacts carrying it are
//! regenerated after an offline expiry): ours keeps it on every object it writes and regenerates
//! expired material whether or not it is present.

use std::collections::BTreeMap;

pub const NOT_AFTER: &str = "auth.openshift.io/certificate-not-after";
pub const NOT_BEFORE: &str = "auth.openshift.io/certificate-not-before";
pub const ISSUER: &str = "auth.openshift.io/certificate-issuer";
pub const HOSTNAMES: &str = "auth.openshift.io/certificate-hostnames";
pub const REFRESH_PERIOD: &str = "certificates.openshift.io/refresh-period";
/// The label: `signer`, `target` or `ca-bundle`.
pub const MANAGED_TYPE: &str = "auth.openshift.io/managed-certificate-type";

/// Annotation keys a config may not set: they describe the certificate and are computed.
const COMPUTED: &[&str] = &[NOT_AFTER, NOT_BEFORE, ISSUER, HOSTNAMES, REFRESH_PERIOD];

/// Checks the annotations a config declares: Kubernetes-shaped keys, none of the computed ones.
pub fn check_keys(annotations: &BTreeMap<String, String>) -> Result<(), String> {
    for key in annotations.keys() {
        if COMPUTED.contains(&key.as_str()) {
            return Err(format!(
                "annotation {key} is computed from the certificate and cannot be set"
            ));
        }
        let name = key.rsplit('/').next().unwrap_or_default();
        let valid = !name.is_empty()
            && name.len() <= 63
            && key.matches('/').count() <= 1
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !valid {
            return Err(format!("annotation key {key:?} is not a valid key"));
        }
    }
    Ok(())
}

/// A duration as Go's `time.Duration.String` prints whole seconds (`6h0m0s`, `1m30s`, `45s`),
/// the format of library-go's refresh-period annotation.
pub fn go_duration(duration: std::time::Duration) -> String {
    let total = duration.as_secs();
    let (hours, minutes, seconds) = (total / 3600, total / 60 % 60, total % 60);
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds}s")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

/// Why library-go would find the validity annotations of a managed Secret unusable (its
/// `getValidityFromAnnotations`), or `None`. Only Secrets labelled as OpenShift-managed
/// (`managed_type` set) are judged: on other Secrets the annotations are ours to write, and
/// the certificate alone decides.
pub fn validity_problem(
    managed_type: Option<&str>,
    annotations: Option<&BTreeMap<String, String>>,
) -> Option<String> {
    managed_type?;
    let get = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
    let parse = |text: &str| {
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).is_ok()
    };
    match get(NOT_AFTER) {
        None | Some("") => return Some(format!("annotation {NOT_AFTER} missing")),
        Some(text) if !parse(text) => return Some(format!("annotation {NOT_AFTER} unparsable")),
        Some(_) => {}
    }
    match get(NOT_BEFORE) {
        None | Some("") => Some(format!("annotation {NOT_BEFORE} missing")),
        Some(text) if !parse(text) => Some(format!("annotation {NOT_BEFORE} unparsable")),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn refresh_periods_print_as_go_durations() {
        assert_eq!(go_duration(Duration::from_secs(6 * 3600)), "6h0m0s");
        assert_eq!(
            go_duration(Duration::from_secs(70_080 * 3600)),
            "70080h0m0s"
        );
        assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(go_duration(Duration::from_secs(45)), "45s");
        assert_eq!(go_duration(Duration::from_secs(3600 + 61)), "1h1m1s");
    }

    #[test]
    fn validity_annotations_are_judged_only_on_managed_secrets() {
        let full = BTreeMap::from([
            (NOT_AFTER.to_owned(), "2030-01-01T00:00:00Z".to_owned()),
            (NOT_BEFORE.to_owned(), "2020-01-01T00:00:00Z".to_owned()),
        ]);
        assert_eq!(validity_problem(Some("signer"), Some(&full)), None);
        let mut removed = full.clone();
        removed.remove(NOT_AFTER);
        assert!(
            validity_problem(Some("signer"), Some(&removed))
                .unwrap()
                .contains("not-after missing")
        );
        assert_eq!(validity_problem(None, Some(&removed)), None);
        let mut bad = full.clone();
        bad.insert(NOT_BEFORE.to_owned(), "yesterday".to_owned());
        assert!(
            validity_problem(Some("target"), Some(&bad))
                .unwrap()
                .contains("unparsable")
        );
        assert!(validity_problem(Some("target"), None).is_some());
    }

    #[test]
    fn computed_and_malformed_keys_are_refused() {
        let ok = BTreeMap::from([("openshift.io/description".to_owned(), "x".to_owned())]);
        assert!(check_keys(&ok).is_ok());
        let computed = BTreeMap::from([(NOT_AFTER.to_owned(), "x".to_owned())]);
        assert!(check_keys(&computed).is_err());
        let bad = BTreeMap::from([("a/b/c".to_owned(), "x".to_owned())]);
        assert!(check_keys(&bad).is_err());
    }
}
