//! A host kube-apiserver over the node's etcd, to put the cluster's objects into etcd before the
//! kubelet starts the pod (the state a node wakes up to): started, used through an admin
//! client, then stopped. Its own serving PKI, token file and client CA are the harness's
//! (`crate::apiserver::write_serving_pki`), unrelated to the pod's.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use testkit::envtest::{ApiserverFiles, EtcdConnection};
use testkit::files::rename_into;

use super::etcd::Etcd;
use crate::apiserver::ADMIN_TOKEN;
use crate::process::ChildProcess;

/// A running host kube-apiserver on the node's etcd (killed on drop).
pub struct SeedApiServer {
    process: ChildProcess,
    /// Its files (`recovery-ca.crt`, `token`, `admin.kubeconfig`, `kube-apiserver.log`).
    pub dir: PathBuf,
    /// CA of its `localhost-recovery` certificate (PEM).
    pub recovery_ca: String,
}

impl std::fmt::Debug for SeedApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeedApiServer")
            .field("addr", &self.process.addr)
            .finish_non_exhaustive()
    }
}

impl SeedApiServer {
    /// Starts kube-apiserver on a free port over `etcd`, signing and checking service-account
    /// tokens with `service_account` (private key, public key: the pod's, so the tokens it
    /// issues are the pod's), plus `extra` flags; waits for `/readyz`.
    ///
    /// # Panics
    /// When it is not ready within 90 s (the message has its log).
    pub fn start(
        dir: &Path,
        etcd: &Etcd,
        service_account: (&Path, &Path),
        extra: &[String],
    ) -> SeedApiServer {
        let assets = crate::envtest::assets().unwrap_or_else(|reason| panic!("{reason}"));
        std::fs::create_dir_all(dir).expect("the seed apiserver's directory");
        let (_, recovery) = crate::apiserver::write_serving_pki(dir);
        let client_ca = testkit::pki::Ca::default();
        rename_into(&dir.join("client-ca.crt"), client_ca.cert_pem.as_bytes());
        testkit::rename::rename_into_with_mode(&dir.join("token"), ADMIN_TOKEN.as_bytes(), 0o600);
        rename_into(
            &dir.join("tokens.csv"),
            format!("{ADMIN_TOKEN},admin,1,\"system:masters\"\n").as_bytes(),
        );
        let (ca, cert, key) = etcd.write_client_files(&dir.join("etcd"));
        let files = ApiserverFiles {
            serving: (dir.join("serving.crt"), dir.join("serving.key")),
            sni: vec![(
                dir.join("recovery/tls.crt"),
                dir.join("recovery/tls.key"),
                "localhost-recovery".to_owned(),
            )],
            client_ca: dir.join("client-ca.crt"),
            tokens: dir.join("tokens.csv"),
            service_account: (service_account.0.to_owned(), service_account.1.to_owned()),
        };
        let [port] = testkit::envtest::free_ports::<1>();
        let etcd = EtcdConnection::Tls {
            url: etcd.url(),
            ca,
            cert,
            key,
        };
        let mut command =
            testkit::envtest::kube_apiserver_command_with(&assets, &files, &etcd, port);
        command.args(extra);
        let mut process = ChildProcess::spawn_logged(
            command,
            &dir.join("kube-apiserver.log"),
            SocketAddr::from(([127, 0, 0, 1], port)),
        )
        .unwrap_or_else(|err| panic!("{err}"));
        let config = crate::tls::client_config(&recovery.cert_pem);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            assert!(
                process.has_exited().is_none(),
                "the seed kube-apiserver exited:\n{}",
                crate::envtest::log_tail(dir, "kube-apiserver.log")
            );
            if let Ok((200, _)) = crate::envtest::blocking_get(
                process.addr,
                "localhost-recovery",
                config.clone(),
                "/readyz",
                "",
            ) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the seed kube-apiserver was not ready within 90 s:\n{}",
                crate::envtest::log_tail(dir, "kube-apiserver.log")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let server = SeedApiServer {
            process,
            dir: dir.to_owned(),
            recovery_ca: recovery.cert_pem.clone(),
        };
        std::fs::write(
            dir.join("admin.kubeconfig"),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: seed\n  cluster:\n    server: {}\n    \
                 certificate-authority: {}\n    tls-server-name: localhost-recovery\nusers:\n- name: admin\n  \
                 user:\n    token: {ADMIN_TOKEN}\ncontexts:\n- name: seed\n  context: {{cluster: seed, user: admin}}\n\
                 current-context: seed\n",
                server.url(),
                dir.join("recovery-ca.crt").display()
            ),
        )
        .expect("the seed admin kubeconfig");
        server
    }

    /// Its base URL.
    pub fn url(&self) -> String {
        format!("https://{}", self.process.addr)
    }

    /// An admin client (SNI `localhost-recovery`, token).
    pub fn admin(&self) -> kube::Client {
        let mut config = crate::apiserver::recovery_config(&self.url(), &self.recovery_ca);
        config.auth_info.token = Some(ADMIN_TOKEN.to_owned().into());
        kube::Client::try_from(config).expect("a kube client")
    }

    /// `dir/admin.kubeconfig`, for kubectl and the workspace's binaries.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// Stops it (SIGTERM, then SIGKILL): etcd keeps what it wrote.
    pub fn stop(mut self) {
        if self.process.terminate(Duration::from_secs(10)).is_none() {
            self.process.kill();
        }
    }
}

impl crate::backend::ApiEndpoint for SeedApiServer {
    fn url(&self) -> String {
        SeedApiServer::url(self)
    }
    fn dir(&self) -> &Path {
        &self.dir
    }
}
