//! The writes of a wake, read from the nodes' audit logs ([`super::audit`]), judged:
//! - **duplicate regeneration**: a certificate Secret of a profile written more than once, or a
//!   CA bundle written twice with the same CAs (a write that changed nothing, or a flap back);
//! - **fight**: one object written through two nodes' kube-apiservers (two nodes' controllers
//!   acting on it), or a write of a profile object refused with 409 (two writers raced);
//! - **wrong approval**: a CSR approved through a node's kube-apiserver (by that node's
//!   approver) for another node's kubelet, or approved twice.

use std::collections::{BTreeMap, BTreeSet};

use cert_syncer::kind::Kind;

use super::audit::Write;
use super::invariants::{certificates, rotations};

/// `resource/namespace/name` of every object the profiles write.
pub fn profile_objects() -> BTreeSet<String> {
    rotations()
        .iter()
        .flat_map(|(_, rotation)| {
            rotation
                .written()
                .map(|(kind, object)| {
                    let resource = match kind {
                        Kind::Secret => "secrets",
                        Kind::ConfigMap => "configmaps",
                    };
                    format!("{resource}/{}/{}", object.namespace, object.name)
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The writes of the profiles' objects.
#[derive(Debug, Clone, Default)]
pub struct WriteReport {
    /// Successful writes, by object (`resource/namespace/name`), in log order per node.
    pub per_object: BTreeMap<String, Vec<Write>>,
    /// Writes of those objects refused with 409 Conflict.
    pub conflicts: Vec<Write>,
}

impl WriteReport {
    /// The report of `writes` (every node's), for the profiles' objects.
    pub fn of(writes: &[Write]) -> WriteReport {
        let objects = profile_objects();
        let mut report = WriteReport::default();
        for write in writes.iter().filter(|w| objects.contains(&w.object())) {
            if write.succeeded() {
                report
                    .per_object
                    .entry(write.object())
                    .or_default()
                    .push(write.clone());
            } else if write.code == 409 {
                report.conflicts.push(write.clone());
            }
        }
        report
    }

    /// Every duplicate regeneration (see the module docs), in words.
    pub fn duplicates(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (object, writes) in &self.per_object {
            if object.starts_with("secrets/") && writes.len() > 1 {
                found.push(format!("{object} written {} times", writes.len()));
            }
            if object.starts_with("configmaps/") {
                let mut seen: Vec<BTreeSet<Vec<u8>>> = Vec::new();
                for write in writes {
                    let cas: BTreeSet<Vec<u8>> =
                        certificates(write.ca_bundle.as_deref().unwrap_or(""))
                            .into_iter()
                            .collect();
                    if seen.contains(&cas) {
                        found.push(format!(
                            "{object} written again with CAs it already had (write {} of {})",
                            seen.len() + 1,
                            writes.len()
                        ));
                    }
                    seen.push(cas);
                }
            }
        }
        found
    }

    /// Every fight (see the module docs), in words.
    pub fn fights(&self, names: &[String]) -> Vec<String> {
        let mut found = Vec::new();
        for (object, writes) in &self.per_object {
            let nodes: BTreeSet<usize> = writes.iter().map(|w| w.node).collect();
            if nodes.len() > 1 {
                let who: Vec<&str> = nodes.iter().map(|&n| names[n].as_str()).collect();
                found.push(format!("{object} written through {who:?}"));
            }
        }
        for write in &self.conflicts {
            found.push(format!(
                "{} {} by {} through {} refused with 409",
                write.verb,
                write.object(),
                write.user,
                names[write.node]
            ));
        }
        found
    }

    /// The number of successful writes.
    pub fn total(&self) -> usize {
        self.per_object.values().map(Vec::len).sum()
    }

    /// Prints one line per written object: how often, through which nodes, by whom.
    pub fn print(&self, names: &[String]) {
        eprintln!(
            "writes of the profiles' objects: {} objects, {} writes, {} refused with 409",
            self.per_object.len(),
            self.total(),
            self.conflicts.len()
        );
        for (object, writes) in &self.per_object {
            let nodes: BTreeSet<&str> = writes.iter().map(|w| names[w.node].as_str()).collect();
            let users: BTreeSet<&str> = writes
                .iter()
                .map(|w| w.user.rsplit(':').next().unwrap_or_default())
                .collect();
            eprintln!(
                "  {:>2} × {object} through {nodes:?} by {users:?}",
                writes.len()
            );
        }
    }
}

/// What is wrong with the approvals in `writes`: each CSR approval (the `approval`
/// subresource, accepted) must go through the kube-apiserver of the node the CSR is for
/// (`owners`: CSR name → `system:node:NAME`; that node's approver is the only one that talks to
/// it), once per CSR.
pub fn wrong_approvals(
    writes: &[Write],
    owners: &BTreeMap<String, String>,
    names: &[String],
) -> Vec<String> {
    let mut wrong = Vec::new();
    let mut approved: BTreeMap<&str, usize> = BTreeMap::new();
    for write in writes.iter().filter(|w| {
        w.resource == "certificatesigningrequests" && w.subresource == "approval" && w.succeeded()
    }) {
        *approved.entry(write.name.as_str()).or_default() += 1;
        let expected = format!("system:node:{}", names[write.node]);
        match owners.get(&write.name) {
            Some(cn) if *cn == expected => {}
            Some(cn) => wrong.push(format!(
                "CSR {} for {cn} approved through {} by {}",
                write.name, names[write.node], write.user
            )),
            None => wrong.push(format!(
                "CSR {} (not a kubelet's) approved through {} by {}",
                write.name, names[write.node], write.user
            )),
        }
    }
    for (csr, times) in approved {
        if times > 1 {
            wrong.push(format!("CSR {csr} approved {times} times"));
        }
    }
    wrong
}
