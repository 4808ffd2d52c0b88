//! The bundle step: a declared CA bundle holds its signers' current CAs, every CA it already
//! held until that expires (the rotation overlap; longer while a leaf it issued is still in
//! use), and the CAs of the bundles it includes. Its outcome is the bundle as stored
//! (`trust::BundleState`): what the steps that wait for it check their CA against.

use k8s_openapi::api::core::v1::ConfigMap;

use crate::pki::{Cert, KeyPairPem};
use crate::regenerate::config::Bundle;
use crate::regenerate::ctx::{Ctx, ReadBundle};
use crate::regenerate::decide;
use crate::regenerate::objects::{BundleKind, signer_cn_prefix, write_bundle};
use crate::regenerate::report::{FailureKind, Report};
use crate::regenerate::trust::{BundleState, NotWritten};

/// Runs the step of bundle `config` over what was read. `signers`: the pair each of its
/// signers stored in this pass (config order of `config.signers`); `in_use`: the managed
/// leaves as read, with their signer's index.
pub(crate) async fn step(
    ctx: &Ctx<'_>,
    config: &Bundle,
    read: ReadBundle,
    signers: &[Option<&KeyPairPem>],
    in_use: &[(usize, Cert)],
    report: &mut Report,
) -> BundleState {
    let outcome = match read {
        Err(err) => Err(err),
        Ok((existing, _)) => one(ctx, config, existing, signers, in_use, report).await,
    };
    settled(ctx, &config.object, outcome, report).await
}

/// The state a bundle's step leaves: what it holds after a write (or the brake's hold) that
/// went through, else its failure reported and the bundle as read again.
pub(crate) async fn settled(
    ctx: &Ctx<'_>,
    object: &crate::regenerate::config::ObjectRef,
    outcome: Result<Vec<Cert>, String>,
    report: &mut Report,
) -> BundleState {
    match outcome {
        Ok(certs) => {
            report.note_bundle(object, &certs);
            as_stored(object, certs, report)
        }
        Err(err) => {
            report.fail(FailureKind::ConfigMap, object, err.clone());
            as_read(ctx, object, NotWritten::Failed(err)).await
        }
    }
}

/// The state of a bundle (`object`) whose step did not write it (`why`): what it holds now,
/// read again.
pub(crate) async fn as_read(
    ctx: &Ctx<'_>,
    object: &crate::regenerate::config::ObjectRef,
    why: NotWritten,
) -> BundleState {
    BundleState {
        object: object.clone(),
        stored: ctx.read_bundle(object).await.map(|(_, certs)| certs),
        not_written: Some(why),
    }
}

/// The state of a bundle (`object`) whose write went through, was not needed, or was held by
/// the brake: then `certs` is what it held before, and the step's `report` says so.
pub(crate) fn as_stored(
    object: &crate::regenerate::config::ObjectRef,
    certs: Vec<Cert>,
    report: &Report,
) -> BundleState {
    let held = report
        .braked()
        .find(|h| h.object == *object)
        .map(|h| NotWritten::Held(h.release_in));
    BundleState {
        object: object.clone(),
        stored: Ok(certs),
        not_written: held,
    }
}

/// One bundle: what it must hold, written when its set of CAs differs.
async fn one(
    ctx: &Ctx<'_>,
    config: &Bundle,
    existing: Option<ConfigMap>,
    signers: &[Option<&KeyPairPem>],
    in_use: &[(usize, Cert)],
    report: &mut Report,
) -> Result<Vec<Cert>, String> {
    let rotation = ctx.rotation;
    let missing: Vec<String> = config
        .signers
        .iter()
        .zip(signers)
        .filter(|(_, pair)| pair.is_none())
        .map(|(i, _)| rotation.signers[*i].object.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "skipped, signer {} unavailable",
            missing.join(", ")
        ));
    }
    // CAs of the bundles it includes, held like its signers'.
    let included = included_cas(ctx, config).await?;
    let signer_certs: Vec<&Cert> = signers
        .iter()
        .flatten()
        .map(|pair| pair.cert())
        .chain(&included)
        .collect();
    let leaves: Vec<&Cert> = in_use
        .iter()
        .filter(|(signer, _)| config.signers.contains(signer))
        .map(|(_, cert)| cert)
        .collect();
    // What the bundle already holds stays until it expires (the rotation overlap) — except,
    // in a bundle that includes others, CAs of none of its own signers: those are exactly what
    // its includes hold now, so a CA that left its source leaves.
    let own: Vec<String> = signers
        .iter()
        .flatten()
        .filter_map(|pair| pair.cert().common_name.as_deref().map(signer_cn_prefix))
        .collect();
    let keep = |cert: &Cert| {
        config.include.is_empty()
            || cert
                .common_name
                .as_deref()
                .is_some_and(|cn| own.iter().any(|p| cn.starts_with(p.as_str())))
    };
    let desired = |certs: &[Cert]| {
        let kept: Vec<Cert> = certs.iter().filter(|c| keep(c)).cloned().collect();
        let mut desired = decide::bundle(&kept, &signer_certs, &leaves, ctx.now);
        if signer_certs.len() > 1 {
            decide::order_by_signer(&mut desired, &signer_certs);
        }
        desired
    };
    write_bundle(
        ctx,
        &config.object,
        existing,
        BundleKind::Signers,
        desired,
        report,
    )
    .await
}

/// The unexpired CAs of the bundles `bundle` includes (a missing one adds nothing; an
/// unreadable one is an error, so trust is never dropped because a read failed).
async fn included_cas(ctx: &Ctx<'_>, bundle: &Bundle) -> Result<Vec<Cert>, String> {
    let mut certs: Vec<Cert> = Vec::new();
    for source in &bundle.include {
        let (_, found) = ctx
            .read_bundle(source)
            .await
            .map_err(|err| format!("included {source}: {err}"))?;
        for cert in found {
            if !cert.is_expired_at(ctx.now) && !certs.iter().any(|c| c.der == cert.der) {
                certs.push(cert);
            }
        }
    }
    Ok(certs)
}
