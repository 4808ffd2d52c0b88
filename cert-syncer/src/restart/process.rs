//! A container's server process as `/proc` shows it in the pod's shared PID namespace
//! (`shareProcessNamespace: true`): found by the executable it runs (`argv[0]`, the container's
//! `command`), with the time it started; and SIGTERM to exactly that process, through a pidfd.
//!
//! What the kernel asks of a sidecar that runs as the same uid as the server with every
//! capability dropped (as the pods of `manifests/` run every container): nothing more.
//! `/proc/PID/cmdline` and `/proc/PID/stat` are readable by any process of the namespace (no
//! ptrace check for these two), and `kill`/`pidfd_send_signal` are allowed when the sender's
//! uid equals the target's (`CAP_KILL` is only needed across uids). `/proc/PID/exe` would need
//! ptrace access, so it is not used.

use std::path::Path;
use std::time::{Duration, SystemTime};

use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};

/// A process found in `/proc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub pid: i32,
    /// When it started (its start in clock ticks after boot, on the wall clock).
    pub started: SystemTime,
    /// Its start in clock ticks after boot: with the pid, what tells it from a later process
    /// that reuses the pid.
    start_ticks: u64,
}

/// What a search for a container's process found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Exactly one process runs the executable (children that run it too are left out).
    Found(Process),
    /// None runs it: the container is between two lives, or its processes are not visible here
    /// (no `shareProcessNamespace: true`, another executable).
    Missing,
    /// Several unrelated processes run it (two containers of the pod with one executable):
    /// which one is the container's cannot be told.
    Several(Vec<i32>),
}

impl Process {
    /// Whether `other` is this same process (the pid and the start; the start's wall-clock
    /// time is computed afresh at each look and moves by microseconds).
    pub fn is(&self, other: &Process) -> bool {
        self.pid == other.pid && self.start_ticks == other.start_ticks
    }
}

#[cfg(test)]
impl Process {
    /// A process found at `pid` that started at `started` (for the rule's unit tests).
    pub fn for_test(pid: i32, started: SystemTime) -> Process {
        Process {
            pid,
            started,
            start_ticks: 0,
        }
    }
}

/// Why a process was not signalled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// It exited (or its pid now belongs to another process) before the signal.
    Gone,
    /// The kernel refused the signal (another uid and no `CAP_KILL`).
    NotPermitted(String),
}

/// The process of this PID namespace that runs `executable` (its `argv[0]`), neither this
/// process nor PID 1 (the pod's pause process, whose end is the pod's).
pub fn find(executable: &Path) -> Lookup {
    let wanted = executable.as_os_str().as_encoded_bytes();
    let own = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Lookup::Missing;
    };
    let mut candidates: Vec<(i32, Stat)> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != own && *pid != 1)
        .filter(|pid| argv0(*pid).is_some_and(|arg| arg == wanted))
        .filter_map(|pid| Some((pid, stat(pid)?)))
        .collect();
    // A server that forks keeps its executable in its children: the container's process is
    // the one whose parent does not run it too.
    let pids: Vec<i32> = candidates.iter().map(|(pid, _)| *pid).collect();
    candidates.retain(|(_, stat)| !pids.contains(&stat.parent));
    match candidates.as_slice() {
        [] => Lookup::Missing,
        [(pid, stat)] => Lookup::Found(Process {
            pid: *pid,
            started: boot_time() + ticks(stat.start_ticks),
            start_ticks: stat.start_ticks,
        }),
        several => Lookup::Several(several.iter().map(|(pid, _)| *pid).collect()),
    }
}

/// Sends SIGTERM to `process`, and only to it: the pidfd is opened first, then the process
/// behind the pid is checked to be the one found (same start), so a pid reused in between is
/// never signalled.
pub fn terminate(process: &Process) -> Result<(), Refused> {
    let pid = Pid::from_raw(process.pid).ok_or(Refused::Gone)?;
    let pidfd = pidfd_open(pid, PidfdFlags::empty()).map_err(|_| Refused::Gone)?;
    if stat(process.pid).map(|s| s.start_ticks) != Some(process.start_ticks) {
        return Err(Refused::Gone);
    }
    match pidfd_send_signal(&pidfd, Signal::TERM) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::SRCH) => Err(Refused::Gone),
        Err(err) => Err(Refused::NotPermitted(err.to_string())),
    }
}

/// The facts of `/proc/PID/stat` used here.
struct Stat {
    parent: i32,
    start_ticks: u64,
}

fn argv0(pid: i32) -> Option<Vec<u8>> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    cmdline.split(|b| *b == 0).next().map(<[u8]>::to_vec)
}

/// `/proc/PID/stat`: the parent (field 4) and the start (field 22). The command name (field 2,
/// in parentheses) may hold spaces and parentheses itself, so fields are counted after the
/// last `)`.
fn stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

fn parse_stat(text: &str) -> Option<Stat> {
    let after_name = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // `fields[0]` is field 3 (the state).
    Some(Stat {
        parent: fields.get(1)?.parse().ok()?,
        start_ticks: fields.get(19)?.parse().ok()?,
    })
}

fn ticks(count: u64) -> Duration {
    let per_second = rustix::param::clock_ticks_per_second().max(1);
    Duration::from_secs(count / per_second)
        + Duration::from_nanos((count % per_second) * 1_000_000_000 / per_second)
}

/// The wall-clock time of boot, as the kernel counts process starts (`CLOCK_BOOTTIME`, which
/// goes on during suspend).
fn boot_time() -> SystemTime {
    let since_boot = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    let since_boot = Duration::new(
        since_boot.tv_sec.max(0) as u64,
        since_boot.tv_nsec.clamp(0, 999_999_999) as u32,
    );
    SystemTime::now()
        .checked_sub(since_boot)
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::{CommandExt, ExitStatusExt};

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let text = "42 (a) b (c)) S 7 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 100 1";
        let stat = parse_stat(text).unwrap();
        assert_eq!((stat.parent, stat.start_ticks), (7, 987654));
        assert!(parse_stat("42 (a) S").is_none());
    }

    /// `sleep 30` with `argv[0]` set to `name`.
    fn sleeper(name: &str) -> std::process::Child {
        std::process::Command::new("sleep")
            .arg0(name)
            .arg("30")
            .spawn()
            .expect("sleep runs")
    }

    /// `find` once the children have exec'd (until then they show the test's command line).
    fn find_soon(name: &str, wanted: impl Fn(&Lookup) -> bool) -> Lookup {
        for _ in 0..100 {
            let found = find(Path::new(name));
            if wanted(&found) {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        find(Path::new(name))
    }

    #[test]
    fn the_one_process_running_the_executable_is_found_and_terminated() {
        let name = format!("/test/restart-target-{}", std::process::id());
        let before = SystemTime::now() - Duration::from_secs(1);
        let mut child = sleeper(&name);
        let Lookup::Found(found) = find_soon(&name, |l| matches!(l, Lookup::Found(_))) else {
            panic!("found one process");
        };
        assert_eq!(found.pid, child.id() as i32);
        let after = SystemTime::now() + Duration::from_secs(1);
        assert!(
            before <= found.started && found.started <= after,
            "{:?}",
            found.started
        );
        terminate(&found).expect("SIGTERM sent");
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
        assert_eq!(find(Path::new(&name)), Lookup::Missing);
        assert_eq!(
            terminate(&found),
            Err(Refused::Gone),
            "a process that exited"
        );
    }

    #[test]
    fn two_unrelated_processes_running_it_are_several() {
        let name = format!("/test/restart-twins-{}", std::process::id());
        let mut children = [sleeper(&name), sleeper(&name)];
        match find_soon(&name, |l| matches!(l, Lookup::Several(p) if p.len() == 2)) {
            Lookup::Several(pids) => assert_eq!(pids.len(), 2),
            other => panic!("{other:?}"),
        }
        for child in &mut children {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    #[test]
    fn a_reused_pid_is_never_signalled() {
        let name = format!("/test/restart-reused-{}", std::process::id());
        let mut child = sleeper(&name);
        let Lookup::Found(mut found) = find_soon(&name, |l| matches!(l, Lookup::Found(_))) else {
            panic!("found");
        };
        // Another start at the same pid: the process behind the pid is not the one found.
        found.start_ticks += 1;
        assert_eq!(terminate(&found), Err(Refused::Gone));
        assert!(child.try_wait().unwrap().is_none(), "still running");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
