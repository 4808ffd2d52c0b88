//! One apiserver abstraction with two backends: our `mini-apiserver` ([`ApiServer`]) and a real
//! kube-apiserver with etcd ([`RealApiServer`]). Both write the same files (recovery CA, token,
//! ...) into their directory, so the syncer helpers take either ([`ApiEndpoint`]), and a
//! scenario written once against [`TestApi`] runs against both ([`both_backends!`](crate::both_backends)).

use std::path::{Path, PathBuf};

use crate::apiserver::ApiServer;
use crate::envtest::{RealApiServer, RealOptions, User};

/// Which apiserver a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `mini-apiserver` (examples/mini-apiserver).
    Mini,
    /// kube-apiserver v1.20 + etcd from `KUBEBUILDER_ASSETS` (see [`crate::envtest`]).
    Real,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Mini => "mini-apiserver",
            Backend::Real => "kube-apiserver",
        })
    }
}

/// The namespace the sync tests use (the kube-apiserver's, as in OpenShift).
pub const NS: &str = "openshift-kube-apiserver";

/// What cert-syncer needs to connect to an apiserver: its URL and the directory with
/// `recovery-ca.crt` and `token`.
pub trait ApiEndpoint {
    /// The base URL (`https://127.0.0.1:PORT`).
    fn url(&self) -> String;
    /// The directory with `recovery-ca.crt`, `token`, `tokens.csv`, ...
    fn dir(&self) -> &Path;
}

impl ApiEndpoint for ApiServer {
    fn url(&self) -> String {
        ApiServer::url(self)
    }
    fn dir(&self) -> &Path {
        &self.dir
    }
}

impl ApiEndpoint for RealApiServer {
    fn url(&self) -> String {
        RealApiServer::url(self)
    }
    fn dir(&self) -> &Path {
        &self.dir
    }
}

impl ApiEndpoint for TestApi {
    fn url(&self) -> String {
        TestApi::url(self)
    }
    fn dir(&self) -> &Path {
        &self.dir
    }
}

/// How to start a [`TestApi`].
#[derive(Debug, Clone, Default)]
pub struct ApiOptions {
    /// Flags for `mini-apiserver` only.
    pub mini_args: Vec<String>,
    /// kube-apiserver options (extra flags, audit) for the real one only.
    pub real: RealOptions,
    /// More users in the token file (both backends; mini ignores the groups).
    pub users: Vec<User>,
    /// Keep an audit log of every request (mini: `--audit-log`; real: `--audit-log-path`),
    /// read with [`TestApi::audit_records`].
    pub audit: bool,
    /// Namespaces to create (the real apiserver needs them; mini accepts any). The sync
    /// tests' namespace, [`NS`], is always created.
    pub namespaces: Vec<String>,
}

enum Inner {
    Mini(ApiServer),
    Real(RealApiServer),
}

/// A running apiserver of either backend.
pub struct TestApi {
    /// Which one.
    pub backend: Backend,
    /// Where its files live.
    pub dir: PathBuf,
    inner: Inner,
}

impl std::fmt::Debug for TestApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestApi")
            .field("backend", &self.backend)
            .field("url", &self.url())
            .finish_non_exhaustive()
    }
}

impl TestApi {
    /// Starts `backend` with its files in `dir`, and creates the namespaces of `options`.
    ///
    /// # Panics
    /// When it does not start (for the real one: also when there are no assets; call
    /// [`require_real_apiserver!`](crate::require_real_apiserver) first, or use
    /// [`both_backends!`](crate::both_backends), which does).
    pub async fn start(backend: Backend, dir: &Path, options: &ApiOptions) -> TestApi {
        let inner = match backend {
            Backend::Mini => {
                let mut args: Vec<&str> = options.mini_args.iter().map(String::as_str).collect();
                let log = dir.join("audit.jsonl").display().to_string();
                if options.audit {
                    args.extend(["--audit-log", log.as_str()]);
                }
                let users: Vec<(&str, &str)> = options
                    .users
                    .iter()
                    .map(|u| (u.token.as_str(), u.name.as_str()))
                    .collect();
                Inner::Mini(ApiServer::start_with_tokens(dir, &args, &users))
            }
            Backend::Real => {
                let mut real = options.real.clone();
                real.users.extend(options.users.iter().cloned());
                real.audit |= options.audit;
                let dir = dir.to_owned();
                // Blocking start (it waits for /readyz) off the async workers.
                let server =
                    tokio::task::spawn_blocking(move || RealApiServer::start_with(&dir, &real))
                        .await
                        .unwrap_or_else(|err| std::panic::resume_unwind(err.into_panic()));
                Inner::Real(server)
            }
        };
        let api = TestApi {
            backend,
            dir: dir.to_owned(),
            inner,
        };
        if backend == Backend::Real {
            let client = api.recovery_client();
            crate::envtest::create_namespace(&client, NS).await;
            for namespace in &options.namespaces {
                crate::envtest::create_namespace(&client, namespace).await;
            }
        }
        api
    }

    /// [`TestApi::start`] with the default options.
    pub async fn start_default(backend: Backend, dir: &Path) -> TestApi {
        TestApi::start(backend, dir, &ApiOptions::default()).await
    }

    /// The mini-apiserver, when that is the backend.
    pub fn mini(&self) -> Option<&ApiServer> {
        match &self.inner {
            Inner::Mini(api) => Some(api),
            Inner::Real(_) => None,
        }
    }

    /// The real kube-apiserver, when that is the backend.
    pub fn real(&self) -> Option<&RealApiServer> {
        match &self.inner {
            Inner::Real(api) => Some(api),
            Inner::Mini(_) => None,
        }
    }

    /// The real kube-apiserver, mutably, when that is the backend.
    pub fn real_mut(&mut self) -> Option<&mut RealApiServer> {
        match &mut self.inner {
            Inner::Real(api) => Some(api),
            Inner::Mini(_) => None,
        }
    }

    /// The address it listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        match &self.inner {
            Inner::Mini(api) => api.server.addr,
            Inner::Real(api) => api.addr(),
        }
    }

    /// The base URL.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr())
    }

    /// CA of the `localhost-recovery` certificate (PEM).
    pub fn recovery_ca(&self) -> &str {
        match &self.inner {
            Inner::Mini(api) => &api.recovery_ca,
            Inner::Real(api) => &api.recovery_ca,
        }
    }

    /// CA of the default serving certificate (PEM).
    pub fn serving_ca(&self) -> &str {
        match &self.inner {
            Inner::Mini(api) => &api.serving_ca,
            Inner::Real(api) => &api.serving_ca,
        }
    }

    /// The admin bearer token.
    pub fn token(&self) -> &str {
        match &self.inner {
            Inner::Mini(api) => &api.token,
            Inner::Real(api) => &api.token,
        }
    }

    /// An admin kube client that connects like cert-syncer (SNI `localhost-recovery`, the
    /// recovery CA, the token file).
    pub fn recovery_client(&self) -> kube::Client {
        match &self.inner {
            Inner::Mini(api) => api.recovery_client(),
            Inner::Real(api) => api.recovery_client(),
        }
    }

    /// Like [`TestApi::recovery_client`], with `token` as the bearer token.
    pub fn client_with_token(&self, token: &str) -> kube::Client {
        match &self.inner {
            Inner::Mini(api) => api.client_with_token(token),
            Inner::Real(api) => api.client_with_token(token),
        }
    }

    /// Creates namespace `name` (mini accepts objects in any namespace: nothing to do).
    pub async fn create_namespace(&self, name: &str) {
        if let Inner::Real(api) = &self.inner {
            api.create_namespace(name).await;
        }
    }

    /// Kills the apiserver (SIGKILL, like a crash) without restarting it (the real one's etcd
    /// keeps running). [`TestApi::restart`] brings it back.
    pub fn kill_apiserver(&mut self) {
        match &mut self.inner {
            Inner::Mini(api) => api.server.kill(),
            Inner::Real(api) => api.kill_apiserver(),
        }
    }

    /// Kills the apiserver (SIGKILL) and starts it again on the same address with the same
    /// flags. Mini keeps its objects only with `--state-file`; the real one keeps them in etcd.
    pub async fn restart(&mut self) {
        match &mut self.inner {
            Inner::Mini(api) => api.restart(),
            Inner::Real(api) => tokio::task::block_in_place(|| api.restart()),
        }
    }

    /// `GET /metrics` as the admin. The metric names differ: mini's own (see
    /// `mini_apiserver::metrics`) or kube-apiserver's (`apiserver_request_total`,
    /// `apiserver_registered_watchers`).
    pub async fn metrics(&self) -> String {
        match &self.inner {
            Inner::Mini(api) => api.metrics().await,
            Inner::Real(api) => tokio::task::block_in_place(|| api.metrics()),
        }
    }
}

impl TestApi {
    /// Every request in the audit log so far (start with [`ApiOptions::audit`]), as mini's
    /// records: mini's own log, or kube-apiserver's read by
    /// [`crate::envtest::audit_records`].
    pub fn audit_records(&self) -> Vec<mini_apiserver::audit::Record> {
        match self.backend {
            Backend::Mini => mini_apiserver::audit::read(&self.dir.join("audit.jsonl")).unwrap(),
            Backend::Real => crate::envtest::audit_records(&self.dir.join("audit.log")),
        }
    }

    /// Requests served so far with `verb` (lowercase: `list`, `get`, `watch`, ...) on
    /// `resource` (`secrets`, ...), from `/metrics`: mini's `mini_apiserver_requests_total`, or
    /// kube-apiserver's `apiserver_request_total` (uppercase verbs). Both reset on restart.
    pub async fn request_count(&self, verb: &str, resource: &str) -> f64 {
        let metrics = self.metrics().await;
        let resource = format!("resource=\"{resource}\"");
        match self.backend {
            Backend::Mini => crate::metrics::metric_sum(
                &metrics,
                "mini_apiserver_requests_total",
                &[&format!("verb=\"{verb}\""), &resource],
            ),
            Backend::Real => crate::metrics::metric_sum(
                &metrics,
                "apiserver_request_total",
                &[&format!("verb=\"{}\"", verb.to_uppercase()), &resource],
            ),
        }
    }

    /// Watches open now on `resource` (`secrets` or `configmaps`): mini's
    /// `mini_apiserver_watches_open`, or kube-apiserver's `apiserver_registered_watchers`
    /// (by kind).
    pub async fn open_watches(&self, resource: &str) -> f64 {
        let metrics = self.metrics().await;
        match self.backend {
            Backend::Mini => crate::metrics::metric_sum(
                &metrics,
                "mini_apiserver_watches_open",
                &[&format!("resource=\"{resource}\"")],
            ),
            Backend::Real => {
                let kind = match resource {
                    "secrets" => "Secret",
                    "configmaps" => "ConfigMap",
                    "leases" => "Lease",
                    other => panic!("no kind known for {other}"),
                };
                crate::metrics::metric_sum(
                    &metrics,
                    "apiserver_registered_watchers",
                    &[&format!("kind=\"{kind}\"")],
                )
            }
        }
    }
}

/// Generates a `mini` and a `real` test for each `async fn scenario(backend: Backend)` named:
/// `scenario::mini` and `scenario::real` (the real one prints `SKIP: <reason>` and passes when
/// no real kube-apiserver is available). Both run on a two-worker multi-thread runtime.
///
/// ```text
/// async fn syncs_a_secret(backend: Backend) { ... }
/// e2e::both_backends!(syncs_a_secret);
/// ```
#[macro_export]
macro_rules! both_backends {
    ($($scenario:ident),+ $(,)?) => {
        $(
            mod $scenario {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn mini() {
                    super::$scenario($crate::backend::Backend::Mini).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn real() {
                    $crate::require_real_apiserver!();
                    super::$scenario($crate::backend::Backend::Real).await;
                }
            }
        )+
    };
}
