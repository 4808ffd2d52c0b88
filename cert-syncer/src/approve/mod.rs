//! `cert-syncer approve-kubelet-csr`: an opt-in approver for the kubelet's client
//! CertificateSigningRequests of the one node it runs on, for the recovery after a long sleep
//! (the enhancement's step 14, otherwise a cluster admin's `kubectl certificate approve`).
//!
//! It approves a CSR only when every rule of [`rules`] holds (signer; the request read as the
//! Go side reads it, [`request`], with exactly this node's subject and no extension; usages;
//! requester and its groups; the kubelet's client certificate on this node's disk expired or
//! absent; created in this recovery's window; one approval per on-disk certificate; no flood);
//! anything else is left alone, never denied, logged once per CSR and reason and counted.
//! Nothing runs unless the subcommand is started, and `--node-name` is required. The threat
//! model is in SECURITY.md ("The kubelet CSR approver").
//!
//! - CSRs are followed with a kube-runtime watcher, field selector
//!   `spec.signerName=kubernetes.io/kube-apiserver-client-kubelet` (a selectable field of CSRs
//!   since 1.18); the signer is checked again on each object.
//! - The CSRs are kept in memory and all decided together on every event and every
//!   `--recheck-interval` (the disk fact changes without any CSR event: the certificate expires
//!   while a CSR waits), since rules 8 and 9 are about all of them.
//! - An approval is an `update` of the `approval` subresource carrying the CSR's
//!   resourceVersion: if anyone acted on it meanwhile, the apiserver refuses (409) and the next
//!   event decides again.

mod disk;
pub mod request;
mod rules;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::Event;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::base::error::ConfigError;
use crate::base::readiness::Readiness;
use crate::kube::sidecar::Sidecar;
pub use disk::KubeletCert;
pub use rules::{BootstrapUser, CLOCK_SKEW, Decision, Policy, REASON, SIGNER};

/// What `approve-kubelet-csr` is asked to do (from [`crate::app::cli::ApproveKubeletCsrArgs`]).
#[derive(Debug, Clone)]
pub struct Settings {
    pub connection: crate::kube::connection::Settings,
    pub policy: Policy,
    /// The kubelet's client certificate (`kubelet-client-current.pem`).
    pub kubelet_client_cert: PathBuf,
    pub recheck_interval: Duration,
    pub metrics_listen: Option<SocketAddr>,
}

/// `cert_syncer_kubelet_csr_decisions_total{result, reason}`: `result` is `approved`,
/// `left-alone` (once per CSR and reason) or `approve-failed`; `reason` says why
/// (`expired`/`absent` for an approval, [`rules::Kind::label`] for a refusal,
/// `conflict`/`error` for a failed approval).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ResultLabels {
    result: &'static str,
    reason: &'static str,
}

/// The approver's metric (its decisions) and the CSR list blocking readiness until listed.
pub(crate) fn register(
    registry: &mut Registry,
    readiness: &Readiness,
) -> Result<Family<ResultLabels, Counter>, ConfigError> {
    let decisions: Family<ResultLabels, Counter> = Family::default();
    registry.register(
        "cert_syncer_kubelet_csr_decisions",
        "Kubelet client CSRs approved, left alone (once per CSR and reason) or whose approval failed, by reason",
        decisions.clone(),
    );
    readiness.block("csrs", "not listed yet");
    Ok(decisions)
}

/// Runs until SIGTERM/SIGINT.
pub(crate) async fn run(
    settings: Settings,
    sidecar: Sidecar,
    decisions: Family<ResultLabels, Counter>,
) -> anyhow::Result<()> {
    let Sidecar {
        connection,
        shutdown,
        readiness,
        ..
    } = sidecar;
    let api: Api<CertificateSigningRequest> = Api::all(connection.client.clone());
    let config = crate::kube::watch::config(connection.watch_timeout_seconds)
        .fields(&format!("spec.signerName={SIGNER}"));
    let stream = kube::runtime::watcher::watcher(api.clone(), config).default_backoff();
    futures::pin_mut!(stream);
    tracing::info!(
        node = %settings.policy.node_name,
        kubelet_client_cert = %settings.kubelet_client_cert.display(),
        bootstrap_users = ?settings.policy.bootstrap_users,
        "approving this node's kubelet client CSRs while its client certificate is expired or absent"
    );
    let mut approver = Approver {
        settings,
        api,
        decisions,
        csrs: BTreeMap::new(),
        logged: HashMap::new(),
        approved: None,
    };
    let mut recheck = tokio::time::interval(approver.settings.recheck_interval);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut listing: Option<BTreeMap<String, CertificateSigningRequest>> = None;
    loop {
        tokio::select! {
            event = stream.next() => match event {
                Some(Ok(Event::Init)) => listing = Some(BTreeMap::new()),
                Some(Ok(Event::InitApply(csr))) => {
                    if let (Some(list), Some(name)) = (listing.as_mut(), csr.metadata.name.clone()) {
                        list.insert(name, csr);
                    }
                }
                Some(Ok(Event::InitDone)) => {
                    approver.csrs = listing.take().unwrap_or_default();
                    approver.logged.retain(|name, _| approver.csrs.contains_key(name));
                    readiness.clear("csrs");
                    approver.decide_all().await;
                }
                Some(Ok(Event::Apply(csr))) => {
                    if let Some(name) = csr.metadata.name.clone() {
                        approver.csrs.insert(name, csr);
                        approver.decide_all().await;
                    }
                }
                Some(Ok(Event::Delete(csr))) => {
                    if let Some(name) = &csr.metadata.name {
                        approver.csrs.remove(name);
                        approver.logged.remove(name);
                    }
                }
                Some(Err(err)) => tracing::warn!(error = %err, "watching CSRs failed; retrying"),
                None => break,
            },
            _ = recheck.tick() => approver.decide_all().await,
            () = shutdown.cancelled() => break,
        }
    }
    Ok(())
}

struct Approver {
    settings: Settings,
    api: Api<CertificateSigningRequest>,
    decisions: Family<ResultLabels, Counter>,
    /// CSRs of the signer, by name, as last seen.
    csrs: BTreeMap<String, CertificateSigningRequest>,
    /// The reason last logged per CSR (a reason is logged once per CSR until it changes).
    logged: HashMap<String, String>,
    /// The last approval: (the on-disk certificate's approval key, the CSR). Rule 8 also reads
    /// it from the CSRs; this copy outlives a CSR that kube-controller-manager's cleaner removes.
    approved: Option<(String, String)>,
}

impl Approver {
    /// Decides about every CSR, with the kubelet's certificate file read afresh (it expires,
    /// or the kubelet writes a new one, with no CSR event).
    async fn decide_all(&mut self) {
        let now = crate::base::time::unix_now();
        let disk = KubeletCert::read(&self.settings.kubelet_client_cert, now);
        let key = disk.approval_key();
        let remembered = match (&self.approved, &key) {
            (Some((approved_key, name)), Some(key)) if approved_key == key => Some(name.clone()),
            _ => None,
        };
        let decisions = rules::decide(
            &self.csrs,
            &self.settings.policy,
            &disk,
            remembered.as_deref(),
            now,
        );
        for (name, decision) in decisions {
            match decision {
                Decision::Leave(refusal) => {
                    if self.logged.get(&name) != Some(&refusal.text) {
                        tracing::info!(csr = %name, reason = %refusal.text, "leaving kubelet client CSR alone");
                        self.count("left-alone", refusal.kind.label());
                        self.logged.insert(name, refusal.text);
                    }
                }
                Decision::Approve(message) => {
                    let approved_for = match &disk {
                        KubeletCert::Absent { .. } => "absent",
                        _ => "expired",
                    };
                    if self.approve(&name, message).await {
                        self.count("approved", approved_for);
                        self.approved = key.clone().map(|key| (key, name));
                    }
                }
            }
        }
    }

    /// Adds the `Approved` condition; whether the apiserver took it.
    async fn approve(&mut self, name: &str, message: String) -> bool {
        let Some(mut approved) = self.csrs.get(name).cloned() else {
            return false;
        };
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let status = approved.status.get_or_insert_with(Default::default);
        status
            .conditions
            .get_or_insert_with(Vec::new)
            .push(CertificateSigningRequestCondition {
                type_: "Approved".to_owned(),
                status: "True".to_owned(),
                reason: Some(REASON.to_owned()),
                message: Some(message.clone()),
                last_update_time: Some(now.clone()),
                last_transition_time: Some(now),
            });
        match self
            .api
            .replace_subresource("approval", name, &PostParams::default(), &approved)
            .await
        {
            Ok(updated) => {
                tracing::info!(csr = name, reason = REASON, message = %message, "approved kubelet client CSR");
                self.csrs.insert(name.to_owned(), updated);
                // Its next event says "already approved": by us, nothing to log.
                self.logged
                    .insert(name.to_owned(), "already approved".to_owned());
                true
            }
            Err(err) => {
                // A conflict (someone acted first) or a refusal: the next event or recheck
                // decides again from the CSR as it then is.
                tracing::warn!(csr = name, error = %err, "approving kubelet client CSR failed");
                let reason = if crate::base::error::is_conflict(&err) {
                    "conflict"
                } else {
                    "error"
                };
                self.count("approve-failed", reason);
                false
            }
        }
    }

    fn count(&self, result: &'static str, reason: &'static str) {
        self.decisions
            .get_or_create(&ResultLabels { result, reason })
            .inc();
    }
}
