//! How a rotation reaches the disk, in each of the styles a reader must survive: a temporary
//! file renamed over ([`Writer::Rename`]), a truncating write in place as `cp` does
//! ([`Writer::InPlace`]), and the kubelet's `..data` symlink swap ([`Writer::Kubelet`]).
//!
//! The kubelet swap is written out here step by step on purpose rather than through reload-lib's
//! own `AtomicDirWriter`: the tests check that reload-lib reads what *another* writer produces,
//! with the kubelet's order of steps and its immediate removal of the old generation.

use std::path::{Path, PathBuf};

pub use crate::rename::{rename_into, rename_into_with_mode};

/// The kubelet AtomicWriter sequence in `dir`: a new generation directory `..gen_<generation>_
/// <pid>` with `files`, `..data_tmp` → that directory, renamed over `..data`, a `name →
/// ..data/name` link per file (created once), and the old generation removed at once.
///
/// # Panics
/// On I/O errors.
pub fn kubelet_swap(dir: &Path, generation: u64, files: &[(&str, &[u8])]) {
    let ts = format!("..gen_{generation}_{}", std::process::id());
    let ts_dir = dir.join(&ts);
    std::fs::create_dir(&ts_dir)
        .unwrap_or_else(|err| panic!("cannot create {}: {err}", ts_dir.display()));
    for (name, bytes) in files {
        std::fs::write(ts_dir.join(name), bytes).expect("writing into the new generation");
    }
    let old = std::fs::read_link(dir.join("..data")).ok();
    let _ = std::fs::remove_file(dir.join("..data_tmp"));
    std::os::unix::fs::symlink(&ts, dir.join("..data_tmp")).expect("linking ..data_tmp");
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).expect("renaming over ..data");
    for (name, _) in files {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link)
                .expect("linking a file to ..data");
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).expect("removing the old generation");
    }
}

/// How a rotation is written to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// Write a temp file, rename over: certificate, then key.
    Rename,
    /// Truncate and write in place (`cp`): certificate, then key.
    InPlace,
    /// The kubelet's `..data` symlink swap: both files switch at once.
    Kubelet,
}

/// Every [`Writer`].
pub const WRITERS: [Writer; 3] = [Writer::Rename, Writer::InPlace, Writer::Kubelet];

/// A directory holding `tls.crt` and `tls.key`, written in one style.
#[derive(Debug)]
pub struct PairDir {
    /// The directory.
    pub dir: PathBuf,
    /// How it is written.
    pub writer: Writer,
    generation: u64,
}

impl PairDir {
    /// Creates `dir` and writes `pair` into it.
    ///
    /// # Panics
    /// On I/O errors.
    pub fn new(dir: &Path, writer: Writer, pair: &crate::pki::Issued) -> PairDir {
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|err| panic!("cannot create {}: {err}", dir.display()));
        let mut this = PairDir {
            dir: dir.to_owned(),
            writer,
            generation: 0,
        };
        this.write(pair);
        this
    }

    /// `tls.crt`.
    pub fn cert(&self) -> PathBuf {
        self.dir.join("tls.crt")
    }

    /// `tls.key`.
    pub fn key(&self) -> PathBuf {
        self.dir.join("tls.key")
    }

    /// Both, for a reload-lib builder.
    pub fn paths(&self) -> reload_lib::CertKeyPaths {
        reload_lib::CertKeyPaths::new(self.cert(), self.key())
    }

    /// Writes `pair` in this directory's style.
    pub fn write(&mut self, pair: &crate::pki::Issued) {
        self.write_raw(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes());
    }

    /// Writes these bytes (not necessarily a valid pair) in this directory's style.
    ///
    /// # Panics
    /// On I/O errors.
    pub fn write_raw(&mut self, cert: &[u8], key: &[u8]) {
        self.generation += 1;
        match self.writer {
            Writer::Rename => {
                rename_into(&self.cert(), cert);
                rename_into(&self.key(), key);
            }
            Writer::InPlace => {
                std::fs::write(self.cert(), cert).expect("writing tls.crt in place");
                std::fs::write(self.key(), key).expect("writing tls.key in place");
            }
            Writer::Kubelet => kubelet_swap(
                &self.dir,
                self.generation,
                &[("tls.crt", cert), ("tls.key", key)],
            ),
        }
    }
}
