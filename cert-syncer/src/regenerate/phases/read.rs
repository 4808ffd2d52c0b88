//! The first phase: every declared signer, target, bundle and intermediate CA is read once,
//! and the clock checked against what a regenerate wrote.
//!
//! A signer or target counts for the clock only when a regenerate (or library-go) wrote it
//! (its not-before annotation matches the certificate): our own fresh certificate in the
//! future means our clock is behind. Anything else with a future notBefore (written by someone
//! else, a foreign CA in a bundle) is no evidence about our clock: such a signer or target is
//! skipped on its own (by its phase), and bundle CAs do not count at all, so one stray cannot
//! stop every regeneration when the apiserver's `Date` is missing. Intermediate CAs are checked
//! apart: ours in the future refuses the intermediate step (and the copies after it) only.

use crate::pki::Cert;
use crate::regenerate::config::ObjectRef;
use crate::regenerate::ctx::{Ctx, ReadBundle, ReadSecret, written_by_us};
use crate::regenerate::decide::{self, Stored};
use crate::regenerate::report::Failure;

/// What was read, per declared item in config order.
pub(crate) struct Read {
    pub signers: Vec<ReadSecret>,
    pub targets: Vec<ReadSecret>,
    pub bundles: Vec<ReadBundle>,
    pub intermediates: Vec<ReadSecret>,
    /// The managed leaves as read, with their signer's index.
    pub in_use: Vec<(usize, Cert)>,
    /// The clock check over the intermediate CAs ours wrote.
    pub intermediates_clock: Result<(), Failure>,
}

/// Reads everything; `Err`: the clock check refused the whole pass (logged, with a
/// `ClockSkew` Event).
pub(crate) async fn run(ctx: &Ctx<'_>) -> Result<Read, Failure> {
    let rotation = ctx.rotation;
    let mut signers = Vec::new();
    for signer in &rotation.signers {
        signers.push(ctx.read_secret(&signer.object).await);
    }
    let mut targets = Vec::new();
    for target in &rotation.targets {
        targets.push(ctx.read_secret(&target.object).await);
    }
    let mut bundles = Vec::new();
    for bundle in &rotation.bundles {
        bundles.push(ctx.read_bundle(&bundle.object).await);
    }
    let ours = rotation
        .signers
        .iter()
        .map(|s| &s.object)
        .zip(&signers)
        .chain(rotation.targets.iter().map(|t| &t.object).zip(&targets));
    if let Err(reason) = check(ctx, ours, ctx.apiserver_now) {
        tracing::error!("{reason}");
        ctx.announce("ClockSkew", "clock".to_owned(), reason.clone(), true);
        return Err(Failure::clock(reason));
    }
    let mut intermediates = Vec::new();
    for intermediate in &rotation.intermediates {
        intermediates.push(ctx.read_secret(&intermediate.object).await);
    }
    let intermediates_clock = check(
        ctx,
        rotation
            .intermediates
            .iter()
            .map(|i| &i.object)
            .zip(&intermediates),
        ctx.apiserver_now,
    )
    .map_err(Failure::clock);
    // A bundle keeps an expired CA one of these was issued by until it is re-issued, see
    // `decide::bundle`.
    let in_use = rotation
        .targets
        .iter()
        .zip(&targets)
        .filter_map(|(config, read)| match read {
            Ok((_, Stored::Usable(pair))) => Some((config.signer, pair.cert().clone())),
            _ => None,
        })
        .collect();
    Ok(Read {
        signers,
        targets,
        bundles,
        intermediates,
        in_use,
        intermediates_clock,
    })
}

/// The clock check over the Secrets among `reads` that a regenerate wrote.
fn check<'r>(
    ctx: &Ctx<'_>,
    reads: impl Iterator<Item = (&'r ObjectRef, &'r ReadSecret)>,
    apiserver_now: Option<i64>,
) -> Result<(), String> {
    let seen: Vec<(String, &Cert)> = reads
        .filter_map(|(object, read)| match read {
            Ok((Some(secret), Stored::Usable(pair))) if written_by_us(secret, pair.cert()) => {
                Some((format!("secret {object}"), pair.cert()))
            }
            _ => None,
        })
        .collect();
    decide::clock_check(
        seen.iter().map(|(object, cert)| (object.as_str(), *cert)),
        ctx.rotation.backdate,
        ctx.now,
        apiserver_now,
    )
}
