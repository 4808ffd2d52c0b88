//! `--file KIND/NAME/KEY=PATH`: one key of the object as a host file other components trust
//! (the kubelet's CA bundle), replaced atomically, 0644. Only PEM certificates may replace it,
//! and nothing else may be in the key: a private key beside the certificates (a Secret's
//! `tls.crt` holding its key too) would be readable by every user of every node. The rule is
//! node mode's ([`crate::pki::trusted_bundle`]); the bytes written are the key's, unchanged. The
//! file is never removed: an object that goes away leaves the last good file in place.

use std::path::Path;

use super::{Sink, SinkError, Wrote};
use crate::kube::fetched::Fetched;
use crate::pki::trusted_bundle;
use crate::sync::files::FileMapping;

#[derive(Debug)]
pub(crate) struct HostFile {
    mapping: FileMapping,
}

impl HostFile {
    pub(crate) fn new(mapping: FileMapping) -> HostFile {
        HostFile { mapping }
    }

    /// The bytes the file gets, or why it gets none (the key is missing, or it holds anything
    /// but PEM certificates). The reason names the object, the key and the version, never the
    /// content.
    fn content<'a>(&self, fetched: &'a Fetched) -> Result<&'a [u8], SinkError> {
        let FileMapping {
            kind, name, key, ..
        } = &self.mapping;
        let source = format!(
            "--file {}/{name}/{key} (resourceVersion {})",
            kind.label(),
            fetched.resource_version
        );
        let bytes = fetched.data.get(key).ok_or_else(|| {
            SinkError::Refused(format!("{source}: {}", trusted_bundle::Invalid::MissingKey))
        })?;
        trusted_bundle::parse(bytes).map_err(|reason| {
            SinkError::Refused(format!(
                "{source}: {reason}; a host file takes PEM certificates only (it is readable by \
                 every user), {} keeps its last good content",
                self.mapping.path.display()
            ))
        })?;
        Ok(bytes)
    }

    fn write_bytes(&self, bytes: &[u8]) -> Result<bool, SinkError> {
        reload_lib::fs::write_file_atomic(&self.mapping.path, bytes, 0o644)
            .map_err(|err| SinkError::Failed(crate::base::error::chain(&err).to_string()))
    }
}

impl Sink for HostFile {
    fn path(&self) -> &Path {
        &self.mapping.path
    }

    fn write(&self, fetched: &Fetched) -> Result<Wrote, SinkError> {
        let bytes = self.content(fetched)?;
        Ok(match self.write_bytes(bytes)? {
            true => Wrote::Written,
            false => Wrote::Unchanged,
        })
    }

    fn remove(&self) -> Result<bool, SinkError> {
        Ok(false)
    }

    fn holds_files(&self) -> bool {
        false
    }

    fn repair(&self, fetched: &Fetched) -> Result<Option<&'static str>, SinkError> {
        // Content refused when it arrived (the process is not ready): the host file is kept.
        let Ok(bytes) = self.content(fetched) else {
            return Ok(None);
        };
        let existed = self.mapping.path.exists();
        Ok(self
            .write_bytes(bytes)?
            .then_some(if existed { "changed" } else { "missing" }))
    }

    fn repair_absent(&self) -> Result<Option<&'static str>, SinkError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::kind::Kind;
    use std::collections::BTreeMap;

    #[test]
    fn only_certificates_replace_the_host_file_and_it_is_never_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        let sink = HostFile::new(FileMapping {
            kind: Kind::ConfigMap,
            name: "ca".to_owned(),
            key: "ca.crt".to_owned(),
            path: path.clone(),
        });
        let ca = crate::pki::new_signer(
            "ca",
            1_900_000_000,
            std::time::Duration::ZERO,
            std::time::Duration::from_secs(86_400),
        )
        .unwrap();
        let fetched = |value: &[u8]| Fetched {
            resource_version: "1".to_owned(),
            data: BTreeMap::from([("ca.crt".to_owned(), value.to_vec())]),
        };
        assert_eq!(
            sink.write(&fetched(ca.cert_pem().as_bytes())),
            Ok(Wrote::Written)
        );
        assert_eq!(
            sink.write(&fetched(ca.cert_pem().as_bytes())),
            Ok(Wrote::Unchanged)
        );
        assert!(matches!(
            sink.write(&fetched(b"garbage")),
            Err(SinkError::Refused(_))
        ));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), ca.cert_pem());
        assert_eq!(sink.remove(), Ok(false));
        assert!(path.exists());
    }

    #[test]
    fn a_private_key_beside_the_certificates_is_refused_and_the_file_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        let sink = HostFile::new(FileMapping {
            kind: Kind::Secret,
            name: "serving".to_owned(),
            key: "tls.crt".to_owned(),
            path: path.clone(),
        });
        let issue = || {
            crate::pki::new_signer(
                "ca",
                1_900_000_000,
                std::time::Duration::ZERO,
                std::time::Duration::from_secs(86_400),
            )
            .unwrap()
        };
        let (good, leaked) = (issue(), issue());
        let fetched = |rv: &str, value: String| Fetched {
            resource_version: rv.to_owned(),
            data: BTreeMap::from([("tls.crt".to_owned(), value.into_bytes())]),
        };
        assert_eq!(
            sink.write(&fetched("1", good.cert_pem())),
            Ok(Wrote::Written)
        );
        // The key after the certificate, and before it: both refused, the file kept.
        let key = leaked.key_pem.clone();
        for value in [
            format!("{}{key}", leaked.cert_pem()),
            format!("{key}{}", leaked.cert_pem()),
        ] {
            let Err(SinkError::Refused(why)) = sink.write(&fetched("2", value.clone())) else {
                panic!("a private key in a host file was accepted");
            };
            assert!(why.contains("secret/serving/tls.crt"), "{why}");
            assert!(why.contains("resourceVersion 2"), "{why}");
            assert!(why.contains("PRIVATE KEY, not a CERTIFICATE"), "{why}");
            let body = key.lines().nth(1).unwrap();
            assert!(!why.contains(body), "the refusal quotes the key");
            assert_eq!(std::fs::read_to_string(&path).unwrap(), good.cert_pem());
            // The resync does not write it either.
            assert_eq!(sink.repair(&fetched("2", value)), Ok(None));
            assert_eq!(std::fs::read_to_string(&path).unwrap(), good.cert_pem());
        }
    }
}
