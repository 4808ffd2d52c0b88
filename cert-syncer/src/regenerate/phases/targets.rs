//! The target step: a declared leaf (serving or client certificate) is kept, or re-issued by
//! its current signer when `decide::target` (or the manual rotation trigger, or a notBefore in
//! the future) says so — once every bundle that must trust that signer holds it (`trust`): it
//! runs after its signer's bundles and everything built from them (`graph`), so a new leaf is
//! trusted before it is served, and a bundle whose write was held keeps the leaf waiting.

use crate::pki::{self, Cert, KeyPairPem};
use crate::regenerate::config::{Identity, Target};
use crate::regenerate::ctx::{Ctx, ReadSecret};
use crate::regenerate::decide::{self, Reason, Stored};
use crate::regenerate::keys::KeyUse;
use crate::regenerate::objects::{Managed, write_managed_secret};
use crate::regenerate::report::{FailureKind, Report};
use crate::regenerate::trust::{self, BundleState};

/// What a target's step starts from besides its own read: its signer after the signer step,
/// and the bundles after theirs.
pub(crate) struct Issuer<'d> {
    /// The signer's pair stored now (`None`: unavailable), and whether the manual trigger
    /// rotated it in this pass.
    pub signer: Option<&'d KeyPairPem>,
    pub triggered: bool,
    /// The bundles that list the signer: the leaf must chain to what they hold.
    pub roots: Vec<&'d BundleState>,
    /// Every bundle that must hold the signer's CA before a leaf from it is written
    /// (`graph::Graph::trust`: these, and what is built from them).
    pub trusted_by: Vec<&'d BundleState>,
}

/// Runs the step of target `config` over what was read.
pub(crate) async fn step(
    ctx: &Ctx<'_>,
    config: &Target,
    read: ReadSecret,
    issuer: Issuer<'_>,
    report: &mut Report,
) {
    match one(ctx, config, read, &issuer, report).await {
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

/// Why the target must be re-issued by `signer`, on what `found` holds (`roots`: the CAs it
/// must chain to; the manual trigger on the Secret aside).
pub(crate) fn reason(
    ctx: &Ctx<'_>,
    config: &Target,
    found: &Stored,
    roots: &[Cert],
    signer: &Cert,
    triggered: bool,
) -> Option<Reason> {
    decide::not_yet_valid(found, ctx.rotation.backdate, ctx.now)
        .or_else(|| decide::target(found, config, roots, signer, ctx.mode, ctx.now))
        .or_else(|| decide::after_trigger(found, signer, triggered, ctx.mode))
}

/// One target: the pair now stored, and its signer.
async fn one<'s>(
    ctx: &Ctx<'_>,
    config: &Target,
    read: ReadSecret,
    issuer: &Issuer<'s>,
    report: &mut Report,
) -> Result<(KeyPairPem, &'s KeyPairPem), String> {
    let rotation = ctx.rotation;
    let signer = issuer.signer.ok_or_else(|| {
        format!(
            "skipped, signer {} unavailable",
            rotation.signers[config.signer].object
        )
    })?;
    let roots = trust::roots(&issuer.roots)?;
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
    let managed = Managed {
        object: &config.object,
        kind: "target",
        key: KeyUse::Leaf,
        decide: |found: &Stored| {
            reason(ctx, config, found, &roots, signer.cert(), issuer.triggered)
        },
        generate: |key| {
            let mut pair = pki::new_leaf_with(
                key,
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
        untrusted: trust::check(signer.cert(), "its signer's CA", &issuer.trusted_by).err(),
    };
    let pair = write_managed_secret(ctx, managed, existing, report).await?;
    Ok((pair, signer))
}
