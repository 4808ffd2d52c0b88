//! The app shell: the flags, the access each subcommand needs, and what every sidecar does
//! before its job starts (connect, signals, metrics, readiness, the health server, the Events
//! target). The only layer that knows every job.
//!
//! - [`cli`]: the flags (clap), turned into each job's plain `Settings`;
//! - [`access`]: the API access each subcommand needs for given flags;
//! - `startup`: the one start-up of every long-running subcommand;
//! - `health`: `/healthz`, `/readyz`, `/metrics`;
//! - `shutdown`: SIGTERM/SIGINT to a cancellation token.

pub mod access;
pub mod cli;
pub(crate) mod health;
pub(crate) mod shutdown;
pub(crate) mod startup;

use crate::kube::events::{EventRecorder, EventsOn};
use crate::{approve, inspect, node, regenerate, restart, sync};
use startup::Start;

/// Runs one subcommand: its settings from the flags, the shared start-up, then its job.
pub(crate) async fn run(command: cli::Command) -> anyhow::Result<()> {
    match command.job()? {
        cli::Job::Sync(settings) => {
            let start = Start {
                connection: &settings.connection,
                metrics_listen: settings.metrics_listen,
                events: EventsOn::Pod {
                    namespace: &settings.namespace,
                    pod_name: settings.pod_name.as_deref(),
                },
            };
            let (sidecar, metrics) = startup::start(start, |registry, readiness| {
                sync::register(&settings, registry, readiness)
            })
            .await?;
            sync::run(settings, sidecar, metrics).await
        }
        cli::Job::Regenerate(settings) => {
            let events = EventsOn::Pod {
                namespace: settings.events_namespace(),
                pod_name: settings.pod_name.as_deref(),
            };
            if settings.once {
                // A one-shot: the connection and the Events target, nothing else.
                let connection = crate::kube::connection::connect(&settings.connection).await?;
                let events = EventRecorder::on(connection.client.clone(), events);
                return regenerate::run_once(settings, connection, events).await;
            }
            let start = Start {
                connection: &settings.connection,
                metrics_listen: settings.metrics_listen,
                events,
            };
            let (sidecar, metrics) = startup::start(start, |registry, readiness| {
                regenerate::register(&settings, registry, readiness)
            })
            .await?;
            regenerate::run(settings, sidecar, metrics).await
        }
        cli::Job::Inspect(settings) => {
            // A one-shot: no signals (the default SIGTERM ends it), no health server, no
            // Events; the API only for `--namespace`.
            let connection = match &settings.namespace {
                Some(_) => Some(crate::kube::connection::connect(&settings.connection).await?),
                None => None,
            };
            inspect::run(settings, connection).await
        }
        cli::Job::Node(settings) => {
            let start = Start {
                connection: &settings.connection,
                metrics_listen: settings.metrics_listen,
                events: EventsOn::Node {
                    node_name: settings.node_name.as_deref(),
                },
            };
            let (sidecar, metrics) = startup::start(start, |registry, readiness| {
                node::register(&settings, registry, readiness)
            })
            .await?;
            node::run(settings, sidecar, metrics).await
        }
        cli::Job::ApproveKubeletCsr(settings) => {
            let start = Start {
                connection: &settings.connection,
                metrics_listen: settings.metrics_listen,
                events: EventsOn::Nothing,
            };
            let (sidecar, metrics) = startup::start(start, approve::register).await?;
            approve::run(settings, sidecar, metrics).await
        }
        cli::Job::RestartOnChange(settings) => {
            let events = match (&settings.pod_namespace, &settings.pod_name) {
                (Some(namespace), Some(pod_name)) => EventsOn::Pod {
                    namespace,
                    pod_name: Some(pod_name),
                },
                _ => EventsOn::Nothing,
            };
            let start = Start {
                connection: &settings.connection,
                metrics_listen: settings.metrics_listen,
                events,
            };
            let (sidecar, metrics) = startup::start(start, |registry, readiness| {
                restart::register(&settings, registry, readiness)
            })
            .await?;
            restart::run(settings, sidecar, metrics).await
        }
    }
}
