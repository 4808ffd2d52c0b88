//! The bundle phase: each declared CA bundle holds its signers' current CAs, every CA it
//! already held until that expires (the rotation overlap; longer while a leaf it issued is
//! still in use), and the CAs of the bundles it includes.

use crate::pki::{Cert, KeyPairPem};
use crate::regenerate::config::Bundle;
use crate::regenerate::ctx::{Bundles, Ctx, ReadBundle, Signers};
use crate::regenerate::decide;
use crate::regenerate::objects::{BundleKind, signer_cn_prefix, write_bundle};
use crate::regenerate::report::{FailureKind, Report};

/// Runs the phase over the bundles as read (config order). `in_use`: the managed leaves as
/// read, with their signer's index.
pub(crate) async fn run(
    ctx: &Ctx<'_>,
    reads: Vec<ReadBundle>,
    signers: &Signers,
    in_use: &[(usize, Cert)],
    report: &mut Report,
) -> Bundles {
    let rotation = ctx.rotation;
    let mut contents: Bundles = Vec::new();
    for (config, read) in rotation.bundles.iter().zip(reads) {
        let outcome = match read {
            Err(err) => Err(err),
            Ok((existing, _)) => one(ctx, config, existing, signers, in_use, report).await,
        };
        match outcome {
            Ok(certs) => {
                report.note_bundle(&config.object, &certs);
                contents.push(Some(certs));
            }
            Err(err) => {
                report.fail(FailureKind::ConfigMap, &config.object, err);
                contents.push(None);
            }
        }
    }
    contents
}

/// One bundle: what it must hold, written when its set of CAs differs.
async fn one(
    ctx: &Ctx<'_>,
    config: &Bundle,
    existing: Option<k8s_openapi::api::core::v1::ConfigMap>,
    signers: &Signers,
    in_use: &[(usize, Cert)],
    report: &mut Report,
) -> Result<Vec<Cert>, String> {
    let rotation = ctx.rotation;
    let missing: Vec<String> = config
        .signers
        .iter()
        .filter(|i| signers.pairs[**i].is_none())
        .map(|i| rotation.signers[*i].object.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "skipped, signer {} unavailable",
            missing.join(", ")
        ));
    }
    // CAs of the bundles it includes, held like its signers'.
    let included = included_cas(ctx, config).await?;
    let signer_certs: Vec<&Cert> = config
        .signers
        .iter()
        .filter_map(|i| signers.pairs[*i].as_ref().map(KeyPairPem::cert))
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
    let own: Vec<String> = config
        .signers
        .iter()
        .filter_map(|i| signers.pairs[*i].as_ref())
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
