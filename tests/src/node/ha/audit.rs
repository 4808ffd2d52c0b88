//! Who wrote what, per node: each node's kube-apiserver keeps an audit log (as OpenShift's do,
//! `/var/log/kube-apiserver/audit.log`), and every node's sidecars talk only to their own
//! node's kube-apiserver, so the log a write is in names the node whose controller made it.
//!
//! The policy records writes (create, update, patch, delete) of Secrets, ConfigMaps, the
//! control plane's Leases and CSRs (with the approval subresource) at `Metadata` level: who,
//! which object, the answer, never a body (no key bytes in any log); the control plane's
//! ConfigMaps (the CA bundles) with their request body, to tell what each write of a bundle
//! changed. That is the pod's one
//! addition in the three-node tier ([`instrument`]): the flags, a `hostPath` for the log, the
//! policy in the resource dir.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::{HostPathVolumeSource, Pod, Volume, VolumeMount};

/// The audit policy (in the kube-apiserver pod's resource dir as `audit-policy.yaml`).
pub const POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Request
    verbs: [create, update]
    namespaces: [openshift-config-managed, openshift-kube-apiserver, openshift-kube-apiserver-operator, openshift-kube-controller-manager, openshift-kube-controller-manager-operator, openshift-kube-scheduler]
    resources:
      - group: \"\"
        resources: [configmaps]
  - level: Metadata
    verbs: [create, update, patch, delete]
    resources:
      - group: \"\"
        resources: [secrets, configmaps]
      - group: certificates.k8s.io
        resources: [certificatesigningrequests, certificatesigningrequests/approval]
  - level: Metadata
    verbs: [create, update, patch, delete]
    namespaces: [openshift-kube-apiserver, openshift-kube-controller-manager, openshift-kube-scheduler, kube-system]
    resources:
      - group: coordination.k8s.io
        resources: [leases]
  - level: None
";

/// The policy's file name in the resource dir.
pub const POLICY_FILE: &str = "audit-policy.yaml";

/// The log's directory on the node (OpenShift's).
pub const LOG_DIR: &str = "/var/log/kube-apiserver";

/// The kube-apiserver pod with its audit log: `--audit-policy-file` (the resource dir's
/// [`POLICY_FILE`]), `--audit-log-path` under [`LOG_DIR`] (a `hostPath`, blocking mode: each
/// event is on disk before the request is answered).
pub fn instrument(mut pod: Pod) -> Pod {
    let spec = pod.spec.as_mut().expect("a pod spec");
    spec.volumes.get_or_insert_with(Vec::new).push(Volume {
        name: "audit-dir".to_owned(),
        host_path: Some(HostPathVolumeSource {
            path: LOG_DIR.to_owned(),
            type_: Some("DirectoryOrCreate".to_owned()),
        }),
        ..Volume::default()
    });
    let server = spec
        .containers
        .iter_mut()
        .find(|c| c.name == crate::manifests::SERVER_CONTAINER)
        .expect("the kube-apiserver container");
    server.args.get_or_insert_with(Vec::new).extend([
        format!("--audit-policy-file=/etc/kubernetes/static-pod-resources/{POLICY_FILE}"),
        format!("--audit-log-path={LOG_DIR}/audit.log"),
        "--audit-log-mode=blocking".to_owned(),
        "--audit-log-maxsize=0".to_owned(),
    ]);
    server
        .volume_mounts
        .get_or_insert_with(Vec::new)
        .push(VolumeMount {
            name: "audit-dir".to_owned(),
            mount_path: LOG_DIR.to_owned(),
            ..VolumeMount::default()
        });
    pod
}

/// One write as a node's kube-apiserver answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The node whose kube-apiserver (whose log) it went through.
    pub node: usize,
    /// The user (`system:serviceaccount:NS:NAME`, `system:node:NAME`, ...).
    pub user: String,
    /// `create`, `update`, `patch`, `delete`.
    pub verb: String,
    /// `secrets`, `configmaps`, `leases`, `certificatesigningrequests`.
    pub resource: String,
    /// `approval` for a CSR's approval, else empty.
    pub subresource: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    /// The object.
    pub name: String,
    /// The HTTP answer.
    pub code: u16,
    /// When it was answered (`stageTimestamp`, RFC 3339).
    pub at: String,
    /// The `ca-bundle.crt` a ConfigMap write carried (its request body is logged).
    pub ca_bundle: Option<String>,
}

impl Write {
    /// Whether the API accepted it (2xx).
    pub fn succeeded(&self) -> bool {
        (200..300).contains(&self.code)
    }

    /// `resource/namespace/name`.
    pub fn object(&self) -> String {
        format!("{}/{}/{}", self.resource, self.namespace, self.name)
    }
}

/// The writes in node `node`'s audit log at `path` (absent: none), in the log's order.
///
/// # Panics
/// On a line that is not an audit event (a torn line at the end is skipped: the log may be
/// read while written).
pub fn writes(path: &Path, node: usize) -> Vec<Write> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut out = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let event: serde_json::Value = match serde_json::from_str(line) {
            Ok(event) => event,
            Err(_) if index + 1 == lines.len() && !text.ends_with('\n') => break,
            Err(err) => panic!("{}: not an audit event: {err}", path.display()),
        };
        let field = |pointer: &str| {
            event
                .pointer(pointer)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_owned()
        };
        out.push(Write {
            node,
            user: field("/user/username"),
            verb: field("/verb"),
            resource: field("/objectRef/resource"),
            subresource: field("/objectRef/subresource"),
            namespace: field("/objectRef/namespace"),
            name: field("/objectRef/name"),
            code: event
                .pointer("/responseStatus/code")
                .and_then(serde_json::Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(0),
            at: field("/stageTimestamp"),
            ca_bundle: event
                .pointer("/requestObject/data/ca-bundle.crt")
                .and_then(|v| v.as_str())
                .map(str::to_owned),
        });
    }
    out
}

/// Successful writes grouped by object (`resource/namespace/name`).
pub fn by_object<'a>(
    writes: impl IntoIterator<Item = &'a Write>,
) -> BTreeMap<String, Vec<&'a Write>> {
    let mut grouped: BTreeMap<String, Vec<&Write>> = BTreeMap::new();
    for write in writes.into_iter().filter(|w| w.succeeded()) {
        grouped.entry(write.object()).or_default().push(write);
    }
    grouped
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two events as kube-apiserver v1.20.2 writes them (`Metadata` and `Request` level), the
    /// second torn as a log being written may be.
    const LOG: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"1","stage":"ResponseComplete","requestURI":"/apis/certificates.k8s.io/v1/certificatesigningrequests/csr-x/approval","verb":"update","user":{"username":"system:serviceaccount:openshift-kube-apiserver:kubelet-csr-approver"},"objectRef":{"resource":"certificatesigningrequests","name":"csr-x","apiGroup":"certificates.k8s.io","apiVersion":"v1","subresource":"approval"},"responseStatus":{"metadata":{},"code":200},"stageTimestamp":"2026-11-28T07:00:00.000001Z"}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Request","auditID":"2","stage":"ResponseComplete","verb":"update","user":{"username":"u"},"objectRef":{"resource":"configmaps","namespace":"ns","name":"b"},"responseStatus":{"code":409},"requestObject":{"data":{"ca-bundle.crt":"PEM"}}}
{"kind":"Event","apiVer"#;

    #[test]
    fn writes_are_read_from_the_log_with_their_subresource_answer_and_bundle() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        std::fs::write(&path, LOG).unwrap();
        let writes = writes(&path, 2);
        assert_eq!(writes.len(), 2, "the torn last line is skipped");
        assert_eq!(writes[0].subresource, "approval");
        assert_eq!(writes[0].object(), "certificatesigningrequests//csr-x");
        assert!(writes[0].succeeded() && !writes[1].succeeded());
        assert_eq!(writes[1].ca_bundle.as_deref(), Some("PEM"));
        assert_eq!(writes[1].node, 2);
        assert!(by_object(&writes).contains_key("certificatesigningrequests//csr-x"));
        assert!(!by_object(&writes).contains_key("configmaps/ns/b"));
    }

    #[test]
    fn the_pod_gets_the_flags_and_the_log_volume() {
        let pod = instrument(crate::node::pod::render_pod());
        let server = crate::manifests::container(&pod, crate::manifests::SERVER_CONTAINER);
        let args = server.args.clone().unwrap_or_default();
        assert!(
            args.iter()
                .any(|a| a.starts_with("--audit-log-path=/var/log/kube-apiserver/"))
        );
        assert!(
            server
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path == LOG_DIR)
        );
        assert!(
            POLICY.contains("level: None"),
            "everything else is not logged"
        );
    }
}
