//! A namespace's Secrets and ConfigMaps into groups, one per object, read through the same
//! connection code as `sync` (kubeconfig, or `--server`, `--ca-file`, `--token-file` and the SNI
//! override) and reduced to keys and bytes the way `sync` writes them.

use anyhow::Context;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::ListParams;

use super::source::{Entry, Group, Origin};
use crate::base::kind::Kind;
use crate::kube::connection::{Connection, Target};
use crate::kube::decode::Raw;
use crate::kube::fetched::ToFetched;

/// Every Secret, then every ConfigMap of `namespace`, each in name order.
///
/// # Errors
/// When a list fails (TLS refused, 401/403, unreachable: exit code 1).
pub(super) async fn namespace(
    connection: &Connection,
    namespace: &str,
) -> anyhow::Result<Vec<Group>> {
    // Raw: one object that does not decode is reported alone, and no response body is logged.
    let secrets: Api<Raw<Secret>> = Api::namespaced(connection.client.clone(), namespace);
    let config_maps: Api<Raw<ConfigMap>> = Api::namespaced(connection.client.clone(), namespace);
    let mut groups = list(&secrets, Kind::Secret, namespace, &connection.target).await?;
    groups.extend(list(&config_maps, Kind::ConfigMap, namespace, &connection.target).await?);
    Ok(groups)
}

async fn list<K>(
    api: &Api<Raw<K>>,
    kind: Kind,
    namespace: &str,
    target: &Target,
) -> anyhow::Result<Vec<Group>>
where
    K: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned + ToFetched,
{
    let objects = match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(err) => {
            let reason = target.explain(&err);
            return Err(anyhow::Error::new(err)).with_context(|| match reason {
                Some(reason) => reason,
                None => format!(
                    "cannot list {}s in namespace {namespace} at {}",
                    kind.api_kind(),
                    target.server
                ),
            });
        }
    };
    let mut groups: Vec<Group> = objects
        .iter()
        .map(|object| {
            let entries = match object.decode() {
                Ok(decoded) => decoded
                    .to_fetched()
                    .data
                    .into_iter()
                    .map(|(name, bytes)| Entry {
                        name,
                        bytes: Ok(bytes),
                    })
                    .collect(),
                Err(err) => vec![Entry {
                    name: super::source::WHOLE_OBJECT.to_owned(),
                    bytes: Err(format!("cannot decode the object: {err}")),
                }],
            };
            Group {
                origin: Origin::Object {
                    kind,
                    namespace: namespace.to_owned(),
                    name: kube::Resource::meta(object)
                        .name
                        .clone()
                        .unwrap_or_default(),
                },
                entries,
            }
        })
        .collect();
    groups.sort_by_key(|group| match &group.origin {
        Origin::Object { name, .. } => name.clone(),
        Origin::Dir(dir) => dir.display().to_string(),
    });
    Ok(groups)
}
