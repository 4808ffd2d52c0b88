//! The engine of the `tls-load` binary: workers that connect, handshake, send one `GET /` and
//! read the response in a loop, and the report of what they saw.
//!
//! The binary turns flags into [`Settings`] (reading files, building the rustls config) and calls
//! [`run`]; this module does no file I/O and never exits the process.

mod observe;
mod report;
mod seen;
mod settings;
mod worker;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use anyhow::Context;
use tokio::time::Instant;

pub use observe::{CountingStore, CountingVerifier, Observer};
pub use report::Summary;
pub use settings::Settings;

/// Runs the workers until the deadline or the request budget and merges what they saw.
///
/// # Errors
///
/// Only when a worker panicked; failed attempts are counted in the [`Summary`].
///
/// # Panics
///
/// If `settings.duration` is so large that the deadline overflows an `Instant`.
pub async fn run(settings: Arc<Settings>) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let deadline = started + settings.duration;
    let budget = Arc::new(AtomicU64::new(settings.requests.unwrap_or(u64::MAX)));
    let pacer = settings
        .rate
        .map(|rate| Arc::new(worker::Pacer::new(started, rate)));
    let workers: Vec<_> = (0..settings.concurrency)
        .map(|_| {
            tokio::spawn(worker::worker(
                Arc::clone(&settings),
                deadline,
                Arc::clone(&budget),
                pacer.clone(),
            ))
        })
        .collect();
    let mut tally = report::Tally::default();
    for worker in workers {
        tally.merge(worker.await.context("a worker panicked")?);
    }
    Ok(Summary::new(
        tally,
        started.elapsed(),
        settings.observer.as_deref(),
    ))
}
