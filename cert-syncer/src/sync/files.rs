//! `--file KIND/NAME/KEY=PATH`: one key of one object written to a host file (the
//! machine-config-daemon pattern for `/etc/kubernetes/kubelet-ca.crt`).

use std::path::PathBuf;

use crate::base::error::ConfigError;
use crate::base::kind::Kind;

/// One `--file` mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMapping {
    pub kind: Kind,
    pub name: String,
    pub key: String,
    pub path: PathBuf,
}

impl FileMapping {
    /// Parses `KIND/NAME/KEY=PATH`.
    pub fn parse(text: &str) -> Result<FileMapping, ConfigError> {
        let bad = |why: &str| {
            ConfigError(format!(
                "--file {text}: {why} (expected KIND/NAME/KEY=PATH)"
            ))
        };
        let (source, path) = text.split_once('=').ok_or_else(|| bad("missing ="))?;
        let mut parts = source.splitn(3, '/');
        let (Some(kind), Some(name), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("missing KIND, NAME or KEY"));
        };
        let kind = Kind::parse(kind).ok_or_else(|| bad("KIND must be secret or configmap"))?;
        if name.is_empty() || key.is_empty() || path.is_empty() {
            return Err(bad("empty NAME, KEY or PATH"));
        }
        let path = PathBuf::from(path);
        if !path.is_absolute() {
            return Err(bad("PATH must be absolute"));
        }
        Ok(FileMapping {
            kind,
            name: name.to_owned(),
            key: key.to_owned(),
            path,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_mapping_parses_kind_name_key_and_path() {
        let mapping =
            FileMapping::parse("configmap/kubelet-ca/ca-bundle.crt=/etc/kubernetes/kubelet-ca.crt")
                .unwrap();
        assert_eq!(mapping.kind, Kind::ConfigMap);
        assert_eq!(mapping.name, "kubelet-ca");
        assert_eq!(mapping.key, "ca-bundle.crt");
        assert_eq!(
            mapping.path,
            PathBuf::from("/etc/kubernetes/kubelet-ca.crt")
        );
    }

    #[test]
    fn bad_file_mappings_say_what_is_wrong() {
        assert!(
            FileMapping::parse("pod/x/y=/a")
                .unwrap_err()
                .0
                .contains("KIND")
        );
        assert!(
            FileMapping::parse("secret/x=/a")
                .unwrap_err()
                .0
                .contains("missing")
        );
        assert!(
            FileMapping::parse("secret/x/y=relative")
                .unwrap_err()
                .0
                .contains("absolute")
        );
    }
}
