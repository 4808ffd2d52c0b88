//! PEM and DER loading of serving pairs, CA bundles and CRLs, through the same code reload runs on
//! file contents (`reload_lib::__fuzz`, `CertInfo::from_der`).
//!
//! Input: one mode byte, then the payload.
//! - 0: payload is a bundle file (chain + key in one file), parsed as a serving pair
//! - 1: payload is a CA bundle
//! - 2: payload is a CRL file next to a valid CA bundle
//! - 3: payload is DER: X.509 facts, then wrapped as a `CERTIFICATE` PEM block into a CA bundle
//!   and into a pair with a valid key
//! - 4: payload is DER wrapped as an `X509 CRL` block next to a valid CA bundle
//! - 5: payload[0] picks the key label (PKCS#8, SEC1, PKCS#1), the rest is the DER key, wrapped
//!   and paired with a valid certificate
//! - 6: payload is `u16 BE length` + certificate file + key file (two files)
//!
//! Property: no panic, and every error formats.

#![no_main]

use base64::Engine;
use libfuzzer_sys::fuzz_target;
use reload_lib::__fuzz::{parse_bundle, parse_pair};
use reload_lib::CertInfo;

const CA: &[u8] = include_bytes!("../seeds/pki/ca.crt");
const LEAF: &[u8] = include_bytes!("../seeds/pki/leaf.crt");
const LEAF_KEY: &[u8] = include_bytes!("../seeds/pki/leaf.key");
const KEY_LABELS: [&str; 3] = ["PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY"];

fn pem(label: &str, der: &[u8]) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out.into_bytes()
}

fn check<T>(result: Result<T, impl std::error::Error>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(err) => {
            // Error messages are built from parser output: they must format.
            let mut text = format!("{err} {err:?}");
            let mut source = err.source();
            while let Some(cause) = source {
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            std::hint::black_box(text);
            None
        }
    }
}

fn pair(cert: &[u8], key: &[u8]) {
    if let Some(info) = check(parse_pair(cert, key)) {
        assert_eq!(info.sha256.len(), 64);
        assert!(!info.serial.is_empty());
        let _ = info.not_after_rfc3339();
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, payload)) = data.split_first() else {
        return;
    };
    match mode % 7 {
        0 => pair(payload, payload),
        1 => {
            check(parse_bundle(payload, None));
        }
        2 => {
            check(parse_bundle(CA, Some(payload)));
        }
        3 => {
            if let Ok(info) = CertInfo::from_der(payload) {
                let _ = info.not_after_rfc3339();
            }
            let wrapped = pem("CERTIFICATE", payload);
            check(parse_bundle(&wrapped, None));
            pair(&wrapped, LEAF_KEY);
        }
        4 => {
            check(parse_bundle(CA, Some(&pem("X509 CRL", payload))));
        }
        5 => {
            let Some((&label, der)) = payload.split_first() else {
                return;
            };
            let label = KEY_LABELS[usize::from(label) % KEY_LABELS.len()];
            pair(LEAF, &pem(label, der));
        }
        _ => {
            if payload.len() < 2 {
                return;
            }
            let split = usize::from(u16::from_be_bytes([payload[0], payload[1]]));
            let files = &payload[2..];
            let split = split.min(files.len());
            pair(&files[..split], &files[split..]);
        }
    }
});
