//! Workspace binaries as child processes: finding them, starting them, waiting for their
//! `listening on ADDR` line, killing them on drop.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a child may take to print `listening on ADDR`.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A workspace binary: in `E2E_BIN_DIR` if set, else in the target dir this test runs from
/// (`target/debug/deps/<test>` → `target/debug/<name>`). `CARGO_BIN_EXE_*` only covers the
/// test's own package, so it cannot find other packages' binaries.
///
/// # Panics
/// When the binary is missing, with the command that builds it.
pub fn bin_path(name: &str) -> PathBuf {
    let path = match std::env::var_os("E2E_BIN_DIR") {
        Some(dir) => PathBuf::from(dir).join(name),
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

/// A running child process, killed (and reaped) on drop. Its stdout and stderr are forwarded
/// to the test's stderr, prefixed with the program name; stderr is also kept for assertions.
pub struct ChildProcess {
    /// The process.
    pub child: Child,
    /// The address it printed as `listening on ADDR`.
    pub addr: SocketAddr,
    /// Everything it wrote on stderr so far.
    pub stderr: Arc<Mutex<String>>,
}

/// The older name of [`ChildProcess`].
pub type Server = ChildProcess;

impl std::fmt::Debug for ChildProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildProcess")
            .field("pid", &self.child.id())
            .field("addr", &self.addr)
            .finish_non_exhaustive()
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
    pub fn try_start(mut command: Command) -> Result<ChildProcess, String> {
        let program = std::path::Path::new(command.get_program())
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| format!("cannot start {program}: {err}"))?;
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        let err = child.stderr.take().expect("stderr is piped");
        let prefix = program.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[{prefix}] {line}");
                let mut sink = sink.lock().unwrap_or_else(|p| p.into_inner());
                sink.push_str(&line);
                sink.push('\n');
            }
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let out = child.stdout.take().expect("stdout is piped");
        let prefix = program.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("listening on ")
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(addr.trim().parse::<SocketAddr>());
                } else {
                    eprintln!("[{prefix} stdout] {line}");
                }
            }
        });
        let outcome = rx.recv_timeout(START_TIMEOUT);
        let failure = |why: String, child: &mut Child| {
            let _ = child.kill();
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            // Give the stderr thread a moment to drain what the process wrote before exiting.
            std::thread::sleep(Duration::from_millis(50));
            let log = stderr.lock().unwrap_or_else(|p| p.into_inner()).clone();
            format!("{program} {why} ({status}); stderr:\n{log}")
        };
        match outcome {
            Ok(Ok(addr)) => Ok(ChildProcess {
                child,
                addr,
                stderr,
            }),
            Ok(Err(err)) => Err(failure(
                format!("printed an unparsable address: {err}"),
                &mut child,
            )),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(failure(
                format!("did not print `listening on` within {START_TIMEOUT:?}"),
                &mut child,
            )),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(failure(
                "exited before printing `listening on`".to_owned(),
                &mut child,
            )),
        }
    }

    /// Spawns `command` with stdout and stderr appended to `log` and returns at once: for
    /// programs that do not print `listening on ADDR` (etcd, kube-apiserver), whose address the
    /// caller chose (`addr`) and whose readiness the caller checks.
    ///
    /// # Errors
    /// The program and why it could not start.
    pub fn spawn_logged(
        mut command: Command,
        log: &std::path::Path,
        addr: SocketAddr,
    ) -> Result<ChildProcess, String> {
        let program = command.get_program().to_string_lossy().into_owned();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|err| format!("cannot open {}: {err}", log.display()))?;
        let err_file = file
            .try_clone()
            .map_err(|err| format!("cannot open {}: {err}", log.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err_file)
            .spawn()
            .map_err(|err| format!("cannot start {program}: {err}"))?;
        Ok(ChildProcess {
            child,
            addr,
            stderr: Arc::new(Mutex::new(String::new())),
        })
    }

    /// Whether the process has exited (reaping it if so).
    pub fn has_exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Kills the process (SIGKILL: nothing gets to flush, as in a crash) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM (through `kill(1)`: the workspace forbids `unsafe`) and waits at most
    /// `timeout` for the process to exit; returns its exit status, or `None` if it is still
    /// running (it is then killed on drop).
    ///
    /// # Panics
    /// When `kill` cannot run.
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill(1) runs");
        assert!(sent.success(), "kill -TERM {} failed", self.child.id());
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What it wrote on stderr so far.
    pub fn stderr_text(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
