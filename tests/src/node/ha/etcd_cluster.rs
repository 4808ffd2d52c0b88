//! The three-member etcd of the three-node tier: one member per node, in the node's network
//! namespace, serving clients over TLS on the node's loopback (the pod's
//! `--etcd-servers=https://localhost:2379` is its own node's member) and its address, and its
//! peers over TLS with peer certificates (server and client auth, `--peer-client-cert-auth`).
//! One signer for the whole cluster: the `etcd-serving-ca` every node's resource dir holds, and
//! the one `etcd-client` every kube-apiserver presents.

use std::path::Path;
use std::time::Duration;

use crate::node::env::NodeEnv;
use crate::node::etcd::{Etcd, EtcdPki, Member};

/// Every member's `--initial-cluster`, from the nodes' names and addresses.
pub fn initial_cluster(envs: &[NodeEnv]) -> String {
    envs.iter()
        .map(|env| {
            format!(
                "{}=https://{}:{}",
                env.name,
                env.address,
                crate::node::ports::ETCD_PEER_PORT
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The member of node `env`, in `dir`.
pub fn member(env: &NodeEnv, envs: &[NodeEnv]) -> Member {
    Member {
        name: env.name.clone(),
        ip: env.address,
        initial_cluster: initial_cluster(envs),
        env: env.clone(),
    }
}

/// Starts one member per node (`dir_of(index)` its directory), then waits until each answers
/// `/health` (a quorum formed).
///
/// # Panics
/// When a member does not answer within 90 s.
pub fn start(
    envs: &[NodeEnv],
    dir_of: impl Fn(usize) -> std::path::PathBuf,
) -> (EtcdPki, Vec<Etcd>) {
    let pki = EtcdPki::new();
    let mut members: Vec<Etcd> = envs
        .iter()
        .enumerate()
        .map(|(index, env)| Etcd::spawn_member(&dir_of(index), &pki, &member(env, envs)))
        .collect();
    for etcd in &mut members {
        etcd.wait_healthy(Duration::from_secs(90));
    }
    (pki, members)
}

/// The members the cluster lists (`/v3/cluster/member/list` of etcd's gRPC gateway through
/// `etcd`), by name; an error when it cannot answer.
///
/// # Errors
/// When the member cannot be reached or answers otherwise than 200.
pub fn member_names(etcd: &Etcd) -> Result<Vec<String>, String> {
    let config = crate::tls::client_config_with_cert(
        &etcd.serving_ca,
        &etcd.client.cert_pem,
        &etcd.client.key_pem,
    );
    let addr = etcd
        .url()
        .trim_start_matches("https://")
        .parse()
        .map_err(|err| format!("{}: {err}", etcd.url()))?;
    let (status, body) =
        crate::envtest::blocking_post(addr, "localhost", config, "/v3/cluster/member/list", "{}")
            .map_err(|err| format!("member list: {err}"))?;
    if status != 200 {
        return Err(format!("member list: {status} {body}"));
    }
    let parsed: serde_json::Value =
        serde_json::from_str(&body).map_err(|err| format!("member list: {err}: {body}"))?;
    Ok(parsed["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["name"].as_str().map(str::to_owned))
        .collect())
}

/// Whether `dir` holds a member's data (it ran once).
pub fn has_data(dir: &Path) -> bool {
    dir.join("data/member").is_dir()
}
