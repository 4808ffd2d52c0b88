//! What the nodes cost this machine: every process of each node's network namespace (its
//! kubelet, containerd, shims, containers, etcd member, host processes) sampled every
//! [`PERIOD`]: CPU time (`utime + stime` of `/proc/PID/stat`, the last value seen per process;
//! a process that ends between two samples loses at most one period of its CPU) and
//! proportional memory (`Pss` of `/proc/PID/smaps_rollup`: shared pages split between their
//! users, so the nodes' figures add up); with the machine's busy CPU (`/proc/stat`) beside
//! them, which includes everyone else's load.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::namespaces::pids_in;

/// How often the processes are sampled.
pub const PERIOD: Duration = Duration::from_secs(2);

/// One node's figures over a window.
#[derive(Debug, Clone, Default)]
pub struct NodeUsage {
    /// CPU seconds its processes used in the window.
    pub cpu_seconds: f64,
    /// Its processes' summed PSS: the highest sample, bytes.
    pub peak_pss: u64,
    /// The mean of the samples, bytes.
    pub mean_pss: u64,
    /// Processes seen.
    pub processes: usize,
}

#[derive(Debug, Default)]
struct State {
    /// Per node: per pid, the CPU ticks at the window's start (first seen) and last seen.
    ticks: Vec<BTreeMap<u32, (u64, u64)>>,
    /// Per node: PSS sums of the samples.
    pss: Vec<Vec<u64>>,
    /// The machine's busy ticks at the window's start and last seen.
    machine: (u64, u64),
    began: Option<Instant>,
}

/// A sampler running in a thread until dropped.
#[derive(Debug)]
pub struct Sampler {
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    ticks_per_second: f64,
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// `utime + stime` of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: the fields start after the last ')'.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the command.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// `Pss` of `pid`, bytes.
fn pss(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    text.lines()
        .find(|l| l.starts_with("Pss:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

/// The machine's busy CPU ticks (all but idle and iowait).
fn machine_busy() -> u64 {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    values
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| v)
        .sum()
}

fn sample(state: &Mutex<State>, nets: &[PathBuf]) {
    let mut readings = Vec::new();
    for net in nets {
        let pids = pids_in(net);
        let ticks: Vec<(u32, u64)> = pids
            .iter()
            .filter_map(|&p| cpu_ticks(p).map(|t| (p, t)))
            .collect();
        let pss: u64 = pids.iter().filter_map(|&p| pss(p)).sum();
        readings.push((ticks, pss));
    }
    let busy = machine_busy();
    let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
    for (index, (ticks, pss)) in readings.into_iter().enumerate() {
        for (pid, t) in ticks {
            state.ticks[index]
                .entry(pid)
                .and_modify(|seen| seen.1 = t)
                .or_insert((t, t));
        }
        state.pss[index].push(pss);
    }
    state.machine.1 = busy;
}

/// Starts a new window: a process already running counts from its current ticks.
fn reset(state: &Mutex<State>, nodes: usize) {
    let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
    let ticks: Vec<BTreeMap<u32, (u64, u64)>> = (0..nodes)
        .map(|i| {
            state
                .ticks
                .get(i)
                .map(|m| {
                    m.iter()
                        .map(|(p, (_, last))| (*p, (*last, *last)))
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect();
    state.ticks = ticks;
    state.pss = vec![Vec::new(); nodes];
    let busy = machine_busy();
    state.machine = (busy, busy);
    state.began = Some(Instant::now());
}

impl Sampler {
    /// Starts sampling the processes of the network namespaces `nets` (one per node).
    pub fn start(nets: Vec<PathBuf>) -> Sampler {
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        reset(&state, nets.len());
        let thread = {
            let (state, stop) = (Arc::clone(&state), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    sample(&state, &nets);
                    std::thread::sleep(PERIOD);
                }
            })
        };
        Sampler {
            state,
            stop,
            thread: Some(thread),
            ticks_per_second: clock_ticks(),
        }
    }

    /// Starts a new window: what the processes used so far is not counted.
    pub fn reset(&self, nodes: usize) {
        reset(&self.state, nodes);
    }

    /// The window so far: per node, and the machine's busy CPU seconds and the window's length.
    pub fn window(&self) -> (Vec<NodeUsage>, f64, Duration) {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let nodes = state
            .ticks
            .iter()
            .zip(&state.pss)
            .map(|(ticks, pss)| {
                let used: u64 = ticks.values().map(|(first, last)| last - first).sum();
                NodeUsage {
                    cpu_seconds: used as f64 / self.ticks_per_second,
                    peak_pss: pss.iter().copied().max().unwrap_or(0),
                    mean_pss: if pss.is_empty() {
                        0
                    } else {
                        pss.iter().sum::<u64>() / pss.len() as u64
                    },
                    processes: ticks.len(),
                }
            })
            .collect();
        let machine = (state.machine.1 - state.machine.0) as f64 / self.ticks_per_second;
        let length = state.began.map(|b| b.elapsed()).unwrap_or_default();
        (nodes, machine, length)
    }

    /// Prints the window as a table under `title`.
    pub fn print(&self, title: &str, names: &[String]) {
        let (nodes, machine, length) = self.window();
        let seconds = length.as_secs_f64().max(0.001);
        eprintln!("usage, {title} ({seconds:.0} s):");
        eprintln!(
            "  {:<10} {:>8} {:>10} {:>12} {:>12} {:>9}",
            "node", "CPU s", "mean cores", "peak PSS MiB", "mean PSS MiB", "processes"
        );
        for (name, usage) in names.iter().zip(&nodes) {
            eprintln!(
                "  {:<10} {:>8.1} {:>10.2} {:>12.0} {:>12.0} {:>9}",
                name,
                usage.cpu_seconds,
                usage.cpu_seconds / seconds,
                usage.peak_pss as f64 / 1048576.0,
                usage.mean_pss as f64 / 1048576.0,
                usage.processes
            );
        }
        let total: f64 = nodes.iter().map(|n| n.cpu_seconds).sum();
        eprintln!(
            "  all nodes: {total:.1} CPU s ({:.2} cores); the machine: {machine:.1} CPU s ({:.2} cores, everyone's load)",
            total / seconds,
            machine / seconds
        );
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
