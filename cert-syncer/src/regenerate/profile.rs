//! Built-in profiles: the sets OpenShift's own controllers manage, as config files compiled
//! into the binary (`profiles/*.yaml`, validated by the same parser as a user's file).
//!
//! The cluster-specific hostnames come from the cluster's own configuration when it has it
//! (`cluster.rs` reads it), else from flags. A flag that disagrees with the cluster's object is
//! refused: a serving certificate for the wrong name is an outage, and the two sources
//! disagreeing means one of them is stale.

use std::net::IpAddr;

use super::cluster::ClusterValues;
use super::config::{self, Rotation};
use super::release::Release;
use crate::base::error::ConfigError;
use crate::base::names::canonical_hostname;

/// The built-in profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// OpenShift's kube-apiserver PKI: 8 signers, 10 CA bundles, 12 targets (what the
    /// operator's cert-regeneration-controller manages, plus the aggregator CA copy the
    /// kube-apiserver's cert-syncer mirrors).
    OpenshiftKubeApiserver,
    /// OpenShift's kube-controller-manager PKI: the CSR signer chain (`csr-signer-signer`, the
    /// intermediate `csr-signer` and its delayed publication), its bundles, and the two copies
    /// the kube-controller-manager's recovery controller makes.
    OpenshiftKubeControllerManager,
    /// OpenShift's kube-scheduler: the copy of its client certificate its recovery controller
    /// makes.
    OpenshiftKubeScheduler,
}

impl Profile {
    fn text(self) -> &'static str {
        match self {
            Profile::OpenshiftKubeApiserver => {
                include_str!("profiles/openshift-kube-apiserver.yaml")
            }
            Profile::OpenshiftKubeControllerManager => {
                include_str!("profiles/openshift-kube-controller-manager.yaml")
            }
            Profile::OpenshiftKubeScheduler => {
                include_str!("profiles/openshift-kube-scheduler.yaml")
            }
        }
    }

    fn name(self) -> &'static str {
        match self {
            Profile::OpenshiftKubeApiserver => "openshift-kube-apiserver",
            Profile::OpenshiftKubeControllerManager => "openshift-kube-controller-manager",
            Profile::OpenshiftKubeScheduler => "openshift-kube-scheduler",
        }
    }

    /// Whether the profile names cluster-specific hostnames (read from the cluster's config
    /// objects, else flags).
    pub fn needs_cluster_values(self) -> bool {
        PLACEHOLDERS.iter().any(|p| self.text().contains(p))
    }
}

/// The cluster-specific values a profile may name.
const PLACEHOLDERS: [&str; 3] = [
    "${SERVICE_NETWORK_IP}",
    "${API_HOSTNAME}",
    "${API_INT_HOSTNAME}",
];

/// Values given on the command line (each optional when the cluster has the object).
#[derive(Debug, Clone, Default)]
pub struct Flags {
    /// `--service-network-ip`, once per family (empty: not given).
    pub service_network_ips: Vec<IpAddr>,
    pub api_hostname: Option<String>,
    pub api_int_hostname: Option<String>,
}

/// The profile's rotation with the cluster's (or the flags') hostnames filled in.
pub fn build(
    profile: Profile,
    release: &Release,
    cluster: &ClusterValues,
    flags: &Flags,
) -> Result<Rotation, ConfigError> {
    let text = profile.text();
    // Only the values the profile names are needed (and checked against the cluster's).
    let pick = |what: &str,
                object: &str,
                flag: &str,
                cluster: Option<String>,
                given: Option<String>,
                placeholder: &str| {
        if text.contains(placeholder) {
            pick(what, object, flag, cluster, given)
        } else {
            Ok(String::new())
        }
    };
    let join = |ips: &[IpAddr]| {
        ips.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let ips = pick(
        "the service network's first IPs",
        "networks.config.openshift.io/cluster status.serviceNetwork",
        "--service-network-ip",
        cluster.service_network_ips.as_deref().map(join),
        (!flags.service_network_ips.is_empty()).then(|| join(&flags.service_network_ips)),
        "${SERVICE_NETWORK_IP}",
    )?;
    // One hostname per address (dual-stack: both families).
    let ips = ips
        .split(", ")
        .map(|ip| format!("\"{ip}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let api = pick(
        "the external load balancer's hostname",
        "infrastructures.config.openshift.io/cluster status.apiServerURL",
        "--api-hostname",
        cluster.api_hostname.clone(),
        flags.api_hostname.clone(),
        "${API_HOSTNAME}",
    )?;
    let api_int = pick(
        "the internal load balancer's hostname",
        "infrastructures.config.openshift.io/cluster status.apiServerInternalURI",
        "--api-int-hostname",
        cluster.api_int_hostname.clone(),
        flags.api_int_hostname.clone(),
        "${API_INT_HOSTNAME}",
    )?;
    let text = text
        .replace("\"${SERVICE_NETWORK_IP}\"", &ips)
        .replace("${API_HOSTNAME}", &api)
        .replace("${API_INT_HOSTNAME}", &api_int);
    let mut rotation = config::parse(&text)
        .map_err(|err| ConfigError(format!("profile {}: {}", profile.name(), err.0)))?;
    if let Some(broken) = rotation.broken.first() {
        return Err(ConfigError(format!(
            "profile {}: {}: {}",
            profile.name(),
            broken.item,
            broken.reason
        )));
    }
    super::release::apply(&mut rotation, release)?;
    Ok(rotation)
}

fn pick(
    what: &str,
    object: &str,
    flag: &str,
    from_cluster: Option<String>,
    from_flag: Option<String>,
) -> Result<String, ConfigError> {
    // Compared and used in the form certificates carry (`2001:0db8::1` is `2001:db8::1`).
    let from_cluster = from_cluster.as_deref().map(canonical_hostname);
    let from_flag = from_flag.as_deref().map(canonical_hostname);
    match (from_cluster, from_flag) {
        (Some(cluster), Some(flag_value)) if cluster != flag_value => Err(ConfigError(format!(
            "{what}: {flag} {flag_value} disagrees with {object} ({cluster}); refusing to \
                 issue certificates for either (drop the flag, or fix the object)"
        ))),
        (Some(value), _) | (None, Some(value)) => Ok(value),
        (None, None) => Err(ConfigError(format!(
            "{what}: the cluster has no {object} and {flag} is not set"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regenerate::cluster::{service_network_ips, url_host};
    use crate::regenerate::config::Identity;

    fn newest() -> &'static Release {
        crate::regenerate::release::find(crate::regenerate::release::DEFAULT).unwrap()
    }

    fn cluster() -> ClusterValues {
        ClusterValues {
            service_network_ips: Some(vec!["172.30.0.1".parse().unwrap()]),
            api_hostname: Some("api.cluster.example.com".into()),
            api_int_hostname: Some("api-int.cluster.example.com".into()),
            unread: Vec::new(),
        }
    }

    #[test]
    fn the_kube_apiserver_profile_is_the_observed_set() {
        let rotation = build(
            Profile::OpenshiftKubeApiserver,
            newest(),
            &cluster(),
            &Flags::default(),
        )
        .unwrap();
        assert_eq!(rotation.signers.len(), 8);
        assert_eq!(rotation.bundles.len(), 9);
        assert_eq!(rotation.unions.len(), 1);
        assert_eq!(rotation.targets.len(), 12);
        let target = |name: &str| {
            rotation
                .targets
                .iter()
                .find(|t| t.object.name == name)
                .unwrap()
        };
        assert_eq!(
            target("localhost-serving-cert-certkey").identity,
            Identity::Serving {
                hostnames: vec!["127.0.0.1".into(), "localhost".into()]
            }
        );
        let Identity::Serving { hostnames } = &target("service-network-serving-certkey").identity
        else {
            panic!()
        };
        assert_eq!(hostnames.len(), 9);
        assert!(hostnames.contains(&"172.30.0.1".to_owned()));
        assert_eq!(
            target("kube-scheduler-client-cert-key").object.namespace,
            "openshift-config-managed"
        );
        // Every signer and target carries OpenShift's metadata.
        for (kind, object) in rotation.written() {
            let annotations = &rotation.annotations[&(kind, object.clone())];
            assert_eq!(
                annotations
                    .get("openshift.io/owning-component")
                    .map(String::as_str),
                Some("kube-apiserver"),
                "{object}"
            );
        }
        assert_eq!(rotation.key_type, crate::pki::KeyType::Rsa2048);
        // client-ca is the exact union of OpenShift's seven sources, three of them read only.
        let client_ca = &rotation.unions[0];
        assert_eq!(
            client_ca.object.to_string(),
            "openshift-kube-apiserver/client-ca"
        );
        let sources: Vec<String> = client_ca.sources.iter().map(ToString::to_string).collect();
        assert_eq!(
            sources,
            [
                "openshift-config/admin-kubeconfig-client-ca",
                "openshift-config-managed/csr-controller-ca",
                "openshift-kube-apiserver-operator/kube-apiserver-to-kubelet-client-ca",
                "openshift-kube-apiserver-operator/kube-control-plane-signer-ca",
                "openshift-kube-apiserver/user-client-ca",
                "openshift-config-managed/kubelet-bootstrap-kubeconfig",
                "openshift-kube-apiserver-operator/node-system-admin-ca",
            ]
        );
        let read_only: Vec<String> = rotation
            .read_only()
            .map(|(_, object)| object.to_string())
            .collect();
        assert_eq!(
            read_only,
            [
                "openshift-config/admin-kubeconfig-client-ca",
                "openshift-config-managed/csr-controller-ca",
                "openshift-kube-apiserver/user-client-ca",
                "openshift-config-managed/kubelet-bootstrap-kubeconfig",
            ]
        );
    }

    #[test]
    fn the_kube_controller_manager_profile_is_the_csr_signer_chain_and_needs_no_hostnames() {
        let profile = Profile::OpenshiftKubeControllerManager;
        assert!(!profile.needs_cluster_values());
        assert!(Profile::OpenshiftKubeApiserver.needs_cluster_values());
        // No hostnames from anywhere: still builds.
        let rotation = build(
            profile,
            newest(),
            &ClusterValues::default(),
            &Flags::default(),
        )
        .unwrap();
        assert_eq!(rotation.signers.len(), 1);
        assert_eq!(rotation.bundles.len(), 1);
        assert_eq!(rotation.targets.len(), 0);
        let csr = &rotation.intermediates[0];
        assert_eq!(
            csr.object.to_string(),
            "openshift-kube-controller-manager-operator/csr-signer"
        );
        assert_eq!(csr.common_name, "kube-csr-signer");
        assert_eq!(csr.validity, std::time::Duration::from_secs(30 * 86_400));
        assert_eq!(
            csr.bundle.as_ref().unwrap().to_string(),
            "openshift-kube-controller-manager-operator/csr-signer-ca"
        );
        let publish = csr.publish.as_ref().unwrap();
        assert_eq!(
            publish.object.to_string(),
            "openshift-kube-controller-manager/csr-signer"
        );
        assert_eq!(publish.delay, std::time::Duration::from_secs(300));
        let union = &rotation.unions[0];
        assert_eq!(union.object.name, "csr-controller-ca");
        assert_eq!(union.sources.len(), 2);
        let written: Vec<String> = rotation
            .written()
            .map(|(kind, object)| format!("{} {object}", kind.plural()))
            .collect();
        assert_eq!(
            written,
            [
                "secrets openshift-kube-controller-manager-operator/csr-signer-signer",
                "configmaps openshift-kube-controller-manager-operator/csr-controller-signer-ca",
                "secrets openshift-kube-controller-manager-operator/csr-signer",
                "configmaps openshift-kube-controller-manager-operator/csr-signer-ca",
                "secrets openshift-kube-controller-manager/csr-signer",
                "configmaps openshift-kube-controller-manager-operator/csr-controller-ca",
                "configmaps openshift-config-managed/csr-controller-ca",
                "secrets openshift-kube-controller-manager/kube-controller-manager-client-cert-key",
            ]
        );
        // Read, never written: the kube-apiserver's client certificate it copies.
        let read_only: Vec<String> = rotation
            .read_only()
            .map(|(_, object)| object.to_string())
            .collect();
        assert_eq!(
            read_only,
            ["openshift-config-managed/kube-controller-manager-client-cert-key"]
        );
        for (kind, object) in rotation.written() {
            if let Some(annotations) = rotation.annotations.get(&(kind, object.clone())) {
                assert_eq!(
                    annotations["openshift.io/owning-component"], "kube-controller-manager",
                    "{object}"
                );
            }
        }
    }

    #[test]
    fn flags_fill_in_and_a_disagreement_is_refused() {
        let flags = Flags {
            service_network_ips: vec!["10.0.0.1".parse().unwrap()],
            api_hostname: Some("api.example".into()),
            api_int_hostname: Some("api-int.example".into()),
        };
        assert!(
            build(
                Profile::OpenshiftKubeApiserver,
                newest(),
                &ClusterValues::default(),
                &flags
            )
            .is_ok()
        );
        let err = build(
            Profile::OpenshiftKubeApiserver,
            newest(),
            &cluster(),
            &flags,
        )
        .unwrap_err();
        assert!(
            err.0.contains("disagrees") && err.0.contains("--service-network-ip"),
            "{err}"
        );
        let err = build(
            Profile::OpenshiftKubeApiserver,
            newest(),
            &ClusterValues::default(),
            &Flags::default(),
        )
        .unwrap_err();
        assert!(err.0.contains("is not set"), "{err}");
    }

    #[test]
    fn every_service_network_gives_its_first_ip_and_an_empty_list_is_refused() {
        let status = serde_json::json!({ "serviceNetwork": ["172.30.0.0/16", "fd02::/112"] });
        let ips = service_network_ips(&status).unwrap().unwrap();
        assert_eq!(
            ips,
            [
                "172.30.0.1".parse::<IpAddr>().unwrap(),
                "fd02::1".parse().unwrap()
            ]
        );
        let cluster = ClusterValues {
            service_network_ips: Some(ips),
            ..cluster()
        };
        let rotation = build(
            Profile::OpenshiftKubeApiserver,
            newest(),
            &cluster,
            &Flags::default(),
        )
        .unwrap();
        let target = rotation
            .targets
            .iter()
            .find(|t| t.object.name == "service-network-serving-certkey")
            .unwrap();
        let Identity::Serving { hostnames } = &target.identity else {
            panic!()
        };
        assert!(
            hostnames.contains(&"172.30.0.1".to_owned()),
            "{hostnames:?}"
        );
        assert!(hostnames.contains(&"fd02::1".to_owned()), "{hostnames:?}");
        assert_eq!(hostnames.len(), 10);
        let err = service_network_ips(&serde_json::json!({ "serviceNetwork": [] })).unwrap_err();
        assert!(err.0.contains("status.serviceNetwork is empty"), "{err}");
        assert_eq!(service_network_ips(&serde_json::json!({})).unwrap(), None);
        assert!(service_network_ips(&serde_json::json!({ "serviceNetwork": ["x"] })).is_err());
    }

    #[test]
    fn ip_literals_from_the_cluster_and_the_flags_are_canonical_before_they_are_compared() {
        let cluster = ClusterValues {
            api_hostname: url_host("https://[2001:0db8::1]:6443"),
            ..cluster()
        };
        let flags = Flags {
            api_hostname: Some("2001:DB8:0:0:0:0:0:1".into()),
            ..Flags::default()
        };
        let rotation = build(Profile::OpenshiftKubeApiserver, newest(), &cluster, &flags).unwrap();
        let names: Vec<String> = rotation
            .targets
            .iter()
            .filter_map(|t| match &t.identity {
                Identity::Serving { hostnames } => Some(hostnames.clone()),
                Identity::Client { .. } => None,
            })
            .flatten()
            .collect();
        assert!(names.contains(&"2001:db8::1".to_owned()), "{names:?}");
        assert!(!names.iter().any(|n| n.contains("0db8")), "{names:?}");
    }
}
