// Over 600 lines because the config format, its item-by-item validation and the tests of both read best side by side (the tests are a third of the file).
//! The rotation config file (YAML): signers, CA bundles and targets, each a namespaced object.
//!
//! Items are parsed one by one, so one broken item (a typo, a bad duration, a reference to an
//! undeclared signer) is reported and skipped while every other item still recovers. Only a file
//! that is not YAML at all, or not a mapping, fails as a whole.
//!
//! ```yaml
//! namespace: openshift-kube-apiserver      # default for items without one
//! backdate: 5m                             # notBefore margin and clock-skew tolerance
//! signers:
//!   - name: localhost-serving-signer
//!     namespace: openshift-kube-apiserver-operator
//!     validity: 10y
//!     refresh: 8y
//! bundles:
//!   - name: localhost-serving-ca
//!     signers: [localhost-serving-signer]
//!     include: [other/more-ca]               # also the unexpired CAs of these (read only)
//! targets:
//!   - name: localhost-serving-cert-certkey
//!     signer: localhost-serving-signer
//!     serving: { hostnames: [localhost, 127.0.0.1] }
//!     validity: 30d
//!     refresh: 15d
//!     priority: 1                          # made first, with its signer and bundles (1 first;
//!                                          # also on intermediates and copies; none: last)
//!   - name: kubelet-client
//!     signer: kube-apiserver-to-kubelet-signer
//!     client: { user: "system:kube-apiserver", groups: [kube-master] }
//!     validity: 30d
//!     refresh: 15d
//! intermediates:                           # CA key pairs issued by a signer (library-go's
//!   - name: csr-signer                     # SignerRotation), see `intermediate`
//!     signer: localhost-serving-signer
//!     common-name: kube-csr-signer         # CN kube-csr-signer_@<unix seconds>
//!     validity: 30d
//!     refresh: 15d
//!     bundle: csr-signer-ca                # every unexpired CA its tls.crt has held
//!     publish: { namespace: other, delay: 5m }   # a copy, new CAs only after the delay
//!                                          # (`copy-annotations: true`: with the CA's annotations)
//! unions:                                  # a bundle that is exactly the union of others
//!   - { name: csr-controller-ca, bundles: [csr-signer-ca, localhost-serving-ca] }
//!   - { name: client-ca, bundles: [other/admin-ca, localhost-serving-ca] }  # other: read only
//! copies:                                  # plain copies of an object's data
//!   - { configmap: csr-controller-ca, to: { namespace: openshift-config-managed } }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

pub use crate::pki::Identity;

use crate::base::error::ConfigError;
use crate::base::kind::Kind;
use crate::base::names::{canonical_hostname, is_dns_label, is_dns_subdomain, is_hostname_or_ip};
use crate::base::time::parse_duration;

/// A namespaced object name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A CA key pair in a Secret (`tls.crt`, `tls.key`).
#[derive(Debug, Clone)]
pub struct Signer {
    pub object: ObjectRef,
    pub validity: Duration,
    pub refresh: Duration,
}

/// A ConfigMap whose `ca-bundle.crt` holds the CAs of its signers (current and not yet
/// expired).
#[derive(Debug, Clone)]
pub struct Bundle {
    pub object: ObjectRef,
    /// Indexes into [`Rotation::signers`].
    pub signers: Vec<usize>,
    /// Other CA bundle ConfigMaps (`ca-bundle.crt`, read only) whose unexpired CAs this bundle
    /// also holds, as OpenShift's `CABundleController` folds them into the kube-apiserver's
    /// `client-ca`; a missing one adds nothing (`include:` in the file, `namespace/name`).
    pub include: Vec<ObjectRef>,
}

/// A leaf certificate key pair in a Secret, issued by one signer.
#[derive(Debug, Clone)]
pub struct Target {
    pub object: ObjectRef,
    /// Index into [`Rotation::signers`].
    pub signer: usize,
    pub identity: Identity,
    pub validity: Duration,
    pub refresh: Duration,
    /// How early a pass makes it (1 first; `None`: after every prioritised item): see `graph`.
    pub priority: Option<u8>,
}

/// An intermediate CA key pair in a Secret (library-go's `SignerRotation`): a CA certificate
/// issued by a signer, CN `<common_name>_@<unix seconds>`, `tls.crt` = the CA then its
/// issuer. Decided like a target (expiry, chain to the signer's bundle; rotation points in
/// rotate mode). See `intermediate`.
#[derive(Debug, Clone)]
pub struct Intermediate {
    pub object: ObjectRef,
    /// Index into [`Rotation::signers`].
    pub signer: usize,
    pub common_name: String,
    pub validity: Duration,
    pub refresh: Duration,
    /// The ConfigMap that collects every unexpired CA this Secret's `tls.crt` has held, so
    /// what the previous CA signed stays trusted (library-go's `csr-signer-ca`).
    pub bundle: Option<ObjectRef>,
    /// Where the CA is published for its user, and when.
    pub publish: Option<Publish>,
    /// As [`Target::priority`], for the CA, its bundle and its publication.
    pub priority: Option<u8>,
}

/// The published copy of an intermediate (`tls.crt` = its certificate alone, `tls.key`):
/// replaced by a new CA only `delay` after the new CA was made, so its trust can reach every
/// bundle first; at once when the copy is missing, unusable or expired.
#[derive(Debug, Clone)]
pub struct Publish {
    pub object: ObjectRef,
    pub delay: Duration,
    /// Whether the copy carries the intermediate's annotations (`copy-annotations`; OpenShift's
    /// `ManageCSRSigner` since 4.15, set per release by `regenerate::release`); otherwise none.
    pub copy_annotations: bool,
}

/// A CA bundle ConfigMap that holds exactly the unexpired CAs of its source bundles (library-go's
/// `CombineCABundleConfigMaps`): sources in order, first occurrence kept, nothing else (a CA that
/// left every source leaves the union).
#[derive(Debug, Clone)]
pub struct Union {
    pub object: ObjectRef,
    /// Declared bundles (of signers or of intermediates), or other components' bundles named
    /// `namespace/name` (read only; a missing one adds nothing).
    pub sources: Vec<ObjectRef>,
}

/// A copy of an object's data into another object of the same kind (library-go's
/// resource-sync). A missing source leaves the copy as it is.
#[derive(Debug, Clone)]
pub struct ObjectCopy {
    pub kind: Kind,
    pub from: ObjectRef,
    pub to: ObjectRef,
    /// As [`Target::priority`].
    pub priority: Option<u8>,
}

/// An item that could not be used, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// `signers[2]`, `targets[0] (ns/name)`, ...
    pub item: String,
    pub reason: String,
}

/// The validated config.
#[derive(Debug, Clone, Default)]
pub struct Rotation {
    pub signers: Vec<Signer>,
    pub bundles: Vec<Bundle>,
    pub targets: Vec<Target>,
    pub intermediates: Vec<Intermediate>,
    pub unions: Vec<Union>,
    pub copies: Vec<ObjectCopy>,
    /// notBefore is set this far in the past; also the tolerated clock skew.
    pub backdate: Duration,
    /// Items that were skipped.
    pub broken: Vec<Broken>,
    /// The type of newly generated keys (`key-type`, default RSA-2048).
    pub key_type: crate::pki::KeyType,
    /// Annotations written on each object whenever it is written (the file's top-level
    /// `annotations` merged with the item's own): see `annotations`.
    pub annotations: BTreeMap<(Kind, ObjectRef), BTreeMap<String, String>>,
}

impl Rotation {
    /// Every object the config reads: each written one once ([`Rotation::written`]), then the
    /// sources of copies that are not written themselves ([`Rotation::read_only`]).
    pub fn objects(&self) -> impl Iterator<Item = (Kind, &ObjectRef)> {
        self.written().chain(self.read_only())
    }

    /// The refresh period of the signer, target or intermediate CA at `object`, if it is one.
    pub fn refresh_of(&self, object: &ObjectRef) -> Option<Duration> {
        let signers = self.signers.iter().map(|s| (&s.object, s.refresh));
        let targets = self.targets.iter().map(|t| (&t.object, t.refresh));
        let intermediates = self.intermediates.iter().map(|i| (&i.object, i.refresh));
        signers
            .chain(targets)
            .chain(intermediates)
            .find(|(declared, _)| *declared == object)
            .map(|(_, refresh)| refresh)
    }

    /// Every object the config writes.
    pub fn written(&self) -> impl Iterator<Item = (Kind, &ObjectRef)> {
        self.signers
            .iter()
            .map(|s| (Kind::Secret, &s.object))
            .chain(self.bundles.iter().map(|b| (Kind::ConfigMap, &b.object)))
            .chain(self.targets.iter().map(|t| (Kind::Secret, &t.object)))
            .chain(self.intermediates.iter().flat_map(|i| {
                std::iter::once((Kind::Secret, &i.object))
                    .chain(i.bundle.iter().map(|b| (Kind::ConfigMap, b)))
                    .chain(i.publish.iter().map(|p| (Kind::Secret, &p.object)))
            }))
            .chain(self.unions.iter().map(|u| (Kind::ConfigMap, &u.object)))
            .chain(self.copies.iter().map(|c| (c.kind, &c.to)))
    }

    /// Objects the config only reads (not written by it), each once: the sources of copies and
    /// the bundles other bundles include.
    pub fn read_only(&self) -> impl Iterator<Item = (Kind, &ObjectRef)> {
        let sources: Vec<(Kind, &ObjectRef)> = self
            .copies
            .iter()
            .map(|c| (c.kind, &c.from))
            .chain(
                self.bundles
                    .iter()
                    .flat_map(|b| b.include.iter().map(|o| (Kind::ConfigMap, o))),
            )
            .chain(
                self.unions
                    .iter()
                    .flat_map(|u| u.sources.iter().map(|o| (Kind::ConfigMap, o))),
            )
            .collect();
        let mut out: Vec<(Kind, &ObjectRef)> = Vec::new();
        for key in sources {
            if !out.contains(&key) && !self.written().any(|w| w == key) {
                out.push(key);
            }
        }
        out.into_iter()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    backdate: Option<String>,
    #[serde(default, rename = "key-type")]
    key_type: Option<crate::pki::KeyType>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    signers: Vec<serde_norway::Value>,
    #[serde(default)]
    bundles: Vec<serde_norway::Value>,
    #[serde(default)]
    targets: Vec<serde_norway::Value>,
    #[serde(default)]
    intermediates: Vec<serde_norway::Value>,
    #[serde(default)]
    unions: Vec<serde_norway::Value>,
    #[serde(default)]
    copies: Vec<serde_norway::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignerItem {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    validity: String,
    refresh: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BundleItem {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    signers: Vec<String>,
    #[serde(default)]
    include: Vec<String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TargetItem {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    signer: String,
    #[serde(default)]
    serving: Option<ServingItem>,
    #[serde(default)]
    client: Option<ClientItem>,
    validity: String,
    refresh: String,
    #[serde(default)]
    priority: Option<u8>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct IntermediateItem {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    signer: String,
    common_name: String,
    validity: String,
    refresh: String,
    #[serde(default)]
    bundle: Option<String>,
    #[serde(default)]
    publish: Option<PublishItem>,
    #[serde(default)]
    priority: Option<u8>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct PublishItem {
    namespace: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    delay: Option<String>,
    #[serde(default)]
    copy_annotations: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UnionItem {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    bundles: Vec<String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CopyItem {
    #[serde(default)]
    secret: Option<String>,
    #[serde(default)]
    configmap: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    to: CopyTo,
    #[serde(default)]
    priority: Option<u8>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CopyTo {
    namespace: String,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServingItem {
    hostnames: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientItem {
    user: String,
    #[serde(default)]
    groups: Vec<String>,
}

/// Reads and validates the config file.
///
/// # Errors
/// A [`ConfigError`] (exit 2) when the file cannot be read or is not a config at all; broken
/// items are in [`Rotation::broken`] instead.
pub fn load(path: &Path) -> Result<Rotation, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| ConfigError(format!("cannot read config {}: {err}", path.display())))?;
    parse(&text).map_err(|err| ConfigError(format!("config {}: {}", path.display(), err.0)))
}

/// Parses a config (see the module docs).
///
/// # Errors
/// When the text is not YAML, not a mapping, has unknown top-level keys, or a bad `backdate`
/// or default `namespace`.
pub fn parse(text: &str) -> Result<Rotation, ConfigError> {
    let file: File = serde_norway::from_str(text).map_err(|err| ConfigError(err.to_string()))?;
    let default_namespace = match file.namespace {
        Some(ns) if is_dns_label(&ns) => Some(ns),
        Some(ns) => return Err(ConfigError(format!("namespace {ns:?} is not a DNS label"))),
        None => None,
    };
    let backdate = match file.backdate.as_deref() {
        Some(text) => config_duration(text).map_err(|e| ConfigError(format!("backdate: {e}")))?,
        None => Duration::from_secs(5 * 60),
    };
    let mut parser = Parser {
        default_namespace,
        common_annotations: file.annotations,
        seen: BTreeSet::new(),
        signer_names: Vec::new(),
        rotation: Rotation {
            backdate,
            key_type: file.key_type.unwrap_or_default(),
            ..Rotation::default()
        },
    };
    // Signers first: bundles and targets refer to them by name; unions to bundles.
    parser.signers(file.signers);
    parser.bundles(file.bundles);
    parser.targets(file.targets);
    parser.intermediates(file.intermediates);
    parser.unions(file.unions);
    parser.copies(file.copies);
    Ok(parser.rotation)
}

/// Per-object annotations, as declared (the file's common ones under the item's own).
type Annotations = BTreeMap<String, String>;

/// The state of one parse: the file's defaults, what is declared so far, the result.
struct Parser {
    default_namespace: Option<String>,
    common_annotations: Annotations,
    /// Every object declared so far (an object is managed by one item only).
    seen: BTreeSet<(Kind, ObjectRef)>,
    /// Each signer item's name, with its index in `rotation.signers` (`None`: broken).
    signer_names: Vec<(String, Option<usize>)>,
    rotation: Rotation,
}

impl Parser {
    /// The object `name` in `namespace` (or the file's default namespace), checked.
    fn object(&self, name: &str, namespace: Option<String>) -> Result<ObjectRef, String> {
        let namespace = namespace
            .or_else(|| self.default_namespace.clone())
            .ok_or("no namespace (set it on the item or at the top)")?;
        if !is_dns_label(&namespace) {
            return Err(format!("namespace {namespace:?} is not a DNS label"));
        }
        if !is_dns_subdomain(name) {
            return Err(format!("name {name:?} is not a DNS subdomain"));
        }
        Ok(ObjectRef {
            namespace,
            name: name.to_owned(),
        })
    }

    /// The file's common annotations with the item's own over them, checked.
    fn annotate(&self, own: Annotations) -> Result<Annotations, String> {
        let mut all = self.common_annotations.clone();
        all.extend(own);
        super::annotations::check_keys(&all)?;
        Ok(all)
    }

    /// Claims `object` for the item being parsed: an object is declared once.
    fn declare(&mut self, kind: Kind, object: &ObjectRef) -> Result<(), String> {
        if self.seen.insert((kind, object.clone())) {
            Ok(())
        } else {
            Err(format!("{} {object} is declared twice", kind.label()))
        }
    }

    /// The index of the signer named `name`.
    fn find_signer(&self, name: &str) -> Result<usize, String> {
        match self.signer_names.iter().find(|(n, _)| n == name) {
            Some((_, Some(index))) => Ok(*index),
            Some((_, None)) => Err(format!("signer {name} is broken (see its own error)")),
            None => Err(format!("signer {name} is not declared")),
        }
    }

    /// An item that failed, as `list[index]` with the reason.
    fn broken(&mut self, item: String, reason: String) {
        self.rotation.broken.push(Broken { item, reason });
    }

    /// Parses each entry of the list `list` as a `T` with `parse` and hands what passes to
    /// `keep`, in order; an entry that fails is recorded as broken (`list[index]`), and left out.
    fn list<T: serde::de::DeserializeOwned, R>(
        &mut self,
        list: &str,
        values: Vec<serde_norway::Value>,
        parse: fn(&mut Self, T) -> Result<R, String>,
        keep: fn(&mut Self, R),
    ) {
        for (i, value) in values.into_iter().enumerate() {
            match item::<T>(value).and_then(|item| parse(self, item)) {
                Ok(parsed) => keep(self, parsed),
                Err(reason) => self.broken(format!("{list}[{i}]"), reason),
            }
        }
    }

    /// The annotations written on `object` whenever it is written.
    fn keep_annotations(&mut self, kind: Kind, object: &ObjectRef, annotations: Annotations) {
        self.rotation
            .annotations
            .insert((kind, object.clone()), annotations);
    }

    /// An item's validity and refresh period, checked against each other and the backdate.
    fn periods(&self, validity: &str, refresh: &str) -> Result<(Duration, Duration), String> {
        let validity = config_duration(validity).map_err(|e| format!("validity: {e}"))?;
        let refresh = config_duration(refresh).map_err(|e| format!("refresh: {e}"))?;
        check_periods(validity, refresh, self.rotation.backdate)?;
        Ok((validity, refresh))
    }

    fn signers(&mut self, values: Vec<serde_norway::Value>) {
        for (i, value) in values.into_iter().enumerate() {
            let name = item_name(&value);
            match item::<SignerItem>(value).and_then(|item| self.signer(item)) {
                Ok((signer, annotations)) => {
                    self.keep_annotations(Kind::Secret, &signer.object, annotations);
                    self.signer_names.push((
                        signer.object.name.clone(),
                        Some(self.rotation.signers.len()),
                    ));
                    self.rotation.signers.push(signer);
                }
                Err(reason) => {
                    if let Some(name) = name {
                        self.signer_names.push((name, None));
                    }
                    self.broken(format!("signers[{i}]"), reason);
                }
            }
        }
    }

    fn signer(&mut self, item: SignerItem) -> Result<(Signer, Annotations), String> {
        let object = self.object(&item.name, item.namespace)?;
        let (validity, refresh) = self.periods(&item.validity, &item.refresh)?;
        let annotations = self.annotate(item.annotations)?;
        self.declare(Kind::Secret, &object)?;
        Ok((
            Signer {
                object,
                validity,
                refresh,
            },
            annotations,
        ))
    }

    fn bundles(&mut self, values: Vec<serde_norway::Value>) {
        self.list::<BundleItem, _>(
            "bundles",
            values,
            Self::bundle,
            |parser, (bundle, annotations)| {
                parser.keep_annotations(Kind::ConfigMap, &bundle.object, annotations);
                parser.rotation.bundles.push(bundle);
            },
        );
    }

    fn bundle(&mut self, item: BundleItem) -> Result<(Bundle, Annotations), String> {
        let object = self.object(&item.name, item.namespace)?;
        if item.signers.is_empty() {
            return Err("no signers".to_owned());
        }
        let signers = item
            .signers
            .iter()
            .map(|name| self.find_signer(name))
            .collect::<Result<Vec<_>, _>>()?;
        let annotations = self.annotate(item.annotations)?;
        self.declare(Kind::ConfigMap, &object)?;
        let include = item
            .include
            .iter()
            .map(|reference| {
                let (namespace, name) = reference
                    .split_once('/')
                    .ok_or_else(|| format!("include {reference:?} is not namespace/name"))?;
                let included = self.object(name, Some(namespace.to_owned()))?;
                if included == object {
                    return Err(format!("includes itself ({object})"));
                }
                Ok(included)
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok((
            Bundle {
                object,
                signers,
                include,
            },
            annotations,
        ))
    }

    fn targets(&mut self, values: Vec<serde_norway::Value>) {
        self.list::<TargetItem, _>(
            "targets",
            values,
            Self::target,
            |parser, (target, annotations)| {
                parser.keep_annotations(Kind::Secret, &target.object, annotations);
                parser.rotation.targets.push(target);
            },
        );
    }

    fn target(&mut self, item: TargetItem) -> Result<(Target, Annotations), String> {
        let object = self.object(&item.name, item.namespace)?;
        let signer = self.find_signer(&item.signer)?;
        if !self
            .rotation
            .bundles
            .iter()
            .any(|b| b.signers.contains(&signer))
        {
            return Err(format!(
                "signer {} is in no bundle: nothing would trust this certificate",
                item.signer
            ));
        }
        let identity = identity(item.serving, item.client)?;
        let (validity, refresh) = self.periods(&item.validity, &item.refresh)?;
        let priority = priority(item.priority)?;
        let annotations = self.annotate(item.annotations)?;
        self.declare(Kind::Secret, &object)?;
        Ok((
            Target {
                object,
                signer,
                identity,
                validity,
                refresh,
                priority,
            },
            annotations,
        ))
    }

    /// Intermediates: issued by a declared signer, like targets.
    fn intermediates(&mut self, values: Vec<serde_norway::Value>) {
        self.list::<IntermediateItem, _>(
            "intermediates",
            values,
            Self::intermediate,
            |parser, (intermediate, annotations)| {
                if let Some(bundle) = &intermediate.bundle {
                    parser.keep_annotations(Kind::ConfigMap, bundle, annotations.clone());
                }
                parser.keep_annotations(Kind::Secret, &intermediate.object, annotations);
                parser.rotation.intermediates.push(intermediate);
            },
        );
    }

    fn intermediate(
        &mut self,
        item: IntermediateItem,
    ) -> Result<(Intermediate, Annotations), String> {
        let object = self.object(&item.name, item.namespace.clone())?;
        let signer = self.find_signer(&item.signer)?;
        if !self
            .rotation
            .bundles
            .iter()
            .any(|b| b.signers.contains(&signer))
        {
            return Err(format!(
                "signer {} is in no bundle: nothing would trust this CA",
                item.signer
            ));
        }
        if !is_dns_subdomain(&item.common_name) {
            return Err(format!(
                "common-name {:?} is not a DNS subdomain",
                item.common_name
            ));
        }
        let (validity, refresh) = self.periods(&item.validity, &item.refresh)?;
        let priority = priority(item.priority)?;
        let annotations = self.annotate(item.annotations)?;
        let bundle = item
            .bundle
            .as_deref()
            .map(|name| self.object(name, Some(object.namespace.clone())))
            .transpose()?;
        let publish = item
            .publish
            .map(|p| -> Result<Publish, String> {
                let delay = match p.delay.as_deref() {
                    Some(text) => {
                        config_duration(text).map_err(|e| format!("publish.delay: {e}"))?
                    }
                    None => Duration::ZERO,
                };
                Ok(Publish {
                    object: self
                        .object(p.name.as_deref().unwrap_or(&item.name), Some(p.namespace))?,
                    delay,
                    copy_annotations: p.copy_annotations,
                })
            })
            .transpose()?;
        // All three objects, or none (a broken item claims nothing).
        self.declare(Kind::Secret, &object)?;
        if let Some(bundle) = &bundle
            && let Err(err) = self.declare(Kind::ConfigMap, bundle)
        {
            self.seen.remove(&(Kind::Secret, object.clone()));
            return Err(err);
        }
        if let Some(publish) = &publish
            && let Err(err) = self.declare(Kind::Secret, &publish.object)
        {
            self.seen.remove(&(Kind::Secret, object.clone()));
            if let Some(bundle) = &bundle {
                self.seen.remove(&(Kind::ConfigMap, bundle.clone()));
            }
            return Err(err);
        }
        Ok((
            Intermediate {
                object,
                signer,
                common_name: item.common_name,
                validity,
                refresh,
                bundle,
                publish,
                priority,
            },
            annotations,
        ))
    }

    /// Unions of declared bundles (of signers or of intermediates), by name or namespace/name.
    fn unions(&mut self, values: Vec<serde_norway::Value>) {
        self.list::<UnionItem, _>(
            "unions",
            values,
            Self::union,
            |parser, (union, annotations)| {
                parser.keep_annotations(Kind::ConfigMap, &union.object, annotations);
                parser.rotation.unions.push(union);
            },
        );
    }

    fn union(&mut self, item: UnionItem) -> Result<(Union, Annotations), String> {
        let object = self.object(&item.name, item.namespace)?;
        if item.bundles.is_empty() {
            return Err("no bundles".to_owned());
        }
        let declared: Vec<&ObjectRef> = self
            .rotation
            .bundles
            .iter()
            .map(|b| &b.object)
            .chain(
                self.rotation
                    .intermediates
                    .iter()
                    .filter_map(|i| i.bundle.as_ref()),
            )
            .collect();
        let sources = item
            .bundles
            .iter()
            .map(|reference| {
                let matches: Vec<&&ObjectRef> = declared
                    .iter()
                    .filter(|b| b.to_string() == *reference || b.name == *reference)
                    .collect();
                match matches[..] {
                    [one] => Ok((*one).clone()),
                    // Another component's bundle, read only (OpenShift's `client-ca` folds in
                    // the installer's and the kube-controller-manager's CAs).
                    [] if reference.contains('/') => {
                        let (namespace, name) = reference.split_once('/').unwrap_or_default();
                        let external = self.object(name, Some(namespace.to_owned()))?;
                        if external == object {
                            return Err(format!("includes itself ({object})"));
                        }
                        Ok(external)
                    }
                    [] => Err(format!("bundle {reference} is not declared (or broken)")),
                    _ => Err(format!(
                        "bundle {reference} is ambiguous: name it as namespace/name"
                    )),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let annotations = self.annotate(item.annotations)?;
        self.declare(Kind::ConfigMap, &object)?;
        Ok((Union { object, sources }, annotations))
    }

    /// Copies: any source (another component's object too); the copy is written by us alone.
    fn copies(&mut self, values: Vec<serde_norway::Value>) {
        self.list::<CopyItem, _>("copies", values, Self::copy, |parser, copy| {
            parser.rotation.copies.push(copy);
        });
    }

    fn copy(&mut self, item: CopyItem) -> Result<ObjectCopy, String> {
        let (kind, name) = match (item.secret, item.configmap) {
            (Some(name), None) => (Kind::Secret, name),
            (None, Some(name)) => (Kind::ConfigMap, name),
            _ => return Err("exactly one of secret or configmap is required".to_owned()),
        };
        let from = self.object(&name, item.namespace)?;
        let to = self.object(
            item.to.name.as_deref().unwrap_or(&name),
            Some(item.to.namespace),
        )?;
        if from == to {
            return Err(format!("copies {from} onto itself"));
        }
        let priority = priority(item.priority)?;
        if !self.seen.insert((kind, to.clone())) {
            return Err(format!("{} {to} is declared twice", kind.plural()));
        }
        Ok(ObjectCopy {
            kind,
            from,
            to,
            priority,
        })
    }
}

/// An item's `priority`: 1 is the first; 0 is refused (a typo for "none"?).
fn priority(value: Option<u8>) -> Result<Option<u8>, String> {
    match value {
        Some(0) => Err("priority 0: priorities start at 1 (the first)".to_owned()),
        other => Ok(other),
    }
}

/// A target's identity: exactly one of `serving` (checked, canonical, sorted hostnames) or
/// `client`.
fn identity(serving: Option<ServingItem>, client: Option<ClientItem>) -> Result<Identity, String> {
    match (serving, client) {
        (Some(serving), None) => {
            let mut hostnames: Vec<String> = serving
                .hostnames
                .iter()
                .map(|h| canonical_hostname(h))
                .collect();
            if let Some(bad) = hostnames.iter().find(|h| !is_hostname_or_ip(h)) {
                return Err(format!("hostname {bad:?} is not a DNS name or IP"));
            }
            hostnames.sort();
            hostnames.dedup();
            if hostnames.is_empty() {
                return Err("serving: no hostnames".to_owned());
            }
            // A name no verifier accepts would be re-issued on every pass, forever.
            if let Err(err) = crate::pki::check_serving_names(&hostnames) {
                for name in &hostnames {
                    crate::pki::check_serving_names(std::slice::from_ref(name))
                        .map_err(|err| format!("hostname {name:?}: {err}"))?;
                }
                return Err(format!("hostnames: {err}"));
            }
            Ok(Identity::Serving { hostnames })
        }
        (None, Some(client)) => {
            if client.user.is_empty() {
                return Err("client: empty user".to_owned());
            }
            let mut groups = client.groups;
            groups.sort();
            groups.dedup();
            Ok(Identity::Client {
                user: client.user,
                groups,
            })
        }
        _ => Err("exactly one of serving or client is required".to_owned()),
    }
}

/// One entry of a list as a `T`.
fn item<T: serde::de::DeserializeOwned>(value: serde_norway::Value) -> Result<T, String> {
    serde_norway::from_value::<T>(value).map_err(|e| e.to_string())
}

fn item_name(value: &serde_norway::Value) -> Option<String> {
    value.get("name")?.as_str().map(str::to_owned)
}

fn check_periods(validity: Duration, refresh: Duration, backdate: Duration) -> Result<(), String> {
    if validity < Duration::from_secs(60) {
        return Err("validity must be at least 1m".to_owned());
    }
    if refresh.is_zero() || refresh > validity {
        return Err("refresh must be above zero and at most the validity".to_owned());
    }
    // A certificate starts `backdate` in the past: with a refresh period no longer than that,
    // it is past its refresh time as it is written, and rotate mode re-issues it every pass.
    if refresh <= backdate {
        return Err(format!(
            "refresh must be longer than the backdate ({}s): a certificate starts that far in \
             the past, and would be due for refresh as it is written",
            backdate.as_secs()
        ));
    }
    Ok(())
}

/// A duration of the config ([`parse_duration`]: `90s`, `5m`, `12h`, `30d`, `10y`, ...), at most
/// 200 years: certificate lifetimes beyond that are typos.
fn config_duration(text: &str) -> Result<Duration, String> {
    parse_duration(text).and_then(|duration| {
        if duration > Duration::from_secs(200 * 365 * 86_400) {
            Err(format!("duration {:?} is out of range", text.trim()))
        } else {
            Ok(duration)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
namespace: openshift-kube-apiserver
signers:
  - name: localhost-serving-signer
    namespace: openshift-kube-apiserver-operator
    validity: 10y
    refresh: 8y
bundles:
  - name: localhost-serving-ca
    signers: [localhost-serving-signer]
targets:
  - name: localhost-serving-cert-certkey
    signer: localhost-serving-signer
    serving: { hostnames: [localhost, 127.0.0.1, LOCALHOST] }
    validity: 30d
    refresh: 15d
  - name: kubelet-client
    signer: localhost-serving-signer
    client: { user: "system:kube-apiserver", groups: [kube-master] }
    validity: 30d
    refresh: 15d
"#;

    #[test]
    fn a_good_config_is_validated_into_references() {
        let rotation = parse(GOOD).unwrap();
        assert!(rotation.broken.is_empty(), "{:?}", rotation.broken);
        assert_eq!(rotation.backdate, Duration::from_secs(300));
        assert_eq!(
            rotation.signers[0].object.to_string(),
            "openshift-kube-apiserver-operator/localhost-serving-signer"
        );
        assert_eq!(
            rotation.bundles[0].object.namespace,
            "openshift-kube-apiserver"
        );
        assert_eq!(
            rotation.targets[0].identity,
            Identity::Serving {
                hostnames: vec!["127.0.0.1".into(), "localhost".into()]
            }
        );
        assert_eq!(rotation.targets[1].signer, 0);
        assert_eq!(rotation.objects().count(), 4);
    }

    #[test]
    fn one_broken_item_degrades_only_itself_and_its_dependents() {
        let text = r#"
namespace: ns
signers:
  - { name: good, validity: 30d, refresh: 15d }
  - { name: bad, validity: 30x, refresh: 15d }
bundles:
  - { name: good-ca, signers: [good] }
  - { name: bad-ca, signers: [bad] }
targets:
  - { name: a, signer: good, serving: { hostnames: [a.example] }, validity: 1d, refresh: 12h }
  - { name: b, signer: bad, serving: { hostnames: [b.example] }, validity: 1d, refresh: 12h }
  - { name: c, signer: nobody, client: { user: u }, validity: 1d, refresh: 12h }
  - { name: d, signer: good, serving: { hostnames: ["bad host"] }, validity: 1d, refresh: 12h }
  - { name: e, signer: good, validity: 1d, refresh: 12h }
  - { name: f, signer: good, serving: { hostnames: [f] }, validity: 1d, refresh: 2d }
  - { name: a, signer: good, serving: { hostnames: [a] }, validity: 1d, refresh: 1h }
  - { nam: typo }
"#;
        let rotation = parse(text).unwrap();
        assert_eq!(rotation.signers.len(), 1);
        assert_eq!(rotation.bundles.len(), 1);
        assert_eq!(rotation.targets.len(), 1);
        let reasons: Vec<String> = rotation
            .broken
            .iter()
            .map(|b| format!("{}: {}", b.item, b.reason))
            .collect();
        let all = reasons.join("\n");
        for expected in [
            "signers[1]: validity: invalid duration unit",
            "bundles[1]: signer bad is broken",
            "targets[1]: signer bad is broken",
            "targets[2]: signer nobody is not declared",
            "targets[3]: hostname \"bad host\"",
            "targets[4]: exactly one of serving or client",
            "targets[5]: refresh must be",
            "targets[6]: secret ns/a is declared twice",
            "targets[7]: unknown field `nam`",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in\n{all}");
        }
    }

    #[test]
    fn hostnames_are_canonical_and_a_name_no_verifier_accepts_is_refused_naming_the_item() {
        let text = r#"
namespace: ns
signers:
  - { name: s, validity: 30d, refresh: 15d }
bundles:
  - { name: ca, signers: [s] }
targets:
  - { name: wild, signer: s, serving: { hostnames: ["*.apps.example.com", apps.example.com] }, validity: 1d, refresh: 12h }
  - { name: v6, signer: s, serving: { hostnames: ["2001:0db8::1", "2001:DB8:0:0:0:0:0:1", "::FFFF:10.0.0.1"] }, validity: 1d, refresh: 12h }
  - { name: partial, signer: s, serving: { hostnames: ["a*.example.com"] }, validity: 1d, refresh: 12h }
  - { name: inner, signer: s, serving: { hostnames: ["api.*.example.com"] }, validity: 1d, refresh: 12h }
  - { name: hyphen, signer: s, serving: { hostnames: [ok.example, "-bad.example"] }, validity: 1d, refresh: 12h }
"#;
        let rotation = parse(text).unwrap();
        let hostnames = |i: usize| match &rotation.targets[i].identity {
            Identity::Serving { hostnames } => hostnames.clone(),
            Identity::Client { .. } => unreachable!(),
        };
        assert_eq!(hostnames(0), ["*.apps.example.com", "apps.example.com"]);
        assert_eq!(hostnames(1), ["2001:db8::1", "::ffff:10.0.0.1"]);
        let all: String = rotation
            .broken
            .iter()
            .map(|b| format!("{}: {}\n", b.item, b.reason))
            .collect();
        for expected in [
            "targets[2]: hostname \"a*.example.com\"",
            "targets[3]: hostname \"api.*.example.com\"",
            "targets[4]: hostname \"-bad.example\"",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in\n{all}");
        }
        assert_eq!(rotation.broken.len(), 3, "{all}");
    }

    #[test]
    fn intermediates_unions_and_copies_are_validated_item_by_item() {
        let text = r#"
namespace: ns
signers:
  - { name: root, validity: 60d, refresh: 30d }
  - { name: lonely, validity: 60d, refresh: 30d }
bundles:
  - { name: root-ca, signers: [root] }
  - { name: other-ca, namespace: other, signers: [root] }
  - { name: root-ca, namespace: other, signers: [root] }
intermediates:
  - { name: csr, signer: root, common-name: kube-csr-signer, validity: 30d, refresh: 15d, bundle: csr-ca, publish: { namespace: kcm, delay: 5m } }
  - { name: loose, signer: lonely, common-name: x, validity: 30d, refresh: 15d }
  - { name: badname, signer: root, common-name: "Not A Name", validity: 30d, refresh: 15d }
  - { name: twice, signer: root, common-name: x, validity: 30d, refresh: 15d, bundle: csr-ca }
  - { name: late, signer: root, common-name: x, validity: 30d, refresh: 15d, publish: { namespace: kcm, delay: soon } }
unions:
  - { name: all-ca, bundles: [csr-ca, ns/root-ca, other-ca] }
  - { name: vague-ca, bundles: [root-ca] }
  - { name: ghost-ca, bundles: [nowhere-ca] }
copies:
  - { configmap: all-ca, to: { namespace: managed } }
  - { secret: client, namespace: managed, to: { namespace: kcm } }
  - { secret: client, namespace: managed, to: { namespace: kcm, name: client-2 } }
  - { configmap: all-ca, secret: all-ca, to: { namespace: managed } }
  - { configmap: all-ca, to: { namespace: ns } }
  - { configmap: all-ca, to: { namespace: managed } }
"#;
        let rotation = parse(text).unwrap();
        let all = rotation
            .broken
            .iter()
            .map(|b| format!("{}: {}", b.item, b.reason))
            .collect::<Vec<_>>()
            .join("\n");
        for expected in [
            "intermediates[1]: signer lonely is in no bundle",
            "intermediates[2]: common-name \"Not A Name\"",
            "intermediates[3]: configmap ns/csr-ca is declared twice",
            "intermediates[4]: publish.delay",
            "unions[1]: bundle root-ca is ambiguous",
            "unions[2]: bundle nowhere-ca is not declared",
            "copies[3]: exactly one of secret or configmap",
            "copies[4]: copies ns/all-ca onto itself",
            "copies[5]: configmaps managed/all-ca is declared twice",
        ] {
            assert!(all.contains(expected), "missing {expected:?} in\n{all}");
        }
        assert_eq!(rotation.intermediates.len(), 1);
        let csr = &rotation.intermediates[0];
        assert_eq!(csr.publish.as_ref().unwrap().object.to_string(), "kcm/csr");
        assert_eq!(csr.bundle.as_ref().unwrap().to_string(), "ns/csr-ca");
        assert_eq!(rotation.unions.len(), 1);
        assert_eq!(
            rotation.unions[0]
                .sources
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["ns/csr-ca", "ns/root-ca", "other/other-ca"]
        );
        assert_eq!(rotation.copies.len(), 3);
        // The failed intermediates left nothing declared behind: "twice"'s Secret is free.
        assert!(!rotation.written().any(|(_, o)| o.name == "twice"));
        // The copies' shared source is read once and never written.
        let read_only: Vec<String> = rotation.read_only().map(|(_, o)| o.to_string()).collect();
        assert_eq!(read_only, ["managed/client"]);
        assert_eq!(rotation.objects().count(), rotation.written().count() + 1);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for text in ["", "[1, 2]", "signers: 5", "{", "bogus: 1", "backdate: -1"] {
            let _ = parse(text);
        }
        assert!(parse("bogus: 1").is_err());
        assert!(parse("signers: 5").is_err());
        assert!(parse("namespace: Not_A_Label").is_err());
        assert!(parse("").is_ok() || parse("").is_err());
    }

    #[test]
    fn config_durations_stop_at_200_years() {
        assert_eq!(
            config_duration("10y"),
            Ok(Duration::from_secs(3650 * 86_400))
        );
        assert!(config_duration("200y").is_ok());
        assert!(
            config_duration("201y")
                .unwrap_err()
                .contains("out of range")
        );
    }
    #[test]
    fn key_type_and_annotations_are_read_and_merged_per_item() {
        let text = r#"
namespace: ns
key-type: ecdsa-p256
annotations: { "openshift.io/owning-component": kube-apiserver }
signers:
  - name: s
    validity: 30d
    refresh: 15d
    annotations: { "openshift.io/description": "the signer" }
bundles:
  - { name: b, signers: [s] }
targets:
  - name: t
    signer: s
    client: { user: u }
    validity: 1d
    refresh: 12h
    annotations: { "auth.openshift.io/certificate-not-after": "forged" }
"#;
        let rotation = parse(text).unwrap();
        assert_eq!(rotation.key_type, crate::pki::KeyType::EcdsaP256);
        let signer = &rotation.annotations[&(
            crate::base::kind::Kind::Secret,
            rotation.signers[0].object.clone(),
        )];
        assert_eq!(signer.len(), 2);
        assert_eq!(signer["openshift.io/description"], "the signer");
        // A computed annotation cannot be declared: that item is broken, the others run.
        assert_eq!(rotation.targets.len(), 0);
        assert!(
            rotation.broken[0].reason.contains("computed"),
            "{:?}",
            rotation.broken
        );
        assert_eq!(parse("namespace: ns").unwrap().key_type, Default::default());
        assert!(parse("key-type: dsa").is_err());
    }
}
