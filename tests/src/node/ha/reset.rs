//! Rounds of the same wake (the fault rounds): the slept state kept once, put back before each
//! round, as a power cycle of every node would find it.

use std::path::PathBuf;
use std::time::Duration;

use super::node_files::{copy_contents, empty};
use super::tier::Tier;

impl Tier {
    /// The node paths a recovery changes on disk: the three pods' cert dirs and the kubelet's
    /// certificate directory (what [`Tier::reset`] puts back).
    fn changed_by_recovery(&self) -> [PathBuf; 4] {
        [
            self.plane.certs.clone(),
            self.kcm.certs.clone(),
            self.kcm.scheduler.certs.clone(),
            self.kcm.kubelet_cert_dir.clone(),
        ]
    }

    /// Keeps the slept state (each etcd member's data, the files a recovery changes) in each
    /// node's `pristine/`, for [`Tier::reset`]. The members are stopped for the copy.
    ///
    /// # Panics
    /// When a copy fails or a member does not answer again.
    pub fn save_pristine(&mut self) {
        tokio::task::block_in_place(|| {
            for index in 0..self.nodes.len() {
                self.etcd(index).kill();
            }
            for index in 0..self.nodes.len() {
                let pristine = self.nodes[index].dir.join("pristine");
                std::fs::create_dir_all(pristine.join("etcd-data")).expect("pristine/");
                copy_contents(
                    &self.nodes[index].dir.join("etcd/data"),
                    &pristine.join("etcd-data"),
                );
                for (k, path) in self.changed_by_recovery().iter().enumerate() {
                    let to = pristine.join(k.to_string());
                    std::fs::create_dir_all(&to).expect("pristine/N");
                    copy_contents(&self.host_path(index, path), &to);
                }
            }
            self.restart_etcd();
        });
    }

    fn restart_etcd(&mut self) {
        for index in 0..self.nodes.len() {
            self.etcd(index).restart();
        }
        for index in 0..self.nodes.len() {
            self.etcd(index).wait_healthy(Duration::from_secs(90));
        }
    }

    /// Puts every node back to the slept state [`Tier::save_pristine`] kept, as a power cycle
    /// would find it: the kubelets killed, every container removed, the etcd members
    /// stopped, their data and the files a recovery changes restored, the audit logs emptied,
    /// the members started again. No kubelet runs afterwards ([`Tier::wake`]).
    ///
    /// # Panics
    /// When a step fails.
    pub fn reset(&mut self) {
        tokio::task::block_in_place(|| {
            for node in &mut self.nodes {
                if let Some(kubelet) = node.node.kubelet() {
                    kubelet.kill();
                }
                node.node.containerd.remove_all_containers();
                node.started = None;
            }
            for index in 0..self.nodes.len() {
                self.etcd(index).kill();
            }
            for index in 0..self.nodes.len() {
                let dir = self.nodes[index].dir.clone();
                let data = dir.join("etcd/data");
                std::fs::remove_dir_all(&data).expect("etcd's data");
                std::fs::create_dir_all(&data).expect("etcd's data");
                copy_contents(&dir.join("pristine/etcd-data"), &data);
                for (k, path) in self.changed_by_recovery().iter().enumerate() {
                    let on_disk = self.host_path(index, path);
                    empty(&on_disk);
                    copy_contents(&dir.join("pristine").join(k.to_string()), &on_disk);
                }
                let _ = std::fs::remove_file(self.audit_log(index));
            }
            self.restart_etcd();
        });
    }
}
