//! The object's directory (`<destination>/<kind>s/<name>/<key>`): every key a file, the set
//! swapped in at once through `..data` by reload-lib's [`AtomicDirWriter`]; Secret keys 0600,
//! ConfigMap keys 0644.

use std::path::{Path, PathBuf};

use reload_lib::fs::{AtomicDirWriter, WriteOutcome};

use super::{Sink, SinkError, Wrote};
use crate::base::kind::Kind;
use crate::kube::fetched::Fetched;

#[derive(Debug)]
pub(crate) struct ObjectDir {
    kind: Kind,
    dir: PathBuf,
    /// The writer follows no symlink below it (`secrets/`, `secrets/<name>`): writes and
    /// deletes stay inside the destination.
    root: PathBuf,
}

impl ObjectDir {
    /// `name` was validated as a DNS subdomain: one safe path component.
    pub(crate) fn new(destination: &Path, kind: Kind, name: &str) -> ObjectDir {
        ObjectDir {
            kind,
            dir: destination.join(kind.dir()).join(name),
            root: destination.to_owned(),
        }
    }

    fn writer(&self) -> AtomicDirWriter {
        AtomicDirWriter::new(&self.dir).with_root(&self.root)
    }
}

fn write_error(err: &reload_lib::fs::Error) -> SinkError {
    let why = crate::base::error::chain(err).to_string();
    match err {
        // A bad key will not fix itself; a failed write (disk full, I/O) may.
        reload_lib::fs::Error::InvalidKey { .. } => SinkError::Refused(why),
        _ => SinkError::Failed(why),
    }
}

impl Sink for ObjectDir {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn write(&self, fetched: &Fetched) -> Result<Wrote, SinkError> {
        match self.writer().write(&fetched.payload(self.kind)) {
            Ok(WriteOutcome::Unchanged) => Ok(Wrote::Unchanged),
            Ok(_) => Ok(Wrote::Written),
            Err(err) => Err(write_error(&err)),
        }
    }

    fn remove(&self) -> Result<bool, SinkError> {
        self.writer()
            .remove_all()
            .map_err(|err| SinkError::Failed(crate::base::error::chain(&err).to_string()))
    }

    fn holds_files(&self) -> bool {
        self.dir.exists()
    }

    fn repair(&self, fetched: &Fetched) -> Result<Option<&'static str>, SinkError> {
        let payload = fetched.payload(self.kind);
        let keys: Vec<String> = payload.keys().cloned().collect();
        let before = drift(&self.dir, &keys);
        match self
            .writer()
            .write(&payload)
            .map_err(|err| write_error(&err))?
        {
            // The writer re-creates a removed key link without a new generation.
            WriteOutcome::Unchanged => Ok(before),
            _ => Ok(Some(before.unwrap_or("changed"))),
        }
    }

    fn repair_absent(&self) -> Result<Option<&'static str>, SinkError> {
        if !self.dir.exists() {
            return Ok(None);
        }
        Ok(self.remove()?.then_some("unexpected-directory"))
    }
}

/// What is visibly wrong with an object's directory before a resync rewrites it: no committed
/// generation at all (`missing`), or a key's link gone (`file-removed`). Content that differs
/// is found by the writer itself (it rewrites: `changed`).
fn drift(dir: &Path, keys: &[String]) -> Option<&'static str> {
    if reload_lib::fs::current_generation(dir).is_none() {
        return Some("missing");
    }
    keys.iter()
        .any(|key| std::fs::symlink_metadata(dir.join(key)).is_err())
        .then_some("file-removed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn drift_names_a_missing_directory_and_a_removed_key() {
        let dir = tempfile::tempdir().unwrap();
        let object = dir.path().join("secrets/a");
        let keys = vec!["tls.crt".to_owned()];
        assert_eq!(drift(&object, &keys), Some("missing"));
        let writer = AtomicDirWriter::new(&object);
        writer
            .write(&BTreeMap::from([(
                "tls.crt".to_owned(),
                reload_lib::fs::FileContent::new(b"x".to_vec(), 0o600),
            )]))
            .unwrap();
        assert_eq!(drift(&object, &keys), None);
        std::fs::remove_file(object.join("tls.crt")).unwrap();
        assert_eq!(drift(&object, &keys), Some("file-removed"));
    }

    #[test]
    fn a_key_that_is_not_a_file_name_is_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let sink = ObjectDir::new(dir.path(), Kind::Secret, "a");
        let fetched = Fetched {
            resource_version: "1".to_owned(),
            data: BTreeMap::from([("../escape".to_owned(), b"x".to_vec())]),
        };
        assert!(matches!(sink.write(&fetched), Err(SinkError::Refused(_))));
        assert!(!sink.holds_files());
        assert!(!dir.path().join("escape").exists());
    }
}
