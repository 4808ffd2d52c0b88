//! reload-lib in ten lines: an HTTPS server (HTTP/1.1 and HTTP/2) that follows `tls.crt` and
//! `tls.key` on disk without a restart. This file is the README section "reload-lib in ten lines"
//! (`reload-lib/tests/readme.rs` keeps the two identical). Build it with `cargo build -p
//! reload-lib --example minimal`, run `target/debug/examples/minimal` in a directory holding the
//! two files, then `curl --cacert tls.crt https://localhost:8443/`.

use std::{convert::Infallible, time::Duration};

use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use reload_lib::{CertKeyPaths, ServingSet};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let paths = CertKeyPaths::new("tls.crt", "tls.key");
    let set = ServingSet::builder(paths).start().await?; // fails closed on bad files
    let acceptor = set.acceptor();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8443").await?;
    loop {
        let (tcp, _) = listener.accept().await?;
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp));
            let Ok(Ok(tls)) = handshake.await else { return };
            let http = auto::Builder::new(TokioExecutor::new()); // HTTP/1.1 and HTTP/2
            let connection = http.serve_connection(TokioIo::new(tls), service_fn(hello));
            let _ = connection.await;
        });
    }
}

async fn hello(_: Request<Incoming>) -> Result<Response<String>, Infallible> {
    Ok(Response::new("hello\n".to_owned()))
}
