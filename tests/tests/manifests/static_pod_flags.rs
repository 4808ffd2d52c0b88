//! The static pod's flags against upstream: the sync sidecar mirrors exactly OpenShift's
//! `CertConfigMaps` / `CertSecrets`; every certificate file the real kube-apiserver container
//! names is one that `sync` writes (a key of a required object it mirrors) or a documented file
//! of the revisioned resource dir; and, where the envtest kube-apiserver is available, that
//! binary accepts every flag the pod passes it; the regeneration sidecar's service IP is host 1
//! of kube-apiserver's service range. (tests/tests/manifests/access.rs runs the sidecars with
//! these flags and checks that the files exist in the cert dir `sync` wrote.)

use std::collections::{BTreeMap, BTreeSet};

use cert_syncer::cli::Command;
use cert_syncer::kind::Kind;
use e2e::manifests::{
    self, POD, REGENERATE_CONTAINER, SERVER_CONTAINER, SYNC_CONTAINER, argv, container, flag,
    node_file,
};

/// openshift/cluster-kube-apiserver-operator `pkg/operator/starter.go`, `CertConfigMaps`
/// (name, optional), in its order. Identical on release-4.9 through release-4.19 and on main
/// (c813e820bb94cf2af88a6343c8554624c334c04c).
const UPSTREAM_CERT_CONFIG_MAPS: &[(&str, bool)] = &[
    ("aggregator-client-ca", false),
    ("client-ca", false),
    // "this is a copy of trusted-ca-bundle CM without the injection annotations"
    ("trusted-ca-bundle", true),
    // "kubeconfig that is a system:master.  this ensures a stable location"
    ("control-plane-node-kubeconfig", false),
    // "kubeconfig for check-endpoints"
    ("check-endpoints-kubeconfig", false),
];

/// The same file, `CertSecrets` (name, optional), in its order.
const UPSTREAM_CERT_SECRETS: &[(&str, bool)] = &[
    ("aggregator-client", false),
    ("localhost-serving-cert-certkey", false),
    ("service-network-serving-certkey", false),
    ("external-loadbalancer-serving-certkey", false),
    ("internal-loadbalancer-serving-certkey", false),
    ("bound-service-account-signing-key", false),
    ("control-plane-node-admin-client-cert-key", false),
    ("check-endpoints-client-cert-key", false),
    ("kubelet-client", false),
    ("node-kubeconfigs", false),
    ("user-serving-cert", true),
    ("user-serving-cert-000", true),
    ("user-serving-cert-001", true),
    ("user-serving-cert-002", true),
    ("user-serving-cert-003", true),
    ("user-serving-cert-004", true),
    ("user-serving-cert-005", true),
    ("user-serving-cert-006", true),
    ("user-serving-cert-007", true),
    ("user-serving-cert-008", true),
    ("user-serving-cert-009", true),
];

/// Keys of `bound-service-account-signing-key`, which no certificate rotation writes:
/// `pkg/operator/boundsatokensignercontroller/controller.go` `PrivateKeyKey`, `PublicKeyKey`.
const UPSTREAM_SA_KEY_KEYS: [&str; 2] = ["service-account.key", "service-account.pub"];

const CERT_DIR: &str = "/etc/kubernetes/static-pod-certs/";
const RESOURCE_DIR: &str = "/etc/kubernetes/static-pod-resources/";

fn sync_args() -> cert_syncer::cli::SyncArgs {
    let pod = manifests::pod();
    let c = container(&pod, SYNC_CONTAINER);
    let cli = manifests::parse_cert_syncer(&argv(&pod, c), &manifests::environment(&pod, c))
        .expect("the sync sidecar's flags parse");
    let Command::Sync(args) = cli.command else {
        panic!("{SYNC_CONTAINER} runs `sync`")
    };
    args
}

fn names(list: &[(&str, bool)], optional: bool) -> Vec<String> {
    list.iter()
        .filter(|(_, o)| *o == optional)
        .map(|(n, _)| (*n).to_owned())
        .collect()
}

#[test]
fn the_sync_lists_are_upstreams_cert_config_maps_and_cert_secrets() {
    let sync = sync_args();
    assert_eq!(sync.namespace, "openshift-kube-apiserver");
    assert_eq!(
        sync.destination_dir.display().to_string(),
        CERT_DIR.trim_end_matches('/')
    );
    // Exactly, and in upstream's order (so a diff against starter.go reads line by line).
    assert_eq!(sync.configmaps, names(UPSTREAM_CERT_CONFIG_MAPS, false));
    assert_eq!(
        sync.optional_configmaps,
        names(UPSTREAM_CERT_CONFIG_MAPS, true)
    );
    assert_eq!(sync.secrets, names(UPSTREAM_CERT_SECRETS, false));
    assert_eq!(sync.optional_secrets, names(UPSTREAM_CERT_SECRETS, true));
    assert!(
        sync.files.is_empty(),
        "no --file mappings: {:?}",
        sync.files
    );
}

/// The keys `sync` writes for each required object the server may read: the certificate
/// objects from what the pod's regeneration profile writes (Secrets `tls.crt`/`tls.key`,
/// ConfigMaps `ca-bundle.crt`), and the service-account key pair from upstream.
fn keys_written_by_sync() -> BTreeMap<(Kind, String), BTreeSet<&'static str>> {
    let pod = manifests::pod();
    let c = container(&pod, REGENERATE_CONTAINER);
    let cli = manifests::parse_cert_syncer(&argv(&pod, c), &manifests::environment(&pod, c))
        .expect("the regenerate sidecar's flags parse");
    let Command::Regenerate(regen) = cli.command else {
        panic!("{REGENERATE_CONTAINER} runs `regenerate`")
    };
    let rotation =
        cert_syncer::regenerate::profile_objects(regen.profile.expect("--profile").into())
            .expect("the built-in profile");
    let sync = sync_args();
    let mut keys = BTreeMap::new();
    for (kind, object) in rotation.written() {
        if object.namespace != sync.namespace {
            continue;
        }
        let written: BTreeSet<&str> = match kind {
            Kind::Secret => ["tls.crt", "tls.key"].into(),
            Kind::ConfigMap => ["ca-bundle.crt"].into(),
        };
        keys.insert((kind, object.name.clone()), written);
    }
    keys.insert(
        (Kind::Secret, "bound-service-account-signing-key".to_owned()),
        UPSTREAM_SA_KEY_KEYS.into(),
    );
    // Only what sync mirrors as required (an optional object may be absent, and the server
    // would not start without the file).
    keys.retain(|(kind, name), _| match kind {
        Kind::Secret => sync.secrets.contains(name),
        Kind::ConfigMap => sync.configmaps.contains(name),
    });
    keys
}

#[test]
fn every_certificate_file_of_kube_apiserver_is_synced_or_revisioned() {
    let pod = manifests::pod();
    let server = container(&pod, SERVER_CONTAINER);
    let args = argv(&pod, server);
    assert!(args[0].ends_with("/kube-apiserver"), "{args:?}");
    let readme =
        std::fs::read_to_string(manifests::dir().join("README.md")).expect("manifests/README.md");
    let keys = keys_written_by_sync();
    let (mut synced, mut revisioned) = (BTreeSet::new(), BTreeSet::new());
    for path in args
        .iter()
        .skip(1)
        .flat_map(|a| a.split(['=', ',']))
        .filter(|w| w.starts_with('/'))
    {
        if let Some(rest) = path.strip_prefix(CERT_DIR) {
            let parts: Vec<&str> = rest.split('/').collect();
            let [dir, name, key] = parts[..] else {
                panic!("{path}: not <kind>/<name>/<key>")
            };
            let kind = match dir {
                "secrets" => Kind::Secret,
                "configmaps" => Kind::ConfigMap,
                other => panic!("{path}: {other} is neither secrets nor configmaps"),
            };
            let written = keys.get(&(kind, name.to_owned())).unwrap_or_else(|| {
                panic!("kube-apiserver reads {path}, but {dir}/{name} is not a required object sync writes")
            });
            assert!(
                written.contains(key),
                "{path}: {dir}/{name} has keys {written:?}"
            );
            synced.insert(path.to_owned());
        } else if path.starts_with(RESOURCE_DIR) {
            let (host, repo) = node_file(&pod, server, path)
                .unwrap_or_else(|| panic!("{path} is on no hostPath mount of the server"));
            assert!(
                repo.is_file() || readme.contains(&host),
                "{path} (node file {host}) is not documented in manifests/README.md"
            );
            revisioned.insert(path.to_owned());
        } else {
            panic!("kube-apiserver reads {path}, in neither the cert dir nor the resource dir");
        }
    }

    // OpenShift's placement (defaultconfig.yaml, config-overrides.yaml, observe_apiserver.go).
    // Every file checked by name here is collected, to compare with every file the pod names.
    let named = std::cell::RefCell::new(BTreeSet::new());
    let expect = |name: &str, path: &str| {
        assert_eq!(flag(&args, name), Some(path), "--{name}");
        if path.starts_with('/') {
            named.borrow_mut().insert(path.to_owned());
        }
    };
    let secret = |name: &str, key: &str| format!("{CERT_DIR}secrets/{name}/{key}");
    let bundle = |name: &str| format!("{CERT_DIR}configmaps/{name}/ca-bundle.crt");
    expect(
        "tls-cert-file",
        &secret("service-network-serving-certkey", "tls.crt"),
    );
    expect(
        "tls-private-key-file",
        &secret("service-network-serving-certkey", "tls.key"),
    );
    expect("client-ca-file", &bundle("client-ca"));
    expect(
        "requestheader-client-ca-file",
        &bundle("aggregator-client-ca"),
    );
    expect(
        "kubelet-client-certificate",
        &secret("kubelet-client", "tls.crt"),
    );
    expect("kubelet-client-key", &secret("kubelet-client", "tls.key"));
    expect(
        "proxy-client-cert-file",
        &secret("aggregator-client", "tls.crt"),
    );
    expect(
        "proxy-client-key-file",
        &secret("aggregator-client", "tls.key"),
    );
    expect(
        "service-account-signing-key-file",
        &secret("bound-service-account-signing-key", "service-account.key"),
    );
    expect(
        "service-account-key-file",
        &secret("bound-service-account-signing-key", "service-account.pub"),
    );
    expect("service-account-issuer", "https://kubernetes.default.svc");
    let sni: Vec<&str> = args
        .iter()
        .filter_map(|a| a.strip_prefix("--tls-sni-cert-key="))
        .collect();
    let pair =
        |dir: &str, name: &str| format!("{dir}secrets/{name}/tls.crt,{dir}secrets/{name}/tls.key");
    let pairs = [
        pair(CERT_DIR, "localhost-serving-cert-certkey"),
        pair(CERT_DIR, "service-network-serving-certkey"),
        pair(CERT_DIR, "external-loadbalancer-serving-certkey"),
        pair(CERT_DIR, "internal-loadbalancer-serving-certkey"),
        pair(RESOURCE_DIR, "localhost-recovery-serving-certkey"),
    ];
    assert_eq!(sni, pairs);
    named
        .borrow_mut()
        .extend(pairs.iter().flat_map(|p| p.split(',')).map(str::to_owned));
    assert_eq!(flag(&args, "etcd-servers"), Some("https://localhost:2379"));
    for (name, file) in [
        ("etcd-cafile", "configmaps/etcd-serving-ca/ca-bundle.crt"),
        ("etcd-certfile", "secrets/etcd-client/tls.crt"),
        ("etcd-keyfile", "secrets/etcd-client/tls.key"),
    ] {
        expect(name, &format!("{RESOURCE_DIR}{file}"));
    }
    // No file the pod names escapes the checks by name above, and each of those is one the
    // pod names (a count written here would go stale with the pod).
    let found: BTreeSet<String> = synced.union(&revisioned).cloned().collect();
    assert_eq!(found, named.into_inner());
}

#[test]
fn the_check_refuses_a_file_sync_does_not_write() {
    // An optional object, or a key its object does not hold, is caught.
    let keys = keys_written_by_sync();
    assert!(!keys.contains_key(&(Kind::Secret, "user-serving-cert".to_owned())));
    assert!(!keys.contains_key(&(Kind::ConfigMap, "trusted-ca-bundle".to_owned())));
    let kubelet = &keys[&(Kind::Secret, "kubelet-client".to_owned())];
    assert!(!kubelet.contains("ca.crt"));
}

#[test]
fn kube_apiserver_accepts_every_flag_of_the_pod() {
    let assets = match e2e::envtest::assets() {
        Ok(dir) => dir,
        Err(reason) => {
            eprintln!("SKIP: {reason}");
            return;
        }
    };
    let pod = manifests::pod();
    let args = argv(&pod, container(&pod, SERVER_CONTAINER));
    let binary = assets.join("kube-apiserver");
    // Flags are parsed before `--help` is acted on: an unknown flag or a bad value of a typed
    // flag fails here; nothing is started.
    let run = |args: &[String]| {
        std::process::Command::new(&binary)
            .args(args)
            .arg("--help")
            .output()
            .unwrap_or_else(|err| panic!("{}: {err}", binary.display()))
    };
    let output = run(&args[1..]);
    assert!(
        output.status.success(),
        "kube-apiserver v1.20.2 refuses the pod's flags ({POD}):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The check means something: a misspelled flag fails.
    let mut wrong = args[1..].to_vec();
    wrong.push("--tls-sni-cert-keys=/a,/b".to_owned());
    let output = run(&wrong);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("tls-sni-cert-keys"));
}

#[test]
fn the_regeneration_sidecar_names_the_first_ip_of_kube_apiserver_s_service_range() {
    // The pod says its service network twice, once per container: a cluster without
    // networks.config.openshift.io has only these flags, and the two must agree.
    let pod = manifests::pod();
    let server = argv(&pod, container(&pod, SERVER_CONTAINER));
    let range = flag(&server, "service-cluster-ip-range").expect("--service-cluster-ip-range");
    let (network, prefix) = range.split_once('/').expect("a CIDR");
    let network: std::net::Ipv4Addr = network.parse().expect("an IPv4 network");
    let mask = u32::MAX << (32 - prefix.parse::<u32>().expect("a prefix length"));
    let first = std::net::Ipv4Addr::from((u32::from(network) & mask) + 1);
    let regenerate = argv(&pod, container(&pod, REGENERATE_CONTAINER));
    assert_eq!(
        flag(&regenerate, "service-network-ip"),
        Some(first.to_string().as_str()),
        "{REGENERATE_CONTAINER}'s --service-network-ip is host 1 of kube-apiserver's {range}"
    );
    for name in ["api-hostname", "api-int-hostname"] {
        assert!(
            flag(&regenerate, name).is_some(),
            "{REGENERATE_CONTAINER} names its --{name}"
        );
    }
}

/// openshift/cluster-kube-scheduler-operator `pkg/operator/starter.go`, `CertConfigMaps` (none)
/// and `CertSecrets` (name, optional): what its `cert-syncer` container
/// (`certsyncpod.NewCertSyncControllerCommand(operator.CertConfigMaps, operator.CertSecrets)`,
/// `cmd/cluster-kube-scheduler-operator/main.go`) mirrors for the scheduler. Identical on
/// release-4.14 (0ae603324e89e65037136d7623e4dd2fd223faf9) through release-5.0 and release-5.1
/// (56fa325466a1f2a2d41435ba3a58b2bf8fdab2f3).
const UPSTREAM_SCHEDULER_CERT_CONFIG_MAPS: &[(&str, bool)] = &[];
/// The same file, `CertSecrets`.
const UPSTREAM_SCHEDULER_CERT_SECRETS: &[(&str, bool)] =
    &[("kube-scheduler-client-cert-key", false)];

/// The kube-scheduler pod (manifests/static-pod-ks).
const SCHEDULER_POD: &str = "static-pod-ks/kube-scheduler-pod.yaml";

fn scheduler_pod() -> k8s_openapi::api::core::v1::Pod {
    let path = manifests::dir().join(SCHEDULER_POD);
    let docs = manifests::documents(&path);
    manifests::typed(&docs[0], SCHEDULER_POD)
}

#[test]
fn the_scheduler_sync_lists_are_upstreams_and_hold_the_scheduler_s_client_pair() {
    let pod = scheduler_pod();
    let c = container(&pod, "kube-scheduler-cert-syncer");
    let cli = manifests::parse_cert_syncer(&argv(&pod, c), &manifests::environment(&pod, c))
        .expect("the scheduler sync sidecar's flags parse");
    let Command::Sync(sync) = cli.command else {
        panic!("kube-scheduler-cert-syncer runs `sync`")
    };
    assert_eq!(sync.namespace, "openshift-kube-scheduler");
    assert_eq!(
        sync.destination_dir.display().to_string(),
        CERT_DIR.trim_end_matches('/')
    );
    assert_eq!(
        sync.configmaps,
        names(UPSTREAM_SCHEDULER_CERT_CONFIG_MAPS, false)
    );
    assert_eq!(
        sync.optional_configmaps,
        names(UPSTREAM_SCHEDULER_CERT_CONFIG_MAPS, true)
    );
    assert_eq!(sync.secrets, names(UPSTREAM_SCHEDULER_CERT_SECRETS, false));
    assert_eq!(
        sync.optional_secrets,
        names(UPSTREAM_SCHEDULER_CERT_SECRETS, true)
    );
    assert!(sync.files.is_empty(), "{:?}", sync.files);

    // The scheduler's kubeconfig names the pair `sync` writes for that Secret (a target of the
    // kube-apiserver's profile: `tls.crt`, `tls.key`), in the cert dir.
    let server = container(&pod, "kube-scheduler");
    let server_argv = argv(&pod, server);
    let kubeconfig = flag(&server_argv, "authentication-kubeconfig").expect("a kubeconfig");
    let (_, repo) = node_file(&pod, server, kubeconfig).expect("on the resource dir");
    let text = std::fs::read_to_string(&repo).unwrap();
    let parsed: serde_json::Value = serde_norway::from_str(&text).unwrap();
    let user = &parsed["users"][0]["user"];
    let mut named = BTreeSet::new();
    for field in ["client-certificate", "client-key"] {
        let path = user[field].as_str().unwrap_or_else(|| panic!("{field}"));
        let rest = path
            .strip_prefix(CERT_DIR)
            .unwrap_or_else(|| panic!("{path} is not in the cert dir"));
        let mut parts = rest.split('/');
        let (kind, name, key) = (parts.next(), parts.next(), parts.next());
        assert_eq!(kind, Some("secrets"), "{path}");
        assert!(
            sync.secrets.iter().any(|s| Some(s.as_str()) == name),
            "{path}"
        );
        named.insert(key.unwrap().to_owned());
    }
    assert_eq!(
        named,
        BTreeSet::from(["tls.crt".to_owned(), "tls.key".to_owned()])
    );
    let rotation = cert_syncer::regenerate::profile_objects(
        cert_syncer::regenerate::Profile::OpenshiftKubeApiserver,
    )
    .unwrap();
    assert!(
        rotation
            .targets
            .iter()
            .any(|t| t.object.name == "kube-scheduler-client-cert-key"),
        "the kube-apiserver's profile issues the scheduler's client certificate"
    );
}

#[test]
fn kube_scheduler_accepts_every_flag_and_the_config_of_the_pod() {
    let assets = match e2e::node::assets() {
        Ok(dir) => dir,
        Err(reason) => {
            eprintln!("SKIP: {reason}");
            return;
        }
    };
    let binary = assets.join("kube-scheduler");
    let pod = scheduler_pod();
    let server = container(&pod, "kube-scheduler");
    let args = argv(&pod, server);
    let run = |args: &[String]| {
        std::process::Command::new(&binary)
            .args(args)
            .output()
            .unwrap_or_else(|err| panic!("{}: {err}", binary.display()))
    };
    // Flags are parsed before `--help` is acted on.
    let with_help = |args: &[String]| {
        let mut all = args.to_vec();
        all.push("--help".to_owned());
        run(&all)
    };
    let output = with_help(&args[1..]);
    assert!(
        output.status.success(),
        "kube-scheduler v1.20.2 refuses the pod's flags ({SCHEDULER_POD}):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut wrong = args[1..].to_vec();
    wrong.push("--kube-config=/x".to_owned());
    assert!(!with_help(&wrong).status.success());

    // The config file loads and validates (`--write-config-to` loads, defaults and validates
    // it, then exits), with its kubeconfig pointed at one that needs no files.
    let tmp = tempfile::tempdir().unwrap();
    let config = flag(&args, "config").expect("--config");
    let (_, repo) = node_file(&pod, server, config).expect("on the resource dir");
    let mut parsed: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(&repo).unwrap()).unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n\
         users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .unwrap();
    parsed["clientConnection"]["kubeconfig"] = kubeconfig.display().to_string().into();
    let copy = tmp.path().join("config.yaml");
    std::fs::write(&copy, serde_json::to_string(&parsed).unwrap()).unwrap();
    let written = tmp.path().join("written.yaml");
    let output = run(&[
        format!("--config={}", copy.display()),
        format!("--cert-dir={}", tmp.path().join("certs").display()),
        format!("--write-config-to={}", written.display()),
    ]);
    assert!(
        output.status.success() && written.is_file(),
        "kube-scheduler v1.20.2 refuses the pod's config {}:\n{}",
        repo.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let effective: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(&written).unwrap()).unwrap();
    assert_eq!(
        effective["leaderElection"]["resourceNamespace"],
        "openshift-kube-scheduler"
    );
    assert_eq!(effective["healthzBindAddress"], "127.0.0.1:10251");
}
