//! A container's CPU and memory, read from its own cgroup: found from its task's pid
//! (`/proc/PID/cgroup`, containerd's and the kubelet's layout need not be known) and the
//! machine's cgroup mounts (`/proc/self/mountinfo`).
//!
//! cgroup v2: `cpu.stat` `usage_usec`, `memory.current`, `memory.peak`, `memory.stat` `anon`.
//! cgroup v1 (this kind of machine, the 1.20 kubelet with `cgroupfs`): `cpuacct.usage` (ns),
//! `memory.usage_in_bytes`, `memory.max_usage_in_bytes` (the v1 peak, resettable by writing 0),
//! `memory.stat` `rss`. [`Sampler`] samples the memory of several containers every
//! [`SAMPLE_EVERY`] for the mean and the sampled maximum.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often [`Sampler`] reads memory.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// The cgroup of one container.
#[derive(Debug, Clone)]
pub struct ContainerCgroup {
    /// cgroup v2 (unified), else v1.
    pub v2: bool,
    /// The directory holding the CPU accounting (v2: the cgroup; v1: its `cpuacct` directory).
    pub cpu_dir: PathBuf,
    /// The directory holding the memory accounting.
    pub memory_dir: PathBuf,
}

/// A cgroup mount: its root inside the hierarchy, where it is mounted, and its type and
/// controllers.
struct Mount {
    root: String,
    point: PathBuf,
    v2: bool,
    controllers: Vec<String>,
}

fn mounts() -> Vec<Mount> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fields: Vec<&str> = left.split(' ').collect();
            let theirs: Vec<&str> = right.split(' ').collect();
            let fstype = *theirs.first()?;
            if fstype != "cgroup" && fstype != "cgroup2" {
                return None;
            }
            Some(Mount {
                root: fields.get(3)?.to_string(),
                point: PathBuf::from(fields.get(4)?),
                v2: fstype == "cgroup2",
                controllers: theirs
                    .get(2)
                    .map(|o| o.split(',').map(str::to_owned).collect())
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// `path` (as `/proc/PID/cgroup` names it) under `mount`.
fn under(mount: &Mount, path: &str) -> PathBuf {
    let rest = if mount.root == "/" {
        path
    } else {
        path.strip_prefix(mount.root.as_str()).unwrap_or(path)
    };
    mount.point.join(rest.trim_start_matches('/'))
}

impl ContainerCgroup {
    /// The cgroup of process `pid` (a container's task).
    ///
    /// # Errors
    /// When its cgroup or the accounting files cannot be found (named).
    pub fn of_pid(pid: u32) -> Result<ContainerCgroup, String> {
        let file = format!("/proc/{pid}/cgroup");
        let text = std::fs::read_to_string(&file).map_err(|err| format!("{file}: {err}"))?;
        let entries: Vec<(String, String)> = text
            .lines()
            .filter_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                Some((controllers.to_owned(), path.to_owned()))
            })
            .collect();
        let mounts = mounts();
        let v1 = |controller: &str| -> Option<PathBuf> {
            let (_, path) = entries
                .iter()
                .find(|(c, _)| c.split(',').any(|c| c == controller))?;
            let mount = mounts
                .iter()
                .find(|m| !m.v2 && m.controllers.iter().any(|c| c == controller))?;
            Some(under(mount, path))
        };
        if let (Some(cpu_dir), Some(memory_dir)) = (v1("cpuacct"), v1("memory"))
            && cpu_dir.join("cpuacct.usage").is_file()
            && memory_dir.join("memory.usage_in_bytes").is_file()
        {
            return Ok(ContainerCgroup {
                v2: false,
                cpu_dir,
                memory_dir,
            });
        }
        let unified = entries
            .iter()
            .find(|(c, _)| c.is_empty())
            .map(|(_, p)| p.clone());
        if let Some(path) = unified
            && let Some(mount) = mounts.iter().find(|m| m.v2)
        {
            let dir = under(mount, &path);
            if dir.join("cpu.stat").is_file() && dir.join("memory.current").is_file() {
                return Ok(ContainerCgroup {
                    v2: true,
                    cpu_dir: dir.clone(),
                    memory_dir: dir,
                });
            }
        }
        Err(format!(
            "no cgroup accounting for pid {pid} ({file}: {})",
            text.trim().replace('\n', "; ")
        ))
    }

    /// CPU time used by the container since its cgroup was made, in µs.
    pub fn cpu_usec(&self) -> Option<u64> {
        if self.v2 {
            stat_field(&self.cpu_dir.join("cpu.stat"), "usage_usec")
        } else {
            read_u64(&self.cpu_dir.join("cpuacct.usage")).map(|ns| ns / 1_000)
        }
    }

    /// Memory charged to the container now, in bytes.
    pub fn memory_current(&self) -> Option<u64> {
        read_u64(&self.memory_dir.join(if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        }))
    }

    /// Its anonymous memory now (heap and stacks: no page cache), in bytes.
    pub fn memory_anon(&self) -> Option<u64> {
        stat_field(
            &self.memory_dir.join("memory.stat"),
            if self.v2 { "anon" } else { "rss" },
        )
    }

    /// The kernel's peak of [`ContainerCgroup::memory_current`] since the cgroup was made or
    /// the peak was reset, if this kernel keeps one.
    pub fn memory_peak(&self) -> Option<u64> {
        read_u64(&self.memory_dir.join(if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        }))
    }

    /// Resets the kernel's peak (v1: writes 0 to `memory.max_usage_in_bytes`); false where it
    /// cannot (v2's reset is per open file, not kept between reads).
    pub fn reset_memory_peak(&self) -> bool {
        !self.v2 && std::fs::write(self.memory_dir.join("memory.max_usage_in_bytes"), "0").is_ok()
    }
}

fn read_u64(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn stat_field(path: &Path, name: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Memory samples of one container over a window.
#[derive(Debug, Clone, Default)]
pub struct MemorySamples {
    /// How many samples.
    pub count: u64,
    /// The largest [`ContainerCgroup::memory_current`] sampled.
    pub max_current: u64,
    /// Their sum (for the mean).
    pub sum_current: u64,
    /// The largest [`ContainerCgroup::memory_anon`] sampled.
    pub max_anon: u64,
    /// Their sum.
    pub sum_anon: u64,
}

impl MemorySamples {
    /// The mean of the sampled current memory, in bytes.
    pub fn mean_current(&self) -> u64 {
        self.sum_current.checked_div(self.count).unwrap_or(0)
    }

    /// The mean of the sampled anonymous memory, in bytes.
    pub fn mean_anon(&self) -> u64 {
        self.sum_anon.checked_div(self.count).unwrap_or(0)
    }
}

type Samples = BTreeMap<String, (ContainerCgroup, MemorySamples)>;

/// Samples the memory of every container [`Sampler::add`]ed, every [`SAMPLE_EVERY`], on a
/// thread of its own, until dropped.
pub struct Sampler {
    samples: Arc<Mutex<Samples>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler").finish_non_exhaustive()
    }
}

impl Default for Sampler {
    fn default() -> Self {
        Self::start()
    }
}

impl Sampler {
    /// Starts the sampling thread (with nothing to sample yet).
    pub fn start() -> Sampler {
        let samples = Arc::new(Mutex::new(Samples::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (samples, stop) = (samples.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for (cgroup, window) in samples.lock().unwrap().values_mut() {
                        if let (Some(current), Some(anon)) =
                            (cgroup.memory_current(), cgroup.memory_anon())
                        {
                            window.count += 1;
                            window.max_current = window.max_current.max(current);
                            window.sum_current += current;
                            window.max_anon = window.max_anon.max(anon);
                            window.sum_anon += anon;
                        }
                    }
                    std::thread::sleep(SAMPLE_EVERY);
                }
            })
        };
        Sampler {
            samples,
            stop,
            thread: Some(thread),
        }
    }

    /// Samples `cgroup` as `name` from now on.
    pub fn add(&self, name: &str, cgroup: ContainerCgroup) {
        self.samples
            .lock()
            .unwrap()
            .insert(name.to_owned(), (cgroup, MemorySamples::default()));
    }

    /// Whether `name` is sampled.
    pub fn has(&self, name: &str) -> bool {
        self.samples.lock().unwrap().contains_key(name)
    }

    /// The samples of the window that ends now, per name; the next window starts empty.
    pub fn take_window(&self) -> BTreeMap<String, MemorySamples> {
        self.samples
            .lock()
            .unwrap()
            .iter_mut()
            .map(|(name, (_, window))| (name.clone(), std::mem::take(window)))
            .collect()
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
