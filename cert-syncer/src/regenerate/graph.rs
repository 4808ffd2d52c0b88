//! The steps of a pass and what each one waits for: the dependency graph of a config, built
//! once per pass from the [`Rotation`] (pure; `pass` runs it).
//!
//! **The rule** (issue 35 item 5): nothing is issued by, or published for, a CA that the
//! bundles its consumers verify with do not hold yet. So a step that issues or publishes waits
//! for every bundle built from its CA ([`Graph::trust`]), and checks that each of them holds
//! it *as stored* (`trust`): a bundle write the brake held, or that failed, leaves the CA
//! out, and the dependent write waits with it instead of running ahead.
//!
//! - a target waits for its signer, the bundles that list the signer, and everything built
//!   from those: bundles that include them, unions of them, ConfigMap copies of those;
//! - an intermediate CA waits for its signer and the bundles that list it (its chain is
//!   checked against them); it is presented to no one until it is published;
//! - a publication waits for its intermediate and everything built from the bundle that
//!   collects it (the unions and their copies that kube-apiserver's `client-ca` is made of);
//! - bundles, unions and copies wait for what they are made of.
//!
//! **The order** (issue 37 item 2, "the needed chain first"): steps start in a topological
//! order in which items with a `priority` (1 first), and everything they wait for, come before
//! the rest; a step whose dependencies are done runs at once, concurrently with the others,
//! and its position is its rank for new keys (`keys`): the `localhost` serving chain's keys are
//! generated first, then the client certificates' the other pods need, then the rest.
//!
//! A config whose items wait for each other in a cycle (a bundle including a bundle that
//! includes it) is not refused: the cycle is cut where the order meets it, and the later step
//! reads the earlier one's object as it is.

use std::collections::{BTreeMap, BTreeSet};

use super::config::{ObjectRef, Rotation};
use crate::base::kind::Kind;

/// One step of a pass: one declared object brought to what it must be. The index is the
/// item's in its list of the [`Rotation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Step {
    Signer(usize),
    Bundle(usize),
    Intermediate(usize),
    /// The bundle that collects an intermediate's CAs (`intermediates[i].bundle`).
    Collected(usize),
    Union(usize),
    Copy(usize),
    Target(usize),
    /// The published copy of an intermediate (`intermediates[i].publish`).
    Publish(usize),
}

/// A config's steps, their dependencies and their order (see the module docs).
#[derive(Debug)]
pub(super) struct Graph {
    order: Vec<Step>,
    /// The ConfigMap each bundle step writes.
    bundles: BTreeMap<Step, ObjectRef>,
    position: BTreeMap<Step, usize>,
    deps: BTreeMap<Step, Vec<Step>>,
    trust: BTreeMap<Step, Vec<Step>>,
}

/// Items without a `priority` come after every prioritised one.
const UNPRIORITISED: u8 = u8::MAX;

impl Graph {
    /// The graph of `rotation`'s items.
    pub(super) fn of(rotation: &Rotation) -> Graph {
        let objects = Objects::of(rotation);
        let mut deps: BTreeMap<Step, Vec<Step>> = BTreeMap::new();
        let mut trust: BTreeMap<Step, Vec<Step>> = BTreeMap::new();
        for (i, _) in rotation.signers.iter().enumerate() {
            deps.insert(Step::Signer(i), Vec::new());
        }
        for (j, bundle) in rotation.bundles.iter().enumerate() {
            let mut needs: Vec<Step> = bundle.signers.iter().map(|s| Step::Signer(*s)).collect();
            needs.extend(bundle.include.iter().filter_map(|o| objects.bundle(o)));
            deps.insert(Step::Bundle(j), needs);
        }
        for (k, target) in rotation.targets.iter().enumerate() {
            let closure = objects.closure(listing(rotation, target.signer));
            let mut needs = vec![Step::Signer(target.signer)];
            needs.extend(closure.iter().copied());
            deps.insert(Step::Target(k), needs);
            trust.insert(Step::Target(k), closure);
        }
        for (i, intermediate) in rotation.intermediates.iter().enumerate() {
            let direct = listing(rotation, intermediate.signer);
            let mut needs = vec![Step::Signer(intermediate.signer)];
            needs.extend(direct.iter().copied());
            deps.insert(Step::Intermediate(i), needs);
            trust.insert(Step::Intermediate(i), direct);
            if intermediate.bundle.is_some() {
                deps.insert(Step::Collected(i), vec![Step::Intermediate(i)]);
            }
            if intermediate.publish.is_some() {
                let closure = match intermediate.bundle {
                    Some(_) => objects.closure(vec![Step::Collected(i)]),
                    None => Vec::new(),
                };
                let mut needs = vec![Step::Intermediate(i)];
                needs.extend(closure.iter().copied());
                deps.insert(Step::Publish(i), needs);
                trust.insert(Step::Publish(i), closure);
            }
        }
        for (u, union) in rotation.unions.iter().enumerate() {
            let needs = union
                .sources
                .iter()
                .filter_map(|o| objects.bundle(o))
                .collect();
            deps.insert(Step::Union(u), needs);
        }
        for (c, copy) in rotation.copies.iter().enumerate() {
            let needs = objects
                .producer(copy.kind, &copy.from)
                .into_iter()
                .collect();
            deps.insert(Step::Copy(c), needs);
        }
        let priority = priorities(rotation, &deps);
        let order = topological(&deps, &priority);
        let position: BTreeMap<Step, usize> =
            order.iter().enumerate().map(|(i, s)| (*s, i)).collect();
        // What a cycle left pointing forward is read as it is, never waited for.
        let earlier = |step: &Step, list: &mut Vec<Step>| {
            let at = position[step];
            list.retain(|dep| position[dep] < at);
            list.sort_by_key(|dep| position[dep]);
            list.dedup();
        };
        for (step, list) in deps.iter_mut() {
            earlier(step, list);
        }
        for (step, list) in trust.iter_mut() {
            earlier(step, list);
        }
        Graph {
            order,
            bundles: objects.written,
            position,
            deps,
            trust,
        }
    }

    /// The ConfigMap a bundle step writes (`None` for other steps).
    pub(super) fn object(&self, step: Step) -> Option<&ObjectRef> {
        self.bundles.get(&step)
    }

    /// Every step, in the order they start (dependencies first, the needed chains first).
    pub(super) fn order(&self) -> &[Step] {
        &self.order
    }

    /// Where `step` is in [`Graph::order`]: its rank for new keys (lower first).
    pub(super) fn rank(&self, step: Step) -> usize {
        self.position[&step]
    }

    /// The steps `step` waits for, all earlier in the order.
    pub(super) fn deps(&self, step: Step) -> &[Step] {
        self.deps.get(&step).map_or(&[], Vec::as_slice)
    }

    /// The bundle steps whose objects must hold the CA `step` issues from (a target, an
    /// intermediate CA) or publishes, before it writes anything from it.
    pub(super) fn trust(&self, step: Step) -> &[Step] {
        self.trust.get(&step).map_or(&[], Vec::as_slice)
    }
}

/// Which step writes each declared object, and which bundle steps read each object.
struct Objects {
    producers: BTreeMap<(Kind, ObjectRef), Step>,
    /// For each ConfigMap, the bundle steps built from it (bundles including it, unions of it,
    /// its copies).
    readers: BTreeMap<ObjectRef, Vec<Step>>,
    /// The ConfigMap each bundle step writes.
    written: BTreeMap<Step, ObjectRef>,
}

impl Objects {
    fn of(rotation: &Rotation) -> Objects {
        let mut producers = BTreeMap::new();
        let mut readers: BTreeMap<ObjectRef, Vec<Step>> = BTreeMap::new();
        let mut written = BTreeMap::new();
        let mut produce = |kind: Kind, object: &ObjectRef, step: Step| {
            producers.insert((kind, object.clone()), step);
            if kind == Kind::ConfigMap {
                written.insert(step, object.clone());
            }
        };
        for (i, s) in rotation.signers.iter().enumerate() {
            produce(Kind::Secret, &s.object, Step::Signer(i));
        }
        for (j, b) in rotation.bundles.iter().enumerate() {
            produce(Kind::ConfigMap, &b.object, Step::Bundle(j));
            for included in &b.include {
                readers
                    .entry(included.clone())
                    .or_default()
                    .push(Step::Bundle(j));
            }
        }
        for (k, t) in rotation.targets.iter().enumerate() {
            produce(Kind::Secret, &t.object, Step::Target(k));
        }
        for (i, m) in rotation.intermediates.iter().enumerate() {
            produce(Kind::Secret, &m.object, Step::Intermediate(i));
            if let Some(bundle) = &m.bundle {
                produce(Kind::ConfigMap, bundle, Step::Collected(i));
            }
            if let Some(publish) = &m.publish {
                produce(Kind::Secret, &publish.object, Step::Publish(i));
            }
        }
        for (u, union) in rotation.unions.iter().enumerate() {
            produce(Kind::ConfigMap, &union.object, Step::Union(u));
            for source in &union.sources {
                readers
                    .entry(source.clone())
                    .or_default()
                    .push(Step::Union(u));
            }
        }
        for (c, copy) in rotation.copies.iter().enumerate() {
            produce(copy.kind, &copy.to, Step::Copy(c));
            if copy.kind == Kind::ConfigMap {
                readers
                    .entry(copy.from.clone())
                    .or_default()
                    .push(Step::Copy(c));
            }
        }
        Objects {
            producers,
            readers,
            written,
        }
    }

    fn producer(&self, kind: Kind, object: &ObjectRef) -> Option<Step> {
        self.producers.get(&(kind, object.clone())).copied()
    }

    /// The step writing the ConfigMap `object`, if the config writes it.
    fn bundle(&self, object: &ObjectRef) -> Option<Step> {
        self.producer(Kind::ConfigMap, object)
    }

    /// `start` and every bundle step built from them, transitively, each once.
    fn closure(&self, start: Vec<Step>) -> Vec<Step> {
        let mut seen: BTreeSet<Step> = start.iter().copied().collect();
        let mut out = start.clone();
        let mut next = start;
        while let Some(step) = next.pop() {
            let Some(object) = self.written.get(&step) else {
                continue;
            };
            for reader in self.readers.get(object).into_iter().flatten() {
                if seen.insert(*reader) {
                    out.push(*reader);
                    next.push(*reader);
                }
            }
        }
        out
    }
}

/// The bundle steps that list signer `signer` (what its certificates must chain to).
pub(super) fn listing(rotation: &Rotation, signer: usize) -> Vec<Step> {
    rotation
        .bundles
        .iter()
        .enumerate()
        .filter(|(_, b)| b.signers.contains(&signer))
        .map(|(j, _)| Step::Bundle(j))
        .collect()
}

/// Each step's priority: its item's own (targets, intermediates with their bundle and
/// publication, copies), or the most urgent of the steps that wait for it.
fn priorities(rotation: &Rotation, deps: &BTreeMap<Step, Vec<Step>>) -> BTreeMap<Step, u8> {
    let mut priority: BTreeMap<Step, u8> = deps.keys().map(|s| (*s, UNPRIORITISED)).collect();
    let mut set = |step: Step, value: Option<u8>| {
        if let (Some(value), Some(slot)) = (value, priority.get_mut(&step)) {
            *slot = (*slot).min(value);
        }
    };
    for (k, t) in rotation.targets.iter().enumerate() {
        set(Step::Target(k), t.priority);
    }
    for (i, m) in rotation.intermediates.iter().enumerate() {
        for step in [Step::Intermediate(i), Step::Collected(i), Step::Publish(i)] {
            set(step, m.priority);
        }
    }
    for (c, copy) in rotation.copies.iter().enumerate() {
        set(Step::Copy(c), copy.priority);
    }
    // Down to the dependencies, until nothing changes (the graph is small; a cycle ends too,
    // since values only decrease).
    loop {
        let mut changed = false;
        for (step, needs) in deps {
            let own = priority[step];
            for dep in needs {
                if let Some(slot) = priority.get_mut(dep)
                    && own < *slot
                {
                    *slot = own;
                    changed = true;
                }
            }
        }
        if !changed {
            return priority;
        }
    }
}

/// Kahn's order: of the steps whose dependencies are placed, the most urgent first (then by
/// kind and item order); a cycle is cut at its most urgent step.
fn topological(deps: &BTreeMap<Step, Vec<Step>>, priority: &BTreeMap<Step, u8>) -> Vec<Step> {
    let key = |step: &Step| (priority[step], *step);
    let mut waiting: BTreeMap<Step, BTreeSet<Step>> = deps
        .iter()
        .map(|(step, needs)| {
            let needs = needs.iter().filter(|d| deps.contains_key(d)).copied();
            (*step, needs.filter(|d| d != step).collect())
        })
        .collect();
    let mut order = Vec::with_capacity(waiting.len());
    while !waiting.is_empty() {
        let next = waiting
            .iter()
            .filter(|(_, needs)| needs.is_empty())
            .map(|(step, _)| *step)
            .min_by_key(key)
            .or_else(|| waiting.keys().copied().min_by_key(key))
            .expect("not empty");
        waiting.remove(&next);
        for needs in waiting.values_mut() {
            needs.remove(&next);
        }
        order.push(next);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regenerate::config;

    fn names(rotation: &Rotation, steps: &[Step]) -> Vec<String> {
        steps.iter().map(|s| name(rotation, *s)).collect()
    }

    fn name(rotation: &Rotation, step: Step) -> String {
        match step {
            Step::Signer(i) => format!("signer {}", rotation.signers[i].object.name),
            Step::Bundle(j) => format!("bundle {}", rotation.bundles[j].object.name),
            Step::Target(k) => format!("target {}", rotation.targets[k].object.name),
            Step::Intermediate(i) => {
                format!("intermediate {}", rotation.intermediates[i].object.name)
            }
            Step::Collected(i) => format!(
                "collected {}",
                rotation.intermediates[i].bundle.as_ref().unwrap().name
            ),
            Step::Union(u) => format!("union {}", rotation.unions[u].object.name),
            Step::Copy(c) => format!("copy {}", rotation.copies[c].to),
            Step::Publish(i) => format!(
                "publish {}",
                rotation.intermediates[i].publish.as_ref().unwrap().object
            ),
        }
    }

    fn assert_topological(graph: &Graph) {
        for step in graph.order() {
            for dep in graph.deps(*step) {
                assert!(
                    graph.rank(*dep) < graph.rank(*step),
                    "{dep:?} after {step:?}"
                );
            }
            for dep in graph.trust(*step) {
                assert!(
                    graph.deps(*step).contains(dep),
                    "{step:?} trusts {dep:?} unwaited"
                );
            }
        }
    }

    fn find(rotation: &Rotation, graph: &Graph, what: &str) -> Step {
        *graph
            .order()
            .iter()
            .find(|s| name(rotation, **s) == what)
            .unwrap_or_else(|| panic!("no step {what}"))
    }

    /// The kube-apiserver's profile: the `localhost` chain starts first, then the client
    /// certificates of the other pods with everything `client-ca` is made of; a client
    /// certificate waits for `client-ca`, a serving certificate only for its own bundle.
    #[test]
    fn the_kube_apiservers_needed_chains_come_first_and_a_client_certificate_waits_for_client_ca() {
        let rotation =
            crate::regenerate::profile_objects(crate::regenerate::Profile::OpenshiftKubeApiserver)
                .unwrap();
        let graph = Graph::of(&rotation);
        assert_topological(&graph);
        let order = names(&rotation, graph.order());
        assert_eq!(
            order[..3],
            [
                "signer localhost-serving-signer",
                "bundle localhost-serving-ca",
                "target localhost-serving-cert-certkey"
            ]
        );
        let position = |what: &str| order.iter().position(|s| s == what).unwrap();
        for needed in [
            "target kube-controller-manager-client-cert-key",
            "target kube-scheduler-client-cert-key",
            "target kubelet-client",
            "union client-ca",
        ] {
            assert!(
                position(needed) < position("target aggregator-client"),
                "{needed} after the rest: {order:?}"
            );
        }
        let kcm = find(
            &rotation,
            &graph,
            "target kube-controller-manager-client-cert-key",
        );
        assert_eq!(
            names(&rotation, graph.trust(kcm)),
            ["bundle kube-control-plane-signer-ca", "union client-ca"]
        );
        let localhost = find(&rotation, &graph, "target localhost-serving-cert-certkey");
        assert_eq!(
            names(&rotation, graph.trust(localhost)),
            ["bundle localhost-serving-ca"]
        );
        let client_ca = find(&rotation, &graph, "union client-ca");
        assert_eq!(
            names(&rotation, graph.deps(client_ca)),
            [
                "bundle kube-apiserver-to-kubelet-client-ca",
                "bundle kube-control-plane-signer-ca",
                "bundle node-system-admin-ca"
            ]
        );
    }

    /// The kube-controller-manager's profile: `csr-signer` is published only after the union
    /// and its copy (what kube-apiserver folds into `client-ca`) were written.
    #[test]
    fn a_publication_waits_for_every_bundle_built_from_its_intermediate() {
        let rotation = crate::regenerate::profile_objects(
            crate::regenerate::Profile::OpenshiftKubeControllerManager,
        )
        .unwrap();
        let graph = Graph::of(&rotation);
        assert_topological(&graph);
        let publish = find(
            &rotation,
            &graph,
            "publish openshift-kube-controller-manager/csr-signer",
        );
        assert_eq!(
            names(&rotation, graph.trust(publish)),
            [
                "collected csr-signer-ca",
                "union csr-controller-ca",
                "copy openshift-config-managed/csr-controller-ca"
            ]
        );
        let intermediate = find(&rotation, &graph, "intermediate csr-signer");
        assert_eq!(
            names(&rotation, graph.trust(intermediate)),
            ["bundle csr-controller-signer-ca"]
        );
    }

    /// Bundles that include each other: the cycle is cut, every step is placed once.
    #[test]
    fn a_cycle_of_includes_is_cut_not_waited_for() {
        let rotation = config::parse(
            r#"
namespace: ns
signers: [{ name: s, validity: 10d, refresh: 5d }]
bundles:
  - { name: a, signers: [s], include: [ns/b] }
  - { name: b, signers: [s], include: [ns/a] }
targets:
  - { name: t, signer: s, serving: { hostnames: [x.example] }, validity: 5d, refresh: 2d, priority: 1 }
"#,
        )
        .unwrap();
        assert!(rotation.broken.is_empty(), "{:?}", rotation.broken);
        let graph = Graph::of(&rotation);
        assert_topological(&graph);
        assert_eq!(graph.order().len(), 4);
        let target = find(&rotation, &graph, "target t");
        assert_eq!(
            names(&rotation, graph.trust(target)),
            ["bundle a", "bundle b"]
        );
    }
}
