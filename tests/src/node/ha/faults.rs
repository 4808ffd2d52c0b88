//! Faults injected into a node of the tier while it recovers: SIGKILL of a container (each of
//! ours: sidecars, restarters, the CSR approver; kube-apiserver), of the kubelet (restarted as systemd's `Restart=always`
//! does, by the timeline's watch), of containerd (started again at once, as systemd would: the
//! shims and containers outlive it and the new one takes them over), and the kube-apiserver
//! cert dir's filesystem full for 10 s (a small tmpfs, [`super::tier::TierOptions`], filled by
//! one file that is removed again).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::tier::Tier;
use crate::node::kcm_plane::{KCM_APPROVER, KCM_POD, KCM_RECOVERY, KCM_RESTARTER, KCM_SYNC};
use crate::node::profile_objects::POD;
use crate::node::scheduler;

/// How long the cert dir stays full.
pub const FULL_FOR: Duration = Duration::from_secs(10);

/// The file that fills the cert dir (no object directory of `sync` is named so).
pub const FILLER: &str = "fill-e2e";

/// One kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL of the running container `container` of pod `pod` (the kubelet restarts it).
    KillContainer {
        /// The static pod's name (without the node suffix).
        pod: &'static str,
        /// The container.
        container: &'static str,
    },
    /// SIGKILL of the kubelet.
    KillKubelet,
    /// SIGKILL of containerd.
    KillContainerd,
    /// The kube-apiserver cert dir's filesystem full for [`FULL_FOR`].
    CertDirFull,
}

impl Fault {
    /// Our containers, in their pods: the sidecars, the restarters, the CSR approver.
    pub const OURS: [Fault; 9] = [
        Fault::KillContainer {
            pod: POD,
            container: "kube-apiserver-cert-syncer",
        },
        Fault::KillContainer {
            pod: POD,
            container: "kube-apiserver-cert-regeneration-controller",
        },
        Fault::KillContainer {
            pod: KCM_POD,
            container: KCM_SYNC,
        },
        Fault::KillContainer {
            pod: KCM_POD,
            container: KCM_RECOVERY,
        },
        Fault::KillContainer {
            pod: scheduler::POD,
            container: scheduler::SYNC,
        },
        Fault::KillContainer {
            pod: scheduler::POD,
            container: scheduler::RECOVERY,
        },
        Fault::KillContainer {
            pod: KCM_POD,
            container: KCM_RESTARTER,
        },
        Fault::KillContainer {
            pod: scheduler::POD,
            container: scheduler::RESTARTER,
        },
        Fault::KillContainer {
            pod: KCM_POD,
            container: KCM_APPROVER,
        },
    ];

    /// kube-apiserver's container.
    pub const KUBE_APISERVER: Fault = Fault::KillContainer {
        pod: POD,
        container: "kube-apiserver",
    };

    /// What it is, in words (the fault table's row).
    pub fn name(self) -> String {
        match self {
            Fault::KillContainer { container, .. } => format!("SIGKILL {container}"),
            Fault::KillKubelet => "SIGKILL kubelet".to_owned(),
            Fault::KillContainerd => "SIGKILL containerd".to_owned(),
            Fault::CertDirFull => format!("cert dir full for {} s", FULL_FOR.as_secs()),
        }
    }
}

/// A fault being injected: done at once, or (the full disk) over [`FULL_FOR`] in a thread.
#[derive(Debug)]
pub struct Injected {
    /// What happened, for the log.
    pub what: String,
    filler: Option<std::thread::JoinHandle<()>>,
}

impl Injected {
    /// Waits until the fault is over (the cert dir emptied of the filler again).
    pub fn finish(mut self) {
        if let Some(filler) = self.filler.take() {
            let _ = filler.join();
        }
    }
}

/// Injects `fault` into node `index` now; `None` while it cannot yet (the container does not
/// run yet: the caller tries again).
pub fn inject(tier: &mut Tier, index: usize, fault: Fault) -> Option<Injected> {
    let node = &mut tier.nodes[index];
    let what = match fault {
        Fault::KillContainer { pod, container } => {
            let id = node.node.running_container(pod, container)?;
            let pid = node.node.containerd.task_pid(&id)?;
            super::namespaces::kill_all(&[pid]);
            format!(
                "SIGKILLed {pod}/{container} (pid {pid}) on {}",
                node.env.name
            )
        }
        Fault::KillKubelet => {
            node.node.kubelet()?.kill();
            format!("SIGKILLed the kubelet of {}", node.env.name)
        }
        Fault::KillContainerd => {
            node.node.containerd.kill();
            let dir = node.node.containerd.dir.clone();
            node.node.containerd =
                tokio::task::block_in_place(|| crate::node::Containerd::start_in(&dir, &node.env));
            format!("SIGKILLed containerd of {} (started again)", node.env.name)
        }
        Fault::CertDirFull => {
            let dir = tier.host_path(index, &tier.plane.certs);
            let filler = dir.join(FILLER);
            let thread = std::thread::spawn(move || fill_for(&filler, FULL_FOR));
            return Some(Injected {
                what: format!("filled {} for {} s", dir.display(), FULL_FOR.as_secs()),
                filler: Some(thread),
            });
        }
    };
    Some(Injected { what, filler: None })
}

/// Writes `file` until its filesystem is full, keeps it for `duration`, removes it.
fn fill_for(file: &PathBuf, duration: Duration) {
    let began = Instant::now();
    if let Ok(mut out) = std::fs::File::create(file) {
        let block = vec![0u8; 64 * 1024];
        while out.write_all(&block).is_ok() {}
        let _ = out.sync_all();
    }
    std::thread::sleep(duration.saturating_sub(began.elapsed()));
    let _ = std::fs::remove_file(file);
}
