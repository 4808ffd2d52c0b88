//! The signer step: a declared signer CA is kept, or regenerated when `decide::signer` (or the
//! manual rotation trigger, or a notBefore in the future) says so.

use crate::base::time::rfc3339;
use crate::pki::{self, KeyPairPem};
use crate::regenerate::config::Signer;
use crate::regenerate::ctx::{Ctx, Outcome, ReadSecret};
use crate::regenerate::decide::{self, Reason, Stored};
use crate::regenerate::keys::KeyUse;
use crate::regenerate::objects::{Managed, write_managed_secret};
use crate::regenerate::report::{FailureKind, Report};

/// Runs the step of signer `config` over what was read: the pair stored now, and whether the
/// manual trigger rotated it.
pub(crate) async fn step(
    ctx: &Ctx<'_>,
    config: &Signer,
    read: ReadSecret,
    report: &mut Report,
) -> Outcome {
    let outcome = one(ctx, config, read, report).await;
    let triggered = report
        .written
        .last()
        .is_some_and(|w| w.object == config.object && w.reason_label == Reason::TRIGGER_LABEL);
    match outcome {
        Ok(pair) => {
            let cert = pair.cert();
            report
                .not_after
                .push(("signer", config.object.clone(), cert.not_after));
            report
                .deadlines
                .extend(decide::deadlines(cert, config.refresh, None, ctx.mode));
            Outcome::Pair {
                pair: Some(pair),
                triggered,
            }
        }
        Err(err) => {
            report.fail(FailureKind::Secret, &config.object, err);
            Outcome::Pair {
                pair: None,
                triggered,
            }
        }
    }
}

/// Why the signer must be regenerated, on what `found` holds (the manual trigger aside).
pub(crate) fn reason(ctx: &Ctx<'_>, config: &Signer, found: &Stored) -> Option<Reason> {
    decide::not_yet_valid(found, ctx.rotation.backdate, ctx.now)
        .or_else(|| decide::signer(found, config, ctx.mode, ctx.now))
}

/// One signer: the pair now stored.
async fn one(
    ctx: &Ctx<'_>,
    config: &Signer,
    read: ReadSecret,
    report: &mut Report,
) -> Result<KeyPairPem, String> {
    let rotation = ctx.rotation;
    let (existing, found) = read?;
    // Someone else's signer from the future by our clock (and the apiserver's, if it told us)
    // is left alone and reported, as a target is.
    if let Some(pair) = found.pair()
        && ctx
            .foreign_from_the_future(
                &config.object,
                existing.as_ref(),
                pair.cert(),
                ctx.apiserver_now,
            )
            .is_some()
    {
        return Err(format!(
            "skipped: its certificate starts at {}, later than now ({}) by more than the {}s \
             margin, and it was not written by a regenerate",
            rfc3339(pair.cert().not_before),
            rfc3339(ctx.now),
            rotation.backdate.as_secs()
        ));
    }
    let managed = Managed {
        object: &config.object,
        kind: "signer",
        key: KeyUse::Ca,
        decide: |found: &Stored| reason(ctx, config, found),
        generate: |key| {
            let cn = format!(
                "{}_{}@{}",
                config.object.namespace, config.object.name, ctx.now
            );
            pki::new_signer_with(key, &cn, ctx.now, rotation.backdate, config.validity)
        },
        untrusted: None,
    };
    write_managed_secret(ctx, managed, existing, report).await
}
