//! The one start-up of every long-running subcommand (`sync`, `regenerate`, `node`, `restart-on-change`,
//! `approve-kubelet-csr`), in this order:
//!
//! 1. the job registers its metrics and its first readiness blockers (pure, and where a job
//!    refuses a setting it can only check at run time: exit code 2 before any request);
//! 2. the connection to the apiserver (`kube::connection`);
//! 3. SIGTERM and SIGINT to the shutdown token;
//! 4. the Events recorder for the job's pod or Node;
//! 5. `/healthz`, `/readyz` and `/metrics` on `--metrics-listen`, serving what step 1 registered.
//!
//! The job then runs with a [`Sidecar`] and its metrics.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::registry::Registry;

use crate::base::error::ConfigError;
use crate::base::readiness::Readiness;
use crate::kube::connection;
use crate::kube::events::{EventRecorder, EventsOn};
use crate::kube::sidecar::Sidecar;

/// What the start-up needs from a job's settings.
pub(crate) struct Start<'a> {
    pub connection: &'a connection::Settings,
    pub metrics_listen: Option<SocketAddr>,
    pub events: EventsOn<'a>,
}

/// Starts a sidecar for a job whose metrics and first readiness blockers `register` sets up.
///
/// # Errors
/// `register`'s [`ConfigError`], a connection that cannot be set up, signal handlers that
/// cannot be installed.
pub(crate) async fn start<M>(
    start: Start<'_>,
    register: impl FnOnce(&mut Registry, &Readiness) -> Result<M, ConfigError>,
) -> anyhow::Result<(Sidecar, M)> {
    let mut registry = Registry::default();
    let readiness = Readiness::default();
    let metrics = register(&mut registry, &readiness)?;
    let connection = connection::connect(start.connection).await?;
    let shutdown = super::shutdown::on_signal()?;
    let events = EventRecorder::on(connection.client.clone(), start.events);
    if let Some(addr) = start.metrics_listen {
        let registry = Arc::new(registry);
        let (readiness, shutdown) = (readiness.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(err) = super::health::serve(addr, registry, readiness, shutdown).await {
                tracing::error!(error = %format!("{err:#}"), "metrics server stopped");
            }
        });
    }
    let sidecar = Sidecar {
        connection,
        shutdown,
        readiness,
        events,
    };
    Ok((sidecar, metrics))
}
