//! `--file KIND/NAME/KEY=PATH`: one key of the object as a host file other components trust
//! (the kubelet's CA bundle), replaced atomically, 0644. Only PEM certificates may replace it,
//! and it is never removed: an object that goes away leaves the last good file in place.

use std::path::Path;

use super::{Sink, SinkError, Wrote};
use crate::kube::fetched::Fetched;
use crate::sync::files::{FileMapping, check_certificates};

#[derive(Debug)]
pub(crate) struct HostFile {
    mapping: FileMapping,
}

impl HostFile {
    pub(crate) fn new(mapping: FileMapping) -> HostFile {
        HostFile { mapping }
    }

    /// The bytes the file gets, or why it gets none (the key is missing, or it is not PEM
    /// certificates).
    fn content<'a>(&self, fetched: &'a Fetched) -> Result<&'a [u8], SinkError> {
        let key = &self.mapping.key;
        let bytes = fetched.data.get(key).ok_or_else(|| {
            SinkError::Refused(format!("--file key {key} missing from the object"))
        })?;
        check_certificates(bytes).map_err(|reason| {
            SinkError::Refused(format!(
                "--file key {key} is not PEM certificates: {reason}"
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
}
