//! A machine of a test's own, for commands written for a whole machine: fixed paths such as
//! `/etc/kubernetes`, fixed ports, a node address (the README's walkthrough,
//! `tests/kubelet_walkthrough.rs`). It is a bash shell in new mount, network and PID namespaces
//! (`unshare`), fed scripts on its standard input as a user pastes them into a terminal:
//!
//! - **files**: the machine paths a run owns (`/etc/kubernetes`, ...) start absent and are
//!   written under the test's directory ([`PrivateMachine::host_path`]); every other entry of
//!   their parent directories is the machine's own, bind-mounted, and nothing of it changes
//!   (`machine.sh`);
//! - **network**: a loopback and an `eth0` with [`MACHINE_ADDRESS`] and a default route, whose
//!   peer is in the namespace too: the fixed ports are the namespace's, nothing leaves it;
//! - **processes**: the shell is the PID namespace's init. It dies with the test process
//!   (`setpriv --pdeathsig` on `unshare --kill-child`), and the kernel then kills every process
//!   of the namespace, so nothing a run started outlives the test, also when the test is killed
//!   (nextest's timeout) and its drop guards never run. The mounts go with the mount namespace.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The machine's address on its `eth0` (TEST-NET-2, never routed).
pub const MACHINE_ADDRESS: &str = "198.51.100.10";

/// The programs it needs on `PATH` (util-linux and iproute2).
pub const PROGRAMS: [&str; 5] = ["setpriv", "unshare", "nsenter", "mount", "ip"];

/// The functions the shell sources before anything else.
const SETUP: &str = include_str!("machine.sh");

/// How a script run in the machine ended badly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError {
    /// A command failed (`set -e`): the script, its line and the command, from the shell's
    /// `ERR` trap.
    Failed {
        /// The script file.
        file: String,
        /// The line in it (1-based).
        line: usize,
        /// The command as bash saw it.
        command: String,
    },
    /// The shell ended without saying why.
    Ended,
    /// The script still ran after this long.
    TimedOut(Duration),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Failed {
                file,
                line,
                command,
            } => write!(f, "{file}:{line}: `{command}` failed"),
            Self::Ended => f.write_str("the shell ended"),
            Self::TimedOut(after) => write!(f, "still running after {after:?}"),
        }
    }
}

/// A running private machine (see the module doc); dropped, every process of it is killed.
pub struct PrivateMachine {
    dir: PathBuf,
    owned: Vec<String>,
    /// `setpriv` → `unshare`: killing it ends the shell, and so the namespaces.
    launcher: Child,
    stdin: Option<ChildStdin>,
    output: Receiver<String>,
    /// The shell's pid (on the host): init of the PID namespace.
    shell: u32,
    /// `pid:[INODE]` of the PID namespace.
    pid_namespace: String,
    scripts: u64,
}

impl std::fmt::Debug for PrivateMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateMachine")
            .field("dir", &self.dir)
            .field("shell", &self.shell)
            .finish_non_exhaustive()
    }
}

impl PrivateMachine {
    /// Starts the shell in `cwd` with exactly the environment `env`, in the namespaces, its
    /// files in `dir` (`root/`: what it writes at the machine paths, `transcript.log`: all it
    /// printed). `owned` are the absolute machine paths a run owns. Scripts then run under
    /// `set -eEuo pipefail`.
    ///
    /// The shell dies when the thread that calls this ends: call it from the test's thread.
    ///
    /// # Panics
    /// When the namespaces cannot be made (not root, a program of [`PROGRAMS`] missing).
    pub fn start(dir: &Path, owned: &[&str], cwd: &Path, env: &[(&str, String)]) -> Self {
        std::fs::create_dir_all(dir).expect("the machine's directory");
        let mut launcher = Command::new("setpriv")
            .args([
                "--pdeathsig",
                "KILL",
                "--",
                "unshare",
                "--kill-child=SIGKILL",
            ])
            .args(["--mount", "--net", "--pid", "--fork", "--mount-proc"])
            .args([
                "--propagation",
                "private",
                "bash",
                "--noprofile",
                "--norc",
                "-s",
            ])
            .current_dir(cwd)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("setpriv and unshare run");
        let output = transcribe(
            launcher.stdout.take().expect("piped"),
            &dir.join("transcript.log"),
        );
        let mut machine = PrivateMachine {
            dir: dir.to_owned(),
            owned: owned.iter().map(|p| (*p).to_owned()).collect(),
            stdin: launcher.stdin.take(),
            launcher,
            output,
            shell: 0,
            pid_namespace: String::new(),
            scripts: 0,
        };
        machine.send(&machine.setup_script());
        if let Err(err) = machine.wait_for("@@machine ready@@", Duration::from_secs(60)) {
            panic!(
                "the private machine did not start: {err}\n{}",
                machine.transcript_tail()
            );
        }
        machine.shell = shell_of(machine.launcher.id());
        machine.pid_namespace = std::fs::read_link(format!("/proc/{}/ns/pid", machine.shell))
            .expect("the shell's PID namespace")
            .display()
            .to_string();
        machine
    }

    fn setup_script(&self) -> String {
        let mut parents: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for path in &self.owned {
            let (parent, name) = path
                .rsplit_once('/')
                .filter(|(parent, name)| !parent.is_empty() && !name.is_empty())
                .unwrap_or_else(|| panic!("{path}: not an absolute path below a directory"));
            parents.entry(parent).or_default().push(name);
        }
        let private: String = parents
            .iter()
            .map(|(parent, names)| format!("private_parent {parent} {}\n", names.join(" ")))
            .collect();
        format!(
            "set -euo pipefail\nexec 2>&1\nT='{}'\n{SETUP}{private}\
             machine_network {MACHINE_ADDRESS}/24 198.51.100.1\n\
             unset -f private_parent machine_network; unset T\n\
             set -E\n\
             trap 'echo \"@@failed ${{BASH_SOURCE[0]:-stdin}}:${{LINENO}}: ${{BASH_COMMAND}}@@\"' ERR\n\
             echo '@@machine ready@@'\n",
            self.dir.display()
        )
    }

    /// Where the machine path `path` (an owned path or below one) is on the host.
    ///
    /// # Panics
    /// When `path` is not below an owned path.
    pub fn host_path(&self, path: &str) -> PathBuf {
        let owned = self
            .owned
            .iter()
            .any(|o| path == o || path.starts_with(&format!("{o}/")));
        assert!(owned, "{path} is not a path the machine owns");
        self.dir.join("root").join(path.trim_start_matches('/'))
    }

    /// Runs `script` in the shell as `source SCRIPT < /dev/null` (its variables stay for the
    /// next) and waits at most `timeout` for it to end.
    ///
    /// # Errors
    /// A [`RunError`]: a command failed, the shell ended, or time ran out.
    pub fn run_script(&mut self, script: &Path, timeout: Duration) -> Result<(), RunError> {
        self.scripts += 1;
        let done = format!("@@done {}@@", self.scripts);
        self.send(&format!(
            "source '{}' < /dev/null; echo '{done}'\n",
            script.display()
        ));
        self.wait_for(&done, timeout)
    }

    fn send(&mut self, text: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            // A shell that ended is reported by the wait that follows.
            let _ = stdin
                .write_all(text.as_bytes())
                .and_then(|()| stdin.flush());
        }
    }

    fn wait_for(&self, marker: &str, timeout: Duration) -> Result<(), RunError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.output.recv_timeout(left) {
                // A script's last output need not end its line: the marker may follow it.
                Ok(line) if line.trim_end().ends_with(marker) => return Ok(()),
                Ok(line) => {
                    if let Some(failure) = failure_of(&line) {
                        return Err(failure);
                    }
                }
                Err(RecvTimeoutError::Timeout) => return Err(RunError::TimedOut(timeout)),
                Err(RecvTimeoutError::Disconnected) => return Err(RunError::Ended),
            }
        }
    }

    /// `PROGRAM` run inside the machine (`nsenter` into its namespaces): its paths, its
    /// network, its `/proc`.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg("--target")
            .arg(self.shell.to_string())
            .args(["--mount", "--net", "--pid", "--", program]);
        command
    }

    /// Every process of the machine but its shell, as `PID COMMAND LINE` (host pids).
    pub fn processes(&self) -> Vec<String> {
        processes_in(&self.pid_namespace)
            .into_iter()
            .filter(|(pid, _)| *pid != self.shell)
            .map(|(pid, line)| format!("{pid} {line}"))
            .collect()
    }

    /// The machine's mount points at or under its path `path`, deepest first.
    pub fn mounts_under(&self, path: &str) -> Vec<String> {
        let mountinfo =
            std::fs::read_to_string(format!("/proc/{}/mountinfo", self.shell)).unwrap_or_default();
        super::cleanup::mounts_under_in(&mountinfo, Path::new(path))
    }

    /// The last lines the shell printed.
    pub fn transcript_tail(&self) -> String {
        crate::envtest::log_tail(&self.dir, "transcript.log")
    }

    /// Ends the shell the way a user leaves a terminal (end of input) and waits for it: the
    /// namespaces end with it. Returns its exit status.
    ///
    /// # Panics
    /// When it has not ended within 30 s.
    pub fn end(&mut self) -> ExitStatus {
        drop(self.stdin.take());
        let status = testkit::wait::poll_until(Duration::from_secs(30), || {
            self.launcher.try_wait().ok().flatten()
        });
        status.expect("the machine's shell ends at the end of its input")
    }
}

impl Drop for PrivateMachine {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.launcher.kill();
        let _ = self.launcher.wait();
        let gone = testkit::wait::poll_until(Duration::from_secs(10), || {
            processes_in(&self.pid_namespace).is_empty().then_some(())
        });
        if gone.is_none() {
            eprintln!(
                "private machine: still running 10 s after its shell was killed: {:?}",
                processes_in(&self.pid_namespace)
            );
        }
    }
}

/// Reads `stdout` line by line on a thread: each line is appended to `transcript` and sent.
fn transcribe(stdout: std::process::ChildStdout, transcript: &Path) -> Receiver<String> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let mut file = std::fs::File::create(transcript).expect("the machine's transcript");
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = Vec::new();
        while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            let _ = file.write_all(&line);
            // The receiver is gone once the machine is: keep draining the pipe all the same.
            let _ = sender.send(String::from_utf8_lossy(&line).into_owned());
            line.clear();
        }
    });
    receiver
}

/// The `@@failed FILE:LINE: COMMAND@@` line of the shell's `ERR` trap.
fn failure_of(line: &str) -> Option<RunError> {
    let (_, rest) = line.trim_end().split_once("@@failed ")?;
    let inner = rest.strip_suffix("@@")?;
    let (place, command) = inner.split_once(": ").unwrap_or((inner, ""));
    let (file, number) = place.rsplit_once(':').unwrap_or((place, "0"));
    Some(RunError::Failed {
        file: file.to_owned(),
        line: number.parse().unwrap_or(0),
        command: command.to_owned(),
    })
}

/// The pid of `unshare`'s child (the shell), from `/proc/PID/task/PID/children`.
fn shell_of(unshare: u32) -> u32 {
    let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
        .unwrap_or_default();
    children
        .split_whitespace()
        .next()
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("unshare ({unshare}) has no child shell"))
}

/// Every process whose PID namespace is `namespace` (`pid:[INODE]`): (pid, command line).
fn processes_in(namespace: &str) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/ns/pid"))
                .is_ok_and(|ns| ns.display().to_string() == namespace)
        })
        .map(|pid| {
            let line = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let line = String::from_utf8_lossy(&line).replace('\0', " ");
            (pid, line.trim_end().to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_err_trap_line_names_file_line_and_command() {
        assert_eq!(
            failure_of("@@failed /t/blocks/3.sh:12: curl -sf http://x: y@@\n"),
            Some(RunError::Failed {
                file: "/t/blocks/3.sh".into(),
                line: 12,
                command: "curl -sf http://x: y".into()
            })
        );
        assert_eq!(failure_of("served: 1\n"), None);
        assert!(failure_of("ok@@failed s.sh:1: false@@").is_some());
    }
}
