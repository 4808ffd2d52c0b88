// Over 600 lines because every flag of every subcommand is classified here, in one place, so a new flag cannot be added without deciding what access it needs.
//! The API access each subcommand needs, computed from its flags (and for `regenerate` its
//! config file): the one list that the RBAC manifests are checked against, and that the
//! end-to-end tests check every request of a real run against (through `mini-apiserver
//! --audit-log`).
//!
//! The rules use RBAC's semantics (`PolicyRule` in a namespace-scoped `Role`):
//! - a rule with `resourceNames` matches only requests that name one of them: a get, update or
//!   delete by its path, a list or watch by a `metadata.name=` field selector (kube's
//!   single-object watch). It never matches a create (the name is in the body) or a list of a
//!   whole namespace;
//! - so every create is a rule without names (RBAC cannot restrict creates by name).
//!
//! ```
//! use cert_syncer::access::{Request, required_access};
//! use cert_syncer::cli::Cli;
//! use clap::Parser;
//!
//! let cli = Cli::try_parse_from([
//!     "cert-syncer", "sync", "--server", "https://127.0.0.1:6443", "--namespace", "ns",
//!     "--destination-dir", "/certs", "--secrets", "serving-cert", "--pod-name", "p",
//! ])?;
//! let rules = required_access(&cli.command)?;
//! let watch = Request::new("watch", "", "secrets", "ns", Some("serving-cert"));
//! assert!(rules.iter().any(|rule| rule.allows(&watch)));
//! let other = Request::new("get", "", "secrets", "ns", Some("someone-elses"));
//! assert!(!rules.iter().any(|rule| rule.allows(&other)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{BTreeMap, BTreeSet};

use crate::app::cli::{Command, Job};
use crate::base::error::ConfigError;
use crate::base::kind::Kind;
use crate::regenerate::config::Rotation;
use crate::{inspect, regenerate, sync};

/// The core API group.
pub const CORE: &str = "";
/// The Lease API group.
pub const COORDINATION: &str = "coordination.k8s.io";
/// The CertificateSigningRequest API group.
pub const CERTIFICATES: &str = "certificates.k8s.io";
/// OpenShift's cluster configuration API group (`networks`, `infrastructures`).
pub const CONFIG_OPENSHIFT: &str = "config.openshift.io";
/// The `namespace` of a cluster-scoped rule (it belongs in a `ClusterRole`).
pub const CLUSTER: &str = "";

/// One permission: verbs on a resource in a namespace, for some names or for all.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Access {
    /// The namespace (the rule belongs in a `Role` there); [`CLUSTER`] (`""`) for a
    /// cluster-scoped resource (the rule belongs in a `ClusterRole`).
    pub namespace: String,
    /// API group (`""` for core).
    pub api_group: &'static str,
    /// Resource plural.
    pub resource: &'static str,
    /// Sorted verbs.
    pub verbs: Vec<&'static str>,
    /// Sorted object names; `None` for every object of the resource in the namespace.
    pub resource_names: Option<Vec<String>>,
}

impl Access {
    /// Whether this rule allows `request` (RBAC's matching, see the module docs).
    pub fn allows(&self, request: &Request<'_>) -> bool {
        self.namespace == request.namespace
            && self.api_group == request.api_group
            && self.resource == request.resource
            && self.verbs.contains(&request.verb)
            && match (&self.resource_names, request.name) {
                (None, _) => true,
                (Some(names), Some(name)) => names.iter().any(|n| n == name),
                (Some(_), None) => false,
            }
    }
}

/// One API request as the authorizer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`.
    pub verb: &'a str,
    /// API group (`""` for core).
    pub api_group: &'a str,
    /// Resource plural.
    pub resource: &'a str,
    /// Namespace.
    pub namespace: &'a str,
    /// The object's name, when the request names one (see the module docs).
    pub name: Option<&'a str>,
}

impl<'a> Request<'a> {
    /// A request.
    pub fn new(
        verb: &'a str,
        api_group: &'a str,
        resource: &'a str,
        namespace: &'a str,
        name: Option<&'a str>,
    ) -> Request<'a> {
        Request {
            verb,
            api_group,
            resource,
            namespace,
            name,
        }
    }
}

/// The access `command` needs with these flags. For `regenerate` this reads `--config`.
///
/// # Errors
/// The same [`ConfigError`]s the subcommand itself would refuse to start with (bad names, an
/// unreadable config).
pub fn required_access(command: &Command) -> Result<Vec<Access>, ConfigError> {
    match command.job()? {
        Job::Sync(settings) => Ok(sync_access(&settings)),
        Job::Regenerate(settings) => {
            let rotation = match (&settings.config, settings.profile) {
                (Some(path), _) => crate::regenerate::config::load(path)?,
                (None, Some(profile)) => crate::regenerate::profile_objects(profile)?,
                (None, None) => {
                    return Err(ConfigError("--config or --profile is required".into()));
                }
            };
            Ok(regenerate_access(&settings, &rotation))
        }
        Job::Inspect(settings) => Ok(inspect_access(&settings)),
        Job::Node(settings) => Ok(node_access(&settings)),
        Job::ApproveKubeletCsr(_) => Ok(approve_access()),
        Job::RestartOnChange(settings) => Ok(restart_access(&settings)),
    }
}

/// `restart-on-change`: creating Events on its pod when the pod is known (`POD_NAME`,
/// `POD_NAMESPACE`), nothing else: the files it watches and the processes it signals are the
/// node's, not the API's.
fn restart_access(settings: &crate::restart::Settings) -> Vec<Access> {
    let mut rules = Rules::default();
    if let (Some(namespace), Some(_)) = (&settings.pod_namespace, &settings.pod_name) {
        rules.any(namespace, CORE, "events", &["create"]);
    }
    rules.into_list()
}

/// `approve-kubelet-csr` (cluster-scoped, [`CLUSTER`]): list and watch CSRs (one watcher, the
/// signer as a field selector, which RBAC cannot narrow), update their `approval`
/// subresource, and `approve` on the one signer `kubernetes.io/kube-apiserver-client-kubelet`
/// (kube-apiserver checks it on every approval since certificates.k8s.io/v1).
fn approve_access() -> Vec<Access> {
    let mut rules = Rules::default();
    rules.any(
        CLUSTER,
        CERTIFICATES,
        "certificatesigningrequests",
        &["list", "watch"],
    );
    rules.any(
        CLUSTER,
        CERTIFICATES,
        "certificatesigningrequests/approval",
        &["update"],
    );
    rules.named(
        CLUSTER,
        CERTIFICATES,
        "signers",
        &["approve"],
        crate::approve::SIGNER,
    );
    rules.into_list()
}

/// `node`: get, list and watch on each source object (one single-object watcher each, by
/// name, in its namespace); creating Events in `default` (where Node Events live) when
/// `NODE_NAME` is known.
fn node_access(settings: &crate::node::Settings) -> Vec<Access> {
    let mut rules = Rules::default();
    for object in settings.objects() {
        let resource = match object.kind {
            crate::base::kind::Kind::Secret => "secrets",
            crate::base::kind::Kind::ConfigMap => "configmaps",
        };
        rules.named(
            &object.namespace,
            CORE,
            resource,
            &["get", "list", "watch"],
            &object.name,
        );
    }
    if settings.node_name.is_some() {
        rules.any("default", CORE, "events", &["create"]);
    }
    rules.into_list()
}

/// `inspect`: with `--namespace`, one list of the Secrets and one of the ConfigMaps there
/// (every object, so no names); directories alone need no access.
fn inspect_access(args: &inspect::Settings) -> Vec<Access> {
    let mut rules = Rules::default();
    if let Some(namespace) = &args.namespace {
        for resource in ["secrets", "configmaps"] {
            rules.any(namespace, CORE, resource, &["list"]);
        }
    }
    rules.into_list()
}

/// `sync`: list and watch on each followed object (one single-object watcher each), get on the
/// optional ones (the live GET before the files of an object that went away are removed:
/// `ObjectSpec::may_get_live`), and creating Events on the pod when `POD_NAME` is known. For a
/// kind with more named objects than `--namespace-watch-threshold`: list and watch on every
/// object of that kind in the namespace (one namespace-wide watcher; RBAC cannot restrict it by
/// name), and get on the optional named ones.
fn sync_access(args: &sync::Settings) -> Vec<Access> {
    let namespace = &args.namespace;
    let mut rules = Rules::default();
    for kind in Kind::ALL {
        if args.namespace_wide(kind) {
            rules.any(namespace, CORE, kind.plural(), &["list", "watch"]);
        }
    }
    // The named objects and those of `--file`.
    for object in &args.objects {
        let verbs: &[&'static str] = match (args.namespace_wide(object.kind), object.may_get_live())
        {
            (true, true) => &["get"],
            (true, false) => continue,
            (false, true) => &["get", "list", "watch"],
            (false, false) => &["list", "watch"],
        };
        rules.named(namespace, CORE, object.kind.plural(), verbs, &object.name);
    }
    if args.pod_name.is_some() {
        rules.any(namespace, CORE, "events", &["create"]);
    }
    rules.into_list()
}

/// `regenerate`: update on every object it writes (signers, bundles, targets, intermediates,
/// unions, published CAs, copies), and create on Secrets and ConfigMaps of each namespace that
/// has written objects (a missing object is created; RBAC cannot restrict a create by name). To
/// read them and the sources of copies and includes (read, never written): list and watch as
/// the cache watches ([`crate::regenerate::watch_plan`]): by name (`resourceNames`) for each
/// declared object of a kind and namespace up to `--namespace-watch-threshold` of them, on every
/// object of that kind in the namespace above it (RBAC cannot restrict a namespace-wide list by
/// name); or with `--once` (no watches) get on each declared object. The apiserver's clock is
/// read from `/version`, which needs no rule. Events on the pod when `POD_NAME` is known; with
/// `--leader-elect`, get and update on the Lease and create on Leases.
fn regenerate_access(args: &regenerate::Settings, rotation: &Rotation) -> Vec<Access> {
    let mut rules = Rules::default();
    for (kind, object) in rotation.written() {
        let resource = kind.plural();
        let verbs: &[&'static str] = if args.once {
            &["get", "update"]
        } else {
            &["update"]
        };
        rules.named(&object.namespace, CORE, resource, verbs, &object.name);
        rules.any(&object.namespace, CORE, resource, &["create"]);
    }
    if args.once {
        // Sources of copies and included bundles: read, never written.
        for (kind, object) in rotation.read_only() {
            rules.named(
                &object.namespace,
                CORE,
                kind.plural(),
                &["get"],
                &object.name,
            );
        }
    } else {
        for (watch, _) in crate::regenerate::watch_plan(rotation, args.namespace_watch_threshold) {
            let resource = watch.kind.plural();
            match &watch.name {
                Some(name) => {
                    rules.named(&watch.namespace, CORE, resource, &["list", "watch"], name)
                }
                None => rules.any(&watch.namespace, CORE, resource, &["list", "watch"]),
            }
        }
    }
    // A built-in profile that names cluster-specific hostnames reads them from the cluster's
    // `networks` and `infrastructures` objects named `cluster` (cluster-scoped, a GET each,
    // `regenerate::cluster::read`) before its first pass; a `--config` file never does.
    if args.config.is_none()
        && args
            .profile
            .is_some_and(crate::regenerate::Profile::needs_cluster_values)
    {
        for resource in ["networks", "infrastructures"] {
            rules.named(CLUSTER, CONFIG_OPENSHIFT, resource, &["get"], "cluster");
        }
    }
    if args.pod_name.is_some() {
        rules.any(args.events_namespace(), CORE, "events", &["create"]);
    }
    if args.leader_elect {
        let namespace = args.lease_namespace();
        rules.named(
            namespace,
            COORDINATION,
            "leases",
            &["get", "update"],
            &args.leader_elect_lease_name,
        );
        rules.any(namespace, COORDINATION, "leases", &["create"]);
    }
    rules.into_list()
}

/// (namespace, group, resource, sorted verbs): one rule.
type RuleKey = (String, &'static str, &'static str, Vec<&'static str>);

/// Rules being collected, names merged per [`RuleKey`].
#[derive(Default)]
struct Rules {
    /// Names per rule; `None` = any name.
    by_key: BTreeMap<RuleKey, Option<BTreeSet<String>>>,
}

impl Rules {
    fn named(
        &mut self,
        namespace: &str,
        group: &'static str,
        resource: &'static str,
        verbs: &[&'static str],
        name: &str,
    ) {
        let names = self
            .by_key
            .entry((namespace.to_owned(), group, resource, sorted(verbs)))
            .or_insert_with(|| Some(BTreeSet::new()));
        if let Some(names) = names {
            names.insert(name.to_owned());
        }
    }

    fn any(
        &mut self,
        namespace: &str,
        group: &'static str,
        resource: &'static str,
        verbs: &[&'static str],
    ) {
        self.by_key
            .insert((namespace.to_owned(), group, resource, sorted(verbs)), None);
    }

    fn into_list(self) -> Vec<Access> {
        self.by_key
            .into_iter()
            .map(|((namespace, api_group, resource, verbs), names)| Access {
                namespace,
                api_group,
                resource,
                verbs,
                resource_names: names.map(|names| names.into_iter().collect()),
            })
            .collect()
    }
}

fn sorted(verbs: &[&'static str]) -> Vec<&'static str> {
    let mut verbs = verbs.to_vec();
    verbs.sort_unstable();
    verbs.dedup();
    verbs
}

/// Every flag of each subcommand, sorted into those whose value changes the requests it makes
/// (read by the functions above) and those that do not ([`FLAGS_WITHOUT_ACCESS`]). A test
/// fails on a flag in neither list, so a new flag is a decision about access, not an accident.
/// The connection flags (`--kubeconfig`, `--server`, ...) are in neither: they change where the
/// requests go, not which.
pub const FLAGS_THAT_CHANGE_ACCESS: &[(&str, &[&str])] = &[
    (
        "sync",
        &[
            "namespace",
            "secrets",
            "optional-secrets",
            "configmaps",
            "optional-configmaps",
            "file",
            "pod-name",
            "namespace-watch-threshold",
        ],
    ),
    (
        "regenerate",
        &[
            "config",
            "profile",
            "pod-name",
            "pod-namespace",
            "leader-elect",
            "leader-elect-lease-name",
            "leader-elect-namespace",
            "namespace-watch-threshold",
        ],
    ),
    ("inspect", &["namespace"]),
    ("node", &["source", "preset", "node-name"]),
    // Its access is fixed: the node name and users change which CSRs it approves, not which
    // requests it makes.
    ("approve-kubelet-csr", &[]),
    // Events on its pod, when the pod is known.
    ("restart-on-change", &["pod-name", "pod-namespace"]),
];

/// See [`FLAGS_THAT_CHANGE_ACCESS`]: output, timing and mode flags.
pub const FLAGS_WITHOUT_ACCESS: &[(&str, &[&str])] = &[
    (
        "sync",
        &[
            "destination-dir",
            "metrics-listen",
            "auth-failure-exit-after",
            "write-parallelism",
            "resync-interval",
        ],
    ),
    (
        "regenerate",
        &[
            "mode",
            "once",
            "metrics-listen",
            "leader-elect-lease-duration",
            "leader-elect-renew-deadline",
            "leader-elect-retry-period",
            "now",
            // Key type and hostnames change what is written, not where. (With --profile the
            // cluster's networks/infrastructures.config.openshift.io `cluster` objects are read
            // when allowed; a 403 counts as absent, so that read is optional access.)
            "key-type",
            "service-network-ip",
            "api-hostname",
            "api-int-hostname",
            // Every release names the same objects; only lifetimes and metadata differ.
            "openshift-version",
        ],
    ),
    (
        "inspect",
        &["dir", "ca-bundle", "warn-within", "json", "now"],
    ),
    (
        "node",
        &[
            "file",
            "mode",
            "owner",
            "grace-period",
            "resync-interval",
            "metrics-listen",
            "post-write-signal",
            "post-write-pid-file",
            "post-write-process-name",
            "post-write-command",
            "post-write-timeout",
        ],
    ),
    (
        "approve-kubelet-csr",
        &[
            "node-name",
            "kubelet-client-cert",
            "bootstrap-user",
            "bootstrap-group",
            "clock-skew-margin",
            "recheck-interval",
            "metrics-listen",
        ],
    ),
    // What it restarts and when is found on the node, never through the API.
    (
        "restart-on-change",
        &[
            "container",
            "pair",
            "max-restarts",
            "restart-window",
            "recheck-interval",
            "reload-period",
            "metrics-listen",
        ],
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::cli::Cli;
    use clap::Parser;

    #[test]
    fn every_flag_is_classified_for_access() {
        use clap::CommandFactory;
        let connection = [
            "kubeconfig",
            "context",
            "server",
            "ca-file",
            "token-file",
            "tls-server-name-override",
            "insecure-plain-http",
            "connect-timeout",
            "read-idle-timeout",
            "log-format",
            "help",
            "version",
        ];
        let cli = Cli::command();
        let listed = |table: &[(&str, &[&str])], sub: &str| -> Vec<String> {
            table
                .iter()
                .filter(|(name, _)| *name == sub)
                .flat_map(|(_, flags)| flags.iter().map(|f| (*f).to_owned()))
                .collect()
        };
        let mut seen = 0;
        for sub in cli.get_subcommands() {
            let name = sub.get_name();
            let changes = listed(FLAGS_THAT_CHANGE_ACCESS, name);
            let neutral = listed(FLAGS_WITHOUT_ACCESS, name);
            for arg in sub.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                if connection.contains(&long) {
                    continue;
                }
                seen += 1;
                assert!(
                    changes.iter().any(|f| f == long) != neutral.iter().any(|f| f == long),
                    "flag --{long} of `{name}` must be in exactly one of FLAGS_THAT_CHANGE_ACCESS \
                     and FLAGS_WITHOUT_ACCESS (src/app/access.rs): if it changes which API requests \
                     `{name}` makes, make the {name} access function follow it"
                );
            }
            for flag in changes.iter().chain(&neutral) {
                assert!(
                    sub.get_arguments()
                        .any(|a| a.get_long() == Some(flag.as_str())),
                    "`{name}` has no flag --{flag} (listed in src/app/access.rs)"
                );
            }
        }
        assert!(seen >= 20, "{seen} flags classified");
    }

    fn command(args: &[&str]) -> Command {
        let mut argv = vec!["cert-syncer"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).unwrap().command
    }

    fn allowed(
        rules: &[Access],
        verb: &str,
        group: &str,
        resource: &str,
        ns: &str,
        name: Option<&str>,
    ) -> bool {
        let request = Request::new(verb, group, resource, ns, name);
        rules.iter().any(|rule| rule.allows(&request))
    }

    #[test]
    fn sync_reads_exactly_its_named_objects() {
        let rules = sync_access(&match &command(&[
            "sync",
            "--server=https://127.0.0.1:6443",
            "--namespace=ns",
            "--destination-dir=/d",
            "--secrets=a,b",
            "--optional-configmaps=c",
            "--file=configmap/kubelet-ca/ca.crt=/etc/kubernetes/kubelet-ca.crt",
        ]) {
            Command::Sync(args) => args.settings().unwrap(),
            _ => unreachable!(),
        });
        for (resource, name, optional) in [
            ("secrets", "a", false),
            ("secrets", "b", false),
            ("configmaps", "c", true),
            ("configmaps", "kubelet-ca", false),
        ] {
            for verb in ["list", "watch"] {
                assert!(
                    allowed(&rules, verb, CORE, resource, "ns", Some(name)),
                    "{verb} {resource}/{name}"
                );
            }
            // Only an optional object is ever GETed (before its files are removed).
            assert_eq!(
                allowed(&rules, "get", CORE, resource, "ns", Some(name)),
                optional,
                "get {resource}/{name}"
            );
            assert!(!allowed(&rules, "update", CORE, resource, "ns", Some(name)));
        }
        assert!(!allowed(&rules, "list", CORE, "secrets", "ns", Some("c")));
        assert!(
            !allowed(&rules, "list", CORE, "secrets", "ns", None),
            "a namespace-wide list"
        );
        assert!(!allowed(&rules, "get", CORE, "secrets", "other", Some("a")));
        // No POD_NAME: no events.
        assert!(!allowed(&rules, "create", CORE, "events", "ns", None));
        assert_eq!(rules.len(), 3);
    }

    #[test]
    fn sync_above_the_threshold_lists_and_watches_the_whole_kind_and_gets_optional_ones_by_name() {
        let rules = sync_access(&match &command(&[
            "sync",
            "--server=https://127.0.0.1:6443",
            "--namespace=ns",
            "--destination-dir=/d",
            "--secrets=a,b",
            "--optional-secrets=c",
            "--configmaps=m",
            "--namespace-watch-threshold=2",
        ]) {
            Command::Sync(args) => args.settings().unwrap(),
            _ => unreachable!(),
        });
        for verb in ["list", "watch"] {
            assert!(allowed(&rules, verb, CORE, "secrets", "ns", None), "{verb}");
            // ConfigMaps (one, below the threshold) stay per object.
            assert!(
                !allowed(&rules, verb, CORE, "configmaps", "ns", None),
                "{verb}"
            );
            assert!(allowed(&rules, verb, CORE, "configmaps", "ns", Some("m")));
        }
        assert!(allowed(&rules, "get", CORE, "secrets", "ns", Some("c")));
        for name in ["a", "b", "d"] {
            assert!(!allowed(&rules, "get", CORE, "secrets", "ns", Some(name)));
        }
        assert!(!allowed(&rules, "list", CORE, "secrets", "other", None));
    }

    #[test]
    fn sync_creates_events_only_with_a_pod_name() {
        let Command::Sync(args) = command(&[
            "sync",
            "--server=https://127.0.0.1:6443",
            "--namespace=ns",
            "--destination-dir=/d",
            "--secrets=a",
            "--pod-name=pod",
        ]) else {
            unreachable!()
        };
        let rules = sync_access(&args.settings().unwrap());
        assert!(allowed(&rules, "create", CORE, "events", "ns", None));
    }

    #[test]
    fn sync_refuses_what_the_subcommand_refuses() {
        let Command::Sync(args) = command(&[
            "sync",
            "--server=https://127.0.0.1:6443",
            "--namespace=ns",
            "--destination-dir=/d",
            "--secrets=../etc",
        ]) else {
            unreachable!()
        };
        assert!(args.settings().unwrap_err().0.contains("../etc"));
    }

    #[test]
    fn regenerate_writes_its_objects_creates_per_namespace_and_holds_its_lease() {
        let rotation = crate::regenerate::config::parse(
            r#"
namespace: ns
signers:
  - { name: signer, namespace: operator, validity: 30d, refresh: 15d }
bundles:
  - { name: ca, namespace: managed, signers: [signer] }
targets:
  - { name: cert, signer: signer, serving: { hostnames: [localhost] }, validity: 1d, refresh: 12h }
"#,
        )
        .unwrap();
        let Command::Regenerate(args) = command(&[
            "regenerate",
            "--server=https://127.0.0.1:6443",
            "--config=/c.yaml",
            "--pod-name=p",
            "--pod-namespace=ns",
            "--leader-elect",
        ]) else {
            unreachable!()
        };
        let rules = regenerate_access(&args.settings().unwrap(), &rotation);
        let Command::Regenerate(once) = command(&[
            "regenerate",
            "--server=https://127.0.0.1:6443",
            "--config=/c.yaml",
            "--once",
        ]) else {
            unreachable!()
        };
        let once = regenerate_access(&once.settings().unwrap(), &rotation);
        for (resource, ns, name) in [
            ("secrets", "operator", "signer"),
            ("configmaps", "managed", "ca"),
            ("secrets", "ns", "cert"),
        ] {
            assert!(allowed(&rules, "update", CORE, resource, ns, Some(name)));
            // No GET per object...
            assert!(!allowed(&rules, "get", CORE, resource, ns, Some(name)));
            // ...except with --once, which has no watch.
            for verb in ["get", "update"] {
                assert!(allowed(&once, verb, CORE, resource, ns, Some(name)));
            }
            assert!(!allowed(&once, "list", CORE, resource, ns, None));
            // The cache's watch of each object, by name: never the whole namespace (its
            // other Secrets may be anyone's keys).
            for verb in ["list", "watch"] {
                assert!(
                    allowed(&rules, verb, CORE, resource, ns, Some(name)),
                    "{verb} {ns}/{name}"
                );
                assert!(
                    !allowed(&rules, verb, CORE, resource, ns, None),
                    "a namespace-wide {verb} in {ns}"
                );
                assert!(
                    !allowed(&rules, verb, CORE, resource, ns, Some("someone-elses")),
                    "{verb} {ns}/someone-elses"
                );
            }
            assert!(allowed(&rules, "create", CORE, resource, ns, None));
            assert!(!allowed(&rules, "delete", CORE, resource, ns, Some(name)));
        }
        assert!(!allowed(
            &rules,
            "update",
            CORE,
            "secrets",
            "operator",
            Some("cert")
        ));
        assert!(!allowed(
            &rules,
            "create",
            CORE,
            "configmaps",
            "operator",
            None
        ));
        // Above --namespace-watch-threshold: one namespace-wide list+watch per kind, as sync.
        let Command::Regenerate(wide) = command(&[
            "regenerate",
            "--server=https://127.0.0.1:6443",
            "--config=/c.yaml",
            "--namespace-watch-threshold=0",
        ]) else {
            unreachable!()
        };
        let wide = regenerate_access(&wide.settings().unwrap(), &rotation);
        for (resource, ns) in [
            ("secrets", "operator"),
            ("configmaps", "managed"),
            ("secrets", "ns"),
        ] {
            for verb in ["list", "watch"] {
                assert!(
                    allowed(&wide, verb, CORE, resource, ns, None),
                    "{verb} {ns}"
                );
            }
        }
        assert!(!allowed(&wide, "list", CORE, "secrets", "managed", None));
        // No read where nothing of that kind is declared.
        assert!(!allowed(
            &rules,
            "list",
            CORE,
            "configmaps",
            "operator",
            None
        ));
        assert!(!allowed(&rules, "watch", CORE, "secrets", "managed", None));
        assert!(allowed(&rules, "create", CORE, "events", "ns", None));
        let lease = "cert-regeneration-controller-lock";
        assert!(allowed(
            &rules,
            "update",
            COORDINATION,
            "leases",
            "ns",
            Some(lease)
        ));
        assert!(allowed(
            &rules,
            "create",
            COORDINATION,
            "leases",
            "ns",
            None
        ));
        assert!(!allowed(
            &rules,
            "update",
            COORDINATION,
            "leases",
            "ns",
            Some("other")
        ));
    }
}
