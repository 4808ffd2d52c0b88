//! A Secret or ConfigMap reduced to what cert-syncer uses of it: its resourceVersion and its keys
//! with their bytes (ConfigMap `data` and `binaryData` alike), and the payload `sync` writes with
//! its kind's file mode. Shared by `sync` and `inspect`, which read objects the same way.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use reload_lib::fs::FileContent;

use crate::base::kind::Kind;

/// An object as fetched, reduced to what we write.
#[derive(Clone)]
pub struct Fetched {
    pub resource_version: String,
    pub data: BTreeMap<String, Vec<u8>>,
}

impl std::fmt::Debug for Fetched {
    // Secret values never reach Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetched")
            .field("resource_version", &self.resource_version)
            .field("keys", &self.data.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Fetched {
    /// The payload for the atomic directory writer.
    pub fn payload(&self, kind: Kind) -> BTreeMap<String, FileContent> {
        self.data
            .iter()
            .map(|(key, bytes)| (key.clone(), FileContent::new(bytes.clone(), kind.mode())))
            .collect()
    }
}

/// Turns an API object into what we write.
pub trait ToFetched {
    fn to_fetched(&self) -> Fetched;
}

impl ToFetched for Secret {
    fn to_fetched(&self) -> Fetched {
        let data = self
            .data
            .iter()
            .flatten()
            .map(|(key, value)| (key.clone(), value.0.clone()))
            .collect();
        Fetched {
            resource_version: self.metadata.resource_version.clone().unwrap_or_default(),
            data,
        }
    }
}

/// [`ToFetched`] for objects that may not decode ([`crate::kube::decode::Raw`]).
pub trait TryFetched {
    fn try_fetched(&self) -> Result<Fetched, crate::kube::decode::DecodeError>;
}

impl<K: ToFetched + serde::de::DeserializeOwned> TryFetched for crate::kube::decode::Raw<K> {
    fn try_fetched(&self) -> Result<Fetched, crate::kube::decode::DecodeError> {
        self.decode().map(|object| object.to_fetched())
    }
}

impl TryFetched for Secret {
    fn try_fetched(&self) -> Result<Fetched, crate::kube::decode::DecodeError> {
        Ok(self.to_fetched())
    }
}

impl ToFetched for ConfigMap {
    fn to_fetched(&self) -> Fetched {
        let mut data: BTreeMap<String, Vec<u8>> = self
            .data
            .iter()
            .flatten()
            .map(|(key, value)| (key.clone(), value.clone().into_bytes()))
            .collect();
        for (key, value) in self.binary_data.iter().flatten() {
            data.insert(key.clone(), value.0.clone());
        }
        Fetched {
            resource_version: self.metadata.resource_version.clone().unwrap_or_default(),
            data,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    #[test]
    fn secret_files_are_private_and_configmap_files_are_readable() {
        let secret = Secret {
            data: Some(BTreeMap::from([(
                "tls.key".to_owned(),
                ByteString(b"k".to_vec()),
            )])),
            ..Secret::default()
        };
        let payload = secret.to_fetched().payload(Kind::Secret);
        assert_eq!(payload["tls.key"].mode(), 0o600);

        let config_map = ConfigMap {
            data: Some(BTreeMap::from([(
                "ca-bundle.crt".to_owned(),
                "pem".to_owned(),
            )])),
            binary_data: Some(BTreeMap::from([(
                "blob".to_owned(),
                ByteString(vec![0, 1]),
            )])),
            ..ConfigMap::default()
        };
        let fetched = config_map.to_fetched();
        assert_eq!(fetched.data["blob"], vec![0, 1]);
        assert_eq!(
            fetched.payload(Kind::ConfigMap)["ca-bundle.crt"].mode(),
            0o644
        );
    }

    #[test]
    fn debug_output_never_shows_values() {
        let fetched = Fetched {
            resource_version: "7".into(),
            data: BTreeMap::from([("tls.key".to_owned(), b"SECRET-BYTES".to_vec())]),
        };
        assert!(!format!("{fetched:?}").contains("SECRET-BYTES"));
    }
}
