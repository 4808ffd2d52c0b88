//! The SNI name matcher (`covers`, `normalize_name` in reload-lib/src/material/names.rs).
//!
//! Input: two strings (certificate name, requested name) split at the first NUL byte.
//!
//! Properties, besides no panic:
//! - a name covers itself, whatever its case and one trailing dot;
//! - matching ignores ASCII case and one trailing dot on either side;
//! - a name without a leading `*.` covers only itself (after normalization);
//! - a `*.parent` name covers only itself or a name of exactly one more, non-empty, non-`*` label
//!   in front of `parent`.

#![no_main]

use libfuzzer_sys::fuzz_target;
use reload_lib::__fuzz::{covers, normalize_name};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (cert_name, name) = text.split_once('\0').unwrap_or((text, text));

    assert!(covers(cert_name, cert_name));
    assert!(covers(name, name));

    let result = covers(cert_name, name);
    // Case and one trailing dot do not matter, on either side.
    let flip = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_lowercase() {
                    c.to_ascii_uppercase()
                } else {
                    c.to_ascii_lowercase()
                }
            })
            .collect()
    };
    assert_eq!(result, covers(&flip(cert_name), &flip(name)));
    if !name.ends_with('.') {
        assert_eq!(result, covers(cert_name, &format!("{name}.")));
    }
    if !cert_name.ends_with('.') {
        assert_eq!(result, covers(&format!("{cert_name}."), name));
    }

    let normalized_cert = normalize_name(cert_name);
    let normalized_name = normalize_name(name);
    assert_eq!(normalized_cert, normalize_name(&flip(cert_name)));
    if result && normalized_cert != normalized_name {
        let parent = normalized_cert
            .strip_prefix("*.")
            .expect("only a wildcard covers a different name");
        let (first, rest) = normalized_name
            .split_once('.')
            .expect("a covered name has a parent");
        assert!(
            !first.is_empty() && first != "*",
            "{cert_name:?} covers {name:?}"
        );
        assert_eq!(rest, parent, "{cert_name:?} covers {name:?}");
    }
});
