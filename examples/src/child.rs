//! Child processes of the demo and load tools: stderr kept for failure reports, the address
//! from the `listening on ADDR` line every workspace binary prints, killed on drop.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};

use anyhow::Context;

/// A child process, killed on drop; its stderr is kept for the failure report.
pub struct Proc {
    /// Shown in reports.
    pub name: &'static str,
    /// The process.
    pub child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    /// Spawns `command`; every stderr line goes to the log and through `watch` (for timeline
    /// marks); the first `listening on ADDR` on stdout is sent on `listening`.
    pub fn spawn(
        name: &'static str,
        mut command: Command,
        watch: impl Fn(&str) + Send + 'static,
        listening: Option<mpsc::Sender<SocketAddr>>,
    ) -> anyhow::Result<Proc> {
        if !command.get_envs().any(|(key, _)| key == "RUST_LOG") {
            command.env("RUST_LOG", "info");
        }
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {}", command.get_program().to_string_lossy()))?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let (stderr, stdout) = (child.stderr.take(), child.stdout.take());
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr.expect("piped"))
                .lines()
                .map_while(Result::ok)
            {
                watch(&line);
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
        std::thread::spawn(move || {
            let mut listening = listening;
            for line in BufReader::new(stdout.expect("piped"))
                .lines()
                .map_while(Result::ok)
            {
                if let Some(addr) = line.strip_prefix("listening on ")
                    && let Some(tx) = listening.take()
                    && let Ok(addr) = addr.trim().parse()
                {
                    let _ = tx.send(addr);
                }
            }
        });
        Ok(Proc { name, child, log })
    }

    /// The last `lines` stderr lines, each prefixed with the name.
    pub fn tail(&self, lines: usize) -> String {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let start = log.len().saturating_sub(lines);
        log[start..]
            .iter()
            .map(|l| format!("  [{}] {l}\n", self.name))
            .collect()
    }
}
