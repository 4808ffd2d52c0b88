//! How regenerate's own objects look, and the plans that write them through the one write
//! (`write`): a managed Secret (a signer, a target or an intermediate CA: `tls.crt`,
//! `tls.key` and library-go's annotations) and a CA bundle ConfigMap (`ca-bundle.crt`). Shared
//! by the phases that write them; no phase calls another.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::ObjectMeta;

use super::annotations;
use super::config::{ObjectRef, Rotation};
use super::ctx::{Ctx, stored};
use super::decide::{self, Reason, Stored};
use super::keys::KeyUse;
use super::report::Report;
use super::trust::Untrusted;
use super::write::{Built, Change, Plan, Wait};
use crate::base::kind::Kind as ObjectKind;
use crate::base::time::rfc3339;
use crate::pki::{self, Cert, KeyPairPem};

/// One managed Secret to bring to what its decision says (see [`write_managed_secret`]).
pub(super) struct Managed<'o, D, G> {
    pub object: &'o ObjectRef,
    /// Its managed-type label: `signer` or `target` (an intermediate CA too).
    pub kind: &'static str,
    /// The key its new pair takes.
    pub key: KeyUse,
    /// Why the pair must be replaced (the manual rotation trigger is added here).
    pub decide: D,
    /// Makes the new pair with the new key.
    pub generate: G,
    /// Set when a new pair must not be written yet: its issuer's CA is not in every bundle
    /// that must trust it (`trust`).
    pub untrusted: Option<Untrusted>,
}

/// Decides, generates and writes one managed Secret, re-deciding after a conflict; returns
/// the pair now stored.
pub(super) async fn write_managed_secret<D, G>(
    ctx: &Ctx<'_>,
    managed: Managed<'_, D, G>,
    existing: Option<Secret>,
    report: &mut Report,
) -> Result<KeyPairPem, String>
where
    D: Fn(&Stored) -> Option<Reason>,
    G: Fn(rcgen::KeyPair) -> Result<KeyPairPem, String> + Sync,
{
    let Managed {
        object,
        kind,
        key,
        decide,
        generate,
        untrusted,
    } = managed;
    let declared = declared_annotations(ctx.rotation, ObjectKind::Secret, object);
    let (generate, declared, untrusted) = (&generate, &declared, &untrusted);
    ctx.write(
        kind,
        object,
        existing,
        report,
        |existing: Option<&Secret>| {
            let found = stored(existing);
            let Some(reason) = decide(&found).or_else(|| trigger(existing, &found)) else {
                return match found {
                    Stored::Usable(pair) => Ok(Plan::Keep(pair)),
                    _ => Err("kept without a usable pair (a bug)".to_owned()),
                };
            };
            if let Some(untrusted) = untrusted {
                return Ok(Plan::Wait(Wait {
                    reason: reason.to_string(),
                    untrusted: untrusted.clone(),
                    then: match found {
                        Stored::Usable(pair) => Ok(pair),
                        _ => Err(format!(
                            "not written yet: waits for {}",
                            untrusted.waits_for
                        )),
                    },
                }));
            }
            let existing = existing.cloned();
            Ok(Plan::Write(Change {
                label: reason.label(),
                reason: reason.to_string(),
                if_held: match found {
                    Stored::Usable(pair) => Ok(pair),
                    _ => {
                        Err("not rewritten: held by the write budget (RegenerationLoop)".to_owned())
                    }
                },
                key: Some(key),
                build: Box::new(move |new_key| {
                    let pair = generate(new_key.ok_or("no key for a new pair (a bug)")?)?;
                    let mut secret = secret_with(existing, object, kind, &pair);
                    secret
                        .metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new)
                        .extend(declared.clone());
                    let cert = pair.cert();
                    Ok(Built {
                        object: secret,
                        log: format!(
                            "regenerated (serial {}, notAfter {})",
                            cert.serial,
                            rfc3339(cert.not_after)
                        ),
                        event: Some((
                            if kind == "signer" {
                                "SignerRegenerated"
                            } else {
                                "CertificateRegenerated"
                            },
                            format!(
                                "Regenerated {kind} secret {object} ({reason}); new notAfter {}",
                                rfc3339(cert.not_after)
                            ),
                        )),
                        then: pair,
                    })
                }),
            }))
        },
    )
    .await
}

/// OpenShift's manual rotation trigger (see `annotations`): a usable pair in a Secret with the
/// managed-type label whose validity annotations are missing or unparsable.
fn trigger(existing: Option<&Secret>, found: &Stored) -> Option<Reason> {
    let secret = existing?;
    found.pair()?;
    let labels = secret.metadata.labels.as_ref();
    annotations::validity_problem(
        labels
            .and_then(|l| l.get(annotations::MANAGED_TYPE))
            .map(String::as_str),
        secret.metadata.annotations.as_ref(),
    )
    .map(Reason::ValidityAnnotation)
}

/// Which bundle [`write_bundle`] writes: one of signers (library-go's `ca-bundle` label on
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

/// Writes the bundle at `object` (as read: `existing`) until it holds the set `desired` makes
/// of what it holds, re-deciding after each conflict; returns what is stored. The right set in
/// another order is kept as it is.
pub(super) async fn write_bundle(
    ctx: &Ctx<'_>,
    object: &ObjectRef,
    existing: Option<ConfigMap>,
    kind: BundleKind,
    desired: impl Fn(&[Cert]) -> Vec<Cert>,
    report: &mut Report,
) -> Result<Vec<Cert>, String> {
    let declared = declared_annotations(ctx.rotation, ObjectKind::ConfigMap, object);
    let declared = &declared;
    ctx.write("bundle", object, existing, report, |existing: Option<&ConfigMap>| {
        let current = existing
            .and_then(|m| m.data.as_ref())
            .and_then(|d| d.get("ca-bundle.crt"));
        // Unparsable blocks were logged when the bundle was read; the write drops them.
        let (certs, problems) = pki::parse_bundle(current.map(String::as_str).unwrap_or_default().as_bytes());
        let desired = desired(&certs);
        if current == Some(&pki::bundle_pem(&desired)) {
            return Ok(Plan::Keep(desired));
        }
        // The right set in another order is kept as it is: OpenShift's operator sorts by
        // DER on some releases and not on others, and any rewrite would fight it.
        if current.is_some() && decide::same_set(&certs, &desired) && problems.is_empty() {
            return Ok(Plan::Keep(certs));
        }
        let added = desired
            .iter()
            .filter(|c| !certs.iter().any(|o| o.der == c.der))
            .count();
        let removed = certs
            .iter()
            .filter(|c| !desired.iter().any(|d| d.der == c.der))
            .count();
        let label = match (existing, added, removed) {
            (None, _, _) => "missing",
            (_, 0, 0) => "unparsable",
            (_, _, 0) => "ca-added",
            (_, 0, _) => "ca-removed",
            _ => "ca-replaced",
        };
        let existing = existing.cloned();
        Ok(Plan::Write(Change {
            label,
            reason: format!("{added} added, {removed} removed"),
            if_held: Ok(certs),
            key: None,
            build: Box::new(move |_| {
                let what = kind.name();
                let map = bundle_with(existing, object, kind, &desired, declared);
                Ok(Built {
                    object: map,
                    log: format!("{what} updated ({} CAs)", desired.len()),
                    event: Some((
                        "CABundleUpdated",
                        format!(
                            "Updated {what} {object}: {} CAs ({added} added, {removed} removed)",
                            desired.len()
                        ),
                    )),
                    then: desired,
                })
            }),
        }))
    })
    .await
}

/// `existing` (or a new ConfigMap) holding `desired` in `ca-bundle.crt`, with the declared
/// annotations.
fn bundle_with(
    existing: Option<ConfigMap>,
    object: &ObjectRef,
    kind: BundleKind,
    desired: &[Cert],
    declared: &BTreeMap<String, String>,
) -> ConfigMap {
    let mut map = existing.unwrap_or_else(|| ConfigMap {
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
        .extend(declared.clone());
    map
}

/// The annotations the config declares for `object`, and for a signer, target or intermediate
/// its refresh period as library-go writes it.
pub(super) fn declared_annotations(
    rotation: &Rotation,
    kind: ObjectKind,
    object: &ObjectRef,
) -> BTreeMap<String, String> {
    let mut all = rotation
        .annotations
        .get(&(kind, object.clone()))
        .cloned()
        .unwrap_or_default();
    let refresh = rotation.refresh_of(object);
    if let (ObjectKind::Secret, Some(refresh)) = (kind, refresh) {
        all.insert(
            annotations::REFRESH_PERIOD.to_owned(),
            annotations::go_duration(refresh),
        );
    }
    all
}

/// `existing` (or a new Secret) with the new pair, the managed-type label (`kind`) and the
/// library-go annotations. Other keys, labels and annotations of an existing Secret are kept.
fn secret_with(
    existing: Option<Secret>,
    object: &ObjectRef,
    kind: &str,
    pair: &KeyPairPem,
) -> Secret {
    let mut secret = existing.unwrap_or_else(|| new_tls_secret(object));
    secret
        .metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(annotations::MANAGED_TYPE.to_owned(), kind.to_owned());
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
    // Serving certificates carry hostnames; signers and client certificates do not.
    if !cert.is_ca && !cert.hostnames.is_empty() {
        annotations.insert(annotations::HOSTNAMES.to_owned(), cert.hostnames.join(","));
    }
    secret
}

/// A new, empty `kubernetes.io/tls` Secret named `object`.
pub(super) fn new_tls_secret(object: &ObjectRef) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(object.name.clone()),
            namespace: Some(object.namespace.clone()),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_owned()),
        ..Secret::default()
    }
}

/// The part of a signer CA's CN that every CA of that signer shares (`<namespace>_<name>@` as
/// library-go and ours name them), or the whole CN.
pub(super) fn signer_cn_prefix(cn: &str) -> String {
    match cn.rfind('@') {
        Some(at) => cn[..=at].to_owned(),
        None => cn.to_owned(),
    }
}

/// A pair as a Secret's data (`tls.crt` the certificate alone).
pub(super) fn ca_data(pair: &KeyPairPem) -> BTreeMap<String, ByteString> {
    BTreeMap::from([
        (
            "tls.crt".to_owned(),
            ByteString(pair.cert().pem().into_bytes()),
        ),
        (
            "tls.key".to_owned(),
            ByteString(pair.key_pem.clone().into_bytes()),
        ),
    ])
}
