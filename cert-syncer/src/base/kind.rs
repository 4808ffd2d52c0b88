//! The two kinds of objects cert-syncer reads and writes: Secrets and ConfigMaps, with every
//! name they go by (log label, resource plural, directory) and the mode of their files.

use serde::Serialize;

/// A core/v1 Secret or ConfigMap. Serialized (in `inspect --json`) as its API kind,
/// `Secret` or `ConfigMap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Kind {
    /// core/v1 Secret: files 0600.
    Secret,
    /// core/v1 ConfigMap: files 0644.
    ConfigMap,
}

impl Kind {
    /// Both kinds, Secrets first.
    pub const ALL: [Kind; 2] = [Kind::Secret, Kind::ConfigMap];

    /// Lowercase singular, for logs, metrics, Events and `--file` (`secret`, `configmap`).
    pub fn label(self) -> &'static str {
        match self {
            Kind::Secret => "secret",
            Kind::ConfigMap => "configmap",
        }
    }

    /// The API kind (`Secret`, `ConfigMap`).
    pub fn api_kind(self) -> &'static str {
        match self {
            Kind::Secret => "Secret",
            Kind::ConfigMap => "ConfigMap",
        }
    }

    /// The resource plural in API paths and RBAC rules (`secrets`, `configmaps`).
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Secret => "secrets",
            Kind::ConfigMap => "configmaps",
        }
    }

    /// The directory of this kind under a resource directory: the plural, as library-go's
    /// certsyncpod lays it out (`<dir>/secrets/<name>/<key>`).
    pub fn dir(self) -> &'static str {
        self.plural()
    }

    /// Mode of the files written for this kind: Secrets hold keys.
    pub fn mode(self) -> u32 {
        match self {
            Kind::Secret => 0o600,
            Kind::ConfigMap => 0o644,
        }
    }

    /// Parses `secret` or `configmap` (or the plural).
    pub fn parse(text: &str) -> Option<Kind> {
        match text {
            "secret" | "secrets" => Some(Kind::Secret),
            "configmap" | "configmaps" => Some(Kind::ConfigMap),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_of_a_kind_round_trips() {
        for kind in Kind::ALL {
            assert_eq!(Kind::parse(kind.label()), Some(kind));
            assert_eq!(Kind::parse(kind.plural()), Some(kind));
            assert_eq!(kind.dir(), kind.plural());
            assert_eq!(
                serde_json::to_string(&kind).unwrap(),
                format!("\"{}\"", kind.api_kind())
            );
        }
        assert_eq!(Kind::Secret.mode(), 0o600);
        assert_eq!(Kind::ConfigMap.mode(), 0o644);
        assert_eq!(Kind::parse("pod"), None);
    }
}
