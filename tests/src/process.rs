//! Workspace binaries as child processes: finding them, starting them, waiting for their
//! `listening on ADDR` line, killing them on drop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use testkit::process::{Child, Stream};

/// How long a child may take to print `listening on ADDR`.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A workspace binary: in `E2E_BIN_DIR` if set (relative to the repository root, see
/// [`testkit::env`]), else in the target dir this test runs from (`target/debug/deps/<test>` →
/// `target/debug/<name>`). `CARGO_BIN_EXE_*` only covers the test's own package, so it cannot
/// find other packages' binaries.
///
/// # Panics
/// When `E2E_BIN_DIR` names a directory that is not there, or the binary is missing, with the
/// command that builds it.
pub fn bin_path(name: &str) -> PathBuf {
    let path = match testkit::env::existing("E2E_BIN_DIR") {
        Some(dir) => dir.join(name),
        None => {
            let exe = std::env::current_exe().expect("the test executable's path");
            exe.parent()
                .and_then(|deps| deps.parent())
                .expect("the test executable lives in target/<profile>/deps")
                .join(name)
        }
    };
    assert!(
        path.exists(),
        "{} not built: run `cargo build --workspace --bins` first (or set E2E_BIN_DIR)",
        path.display()
    );
    path
}

/// The older name of [`bin_path`].
pub fn bin(name: &str) -> PathBuf {
    bin_path(name)
}

/// A workspace binary (or etcd, kube-apiserver) as a child process: a [`testkit::process::Child`]
/// (killed and reaped on drop; methods through `Deref`) whose output is forwarded to the test's
/// stderr, prefixed with the program name, and scanned for secret bytes ([`crate::log_scan`]):
/// the test fails on drop when any leaked.
pub struct ChildProcess {
    process: Child,
    /// The address it printed as `listening on ADDR` (the chosen one for
    /// [`ChildProcess::spawn_logged`]).
    pub addr: SocketAddr,
    leaks: crate::log_scan::Leaks,
}

/// The older name of [`ChildProcess`].
pub type Server = ChildProcess;

impl std::fmt::Debug for ChildProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildProcess")
            .field("pid", &self.process.child.id())
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for ChildProcess {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.process
    }
}

impl std::ops::DerefMut for ChildProcess {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.process
    }
}

impl ChildProcess {
    /// Spawns `command` and waits (up to [`START_TIMEOUT`]) for its `listening on ADDR` line.
    ///
    /// # Panics
    /// When it cannot start, exits, or stays silent; the message has its stderr.
    pub fn start(command: Command) -> ChildProcess {
        ChildProcess::try_start(command).unwrap_or_else(|err| panic!("{err}"))
    }

    /// [`ChildProcess::start`] that returns the failure instead of panicking (for restarts that
    /// may race with the old process releasing its port).
    ///
    /// # Errors
    /// The program, why it failed, and its stderr.
    pub fn try_start(command: Command) -> Result<ChildProcess, String> {
        let leaks = crate::log_scan::Leaks::default();
        let scan = leaks.clone();
        let program = std::path::Path::new(command.get_program())
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut process = Child::spawn(Some(&program.clone()), command, move |stream, line| {
            scan.scan(&program, line);
            match stream {
                Stream::Stderr => eprintln!("[{program}] {line}"),
                Stream::Stdout if !line.starts_with("listening on ") => {
                    eprintln!("[{program} stdout] {line}");
                }
                Stream::Stdout => {}
            }
        })?;
        let addr = process.wait_listening(START_TIMEOUT)?;
        Ok(ChildProcess {
            process,
            addr,
            leaks,
        })
    }

    /// Spawns `command` with stdout and stderr appended to `log` and returns at once: for
    /// programs that do not print `listening on ADDR` (etcd, kube-apiserver), whose address the
    /// caller chose (`addr`) and whose readiness the caller checks.
    ///
    /// # Errors
    /// The program and why it could not start.
    pub fn spawn_logged(
        command: Command,
        log: &std::path::Path,
        addr: SocketAddr,
    ) -> Result<ChildProcess, String> {
        // Not scanned for secrets: these are third-party servers (etcd, kube-apiserver) whose
        // output goes to a file; our binaries are started with `start`/`try_start`.
        Ok(ChildProcess {
            process: Child::spawn_to_file(command, log)?,
            addr,
            leaks: crate::log_scan::Leaks::default(),
        })
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.process.kill();
        self.leaks.assert_none();
    }
}

/// Runs `command` to its end; panics naming `what`, with its status and output, when it fails.
/// Returns its output.
///
/// # Panics
/// When it cannot start or exits unsuccessfully.
pub fn run_checked(command: &mut Command, what: &str) -> std::process::Output {
    let out = command
        .output()
        .unwrap_or_else(|err| panic!("{what}: {err}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
