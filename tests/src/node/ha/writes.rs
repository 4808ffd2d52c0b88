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
            // A bundle's CAs per write (how each write changed it).
            let cas: Vec<usize> = writes
                .iter()
                .filter_map(|w| w.ca_bundle.as_deref())
                .map(|pem| certificates(pem).len())
                .collect();
            let cas = if cas.is_empty() {
                String::new()
            } else {
                format!(", CAs per write {cas:?}")
            };
            eprintln!(
                "  {:>2} × {object} through {nodes:?} by {users:?}{cas}",
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

#[cfg(test)]
mod tests {
    use super::*;

    fn write(node: usize, object: &str, code: u16, bundle: Option<&str>) -> Write {
        let mut parts = object.splitn(3, '/');
        Write {
            node,
            user: "system:serviceaccount:openshift-kube-apiserver:cert-regeneration-controller"
                .to_owned(),
            verb: "update".to_owned(),
            resource: parts.next().unwrap().to_owned(),
            subresource: String::new(),
            namespace: parts.next().unwrap().to_owned(),
            name: parts.next().unwrap().to_owned(),
            code,
            at: String::new(),
            ca_bundle: bundle.map(str::to_owned),
        }
    }

    const SIGNER: &str = "secrets/openshift-kube-apiserver-operator/localhost-serving-signer";
    const BUNDLE: &str = "configmaps/openshift-kube-apiserver-operator/localhost-serving-ca";

    #[test]
    fn the_profiles_objects_are_read_from_their_yaml() {
        let objects = profile_objects();
        assert!(objects.contains(SIGNER) && objects.contains(BUNDLE));
        assert!(!objects.iter().any(|o| o.starts_with("leases/")));
    }

    #[test]
    fn one_write_per_object_through_one_node_is_neither_a_duplicate_nor_a_fight() {
        let ca = testkit::pki::Ca::new("one").cert_pem;
        let report = WriteReport::of(&[
            write(1, SIGNER, 200, None),
            write(1, BUNDLE, 200, Some(&ca)),
        ]);
        assert!(report.duplicates().is_empty());
        assert!(report.fights(&["a".into(), "b".into()]).is_empty());
        assert_eq!(report.total(), 2);
    }

    #[test]
    fn a_certificate_written_twice_is_a_duplicate_and_through_two_nodes_a_fight() {
        let report = WriteReport::of(&[write(0, SIGNER, 200, None), write(2, SIGNER, 200, None)]);
        assert_eq!(report.duplicates().len(), 1, "{:?}", report.duplicates());
        let names = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
        assert_eq!(report.fights(&names).len(), 1);
    }

    #[test]
    fn a_bundle_written_again_with_the_same_cas_is_a_duplicate_a_new_set_is_not() {
        let (one, two) = (
            testkit::pki::Ca::new("one").cert_pem,
            testkit::pki::Ca::new("two").cert_pem,
        );
        let both = format!("{one}{two}");
        let grown = WriteReport::of(&[
            write(0, BUNDLE, 200, Some(&one)),
            write(0, BUNDLE, 201, Some(&both)),
        ]);
        assert!(grown.duplicates().is_empty());
        let flapped = WriteReport::of(&[
            write(0, BUNDLE, 200, Some(&one)),
            write(0, BUNDLE, 200, Some(&both)),
            write(0, BUNDLE, 200, Some(&one)),
        ]);
        assert_eq!(flapped.duplicates().len(), 1);
    }

    #[test]
    fn a_conflict_is_a_fight_and_a_refused_write_is_not_counted() {
        let report = WriteReport::of(&[write(0, SIGNER, 409, None), write(0, SIGNER, 200, None)]);
        assert_eq!(report.total(), 1);
        assert_eq!(report.fights(&["a".into()]).len(), 1);
        let other = WriteReport::of(&[write(0, "secrets/default/not-ours", 200, None)]);
        assert_eq!(
            other.total(),
            0,
            "objects outside the profiles are not judged"
        );
    }

    #[test]
    fn an_approval_through_another_nodes_apiserver_or_twice_is_wrong() {
        let names = ["master-0".to_owned(), "master-1".to_owned()];
        let approval = |node: usize, csr: &str| Write {
            resource: "certificatesigningrequests".into(),
            subresource: "approval".into(),
            namespace: String::new(),
            name: csr.into(),
            ..write(node, SIGNER, 200, None)
        };
        let owners = BTreeMap::from([
            ("csr-a".to_owned(), "system:node:master-0".to_owned()),
            ("csr-b".to_owned(), "system:node:master-1".to_owned()),
        ]);
        assert!(
            wrong_approvals(
                &[approval(0, "csr-a"), approval(1, "csr-b")],
                &owners,
                &names
            )
            .is_empty()
        );
        assert_eq!(
            wrong_approvals(&[approval(1, "csr-a")], &owners, &names).len(),
            1
        );
        assert_eq!(
            wrong_approvals(
                &[approval(0, "csr-a"), approval(0, "csr-a")],
                &owners,
                &names
            )
            .len(),
            1
        );
        assert_eq!(
            wrong_approvals(&[approval(0, "csr-x")], &owners, &names).len(),
            1
        );
    }
}
