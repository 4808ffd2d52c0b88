//! With `--leader-elect`, the Lease: taken before the first pass, held while the controller
//! runs (losing it ends the process: the kubelet restarts it as a candidate, as client-go's
//! leader election does), released on shutdown so a standby takes over at once; and where the
//! brake's record is kept (`brake::lease`). Without, a leadership that is never lost.

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::Settings;
use super::brake::lease::LeaseRecord;
use crate::base::readiness::Readiness;
use crate::kube::leader::{self, Elector};

/// Cancelled when the Lease is lost, and why; the task holding it; where the brake's record is
/// kept.
pub(super) struct Leadership {
    pub(super) lost: CancellationToken,
    lost_reason: Arc<Mutex<String>>,
    holder: Option<tokio::task::JoinHandle<()>>,
    pub(super) record: Option<LeaseRecord>,
}

impl Leadership {
    /// Waits for the Lease and keeps it held; `None` on shutdown while waiting.
    pub(super) async fn take(
        args: &Settings,
        client: &kube::Client,
        shutdown: &CancellationToken,
        readiness: &Readiness,
    ) -> Option<Self> {
        let lost = CancellationToken::new();
        let lost_reason = Arc::new(Mutex::new(String::new()));
        if !args.leader_elect {
            return Some(Self {
                lost,
                lost_reason,
                holder: None,
                record: None,
            });
        }
        let identity = identity(args.pod_name.as_deref());
        let record = LeaseRecord::new(
            client.clone(),
            args.lease_namespace(),
            &args.leader_elect_lease_name,
            &identity,
        );
        let mut elector = Elector::new(
            client.clone(),
            args.lease_namespace(),
            &args.leader_elect_lease_name,
            identity,
            leader::Timing {
                lease_duration: args.leader_elect_lease_duration,
                renew_deadline: args.leader_elect_renew_deadline,
                retry_period: args.leader_elect_retry_period,
            },
        )
        .with_readiness(readiness.clone());
        if !elector.acquire(shutdown).await {
            return None;
        }
        readiness.block(
            "pass",
            "no pass completed yet since this replica became leader",
        );
        let (shutdown, cancel, reason) = (shutdown.clone(), lost.clone(), Arc::clone(&lost_reason));
        let holder = tokio::spawn(async move {
            match elector.hold(&shutdown).await {
                Some(why) => {
                    *reason.lock().unwrap_or_else(|p| p.into_inner()) = why;
                    cancel.cancel();
                }
                None => elector.release().await,
            }
        });
        Some(Self {
            lost,
            lost_reason,
            holder: Some(holder),
            record: Some(record),
        })
    }

    /// The error that ends the process once the Lease is lost (`during`: where it was noticed).
    pub(super) fn lost_error(&self, during: &str) -> anyhow::Error {
        let reason = self
            .lost_reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        anyhow::anyhow!(
            "lost leadership{during}: {reason}; exiting so the kubelet restarts us as a candidate"
        )
    }

    /// On shutdown: waits for the holder to release the Lease, so a standby takes over at once.
    pub(super) async fn release(self) {
        if let Some(holder) = self.holder {
            let _ = holder.await;
        }
    }
}

/// This replica's name in the Lease: the pod name, else the host name and the process id.
fn identity(pod_name: Option<&str>) -> String {
    pod_name.map(str::to_owned).unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "unknown-host".to_owned());
        format!("{host}_{}", std::process::id())
    })
}
