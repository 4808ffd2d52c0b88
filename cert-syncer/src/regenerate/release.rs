//! OpenShift's releases (`--openshift-version`, 4.14 … 5.0): the lifetimes, refresh periods and
//! metadata each release's operators write, applied to the built-in profiles.
//!
//! The table is `profiles/openshift-releases.yaml`, read from each release branch of
//! openshift/cluster-kube-apiserver-operator and openshift/cluster-kube-controller-manager-operator
//! (every row names its branch, commit and files). Why it matters: library-go rewrites the
//! metadata of an object whose annotations differ from its own, and re-issues on its own
//! lifetimes; a profile must be the release it runs next to. The operators' `main` (the
//! development line, rotation sped up 60× "to be reverted before we ship") is not a release.
//! `docs/openshift.md` has the same table in short; a test holds the two to each other.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use serde::Deserialize;

use super::config::{ObjectRef, Rotation};
use crate::base::error::ConfigError;
use crate::base::kind::Kind;
use crate::base::time::parse_duration;

/// The release a profile models when `--openshift-version` is not given: the newest shipped
/// line.
pub const DEFAULT: &str = "5.0";

/// One release: where its values come from, and the values.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Release {
    pub version: String,
    /// `release-X.Y@<commit> <files>` of cluster-kube-apiserver-operator.
    pub kube_apiserver: String,
    /// The same for cluster-kube-controller-manager-operator.
    pub kube_controller_manager: String,
    /// Whether the published `openshift-kube-controller-manager/csr-signer` carries the
    /// annotations of its source (`ManageCSRSigner`: `Annotations: csrSigner.Annotations`).
    pub publish_annotations: bool,
    /// By object name (unique within each profile).
    pub objects: BTreeMap<String, Object>,
}

/// One object's lifetime (signers, targets, intermediates) and annotations (all).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Object {
    #[serde(default)]
    pub validity: Option<String>,
    #[serde(default)]
    pub refresh: Option<String>,
    pub annotations: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    releases: Vec<Release>,
}

/// Every supported release, oldest first.
pub fn all() -> &'static [Release] {
    static TABLE: OnceLock<Vec<Release>> = OnceLock::new();
    TABLE.get_or_init(|| {
        serde_norway::from_str::<Table>(include_str!("profiles/openshift-releases.yaml"))
            .expect("profiles/openshift-releases.yaml parses (unit-tested)")
            .releases
    })
}

/// The release `version` names (`4.14` … `5.0`).
///
/// # Errors
/// An unknown version, naming the supported ones.
pub fn find(version: &str) -> Result<&'static Release, ConfigError> {
    all()
        .iter()
        .find(|r| r.version == version.trim())
        .ok_or_else(|| {
            ConfigError(format!(
                "--openshift-version {version:?} is not a supported release (supported: {})",
                all()
                    .iter()
                    .map(|r| r.version.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

fn duration(
    release: &Release,
    name: &str,
    what: &str,
    text: &str,
) -> Result<Duration, ConfigError> {
    parse_duration(text).map_err(|err| {
        ConfigError(format!(
            "release {} {name} {what} {text:?}: {err}",
            release.version
        ))
    })
}

/// Sets the release's lifetimes and annotations on every object of `rotation` it names; objects
/// it does not name (copies, the aggregator CA copy) keep the profile's.
///
/// # Errors
/// A lifetime in the table that does not parse, or a refresh not shorter than the validity.
pub fn apply(rotation: &mut Rotation, release: &Release) -> Result<(), ConfigError> {
    let lifetime = |name: &str| -> Result<Option<(Duration, Duration)>, ConfigError> {
        match release.objects.get(name) {
            Some(Object {
                validity: Some(validity),
                refresh: Some(refresh),
                ..
            }) => {
                let validity = duration(release, name, "validity", validity)?;
                let refresh = duration(release, name, "refresh", refresh)?;
                if refresh >= validity {
                    return Err(ConfigError(format!(
                        "release {} {name}: refresh is not shorter than validity",
                        release.version
                    )));
                }
                Ok(Some((validity, refresh)))
            }
            _ => Ok(None),
        }
    };
    for signer in &mut rotation.signers {
        if let Some((validity, refresh)) = lifetime(&signer.object.name)? {
            (signer.validity, signer.refresh) = (validity, refresh);
        }
    }
    for target in &mut rotation.targets {
        if let Some((validity, refresh)) = lifetime(&target.object.name)? {
            (target.validity, target.refresh) = (validity, refresh);
        }
    }
    for intermediate in &mut rotation.intermediates {
        if let Some((validity, refresh)) = lifetime(&intermediate.object.name)? {
            (intermediate.validity, intermediate.refresh) = (validity, refresh);
        }
        if let Some(publish) = &mut intermediate.publish {
            publish.copy_annotations = release.publish_annotations;
        }
    }
    // Every object the operators write themselves (not copies, not the published CA: those
    // carry their source's), set to exactly the release's annotations — an empty set where the
    // release writes none, so the profile's defaults are not written there either.
    let own: Vec<(Kind, ObjectRef)> = rotation
        .signers
        .iter()
        .map(|s| (Kind::Secret, s.object.clone()))
        .chain(
            rotation
                .bundles
                .iter()
                .map(|b| (Kind::ConfigMap, b.object.clone())),
        )
        .chain(
            rotation
                .targets
                .iter()
                .map(|t| (Kind::Secret, t.object.clone())),
        )
        .chain(rotation.intermediates.iter().flat_map(|i| {
            std::iter::once((Kind::Secret, i.object.clone()))
                .chain(i.bundle.iter().map(|b| (Kind::ConfigMap, b.clone())))
        }))
        .chain(
            rotation
                .unions
                .iter()
                .map(|u| (Kind::ConfigMap, u.object.clone())),
        )
        .collect();
    for (kind, object) in own {
        if let Some(row) = release.objects.get(&object.name) {
            rotation
                .annotations
                .entry((kind, object))
                .or_default()
                .clone_from(&row.annotations);
        }
    }
    Ok(())
}

/// A short description of the annotations a set of objects carries, as `docs/openshift.md`'s
/// table states it: the keys any object has (`component`, `description`, `test-name`,
/// `auto-regenerate`), and whether the last holds the bare link (`=url`) or the link and a
/// text (`=url,text`); `none` when no object has any.
pub fn metadata_summary<'a>(
    annotations: impl Iterator<Item = &'a BTreeMap<String, String>>,
) -> String {
    const KEYS: [(&str, &str); 4] = [
        ("openshift.io/owning-component", "component"),
        ("openshift.io/description", "description"),
        ("certificates.openshift.io/test-name", "test-name"),
        (
            "certificates.openshift.io/auto-regenerate-after-offline-expiry",
            "auto-regenerate",
        ),
    ];
    let mut present = [false; 4];
    let mut bare = true;
    for map in annotations {
        for (i, (key, _)) in KEYS.iter().enumerate() {
            if let Some(value) = map.get(*key) {
                present[i] = true;
                if i == 3 && value.contains(',') {
                    bare = false;
                }
            }
        }
    }
    let mut parts: Vec<String> = Vec::new();
    for (i, (_, short)) in KEYS.iter().enumerate() {
        if present[i] {
            parts.push(if i == 3 {
                format!("{short}={}", if bare { "url" } else { "url,text" })
            } else {
                (*short).to_owned()
            });
        }
    }
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regenerate::cluster::ClusterValues;
    use crate::regenerate::profile::{self, Flags, Profile};

    const DOC: &str = include_str!("../../../docs/openshift.md");

    /// `docs/openshift.md`'s release table: one map (column header → cell) per row.
    fn doc_rows() -> Vec<BTreeMap<String, String>> {
        let cells = |line: &str| -> Vec<String> {
            line.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        };
        let mut lines = DOC
            .lines()
            .skip_while(|l| !l.starts_with("| release |"))
            .take_while(|l| l.starts_with('|'));
        let header = cells(
            lines
                .next()
                .expect("the release table in docs/openshift.md"),
        );
        lines
            .skip(1)
            .map(|line| header.iter().cloned().zip(cells(line)).collect())
            .collect()
    }

    fn life(validity: Duration, refresh: Duration) -> String {
        let text = |d: Duration| {
            let secs = d.as_secs();
            if secs.is_multiple_of(86_400) {
                format!("{}d", secs / 86_400)
            } else {
                format!("{}h", secs / 3600)
            }
        };
        format!("{} / {}", text(validity), text(refresh))
    }

    /// The doc column an object's lifetime is stated in.
    fn column(name: &str) -> &'static str {
        match name {
            "aggregator-client-signer" => "aggregator-client-signer",
            "kube-apiserver-to-kubelet-signer" => "kube-apiserver-to-kubelet-signer",
            "kube-control-plane-signer" => "kube-control-plane-signer",
            "node-system-admin-signer" => "node-system-admin-signer",
            "node-system-admin-client" => "node-system-admin-client",
            "localhost-serving-signer"
            | "service-network-serving-signer"
            | "loadbalancer-serving-signer"
            | "localhost-recovery-serving-signer"
            | "localhost-recovery-serving-certkey" => {
                "10-year signers and localhost-recovery-serving-certkey"
            }
            _ => "targets",
        }
    }

    fn build(which: Profile, release: &Release) -> Rotation {
        let cluster = ClusterValues {
            service_network_ips: Some(vec!["172.30.0.1".parse().unwrap()]),
            api_hostname: Some("api.example.com".into()),
            api_int_hostname: Some("api-int.example.com".into()),
            unread: Vec::new(),
        };
        profile::build(which, release, &cluster, &Flags::default()).unwrap()
    }

    /// The annotations of every object the release's table names.
    fn summary(rotation: &Rotation, release: &Release) -> String {
        metadata_summary(
            rotation
                .annotations
                .iter()
                .filter(|((_, object), _)| release.objects.contains_key(&object.name))
                .map(|(_, annotations)| annotations),
        )
    }

    #[test]
    fn the_docs_table_is_the_profiles() {
        let rows = doc_rows();
        let versions: Vec<&str> = rows.iter().map(|r| r["release"].as_str()).collect();
        let supported: Vec<&str> = all().iter().map(|r| r.version.as_str()).collect();
        assert_eq!(versions, supported);
        assert_eq!(supported.first(), Some(&"4.14"));
        assert_eq!(supported.last(), Some(&DEFAULT));
        for row in &rows {
            let release = find(&row["release"]).unwrap();
            let at = |what: &str| format!("release {}: {what}", release.version);
            // Where the values come from.
            let source = |text: &str| text.split_whitespace().next().unwrap().to_owned();
            assert_eq!(
                row["source (cluster-kube-apiserver-operator; cluster-kube-controller-manager-operator)"],
                format!(
                    "{}; {}",
                    source(&release.kube_apiserver),
                    source(&release.kube_controller_manager)
                ),
                "{}",
                at("source")
            );
            assert!(
                release
                    .kube_apiserver
                    .starts_with(&format!("release-{}@", release.version))
            );

            // The kube-apiserver's half: the same objects on every release, lifetimes per row.
            let kas = build(Profile::OpenshiftKubeApiserver, release);
            assert_eq!(kas.signers.len(), 8, "{}", at("signers"));
            assert_eq!(kas.bundles.len(), 9, "{}", at("bundles"));
            assert_eq!(kas.unions.len(), 1, "{}", at("unions"));
            assert_eq!(kas.unions[0].sources.len(), 7, "{}", at("client-ca"));
            assert_eq!(kas.targets.len(), 12, "{}", at("targets"));
            let lifetimes = kas
                .signers
                .iter()
                .map(|s| (&s.object.name, s.validity, s.refresh))
                .chain(
                    kas.targets
                        .iter()
                        .map(|t| (&t.object.name, t.validity, t.refresh)),
                );
            for (name, validity, refresh) in lifetimes {
                assert_eq!(life(validity, refresh), row[column(name)], "{}", at(name));
            }
            assert_eq!(
                summary(&kas, release),
                row["kube-apiserver metadata"],
                "{}",
                at("kube-apiserver metadata")
            );
            // Every object the table names is one of the two profiles'.
            let kcm = build(Profile::OpenshiftKubeControllerManager, release);
            for name in release.objects.keys() {
                let known = |r: &Rotation| r.written().any(|(_, o)| &o.name == name);
                assert!(known(&kas) || known(&kcm), "{}", at(name));
            }
            // client-ca: no label ever (a union), the component from 4.15 on.
            assert_eq!(
                kas.annotations[&(Kind::ConfigMap, kas.unions[0].object.clone())],
                release.objects["client-ca"].annotations
            );

            // The kube-controller-manager's half.
            let signer = &kcm.signers[0];
            let csr = &kcm.intermediates[0];
            assert_eq!(
                format!(
                    "{}, {}",
                    life(signer.validity, signer.refresh),
                    life(csr.validity, csr.refresh)
                ),
                row["csr-signer-signer, csr-signer"],
                "{}",
                at("csr-signer")
            );
            assert_eq!(
                summary(&kcm, release),
                row["kube-controller-manager metadata"],
                "{}",
                at("kube-controller-manager metadata")
            );
            let published = csr.publish.as_ref().unwrap().copy_annotations;
            assert_eq!(
                if published { "yes" } else { "no" },
                row["published csr-signer annotations"],
                "{}",
                at("published csr-signer")
            );
        }
    }

    #[test]
    fn every_release_applies_its_annotations_exactly() {
        for release in all() {
            let kas = build(Profile::OpenshiftKubeApiserver, release);
            for ((_, object), annotations) in &kas.annotations {
                if let Some(row) = release.objects.get(&object.name) {
                    assert_eq!(
                        annotations, &row.annotations,
                        "{} {object}",
                        release.version
                    );
                }
            }
        }
        // Spot checks against the operators' source (the list).
        let kas = |v: &str| build(Profile::OpenshiftKubeApiserver, find(v).unwrap());
        let signer = |r: &Rotation, name: &str| {
            let s = r.signers.iter().find(|s| s.object.name == name).unwrap();
            life(s.validity, s.refresh)
        };
        assert_eq!(
            signer(&kas("4.20"), "kube-apiserver-to-kubelet-signer"),
            "365d / 30d"
        );
        assert_eq!(
            signer(&kas("5.0"), "kube-apiserver-to-kubelet-signer"),
            "365d / 292d"
        );
        assert_eq!(
            signer(&kas("4.18"), "node-system-admin-signer"),
            "365d / 292d"
        );
        assert_eq!(
            signer(&kas("4.19"), "node-system-admin-signer"),
            "1095d / 876d"
        );
        let auto = "certificates.openshift.io/auto-regenerate-after-offline-expiry";
        let test_name = "certificates.openshift.io/test-name";
        let of = |r: &Rotation, name: &str| {
            r.annotations
                .iter()
                .find(|((_, o), _)| o.name == name)
                .unwrap()
                .1
                .clone()
        };
        let v420 = of(&kas("4.20"), "kubelet-client");
        assert!(!v420.contains_key(test_name));
        assert!(v420[auto].contains(",'[sig-cli] Kubectl logs"), "{v420:?}");
        let v50 = of(&kas("5.0"), "kubelet-client");
        assert_eq!(
            v50[auto],
            "https://github.com/openshift/cluster-kube-apiserver-operator/pull/1631"
        );
        assert!(v50.contains_key(test_name));
        assert!(of(&kas("4.14"), "kubelet-client").is_empty());
        assert!(find("5.1").unwrap_err().0.contains("4.14"));
    }
}
