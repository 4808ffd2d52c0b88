//! The writer side of the on-disk protocol reload-lib reads: the atomic directory writer
//! (kubelet `..data` swaps, with fsync) and an atomic single-file writer. Reader and writer of one
//! protocol live together.
//!
//! A [`ServingSet`](crate::ServingSet) fed by an [`AtomicDirWriter`] never sees a torn pair: the
//! certificate and the key switch together with one rename of `..data`.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
//! # let pair = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
//! use reload_lib::fs::{AtomicDirWriter, FileContent};
//! use reload_lib::{CertKeyPaths, ServingSet};
//! use std::{collections::BTreeMap, time::Duration};
//!
//! let files = |cert: String, key: String| BTreeMap::from([
//!     ("tls.crt".to_owned(), FileContent::new(cert.into_bytes(), 0o644)),
//!     ("tls.key".to_owned(), FileContent::new(key.into_bytes(), 0o600)),
//! ]);
//! let writer = AtomicDirWriter::new(dir.path().join("serving-cert"));
//! writer.write(&files(pair.cert.pem(), pair.signing_key.serialize_pem()))?;
//! let paths = CertKeyPaths::new(writer.dir().join("tls.crt"), writer.dir().join("tls.key"));
//! let set = ServingSet::builder(paths).start().await?;
//!
//! let mut updates = set.subscribe();
//! let next = rcgen::generate_simple_self_signed(["api.example".to_owned()])?;
//! writer.write(&files(next.cert.pem(), next.signing_key.serialize_pem()))?;
//! tokio::time::timeout(Duration::from_secs(10), updates.wait_for(|s| s.generation == 2)).await??;
//! assert_eq!(set.status().reloads_failed, 0); // never a torn pair
//! # Ok(()) }
//! ```

mod atomic_writer;
mod file;

pub use atomic_writer::{AtomicDirWriter, MAX_KEY_LEN, WriteOutcome, validate_key};
pub use file::{Error, FileContent, write_file_atomic};

/// The generation directory `dir/..data` points to, if `dir` has the kubelet layout (a `..name`
/// inside `dir`; anything else is not followed).
///
/// ```
/// # let dir = tempfile::tempdir()?;
/// use reload_lib::fs::{AtomicDirWriter, FileContent, current_generation};
/// use std::collections::BTreeMap;
///
/// assert_eq!(current_generation(dir.path()), None); // a plain directory
/// let writer = AtomicDirWriter::new(dir.path());
/// writer.write(&BTreeMap::from([("ca.crt".to_owned(), FileContent::new(b"PEM".to_vec(), 0o644))]))?;
/// let generation = current_generation(dir.path()).expect("written");
/// assert!(generation.to_str().is_some_and(|name| name.starts_with("..")));
///
/// std::fs::remove_file(dir.path().join("..data"))?;
/// std::os::unix::fs::symlink("/etc", dir.path().join("..data"))?;
/// assert_eq!(current_generation(dir.path()), None); // never followed outside `dir`
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn current_generation(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    crate::layout::current_generation(dir)
}
