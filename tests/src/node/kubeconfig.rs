//! The kubeconfig files of the node tier (the kubelet's, kubectl's).

use std::collections::BTreeMap;
use std::path::Path;

/// A kubeconfig: `server`, SNI `server_name`, CA file `ca`, and a token or a client pair.
pub fn kubeconfig(
    server: &str,
    server_name: Option<&str>,
    ca: &Path,
    user: &BTreeMap<&str, String>,
) -> String {
    let sni = server_name
        .map(|n| format!("    tls-server-name: {n}\n"))
        .unwrap_or_default();
    let user: String = user
        .iter()
        .map(|(k, v)| format!("    {k}: {v}\n"))
        .collect();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n{sni}    \
         certificate-authority: {}\nusers:\n- name: u\n  user:\n{user}contexts:\n- name: x\n  \
         context: {{cluster: c, user: u}}\ncurrent-context: x\n",
        ca.display()
    )
}
