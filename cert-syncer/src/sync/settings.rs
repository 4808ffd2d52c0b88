//! What `sync` runs with: the validated object list and the knobs, as plain values (`cli` turns
//! the flags into them; `app::access` derives the API access from the same values).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::files::FileMapping;
use crate::base::error::ConfigError;
use crate::base::kind::Kind;
use crate::base::names::is_dns_subdomain;

/// One object to mirror.
#[derive(Debug, Clone)]
pub(crate) struct ObjectSpec {
    pub kind: Kind,
    pub name: String,
    pub required: bool,
    /// Mirrored into the destination directory. `false` for an object named only by `--file`:
    /// only the mapped key goes to its host file, never the whole object (its private key).
    pub mirror: bool,
}

impl ObjectSpec {
    /// Whether `sync` may GET this object: only an optional one, confirmed live before the
    /// files of an object that went away are removed (a required object's files stay). The
    /// worker's policy (`worker::needs_live_get`) and the RBAC it needs (`app::access`) both
    /// follow this.
    pub fn may_get_live(&self) -> bool {
        !self.required
    }

    /// `secret/name`: how logs, readiness and Events name the object.
    pub fn label(&self) -> String {
        format!("{}/{}", self.kind.label(), self.name)
    }
}

/// The settings of one `sync` run.
#[derive(Debug)]
pub(crate) struct Settings {
    pub connection: crate::kube::connection::Settings,
    pub namespace: String,
    /// The resource directory: `<destination>/secrets/<name>/<key>`, ...
    pub destination: PathBuf,
    /// Every named object, and those only named by `--file` (see [`Settings::objects`]).
    pub objects: Vec<ObjectSpec>,
    pub files: Vec<FileMapping>,
    /// A kind with more named objects than this gets one namespace-wide watcher.
    pub namespace_watch_threshold: usize,
    pub metrics_listen: Option<SocketAddr>,
    /// This pod, for Events (none without it).
    pub pod_name: Option<String>,
    /// Exit non-zero after the apiserver has refused our credentials this long.
    pub auth_failure_exit_after: Duration,
    /// At most this many objects are reconciled at once.
    pub write_parallelism: usize,
    /// How often the disk is checked against the last state seen of each object (and repaired
    /// from it); zero: never.
    pub resync_interval: Duration,
}

/// The object names as given: required and optional, per kind, and the `--file` mappings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Named<'a> {
    pub secrets: &'a [String],
    pub optional_secrets: &'a [String],
    pub configmaps: &'a [String],
    pub optional_configmaps: &'a [String],
    /// `KIND/NAME/KEY=PATH`.
    pub files: &'a [String],
}

impl Settings {
    /// The objects to follow: every named one (a DNS subdomain, named once), then the object of
    /// each `--file` mapping not named already (required, not mirrored).
    ///
    /// # Errors
    /// A bad name, a name listed twice, a bad `--file`, or nothing to sync at all.
    pub(crate) fn objects(
        named: &Named<'_>,
    ) -> Result<(Vec<ObjectSpec>, Vec<FileMapping>), ConfigError> {
        let mut objects = Vec::new();
        let lists = [
            (Kind::Secret, true, named.secrets),
            (Kind::Secret, false, named.optional_secrets),
            (Kind::ConfigMap, true, named.configmaps),
            (Kind::ConfigMap, false, named.optional_configmaps),
        ];
        for (kind, required, names) in lists {
            for name in names.iter().filter(|n| !n.is_empty()) {
                if !is_dns_subdomain(name) {
                    return Err(ConfigError(format!(
                        "invalid {} name {name:?}",
                        kind.label()
                    )));
                }
                if objects
                    .iter()
                    .any(|o: &ObjectSpec| o.kind == kind && o.name == *name)
                {
                    return Err(ConfigError(format!(
                        "{} {name} is listed twice",
                        kind.label()
                    )));
                }
                objects.push(ObjectSpec {
                    kind,
                    name: name.clone(),
                    required,
                    mirror: true,
                });
            }
        }
        let files = named
            .files
            .iter()
            .map(|f| FileMapping::parse(f))
            .collect::<Result<Vec<_>, _>>()?;
        for file in &files {
            if !objects
                .iter()
                .any(|o| o.kind == file.kind && o.name == file.name)
            {
                // Required: a host file whose object is missing is a failure to report (not
                // ready), and there is no directory to remove.
                objects.push(ObjectSpec {
                    kind: file.kind,
                    name: file.name.clone(),
                    required: true,
                    mirror: false,
                });
            }
        }
        if objects.is_empty() {
            return Err(ConfigError(
                "nothing to sync: name objects with --secrets, --optional-secrets, --configmaps, --optional-configmaps or --file".to_owned(),
            ));
        }
        Ok((objects, files))
    }

    /// The named objects of `kind`.
    pub(crate) fn objects_of(&self, kind: Kind) -> Vec<ObjectSpec> {
        self.objects
            .iter()
            .filter(|o| o.kind == kind)
            .cloned()
            .collect()
    }

    /// Whether `kind` is followed with one namespace-wide watcher (more named objects of it
    /// than the threshold) rather than one watcher per object.
    pub(crate) fn namespace_wide(&self, kind: Kind) -> bool {
        self.objects.iter().filter(|o| o.kind == kind).count() > self.namespace_watch_threshold
    }
}
