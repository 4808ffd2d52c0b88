//! What the load tool reads from outside the processes: memory and CPU from `/proc`, readiness
//! over plain HTTP, and the moment an object's `..data` link is swapped (inotify).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use anyhow::Context;
use inotify::{Inotify, WatchDescriptor, WatchMask, Watches};

/// `VmRSS` and `VmHWM` (peak) of a process, in KiB.
pub fn memory_kib(pid: u32) -> anyhow::Result<(u64, u64)> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("no {name} in {path}"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// CPU time (user + system) a process has used so far.
pub fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    // Fields after the command name (which may hold spaces, and ends at the last ')'):
    // state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| -> anyhow::Result<u64> {
        fields
            .get(i - 3)
            .and_then(|f| f.parse().ok())
            .with_context(|| format!("no field {i} in {path}"))
    };
    let total = ticks(14)? + ticks(15)?;
    Ok(Duration::from_secs_f64(total as f64 / clock_ticks() as f64))
}

/// `sysconf(_SC_CLK_TCK)` through getconf(1) (the workspace forbids `unsafe`); 100, the value
/// on every Linux we run on, when that fails.
fn clock_ticks() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(100)
    })
}

/// The status code of a plain-HTTP `GET` (the syncer's `/readyz`); 0 when it cannot connect.
pub fn http_status(addr: SocketAddr, path: &str) -> u16 {
    let attempt = || -> std::io::Result<u16> {
        let mut tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            tcp,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )?;
        let mut response = String::new();
        tcp.read_to_string(&mut response)?;
        Ok(response
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0))
    };
    attempt().unwrap_or(0)
}

/// Reports when `..data` is renamed into a watched directory (the commit of the atomic
/// directory writer), timed by a thread that blocks on inotify.
pub struct Landings {
    watches: Watches,
    rx: mpsc::Receiver<(WatchDescriptor, Instant)>,
    /// Read errors of the thread, reported instead of hanging.
    failed: Arc<Mutex<Option<String>>>,
}

impl Landings {
    /// Starts the reader thread (it lives as long as the process).
    ///
    /// # Errors
    /// When inotify cannot be initialised.
    pub fn start() -> anyhow::Result<Landings> {
        let mut inotify = Inotify::init().context("cannot initialise inotify")?;
        let watches = inotify.watches();
        let (tx, rx) = mpsc::channel();
        let failed = Arc::new(Mutex::new(None));
        let report = Arc::clone(&failed);
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            loop {
                let events = match inotify.read_events_blocking(&mut buffer) {
                    Ok(events) => events,
                    Err(err) => {
                        *report.lock().unwrap_or_else(|p| p.into_inner()) = Some(err.to_string());
                        return;
                    }
                };
                let now = Instant::now();
                for event in events {
                    if event.name.is_some_and(|n| n == "..data")
                        && tx.send((event.wd, now)).is_err()
                    {
                        return;
                    }
                }
            }
        });
        Ok(Landings {
            watches,
            rx,
            failed,
        })
    }

    /// Watches `dir` for the next swap; call before causing it.
    ///
    /// # Errors
    /// When the watch cannot be added.
    pub fn arm(&mut self, dir: &Path) -> anyhow::Result<WatchDescriptor> {
        self.watches
            .add(dir, WatchMask::MOVED_TO)
            .with_context(|| format!("cannot watch {}", dir.display()))
    }

    /// When the swap in the directory of `wd` happened (at most `timeout` from now); the watch is
    /// removed.
    ///
    /// # Errors
    /// On timeout or a failed reader thread.
    pub fn wait(&mut self, wd: WatchDescriptor, timeout: Duration) -> anyhow::Result<Instant> {
        let deadline = Instant::now() + timeout;
        let landed = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok((seen, at)) if seen == wd => break Ok(at),
                Ok(_) => {}
                Err(_) => {
                    let failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
                    break Err(anyhow::anyhow!(
                        "no ..data swap within {timeout:?}{}",
                        failed
                            .as_deref()
                            .map(|e| format!(" (inotify: {e})"))
                            .unwrap_or_default()
                    ));
                }
            }
        };
        let _ = self.watches.remove(wd);
        landed
    }
}

/// Nearest-rank percentile of sorted values (`p` in 0..=100).
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// min, median and max of `values` (unsorted).
pub fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => (0.0, 0.0, 0.0),
        n => (sorted[0], sorted[n / 2], sorted[n - 1]),
    }
}

/// The value of one series (exact name and labels, as printed) in Prometheus text.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    let values: HashMap<&str, f64> = text
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            Some((name, value.parse().ok()?))
        })
        .collect();
    values.get(series).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let values: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&values, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&values, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&values[..1], 99.0), Duration::from_millis(1));
    }

    #[test]
    fn the_spread_is_min_median_max() {
        assert_eq!(spread(&[3.0, 1.0, 2.0]), (1.0, 2.0, 3.0));
    }

    #[test]
    fn this_process_has_memory_and_cpu_figures() {
        let (rss, hwm) = memory_kib(std::process::id()).unwrap();
        assert!(rss > 0 && hwm >= rss);
        cpu_time(std::process::id()).unwrap();
    }

    #[test]
    fn a_series_value_is_found_by_its_exact_labels() {
        let text = "# TYPE x gauge\nx{resource=\"secrets\"} 1\nx{resource=\"configmaps\"} 2\n";
        assert_eq!(metric_value(text, "x{resource=\"configmaps\"}"), Some(2.0));
        assert_eq!(metric_value(text, "x{resource=\"events\"}"), None);
    }
}
