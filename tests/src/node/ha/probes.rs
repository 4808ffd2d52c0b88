//! What the test looks at on each node while the tier wakes: each a single look that answers
//! yes or no (the [`super::timeline`] repeats them), bounded in time (a powered-off node's
//! address swallows connections).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Node as KubeNode, Pod};
use kube::api::{Api, ListParams, PostParams};

use super::tier::Tier;
use crate::node::profile_objects::{KS, OP, POD};
use crate::node::scenario::{first_der, not_after, now};

/// How long one look may take.
const LOOK: Duration = Duration::from_secs(5);

/// The CSR signer of kubelet client certificates.
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";

/// The reason our approver gives (`approve-kubelet-csr`; kube-controller-manager's own says
/// `AutoApproved`).
pub const APPROVED_BY_OURS: &str = "AutoApprovedExpiredNodeClientCert";

/// A TLS handshake with `addr` for `name` verified with `ca_pem`, within 5 s.
pub async fn verified(addr: SocketAddr, name: &str, ca_pem: &str) -> bool {
    if !ca_pem.contains("BEGIN CERTIFICATE") {
        return false;
    }
    matches!(
        tokio::time::timeout(LOOK, crate::tls::handshake_leaf(addr, name, ca_pem)).await,
        Ok(Ok(_))
    )
}

/// The subject CN of the CSR's request (`system:node:NAME` for a kubelet's).
pub fn requested_cn(csr: &CertificateSigningRequest) -> Option<String> {
    let pem = String::from_utf8(csr.spec.request.0.clone()).ok()?;
    let der = rustls_pki_types::pem::PemObject::from_pem_slice(pem.as_bytes())
        .ok()
        .map(|d: rustls_pki_types::CertificateSigningRequestDer<'_>| d.as_ref().to_vec())?;
    use x509_parser::prelude::FromDer;
    let (_, request) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&der).ok()?;
    let cn = request
        .certification_request_info
        .subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_owned();
    Some(cn)
}

/// Whether `csr` carries the `Approved` condition with `reason`.
pub fn approved_with(csr: &CertificateSigningRequest, reason: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conds| {
            conds
                .iter()
                .any(|c| c.type_ == "Approved" && c.reason.as_deref() == Some(reason))
        })
}

impl Tier {
    /// Node `index`'s kube-apiserver answers `localhost-recovery` (verified with the recovery
    /// CA).
    pub async fn answers_recovery(&self, index: usize) -> bool {
        verified(
            self.apiserver(index),
            "localhost-recovery",
            &self.plane.recovery_ca,
        )
        .await
    }

    /// Node `index`'s kube-apiserver serves `localhost` with a certificate a client trusting
    /// only the current `localhost-serving-ca` (read through `client`) verifies.
    pub async fn serves_valid_localhost(&self, index: usize, client: &kube::Client) -> bool {
        let bundles: Api<ConfigMap> = Api::namespaced(client.clone(), OP);
        let Ok(Ok(bundle)) = tokio::time::timeout(LOOK, bundles.get("localhost-serving-ca")).await
        else {
            return false;
        };
        let pem = bundle
            .data
            .and_then(|mut d| d.remove("ca-bundle.crt"))
            .unwrap_or_default();
        verified(self.apiserver(index), "localhost", &pem).await
    }

    /// The kubelet client CSRs of node `index` (`system:node:NAME` requested).
    pub async fn node_csrs(
        &self,
        index: usize,
        client: &kube::Client,
    ) -> Vec<CertificateSigningRequest> {
        let cn = format!("system:node:{}", self.nodes[index].env.name);
        let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
        match tokio::time::timeout(LOOK, csrs.list(&ListParams::default())).await {
            Ok(Ok(list)) => list
                .items
                .into_iter()
                .filter(|c| c.spec.signer_name == KUBELET_CLIENT_SIGNER)
                .filter(|c| requested_cn(c).as_deref() == Some(cn.as_str()))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Node `index`'s kubelet client certificate on its disk (`kubelet-client-current.pem`,
    /// links followed as the node resolves them) is valid now.
    pub fn kubelet_cert_valid(&self, index: usize) -> bool {
        self.read(index, &self.kcm.kubelet_client_cert())
            .is_ok_and(|pem| pem.contains("BEGIN CERTIFICATE") && not_after(&pem) > now())
    }

    /// The DER of node `index`'s kubelet client certificate on its disk.
    pub fn kubelet_cert_der(&self, index: usize) -> Option<Vec<u8>> {
        self.read(index, &self.kcm.kubelet_client_cert())
            .ok()
            .filter(|pem| pem.contains("BEGIN CERTIFICATE"))
            .map(|pem| first_der(&pem))
    }

    /// Node `index` is `Ready` in the API.
    pub async fn node_ready(&self, index: usize, client: &kube::Client) -> bool {
        let nodes: Api<KubeNode> = Api::all(client.clone());
        let name = &self.nodes[index].env.name;
        matches!(tokio::time::timeout(LOOK, nodes.get_opt(name)).await, Ok(Ok(Some(n))) if crate::node::scenario::is_ready(&n))
    }

    /// A pod for node `index` bound to it by the scheduler (the pod `after-the-sleep-NAME` is
    /// created as soon as the API admits it: its namespace's `default` service account comes
    /// from kube-controller-manager).
    pub async fn pod_bound(&self, index: usize, client: &kube::Client) -> bool {
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let node = &self.nodes[index].env.name;
        let name = format!("after-the-sleep-{node}");
        match tokio::time::timeout(LOOK, pods.get_opt(&name)).await {
            Ok(Ok(None)) => {
                let _ = tokio::time::timeout(
                    LOOK,
                    pods.create(
                        &PostParams::default(),
                        &crate::node::pod::workload(&name, Some(node)),
                    ),
                )
                .await;
                false
            }
            Ok(Ok(Some(pod))) => {
                pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str())
            }
            _ => false,
        }
    }

    /// The file `relative` of node `index`'s kube-apiserver cert dir holds a valid
    /// certificate.
    pub fn synced_valid(&self, index: usize, certs: &Path, relative: &str) -> bool {
        self.read(index, &certs.join(relative))
            .is_ok_and(|pem| pem.contains("BEGIN CERTIFICATE") && not_after(&pem) > now())
    }

    /// The mirror pod of the kube-apiserver of node `index` is in the API.
    pub async fn mirror_pod(&self, index: usize, client: &kube::Client) -> bool {
        let pods: Api<Pod> = Api::namespaced(client.clone(), KS);
        let name = format!("{POD}-{}", self.nodes[index].env.name);
        matches!(
            tokio::time::timeout(LOOK, pods.get_opt(&name)).await,
            Ok(Ok(Some(_)))
        )
    }
}
