//! What `cert-syncer node` is asked to do, as plain data: the sources of the host file in
//! order, the file and how to write it, how to live with another writer, and the optional
//! post-write action. Built from the command line by [`crate::app::cli::NodeArgs`]; the job never
//! sees flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::base::error::ConfigError;
use crate::base::kind::Kind;

/// One key of one object: a part of the host file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Source {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    pub key: String,
}

impl Source {
    /// Parses `KIND/NAMESPACE/NAME/KEY` (`configmap/openshift-config-managed/kube-apiserver-client-ca/ca-bundle.crt`).
    pub fn parse(text: &str) -> Result<Source, ConfigError> {
        let bad = |why: &str| {
            ConfigError(format!(
                "--source {text}: {why} (expected KIND/NAMESPACE/NAME/KEY, KIND secret or configmap)"
            ))
        };
        let parts: Vec<&str> = text.split('/').collect();
        let [kind, namespace, name, key] = parts[..] else {
            return Err(bad("not four parts"));
        };
        let kind = Kind::parse(kind).ok_or_else(|| bad("KIND must be secret or configmap"))?;
        if !crate::base::names::is_dns_subdomain(namespace) || namespace.len() > 63 {
            return Err(bad("invalid NAMESPACE"));
        }
        if !crate::base::names::is_dns_subdomain(name) {
            return Err(bad("invalid NAME"));
        }
        if key.is_empty()
            || key.len() > 253
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(bad("invalid KEY (letters, digits, '-', '_', '.')"));
        }
        Ok(Source {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            key: key.to_owned(),
        })
    }

    /// The object, as logs, Events and metrics name it: `configmap ns/name`.
    pub fn object(&self) -> ObjectRef {
        ObjectRef {
            kind: self.kind,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} key {}", self.object(), self.key)
    }
}

/// One watched object (several keys of it may be sources).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind.label(), self.namespace, self.name)
    }
}

/// A preset: the sources and the file of a well-known host bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// OpenShift 4.16+'s `/etc/kubernetes/kubelet-ca.crt` (the kubelet's `clientCAFile`): what
    /// the machine-config-daemon writes from `ControllerConfig.spec.kubeAPIServerServingCAData`,
    /// which the operator fills from `openshift-config-managed/kube-apiserver-client-ca`
    /// (`ca-bundle.crt`) once bootstrap is complete (see `docs/node-mode.md`).
    OpenshiftKubeletCa,
}

impl Preset {
    /// The preset's sources, in file order.
    pub fn sources(self) -> Vec<Source> {
        match self {
            Preset::OpenshiftKubeletCa => vec![Source {
                kind: Kind::ConfigMap,
                namespace: "openshift-config-managed".to_owned(),
                name: "kube-apiserver-client-ca".to_owned(),
                key: "ca-bundle.crt".to_owned(),
            }],
        }
    }

    /// The preset's host file.
    pub fn file(self) -> PathBuf {
        match self {
            Preset::OpenshiftKubeletCa => PathBuf::from("/etc/kubernetes/kubelet-ca.crt"),
        }
    }
}

/// Who receives the post-write signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalTarget {
    /// The pid in this file.
    PidFile(PathBuf),
    /// Every process whose name (`/proc/PID/comm`) is this.
    ProcessName(String),
}

/// What to do after the file was written (for consumers that do not watch the file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostWrite {
    /// Send `signal` (a number, e.g. SIGHUP = 1) to `target`.
    Signal { signal: i32, target: SignalTarget },
    /// Run this program with these arguments (no shell).
    Command(Vec<String>),
}

/// Everything the node job needs.
#[derive(Debug)]
pub struct Settings {
    /// How to reach the apiserver.
    pub connection: crate::kube::connection::Settings,
    /// The sources, in the order their certificates appear in the file.
    pub sources: Vec<Source>,
    /// The host file (absolute).
    pub file: PathBuf,
    /// Mode of the file; `None`: keep the existing file's mode, 0644 for a new one.
    pub mode: Option<u32>,
    /// Owner (uid, gid); `None`: keep the existing file's owner, ours for a new one.
    pub owner: Option<(u32, u32)>,
    /// Different content written by someone else is replaced only after it has stayed
    /// unchanged this long.
    pub grace_period: Duration,
    /// The file is re-checked this often even without an inotify event (a safety net).
    pub resync_interval: Duration,
    /// The Node for Events (`NODE_NAME`).
    pub node_name: Option<String>,
    /// `/metrics`, `/healthz`, `/readyz`.
    pub metrics_listen: Option<SocketAddr>,
    /// After each write of ours.
    pub post_write: Option<PostWrite>,
    /// The post-write action is stopped (SIGKILL for a command) after this long.
    pub post_write_timeout: Duration,
}

impl Settings {
    /// The distinct objects of the sources, in first-seen order.
    pub fn objects(&self) -> Vec<ObjectRef> {
        let mut objects: Vec<ObjectRef> = Vec::new();
        for source in &self.sources {
            let object = source.object();
            if !objects.contains(&object) {
                objects.push(object);
            }
        }
        objects
    }

    /// Checks what parsing alone cannot: at least one source, no source twice, an absolute
    /// file path with a parent directory.
    pub fn validate(self) -> Result<Settings, ConfigError> {
        if self.sources.is_empty() {
            return Err(ConfigError(
                "nothing to assemble: give --source KIND/NAMESPACE/NAME/KEY (repeatable) or --preset"
                    .to_owned(),
            ));
        }
        for (index, source) in self.sources.iter().enumerate() {
            if self.sources[..index].contains(source) {
                return Err(ConfigError(format!("--source {source} is given twice")));
            }
        }
        if !self.file.is_absolute() || self.file.file_name().is_none() {
            return Err(ConfigError(format!(
                "--file {}: must be an absolute file path",
                self.file.display()
            )));
        }
        if let Some(mode) = self.mode
            && mode & !0o777 != 0
        {
            return Err(ConfigError(format!(
                "--mode {mode:o}: only permission bits (at most 0777)"
            )));
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_kind_namespace_name_and_key() {
        let source = Source::parse(
            "configmap/openshift-config-managed/kube-apiserver-client-ca/ca-bundle.crt",
        )
        .unwrap();
        assert_eq!(source, Preset::OpenshiftKubeletCa.sources()[0]);
        assert_eq!(
            source.to_string(),
            "configmap openshift-config-managed/kube-apiserver-client-ca key ca-bundle.crt"
        );
        assert_eq!(
            Source::parse("secret/ns/n/ca.crt").unwrap().kind,
            Kind::Secret
        );
    }

    #[test]
    fn bad_sources_say_what_is_wrong() {
        for (text, why) in [
            ("configmap/ns/name", "four parts"),
            ("pod/ns/name/key", "KIND"),
            ("configmap/NS/name/key", "NAMESPACE"),
            ("configmap/ns/../key", "NAME"),
            ("configmap/ns/name/a b", "KEY"),
            ("configmap/ns/name/a/b", "four parts"),
        ] {
            let err = Source::parse(text).unwrap_err().0;
            assert!(err.contains(why), "{text}: {err}");
        }
    }
}
