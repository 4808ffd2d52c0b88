//! The intermediate phase, after signers, bundles and targets: intermediate CAs, the bundles
//! that collect them, union bundles, and the delayed publication of each intermediate — in
//! that order, so trust is written before anything that needs it. Decisions are
//! `intermediate`'s.
//!
//! Never a write without a reason: an intermediate is written only when `intermediate::decide`
//! says so, a bundle or union only when its set of CAs changes (any order is kept), a published
//! copy only when it does not hold the current CA (and then only once the delay has passed,
//! unless it is missing, unusable or expired).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;

use crate::base::time::rfc3339;
use crate::pki::{Cert, KeyPairPem};
use crate::regenerate::config::{Intermediate, ObjectRef};
use crate::regenerate::ctx::{Bundles, Ctx, ReadSecret, Signers, stored};
use crate::regenerate::decide;
use crate::regenerate::intermediate::{self, Publication};
use crate::regenerate::objects::{
    BundleKind, ca_data, new_tls_secret, write_bundle, write_managed_secret,
};
use crate::regenerate::report::{FailureKind, Report};
use crate::regenerate::write::{Built, Change, Plan};

/// Runs the phase over the intermediates as read (config order).
pub(crate) async fn run(
    ctx: &Ctx<'_>,
    reads: Vec<ReadSecret>,
    signers: &Signers,
    bundles: &Bundles,
    report: &mut Report,
) {
    let rotation = ctx.rotation;

    // 1. Each intermediate, then the bundle that collects it.
    let mut stored: Vec<Option<KeyPairPem>> = Vec::new();
    let mut collected: Vec<(ObjectRef, Option<Vec<Cert>>)> = Vec::new();
    for (config, read) in rotation.intermediates.iter().zip(reads) {
        let pair = match one(ctx, config, read, signers, bundles, report).await {
            Ok(pair) => {
                let cert = pair.cert();
                report
                    .not_after
                    .push(("target", config.object.clone(), cert.not_after));
                report
                    .deadlines
                    .extend(decide::deadlines(cert, config.refresh, None, ctx.mode));
                Some(pair)
            }
            Err(err) => {
                report.fail(FailureKind::Secret, &config.object, err);
                None
            }
        };
        if let Some(bundle) = &config.bundle {
            let content = match collect(ctx, bundle, pair.as_ref(), config, report).await {
                Ok(certs) => {
                    report.note_bundle(bundle, &certs);
                    Some(certs)
                }
                Err(err) => {
                    report.fail(FailureKind::ConfigMap, bundle, err);
                    None
                }
            };
            collected.push((bundle.clone(), content));
        }
        stored.push(pair);
    }

    // 2. Unions, from the contents this pass stored.
    let mut unions_ok = true;
    for config in &rotation.unions {
        match union(ctx, config, bundles, &collected, report).await {
            Ok(certs) => report.note_bundle(&config.object, &certs),
            Err(err) => {
                report.fail(FailureKind::ConfigMap, &config.object, err);
                unions_ok = false;
            }
        }
    }

    // 3. Publication of each intermediate, once every union is written (trust first).
    for (config, pair) in rotation.intermediates.iter().zip(&stored) {
        let Some(publish) = &config.publish else {
            continue;
        };
        let outcome = match pair {
            None => Err(format!("skipped, its CA {} is unavailable", config.object)),
            Some(_) if !unions_ok => Err("skipped until every union bundle is written".to_owned()),
            Some(pair) => {
                // The source's annotations (its dates, issuer, refresh period, component), as
                // OpenShift's `ManageCSRSigner` copies them since 4.15.
                let annotations = if publish.copy_annotations {
                    match ctx.read_secret(&config.object).await {
                        Ok((Some(secret), _)) => secret.metadata.annotations.unwrap_or_default(),
                        _ => BTreeMap::new(),
                    }
                } else {
                    BTreeMap::new()
                };
                publish_ca(
                    ctx,
                    &publish.object,
                    pair,
                    publish.delay,
                    &annotations,
                    report,
                )
                .await
            }
        };
        if let Err(err) = outcome {
            report.fail(FailureKind::Secret, &publish.object, err);
        }
    }
}

/// One intermediate CA: the pair now stored.
async fn one(
    ctx: &Ctx<'_>,
    config: &Intermediate,
    read: ReadSecret,
    signers: &Signers,
    bundles: &Bundles,
    report: &mut Report,
) -> Result<KeyPairPem, String> {
    let rotation = ctx.rotation;
    let (signer, roots) = signers.issuer(rotation, config.signer, bundles)?;
    let (existing, found) = read?;
    // Someone else's CA from the future is left alone (as a target is).
    if let Some(pair) = found.pair()
        && let Some(reason) =
            ctx.foreign_from_the_future(&config.object, existing.as_ref(), pair.cert(), None)
    {
        return Err(format!("skipped: {reason}"));
    }
    let triggered = signers.triggered[config.signer];
    write_managed_secret(
        ctx,
        &config.object,
        "target",
        existing,
        report,
        |found| {
            decide::not_yet_valid(found, rotation.backdate, ctx.now)
                .or_else(|| {
                    intermediate::decide(found, config, &roots, signer.cert(), ctx.mode, ctx.now)
                })
                .or_else(|| decide::after_trigger(found, signer.cert(), triggered, ctx.mode))
        },
        || {
            intermediate::generate(
                rotation.key_type,
                signer,
                &config.common_name,
                ctx.now,
                rotation.backdate,
                config.validity,
            )
        },
    )
    .await
}

/// The bundle collecting an intermediate's CAs: every unexpired CA it held, plus the current
/// one; written without the `ca-bundle` label, as `ManageCSRIntermediateCABundle` creates it.
async fn collect(
    ctx: &Ctx<'_>,
    bundle: &ObjectRef,
    pair: Option<&KeyPairPem>,
    config: &Intermediate,
    report: &mut Report,
) -> Result<Vec<Cert>, String> {
    let pair = pair.ok_or_else(|| format!("skipped, its CA {} is unavailable", config.object))?;
    let chain = intermediate::collected(pair);
    let desired = |certs: &[Cert]| decide::bundle(certs, &chain, &[], ctx.now);
    let (existing, _) = ctx.read_bundle(bundle).await?;
    write_bundle(
        ctx,
        bundle,
        existing,
        BundleKind::Collected,
        desired,
        report,
    )
    .await
}

/// A union bundle: the unexpired CAs of its sources as this pass stored them (`bundles`,
/// `collected`), or as read for another component's bundle.
async fn union(
    ctx: &Ctx<'_>,
    config: &crate::regenerate::config::Union,
    bundles: &Bundles,
    collected: &[(ObjectRef, Option<Vec<Cert>>)],
    report: &mut Report,
) -> Result<Vec<Cert>, String> {
    let rotation = ctx.rotation;
    let mut sources: Vec<Vec<Cert>> = Vec::new();
    let mut unavailable = Vec::new();
    for source in &config.sources {
        let content = rotation
            .bundles
            .iter()
            .zip(bundles)
            .find(|(b, _)| b.object == *source)
            .map(|(_, content)| content)
            .or_else(|| {
                collected
                    .iter()
                    .find(|(object, _)| object == source)
                    .map(|(_, content)| content)
            });
        match content {
            Some(Some(certs)) => sources.push(certs.clone()),
            Some(None) => unavailable.push(source.to_string()),
            // Another component's bundle, read only: a missing one adds nothing; an
            // unreadable one fails the union rather than drop its CAs.
            None => match ctx.read_bundle(source).await {
                Ok((_, certs)) => sources.push(certs),
                Err(err) => unavailable.push(format!("{source} ({err})")),
            },
        }
    }
    if !unavailable.is_empty() {
        return Err(format!(
            "skipped, source {} unavailable",
            unavailable.join(", ")
        ));
    }
    let sources: Vec<&[Cert]> = sources.iter().map(Vec::as_slice).collect();
    let desired = intermediate::union(&sources, ctx.now);
    if desired.is_empty() {
        // Never an empty client CA bundle: that would lock every client out.
        return Err("skipped, its sources hold no unexpired CA".to_owned());
    }
    let (existing, _) = ctx.read_bundle(&config.object).await?;
    write_bundle(
        ctx,
        &config.object,
        existing,
        BundleKind::Union,
        |_| desired.clone(),
        report,
    )
    .await
}

/// Publishes `source` (the CA alone in `tls.crt`, its key) at `object` when
/// [`intermediate::publication`] says so; otherwise notes when it will.
async fn publish_ca(
    ctx: &Ctx<'_>,
    object: &ObjectRef,
    source: &KeyPairPem,
    delay: Duration,
    annotations: &BTreeMap<String, String>,
    report: &mut Report,
) -> Result<(), String> {
    let (existing, found) = ctx.read_secret(object).await?;
    if let Some(pair) = found.pair() {
        report
            .not_after
            .push(("published", object.clone(), pair.cert().not_after));
        report.deadlines.push(pair.cert().not_after);
    }
    let wait = ctx
        .write(
            "published",
            object,
            existing,
            report,
            |existing: Option<&Secret>| {
                let found = stored(existing);
                let (label, reason) = match intermediate::publication(
                    source.cert(),
                    &found,
                    delay,
                    ctx.rotation.backdate,
                    ctx.now,
                ) {
                    Publication::Current => return Ok(Plan::Keep(None)),
                    Publication::Wait { until } => return Ok(Plan::Keep(Some(until))),
                    Publication::Now { label, reason } => (label, reason),
                };
                let existing = existing.cloned();
                Ok(Plan::Write(Change {
                    label,
                    reason: reason.clone(),
                    if_held: Ok(None),
                    build: Box::new(move || {
                        let secret = published(existing, object, source, annotations);
                        Ok(Built {
                            object: secret,
                            then: None,
                            log: format!("CA published (serial {})", source.cert().serial),
                            event: Some((
                                "SignerPublished",
                                format!(
                                    "Published CA {} to {object} ({reason})",
                                    source.cert().common_name.as_deref().unwrap_or_default()
                                ),
                            )),
                        })
                    }),
                }))
            },
        )
        .await?;
    if let Some(until) = wait {
        tracing::info!(secret = %object, publish_at = %rfc3339(until), "a new CA waits for its trust to propagate before it is published");
        report.deadlines.push(until);
    }
    Ok(())
}

/// `existing` (or a new Secret) holding `source` as a published CA (`tls.crt` the CA alone),
/// with every annotation the source has, at the source's value (library-go's `ApplySecret`
/// merge): none of the previous CA's dates stays behind.
fn published(
    existing: Option<Secret>,
    object: &ObjectRef,
    source: &KeyPairPem,
    annotations: &BTreeMap<String, String>,
) -> Secret {
    let mut secret = existing.unwrap_or_else(|| new_tls_secret(object));
    secret.data = Some(ca_data(source));
    if !annotations.is_empty() {
        secret
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(annotations.clone());
    }
    secret
}
