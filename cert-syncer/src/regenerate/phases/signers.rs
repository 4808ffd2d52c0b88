//! The signer phase: each declared signer CA is kept, or regenerated when `decide::signer`
//! (or the manual rotation trigger, or a notBefore in the future) says so.

use crate::base::time::rfc3339;
use crate::pki::{self, KeyPairPem};
use crate::regenerate::config::Signer;
use crate::regenerate::ctx::{Ctx, ReadSecret, Signers};
use crate::regenerate::decide::{self, Reason};
use crate::regenerate::objects::write_managed_secret;
use crate::regenerate::report::{FailureKind, Report};

/// Runs the phase over the signers as read (config order).
pub(crate) async fn run(ctx: &Ctx<'_>, reads: Vec<ReadSecret>, report: &mut Report) -> Signers {
    let mut signers = Signers {
        pairs: Vec::new(),
        triggered: Vec::new(),
    };
    for (config, read) in ctx.rotation.signers.iter().zip(reads) {
        let outcome = one(ctx, config, read, report).await;
        signers.triggered.push(
            report.written.last().is_some_and(|w| {
                w.object == config.object && w.reason_label == Reason::TRIGGER_LABEL
            }),
        );
        match outcome {
            Ok(pair) => {
                let cert = pair.cert();
                report
                    .not_after
                    .push(("signer", config.object.clone(), cert.not_after));
                report
                    .deadlines
                    .extend(decide::deadlines(cert, config.refresh, None, ctx.mode));
                signers.pairs.push(Some(pair));
            }
            Err(err) => {
                report.fail(FailureKind::Secret, &config.object, err);
                signers.pairs.push(None);
            }
        }
    }
    signers
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
    write_managed_secret(
        ctx,
        &config.object,
        "signer",
        existing,
        report,
        |found| {
            decide::not_yet_valid(found, rotation.backdate, ctx.now)
                .or_else(|| decide::signer(found, config, ctx.mode, ctx.now))
        },
        || {
            let cn = format!(
                "{}_{}@{}",
                config.object.namespace, config.object.name, ctx.now
            );
            pki::new_signer_of(
                rotation.key_type,
                &cn,
                ctx.now,
                rotation.backdate,
                config.validity,
            )
        },
    )
    .await
}
