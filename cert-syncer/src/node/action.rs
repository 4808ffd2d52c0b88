//! The optional post-write action, for consumers that do not watch the file: a signal to a
//! process (found by pid file or by name) or a command (no shell), bounded by a timeout.

use std::path::Path;
use std::time::Duration;

use super::settings::{PostWrite, SignalTarget};

/// What the action did: `Ok` with a summary for the log, or why it failed.
pub async fn run(action: &PostWrite, timeout: Duration) -> Result<String, String> {
    match action {
        PostWrite::Signal { signal, target } => {
            let target = target.clone();
            let signal = *signal;
            let work = tokio::task::spawn_blocking(move || signal_processes(signal, &target));
            match tokio::time::timeout(timeout, work).await {
                Ok(Ok(result)) => result,
                Ok(Err(err)) => Err(format!("the signal task failed: {err}")),
                Err(_) => Err(format!("finding the process took longer than {timeout:?}")),
            }
        }
        PostWrite::Command(argv) => run_command(argv, timeout).await,
    }
}

fn signal_processes(signal: i32, target: &SignalTarget) -> Result<String, String> {
    let pids = match target {
        SignalTarget::PidFile(path) => vec![read_pid_file(path)?],
        SignalTarget::ProcessName(name) => {
            let pids = processes_named(name);
            if pids.is_empty() {
                return Err(format!("no process named {name:?}"));
            }
            pids
        }
    };
    let signal_value = nix::sys::signal::Signal::try_from(signal)
        .map_err(|err| format!("signal {signal}: {err}"))?;
    for pid in &pids {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), signal_value)
            .map_err(|err| format!("cannot send {signal_value} to pid {pid}: {err}"))?;
    }
    Ok(format!("sent {signal_value} to pid {pids:?}"))
}

fn read_pid_file(path: &Path) -> Result<i32, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| format!("cannot read pid file {}: {err}", path.display()))?;
    text.trim()
        .parse::<i32>()
        .ok()
        .filter(|pid| *pid > 1)
        .ok_or_else(|| format!("pid file {} does not hold a pid above 1", path.display()))
}

/// Pids whose `/proc/PID/comm` is `name` (the kernel truncates it to 15 bytes; so is `name`).
fn processes_named(name: &str) -> Vec<i32> {
    let wanted: String = name.chars().take(15).collect();
    let own = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != own)
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim_end_matches('\n') == wanted)
        })
        .collect()
}

async fn run_command(argv: &[String], timeout: Duration) -> Result<String, String> {
    let Some((program, args)) = argv.split_first() else {
        return Err("empty command".to_owned());
    };
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|err| format!("cannot start {program}: {err}"))?;
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(format!("{program} exited 0")),
        Ok(Ok(status)) => Err(format!("{program} failed: {status}")),
        Ok(Err(err)) => Err(format!("waiting for {program}: {err}")),
        Err(_) => {
            let _ = child.kill().await;
            Err(format!(
                "{program} did not finish within {timeout:?}; killed"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_command_runs_and_a_slow_one_is_killed() {
        let ok = run(
            &PostWrite::Command(vec!["true".into()]),
            Duration::from_secs(10),
        )
        .await;
        assert!(ok.is_ok(), "{ok:?}");
        let failed = run(
            &PostWrite::Command(vec!["false".into()]),
            Duration::from_secs(10),
        )
        .await;
        assert!(failed.unwrap_err().contains("failed"));
        let slow = run(
            &PostWrite::Command(vec!["sleep".into(), "30".into()]),
            Duration::from_millis(200),
        )
        .await;
        assert!(slow.unwrap_err().contains("killed"));
    }

    #[tokio::test]
    async fn a_signal_reaches_the_process_of_a_pid_file() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        std::fs::write(&pid_file, format!("{}\n", child.id())).unwrap();
        let action = PostWrite::Signal {
            signal: libc::SIGTERM,
            target: SignalTarget::PidFile(pid_file),
        };
        run(&action, Duration::from_secs(10)).await.unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        let missing = PostWrite::Signal {
            signal: libc::SIGHUP,
            target: SignalTarget::ProcessName("no-such-process-x".into()),
        };
        assert!(
            run(&missing, Duration::from_secs(10))
                .await
                .unwrap_err()
                .contains("no process")
        );
    }
}
