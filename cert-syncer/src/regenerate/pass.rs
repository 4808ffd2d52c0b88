//! One pass over the config: a short sequence of phases in dependency order (`phases`): read
//! everything and check the clock, then signers, bundles, targets, intermediate CAs and what is
//! built from them, and copies. Every object is read once at the start of the pass (`ctx`:
//! from the watches' cache in the controller's loop, by GET with `--once`); every write goes
//! through the one write (`write`), which carries the resourceVersion it was decided on and, on
//! a conflict, reads again and decides again. All replicas compute the same decisions from the
//! same data, so after one of them writes, the others find nothing to do: no double
//! regeneration, no ping-pong.

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::brake::Brake;
use super::config::Rotation;
use super::ctx::Ctx;
pub use super::ctx::Reads;
use super::decide::Mode;
use super::phases::{bundles, copies, intermediates, read, signers, targets};
pub use super::report::Report;
use crate::events::EventRecorder;

/// What the pass needs from outside.
pub struct Pass<'a> {
    /// For writes, and for reads with [`Reads::Live`].
    pub client: &'a kube::Client,
    pub reads: Reads<'a>,
    pub rotation: &'a Rotation,
    pub mode: Mode,
    /// The time decisions use: `decide::trusted_now` of the local clock and `apiserver_now`.
    pub now: i64,
    /// The apiserver's clock at the start of the pass (`clock::apiserver_time`), if it answered.
    pub apiserver_now: Option<i64>,
    pub events: &'a Arc<EventRecorder>,
    /// The per-object write budget of the controller's loop (`None`: `--once`, one pass).
    pub brake: Option<&'a Brake>,
    /// With `--leader-elect`: cancelled when the Lease is lost. Checked before every write, so
    /// a pass running when the Lease is lost writes nothing more (a standby may be leading).
    pub lease_lost: Option<&'a CancellationToken>,
}

impl Pass<'_> {
    /// Runs the pass. Failures are collected per item; one broken item never stops the others.
    pub async fn run(&self) -> Report {
        let ctx = Ctx {
            client: self.client,
            reads: self.reads,
            rotation: self.rotation,
            mode: self.mode,
            now: self.now,
            apiserver_now: self.apiserver_now,
            events: Arc::clone(self.events),
            pending_events: Mutex::new(Vec::new()),
            brake: self.brake,
            lease_lost: self.lease_lost,
        };
        let mut report = Report::default();
        match read::run(&ctx).await {
            Err(clock) => report.failures.push(clock),
            Ok(read) => {
                let signers = signers::run(&ctx, read.signers, &mut report).await;
                let bundles =
                    bundles::run(&ctx, read.bundles, &signers, &read.in_use, &mut report).await;
                targets::run(&ctx, read.targets, &signers, &bundles, &mut report).await;
                // Our own intermediate CA in the future refuses this step and the copies.
                match read.intermediates_clock {
                    Err(clock) => report.failures.push(clock),
                    Ok(()) => {
                        intermediates::run(
                            &ctx,
                            read.intermediates,
                            &signers,
                            &bundles,
                            &mut report,
                        )
                        .await;
                        copies::run(&ctx, &mut report).await;
                    }
                }
            }
        }
        ctx.finish().await;
        report.next_deadline = report
            .deadlines
            .iter()
            .copied()
            .filter(|at| *at > self.now)
            .min();
        report
    }
}
