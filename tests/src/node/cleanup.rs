//! What a kubelet and containerd leave on the machine after they stopped: bind mounts under the
//! kubelet's root dir, a `shm` mount per sandbox under containerd's state dir, and the pods' log
//! directories under `/var/log/pods` (machine-wide, whatever `--root-dir` is).

use std::path::Path;
use std::process::Command;

/// The mount points at or under `dir`, deepest first (from `/proc/self/mountinfo`; octal
/// escapes such as `\040` decoded).
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mounts_under_in(&text, dir)
}

/// [`mounts_under`] in the mount table `mountinfo` (the text of a `/proc/PID/mountinfo`: another
/// process's mount namespace).
pub fn mounts_under_in(mountinfo: &str, dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    let mut mounts: Vec<String> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape)
        .filter(|point| {
            point == &prefix || point.starts_with(&format!("{}/", prefix.trim_end_matches('/')))
        })
        .collect();
    // Deepest first: a longer path under the same prefix is never the parent of a shorter one.
    mounts.sort_by_key(|m| std::cmp::Reverse(m.matches('/').count()));
    mounts.dedup();
    mounts
}

/// Unmounts every mount at or under `dir`, deepest first (lazily when one is busy); returns the
/// ones that stayed.
pub fn unmount_under(dir: &Path) -> Vec<String> {
    for point in mounts_under(dir) {
        let done = Command::new("umount").arg(&point).status();
        if !matches!(done, Ok(s) if s.success()) {
            let _ = Command::new("umount").args(["-l", &point]).status();
        }
    }
    mounts_under(dir)
}

/// Removes the log directories of the static pods of node `node` (`/var/log/pods/NS_POD-NODE_UID`)
/// and their links in `/var/log/containers` (`POD-NODE_NS_CONTAINER-ID.log`).
pub fn remove_pod_logs(node: &str) {
    let pods_marker = format!("-{node}_");
    for (dir, is_ours) in [
        ("/var/log/pods", pods_marker.clone()),
        ("/var/log/containers", pods_marker),
    ] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            if entry.file_name().to_string_lossy().contains(&is_ours) {
                let path = entry.path();
                let _ = if path.is_symlink() || path.is_file() {
                    std::fs::remove_file(&path)
                } else {
                    std::fs::remove_dir_all(&path)
                };
            }
        }
    }
}

fn unescape(field: &str) -> String {
    let mut out = String::new();
    let mut chars = field.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            match u8::from_str_radix(&code, 8) {
                Ok(byte) => out.push(char::from(byte)),
                Err(_) => {
                    out.push('\\');
                    out.push_str(&code);
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
