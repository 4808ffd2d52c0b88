//! The resources served and their identities.

/// A served resource type.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Resource {
    /// core/v1 secrets.
    Secrets,
    /// core/v1 configmaps.
    ConfigMaps,
    /// core/v1 events.
    Events,
    /// coordination.k8s.io/v1 leases.
    Leases,
}

impl Resource {
    /// Every served resource.
    pub const ALL: [Resource; 4] = [
        Resource::Secrets,
        Resource::ConfigMaps,
        Resource::Events,
        Resource::Leases,
    ];

    /// The plural used in URLs.
    pub fn plural(self) -> &'static str {
        match self {
            Resource::Secrets => "secrets",
            Resource::ConfigMaps => "configmaps",
            Resource::Events => "events",
            Resource::Leases => "leases",
        }
    }

    /// The `kind` of one object.
    pub fn kind(self) -> &'static str {
        match self {
            Resource::Secrets => "Secret",
            Resource::ConfigMaps => "ConfigMap",
            Resource::Events => "Event",
            Resource::Leases => "Lease",
        }
    }

    /// The `apiVersion` of its objects.
    pub fn api_version(self) -> &'static str {
        match self {
            Resource::Leases => "coordination.k8s.io/v1",
            _ => "v1",
        }
    }

    /// The API group ("" for core).
    pub fn group(self) -> &'static str {
        match self {
            Resource::Leases => "coordination.k8s.io",
            _ => "",
        }
    }

    /// Parses a plural within a group.
    pub fn from_plural(group: &str, plural: &str) -> Option<Resource> {
        Resource::ALL
            .into_iter()
            .find(|r| r.group() == group && r.plural() == plural)
    }

    /// Parses a kind.
    pub fn from_kind(kind: &str) -> Option<Resource> {
        Resource::ALL.into_iter().find(|r| r.kind() == kind)
    }
}

/// DNS-1123 subdomain: at most 253 characters of lowercase alphanumerics, `-` and `.`, each
/// dot-separated label starting and ending with an alphanumeric.
pub fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}
