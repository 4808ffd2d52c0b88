//! The Python `kubernetes` client against mini-apiserver: list and watch with
//! resourceVersion, 410 Gone and relist, label-filtered watch transitions (ADDED when an object
//! starts matching, DELETED when it stops). The checks are in `python/watch_check.py`; this test
//! creates a venv in a temp dir and installs `kubernetes` from PyPI into it. Skipped with a
//! printed reason when python3, venv or pip (or the network to PyPI) is unavailable.

use std::path::{Path, PathBuf};
use std::process::Command;

use e2e::ApiServer;

/// A venv with `kubernetes` installed; `Err(reason)` to skip.
fn venv(dir: &Path) -> Result<PathBuf, String> {
    let venv = dir.join("venv");
    let created = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .map_err(|err| format!("python3 does not run: {err}"))?;
    if !created.status.success() {
        return Err(format!(
            "python3 -m venv failed: {}",
            String::from_utf8_lossy(&created.stderr)
        ));
    }
    let python = venv.join("bin/python");
    let installed = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "kubernetes",
        ])
        .output()
        .map_err(|err| format!("pip does not run: {err}"))?;
    if !installed.status.success() {
        return Err(format!(
            "pip install kubernetes failed: {}",
            String::from_utf8_lossy(&installed.stderr)
        ));
    }
    Ok(python)
}

#[test]
fn python_client_lists_watches_relists_after_410_and_sees_selector_transitions() {
    let tmp = tempfile::tempdir().unwrap();
    let python = match venv(tmp.path()) {
        Ok(python) => python,
        Err(reason) => {
            eprintln!("SKIPPED: {reason}");
            return;
        }
    };
    // A short history: the script's watch from its first resourceVersion must expire.
    let server = ApiServer::start(&tmp.path().join("mini"), &["--history", "5"]);
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mini_apiserver/python/watch_check.py");
    let output = Command::new(&python)
        .arg(&script)
        .arg(server.url())
        .arg(server.dir.join("serving-ca.crt"))
        .arg(&server.token)
        .arg("py")
        .arg("1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{stdout}");
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for check in [
        "OK list",
        "OK watch from resourceVersion",
        "OK label-filtered watch transitions",
        "OK 410 Gone",
        "OK relist and watch again",
    ] {
        assert!(stdout.contains(check), "missing {check:?}: {stdout}");
    }
}
