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

/// A hostname as certificates carry it: trimmed and lowercase, and an IP address in its one
/// canonical text (`2001:0db8::1` is `2001:db8::1`, as the address is read back from a
/// certificate's SAN), so names compare as text with what a certificate holds.
pub(crate) fn canonical_hostname(name: &str) -> String {
    let name = name.trim();
    match name.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => name.to_ascii_lowercase(),
    }
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

    #[test]
    fn ip_literals_get_their_canonical_text_and_names_are_lowercased() {
        assert_eq!(canonical_hostname("2001:0db8::1"), "2001:db8::1");
        assert_eq!(canonical_hostname("2001:DB8:0:0:0:0:0:1"), "2001:db8::1");
        assert_eq!(canonical_hostname(" ::FFFF:10.0.0.1 "), "::ffff:10.0.0.1");
        assert_eq!(canonical_hostname("Api.Example.COM"), "api.example.com");
        assert_eq!(canonical_hostname("10.0.0.1"), "10.0.0.1");
    }
}
