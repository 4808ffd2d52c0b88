// Over 600 lines because one pass (read, clock check, signers, bundles, targets, each write with
// its conflict retry) is one transaction over shared reads; its tests live in pass_tests.rs.
//! One pass over the config, in dependency order: signers, then bundles, then targets. Every
//! object is read once at the start of the pass ([`Reads`]: from the watches' cache in the
//! controller's loop, by GET with `--once`); every write carries the resourceVersion it was
//! decided on, and a conflict (409) means another replica or the operator got there first (or
//! the cache had not caught up yet): read again (from the cache: once the watch brings a newer
//! version) and decide again, a bounded number of times. All replicas compute the same decisions from the same data,
//! so after one of them writes, the others find nothing to do: no double regeneration, no
//! ping-pong.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tokio_util::sync::CancellationToken;

use super::annotations;
use super::brake::{Brake, Held};
use super::cache::{Cache, Cached};
use super::config::{Identity, ObjectRef, Rotation};
use super::decide::{self, Found, Mode, Reason};
use crate::decode::Raw;
use crate::error::{chain, is_conflict};
use crate::events::EventRecorder;
use crate::kind::Kind as ObjectKind;
use crate::pki::{self, Cert, KeyPairPem};
use crate::time::rfc3339;

/// Secret types regenerate writes `tls.crt`/`tls.key` into. Any other type (a pull secret, a
/// service-account token) belongs to someone else: adding a private key to it is refused.
const OWNED_SECRET_TYPES: &[&str] = &["kubernetes.io/tls", "Opaque"];

/// Attempts per object when writes conflict.
const MAX_ATTEMPTS: usize = 5;

/// After a conflict, how long a pass reading from the cache waits for the watch to bring the
/// newer version (normally milliseconds) before it gives the item up until the next pass.
const CONFLICT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A Secret as read (absent: `None`) with its parsed pair.
type ReadSecret = Result<(Option<Secret>, Found), String>;
/// A CA bundle ConfigMap as read, with its parsed certificates.
type ReadBundle = Result<(Option<ConfigMap>, Vec<Cert>), String>;

/// What a pass did.
#[derive(Debug, Default)]
pub struct Report {
    /// `kind ns/name: reason`, one per write.
    pub written: Vec<Written>,
    /// `object: error`, one per failed item.
    pub failures: Vec<String>,
    /// notAfter of every managed certificate read or written (for metrics).
    pub not_after: Vec<(&'static str, ObjectRef, i64)>,
    /// Times at which a decision can change by time alone (expiries; rotation points in
    /// rotate mode).
    pub deadlines: Vec<i64>,
    /// The nearest of `deadlines` after now.
    pub next_deadline: Option<i64>,
    /// Writes refused with 409 (read again and decided again).
    pub conflicts: u64,
    /// Writes the brake withheld (see `brake`).
    pub held: Vec<Held>,
}

/// One write.
#[derive(Debug, Clone)]
pub struct Written {
    pub kind: &'static str,
    pub object: ObjectRef,
    pub reason: String,
    pub reason_label: &'static str,
}

/// Where a pass reads the declared objects.
#[derive(Clone, Copy)]
pub enum Reads<'a> {
    /// A GET of each object (`--once`: one pass, no watches worth opening).
    Live,
    /// The namespace-wide watches' cache (the controller's loop): no request per object.
    Cached(&'a Cache),
}

/// What the pass needs from outside.
pub struct Pass<'a> {
    /// For writes, and for reads with [`Reads::Live`].
    pub client: &'a kube::Client,
    pub reads: Reads<'a>,
    pub rotation: &'a Rotation,
    pub mode: Mode,
    /// The time decisions use: [`decide::trusted_now`] of the local clock and `apiserver_now`.
    pub now: i64,
    /// The apiserver's clock at the start of the pass ([`apiserver_time`]), if it answered.
    pub apiserver_now: Option<i64>,
    pub events: &'a EventRecorder,
    /// The per-object write budget of the controller's loop (`None`: `--once`, one pass).
    pub brake: Option<&'a Brake>,
    /// With `--leader-elect`: cancelled when the Lease is lost. Checked before every write, so
    /// a pass running when the Lease is lost writes nothing more (a standby may be leading).
    pub lease_lost: Option<&'a CancellationToken>,
}

impl Pass<'_> {
    /// Runs the pass. Failures are collected per item; one broken item never stops the others.
    pub async fn run(&self) -> Report {
        let mut report = Report::default();
        let rotation = self.rotation;

        // Read everything first, for the clock check.
        let mut signers: Vec<ReadSecret> = Vec::new();
        for signer in &rotation.signers {
            signers.push(self.read_secret(&signer.object).await);
        }
        let mut targets: Vec<ReadSecret> = Vec::new();
        for target in &rotation.targets {
            targets.push(self.read_secret(&target.object).await);
        }
        let mut bundles: Vec<ReadBundle> = Vec::new();
        for bundle in &rotation.bundles {
            bundles.push(self.read_bundle(&bundle.object).await);
        }
        // A signer or target counts for the clock only when a regenerate (or library-go) wrote
        // it (its not-before annotation matches the certificate): our own fresh certificate in
        // the future means our clock is behind. Anything else with a future notBefore (written
        // by someone else, a foreign CA in a bundle) is no evidence about our clock: such a
        // signer or target is skipped on its own below, and bundle CAs do not count at all, so
        // one stray cannot stop every regeneration when the apiserver's `Date` is missing.
        let mut seen: Vec<(String, &Cert)> = Vec::new();
        for (config, read) in rotation
            .signers
            .iter()
            .map(|s| &s.object)
            .zip(&signers)
            .chain(rotation.targets.iter().map(|t| &t.object).zip(&targets))
        {
            if let Ok((Some(secret), Some(Ok(pair)))) = read
                && written_by_us(secret, pair.cert())
            {
                seen.push((format!("secret {config}"), pair.cert()));
            }
        }
        if let Err(reason) = decide::clock_check(
            seen.iter().map(|(object, cert)| (object.as_str(), *cert)),
            rotation.backdate,
            self.now,
            self.apiserver_now,
        ) {
            tracing::error!("{reason}");
            self.events
                .record("ClockSkew", "clock", reason.clone(), true)
                .await;
            report.failures.push(format!("clock: {reason}"));
            return report;
        }

        // 1. Signers.
        let mut current_signers: Vec<Option<KeyPairPem>> = Vec::new();
        // Per signer: regenerated in this pass by the manual trigger (see `annotations`).
        let mut triggered: Vec<bool> = Vec::new();
        for (config, read) in rotation.signers.iter().zip(signers) {
            let outcome = match read {
                Err(err) => Err(err),
                // Someone else's signer from the future by our clock (and the apiserver's, if
                // it told us) is left alone and reported, as a target is below.
                Ok((Some(secret), Some(Ok(pair))))
                    if !written_by_us(&secret, pair.cert())
                        && decide::clock_check(
                            [(format!("secret {}", config.object).as_str(), pair.cert())],
                            rotation.backdate,
                            self.now,
                            self.apiserver_now,
                        )
                        .is_err() =>
                {
                    Err(format!(
                        "skipped: its certificate starts at {}, later than now ({}) by more \
                         than the {}s margin, and it was not written by a regenerate",
                        rfc3339(pair.cert().not_before),
                        rfc3339(self.now),
                        rotation.backdate.as_secs()
                    ))
                }
                Ok((object, found)) => {
                    self.ensure_secret(
                        &config.object,
                        "signer",
                        object,
                        found,
                        &mut report,
                        |found| {
                            decide::not_yet_valid(found, rotation.backdate, self.now)
                                .or_else(|| decide::signer(found, config, self.mode, self.now))
                        },
                        |_| {
                            let cn = format!(
                                "{}_{}@{}",
                                config.object.namespace, config.object.name, self.now
                            );
                            pki::new_signer_of(
                                rotation.key_type,
                                &cn,
                                self.now,
                                rotation.backdate,
                                config.validity,
                            )
                        },
                    )
                    .await
                }
            };
            triggered.push(report.written.last().is_some_and(|w| {
                w.object == config.object && w.reason_label == Reason::TRIGGER_LABEL
            }));
            match outcome {
                Ok(pair) => {
                    let cert = pair.cert();
                    report
                        .not_after
                        .push(("signer", config.object.clone(), cert.not_after));
                    report.deadlines.extend(decide::deadlines(
                        cert,
                        config.refresh,
                        None,
                        self.mode,
                    ));
                    current_signers.push(Some(pair));
                }
                Err(err) => {
                    report
                        .failures
                        .push(format!("secret {}: {err}", config.object));
                    current_signers.push(None);
                }
            }
        }

        // The managed leaves as read, per signer: a bundle keeps an expired CA one of them
        // was issued by until it is re-issued (below), see `decide::bundle`.
        let in_use: Vec<(usize, Cert)> = rotation
            .targets
            .iter()
            .zip(&targets)
            .filter_map(|(config, read)| match read {
                Ok((_, Some(Ok(pair)))) => Some((config.signer, pair.cert().clone())),
                _ => None,
            })
            .collect();

        // 2. Bundles.
        let mut bundle_contents: Vec<Option<Vec<Cert>>> = Vec::new();
        for (config, read) in rotation.bundles.iter().zip(bundles) {
            let missing: Vec<&ObjectRef> = config
                .signers
                .iter()
                .filter(|i| current_signers[**i].is_none())
                .map(|i| &rotation.signers[*i].object)
                .collect();
            if !missing.is_empty() {
                report.failures.push(format!(
                    "configmap {}: skipped, signer {} unavailable",
                    config.object,
                    missing
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                bundle_contents.push(None);
                continue;
            }
            // CAs of the bundles it includes (`intermediate_pass`), held like its signers'.
            let included = match self.included_cas(config).await {
                Ok(certs) => certs,
                Err(err) => {
                    report
                        .failures
                        .push(format!("configmap {}: {err}", config.object));
                    bundle_contents.push(None);
                    continue;
                }
            };
            let signer_certs: Vec<&Cert> = config
                .signers
                .iter()
                .filter_map(|i| current_signers[*i].as_ref().map(KeyPairPem::cert))
                .chain(&included)
                .collect();
            let leaves: Vec<&Cert> = in_use
                .iter()
                .filter(|(signer, _)| config.signers.contains(signer))
                .map(|(_, cert)| cert)
                .collect();
            // What the bundle already holds stays until it expires (the rotation overlap) —
            // except, in a bundle that includes others, CAs of none of its own signers: those
            // are exactly what its includes hold now, so a CA that left its source leaves.
            let own: Vec<String> = config
                .signers
                .iter()
                .filter_map(|i| current_signers[*i].as_ref())
                .filter_map(|pair| pair.cert().common_name.as_deref().map(signer_cn_prefix))
                .collect();
            let keep = |cert: &Cert| {
                config.include.is_empty()
                    || cert
                        .common_name
                        .as_deref()
                        .is_some_and(|cn| own.iter().any(|p| cn.starts_with(p.as_str())))
            };
            let outcome = match read {
                Err(err) => Err(err),
                Ok((object, existing)) => {
                    self.ensure_bundle(
                        &config.object,
                        object,
                        existing,
                        &signer_certs,
                        &leaves,
                        &keep,
                        &mut report,
                    )
                    .await
                }
            };
            match outcome {
                Ok(certs) => {
                    for cert in &certs {
                        report
                            .not_after
                            .push(("bundle", config.object.clone(), cert.not_after));
                        report.deadlines.push(cert.not_after);
                    }
                    bundle_contents.push(Some(certs));
                }
                Err(err) => {
                    report
                        .failures
                        .push(format!("configmap {}: {err}", config.object));
                    bundle_contents.push(None);
                }
            }
        }

        // 3. Targets.
        for (config, read) in rotation.targets.iter().zip(targets) {
            let Some(signer) = current_signers[config.signer].as_ref() else {
                report.failures.push(format!(
                    "secret {}: skipped, signer {} unavailable",
                    config.object, rotation.signers[config.signer].object
                ));
                continue;
            };
            let mut roots: Vec<Cert> = Vec::new();
            let mut unavailable = false;
            for (bundle, content) in rotation.bundles.iter().zip(&bundle_contents) {
                if bundle.signers.contains(&config.signer) {
                    match content {
                        Some(certs) => roots.extend(certs.iter().cloned()),
                        None => unavailable = true,
                    }
                }
            }
            if unavailable {
                report.failures.push(format!(
                    "secret {}: skipped, its CA bundle is unavailable",
                    config.object
                ));
                continue;
            }
            // Someone else's certificate from the future is left alone (and reported); our own
            // got here only if it is in the future by the apiserver's clock too, and is
            // regenerated as not yet valid.
            if let Ok((secret, Some(Ok(pair)))) = &read
                && !secret
                    .as_ref()
                    .is_some_and(|secret| written_by_us(secret, pair.cert()))
                && let Err(reason) = decide::clock_check(
                    [(format!("secret {}", config.object).as_str(), pair.cert())],
                    rotation.backdate,
                    self.now,
                    None,
                )
            {
                report
                    .failures
                    .push(format!("secret {}: skipped: {reason}", config.object));
                continue;
            }
            let outcome = match read {
                Err(err) => Err(err),
                Ok((object, found)) => {
                    self.ensure_secret(
                        &config.object,
                        "target",
                        object,
                        found,
                        &mut report,
                        |found| {
                            decide::not_yet_valid(found, rotation.backdate, self.now)
                                .or_else(|| {
                                    decide::target(
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
                            let mut pair = pki::new_leaf_of(
                                rotation.key_type,
                                signer,
                                &config.identity,
                                self.now,
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
                    .await
                }
            };
            match outcome {
                Ok(pair) => {
                    let cert = pair.cert();
                    report
                        .not_after
                        .push(("target", config.object.clone(), cert.not_after));
                    report.deadlines.extend(decide::deadlines(
                        cert,
                        config.refresh,
                        Some(signer.cert()),
                        self.mode,
                    ));
                }
                Err(err) => report
                    .failures
                    .push(format!("secret {}: {err}", config.object)),
            }
        }

        // 4. Intermediate CAs and what is built from them (`intermediate_pass`).
        self.run_intermediates(&current_signers, &triggered, &bundle_contents, &mut report)
            .await;

        report.next_deadline = report
            .deadlines
            .iter()
            .copied()
            .filter(|at| *at > self.now)
            .min();
        report
    }

    /// The annotations the config declares for `object`, and for a signer or target its
    /// refresh period as library-go writes it.
    pub(super) fn declared_annotations(
        &self,
        kind: ObjectKind,
        object: &ObjectRef,
    ) -> BTreeMap<String, String> {
        let rotation = self.rotation;
        let mut all = rotation
            .annotations
            .get(&(kind, object.clone()))
            .cloned()
            .unwrap_or_default();
        let refresh = rotation
            .signers
            .iter()
            .find(|s| s.object == *object)
            .map(|s| s.refresh)
            .or_else(|| {
                rotation
                    .targets
                    .iter()
                    .find(|t| t.object == *object)
                    .map(|t| t.refresh)
            })
            .or_else(|| {
                rotation
                    .intermediates
                    .iter()
                    .find(|i| i.object == *object)
                    .map(|i| i.refresh)
            });
        if let (ObjectKind::Secret, Some(refresh)) = (kind, refresh) {
            all.insert(
                annotations::REFRESH_PERIOD.to_owned(),
                annotations::go_duration(refresh),
            );
        }
        all
    }

    /// The object as read: `None` when it does not exist.
    pub(super) async fn read<K: Cached>(&self, object: &ObjectRef) -> Result<Option<K>, String> {
        match self.reads {
            Reads::Cached(cache) => cache.get::<K>(object),
            Reads::Live => {
                // Raw, then decoded here: kube-client would log the whole body (keys) on a bad
                // field.
                let api: Api<Raw<K>> = Api::namespaced(self.client.clone(), &object.namespace);
                api.get_opt(&object.name)
                    .await
                    .map_err(|err| format!("cannot read: {}", chain(&err)))?
                    .map(|raw| raw.decode())
                    .transpose()
                    .map_err(|err| format!("cannot decode: {err}"))
            }
        }
    }

    /// After a write of `object` based on `read` was refused with 409: the object as it is
    /// now. From the cache, once the watch has brought a version other than `read`'s (the
    /// cache was stale, or someone wrote since): never a write over a version not seen.
    pub(super) async fn read_again<K: Cached>(
        &self,
        object: &ObjectRef,
        read: Option<&K>,
    ) -> Result<Option<K>, String> {
        let Reads::Cached(cache) = self.reads else {
            return self.read(object).await;
        };
        let based_on = read.and_then(|o| o.meta().resource_version.clone());
        if !cache
            .newer::<K>(object, based_on.as_deref(), CONFLICT_WAIT)
            .await
        {
            return Err(format!(
                "changed since read, and the watch has not brought the new version within {}s; \
                 the next pass decides again",
                CONFLICT_WAIT.as_secs()
            ));
        }
        cache.get::<K>(object)
    }

    /// Whether this replica may still write `object`: not once the Lease is lost.
    pub(super) fn may_write(&self, object: &ObjectRef) -> Result<(), String> {
        match self.lease_lost {
            Some(lost) if lost.is_cancelled() => Err(format!(
                "not written: this replica lost the leader-election lease during the pass ({object} left as it is)"
            )),
            _ => Ok(()),
        }
    }

    /// Our own successful write, into the cache (see [`Cache::written`]).
    pub(super) fn remember<K: Cached>(&self, object: &ObjectRef, read: Option<&K>, written: &K) {
        if let Reads::Cached(cache) = self.reads {
            let based_on = read.and_then(|o| o.meta().resource_version.clone());
            cache.written(object, based_on.as_deref(), written);
        }
    }

    /// Whether the write budget withholds this write of `object` (see `brake`): if so it is
    /// logged, reported and recorded as a `RegenerationLoop` Event, and the caller keeps the
    /// object as it is. `resource` is the object's resource for the Event (`secret`).
    pub(super) async fn held(
        &self,
        kind: &'static str,
        resource: &str,
        object: &ObjectRef,
        reason_label: &str,
        reason: &str,
        report: &mut Report,
    ) -> bool {
        let Some(brake) = self.brake else {
            return false;
        };
        let Some(release_in) = brake.holds(kind, object, reason_label) else {
            return false;
        };
        let message = format!(
            "{resource} {object} was written {} times within {}s and would be written again \
             ({reason}): not before {}s from now. Its writes do not settle: another controller \
             may disagree about it, or a rule rejects what it wrote",
            brake.budget(),
            brake.window().as_secs(),
            release_in.as_secs().max(1)
        );
        tracing::warn!(kind, %object, %reason, release_in_seconds = release_in.as_secs(), "write withheld: the object's write budget is spent (RegenerationLoop)");
        self.events
            .record(
                "RegenerationLoop",
                &format!("{resource}/{object}"),
                message,
                true,
            )
            .await;
        report.held.push(Held {
            kind,
            object: object.clone(),
            reason: reason.to_owned(),
            release_in,
        });
        true
    }

    pub(super) async fn read_secret(&self, object: &ObjectRef) -> ReadSecret {
        let secret = self.read::<Secret>(object).await?;
        let found = secret.as_ref().map(parse_secret);
        Ok((secret, found))
    }

    pub(super) async fn read_bundle(&self, object: &ObjectRef) -> ReadBundle {
        let map = self.read::<ConfigMap>(object).await?;
        let certs = bundle_certs(object, map.as_ref());
        Ok((map, certs))
    }

    /// Decides, generates and writes one Secret, re-reading and deciding again on conflict.
    /// Returns the pair now stored.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn ensure_secret(
        &self,
        object: &ObjectRef,
        kind: &'static str,
        mut existing: Option<Secret>,
        mut found: Found,
        report: &mut Report,
        decide: impl Fn(&Found) -> Option<Reason>,
        generate: impl Fn(&Found) -> Result<KeyPairPem, String>,
    ) -> Result<KeyPairPem, String> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &object.namespace);
        for _ in 0..MAX_ATTEMPTS {
            if let Some(type_) = existing.as_ref().and_then(|s| s.type_.as_deref())
                && !OWNED_SECRET_TYPES.contains(&type_)
            {
                let message = format!(
                    "secret {object} has type {type_}, which regenerate does not manage (only \
                     {}); refusing to write a certificate and key into it",
                    OWNED_SECRET_TYPES.join(" or ")
                );
                self.events
                    .record(
                        "CertificateRegenerationRefused",
                        &format!("secret/{object}"),
                        message.clone(),
                        true,
                    )
                    .await;
                return Err(message);
            }
            let trigger = || {
                let secret = existing.as_ref()?;
                found.as_ref()?.as_ref().ok()?;
                let labels = secret.metadata.labels.as_ref();
                annotations::validity_problem(
                    labels
                        .and_then(|l| l.get(annotations::MANAGED_TYPE))
                        .map(String::as_str),
                    secret.metadata.annotations.as_ref(),
                )
                .map(Reason::ValidityAnnotation)
            };
            let Some(reason) = decide(&found).or_else(trigger) else {
                return match found {
                    Some(Ok(pair)) => Ok(pair),
                    _ => Err("kept without a usable pair (a bug)".to_owned()),
                };
            };
            if self
                .held(
                    kind,
                    "secret",
                    object,
                    reason.label(),
                    &reason.to_string(),
                    report,
                )
                .await
            {
                return match found {
                    Some(Ok(pair)) => Ok(pair),
                    _ => {
                        Err("not rewritten: held by the write budget (RegenerationLoop)".to_owned())
                    }
                };
            }
            let pair = generate(&found)?;
            let mut secret = secret_with(existing.clone(), object, kind, &pair);
            secret
                .metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(annotations::MANAGED_TYPE.to_owned(), kind.to_owned());
            secret
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .extend(self.declared_annotations(ObjectKind::Secret, object));
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
                    let cert = pair.cert();
                    tracing::info!(secret = %object, kind, %reason, serial = %cert.serial, not_after = %rfc3339(cert.not_after), "regenerated");
                    self.events
                        .record(
                            if kind == "signer" {
                                "SignerRegenerated"
                            } else {
                                "CertificateRegenerated"
                            },
                            &format!("secret/{object}"),
                            format!(
                                "Regenerated {kind} secret {object} ({reason}); new notAfter {}",
                                rfc3339(cert.not_after)
                            ),
                            false,
                        )
                        .await;
                    report.written.push(Written {
                        kind,
                        object: object.clone(),
                        reason: reason.to_string(),
                        reason_label: reason.label(),
                    });
                    return Ok(pair);
                }
                Err(err) if is_conflict(&err) => {
                    report.conflicts += 1;
                    tracing::info!(secret = %object, "changed since read (conflict); reading again");
                    existing = self
                        .read_again(object, existing.as_ref())
                        .await
                        .map_err(|err| format!("after a conflict: {err}"))?;
                    found = existing.as_ref().map(parse_secret);
                }
                Err(err) => return Err(format!("cannot write: {}", chain(&err))),
            }
        }
        Err(format!("still conflicting after {MAX_ATTEMPTS} attempts"))
    }

    /// Brings one bundle to its desired content; returns the content now stored. Of what it
    /// holds, only the certificates `keep` accepts can stay.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn ensure_bundle(
        &self,
        object: &ObjectRef,
        existing: Option<ConfigMap>,
        certs: Vec<Cert>,
        signers: &[&Cert],
        in_use: &[&Cert],
        keep: &dyn Fn(&Cert) -> bool,
        report: &mut Report,
    ) -> Result<Vec<Cert>, String> {
        let desired = |certs: &[Cert]| {
            let kept: Vec<Cert> = certs.iter().filter(|c| keep(c)).cloned().collect();
            let mut desired = decide::bundle(&kept, signers, in_use, self.now);
            if signers.len() > 1 {
                decide::order_by_signer(&mut desired, signers);
            }
            desired
        };
        self.converge_bundle(
            object,
            existing,
            certs,
            BundleKind::Signers,
            desired,
            report,
        )
        .await
    }

    /// Writes the bundle at `object` (`existing`, holding `certs`) until it holds the set
    /// `desired` makes of what it holds, re-reading after each conflict; returns what is stored.
    pub(super) async fn converge_bundle(
        &self,
        object: &ObjectRef,
        mut existing: Option<ConfigMap>,
        mut certs: Vec<Cert>,
        kind: BundleKind,
        desired: impl Fn(&[Cert]) -> Vec<Cert>,
        report: &mut Report,
    ) -> Result<Vec<Cert>, String> {
        for _ in 0..MAX_ATTEMPTS {
            let desired = desired(&certs);
            let current = existing
                .as_ref()
                .and_then(|m| m.data.as_ref())
                .and_then(|d| d.get("ca-bundle.crt"));
            if current == Some(&pki::bundle_pem(&desired)) {
                return Ok(desired);
            }
            // The right set in another order is kept as it is: OpenShift's operator sorts by
            // DER on some releases and not on others, and any rewrite would fight it.
            if let Some(current) = current
                && decide::same_set(&certs, &desired)
                && pki::parse_bundle(current.as_bytes()).1.is_empty()
            {
                return Ok(certs);
            }
            match self
                .write_bundle(object, existing.as_ref(), &certs, &desired, kind, report)
                .await?
            {
                BundleWrite::Written => return Ok(desired),
                BundleWrite::Held => return Ok(certs),
                BundleWrite::Conflict(now) => {
                    existing = now.map(|map| *map);
                    certs = bundle_certs(object, existing.as_ref());
                }
            }
        }
        Err(format!("still conflicting after {MAX_ATTEMPTS} attempts"))
    }

    /// One write of a bundle's `ca-bundle.crt` as `desired` (created, with the ca-bundle label,
    /// when `existing` is `None`), logged, recorded and counted with what changed against
    /// `certs` (what `existing` held).
    /// A 409 waits for the version that won ([`Pass::read_again`]) and returns it.
    async fn write_bundle(
        &self,
        object: &ObjectRef,
        existing: Option<&ConfigMap>,
        certs: &[Cert],
        desired: &[Cert],
        kind: BundleKind,
        report: &mut Report,
    ) -> Result<BundleWrite, String> {
        let what = kind.name();
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &object.namespace);
        let mut map = existing.cloned().unwrap_or_else(|| ConfigMap {
            metadata: ObjectMeta {
                name: Some(object.name.clone()),
                namespace: Some(object.namespace.clone()),
                labels: match kind {
                    BundleKind::Signers => Some(BTreeMap::from([(
                        annotations::MANAGED_TYPE.to_owned(),
                        "ca-bundle".to_owned(),
                    )])),
                    BundleKind::Union | BundleKind::Collected => None,
                },
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        });
        map.data
            .get_or_insert_with(BTreeMap::new)
            .insert("ca-bundle.crt".to_owned(), pki::bundle_pem(desired));
        map.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(self.declared_annotations(ObjectKind::ConfigMap, object));
        let added = desired
            .iter()
            .filter(|c| !certs.iter().any(|o| o.der == c.der))
            .count();
        let removed = certs
            .iter()
            .filter(|c| !desired.iter().any(|d| d.der == c.der))
            .count();
        let reason_label = match (existing, added, removed) {
            (None, _, _) => "missing",
            (_, 0, 0) => "unparsable",
            (_, _, 0) => "ca-added",
            (_, 0, _) => "ca-removed",
            _ => "ca-replaced",
        };
        let reason = format!("{added} added, {removed} removed");
        if self
            .held("bundle", "configmap", object, reason_label, &reason, report)
            .await
        {
            return Ok(BundleWrite::Held);
        }
        self.may_write(object)?;
        let result = match existing {
            None => api.create(&PostParams::default(), &map).await,
            Some(_) => {
                api.replace(&object.name, &PostParams::default(), &map)
                    .await
            }
        };
        match result {
            Ok(written) => {
                self.remember(object, existing, &written);
                tracing::info!(configmap = %object, cas = desired.len(), added, removed, reason = reason_label, "{what} updated");
                self.events
                    .record(
                        "CABundleUpdated",
                        &format!("configmap/{object}"),
                        format!(
                            "Updated {what} {object}: {} CAs ({added} added, {removed} removed)",
                            desired.len()
                        ),
                        false,
                    )
                    .await;
                report.written.push(Written {
                    kind: "bundle",
                    object: object.clone(),
                    reason,
                    reason_label,
                });
                Ok(BundleWrite::Written)
            }
            Err(err) if is_conflict(&err) => {
                report.conflicts += 1;
                tracing::info!(configmap = %object, "changed since read (conflict); reading again");
                let now = self
                    .read_again(object, existing)
                    .await
                    .map_err(|err| format!("after a conflict: {err}"))?;
                Ok(BundleWrite::Conflict(now.map(Box::new)))
            }
            Err(err) => Err(format!("cannot write: {}", chain(&err))),
        }
    }
}

/// The part of a signer CA's CN that every CA of that signer shares (`<namespace>_<name>@` as
/// library-go and ours name them), or the whole CN.
fn signer_cn_prefix(cn: &str) -> String {
    match cn.rfind('@') {
        Some(at) => cn[..=at].to_owned(),
        None => cn.to_owned(),
    }
}

/// What one [`Pass::write_bundle`] came to.
enum BundleWrite {
    Written,
    /// Withheld by the write budget: the bundle stays as it is.
    Held,
    /// Refused with 409: the bundle as it is now (what won).
    Conflict(Option<Box<ConfigMap>>),
}

/// Which bundle [`Pass::write_bundle`] writes: one of signers (library-go's `ca-bundle` label on
/// creation), a union of other bundles, or the CAs an intermediate held (both written as
/// OpenShift's controllers write them, without that label).
#[derive(Clone, Copy)]
pub(super) enum BundleKind {
    Signers,
    Union,
    Collected,
}

impl BundleKind {
    fn name(self) -> &'static str {
        match self {
            Self::Signers | Self::Collected => "CA bundle",
            Self::Union => "union CA bundle",
        }
    }
}

/// The apiserver's clock: the `Date` of its answer to `GET /version` (public information every
/// client may read: no permission, no object read; any answer, an error too, carries a `Date`).
/// `None` if it does not answer or sends no usable `Date`: the caller then falls back to the
/// local clock alone.
pub async fn apiserver_time(client: &kube::Client) -> Option<i64> {
    use http_body_util::BodyExt;
    let request = http::Request::get("/version")
        .body(kube::client::Body::from(Vec::new()))
        .ok()?;
    let response = client
        .send(request)
        .await
        .map_err(|err| tracing::warn!(error = %chain(&err), "cannot read the apiserver's clock; using the local clock alone"))
        .ok()?;
    let date = response.headers().get(http::header::DATE).cloned();
    // Drain the body so the connection can be reused; its content is not needed.
    let _ = response.into_body().collect().await;
    let date = date?;
    parse_http_date(date.to_str().ok()?)
}

/// An HTTP `Date` (`Sun, 06 Nov 1994 08:49:37 GMT`, RFC 9110 IMF-fixdate) as Unix seconds.
fn parse_http_date(text: &str) -> Option<i64> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let [_weekday, day, month, year, clock, "GMT"] =
        text.split_ascii_whitespace().collect::<Vec<_>>()[..]
    else {
        return None;
    };
    let month = MONTHS.iter().position(|m| *m == month)? as u8 + 1;
    let date = time::Date::from_calendar_date(
        year.parse().ok()?,
        time::Month::try_from(month).ok()?,
        day.parse().ok()?,
    )
    .ok()?;
    let mut parts = clock.split(':').map(str::parse::<u8>);
    let (Some(Ok(hour)), Some(Ok(minute)), Some(Ok(second)), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let at = time::Time::from_hms(hour, minute, second).ok()?;
    Some(date.with_time(at).assume_utc().unix_timestamp())
}

/// The CAs in a bundle's `ca-bundle.crt` (none when it is absent); unparsable blocks are logged
/// and left out (the next write drops them).
fn bundle_certs(object: &ObjectRef, map: Option<&ConfigMap>) -> Vec<Cert> {
    let text = map
        .and_then(|m| m.data.as_ref())
        .and_then(|d| d.get("ca-bundle.crt"))
        .map(String::as_str)
        .unwrap_or_default();
    let (certs, problems) = pki::parse_bundle(text.as_bytes());
    for problem in problems {
        tracing::warn!(configmap = %object, %problem, "unparsable block in ca-bundle.crt; it will be dropped");
    }
    certs
}

/// Whether a regenerate wrote this Secret: its not-before annotation is the certificate's.
pub(super) fn written_by_us(secret: &Secret, cert: &Cert) -> bool {
    secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::NOT_BEFORE))
        .is_some_and(|at| *at == rfc3339(cert.not_before))
}

/// The pair in a Secret, or why it is unusable.
fn parse_secret(secret: &Secret) -> Result<KeyPairPem, String> {
    let data = secret.data.as_ref();
    let get = |key: &str| data.and_then(|d| d.get(key)).map(|b| b.0.as_slice());
    match (get("tls.crt"), get("tls.key")) {
        (Some(cert), Some(key)) if !cert.is_empty() && !key.is_empty() => {
            KeyPairPem::parse(cert, key)
        }
        _ => Err("tls.crt or tls.key is missing or empty".to_owned()),
    }
}

/// `existing` (or a new Secret) with the new pair and the library-go annotations. Other keys,
/// labels and annotations of an existing Secret are kept.
fn secret_with(
    existing: Option<Secret>,
    object: &ObjectRef,
    kind: &str,
    pair: &KeyPairPem,
) -> Secret {
    let mut secret = existing.unwrap_or_else(|| Secret {
        metadata: ObjectMeta {
            name: Some(object.name.clone()),
            namespace: Some(object.namespace.clone()),
            labels: Some(BTreeMap::from([(
                annotations::MANAGED_TYPE.to_owned(),
                kind.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        ..Secret::default()
    });
    let data = secret.data.get_or_insert_with(BTreeMap::new);
    data.insert(
        "tls.crt".to_owned(),
        ByteString(pair.cert_pem().into_bytes()),
    );
    data.insert(
        "tls.key".to_owned(),
        ByteString(pair.key_pem.clone().into_bytes()),
    );
    let cert = pair.cert();
    let annotations = secret
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new);
    annotations.insert(annotations::NOT_AFTER.to_owned(), rfc3339(cert.not_after));
    annotations.insert(annotations::NOT_BEFORE.to_owned(), rfc3339(cert.not_before));
    annotations.insert(
        annotations::ISSUER.to_owned(),
        cert.issuer_common_name.clone().unwrap_or_default(),
    );
    if let Some(Identity::Serving { .. }) = identity_of(cert) {
        annotations.insert(annotations::HOSTNAMES.to_owned(), cert.hostnames.join(","));
    }
    secret
}

/// Serving certificates carry hostnames; signers and client certificates do not.
fn identity_of(cert: &Cert) -> Option<Identity> {
    (!cert.is_ca && !cert.hostnames.is_empty()).then(|| Identity::Serving {
        hostnames: cert.hostnames.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::parse_http_date;

    #[test]
    fn http_dates_parse_and_anything_else_is_none() {
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(parse_http_date("Sun, 06 Nov 1994 08:49:37 CET"), None);
        assert_eq!(parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"), None);
        assert_eq!(parse_http_date(""), None);
    }
}
