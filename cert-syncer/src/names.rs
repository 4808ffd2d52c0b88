//! Kubernetes name rules, checked before a name becomes a path component or a request path.

/// DNS-1123 subdomain: what the apiserver accepts as a Secret or ConfigMap name, and therefore
/// a safe single path component (no `/`, no `..`).
pub(crate) fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// DNS-1123 label: what the apiserver accepts as a namespace name.
pub(crate) fn is_dns_label(name: &str) -> bool {
    is_dns_subdomain(name) && !name.contains('.') && name.len() <= 63
}

/// A certificate hostname: an IP address, or a DNS name (letters, digits, `-`, and `*` for a
/// wildcard label), compared case-insensitively by the caller.
pub(crate) fn is_hostname_or_ip(name: &str) -> bool {
    name.parse::<std::net::IpAddr>().is_ok()
        || (!name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'*')
            }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_must_be_dns_subdomains() {
        assert!(is_dns_subdomain("serving-cert"));
        assert!(is_dns_subdomain("a.b-c"));
        for bad in ["", "..", "../x", "a/b", "UPPER", "-a", "a-", "a..b"] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn namespaces_are_dns_labels_and_hostnames_may_be_ips_or_wildcards() {
        assert!(is_dns_label("openshift-kube-apiserver"));
        assert!(!is_dns_label("a.b"));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_hostname_or_ip("127.0.0.1"));
        assert!(is_hostname_or_ip("::1"));
        assert!(is_hostname_or_ip("*.apps.example"));
        assert!(!is_hostname_or_ip("bad host"));
        assert!(!is_hostname_or_ip("a..b"));
    }
}
