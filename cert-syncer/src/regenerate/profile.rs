//! Built-in profiles: the sets OpenShift's own controllers manage, as config files compiled
//! into the binary (`profiles/*.yaml`, validated by the same parser as a user's file).
//!
//! The cluster-specific hostnames come from the cluster's own configuration when it has it —
//! `networks.config.openshift.io/cluster` (`status.serviceNetwork`: host 1 of every CIDR, the
//! `kubernetes` Service's IP of each family, as OpenShift's operator puts them in
//! `service-network-serving-certkey`) and `infrastructures.config.openshift.io/cluster`
//! (`status.apiServerURL`, `status.apiServerInternalURI`: their hosts), read only — else from
//! flags. A flag that disagrees with the cluster's object is refused: a serving certificate for
//! the wrong name is an outage, and the two sources disagreeing means one of them is stale.

use std::net::IpAddr;

use kube::Api;
use kube::api::{ApiResource, DynamicObject};

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

/// The values the cluster's config objects give (`None`: object or field absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterValues {
    /// Host 1 of each `status.serviceNetwork` CIDR, in its order.
    pub service_network_ips: Option<Vec<IpAddr>>,
    pub api_hostname: Option<String>,
    pub api_int_hostname: Option<String>,
}

/// Why the cluster's values could not be read.
#[derive(Debug)]
pub enum ReadClusterError {
    /// The apiserver did not answer, or answered that it cannot serve now (5xx, 429): on a woken
    /// node this sidecar starts with kube-apiserver, before it answers. Worth retrying.
    Unavailable(String),
    /// An answer that is wrong for good (a malformed object, another refusal): retrying would
    /// read the same.
    Config(ConfigError),
}

impl From<ConfigError> for ReadClusterError {
    fn from(err: ConfigError) -> Self {
        Self::Config(err)
    }
}

/// Reads the cluster's values (read only; a missing CRD or object is not an error).
///
/// # Errors
/// [`ReadClusterError::Unavailable`] while the apiserver cannot answer,
/// [`ReadClusterError::Config`] for an object whose values are wrong or another refusal.
pub async fn read_cluster(client: &kube::Client) -> Result<ClusterValues, ReadClusterError> {
    let get = |kind: &str, plural: &str| {
        let resource = ApiResource {
            group: "config.openshift.io".into(),
            version: "v1".into(),
            api_version: "config.openshift.io/v1".into(),
            kind: kind.into(),
            plural: plural.into(),
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let what = format!("{plural}.config.openshift.io/cluster");
        async move {
            match api.get_opt("cluster").await {
                Ok(object) => Ok(object),
                // No such resource (the CRD is not installed: a plain-text 404 kube-client does
                // not turn into `None`).
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
                // Not allowed to read it: as if absent (the flags decide), said out loud.
                Err(kube::Error::Api(status)) if status.code == 403 => {
                    tracing::warn!(object = %what, "not allowed to read it; using the flags alone");
                    Ok(None)
                }
                Err(kube::Error::Api(status)) if status.code >= 500 || status.code == 429 => Err(
                    ReadClusterError::Unavailable(format!("cannot read {what}: {status}")),
                ),
                Err(kube::Error::Api(status)) => Err(ReadClusterError::Config(ConfigError(
                    format!("cannot read {what}: {status}"),
                ))),
                // No answer at all (refused, reset, timed out, a TLS handshake that failed).
                Err(err) => Err(ReadClusterError::Unavailable(format!(
                    "cannot read {what}: {err}"
                ))),
            }
        }
    };
    let mut values = ClusterValues::default();
    if let Some(network) = get("Network", "networks").await? {
        values.service_network_ips = service_network_ips(&network.data["status"])?;
    }
    if let Some(infra) = get("Infrastructure", "infrastructures").await? {
        let host = |field: &str| -> Result<Option<String>, ConfigError> {
            infra.data["status"][field]
                .as_str()
                .map(|url| {
                    url_host(url).ok_or_else(|| {
                        ConfigError(format!(
                            "infrastructures.config.openshift.io/cluster: status.{field} {url:?} has no host"
                        ))
                    })
                })
                .transpose()
        };
        values.api_hostname = host("apiServerURL")?;
        values.api_int_hostname = host("apiServerInternalURI")?;
    }
    Ok(values)
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

/// Host 1 of every CIDR of a Network's `status.serviceNetwork` (`None`: the field is absent).
/// An empty list is refused, as OpenShift's operator refuses it ("empty networkConfig
/// ServiceNetwork, can't generate cert"): a serving certificate without the service IP would
/// break every in-cluster client.
fn service_network_ips(status: &serde_json::Value) -> Result<Option<Vec<IpAddr>>, ConfigError> {
    let what = "networks.config.openshift.io/cluster: status.serviceNetwork";
    let Some(list) = status.get("serviceNetwork").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let list = list
        .as_array()
        .ok_or_else(|| ConfigError(format!("{what} is not a list")))?;
    if list.is_empty() {
        return Err(ConfigError(format!(
            "{what} is empty: no service IP to issue service-network-serving-certkey for \
             (OpenShift's operator refuses this too); fix the object"
        )));
    }
    let mut ips = Vec::new();
    for (i, cidr) in list.iter().enumerate() {
        let cidr = cidr
            .as_str()
            .ok_or_else(|| ConfigError(format!("{what}[{i}] is not a string")))?;
        let ip =
            first_ip(cidr).map_err(|err| ConfigError(format!("{what}[{i}] {cidr:?}: {err}")))?;
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    Ok(Some(ips))
}

/// The first address of a CIDR (the network address plus one), as OpenShift gives the
/// `kubernetes` Service.
fn first_ip(cidr: &str) -> Result<IpAddr, String> {
    let (address, prefix) = cidr.split_once('/').ok_or("not a CIDR")?;
    let address: IpAddr = address.parse().map_err(|_| "not an IP address")?;
    let prefix: u32 = prefix.parse().map_err(|_| "not a prefix length")?;
    match address {
        IpAddr::V4(v4) if prefix < 32 => {
            let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
            Ok(IpAddr::V4((((u32::from(v4)) & mask) + 1).into()))
        }
        IpAddr::V6(v6) if prefix < 128 => {
            let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
            Ok(IpAddr::V6(((u128::from(v6) & mask) + 1).into()))
        }
        _ => Err("the prefix leaves no address".to_owned()),
    }
}

/// The host of a URL (`https://api.example.com:6443` → `api.example.com`).
fn url_host(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| canonical_hostname(host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::regenerate::config::Identity;

    fn newest() -> &'static Release {
        crate::regenerate::release::find(crate::regenerate::release::DEFAULT).unwrap()
    }

    fn cluster() -> ClusterValues {
        ClusterValues {
            service_network_ips: Some(vec!["172.30.0.1".parse().unwrap()]),
            api_hostname: Some("api.cluster.example.com".into()),
            api_int_hostname: Some("api-int.cluster.example.com".into()),
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
    fn cidrs_and_urls_give_the_first_ip_and_the_host() {
        assert_eq!(first_ip("172.30.0.0/16").unwrap().to_string(), "172.30.0.1");
        assert_eq!(first_ip("172.30.5.7/16").unwrap().to_string(), "172.30.0.1");
        assert_eq!(first_ip("fd02::/112").unwrap().to_string(), "fd02::1");
        assert!(first_ip("172.30.0.0").is_err());
        assert!(first_ip("10.0.0.1/32").is_err());
        assert_eq!(
            url_host("https://api.cluster.example.com:6443").as_deref(),
            Some("api.cluster.example.com")
        );
        assert_eq!(url_host("not a url"), None);
        assert_eq!(
            url_host("https://[2001:0DB8::0001]:6443").as_deref(),
            Some("2001:db8::1")
        );
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
