//! One pass over the config: a short sequence of phases in dependency order (`phases`): read
//! everything and check the clock, then signers, bundles, targets, intermediate CAs and what is
//! built from them, and copies. Every object is read once at the start of the pass (`ctx`:
//! from the watches' cache in the controller's loop, by GET with `--once`); every write goes
//! through the one write (`write`), which carries the resourceVersion it was decided on and, on
//! a conflict, reads again and decides again. All replicas compute the same decisions from the
//! same data, so after one of them writes, the others find nothing to do: no double
//! regeneration, no ping-pong.

use super::ctx::Ctx;
pub use super::ctx::{Pass, Reads};
use super::phases::{bundles, copies, intermediates, read, signers, targets};
pub use super::report::Report;

impl Pass<'_> {
    /// Runs the pass. Failures are collected per item; one broken item never stops the others.
    pub async fn run(&self) -> Report {
        let ctx = Ctx::new(self);
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
