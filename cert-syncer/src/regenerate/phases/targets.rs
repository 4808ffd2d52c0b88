//! The target phase: each declared leaf (serving or client certificate) is kept, or re-issued
//! by its current signer when `decide::target` (or the manual rotation trigger, or a notBefore
//! in the future) says so. It runs after the bundles, so a new leaf is trusted before it is
//! served.

use crate::pki::{self, KeyPairPem};
use crate::regenerate::config::{Identity, Target};
use crate::regenerate::ctx::{Bundles, Ctx, ReadSecret, Signers};
use crate::regenerate::decide;
use crate::regenerate::objects::write_managed_secret;
use crate::regenerate::report::{FailureKind, Report};

/// Runs the phase over the targets as read (config order).
pub(crate) async fn run(
    ctx: &Ctx<'_>,
    reads: Vec<ReadSecret>,
    signers: &Signers,
    bundles: &Bundles,
    report: &mut Report,
) {
    for (config, read) in ctx.rotation.targets.iter().zip(reads) {
        match one(ctx, config, read, signers, bundles, report).await {
            Ok((pair, signer)) => {
                let cert = pair.cert();
                report
                    .not_after
                    .push(("target", config.object.clone(), cert.not_after));
                report.deadlines.extend(decide::deadlines(
                    cert,
                    config.refresh,
                    Some(signer.cert()),
                    ctx.mode,
                ));
            }
            Err(err) => report.fail(FailureKind::Secret, &config.object, err),
        }
    }
}

/// One target: the pair now stored, and its signer.
async fn one<'s>(
    ctx: &Ctx<'_>,
    config: &Target,
    read: ReadSecret,
    signers: &'s Signers,
    bundles: &Bundles,
    report: &mut Report,
) -> Result<(KeyPairPem, &'s KeyPairPem), String> {
    let rotation = ctx.rotation;
    let (signer, roots) = signers.issuer(rotation, config.signer, bundles)?;
    let (existing, found) = read?;
    // Someone else's certificate from the future is left alone (and reported); our own got
    // here only if it is in the future by the apiserver's clock too, and is regenerated as not
    // yet valid.
    if let Some(pair) = found.pair()
        && let Some(reason) =
            ctx.foreign_from_the_future(&config.object, existing.as_ref(), pair.cert(), None)
    {
        return Err(format!("skipped: {reason}"));
    }
    let triggered = signers.triggered[config.signer];
    let pair = write_managed_secret(
        ctx,
        &config.object,
        "target",
        existing,
        report,
        |found| {
            decide::not_yet_valid(found, rotation.backdate, ctx.now)
                .or_else(|| decide::target(found, config, &roots, signer.cert(), ctx.mode, ctx.now))
                .or_else(|| decide::after_trigger(found, signer.cert(), triggered, ctx.mode))
        },
        || {
            let mut pair = pki::new_leaf_of(
                rotation.key_type,
                signer,
                &config.identity,
                ctx.now,
                rotation.backdate,
                config.validity,
            )?;
            // library-go's serving tls.crt: the leaf, then its signer.
            if matches!(config.identity, Identity::Serving { .. }) {
                pair.chain.push(signer.cert().clone());
            }
            Ok(pair)
        },
    )
    .await?;
    Ok((pair, signer))
}
