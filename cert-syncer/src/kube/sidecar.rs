//! What a long-running job is handed by the app shell's start-up (`app::startup::start`): the
//! connection, the shutdown signal, readiness and the Events recorder, ready to use. The job
//! registered its metrics and first readiness blockers before the health server started.

use tokio_util::sync::CancellationToken;

use super::connection::Connection;
use super::events::EventRecorder;
use crate::base::readiness::Readiness;

/// A started sidecar: everything a job needs from its process besides its own settings.
pub(crate) struct Sidecar {
    /// The apiserver connection (client, watch timeout, the target for error messages).
    pub connection: Connection,
    /// Cancelled on the first SIGTERM or SIGINT.
    pub shutdown: CancellationToken,
    /// What `/readyz` reports (already served when `--metrics-listen` is set).
    pub readiness: Readiness,
    /// Events on the job's pod or Node (a recorder that records nothing when there is none).
    pub events: EventRecorder,
}
