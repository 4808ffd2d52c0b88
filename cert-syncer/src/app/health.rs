//! `/healthz`, `/readyz` and `/metrics` on a local plain-HTTP port.
//!
//! Live while the process runs. Ready once every required object has been synced, and not ready
//! while a required object is missing or the apiserver refuses our credentials.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::base::readiness::Readiness;

/// Serves until `shutdown`. Prints `listening on ADDR` on stdout once listening (as every
/// binary of the workspace does, so scripts and tests find the port).
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|err| anyhow::anyhow!("cannot listen on {addr} for metrics: {err}"))?;
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (tcp, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = shutdown.cancelled() => return Ok(()),
        };
        let (registry, readiness) = (Arc::clone(&registry), readiness.clone());
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let response = respond(request.uri().path(), &registry, &readiness);
                    async move { Ok::<_, Infallible>(response) }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

fn respond(path: &str, registry: &Registry, readiness: &Readiness) -> http::Response<Full<Bytes>> {
    let (status, body) = match path {
        "/healthz" => (200, "ok\n".to_owned()),
        "/readyz" => match readiness.blockers() {
            None => (200, "ok\n".to_owned()),
            Some(reasons) => (503, reasons),
        },
        "/metrics" => {
            let mut text = String::new();
            match prometheus_client::encoding::text::encode(&mut text, registry) {
                Ok(()) => (200, text),
                Err(_) => (500, "encoding failed\n".to_owned()),
            }
        }
        _ => (404, "not found\n".to_owned()),
    };
    let mut response = http::Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = http::StatusCode::from_u16(status).expect("valid status codes");
    response
}
