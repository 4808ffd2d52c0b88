//! The cluster's own values a profile names — `networks.config.openshift.io/cluster`
//! (`status.serviceNetwork`: host 1 of every CIDR, the `kubernetes` Service's IP of each
//! family) and `infrastructures.config.openshift.io/cluster` (`status.apiServerURL`,
//! `status.apiServerInternalURI`: their hosts) — read once at start, read only.
//!
//! On a woken node the controller starts with kube-apiserver, before that answers, and before
//! its authorizer and CRDs are ready: the read then waits ([`Unavailable::Wait`], as `wait`
//! waits: closely for what heals by itself, saying once what does not) rather than exiting into
//! the kubelet's crash-loop backoff.

use std::net::IpAddr;

use kube::Api;
use kube::api::{ApiResource, DynamicObject};

use super::wait::{Blocked, Waiting};
use crate::base::error::ConfigError;
use crate::base::names::canonical_hostname;
use crate::kube::connection::Connection;

/// The values the cluster's config objects give (`None`: object or field absent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterValues {
    /// Host 1 of each `status.serviceNetwork` CIDR, in its order.
    pub service_network_ips: Option<Vec<IpAddr>>,
    pub api_hostname: Option<String>,
    pub api_int_hostname: Option<String>,
    /// The objects that could not be read, with why: not allowed (403) or not found (no CRD, no
    /// object). Read as absent, so the flags decide; while kube-apiserver starts both are
    /// transient (its authorizer and its CRDs come up after it answers).
    pub unread: Vec<String>,
}

/// Why one read of the cluster's values failed.
#[derive(Debug)]
enum ReadError {
    /// The apiserver did not answer (classified by the connection: not up yet, or a TLS or
    /// name failure), or answered that it cannot serve now (5xx, 429).
    Unavailable(Blocked),
    /// An answer that is wrong for good (a malformed object, another refusal): retrying would
    /// read the same.
    Config(ConfigError),
}

impl From<ConfigError> for ReadError {
    fn from(err: ConfigError) -> Self {
        Self::Config(err)
    }
}

/// How [`read`] meets an apiserver that cannot answer yet (or not allow yet).
pub(super) enum Unavailable<'a> {
    /// `--once`: the pass cannot run without it, so the command fails with the reason.
    Fail,
    /// The controller: on a woken node it starts with kube-apiserver, before that answers, and
    /// exiting would only earn it the kubelet's crash-loop backoff. It retries as `wait` says
    /// until the values are read or shutdown, `/readyz` saying what it waits for.
    Wait(Waiting<'a>),
}

/// What `build` makes of the cluster's values (the profile with its hostnames), meeting an
/// apiserver that cannot answer as [`Unavailable`] says; `None` on shutdown while waiting.
///
/// With [`Unavailable::Wait`], a `build` that fails for a value the cluster did not give
/// while some object was unread (403, 404) waits too: right after kube-apiserver answers, its
/// authorizer refuses what RBAC will allow a moment later, and its CRDs are not served yet.
/// Exiting then would only earn the kubelet's crash-loop backoff; a grant that never comes
/// keeps the controller not ready, saying so.
///
/// # Errors
/// A [`ConfigError`] (exit 2) for an object whose values are wrong, a refusal other than 403,
/// or what `build` refuses with every object read (or with [`Unavailable::Fail`]); with
/// [`Unavailable::Fail`], an apiserver that cannot answer (exit 1: not the configuration's
/// fault).
pub(super) async fn read<T>(
    connection: &Connection,
    mut unavailable: Unavailable<'_>,
    build: impl Fn(&ClusterValues) -> Result<T, ConfigError>,
) -> anyhow::Result<Option<T>> {
    loop {
        let blocked = match read_once(connection).await {
            Ok(values) => match build(&values) {
                Ok(built) => {
                    if !values.unread.is_empty() {
                        tracing::warn!(unread = %values.unread.join("; "), "cluster objects not read; the flags give their values");
                    }
                    if let Unavailable::Wait(waiting) = &mut unavailable {
                        waiting.done("the cluster's values are read");
                    }
                    return Ok(Some(built));
                }
                Err(err) if values.unread.is_empty() => return Err(err.into()),
                Err(err) => match unavailable {
                    Unavailable::Fail => return Err(err.into()),
                    Unavailable::Wait(_) => {
                        Blocked::NotReady(format!("{err} ({})", values.unread.join("; ")))
                    }
                },
            },
            Err(ReadError::Config(err)) => return Err(err.into()),
            Err(ReadError::Unavailable(blocked)) => blocked,
        };
        let Unavailable::Wait(waiting) = &mut unavailable else {
            anyhow::bail!("{blocked}");
        };
        if !waiting
            .retry(
                &blocked,
                "the cluster's values cannot be read yet; the first pass waits for them",
            )
            .await
        {
            return Ok(None);
        }
    }
}

/// One read of the cluster's values (a missing CRD or object, or a 403, is not an error: it is
/// listed in [`ClusterValues::unread`]).
async fn read_once(connection: &Connection) -> Result<ClusterValues, ReadError> {
    let client = &connection.client;
    // `Ok(Err(why))`: not read, and why (for `unread`).
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
            let unread = |why: &str| Ok(Err(format!("{what}: {why}")));
            match api.get_opt("cluster").await {
                Ok(Some(object)) => Ok(Ok(object)),
                Ok(None) => unread("not found"),
                // No such resource (the CRD is not installed, or not served yet: a plain-text
                // 404 kube-client does not turn into `None`).
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    unread("no such resource (no CRD)")
                }
                // Not allowed to read it: as if absent (the flags decide).
                Err(kube::Error::Api(status)) if status.code == 403 => unread("not allowed (403)"),
                Err(kube::Error::Api(status)) if status.code >= 500 || status.code == 429 => {
                    Err(ReadError::Unavailable(Blocked::NotReady(format!(
                        "cannot read {what}: {status}"
                    ))))
                }
                Err(kube::Error::Api(status)) => Err(ReadError::Config(ConfigError(format!(
                    "cannot read {what}: {status}"
                )))),
                // No answer at all: not up yet (refused, reset, timed out), or a certificate
                // our CA does not trust, a name that does not resolve (the connection's one
                // classification).
                Err(err) => Err(ReadError::Unavailable(Blocked::of(connection, &what, &err))),
            }
        }
    };
    let mut values = ClusterValues::default();
    match get("Network", "networks").await? {
        Ok(network) => values.service_network_ips = service_network_ips(&network.data["status"])?,
        Err(why) => values.unread.push(why),
    }
    let infra = match get("Infrastructure", "infrastructures").await? {
        Ok(infra) => Some(infra),
        Err(why) => {
            values.unread.push(why);
            None
        }
    };
    if let Some(infra) = infra {
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

/// Host 1 of every CIDR of a Network's `status.serviceNetwork` (`None`: the field is absent).
/// An empty list is refused, as OpenShift's operator refuses it ("empty networkConfig
/// ServiceNetwork, can't generate cert"): a serving certificate without the service IP would
/// break every in-cluster client.
pub(super) fn service_network_ips(
    status: &serde_json::Value,
) -> Result<Option<Vec<IpAddr>>, ConfigError> {
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
pub(super) fn url_host(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| canonical_hostname(host))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
