//! Harness for the end-to-end tests: finding the workspace binaries and running them as child
//! processes ([`process`], over `testkit::process`), the workspace's throwaway PKI ([`pki`], which
//! is `testkit::pki`), client-side TLS helpers ([`tls`]), and a
//! `mini-apiserver` with kube clients that connect as cert-syncer does ([`apiserver`]), a real
//! kube-apiserver with etcd ([`envtest`]; bootstrap tokens on it: [`bootstrap_tokens`]), one
//! abstraction over both ([`backend`]), and `cert-syncer sync` connected to it ([`syncer`]),
//! `manifests/` read as Kubernetes objects and command lines ([`manifests`]), Go's reading
//! of a CSR as kubectl prints it ([`go_csr`]), and the README's shell blocks ([`readme`]).
//!
//! The most used items are re-exported here.

pub mod apiserver;
pub mod backend;
pub mod bootstrap_tokens;
pub mod envtest;
pub mod go_csr;
pub mod log_scan;
pub mod manifests;
pub mod metrics;
pub mod monitoring;
pub mod node;
pub mod process;
pub mod prometheus;
pub mod rbac;
pub mod readme;
pub mod syncer;
pub mod tls;
pub mod tokens;

pub use testkit::pki;
pub use testkit::wait::wait_until;

pub use apiserver::ApiServer;
pub use backend::{ApiEndpoint, ApiOptions, Backend, TestApi};
pub use envtest::RealApiServer;
pub use metrics::{metric_sum, plain_http_get};
pub use pki::{Ca, CertFiles, CertSpec, Issued, TempPki};
pub use process::{ChildProcess, Server, bin, bin_path};
pub use syncer::{Syncer, SyncerSpec};
pub use tls::{Leaf, client_config, handshake_leaf, https_get, serial_of};

/// Installs the process-wide rustls provider (aws-lc-rs) kube-client needs; idempotent.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Items of a stream (a kube watcher, typically) turned into labels by a task, read with a
/// bounded wait. The task is aborted on drop, while the test's runtime still runs: a watcher
/// left running past the test body would retry in a tight loop once the runtime shuts down
/// (its client's request queue is gone), and the runtime would never finish shutting down.
pub struct Events {
    rx: tokio::sync::mpsc::UnboundedReceiver<String>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// Spawns a task that sends `label(item)` for every item of `stream` (`None`: skipped).
    pub fn spawn<S, F>(stream: S, mut label: F) -> Events
    where
        S: futures::Stream + Send + 'static,
        F: FnMut(S::Item) -> Option<String> + Send + 'static,
    {
        use futures::StreamExt;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                if let Some(text) = label(item)
                    && tx.send(text).is_err()
                {
                    return;
                }
            }
        });
        Events { rx, task }
    }

    /// The next label, waiting at most 30 s.
    ///
    /// # Panics
    /// On timeout, or when the stream ended.
    pub async fn next(&mut self) -> String {
        tokio::time::timeout(std::time::Duration::from_secs(30), self.rx.recv())
            .await
            .expect("no event within 30 s")
            .expect("the stream ended")
    }

    /// Reads labels until `done` holds for one; returns all of them, that one included.
    pub async fn until(&mut self, mut done: impl FnMut(&str) -> bool) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let label = self.next().await;
            let stop = done(&label);
            seen.push(label);
            if stop {
                return seen;
            }
        }
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A spawned task aborted on drop (see [`Events`] for why tests need this).
#[derive(Debug)]
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> AbortOnDrop<T> {
    /// Waits for the task's output, at most `timeout`.
    ///
    /// # Panics
    /// On timeout or if the task panicked, naming `what`.
    pub async fn join(&mut self, what: &str, timeout: std::time::Duration) -> T {
        tokio::time::timeout(timeout, &mut self.0)
            .await
            .unwrap_or_else(|_| panic!("{what} did not finish within {timeout:?}"))
            .unwrap_or_else(|err| panic!("{what} failed: {err}"))
    }
}

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
