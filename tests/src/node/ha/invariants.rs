//! What must hold once the tier recovered, whatever happened on the way (a leader killed in
//! the middle of a pass, a sidecar killed, a full disk): nothing half done, in the API and on
//! each node's disk.
//!
//! In the API, for each profile the pods' controllers run (`openshift-kube-apiserver`,
//! `openshift-kube-controller-manager`, `openshift-kube-scheduler`, read as data from
//! `cert_syncer::regenerate::profile_objects`):
//! - every signer and intermediate holds an unexpired CA, every target an unexpired certificate
//!   issued by its signer's current CA (its consumers verify it with the bundles below);
//! - no CA without its bundle: the current CA of every signer is in every bundle that lists the
//!   signer, every intermediate's CA in its bundle, its published copy in that bundle too;
//! - no trust widened: every CA of a bundle is unexpired and is the current CA of one of its
//!   signers or of an included bundle; every union holds exactly the unexpired CAs of its
//!   sources (nothing else); every copy equals its source.
//!
//! On a node's disk, for every object directory `sync` keeps: `..data` names a generation
//! directory that holds every key, every key is a link into `..data`, no `..data_tmp` is left,
//! and the files hold what the API holds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use cert_syncer::kind::Kind;
use cert_syncer::regenerate::Profile;
use cert_syncer::regenerate::config::{ObjectRef, Rotation};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;

use crate::node::scenario::now;

/// Every profile the three pods' regeneration controllers run, with its objects.
pub fn rotations() -> Vec<(&'static str, Rotation)> {
    [
        ("openshift-kube-apiserver", Profile::OpenshiftKubeApiserver),
        (
            "openshift-kube-controller-manager",
            Profile::OpenshiftKubeControllerManager,
        ),
        ("openshift-kube-scheduler", Profile::OpenshiftKubeScheduler),
    ]
    .into_iter()
    .map(|(name, profile)| {
        (
            name,
            cert_syncer::regenerate::profile_objects(profile)
                .unwrap_or_else(|err| panic!("profile {name}: {err}")),
        )
    })
    .collect()
}

/// The data of every object the profiles declare (written or read), as the API holds it now;
/// absent objects are absent.
#[derive(Debug, Default, Clone)]
pub struct ApiState {
    /// Secrets' data, by (namespace, name).
    pub secrets: BTreeMap<(String, String), BTreeMap<String, Vec<u8>>>,
    /// ConfigMaps' data, by (namespace, name).
    pub config_maps: BTreeMap<(String, String), BTreeMap<String, String>>,
}

impl ApiState {
    /// Reads every object of `rotations` through `client`.
    ///
    /// # Errors
    /// The first read that failed otherwise than with 404.
    pub async fn read(
        client: &kube::Client,
        rotations: &[(&str, Rotation)],
    ) -> Result<ApiState, String> {
        let mut state = ApiState::default();
        let mut wanted = BTreeSet::new();
        for (_, rotation) in rotations {
            for (kind, object) in rotation.objects() {
                wanted.insert((
                    kind == Kind::Secret,
                    object.namespace.clone(),
                    object.name.clone(),
                ));
            }
        }
        for (secret, namespace, name) in wanted {
            let key = (namespace.clone(), name.clone());
            if secret {
                let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
                if let Some(found) = api
                    .get_opt(&name)
                    .await
                    .map_err(|e| format!("{namespace}/{name}: {e}"))?
                {
                    let data = found.data.unwrap_or_default();
                    state
                        .secrets
                        .insert(key, data.into_iter().map(|(k, v)| (k, v.0)).collect());
                }
            } else {
                let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
                if let Some(found) = api
                    .get_opt(&name)
                    .await
                    .map_err(|e| format!("{namespace}/{name}: {e}"))?
                {
                    state
                        .config_maps
                        .insert(key, found.data.unwrap_or_default());
                }
            }
        }
        Ok(state)
    }

    fn secret_pem(&self, object: &ObjectRef, key: &str) -> Option<String> {
        self.secrets
            .get(&(object.namespace.clone(), object.name.clone()))
            .and_then(|d| d.get(key))
            .and_then(|b| String::from_utf8(b.clone()).ok())
    }

    fn bundle(&self, object: &ObjectRef) -> Option<Vec<Vec<u8>>> {
        self.config_maps
            .get(&(object.namespace.clone(), object.name.clone()))
            .map(|d| certificates(d.get("ca-bundle.crt").map_or("", String::as_str)))
    }
}

/// The DER of every certificate in `pem`.
pub fn certificates(pem: &str) -> Vec<Vec<u8>> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .filter_map(Result::ok)
        .map(|c| c.to_vec())
        .collect()
}

/// Whether the certificate `der` is within its validity window now.
fn unexpired(der: &[u8]) -> bool {
    x509_parser::parse_x509_certificate(der).is_ok_and(|(_, c)| {
        let t = now();
        c.validity().not_before.timestamp() <= t && t < c.validity().not_after.timestamp()
    })
}

/// Whether `leaf` carries a signature `ca`'s key made.
pub fn signed_by(leaf: &[u8], ca: &[u8]) -> bool {
    let (Ok((_, leaf)), Ok((_, ca))) = (
        x509_parser::parse_x509_certificate(leaf),
        x509_parser::parse_x509_certificate(ca),
    ) else {
        return false;
    };
    leaf.verify_signature(Some(ca.public_key())).is_ok()
}

/// The subject of `der`, for messages.
fn subject(der: &[u8]) -> String {
    x509_parser::parse_x509_certificate(der)
        .map(|(_, c)| c.subject().to_string())
        .unwrap_or_else(|_| "(unparsable)".to_owned())
}

/// What is wrong with `rotation`'s objects in `state` (empty: nothing), each naming the object.
pub fn check_api(profile: &str, rotation: &Rotation, state: &ApiState) -> Vec<String> {
    let mut wrong = Vec::new();
    let current = |object: &ObjectRef| {
        state
            .secret_pem(object, "tls.crt")
            .map(|pem| certificates(&pem))
            .and_then(|c| c.into_iter().next())
    };
    let signer_ca: Vec<Option<Vec<u8>>> = rotation
        .signers
        .iter()
        .map(|s| current(&s.object))
        .collect();
    for (signer, ca) in rotation.signers.iter().zip(&signer_ca) {
        match ca {
            Some(ca) if unexpired(ca) => {}
            _ => wrong.push(format!(
                "{profile}: signer {} holds no unexpired CA",
                signer.object
            )),
        }
    }
    for target in &rotation.targets {
        let Some(leaf) = current(&target.object) else {
            wrong.push(format!("{profile}: target {} is missing", target.object));
            continue;
        };
        if !unexpired(&leaf) {
            wrong.push(format!("{profile}: target {} is expired", target.object));
        }
        match &signer_ca[target.signer] {
            Some(ca) if signed_by(&leaf, ca) => {}
            _ => wrong.push(format!(
                "{profile}: target {} ({}) is not issued by the current CA of {}",
                target.object,
                subject(&leaf),
                rotation.signers[target.signer].object
            )),
        }
    }
    for bundle in &rotation.bundles {
        let Some(cas) = state.bundle(&bundle.object) else {
            wrong.push(format!("{profile}: bundle {} is missing", bundle.object));
            continue;
        };
        let mut allowed: Vec<Vec<u8>> = bundle
            .signers
            .iter()
            .filter_map(|&i| signer_ca[i].clone())
            .collect();
        for &i in &bundle.signers {
            if let Some(ca) = &signer_ca[i]
                && !cas.contains(ca)
            {
                wrong.push(format!(
                    "{profile}: the CA of {} ({}) is not in its bundle {}",
                    rotation.signers[i].object,
                    subject(ca),
                    bundle.object
                ));
            }
        }
        for included in &bundle.include {
            allowed.extend(state.bundle(included).unwrap_or_default());
        }
        for ca in &cas {
            if !unexpired(ca) {
                wrong.push(format!(
                    "{profile}: bundle {} keeps an expired CA ({})",
                    bundle.object,
                    subject(ca)
                ));
            } else if !allowed.contains(ca) {
                wrong.push(format!(
                    "{profile}: bundle {} trusts {}, which is none of its signers' current CAs nor included (trust widened)",
                    bundle.object,
                    subject(ca)
                ));
            }
        }
    }
    for intermediate in &rotation.intermediates {
        let Some(ca) = current(&intermediate.object) else {
            wrong.push(format!(
                "{profile}: intermediate {} is missing",
                intermediate.object
            ));
            continue;
        };
        if !unexpired(&ca) {
            wrong.push(format!(
                "{profile}: intermediate {} is expired",
                intermediate.object
            ));
        }
        if !signer_ca[intermediate.signer]
            .as_ref()
            .is_some_and(|s| signed_by(&ca, s))
        {
            wrong.push(format!(
                "{profile}: intermediate {} is not issued by the current CA of {}",
                intermediate.object, rotation.signers[intermediate.signer].object
            ));
        }
        let bundled = intermediate.bundle.as_ref().and_then(|b| state.bundle(b));
        if let (Some(bundle), Some(cas)) = (&intermediate.bundle, &bundled) {
            if !cas.contains(&ca) {
                wrong.push(format!(
                    "{profile}: the CA of {} is not in its bundle {bundle}",
                    intermediate.object
                ));
            }
            if let Some(publish) = &intermediate.publish {
                match current(&publish.object) {
                    Some(published) if cas.contains(&published) && unexpired(&published) => {}
                    _ => wrong.push(format!(
                        "{profile}: the published {} is not an unexpired CA of {bundle}",
                        publish.object
                    )),
                }
            }
        }
    }
    for union in &rotation.unions {
        let Some(cas) = state.bundle(&union.object) else {
            wrong.push(format!("{profile}: union {} is missing", union.object));
            continue;
        };
        let mut expected: Vec<Vec<u8>> = Vec::new();
        for source in &union.sources {
            for ca in state.bundle(source).unwrap_or_default() {
                if unexpired(&ca) && !expected.contains(&ca) {
                    expected.push(ca);
                }
            }
        }
        let (have, want): (BTreeSet<_>, BTreeSet<_>) =
            (cas.iter().collect(), expected.iter().collect());
        for extra in have.difference(&want) {
            wrong.push(format!(
                "{profile}: union {} trusts {}, in none of its sources (trust widened)",
                union.object,
                subject(extra)
            ));
        }
        for missing in want.difference(&have) {
            wrong.push(format!(
                "{profile}: union {} lacks {} of its sources",
                union.object,
                subject(missing)
            ));
        }
    }
    for copy in &rotation.copies {
        let key = |o: &ObjectRef| (o.namespace.clone(), o.name.clone());
        let same = match copy.kind {
            Kind::Secret => {
                state.secrets.get(&key(&copy.from)) == state.secrets.get(&key(&copy.to))
            }
            Kind::ConfigMap => {
                state.config_maps.get(&key(&copy.from)) == state.config_maps.get(&key(&copy.to))
            }
        };
        if !same {
            wrong.push(format!(
                "{profile}: the copy {} differs from {}",
                copy.to, copy.from
            ));
        }
    }
    wrong
}

/// What is wrong on disk in the cert dir `dir` (kept by `sync` from `namespace`), compared with
/// `api` (the objects' data by kind and name; `None`: not compared): incomplete generations,
/// stray staging links, links that do not go through `..data`, content that is not the API's.
pub fn check_cert_dir(
    dir: &Path,
    api: &BTreeMap<(bool, String), BTreeMap<String, Vec<u8>>>,
) -> Vec<String> {
    let mut wrong = Vec::new();
    for (secret, kind) in [(true, "secrets"), (false, "configmaps")] {
        let Ok(entries) = std::fs::read_dir(dir.join(kind)) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let object = entry.path();
            let found = generation(&object);
            match found {
                Err(why) => wrong.push(format!("{}: {why}", object.display())),
                Ok(files) => {
                    if let Some(data) = api.get(&(secret, name.clone()))
                        && &files != data
                    {
                        let keys: Vec<&String> = files.keys().chain(data.keys()).collect();
                        wrong.push(format!(
                            "{}: the files differ from the API's {kind}/{name} (keys {keys:?})",
                            object.display()
                        ));
                    }
                }
            }
        }
    }
    wrong
}

/// The files of the object directory `dir` through `..data`, or what is incomplete.
fn generation(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>, String> {
    if std::fs::symlink_metadata(dir.join("..data_tmp")).is_ok() {
        return Err("a staged ..data_tmp was left".to_owned());
    }
    let target = std::fs::read_link(dir.join("..data")).map_err(|e| format!("no ..data: {e}"))?;
    let generation = dir.join(&target);
    if !generation.is_dir() {
        return Err(format!(
            "..data names {}, which is not a directory",
            target.display()
        ));
    }
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(&generation)
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
    {
        let key = entry.file_name().to_string_lossy().into_owned();
        let bytes = std::fs::read(entry.path()).map_err(|e| format!("{key}: {e}"))?;
        files.insert(key, bytes);
    }
    for entry in std::fs::read_dir(dir)
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
    {
        let key = entry.file_name().to_string_lossy().into_owned();
        if key.starts_with("..") {
            continue;
        }
        let link = std::fs::read_link(entry.path()).map_err(|_| format!("{key} is not a link"))?;
        if link != Path::new("..data").join(&key) {
            return Err(format!(
                "{key} links to {}, not through ..data",
                link.display()
            ));
        }
        if !files.contains_key(&key) {
            return Err(format!(
                "{key} is visible but missing from the generation {}",
                target.display()
            ));
        }
    }
    if files.is_empty() {
        return Err(format!("the generation {} is empty", target.display()));
    }
    Ok(files)
}

/// The data of every Secret and ConfigMap of `namespace` (by (is a Secret, name)): what the
/// cert dirs kept from it are compared with.
///
/// # Errors
/// When the lists fail.
pub async fn namespace_data(
    client: &kube::Client,
    namespace: &str,
) -> Result<BTreeMap<(bool, String), BTreeMap<String, Vec<u8>>>, String> {
    let mut data = BTreeMap::new();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for secret in secrets
        .list(&Default::default())
        .await
        .map_err(|e| e.to_string())?
        .items
    {
        let name = secret.metadata.name.clone().unwrap_or_default();
        let files = secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        data.insert((true, name), files);
    }
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    for config_map in config_maps
        .list(&Default::default())
        .await
        .map_err(|e| e.to_string())?
        .items
    {
        let name = config_map.metadata.name.clone().unwrap_or_default();
        let files = config_map
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        data.insert((false, name), files);
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(
        secret: bool,
        name: &str,
        files: &[(&str, &[u8])],
    ) -> BTreeMap<(bool, String), BTreeMap<String, Vec<u8>>> {
        BTreeMap::from([(
            (secret, name.to_owned()),
            files
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.to_vec()))
                .collect(),
        )])
    }

    #[test]
    fn a_kubelet_swap_is_a_complete_generation_and_the_apis_data() {
        let dir = tempfile::tempdir().unwrap();
        let object = dir.path().join("secrets/pair");
        std::fs::create_dir_all(&object).unwrap();
        testkit::files::kubelet_swap(&object, 1, &[("tls.crt", b"c1"), ("tls.key", b"k1")]);
        testkit::files::kubelet_swap(&object, 2, &[("tls.crt", b"c2"), ("tls.key", b"k2")]);
        let now = api(true, "pair", &[("tls.crt", b"c2"), ("tls.key", b"k2")]);
        assert!(check_cert_dir(dir.path(), &now).is_empty());
        let stale = api(true, "pair", &[("tls.crt", b"c3"), ("tls.key", b"k3")]);
        assert_eq!(
            check_cert_dir(dir.path(), &stale).len(),
            1,
            "content other than the API's"
        );
    }

    #[test]
    fn a_staged_link_a_visible_key_missing_from_the_generation_or_a_dangling_data_is_incomplete() {
        let dir = tempfile::tempdir().unwrap();
        let object = dir.path().join("configmaps/bundle");
        std::fs::create_dir_all(&object).unwrap();
        testkit::files::kubelet_swap(&object, 1, &[("ca-bundle.crt", b"x")]);
        let none = BTreeMap::new();
        assert!(check_cert_dir(dir.path(), &none).is_empty());
        std::os::unix::fs::symlink("..data/extra", object.join("extra")).unwrap();
        assert_eq!(check_cert_dir(dir.path(), &none).len(), 1);
        std::fs::remove_file(object.join("extra")).unwrap();
        std::os::unix::fs::symlink("..gone", object.join("..data_tmp")).unwrap();
        assert_eq!(check_cert_dir(dir.path(), &none).len(), 1);
        std::fs::remove_file(object.join("..data_tmp")).unwrap();
        let generation = std::fs::read_link(object.join("..data")).unwrap();
        std::fs::remove_dir_all(object.join(generation)).unwrap();
        assert_eq!(check_cert_dir(dir.path(), &none).len(), 1);
    }

    #[test]
    fn a_leaf_is_signed_by_its_ca_only() {
        let (ca, other) = (testkit::pki::Ca::new("a"), testkit::pki::Ca::new("b"));
        let leaf = ca.leaf(&["localhost"], 1);
        assert!(signed_by(&leaf.der, &certificates(&ca.cert_pem)[0]));
        assert!(!signed_by(&leaf.der, &certificates(&other.cert_pem)[0]));
        assert_eq!(
            certificates(&format!("{}{}", ca.cert_pem, other.cert_pem)).len(),
            2
        );
    }
}
