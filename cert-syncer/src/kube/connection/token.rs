//! A bearer token file, re-read when it changes (kube-client re-reads one only every 60 s).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use http::HeaderValue;

use crate::base::error::ConfigError;

/// A bearer token file, re-read when it changes.
///
/// # Security
/// The token is kept only as a sensitive `HeaderValue` and never logged; errors name the file.
pub struct TokenFile {
    path: PathBuf,
    state: Mutex<TokenState>,
}

struct TokenState {
    stamp: Option<FileStamp>,
    header: Option<HeaderValue>,
    /// The last read failed (logged once until it succeeds again).
    failing: bool,
}

/// What changes when a file is replaced or rewritten.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

impl FileStamp {
    fn of(path: &Path) -> std::io::Result<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        Ok(FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl TokenFile {
    /// Reads the token now: a missing or empty file at start-up is a configuration error.
    pub fn open(path: PathBuf) -> Result<TokenFile, ConfigError> {
        let token = TokenFile {
            path,
            state: Mutex::new(TokenState {
                stamp: None,
                header: None,
                failing: false,
            }),
        };
        let mut state = token.state.lock().unwrap_or_else(|p| p.into_inner());
        token.refresh(&mut state).map_err(ConfigError)?;
        drop(state);
        Ok(token)
    }

    /// The `Authorization` value to send now: re-read if the file changed; the last good
    /// token when the file is unreadable or empty (logged).
    pub fn header(&self) -> Option<HeaderValue> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match self.refresh(&mut state) {
            Ok(()) => {
                if state.failing {
                    tracing::info!(path = %self.path.display(), "token file readable again");
                    state.failing = false;
                }
            }
            Err(reason) => {
                if !state.failing {
                    tracing::error!(%reason, "keeping the last good token");
                    state.failing = true;
                }
                // Try again on the next request even if the stamp did not change.
                state.stamp = None;
            }
        }
        state.header.clone()
    }

    fn refresh(&self, state: &mut TokenState) -> Result<(), String> {
        let path = self.path.display();
        let stamp = FileStamp::of(&self.path)
            .map_err(|err| format!("cannot read token file {path}: {err}"))?;
        if state.stamp.as_ref() == Some(&stamp) {
            return Ok(());
        }
        let (bytes, meta) = crate::base::input_file::read(
            "token file",
            &self.path,
            crate::base::input_file::MAX_TOKEN_FILE,
        )?;
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(path = %path, mode = %format_args!("{mode:o}"), "the token file is readable by group or others; it should be 0600 (or 0400)");
            }
        }
        let text =
            String::from_utf8(bytes).map_err(|_| format!("token file {path} is not UTF-8"))?;
        let token = text.trim();
        if token.is_empty() {
            return Err(format!("token file {path} is empty"));
        }
        let mut header = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| format!("token file {path} holds characters not allowed in a header"))?;
        header.set_sensitive(true);
        if state.header.is_some() && state.header.as_ref() != Some(&header) {
            tracing::info!(path = %path, "token file changed; using the new token");
        }
        state.header = Some(header);
        state.stamp = Some(stamp);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_follows_the_file_and_survives_a_bad_rewrite() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let token = TokenFile::open(path.clone()).unwrap();
        assert_eq!(token.header().unwrap(), "Bearer first");
        assert!(token.header().unwrap().is_sensitive());
        // Replaced by rename (a new inode), as kubelet and installers do.
        let next = dir.path().join("token.new");
        std::fs::write(&next, "second").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(token.header().unwrap(), "Bearer second");
        // Emptied: keep the last good token.
        std::fs::write(&path, "").unwrap();
        assert_eq!(token.header().unwrap(), "Bearer second");
        // Removed: still the last good token.
        std::fs::remove_file(&path).unwrap();
        assert_eq!(token.header().unwrap(), "Bearer second");
        std::fs::write(&path, "third").unwrap();
        assert_eq!(token.header().unwrap(), "Bearer third");
        assert!(!format!("{token:?}").contains("third"));
    }

    #[test]
    fn a_missing_or_empty_token_file_is_a_config_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let err = TokenFile::open(path.clone()).unwrap_err();
        assert!(err.0.contains(&path.display().to_string()), "{err}");
        std::fs::write(&path, "  \n").unwrap();
        let err = TokenFile::open(path).unwrap_err();
        assert!(err.0.contains("empty"), "{err}");
    }
}
