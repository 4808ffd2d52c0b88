//! Child processes: spawned with their output captured line by line (kept, and shown to a hook
//! the caller gives), their `listening on ADDR` line awaited (every workspace binary prints one
//! on stdout when it serves), killed and reaped on drop.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// Which output a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output (machine-readable lines, `listening on ADDR`).
    Stdout,
    /// Standard error (the logs).
    Stderr,
}

/// What the caller sees of each output line (the `listening on` line included).
pub type LineHook = Box<dyn Fn(Stream, &str) + Send + Sync>;

/// A running child process, killed (SIGKILL) and reaped on drop.
pub struct Child {
    /// The name in messages (the program's file name unless given).
    pub name: String,
    /// The process.
    pub child: std::process::Child,
    /// Its stderr lines so far.
    stderr: Arc<Mutex<Vec<String>>>,
    /// The first `listening on ADDR` of its stdout.
    listening: Option<mpsc::Receiver<Result<SocketAddr, String>>>,
}

impl std::fmt::Debug for Child {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Child")
            .field("name", &self.name)
            .field("pid", &self.child.id())
            .finish_non_exhaustive()
    }
}

/// Sets `RUST_LOG=info` on `command` unless it sets `RUST_LOG` itself, so the info lines a hook
/// waits for are there whatever the caller's environment says.
pub fn log_info_unless_set(command: &mut Command) {
    if !command.get_envs().any(|(key, _)| key == "RUST_LOG") {
        command.env("RUST_LOG", "info");
    }
}

impl Child {
    /// [`Child::spawn`] as the demos run their children: `RUST_LOG=info` unless the command sets
    /// it (see [`log_info_unless_set`]), and `on_stderr` sees each log line.
    ///
    /// # Errors
    /// When the program cannot start, naming it.
    pub fn spawn_logging(
        name: &str,
        mut command: Command,
        on_stderr: impl Fn(&str) + Send + Sync + 'static,
    ) -> Result<Child, String> {
        log_info_unless_set(&mut command);
        Child::spawn(Some(name), command, move |stream, line| {
            if stream == Stream::Stderr {
                on_stderr(line);
            }
        })
    }

    /// Spawns `command` with stdout and stderr piped; every line goes to `hook`, stderr lines
    /// are also kept ([`Child::stderr_text`], [`Child::tail`]).
    ///
    /// # Errors
    /// When the program cannot start, naming it.
    pub fn spawn(
        name: Option<&str>,
        mut command: Command,
        hook: impl Fn(Stream, &str) + Send + Sync + 'static,
    ) -> Result<Child, String> {
        let name = name.map_or_else(|| program_name(&command), str::to_owned);
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| format!("cannot start {name}: {err}"))?;
        let hook: Arc<LineHook> = Arc::new(Box::new(hook));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (err, out) = (child.stderr.take(), child.stdout.take());
        let (sink, err_hook) = (Arc::clone(&stderr), Arc::clone(&hook));
        std::thread::spawn(move || {
            for line in BufReader::new(err.expect("stderr is piped"))
                .lines()
                .map_while(Result::ok)
            {
                err_hook(Stream::Stderr, &line);
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(out.expect("stdout is piped"))
                .lines()
                .map_while(Result::ok)
            {
                hook(Stream::Stdout, &line);
                if let Some(addr) = line.strip_prefix("listening on ")
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(
                        addr.trim()
                            .parse::<SocketAddr>()
                            .map_err(|err| format!("printed an unparsable address: {err}")),
                    );
                }
            }
        });
        Ok(Child {
            name,
            child,
            stderr,
            listening: Some(rx),
        })
    }

    /// Spawns `command` with stdout and stderr appended to the file `log` and returns at once:
    /// for programs that print no `listening on ADDR` (etcd, kube-apiserver), whose readiness
    /// the caller checks.
    ///
    /// # Errors
    /// When the log cannot be opened or the program cannot start, naming them.
    pub fn spawn_to_file(mut command: Command, log: &Path) -> Result<Child, String> {
        let name = program_name(&command);
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .map_err(|err| format!("cannot open {}: {err}", log.display()))
        };
        let child = command
            .stdin(Stdio::null())
            .stdout(open()?)
            .stderr(open()?)
            .spawn()
            .map_err(|err| format!("cannot start {name}: {err}"))?;
        Ok(Child {
            name,
            child,
            stderr: Arc::new(Mutex::new(Vec::new())),
            listening: None,
        })
    }

    /// Waits at most `timeout` for the `listening on ADDR` line. On failure the child is
    /// killed and the message has its exit status and stderr.
    ///
    /// # Errors
    /// The process exited, stayed silent, or printed an unparsable address.
    pub fn wait_listening(&mut self, timeout: Duration) -> Result<SocketAddr, String> {
        let outcome = match &self.listening {
            Some(rx) => rx.recv_timeout(timeout),
            None => return Err(format!("{}: its output goes to a file", self.name)),
        };
        let why = match outcome {
            Ok(Ok(addr)) => return Ok(addr),
            Ok(Err(err)) => err,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                format!("did not print `listening on` within {timeout:?}")
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                "exited before printing `listening on`".to_owned()
            }
        };
        self.kill();
        let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
        // Give the stderr thread a moment to drain what the process wrote before exiting.
        std::thread::sleep(Duration::from_millis(50));
        Err(format!(
            "{} {why} ({status}); stderr:\n{}",
            self.name,
            self.stderr_text()
        ))
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited (reaping it if so).
    pub fn has_exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Kills the process (SIGKILL: nothing gets to flush, as in a crash) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM (through `kill(1)`: the workspace forbids `unsafe`) and waits at most
    /// `timeout` for the process to exit; returns its exit status, or `None` if it is still
    /// running (it is then killed on drop). A process that already exited (and was reaped, by
    /// [`Child::has_exited`] say) gets no signal: its pid may be another process's by now.
    ///
    /// # Panics
    /// When `kill` cannot run or fails.
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill(1) runs");
        assert!(sent.success(), "kill -TERM {} failed", self.child.id());
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What it wrote on stderr so far.
    pub fn stderr_text(&self) -> String {
        let lines = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().flat_map(|l| [l.as_str(), "\n"]).collect()
    }

    /// The last `lines` stderr lines, each prefixed with the name.
    pub fn tail(&self, lines: usize) -> String {
        let log = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        let start = log.len().saturating_sub(lines);
        log[start..]
            .iter()
            .map(|l| format!("  [{}] {l}\n", self.name))
            .collect()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}

fn program_name(command: &Command) -> String {
    Path::new(command.get_program())
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
