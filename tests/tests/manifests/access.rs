//! The access lists are the truth: real runs of `cert-syncer sync`, `regenerate`,
//! `inspect --namespace` and `restart-on-change` against an audited apiserver (`mini-apiserver --audit-log`, and the
//! real kube-apiserver's audit log, where RBAC is enforced: there each run gets exactly its
//! access list as Roles, and the static pod's sidecars exactly the Roles of `manifests/`), and
//! every request they made
//! (verb, group, resource, namespace, name as kube-apiserver's authorizer sees them) is allowed by
//! `cert_syncer::access::required_access` for the same flags — and every verb the list grants
//! was used. Then the static pod's own sidecars, with the pod's flags, kubeconfig templates and
//! example config, make only requests that the RBAC in `manifests/` allows, and leave in the
//! cert dir every file the pod's kube-apiserver container reads.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use cert_syncer::access::{Access, Request, required_access};
use cert_syncer::cli::Cli;
use clap::Parser;
use e2e::apiserver::ADMIN_TOKEN;
use e2e::envtest::User;
use e2e::manifests::{self, REGENERATE_CONTAINER, SYNC_CONTAINER};
use e2e::syncer::{NS, bundle_config_map, read, tls_secret};
use e2e::{
    ApiOptions, Backend, Ca, CertSpec, ChildProcess, SyncerSpec, TestApi, bin_path, both_backends,
    install_crypto_provider, rbac,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::Kubeconfig;
use mini_apiserver::audit::Record;
use testkit::files::rename_into;
use time::OffsetDateTime;

/// The flags of `command`, parsed as cert-syncer parses them.
fn cli_of(command: &Command) -> Cli {
    let argv = std::iter::once("cert-syncer".to_owned()).chain(
        command
            .get_args()
            .map(|a| a.to_str().expect("UTF-8 flags").to_owned()),
    );
    Cli::try_parse_from(argv).expect("the flags the test runs cert-syncer with")
}

/// The audit records of `user`, after the run.
fn requests_of(api: &TestApi, user: &str) -> Vec<Record> {
    let records: Vec<Record> = api
        .audit_records()
        .into_iter()
        .filter(|r| r.user == user)
        .collect();
    assert!(!records.is_empty(), "no request of {user} in the audit log");
    records
}

/// An audited apiserver of `backend` with `users` in its token file and `namespaces`.
async fn audited(backend: Backend, dir: &Path, users: Vec<User>, namespaces: &[&str]) -> TestApi {
    let options = ApiOptions {
        audit: true,
        users,
        namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
        ..ApiOptions::default()
    };
    TestApi::start(backend, dir, &options).await
}

/// On the real apiserver (which enforces RBAC), grants `user` exactly `list`; mini does not
/// enforce RBAC, so there is nothing to do.
async fn grant_on_real(api: &TestApi, user: &str, list: &[Access]) {
    if api.backend == Backend::Real {
        let admin = api.client_with_token(ADMIN_TOKEN);
        rbac::grant(&admin, user, "e2e-access-list", list).await;
    }
}

both_backends!(
    every_request_of_a_sync_run_is_in_its_access_list,
    every_request_of_a_namespace_wide_sync_run_is_in_its_access_list,
    every_request_of_a_regenerate_run_is_in_its_access_list,
    every_request_of_an_inspect_run_is_in_its_access_list,
    every_request_of_a_restart_on_change_run_is_in_its_access_list,
    the_static_pod_sidecars_make_only_requests_their_rbac_allows,
);

fn label(r: &Record) -> String {
    format!(
        "{} {}/{} {}/{} ({})",
        r.verb,
        r.api_group,
        r.resource,
        r.namespace.as_deref().unwrap_or("*"),
        r.name.as_deref().unwrap_or("-"),
        r.code
    )
}

/// Every request is allowed by the list, and every (namespace, group, resource, verb) the
/// list grants was used.
fn assert_list_is_the_truth(list: &[Access], records: &[Record]) {
    for r in records {
        let namespace = r
            .namespace
            .as_deref()
            .unwrap_or_else(|| panic!("a cluster-wide request: {}", label(r)));
        let request = Request::new(
            &r.verb,
            &r.api_group,
            &r.resource,
            namespace,
            r.name.as_deref(),
        );
        assert!(
            list.iter().any(|a| a.allows(&request)),
            "request {} is not in the access list:\n{list:#?}",
            label(r)
        );
        assert!(r.code != 401 && r.code != 403, "refused: {}", label(r));
    }
    let used: BTreeSet<(String, String, String, String)> = records
        .iter()
        .map(|r| {
            (
                r.namespace.clone().unwrap_or_default(),
                r.api_group.clone(),
                r.resource.clone(),
                r.verb.clone(),
            )
        })
        .collect();
    for access in list {
        for verb in &access.verbs {
            let key = (
                access.namespace.clone(),
                access.api_group.to_owned(),
                access.resource.to_owned(),
                (*verb).to_owned(),
            );
            assert!(
                used.contains(&key),
                "the list grants {verb} on {}/{} in {} but the run never used it; requests:\n{}",
                access.api_group,
                access.resource,
                access.namespace,
                records.iter().map(label).collect::<Vec<_>>().join("\n")
            );
        }
    }
}

async fn every_request_of_a_sync_run_is_in_its_access_list(backend: Backend) {
    let (list, records) = audited_sync_run(backend, &[]).await;
    assert_list_is_the_truth(&list, &records);
    // Per object too: each followed object was listed and watched by name, and read with a GET
    // only to confirm a removal (b and d: the optional objects deleted during the run), as in
    // the namespace-wide mode: a watch event already holds the whole object.
    for name in ["a", "b", "c", "d", "e"] {
        for verb in ["list", "watch"] {
            assert!(
                records
                    .iter()
                    .any(|r| r.verb == verb && r.name.as_deref() == Some(name)),
                "no {verb} of {name}"
            );
        }
    }
    let mut got: Vec<&str> = records
        .iter()
        .filter(|r| r.verb == "get")
        .filter_map(|r| r.name.as_deref())
        .collect();
    got.sort();
    got.dedup();
    assert_eq!(got, ["b", "d"], "GETs only to confirm a removal");
}

/// Above `--namespace-watch-threshold` (0 here): one namespace-wide list and watch per kind,
/// GETs only to confirm a removal.
async fn every_request_of_a_namespace_wide_sync_run_is_in_its_access_list(backend: Backend) {
    let (list, records) = audited_sync_run(backend, &["--namespace-watch-threshold=0"]).await;
    assert_list_is_the_truth(&list, &records);
    for resource in ["secrets", "configmaps"] {
        for verb in ["list", "watch"] {
            assert!(
                records
                    .iter()
                    .any(|r| r.verb == verb && r.resource == resource && r.name.is_none()),
                "no namespace-wide {verb} of {resource}"
            );
        }
    }
    let gets: Vec<String> = records
        .iter()
        .filter(|r| r.verb == "get")
        .map(label)
        .collect();
    // b and d: the optional objects deleted during the run.
    assert_eq!(gets.len(), 2, "{gets:?}");
}

/// A sync run (with `extra` flags) against an audited apiserver: its access list and the
/// requests it made.
async fn audited_sync_run(backend: Backend, extra: &[&str]) -> (Vec<Access>, Vec<Record>) {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = audited(backend, tmp.path(), Vec::new(), &[]).await;
    let admin = api.client_with_token(ADMIN_TOKEN);
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(admin, NS);
    let ca = Ca::default();
    let (cert, key, _) = ca.localhost_leaf();
    let post = PostParams::default();
    secrets
        .create(&post, &tls_secret("a", &cert, &key))
        .await
        .unwrap();
    secrets
        .create(&post, &tls_secret("e", &cert, &key))
        .await
        .unwrap();
    config_maps
        .create(&post, &bundle_config_map("c", &ca.cert_pem))
        .await
        .unwrap();

    // The syncer authenticates as its own user (`cert-syncer` in the token file).
    let token = tmp.path().join("syncer-token");
    rename_into(&token, b"syncer-token");
    let dest = tmp.path().join("certs");
    let host_ca = tmp.path().join("host/ca.crt");
    let host_cert = tmp.path().join("host/e.crt");
    std::fs::create_dir_all(host_ca.parent().unwrap()).unwrap();
    let files = [
        format!("--file=configmap/c/ca-bundle.crt={}", host_ca.display()),
        // An object named only by --file is followed too.
        format!("--file=secret/e/tls.crt={}", host_cert.display()),
    ];
    let mut flags = vec![
        "--secrets=a",
        "--optional-secrets=b",
        "--configmaps=c",
        "--optional-configmaps=d",
        &files[0],
        &files[1],
        "--pod-name=syncer-pod",
    ];
    flags.extend_from_slice(extra);
    let mut spec = SyncerSpec::new(&api, &dest, &flags);
    spec.token_file = token;
    let command = spec.command();
    let list = required_access(&cli_of(&command).command).unwrap();
    grant_on_real(&api, "cert-syncer", &list).await;
    let mut syncer = ChildProcess::start(command);

    let timeout = Duration::from_secs(20);
    e2e::wait_until("the files", timeout, || async {
        read(&dest.join("secrets/a/tls.crt")).is_some()
            && read(&host_ca).as_deref() == Some(ca.cert_pem.as_str())
            && read(&host_cert).as_deref() == Some(cert.as_str())
    })
    .await;
    secrets
        .create(&post, &tls_secret("b", &cert, &key))
        .await
        .unwrap();
    e2e::wait_until("the optional Secret", timeout, || async {
        dest.join("secrets/b/tls.crt").exists()
    })
    .await;
    secrets.delete("b", &DeleteParams::default()).await.unwrap();
    e2e::wait_until("its removal", timeout, || async {
        !dest.join("secrets/b").exists()
    })
    .await;
    config_maps
        .create(&post, &bundle_config_map("d", &ca.cert_pem))
        .await
        .unwrap();
    e2e::wait_until("the optional ConfigMap", timeout, || async {
        dest.join("configmaps/d/ca-bundle.crt").exists()
    })
    .await;
    config_maps
        .delete("d", &DeleteParams::default())
        .await
        .unwrap();
    e2e::wait_until("its removal", timeout, || async {
        !dest.join("configmaps/d").exists()
    })
    .await;
    let (cert2, key2, _) = ca.localhost_leaf();
    secrets
        .replace("a", &post, &{
            let mut a = secrets.get("a").await.unwrap();
            a.data = tls_secret("a", &cert2, &key2).data;
            a
        })
        .await
        .unwrap();
    e2e::wait_until("the update", timeout, || async {
        read(&dest.join("secrets/a/tls.crt")).as_deref() == Some(cert2.as_str())
    })
    .await;
    assert!(
        syncer
            .terminate(Duration::from_secs(10))
            .is_some_and(|s| s.success())
    );

    (list, requests_of(&api, "cert-syncer"))
}

const ROTATION: &str = r#"
namespace: pods
signers:
  - { name: old-signer, namespace: operator, validity: 30d, refresh: 15d }
  - { name: new-signer, namespace: operator, validity: 30d, refresh: 15d }
bundles:
  - { name: old-ca, namespace: managed, signers: [old-signer] }
  - { name: new-ca, namespace: managed, signers: [new-signer] }
targets:
  - { name: old-cert, signer: old-signer, serving: { hostnames: [localhost] }, validity: 10d, refresh: 5d }
  - { name: new-cert, signer: new-signer, client: { user: someone }, validity: 10d, refresh: 5d }
"#;

async fn every_request_of_a_regenerate_run_is_in_its_access_list(backend: Backend) {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = audited(
        backend,
        tmp.path(),
        vec![User::new("regenerate-token", "regenerator", &[])],
        &["operator", "managed", "pods"],
    )
    .await;
    // Expired material (update) next to missing material (create), in three namespaces.
    let admin = api.client_with_token(ADMIN_TOKEN);
    let post = PostParams::default();
    let now = OffsetDateTime::now_utc();
    let old = Ca::with_validity(
        now - time::Duration::days(40),
        now - time::Duration::days(1),
    );
    let leaf = old.issue(&CertSpec::server(&["localhost"]).valid(
        now - time::Duration::days(20),
        now - time::Duration::days(2),
    ));
    Api::<Secret>::namespaced(admin.clone(), "operator")
        .create(
            &post,
            &tls_secret("old-signer", &old.cert_pem, &old.key_pem()),
        )
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), "managed")
        .create(&post, &bundle_config_map("old-ca", &old.cert_pem))
        .await
        .unwrap();
    Api::<Secret>::namespaced(admin, "pods")
        .create(
            &post,
            &tls_secret("old-cert", &leaf.cert_pem, &leaf.key_pem),
        )
        .await
        .unwrap();

    let config = tmp.path().join("rotation.yaml");
    rename_into(&config, ROTATION.as_bytes());
    let token = tmp.path().join("regenerate-token");
    rename_into(&token, b"regenerate-token");
    let mut command = connected("regenerate", &api, &token);
    command
        .arg(format!("--config={}", config.display()))
        .args([
            "--pod-name=regenerate-pod",
            "--pod-namespace=pods",
            "--leader-elect",
            "--leader-elect-lease-duration=2s",
            "--leader-elect-renew-deadline=1500ms",
            "--leader-elect-retry-period=200ms",
            "--metrics-listen=127.0.0.1:0",
        ])
        .env("RUST_LOG", "info");
    let list = required_access(&cli_of(&command).command).unwrap();
    grant_on_real(&api, "regenerator", &list).await;
    let mut regenerate = ChildProcess::start(command);
    let health = regenerate.addr.to_string();
    e2e::wait_until("a clean pass", Duration::from_secs(30), || async {
        e2e::plain_http_get(&health, "/readyz").0 == 200
    })
    .await;
    e2e::wait_until("a lease renewal", Duration::from_secs(10), || async {
        api.audit_records()
            .iter()
            .any(|r| r.resource == "leases" && r.verb == "update")
    })
    .await;
    assert!(
        regenerate
            .terminate(Duration::from_secs(10))
            .is_some_and(|s| s.success())
    );

    let records = requests_of(&api, "regenerator");
    assert_list_is_the_truth(&list, &records);
    // It really regenerated: the expired signer and leaf were updated, the missing ones created.
    for (verb, resource, name) in [
        ("update", "secrets", "old-signer"),
        ("update", "configmaps", "old-ca"),
        ("update", "secrets", "old-cert"),
        ("create", "configmaps", ""),
        ("create", "leases", ""),
    ] {
        assert!(
            records.iter().any(|r| r.verb == verb
                && r.resource == resource
                && (name.is_empty() || r.name.as_deref() == Some(name))
                && r.code < 300),
            "no successful {verb} {resource} {name}"
        );
    }
}

async fn every_request_of_an_inspect_run_is_in_its_access_list(backend: Backend) {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = audited(backend, tmp.path(), Vec::new(), &[]).await;
    let admin = api.client_with_token(ADMIN_TOKEN);
    let ca = Ca::default();
    let (cert, key, _) = ca.localhost_leaf();
    let post = PostParams::default();
    Api::<Secret>::namespaced(admin.clone(), NS)
        .create(&post, &tls_secret("serving", &cert, &key))
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(admin, NS)
        .create(&post, &bundle_config_map("serving-ca", &ca.cert_pem))
        .await
        .unwrap();
    let token = tmp.path().join("syncer-token");
    rename_into(&token, b"syncer-token");
    let mut command = connected("inspect", &api, &token);
    command
        .arg(format!("--namespace={NS}"))
        .arg("--json")
        .env("RUST_LOG", "warn");
    let list = required_access(&cli_of(&command).command).unwrap();
    grant_on_real(&api, "cert-syncer", &list).await;
    let output = tokio::task::block_in_place(|| command.output()).unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_list_is_the_truth(&list, &requests_of(&api, "cert-syncer"));
}

async fn every_request_of_a_restart_on_change_run_is_in_its_access_list(backend: Backend) {
    // Its only request: the Event of a withheld restart (a pair whose key does not fit, at the
    // watched path; no process runs the container's executable, so nothing is signalled).
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = audited(backend, tmp.path(), Vec::new(), &[]).await;
    let token = tmp.path().join("syncer-token");
    rename_into(&token, b"syncer-token");
    let pair = tmp.path().join("pair");
    std::fs::create_dir_all(&pair).unwrap();
    let ca = Ca::default();
    let (cert, key) = ca.client_leaf("system:kube-controller-manager");
    rename_into(&pair.join("tls.crt"), cert.as_bytes());
    rename_into(&pair.join("tls.key"), key.as_bytes());
    let mut command = connected("restart-on-change", &api, &token);
    command
        .arg(format!(
            "--container=c=/no-such-dir-{}/server",
            std::process::id()
        ))
        .arg(format!(
            "--pair=c={},{}",
            pair.join("tls.crt").display(),
            pair.join("tls.key").display()
        ))
        .arg("--recheck-interval=1s")
        .arg("--metrics-listen=127.0.0.1:0")
        .arg("--pod-name=restarter")
        .arg(format!("--pod-namespace={NS}"))
        .env("RUST_LOG", "warn,cert_syncer::restart=info");
    let list = required_access(&cli_of(&command).command).unwrap();
    grant_on_real(&api, "cert-syncer", &list).await;
    let restarter = tokio::task::block_in_place(|| ChildProcess::start(command));
    // The change must come after it read the pair as it was at its start.
    e2e::wait_until(
        "the restarter's first look",
        Duration::from_secs(30),
        || async {
            restarter
                .stderr_text()
                .contains("restarting the container when its pairs change")
        },
    )
    .await;
    let (_, other_key) = ca.client_leaf("system:kube-controller-manager");
    rename_into(&pair.join("tls.key"), other_key.as_bytes());
    let addr = restarter.addr.to_string();
    e2e::wait_until("the held restart's Event", Duration::from_secs(30), || {
        let (addr, api) = (addr.clone(), &api);
        async move {
            e2e::metric_sum(
                &e2e::plain_http_get(&addr, "/metrics").1,
                "cert_syncer_container_restarts_held_total",
                &["reason=\"invalid_pair\""],
            ) == 1.0
                && api
                    .audit_records()
                    .iter()
                    .any(|r| r.user == "cert-syncer" && r.resource == "events")
        }
    })
    .await;
    drop(restarter);
    assert_list_is_the_truth(&list, &requests_of(&api, "cert-syncer"));
}

/// `cert-syncer SUBCOMMAND` on `api`'s recovery connection with the token file `token` (one
/// user of the audited apiserver), as `--name=value` flags (what `cli_of` parses back).
fn connected(subcommand: &str, api: &TestApi, token: &Path) -> Command {
    let mut command = Command::new(bin_path("cert-syncer"));
    command
        .arg(subcommand)
        .arg(format!("--server={}", api.url()))
        .arg("--tls-server-name-override=localhost-recovery")
        .arg(format!(
            "--ca-file={}",
            api.dir.join("recovery-ca.crt").display()
        ))
        .arg(format!("--token-file={}", token.display()));
    command
}

/// `argv` with `--name=VALUE` (or `--name VALUE`) replaced by `--name=value`.
fn replace_flag(argv: &mut Vec<String>, name: &str, value: &str) {
    let long = format!("--{name}");
    let index = argv
        .iter()
        .position(|a| *a == long || a.starts_with(&format!("{long}=")))
        .unwrap_or_else(|| panic!("no {long} in {argv:?}"));
    if argv[index] == long {
        argv.remove(index + 1);
    }
    argv[index] = format!("{long}={value}");
}

/// The kube-apiserver user of the service account whose token a sidecar's kubeconfig names.
fn service_account_user(pod: &k8s_openapi::api::core::v1::Pod, name: &str) -> String {
    let container = manifests::container(pod, name);
    let argv = manifests::argv(pod, container);
    let template = manifests::flag(&argv, "kubeconfig").expect("--kubeconfig");
    let (_, repo) = manifests::node_file(pod, container, template).expect("on a hostPath");
    let kubeconfig = Kubeconfig::read_from(&repo).unwrap();
    let token_file = kubeconfig
        .auth_infos
        .iter()
        .find_map(|a| a.auth_info.as_ref()?.token_file.clone())
        .expect("a tokenFile");
    let (ns, account) = manifests::service_account_of_token_file(&token_file);
    format!("system:serviceaccount:{ns}:{account}")
}

/// A sidecar of the static pod as a process: the pod's command line and downward-API
/// environment, its kubeconfig template pointed at `api` (server URL, CA file, a token file
/// holding `token`), and files of this run.
struct Sidecar {
    argv: Vec<String>,
    env: BTreeMap<String, String>,
    /// The kube-apiserver user name of its service account.
    user: String,
}

fn sidecar(name: &str, api: &TestApi, dir: &Path, token: &str) -> Sidecar {
    let pod = manifests::pod();
    let container = manifests::container(&pod, name);
    let mut argv = manifests::argv(&pod, container);
    let template = manifests::flag(&argv, "kubeconfig")
        .expect("--kubeconfig")
        .to_owned();
    let (_, repo) = manifests::node_file(&pod, container, &template).expect("on a hostPath");
    let mut kubeconfig = Kubeconfig::read_from(&repo).unwrap();
    let token_file = dir.join(format!("{name}.token"));
    rename_into(&token_file, token.as_bytes());
    let user = service_account_user(&pod, name);
    for auth in kubeconfig
        .auth_infos
        .iter_mut()
        .filter_map(|a| a.auth_info.as_mut())
    {
        auth.token_file = Some(token_file.display().to_string());
    }
    for cluster in kubeconfig
        .clusters
        .iter_mut()
        .filter_map(|c| c.cluster.as_mut())
    {
        assert_eq!(
            cluster.tls_server_name.as_deref(),
            Some("localhost-recovery")
        );
        cluster.server = Some(api.url());
        cluster.certificate_authority = Some(api.dir.join("recovery-ca.crt").display().to_string());
    }
    let path = dir.join(format!("{name}.kubeconfig"));
    rename_into(
        &path,
        serde_json::to_string(&kubeconfig).unwrap().as_bytes(),
    );
    replace_flag(&mut argv, "kubeconfig", path.to_str().unwrap());
    replace_flag(&mut argv, "metrics-listen", "127.0.0.1:0");
    Sidecar {
        env: manifests::environment(&pod, container),
        argv,
        user,
    }
}

impl Sidecar {
    fn start(&self) -> ChildProcess {
        let mut command = Command::new(bin_path("cert-syncer"));
        command
            .args(&self.argv[1..])
            .envs(&self.env)
            .env("RUST_LOG", "info");
        ChildProcess::start(command)
    }
}

async fn the_static_pod_sidecars_make_only_requests_their_rbac_allows(backend: Backend) {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let (sync_token, regenerate_token) = ("sa-sync-token-0123", "sa-regenerate-token-4567");
    // Users named after the service accounts the kubeconfig templates' token files belong to.
    let pod = manifests::pod();
    let (sync_user, regenerate_user) = (
        service_account_user(&pod, SYNC_CONTAINER),
        service_account_user(&pod, REGENERATE_CONTAINER),
    );
    // As kube-apiserver authenticates a service account's token: its user and groups.
    let account = |token: &str, user: &str| {
        let mut parts = user.split(':').skip(2);
        let (namespace, name) = (parts.next().unwrap(), parts.next().unwrap());
        User::service_account(token, namespace, name)
    };
    let api = audited(
        backend,
        tmp.path(),
        vec![
            account(sync_token, &sync_user),
            account(regenerate_token, &regenerate_user),
        ],
        &[],
    )
    .await;
    if backend == Backend::Real {
        // Only the Roles and RoleBindings of manifests/ grant the sidecars anything.
        let applied = rbac::apply_manifest_rbac(&api.client_with_token(ADMIN_TOKEN)).await;
        eprintln!("applied {applied} RBAC objects of manifests/");
    }

    // The regeneration controller creates the whole set from nothing, with the pod's profile.
    let mut regenerate = sidecar(REGENERATE_CONTAINER, &api, tmp.path(), regenerate_token);
    assert_eq!(regenerate.user, regenerate_user);
    // Renew often, so the run shows renewals too. No config.openshift.io objects here: the
    // names come from the pod's own flags.
    regenerate.argv.extend(
        [
            "--leader-elect-lease-duration=2s",
            "--leader-elect-renew-deadline=1500ms",
            "--leader-elect-retry-period=200ms",
        ]
        .map(str::to_owned),
    );
    let mut regenerate_process = regenerate.start();
    let health = regenerate_process.addr.to_string();
    e2e::wait_until("the regeneration pass", Duration::from_secs(60), || async {
        e2e::plain_http_get(&health, "/readyz").0 == 200
    })
    .await;

    // The syncer mirrors what it regenerated into the cert dir.
    let mut sync = sidecar(SYNC_CONTAINER, &api, tmp.path(), sync_token);
    assert_eq!(sync.user, sync_user);
    let dest = tmp.path().join("static-pod-certs");
    replace_flag(&mut sync.argv, "destination-dir", dest.to_str().unwrap());
    let sync_cli = manifests::parse_cert_syncer(&sync.argv, &sync.env).unwrap();
    let cert_syncer::cli::Command::Sync(sync_args) = &sync_cli.command else {
        panic!("{SYNC_CONTAINER} runs sync")
    };
    // The required objects of upstream's list that are not certificates, as OpenShift's
    // operator makes them (the service-account signing key pair, the kubeconfigs).
    create_non_certificate_objects(&api.client_with_token(ADMIN_TOKEN), &sync_args.namespace).await;
    let mut sync_process = sync.start();
    for (kind, names) in [
        ("secrets", &sync_args.secrets),
        ("configmaps", &sync_args.configmaps),
    ] {
        for name in names {
            let dir = dest.join(kind).join(name);
            e2e::wait_until(
                &format!("{kind}/{name} on disk"),
                Duration::from_secs(30),
                || async {
                    std::fs::read_dir(&dir).is_ok_and(|mut entries| entries.next().is_some())
                },
            )
            .await;
        }
    }
    // Every file the pod's kube-apiserver container reads from the cert dir is one that this
    // run of `sync` wrote (a missing one would keep kube-apiserver from starting).
    let server = manifests::argv(
        &pod,
        manifests::container(&pod, manifests::SERVER_CONTAINER),
    );
    let mut read = 0;
    for path in server.iter().flat_map(|a| a.split(['=', ','])) {
        if let Some(rest) = path.strip_prefix("/etc/kubernetes/static-pod-certs/") {
            let file = dest.join(rest);
            e2e::wait_until(
                &format!("{} on disk", file.display()),
                Duration::from_secs(30),
                || async { file.is_file() },
            )
            .await;
            read += 1;
        }
    }
    assert!(read >= 15, "{read} synced files read by kube-apiserver");
    if backend == Backend::Real {
        the_pods_kube_apiserver_starts_from(&api, &dest, tmp.path(), &sync_args.namespace).await;
    }
    assert!(
        sync_process
            .terminate(Duration::from_secs(10))
            .is_some_and(|s| s.success())
    );
    assert!(
        regenerate_process
            .terminate(Duration::from_secs(10))
            .is_some_and(|s| s.success())
    );

    // Every request each sidecar made is allowed by the Roles bound to its service account.
    for (container, user) in [
        (SYNC_CONTAINER, &sync_user),
        (REGENERATE_CONTAINER, &regenerate_user),
    ] {
        let account = user.rsplit(':').next().unwrap();
        let namespace = user.split(':').nth(2).unwrap();
        let granted = manifests::granted_rules(namespace, account);
        // (The profile's reads of the cluster's network and infrastructure config are
        // cluster-scoped: namespace "", granted by the ClusterRole of manifests/rbac.)
        let records = requests_of(&api, user);
        for r in &records {
            assert!(
                manifests::rbac_allows(
                    &granted,
                    &r.verb,
                    &r.api_group,
                    &r.resource,
                    r.namespace.as_deref().unwrap_or(""),
                    r.name.as_deref()
                ),
                "{container} ({user}) made {}, which manifests/rbac does not allow",
                label(r)
            );
            // On the real apiserver RBAC is enforced: nothing was refused either.
            assert!(
                r.code != 401 && r.code != 403,
                "{container} ({user}) was refused: {}",
                label(r)
            );
        }
        eprintln!(
            "{container}: {} requests, all allowed by its Roles",
            records.len()
        );
    }

    // (After the audit check above: these probes are requests of the sidecar's user too.)
    if backend == Backend::Real {
        // The regeneration controller's token reads its declared objects by name only: a
        // namespace-wide list of Secrets (etcd's client keys live in such namespaces) is
        // refused by the real apiserver's RBAC, a list by name is allowed.
        let token = api.client_with_token(regenerate_token);
        let rotation = cert_syncer::regenerate::profile_objects(
            cert_syncer::regenerate::Profile::OpenshiftKubeApiserver,
        )
        .unwrap();
        let mut namespaces = BTreeMap::new();
        for (kind, object) in rotation.objects() {
            if kind == cert_syncer::kind::Kind::Secret {
                namespaces.insert(object.namespace.clone(), object.name.clone());
            }
        }
        assert!(!namespaces.is_empty(), "the profile writes no Secret");
        for (namespace, name) in &namespaces {
            let secrets = Api::<Secret>::namespaced(token.clone(), namespace);
            match secrets.list(&ListParams::default()).await {
                Err(kube::Error::Api(status)) if status.code == 403 => {}
                other => panic!(
                    "listing every Secret of {namespace} with the regenerate token: {:?}, not 403",
                    other.map(|l| l.items.len())
                ),
            }
            let by_name = ListParams::default().fields(&format!("metadata.name={name}"));
            let listed = secrets.list(&by_name).await.unwrap_or_else(|err| {
                panic!("listing {namespace}/{name} by name with the regenerate token: {err}")
            });
            assert_eq!(listed.items.len(), 1, "{namespace}/{name}");
        }
        eprintln!(
            "the regenerate token: 403 on a namespace-wide list of Secrets in {:?}, lists by name allowed",
            namespaces.keys()
        );
    }
}

/// `bound-service-account-signing-key`, `node-kubeconfigs`, `control-plane-node-kubeconfig`
/// and `check-endpoints-kubeconfig` in `namespace`, with upstream's keys
/// (cluster-kube-apiserver-operator: boundsatokensignercontroller, bindata node-kubeconfigs.yaml,
/// control-plane-node-kubeconfig-cm.yaml, check-endpoints-kubeconfig-cm.yaml).
async fn create_non_certificate_objects(admin: &kube::Client, namespace: &str) {
    use k8s_openapi::ByteString;
    let kubeconfig = |server: &str, name: &str| {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {server}\n    \
             certificate-authority: /etc/kubernetes/static-pod-resources/configmaps/kube-apiserver-server-ca/ca-bundle.crt\n\
             contexts:\n- name: {name}\n  context: {{cluster: {name}, user: {name}}}\ncurrent-context: {name}\n\
             users:\n- name: {name}\n  user: {{}}\n"
        )
    };
    let (private, public) = e2e::pki::key_pair_pem(e2e::pki::KeyKind::EcdsaP256);
    let secret = |name: &str, data: Vec<(&str, String)>| Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some(
            data.into_iter()
                .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Default::default()
    };
    let config_map = |name: &str, text: String| ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("kubeconfig".to_owned(), text)])),
        ..Default::default()
    };
    let post = PostParams::default();
    let secrets = Api::<Secret>::namespaced(admin.clone(), namespace);
    for object in [
        secret(
            "bound-service-account-signing-key",
            vec![
                ("service-account.key", private),
                ("service-account.pub", public),
            ],
        ),
        secret(
            "node-kubeconfigs",
            vec![
                (
                    "localhost.kubeconfig",
                    kubeconfig("https://localhost:6443", "localhost"),
                ),
                (
                    "localhost-recovery.kubeconfig",
                    kubeconfig("https://localhost:6443", "localhost-recovery"),
                ),
                (
                    "lb-ext.kubeconfig",
                    kubeconfig("https://api.cluster.example.com:6443", "lb-ext"),
                ),
                (
                    "lb-int.kubeconfig",
                    kubeconfig("https://api-int.cluster.example.com:6443", "lb-int"),
                ),
            ],
        ),
    ] {
        secrets
            .create(&post, &object)
            .await
            .expect("create a Secret");
    }
    let maps = Api::<ConfigMap>::namespaced(admin.clone(), namespace);
    for name in [
        "control-plane-node-kubeconfig",
        "check-endpoints-kubeconfig",
    ] {
        maps.create(
            &post,
            &config_map(name, kubeconfig("https://localhost:6443", name)),
        )
        .await
        .expect("create a ConfigMap");
    }
}

/// The pod's kube-apiserver container, as the kubelet would run it, started from the cert dir
/// this run of `sync` wrote: the envtest kube-apiserver with the container's command line,
/// container paths mapped to this run's directories, over an etcd of its own (plain HTTP like
/// the test apiserver's: etcd's TLS flags, which name resource-dir files, are the node tier's).
/// It must turn ready, serve the synced `localhost` certificate (verified against the
/// `localhost-serving-ca` bundle) and the revisioned `localhost-recovery` one by SNI, and accept
/// the synced admin client certificate through the synced `client-ca`.
async fn the_pods_kube_apiserver_starts_from(
    api: &TestApi,
    dest: &Path,
    dir: &Path,
    namespace: &str,
) {
    let assets = e2e::envtest::assets().expect("the real backend has envtest's binaries");
    let admin = api.client_with_token(ADMIN_TOKEN);
    // The resource dir: the revisioned recovery certificate, copied from the API the way the
    // installer copies it.
    let resources = dir.join("static-pod-resources");
    let recovery = Api::<Secret>::namespaced(admin.clone(), namespace)
        .get("localhost-recovery-serving-certkey")
        .await
        .expect("the regenerated localhost-recovery-serving-certkey");
    for key in ["tls.crt", "tls.key"] {
        let path = resources
            .join("secrets/localhost-recovery-serving-certkey")
            .join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let data = &recovery.data.as_ref().expect("data")[key];
        rename_into(&path, &data.0);
    }
    let operator = Api::<ConfigMap>::namespaced(admin, "openshift-kube-apiserver-operator");
    let mut bundles = Vec::new();
    for name in ["localhost-serving-ca", "localhost-recovery-serving-ca"] {
        let map = operator
            .get(name)
            .await
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        bundles.push(map.data.expect("data")["ca-bundle.crt"].clone());
    }
    let [localhost_ca, recovery_ca] = [&bundles[0], &bundles[1]];

    let [etcd_port, peer_port, port] = testkit::envtest::free_ports::<3>();
    let etcd_addr: std::net::SocketAddr = ([127, 0, 0, 1], etcd_port).into();
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    let etcd = ChildProcess::spawn_logged(
        testkit::envtest::etcd_command(&assets, &dir.join("pod-etcd"), etcd_port, peer_port),
        &dir.join("pod-etcd.log"),
        etcd_addr,
    )
    .expect("etcd starts");
    let pod = manifests::pod();
    let argv = manifests::argv(
        &pod,
        manifests::container(&pod, manifests::SERVER_CONTAINER),
    );
    let (certs, revisioned) = (dest.display().to_string(), resources.display().to_string());
    let mut args = Vec::new();
    for arg in &argv[1..] {
        let name = arg.split('=').next().unwrap_or_default();
        let arg = match name {
            "--etcd-cafile" | "--etcd-certfile" | "--etcd-keyfile" => continue,
            "--etcd-servers" => format!("--etcd-servers=http://{etcd_addr}"),
            "--secure-port" => format!("--secure-port={port}"),
            "--bind-address" => "--bind-address=127.0.0.1".to_owned(),
            _ => arg
                .replace("/etc/kubernetes/static-pod-certs", &certs)
                .replace("/etc/kubernetes/static-pod-resources", &revisioned),
        };
        args.push(arg);
    }
    let mut command = Command::new(assets.join("kube-apiserver"));
    command.args(&args);
    let log = dir.join("pod-kube-apiserver.log");
    let server = ChildProcess::spawn_logged(command, &log, addr).expect("kube-apiserver starts");

    let admin_dir = dest.join("secrets/control-plane-node-admin-client-cert-key");
    let config = e2e::tls::client_config_with_cert(
        localhost_ca,
        &std::fs::read_to_string(admin_dir.join("tls.crt")).unwrap(),
        &std::fs::read_to_string(admin_dir.join("tls.key")).unwrap(),
    );
    let deadline = std::time::Instant::now() + e2e::envtest::READY_TIMEOUT;
    loop {
        match e2e::tls::https_get(addr, "localhost", config.clone(), "/readyz").await {
            Ok((200, body)) if body.trim() == "ok" => break,
            other => assert!(
                std::time::Instant::now() < deadline,
                "the pod's kube-apiserver is not ready from the synced cert dir: {other:?}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            ),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The synced admin certificate authenticates (anonymous would get 403 here).
    let (code, body) =
        e2e::tls::https_get(addr, "localhost", config, "/api/v1/namespaces/kube-system")
            .await
            .expect("GET kube-system");
    assert_eq!(code, 200, "{body}");
    // The sidecars' way in: the revisioned recovery certificate by SNI.
    e2e::tls::handshake_leaf(addr, "localhost-recovery", recovery_ca)
        .await
        .expect("the localhost-recovery certificate, by SNI");
    eprintln!(
        "the pod's kube-apiserver started from the synced cert dir ({} flags)",
        args.len()
    );
    drop(server);
    drop(etcd);
}
