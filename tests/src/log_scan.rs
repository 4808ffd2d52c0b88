//! The log scanner: every line a child process writes (stdout and stderr) is checked for
//! secret bytes, and the test that started the process fails when one is found (on drop of its
//! [`crate::ChildProcess`]), with the offending line redacted.
//!
//! What counts as a leak:
//! - a PEM private-key block header (`-----BEGIN … PRIVATE KEY-----`);
//! - the base64 of such a header (a Secret's `data` as JSON);
//! - the DER prefix every PKCS#8 P-256 key starts with, in base64 (the body of a PEM key, or of
//!   a key whose header was cut off): every key the harness generates is one (rcgen, P-256);
//! - the known test tokens ([`crate::tokens::ADMIN_TOKEN`], [`crate::tokens::VIEWER_TOKEN`])
//!   and anything a test registers with [`register_secret`].

use std::sync::{Arc, Mutex};

/// Fixed leak patterns (see the module docs).
const PATTERNS: &[(&str, &str)] = &[
    ("PEM private key", "PRIVATE KEY-----"),
    // base64("-----BEGIN PRIVATE KEY"), ("-----BEGIN EC PRIVATE KEY"), ("-----BEGIN RSA PRIVATE")
    ("base64 PEM private key", "LS0tLS1CRUdJTiBQUklWQVRFIEtFW"),
    (
        "base64 PEM EC private key",
        "LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFW",
    ),
    (
        "base64 PEM RSA private key",
        "LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRV",
    ),
    // PKCS#8 P-256 key DER prefix (SEQUENCE, version 0, id-ecPublicKey, prime256v1), base64.
    (
        "PKCS#8 P-256 key bytes",
        "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEH",
    ),
];

/// Secrets registered by tests (tokens, keys): any of them in a log is a leak.
static REGISTERED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Adds a secret (at least 8 bytes; shorter ones would match by chance) to look for in every
/// log line from now on.
pub fn register_secret(secret: &str) {
    let secret = secret.trim();
    if secret.len() >= 8 {
        REGISTERED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(secret.to_owned());
    }
}

/// What leaked in `line`, as a description, or `None`. The description holds the line with
/// every secret replaced by `<redacted>`, never the secret.
pub fn check_line(line: &str) -> Option<String> {
    let mut found: Vec<&str> = Vec::new();
    let mut redacted = line.to_owned();
    for (what, pattern) in PATTERNS {
        if redacted.contains(pattern) {
            found.push(what);
            redacted = redacted.replace(pattern, "<redacted>");
        }
    }
    let mut secrets = vec![
        crate::tokens::ADMIN_TOKEN.to_owned(),
        crate::tokens::VIEWER_TOKEN.to_owned(),
    ];
    secrets.extend(
        REGISTERED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned(),
    );
    for secret in &secrets {
        if redacted.contains(secret.as_str()) {
            found.push("a known token or key");
            redacted = redacted.replace(secret.as_str(), "<redacted>");
        }
    }
    if found.is_empty() {
        return None;
    }
    // The rest of a PEM body or a token may follow the marker: keep only the start.
    let shown: String = redacted.chars().take(160).collect();
    Some(format!("{}: {shown}…", found.join(", ")))
}

/// Leaks found in one process's output.
#[derive(Debug, Clone, Default)]
pub struct Leaks(Arc<Mutex<Vec<String>>>);

impl Leaks {
    /// Checks one line written by `program`.
    pub fn scan(&self, program: &str, line: &str) {
        if let Some(leak) = check_line(line) {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!("[{program}] {leak}"));
        }
    }

    /// Panics (failing the test) when anything leaked, unless the thread is already panicking.
    pub fn assert_none(&self) {
        let leaks = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if !leaks.is_empty() && !std::thread::panicking() {
            panic!(
                "secret bytes in a child's log ({} line(s)), redacted:\n  {}",
                leaks.len(),
                leaks.join("\n  ")
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_positives_are_caught_and_redacted() {
        let ca = crate::Ca::default();
        let issued = ca.issue(&crate::CertSpec::server(&["localhost"]));
        let key_body: String = issued
            .key_pem
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        use base64::Engine;
        let key_b64 = base64::engine::general_purpose::STANDARD.encode(&issued.key_pem);
        let positives = [
            format!("WARN body: {}", issued.key_pem.replace('\n', "\\n")),
            format!("{{\"data\":{{\"tls.key\":\"{key_b64}\"}}}}"),
            format!("error: invalid type: string \"{key_body}\""),
            format!(
                "sending Authorization: Bearer {}",
                crate::tokens::ADMIN_TOKEN
            ),
            format!("token={}", crate::tokens::VIEWER_TOKEN),
        ];
        for line in &positives {
            let leak = check_line(line).unwrap_or_else(|| panic!("missed: {line}"));
            assert!(!leak.contains(crate::tokens::ADMIN_TOKEN), "{leak}");
            assert!(!leak.contains(&key_body[..40]), "{leak}");
            assert!(!leak.contains(&key_b64[..40]), "{leak}");
        }
        register_secret("registered-s3cr3t-value");
        assert!(check_line("x registered-s3cr3t-value y").is_some());
        // Ordinary lines, certificates included, are not leaks.
        for line in [
            "INFO written object=secret/serving-cert keys=[\"tls.crt\", \"tls.key\"]",
            issued.cert_pem.lines().nth(1).unwrap(),
            "no private key found in /tmp/x/tls.key",
        ] {
            assert_eq!(check_line(line), None, "{line}");
        }
        let leaks = Leaks::default();
        leaks.scan("cert-syncer", &positives[0]);
        let err = std::panic::catch_unwind(|| leaks.assert_none()).unwrap_err();
        let text = err.downcast_ref::<String>().unwrap();
        assert!(
            text.contains("[cert-syncer]") && !text.contains(&key_body[..40]),
            "{text}"
        );
    }
}
