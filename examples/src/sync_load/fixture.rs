//! The files a run needs: a CA and the apiserver's `localhost-recovery` certificate, a token,
//! the Secrets to seed (one ECDSA P-256 pair each, as `kubernetes.io/tls`), and two more pairs
//! the updates alternate between.

use std::path::{Path, PathBuf};

use anyhow::Context;
use base64::Engine;
use testkit::pki::{Ca, CertSpec};

/// The namespace of the seeded Secrets.
pub const NAMESPACE: &str = "openshift-kube-apiserver";
/// The bearer token of the syncer and of the tool.
pub const TOKEN: &str = "sync-load-token-0123456789abcdef";

/// A certificate and its key, PEM.
#[derive(Debug, Clone)]
pub struct Pair {
    /// `tls.crt`.
    pub cert: String,
    /// `tls.key`.
    pub key: String,
}

/// The work directory and what was generated in it; removed on drop.
#[derive(Debug)]
pub struct Fixture {
    /// The work directory.
    pub dir: PathBuf,
    /// The CA that issued the apiserver's certificate (`--ca-file` of the syncer).
    pub ca_file: PathBuf,
    /// The syncer's `--token-file`.
    pub token_file: PathBuf,
    /// The apiserver's `--cert`, `--key` and `--token-auth-file`.
    pub serving: (PathBuf, PathBuf, PathBuf),
    /// The CA, PEM.
    pub ca_pem: String,
    /// The content of each seeded Secret.
    pub pairs: Vec<Pair>,
    /// What updates write (alternately).
    pub updates: [Pair; 2],
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The name of seeded Secret `i`.
pub fn object_name(i: usize) -> String {
    format!("scale-cert-{i:05}")
}

impl Fixture {
    /// Generates everything for up to `objects` Secrets under a new directory in `parent`.
    ///
    /// # Errors
    /// When the directory or a file cannot be written.
    pub fn create(parent: &Path, objects: usize) -> anyhow::Result<Fixture> {
        let dir = parent.join(format!("sync-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
        let ca = Ca::new("sync-load CA");
        let ca_pem = ca.cert_pem.clone();
        let serving = leaf(&ca, "localhost-recovery");
        let pairs = (0..objects)
            .map(|i| leaf(&ca, &format!("{}.scale.test", object_name(i))))
            .collect();
        let updates = [
            leaf(&ca, "update-a.scale.test"),
            leaf(&ca, "update-b.scale.test"),
        ];
        let write = |name: &str, text: &str| -> anyhow::Result<PathBuf> {
            let path = dir.join(name);
            reload_lib::fs::write_file_atomic(&path, text.as_bytes(), 0o600)
                .with_context(|| format!("cannot write {}", path.display()))?;
            Ok(path)
        };
        let fixture = Fixture {
            ca_file: write("ca.crt", &ca_pem)?,
            token_file: write("token", TOKEN)?,
            serving: (
                write("serving.crt", &serving.cert)?,
                write("serving.key", &serving.key)?,
                write(
                    "tokens.csv",
                    &format!("{TOKEN},cert-syncer,1,\"system:masters\"\n"),
                )?,
            ),
            dir,
            ca_pem,
            pairs,
            updates,
        };
        Ok(fixture)
    }

    /// A seed directory holding the first `objects` Secrets as one JSON `List`.
    ///
    /// # Errors
    /// When it cannot be written.
    pub fn seed_dir(&self, objects: usize) -> anyhow::Result<PathBuf> {
        let dir = self.dir.join(format!("seed-{objects}"));
        if dir.exists() {
            return Ok(dir);
        }
        std::fs::create_dir_all(&dir)?;
        let items: Vec<serde_json::Value> = self.pairs[..objects]
            .iter()
            .enumerate()
            .map(|(i, pair)| secret_json(&object_name(i), pair))
            .collect();
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        std::fs::write(dir.join("secrets.json"), serde_json::to_vec(&list)?)
            .with_context(|| format!("cannot write {}", dir.display()))?;
        Ok(dir)
    }
}

/// The `data` of a Secret holding `pair`.
pub fn secret_data(pair: &Pair) -> serde_json::Value {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    serde_json::json!({ "tls.crt": b64(&pair.cert), "tls.key": b64(&pair.key) })
}

fn secret_json(name: &str, pair: &Pair) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": { "name": name, "namespace": NAMESPACE },
        "data": secret_data(pair),
    })
}

/// A serving certificate for `name`, valid for a day.
fn leaf(ca: &Ca, name: &str) -> Pair {
    let issued = ca.issue(&CertSpec::server(&[name]));
    Pair {
        cert: issued.cert_pem,
        key: issued.key_pem,
    }
}
