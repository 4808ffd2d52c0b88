//! A real kube-apiserver with its own etcd, the envtest way: the binaries come from
//! `KUBEBUILDER_ASSETS` (a directory holding `kube-apiserver` and `etcd`; a relative value is
//! taken from the repository root, and one naming a path that is not there fails the test,
//! see [`testkit::env`]), else from what `<repo root>/../shared/envtest/setup` prints, else the
//! tests that need them skip with a printed reason ([`skip_reason`],
//! [`require_real_apiserver!`](crate::require_real_apiserver)).
//!
//! [`RealApiServer`] writes the same files as the `mini-apiserver` harness
//! ([`crate::apiserver::ApiServer`]) into its directory, so the syncer helpers work with both:
//!
//! | file | content |
//! |---|---|
//! | `serving.crt`, `serving.key` | default certificate (`localhost`, `127.0.0.1`), CA `serving-ca.crt` |
//! | `recovery/tls.crt`, `recovery/tls.key` | SNI `localhost-recovery` certificate, CA `recovery-ca.crt` |
//! | `client-ca.crt` | `--client-ca-file` (CA of [`RealApiServer::client_ca`]) |
//! | `tokens.csv` | `--token-auth-file`: admin (`system:masters`), viewer, cert-syncer, and [`RealOptions::users`] |
//! | `token` | [`ADMIN_TOKEN`], for clients that read a token file |
//! | `sa.key`, `sa.pub` | service-account signing key |
//! | `etcd/`, `etcd.log`, `kube-apiserver.log` | etcd's data, the two logs |
//! | `audit-policy.yaml`, `audit.log` | with [`RealOptions::audit`]: every request at `Metadata` level |

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use crate::apiserver::{ADMIN_TOKEN, VIEWER_TOKEN};
use crate::process::ChildProcess;
pub use crate::tls::{blocking_get, blocking_post};
use testkit::files::rename_into;
use testkit::pki::Ca;

pub use testkit::envtest::ASSETS_ENV;

/// How long etcd plus kube-apiserver may take to answer `/readyz` (2–4 s on an idle 2-core
/// machine; CI runs several test processes at once).
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// The directory holding `kube-apiserver` and `etcd`: `KUBEBUILDER_ASSETS`, else the output of
/// `<repo root>/../shared/envtest/setup` (run once per process).
///
/// # Errors
/// Why there is none (the variable unset and no setup script): the reason a test prints when it
/// skips.
///
/// # Panics
/// When `KUBEBUILDER_ASSETS` names a path that is not there or lacks a binary, or the setup
/// script fails ([`testkit::envtest::find_assets`]).
pub fn assets() -> Result<PathBuf, String> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND.get_or_init(testkit::envtest::find_assets).clone()
}

/// The workspace root.
pub fn repo_root() -> PathBuf {
    testkit::envtest::workspace_root()
}

/// Why the real-apiserver tests cannot run here, or `None` when they can.
pub fn skip_reason() -> Option<String> {
    assets().err()
}

/// Returns from the calling test (which passes) after printing `SKIP: <reason>` when no real
/// kube-apiserver is available (see [`assets`]).
#[macro_export]
macro_rules! require_real_apiserver {
    () => {
        if let Some(reason) = $crate::envtest::skip_reason() {
            eprintln!("SKIP: {reason}");
            return;
        }
    };
}

/// A user in `tokens.csv`.
#[derive(Clone)]
pub struct User {
    /// Bearer token.
    pub token: String,
    /// User name (e.g. `system:serviceaccount:NS:SA`).
    pub name: String,
    /// Groups.
    pub groups: Vec<String>,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("groups", &self.groups)
            .finish_non_exhaustive()
    }
}

impl User {
    /// A user with `token` and `groups`.
    pub fn new(token: &str, name: &str, groups: &[&str]) -> User {
        User {
            token: token.to_owned(),
            name: name.to_owned(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
        }
    }

    /// The service account `namespace/name` as kube-apiserver names it, with its groups.
    pub fn service_account(token: &str, namespace: &str, name: &str) -> User {
        User::new(
            token,
            &format!("system:serviceaccount:{namespace}:{name}"),
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{namespace}"),
                "system:authenticated",
            ],
        )
    }
}

/// How to start a [`RealApiServer`].
#[derive(Debug, Clone, Default)]
pub struct RealOptions {
    /// More kube-apiserver flags, after the defaults: repeatable flags such as
    /// `--tls-sni-cert-key` add to them, single-valued ones such as `--client-ca-file`
    /// replace them (the last one wins).
    pub extra_args: Vec<String>,
    /// More users in `tokens.csv`.
    pub users: Vec<User>,
    /// Write an audit log (`audit.log`, JSON lines, every request at `Metadata` level).
    pub audit: bool,
}

/// A real kube-apiserver and its etcd on free 127.0.0.1 ports, both killed on drop (see the
/// module docs for its files).
pub struct RealApiServer {
    // Dropped in this order: the apiserver before its etcd.
    apiserver: ChildProcess,
    etcd: ChildProcess,
    /// Where its files live.
    pub dir: PathBuf,
    /// CA of the default serving certificate (PEM).
    pub serving_ca: String,
    /// CA of the `localhost-recovery` certificate (PEM).
    pub recovery_ca: String,
    /// The CA named by `--client-ca-file` (unless overridden): issue client certificates with
    /// it.
    pub client_ca: Ca,
    /// The admin bearer token.
    pub token: String,
    args: Vec<String>,
}

impl std::fmt::Debug for RealApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealApiServer")
            .field("addr", &self.apiserver.addr)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl RealApiServer {
    /// [`RealApiServer::start_with`] with the default options.
    ///
    /// # Panics
    /// When no assets exist or it does not become ready.
    pub fn start(dir: &Path) -> RealApiServer {
        RealApiServer::start_with(dir, &RealOptions::default())
    }

    /// Writes the PKI, token file and etcd data dir into `dir`, starts etcd and kube-apiserver
    /// and waits for `/readyz`. Retries once on other ports when they lose a port race.
    ///
    /// # Panics
    /// When no assets exist (call [`require_real_apiserver!`](crate::require_real_apiserver)
    /// first) or it does not become ready within [`READY_TIMEOUT`]; the message has the end of
    /// its log.
    pub fn start_with(dir: &Path, options: &RealOptions) -> RealApiServer {
        let assets = assets().unwrap_or_else(|reason| panic!("{reason}"));
        std::fs::create_dir_all(dir).expect("the apiserver directory");
        let (serving, recovery) = crate::apiserver::write_serving_pki(dir);
        let client_ca = Ca::default();
        rename_into(&dir.join("client-ca.crt"), client_ca.cert_pem.as_bytes());
        rename_into(&dir.join("token"), ADMIN_TOKEN.as_bytes());
        let mut users = vec![
            User::new(ADMIN_TOKEN, "admin", &["system:masters"]),
            User::new(VIEWER_TOKEN, "viewer", &["viewers"]),
            User::new("syncer-token", "cert-syncer", &["syncers"]),
        ];
        users.extend(options.users.iter().cloned());
        let tokens: String = users
            .iter()
            .enumerate()
            .map(|(uid, user)| {
                let groups = if user.groups.is_empty() {
                    String::new()
                } else {
                    format!(",\"{}\"", user.groups.join(","))
                };
                format!("{},{},{}{groups}\n", user.token, user.name, uid + 1)
            })
            .collect();
        rename_into(&dir.join("tokens.csv"), tokens.as_bytes());
        // The service-account token signer: kube-apiserver refuses to start without one.
        let (sa_key, sa_pub) = testkit::pki::key_pair_pem(testkit::pki::KeyKind::EcdsaP256);
        rename_into(&dir.join("sa.key"), sa_key.as_bytes());
        rename_into(&dir.join("sa.pub"), sa_pub.as_bytes());
        let mut args = Vec::new();
        if options.audit {
            rename_into(
                &dir.join("audit-policy.yaml"),
                b"apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n\
                  rules:\n- level: Metadata\n",
            );
            args.push(format!(
                "--audit-policy-file={}",
                dir.join("audit-policy.yaml").display()
            ));
            args.push(format!(
                "--audit-log-path={}",
                dir.join("audit.log").display()
            ));
        }
        args.extend(options.extra_args.iter().cloned());
        let mut last = String::new();
        // Ports are chosen free, then bound by the processes a moment later: another test may
        // take one in between. Such a start fails fast and is retried on other ports.
        for _ in 0..3 {
            let [etcd_port, peer_port, port] = testkit::envtest::free_ports::<3>();
            let _ = std::fs::remove_dir_all(dir.join("etcd"));
            let mut etcd = match start_etcd(&assets, dir, etcd_port, peer_port) {
                Ok(etcd) => etcd,
                Err(err) => {
                    last = err;
                    continue;
                }
            };
            let mut apiserver = ChildProcess::spawn_logged(
                apiserver_command(&assets, dir, etcd_port, port, &args),
                &dir.join("kube-apiserver.log"),
                SocketAddr::from(([127, 0, 0, 1], port)),
            )
            .unwrap_or_else(|err| panic!("{err}"));
            match wait_ready(&mut etcd, &mut apiserver, dir, &recovery.cert_pem) {
                Ok(()) => {
                    return RealApiServer {
                        apiserver,
                        etcd,
                        dir: dir.to_owned(),
                        serving_ca: serving.cert_pem.clone(),
                        recovery_ca: recovery.cert_pem.clone(),
                        client_ca,
                        token: ADMIN_TOKEN.to_owned(),
                        args,
                    };
                }
                Err(err) if err.contains("address already in use") => last = err,
                Err(err) => panic!("the real kube-apiserver did not start: {err}"),
            }
        }
        panic!("the real kube-apiserver did not start: {last}");
    }

    /// The last 40 lines of one of its logs.
    pub fn log_tail(&self, name: &str) -> String {
        log_tail(&self.dir, name)
    }

    /// One blocking `GET path` over a fresh TLS connection with SNI `localhost-recovery`
    /// (trusting the recovery CA): as the admin when `token` is `None`, anonymous with
    /// `Some("")`. Returns (status, body).
    ///
    /// # Errors
    /// Connection and handshake failures.
    pub fn get(&self, path: &str, token: Option<&str>) -> std::io::Result<(u16, String)> {
        let token = token.unwrap_or(&self.token);
        blocking_get(
            self.addr(),
            "localhost-recovery",
            crate::tls::client_config(&self.recovery_ca),
            path,
            token,
        )
    }

    /// Issues a client certificate for `user` from `ca` and answers whether the apiserver
    /// authenticates a request with it as that user: RBAC then names the user in its 403 (a
    /// certificate of an unknown CA gets 401, and none makes the request anonymous). The
    /// certificate is issued now; the request runs when the future is awaited, so the future
    /// borrows neither `ca` nor the server (for retry loops).
    pub fn authenticates_client_cert(
        &self,
        ca: &mut Ca,
        user: &str,
    ) -> impl std::future::Future<Output = bool> + Send + use<> {
        let issued = ca.issue(&testkit::pki::CertSpec::client(user));
        let config = crate::tls::client_config_with_cert(
            &self.recovery_ca,
            &issued.cert_pem,
            &issued.key_pem,
        );
        let addr = self.addr();
        let user = user.to_owned();
        async move {
            // `User \"client-7\" cannot list ...` (JSON-escaped quotes).
            matches!(
                crate::tls::https_get(addr, "localhost-recovery", config, "/api/v1/namespaces/x/pods").await,
                Ok((403, body)) if body.contains(&format!("User \\\"{user}\\\""))
            )
        }
    }

    /// Kills kube-apiserver (SIGKILL, like a crash) and starts it again on the same port with
    /// the same flags; etcd keeps running, so every object survives.
    ///
    /// # Panics
    /// When it does not become ready again.
    pub fn restart(&mut self) {
        let assets = assets().unwrap_or_else(|reason| panic!("{reason}"));
        self.apiserver.kill();
        let addr = self.apiserver.addr;
        let etcd_port = self.etcd.addr.port();
        self.apiserver = ChildProcess::spawn_logged(
            apiserver_command(&assets, &self.dir, etcd_port, addr.port(), &self.args),
            &self.dir.join("kube-apiserver.log"),
            addr,
        )
        .unwrap_or_else(|err| panic!("{err}"));
        wait_ready(
            &mut self.etcd,
            &mut self.apiserver,
            &self.dir,
            &self.recovery_ca,
        )
        .unwrap_or_else(|err| panic!("kube-apiserver did not restart: {err}"));
    }

    /// [`RealApiServer::restart`] with `more` flags added after the current ones (for flags
    /// that name files which exist only once the server ran: a synced directory, say).
    ///
    /// # Panics
    /// When it does not become ready again.
    pub fn restart_with_args(&mut self, more: &[String]) {
        self.args.extend(more.iter().cloned());
        self.restart();
    }

    /// Stops kube-apiserver (SIGKILL) without restarting it; etcd keeps running.
    pub fn kill_apiserver(&mut self) {
        self.apiserver.kill();
    }

    /// The address kube-apiserver listens on.
    pub fn addr(&self) -> SocketAddr {
        self.apiserver.addr
    }

    /// The base URL.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr())
    }

    /// The flags it was started with after the defaults (audit and [`RealOptions::extra_args`]).
    pub fn extra_args(&self) -> &[String] {
        &self.args
    }

    /// A kube config that connects like cert-syncer: `https://127.0.0.1:PORT`, SNI
    /// `localhost-recovery`, the recovery CA, no credentials yet.
    pub fn recovery_config(&self) -> kube::Config {
        crate::apiserver::recovery_config(&self.url(), &self.recovery_ca)
    }

    /// A kube client that connects like cert-syncer, with the token file `dir/token` (admin).
    pub fn recovery_client(&self) -> kube::Client {
        let mut config = self.recovery_config();
        config.auth_info.token_file = Some(self.dir.join("token").display().to_string());
        kube::Client::try_from(config).expect("a kube client")
    }

    /// Like [`RealApiServer::recovery_client`], with `token` as the bearer token.
    pub fn client_with_token(&self, token: &str) -> kube::Client {
        let mut config = self.recovery_config();
        config.auth_info.token = Some(token.to_owned().into());
        kube::Client::try_from(config).expect("a kube client")
    }

    /// `GET /metrics` as the admin (kube-apiserver's own metrics:
    /// `apiserver_request_total`, `apiserver_registered_watchers`, ...).
    ///
    /// # Panics
    /// When the request fails.
    pub fn metrics(&self) -> String {
        match self.get("/metrics", None) {
            Ok((200, body)) => body,
            other => panic!("GET /metrics: {other:?}"),
        }
    }

    /// Creates namespace `name` as the admin (nothing when it exists).
    ///
    /// # Panics
    /// When the API refuses otherwise.
    pub async fn create_namespace(&self, name: &str) {
        create_namespace(&self.recovery_client(), name).await;
    }
}

/// Waits for `/readyz` (anonymous, SNI `localhost-recovery`), failing early when either
/// process exits.
fn wait_ready(
    etcd: &mut ChildProcess,
    apiserver: &mut ChildProcess,
    dir: &Path,
    recovery_ca: &str,
) -> Result<(), String> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let config = crate::tls::client_config(recovery_ca);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Some(status) = etcd.has_exited() {
            return Err(format!(
                "etcd exited ({status}):\n{}",
                log_tail(dir, "etcd.log")
            ));
        }
        if let Some(status) = apiserver.has_exited() {
            return Err(format!(
                "kube-apiserver exited ({status}):\n{}",
                log_tail(dir, "kube-apiserver.log")
            ));
        }
        match blocking_get(
            apiserver.addr,
            "localhost-recovery",
            config.clone(),
            "/readyz",
            "",
        ) {
            Ok((200, _)) => return Ok(()),
            Ok((status, body)) => last = format!("/readyz {status}: {body}"),
            Err(err) => last = err.to_string(),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "no /readyz within {READY_TIMEOUT:?} (last: {last}):\n{}",
        log_tail(dir, "kube-apiserver.log")
    ))
}

/// The last 40 lines of the log `dir/name` (empty when absent).
pub fn log_tail(dir: &Path, name: &str) -> String {
    let text = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The requests in kube-apiserver's audit log (`--audit-log-path`, JSON), one per request as
/// its authorizer saw it, in the shape of `mini-apiserver --audit-log`'s records: the first
/// event of each request past `RequestReceived` (a watch: `ResponseStarted`), requests that
/// name no resource left out (as mini does). An absent log reads as empty.
///
/// # Panics
/// On a line that is not an audit event.
pub fn audit_records(path: &Path) -> Vec<mini_apiserver::audit::Record> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut seen = std::collections::BTreeSet::new();
    let mut records = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let event: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|err| panic!("{}: not an audit event: {err}", path.display()));
        let field = |pointer: &str| event.pointer(pointer).and_then(|v| v.as_str());
        if field("/stage") == Some("RequestReceived") {
            continue;
        }
        let Some(resource) = field("/objectRef/resource") else {
            continue;
        };
        let id = field("/auditID").unwrap_or_default().to_owned();
        if !seen.insert(id) {
            continue;
        }
        records.push(mini_apiserver::audit::Record {
            user: field("/user/username").unwrap_or_default().to_owned(),
            verb: field("/verb").unwrap_or_default().to_owned(),
            api_group: field("/objectRef/apiGroup").unwrap_or_default().to_owned(),
            resource: resource.to_owned(),
            namespace: field("/objectRef/namespace").map(str::to_owned),
            name: field("/objectRef/name").map(str::to_owned),
            code: event
                .pointer("/responseStatus/code")
                .and_then(serde_json::Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(0),
        });
    }
    records
}

/// Creates namespace `name` with `client` (nothing when it exists).
///
/// # Panics
/// When the API refuses otherwise.
pub async fn create_namespace(client: &kube::Client, name: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let api: kube::Api<Namespace> = kube::Api::all(client.clone());
    let namespace = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    match api.create(&Default::default(), &namespace).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(err) => panic!("cannot create namespace {name}: {err}"),
    }
}

fn start_etcd(
    assets: &Path,
    dir: &Path,
    client_port: u16,
    peer_port: u16,
) -> Result<ChildProcess, String> {
    ChildProcess::spawn_logged(
        testkit::envtest::etcd_command(assets, &dir.join("etcd"), client_port, peer_port),
        &dir.join("etcd.log"),
        SocketAddr::from(([127, 0, 0, 1], client_port)),
    )
}

fn apiserver_command(
    assets: &Path,
    dir: &Path,
    etcd_port: u16,
    port: u16,
    extra: &[String],
) -> Command {
    let files = testkit::envtest::ApiserverFiles {
        serving: (dir.join("serving.crt"), dir.join("serving.key")),
        sni: vec![(
            dir.join("recovery/tls.crt"),
            dir.join("recovery/tls.key"),
            "localhost-recovery".to_owned(),
        )],
        client_ca: dir.join("client-ca.crt"),
        tokens: dir.join("tokens.csv"),
        service_account: (dir.join("sa.key"), dir.join("sa.pub")),
    };
    let mut command = testkit::envtest::kube_apiserver_command(assets, &files, etcd_port, port);
    command.args(extra);
    command
}
