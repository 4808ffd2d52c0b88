//! mini-apiserver against slow and silent clients: with a small descriptor
//! limit, hundreds of connections that stop in the middle of their headers neither lock out a
//! legitimate client nor stop certificate reloads, and the server closes them.
//!
//! It lowers this process's `RLIMIT_NOFILE` around the spawn of the server (the child inherits
//! it), which no other test may see: nextest runs each test in a process of its own (under
//! `cargo test`, run this file alone: `--test mini_apiserver limits::`).
//! Needs util-linux `prlimit` (skipped with a message without it).

use std::time::Duration;

use e2e::{ApiServer, handshake_leaf, install_crypto_provider, wait_until};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The descriptor limit the server runs with.
const FD_LIMIT: u64 = 256;
/// Connections the attacker opens and leaves half-finished: more than the server has
/// descriptors.
const ATTACKERS: usize = 320;

/// Sets this process's soft descriptor limit with util-linux `prlimit` (the workspace forbids
/// `unsafe`, so no direct `setrlimit`); `false` when the tool is missing.
fn set_soft_fd_limit(soft: &str) -> bool {
    let status = std::process::Command::new("prlimit")
        .arg("--pid")
        .arg(std::process::id().to_string())
        .arg(format!("--nofile={soft}:"))
        .status();
    matches!(status, Ok(s) if s.success())
}

fn soft_fd_limit() -> String {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    line.split_whitespace().nth(3).unwrap().to_owned()
}

/// Starts the server with a soft descriptor limit of [`FD_LIMIT`]; `None` without `prlimit`.
fn start_with_fd_limit(dir: &std::path::Path) -> Option<ApiServer> {
    let old = soft_fd_limit();
    if !set_soft_fd_limit(&FD_LIMIT.to_string()) {
        return None;
    }
    let server = std::panic::catch_unwind(|| ApiServer::start(dir, &[]));
    assert!(
        set_soft_fd_limit(&old),
        "cannot restore the descriptor limit"
    );
    Some(server.unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
}

/// A connection that completes TLS and sends half a request, then nothing.
async fn half_request(
    addr: std::net::SocketAddr,
    ca: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let mut tls = tokio_rustls::TlsConnector::from(e2e::tls::client_config(ca))
        .connect(ServerName::try_from("localhost-recovery").unwrap(), tcp)
        .await?;
    tls.write_all(b"GET /api/v1/namespaces/ns/secrets HTTP/1.1\r\nHost: x\r\n")
        .await?;
    Ok(tls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_finished_requests_neither_lock_out_clients_nor_stay_open() {
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let Some(mut server) = start_with_fd_limit(tmp.path()) else {
        eprintln!("SKIPPED: util-linux `prlimit` is not available to lower the descriptor limit");
        return;
    };
    let addr = server.server.addr;

    let mut held = Vec::new();
    let mut silent = Vec::new();
    for i in 0..ATTACKERS {
        if i % 4 == 0 {
            // Some never even start TLS.
            if let Ok(tcp) = tokio::net::TcpStream::connect(addr).await {
                silent.push(tcp);
            }
            continue;
        }
        // Refused or closed to make room: fine, the attacker just has fewer connections.
        if let Ok(Ok(tls)) = tokio::time::timeout(
            Duration::from_secs(5),
            half_request(addr, &server.recovery_ca),
        )
        .await
        {
            held.push(tls);
        }
    }
    eprintln!(
        "{} half-finished TLS requests and {} silent connections open",
        held.len(),
        silent.len()
    );

    // A legitimate client is served while they are open...
    let secrets: Api<Secret> = Api::namespaced(server.recovery_client(), "ns");
    let listed = tokio::time::timeout(
        Duration::from_secs(20),
        secrets.list(&ListParams::default()),
    )
    .await
    .expect("a legitimate request is answered while half-finished ones are open");
    listed.expect("the list succeeds");

    // ...and a rotated certificate is loaded and served (reloading needs descriptors).
    let serial = server.rotate_recovery();
    let ca = server.recovery_ca.clone();
    wait_until(
        "the rotated certificate is served",
        Duration::from_secs(30),
        || {
            let (ca, serial) = (ca.clone(), serial.clone());
            async move {
                handshake_leaf(addr, "localhost-recovery", &ca)
                    .await
                    .is_ok_and(|leaf| leaf.serial == serial)
            }
        },
    )
    .await;

    // The server closes every half-finished connection (header and authentication deadlines).
    let closed = futures::future::join_all(held.iter_mut().map(|tls| async move {
        let mut buf = [0u8; 1024];
        loop {
            match tokio::time::timeout(Duration::from_secs(60), tls.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => return true,
                Ok(Ok(_)) => {} // an error answer (408) before the close is fine
                Err(_) => return false,
            }
        }
    }))
    .await;
    let open = closed.iter().filter(|c| !**c).count();
    assert_eq!(
        open, 0,
        "{open} half-finished connections still open after 60 s"
    );
}
