//! DNS name matching for SNI, with the single-label wildcard rule of RFC 6125 §6.4.3 as
//! browsers and Go's crypto/tls apply it.

/// Lower-cases and strips one trailing dot.
pub(crate) fn normalize_name(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// Whether a certificate name (`api.a.com` or `*.a.com`) covers `name`. A wildcard covers exactly
/// one label: `*.a.com` covers `x.a.com`, not `a.com` nor `x.y.a.com`. A configured wildcard name
/// is covered only by the same wildcard.
pub(crate) fn covers(cert_name: &str, name: &str) -> bool {
    let cert_name = normalize_name(cert_name);
    let name = normalize_name(name);
    if cert_name == name {
        return true;
    }
    match (cert_name.strip_prefix("*."), name.split_once('.')) {
        (Some(parent), Some((first, rest))) => !first.is_empty() && first != "*" && rest == parent,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_names_match_case_insensitively_and_ignore_a_trailing_dot() {
        assert!(covers("API.example.com", "api.example.com."));
        assert!(!covers("api.example.com", "example.com"));
    }

    #[test]
    fn a_wildcard_covers_exactly_one_label() {
        assert!(covers("*.a.com", "x.a.com"));
        assert!(!covers("*.a.com", "a.com"));
        assert!(!covers("*.a.com", "x.y.a.com"));
        assert!(!covers("*.a.com", ".a.com"));
    }

    #[test]
    fn a_wildcard_name_is_covered_only_by_the_same_wildcard() {
        assert!(covers("*.a.com", "*.a.com"));
        assert!(!covers("x.a.com", "*.a.com"));
    }
}
