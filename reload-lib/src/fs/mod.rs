//! The writer side of the on-disk protocol reload-lib reads: the atomic directory writer
//! (kubelet `..data` swaps, with fsync) and an atomic single-file writer. Reader and writer of one
//! protocol live together.

mod atomic_writer;

pub use atomic_writer::{
    AtomicDirWriter, Error, FileContent, MAX_KEY_LEN, WriteOutcome, validate_key, write_file_atomic,
};

/// The generation directory `dir/..data` points to, if `dir` has the kubelet layout (a `..name`
/// inside `dir`; anything else is not followed).
pub fn current_generation(dir: &std::path::Path) -> Option<std::path::PathBuf> {
    crate::source::current_generation(dir)
}
