//! Paths named by environment variables (`KUBEBUILDER_ASSETS`, `E2E_NODE_ASSETS`,
//! `E2E_OPENSHIFT_DIR`, `E2E_BIN_DIR`, `E2E_NODE_LOCK`, `OPENSHIFT_OPERATOR`), read one way by
//! every test, the harness and the scripts:
//!
//! - unset or empty: `None`; the caller looks for its default (`../shared/...` beside the
//!   workspace) and, when there is none, the test skips with `SKIP: <reason>`;
//! - a relative value is taken from the workspace root, the directory the README's and
//!   BENCHMARKS' commands run from, whatever directory cargo or nextest runs a test in (nextest
//!   runs each in its package's directory, `tests/` for the end-to-end tests);
//! - a value naming a path that is not there is a mistake in the command, never a reason to
//!   skip: it panics (the test fails) naming the variable, its value and the path looked at.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The path `var` names, relative values taken from the workspace root; `None` when `var` is
/// unset or empty. The path need not exist (a lock file to create): see [`existing`].
pub fn path(var: &str) -> Option<PathBuf> {
    resolve(std::env::var_os(var))
}

/// [`path`], which must exist.
///
/// # Panics
/// When `var` names a path that does not exist (see [`missing`]).
pub fn existing(var: &str) -> Option<PathBuf> {
    check(var, std::env::var_os(var)).unwrap_or_else(|message| panic!("{message}"))
}

/// The message for a path `var` names that is not what it should be: the variable, its value
/// as set (maybe relative), the path looked at, and `what` is wrong with it.
pub fn missing(var: &str, path: &Path, what: &str) -> String {
    let value = std::env::var_os(var).unwrap_or_default();
    message(var, &value, path, what)
}

/// The workspace root (this package lives in `<root>/tests/kit`): where relative values are
/// taken from.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the kit is inside the workspace")
        .to_owned()
}

fn resolve(value: Option<OsString>) -> Option<PathBuf> {
    let value = PathBuf::from(value.filter(|v| !v.is_empty())?);
    Some(if value.is_absolute() {
        value
    } else {
        workspace_root().join(value)
    })
}

fn check(var: &str, value: Option<OsString>) -> Result<Option<PathBuf>, String> {
    let Some(path) = resolve(value.clone()) else {
        return Ok(None);
    };
    if !path.exists() {
        return Err(message(
            var,
            &value.unwrap_or_default(),
            &path,
            "does not exist",
        ));
    }
    Ok(Some(path))
}

fn message(var: &str, value: &OsString, path: &Path, what: &str) -> String {
    format!(
        "{var}={} names {}, which {what} (a relative value is taken from the workspace root, \
         {}): fix or unset {var}",
        value.to_string_lossy(),
        path.display(),
        workspace_root().display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_values_are_taken_from_the_workspace_root_and_a_missing_path_is_an_error() {
        let root = workspace_root();
        let set = |value: &str| Some(OsString::from(value));
        assert_eq!(check("V", None), Ok(None));
        assert_eq!(check("V", set("")), Ok(None), "empty is unset");
        assert_eq!(
            check("V", set("tests/kit")),
            Ok(Some(root.join("tests/kit")))
        );
        let absolute = root.join("tests");
        assert_eq!(
            check("V", Some(absolute.clone().into_os_string())),
            Ok(Some(absolute))
        );
        let err = check("V", set("../no-such-dir-of-testkit")).unwrap_err();
        assert!(
            err.starts_with("V=../no-such-dir-of-testkit names "),
            "{err}"
        );
        assert!(
            err.contains(&root.join("../no-such-dir-of-testkit").display().to_string()),
            "{err}"
        );
        assert!(err.contains("does not exist"), "{err}");
    }
}
