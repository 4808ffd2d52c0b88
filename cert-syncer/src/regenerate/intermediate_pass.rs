//! The last step of a pass, after signers, bundles and targets: intermediate CAs, the bundles
//! that collect them, union bundles, the delayed publication of each intermediate, and plain
//! copies — in that order, so trust is written before anything that needs it. Decisions are
//! `intermediate`'s; writes carry the resourceVersion they were decided on and a conflict
//! re-reads and decides again, as everywhere in `pass`.
//!
//! Never a write without a reason: an intermediate is written only when `intermediate::decide`
//! says so, a bundle or union only when its set of CAs changes (any order is kept), a published
//! copy only when it does not hold the current CA (and then only once the delay has passed,
//! unless it is missing, unusable or expired), a copy only when its data differs from the
//! source's. A copy whose source is missing is left as it is (library-go's resource-sync would
//! delete it: removing the last good material is never ours to do).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use super::config::ObjectRef;
use super::decide::{self, Found};
use super::intermediate::{self, Publication};
use super::pass::{BundleKind, Pass, Report, Written};
use crate::error::{chain, is_conflict};
use crate::kind::Kind as ObjectKind;
use crate::pki::{Cert, KeyPairPem};

/// Attempts per object when writes conflict (as `pass`).
pub(super) const MAX_ATTEMPTS: usize = 5;

impl Pass<'_> {
    /// Runs the step. `signers` are the signers as stored after this pass (`None`: failed),
    /// `triggered` whether the manual trigger rotated each one in this pass, `bundles` the
    /// content of each declared bundle after this pass (`None`: failed).
    pub(super) async fn run_intermediates(
        &self,
        signers: &[Option<KeyPairPem>],
        triggered: &[bool],
        bundles: &[Option<Vec<Cert>>],
        report: &mut Report,
    ) {
        let rotation = self.rotation;
        if rotation.intermediates.is_empty()
            && rotation.unions.is_empty()
            && rotation.copies.is_empty()
        {
            return;
        }
        let mut reads = Vec::new();
        for config in &rotation.intermediates {
            reads.push(self.read_secret(&config.object).await);
        }
        // The clock check of `pass`, over the intermediates ours wrote: our own fresh CA in the
        // future means our clock is behind; refuse this step rather than replace it.
        let ours: Vec<(String, &Cert)> = rotation
            .intermediates
            .iter()
            .zip(&reads)
            .filter_map(|(config, read)| match read {
                Ok((Some(secret), Some(Ok(pair))))
                    if super::pass::written_by_us(secret, pair.cert()) =>
                {
                    Some((format!("secret {}", config.object), pair.cert()))
                }
                _ => None,
            })
            .collect();
        if let Err(reason) = decide::clock_check(
            ours.iter().map(|(object, cert)| (object.as_str(), *cert)),
            rotation.backdate,
            self.now,
            self.apiserver_now,
        ) {
            report.failures.push(format!("clock: {reason}"));
            return;
        }

        // 1. Each intermediate, then the bundle that collects it.
        let mut stored: Vec<Option<KeyPairPem>> = Vec::new();
        let mut collected: Vec<(ObjectRef, Option<Vec<Cert>>)> = Vec::new();
        for (config, read) in rotation.intermediates.iter().zip(reads) {
            let outcome = self
                .ensure_intermediate(config, read, signers, triggered, bundles, report)
                .await;
            let pair = match outcome {
                Ok(pair) => {
                    let cert = pair.cert();
                    report
                        .not_after
                        .push(("target", config.object.clone(), cert.not_after));
                    report.deadlines.extend(decide::deadlines(
                        cert,
                        config.refresh,
                        None,
                        self.mode,
                    ));
                    Some(pair)
                }
                Err(err) => {
                    report
                        .failures
                        .push(format!("secret {}: {err}", config.object));
                    None
                }
            };
            if let Some(bundle) = &config.bundle {
                let content = match &pair {
                    None => {
                        report.failures.push(format!(
                            "configmap {bundle}: skipped, its CA {} is unavailable",
                            config.object
                        ));
                        None
                    }
                    Some(pair) => {
                        let chain = intermediate::collected(pair);
                        // Every unexpired CA it held, plus the current one; written without
                        // the `ca-bundle` label, as `ManageCSRIntermediateCABundle` creates it.
                        let desired = |certs: &[Cert]| decide::bundle(certs, &chain, &[], self.now);
                        let outcome = match self.read_bundle(bundle).await {
                            Err(err) => Err(err),
                            Ok((map, certs)) => {
                                self.converge_bundle(
                                    bundle,
                                    map,
                                    certs,
                                    BundleKind::Collected,
                                    desired,
                                    report,
                                )
                                .await
                            }
                        };
                        match outcome {
                            Ok(certs) => {
                                self.note_bundle(bundle, &certs, report);
                                Some(certs)
                            }
                            Err(err) => {
                                report.failures.push(format!("configmap {bundle}: {err}"));
                                None
                            }
                        }
                    }
                };
                collected.push((bundle.clone(), content));
            }
            stored.push(pair);
        }

        // 2. Unions, from the contents this pass stored.
        let mut unions: Vec<(ObjectRef, bool)> = Vec::new();
        for config in &rotation.unions {
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
                    None => match self.read_bundle(source).await {
                        Ok((_, certs)) => sources.push(certs),
                        Err(err) => unavailable.push(format!("{source} ({err})")),
                    },
                }
            }
            if !unavailable.is_empty() {
                report.failures.push(format!(
                    "configmap {}: skipped, source {} unavailable",
                    config.object,
                    unavailable.join(", ")
                ));
                unions.push((config.object.clone(), false));
                continue;
            }
            let sources: Vec<&[Cert]> = sources.iter().map(Vec::as_slice).collect();
            let desired = intermediate::union(&sources, self.now);
            if desired.is_empty() {
                // Never an empty client CA bundle: that would lock every client out.
                report.failures.push(format!(
                    "configmap {}: skipped, its sources hold no unexpired CA",
                    config.object
                ));
                unions.push((config.object.clone(), false));
                continue;
            }
            match self.ensure_union(&config.object, desired, report).await {
                Ok(certs) => {
                    self.note_bundle(&config.object, &certs, report);
                    unions.push((config.object.clone(), true));
                }
                Err(err) => {
                    report
                        .failures
                        .push(format!("configmap {}: {err}", config.object));
                    unions.push((config.object.clone(), false));
                }
            }
        }

        // 3. Publication of each intermediate, once every union is written (trust first).
        let unions_ok = unions.iter().all(|(_, ok)| *ok);
        for (config, pair) in rotation.intermediates.iter().zip(&stored) {
            let Some(publish) = &config.publish else {
                continue;
            };
            let Some(pair) = pair else {
                report.failures.push(format!(
                    "secret {}: skipped, its CA {} is unavailable",
                    publish.object, config.object
                ));
                continue;
            };
            if !unions_ok {
                report.failures.push(format!(
                    "secret {}: skipped until every union bundle is written",
                    publish.object
                ));
                continue;
            }
            // The source's annotations (its dates, issuer, refresh period, component), as
            // OpenShift's `ManageCSRSigner` copies them since 4.15.
            let annotations = if publish.copy_annotations {
                match self.read_secret(&config.object).await {
                    Ok((Some(secret), _)) => secret.metadata.annotations.unwrap_or_default(),
                    _ => BTreeMap::new(),
                }
            } else {
                BTreeMap::new()
            };
            if let Err(err) = self
                .ensure_published(&publish.object, pair, publish.delay, &annotations, report)
                .await
            {
                report
                    .failures
                    .push(format!("secret {}: {err}", publish.object));
            }
        }

        // 4. Copies.
        for copy in &rotation.copies {
            if let Err(err) = self.ensure_copy(copy, report).await {
                report.failures.push(format!(
                    "{} {}: {err}",
                    match copy.kind {
                        ObjectKind::Secret => "secret",
                        ObjectKind::ConfigMap => "configmap",
                    },
                    copy.to
                ));
            }
        }
    }

    async fn ensure_intermediate(
        &self,
        config: &super::config::Intermediate,
        read: Result<(Option<Secret>, Found), String>,
        signers: &[Option<KeyPairPem>],
        triggered: &[bool],
        bundles: &[Option<Vec<Cert>>],
        report: &mut Report,
    ) -> Result<KeyPairPem, String> {
        let rotation = self.rotation;
        let signer = signers[config.signer].as_ref().ok_or_else(|| {
            format!(
                "skipped, signer {} unavailable",
                rotation.signers[config.signer].object
            )
        })?;
        let mut roots: Vec<Cert> = Vec::new();
        for (bundle, content) in rotation.bundles.iter().zip(bundles) {
            if bundle.signers.contains(&config.signer) {
                roots.extend(
                    content
                        .as_ref()
                        .ok_or("skipped, its signer's CA bundle is unavailable")?
                        .iter()
                        .cloned(),
                );
            }
        }
        let (object, found) = read?;
        // Someone else's CA from the future is left alone (see `pass`).
        if let (Some(secret), Some(Ok(pair))) = (&object, &found)
            && !super::pass::written_by_us(secret, pair.cert())
        {
            decide::clock_check(
                [(format!("secret {}", config.object).as_str(), pair.cert())],
                rotation.backdate,
                self.now,
                None,
            )
            .map_err(|reason| format!("skipped: {reason}"))?;
        }
        self.ensure_secret(
            &config.object,
            "target",
            object,
            found,
            report,
            |found| {
                decide::not_yet_valid(found, rotation.backdate, self.now)
                    .or_else(|| {
                        intermediate::decide(
                            found,
                            config,
                            &roots,
                            signer.cert(),
                            self.mode,
                            self.now,
                        )
                    })
                    .or_else(|| {
                        decide::after_trigger(
                            found,
                            signer.cert(),
                            triggered[config.signer],
                            self.mode,
                        )
                    })
            },
            |_| {
                intermediate::generate(
                    rotation.key_type,
                    signer,
                    &config.common_name,
                    self.now,
                    rotation.backdate,
                    config.validity,
                )
            },
        )
        .await
    }

    /// The unexpired CAs of the bundles `bundle` includes (a missing one adds nothing; an
    /// unreadable one is an error, so trust is never dropped because a read failed).
    pub(super) async fn included_cas(
        &self,
        bundle: &super::config::Bundle,
    ) -> Result<Vec<Cert>, String> {
        let mut certs: Vec<Cert> = Vec::new();
        for source in &bundle.include {
            let (_, found) = self
                .read_bundle(source)
                .await
                .map_err(|err| format!("included {source}: {err}"))?;
            for cert in found {
                if !cert.is_expired_at(self.now) && !certs.iter().any(|c| c.der == cert.der) {
                    certs.push(cert);
                }
            }
        }
        Ok(certs)
    }

    /// Expiry metrics and deadlines of a bundle's CAs.
    fn note_bundle(&self, object: &ObjectRef, certs: &[Cert], report: &mut Report) {
        for cert in certs {
            report
                .not_after
                .push(("bundle", object.clone(), cert.not_after));
            report.deadlines.push(cert.not_after);
        }
    }

    /// Brings a union bundle to `desired` when its set of CAs differs; returns what is stored.
    async fn ensure_union(
        &self,
        object: &ObjectRef,
        desired: Vec<Cert>,
        report: &mut Report,
    ) -> Result<Vec<Cert>, String> {
        let (existing, certs) = self.read_bundle(object).await?;
        let desired = |_: &[Cert]| desired.clone();
        self.converge_bundle(object, existing, certs, BundleKind::Union, desired, report)
            .await
    }

    /// Publishes `source` (the CA alone in `tls.crt`, its key) at `object` when
    /// [`intermediate::publication`] says so; otherwise reports when it will.
    async fn ensure_published(
        &self,
        object: &ObjectRef,
        source: &KeyPairPem,
        delay: std::time::Duration,
        annotations: &BTreeMap<String, String>,
        report: &mut Report,
    ) -> Result<(), String> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &object.namespace);
        let rotation = self.rotation;
        for _ in 0..MAX_ATTEMPTS {
            let (existing, found) = self.read_secret(object).await?;
            refuse_foreign_type(object, existing.as_ref())?;
            if let Some(Ok(pair)) = &found {
                report
                    .not_after
                    .push(("published", object.clone(), pair.cert().not_after));
                report.deadlines.push(pair.cert().not_after);
            }
            let (label, reason) = match intermediate::publication(
                source.cert(),
                &found,
                delay,
                rotation.backdate,
                self.now,
            ) {
                Publication::Current => return Ok(()),
                Publication::Wait { until } => {
                    tracing::info!(secret = %object, publish_at = %crate::time::rfc3339(until), "a new CA waits for its trust to propagate before it is published");
                    report.deadlines.push(until);
                    return Ok(());
                }
                Publication::Now { label, reason } => (label, reason),
            };
            if self
                .held("published", "secret", object, label, &reason, report)
                .await
            {
                return Ok(());
            }
            let data = BTreeMap::from([
                (
                    "tls.crt".to_owned(),
                    ByteString(source.cert().pem().into_bytes()),
                ),
                (
                    "tls.key".to_owned(),
                    ByteString(source.key_pem.clone().into_bytes()),
                ),
            ]);
            let mut secret = match existing.clone() {
                Some(mut secret) => {
                    secret.data = Some(data);
                    secret
                }
                None => Secret {
                    metadata: ObjectMeta {
                        name: Some(object.name.clone()),
                        namespace: Some(object.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    type_: Some("kubernetes.io/tls".to_owned()),
                    data: Some(data),
                    ..Secret::default()
                },
            };
            // Every annotation the source has, with the source's value (library-go's
            // `ApplySecret` merge): none of the previous CA's dates stays behind.
            if !annotations.is_empty() {
                secret
                    .metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .extend(annotations.clone());
            }
            self.may_write(object)?;
            let result = match &existing {
                None => api.create(&PostParams::default(), &secret).await,
                Some(_) => {
                    api.replace(&object.name, &PostParams::default(), &secret)
                        .await
                }
            };
            match result {
                Ok(written) => {
                    self.remember(object, existing.as_ref(), &written);
                    tracing::info!(secret = %object, %reason, serial = %source.cert().serial, "CA published");
                    self.events
                        .record(
                            "SignerPublished",
                            &format!("secret/{object}"),
                            format!(
                                "Published CA {} to {object} ({reason})",
                                source.cert().common_name.as_deref().unwrap_or_default()
                            ),
                            false,
                        )
                        .await;
                    report.written.push(Written {
                        kind: "published",
                        object: object.clone(),
                        reason,
                        reason_label: label,
                    });
                    return Ok(());
                }
                Err(err) if is_conflict(&err) => {
                    report.conflicts += 1;
                    tracing::info!(secret = %object, "changed since read (conflict); reading again");
                    self.read_again(object, existing.as_ref())
                        .await
                        .map_err(|err| format!("after a conflict: {err}"))?;
                }
                Err(err) => return Err(format!("cannot write: {}", chain(&err))),
            }
        }
        Err(format!("still conflicting after {MAX_ATTEMPTS} attempts"))
    }
}

/// A Secret of a type regenerate does not write a key into (see `pass`).
pub(super) fn refuse_foreign_type(
    object: &ObjectRef,
    existing: Option<&Secret>,
) -> Result<(), String> {
    match existing.and_then(|s| s.type_.as_deref()) {
        Some(type_) if !["kubernetes.io/tls", "Opaque"].contains(&type_) => Err(format!(
            "secret {object} has type {type_}, which regenerate does not manage; refusing to write a key into it"
        )),
        _ => Ok(()),
    }
}
