//! Flags of `cert-syncer node`, and the value parsers of its file's mode, owner and post-write
//! signal (clap's, so they live with the flags, not in the job).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::connection_args::ConnectionArgs;
use crate::base::error::ConfigError;
use crate::base::time::parse_duration;

/// Flags of `cert-syncer node` (turned into the node job's plain settings by `NodeArgs::settings`).
#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// A part of the file: KIND/NAMESPACE/NAME/KEY, KIND `configmap` or `secret` (repeatable;
    /// the file holds the sources' certificates in this order, each certificate once).
    #[arg(long = "source", value_name = "KIND/NAMESPACE/NAME/KEY")]
    pub sources: Vec<String>,
    /// Sources and file of a known host bundle: `openshift-kubelet-ca` is
    /// configmap/openshift-config-managed/kube-apiserver-client-ca/ca-bundle.crt into
    /// /etc/kubernetes/kubelet-ca.crt. --source and --file replace its parts.
    #[arg(long, value_enum)]
    pub preset: Option<NodePreset>,
    /// The host file to keep (absolute; its directory must exist).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Mode of the file, octal (default: the existing file's, 0644 for a new one).
    #[arg(long, value_parser = parse_mode)]
    pub mode: Option<u32>,
    /// Owner of the file, numeric UID:GID (default: the existing file's).
    #[arg(long, value_parser = parse_owner)]
    pub owner: Option<(u32, u32)>,
    /// Content written by someone else is replaced only after it stayed unchanged this long.
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    pub grace_period: Duration,
    /// Re-check the file this often even without a change event.
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    pub resync_interval: Duration,
    /// This node's name, for Events on the Node (downward API `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Serve /metrics, /healthz and /readyz on this address.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// After each write, send this signal (HUP, USR1, ...) to the process of --post-write-pid-file
    /// or --post-write-process-name.
    #[arg(long, value_parser = parse_signal, requires = "signal_target")]
    pub post_write_signal: Option<i32>,
    /// The pid file of the process to signal.
    #[arg(long, group = "signal_target")]
    pub post_write_pid_file: Option<PathBuf>,
    /// The name (`/proc/PID/comm`) of the processes to signal.
    #[arg(long, group = "signal_target")]
    pub post_write_process_name: Option<String>,
    /// After each write, run this program (no shell; repeat the flag for each argument).
    #[arg(
        long,
        value_name = "ARG",
        conflicts_with = "post_write_signal",
        allow_hyphen_values = true
    )]
    pub post_write_command: Vec<String>,
    /// The post-write action is given up (a command killed) after this long.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub post_write_timeout: Duration,
}

/// Presets of `cert-syncer node`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum NodePreset {
    /// OpenShift 4.16+'s /etc/kubernetes/kubelet-ca.crt.
    OpenshiftKubeletCa,
}

impl NodeArgs {
    /// The node job's settings.
    ///
    /// # Errors
    /// Bad sources, no file, a relative path.
    pub(crate) fn settings(&self) -> Result<crate::node::Settings, ConfigError> {
        use crate::node::{PostWrite, Preset, SignalTarget, Source};
        let preset = self
            .preset
            .map(|NodePreset::OpenshiftKubeletCa| Preset::OpenshiftKubeletCa);
        let sources = if self.sources.is_empty() {
            preset.map(Preset::sources).unwrap_or_default()
        } else {
            self.sources
                .iter()
                .map(|s| Source::parse(s))
                .collect::<Result<_, _>>()?
        };
        let file = self
            .file
            .clone()
            .or(preset.map(Preset::file))
            .ok_or_else(|| ConfigError("--file (or --preset) is required".to_owned()))?;
        let post_write = match (self.post_write_signal, self.post_write_command.is_empty()) {
            (Some(signal), _) => Some(PostWrite::Signal {
                signal,
                target: match (&self.post_write_pid_file, &self.post_write_process_name) {
                    (Some(path), _) => SignalTarget::PidFile(path.clone()),
                    (None, Some(name)) => SignalTarget::ProcessName(name.clone()),
                    (None, None) => {
                        return Err(ConfigError(
                            "--post-write-signal needs --post-write-pid-file or --post-write-process-name".to_owned(),
                        ));
                    }
                },
            }),
            (None, false) => Some(PostWrite::Command(self.post_write_command.clone())),
            (None, true) => None,
        };
        crate::node::Settings {
            connection: self.connection.settings(),
            sources,
            file,
            mode: self.mode,
            owner: self.owner,
            grace_period: self.grace_period,
            resync_interval: self.resync_interval.max(Duration::from_secs(1)),
            node_name: self.node_name.clone().filter(|n| !n.is_empty()),
            metrics_listen: self.metrics_listen,
            post_write,
            post_write_timeout: self.post_write_timeout,
        }
        .validate()
    }
}

/// Parses an octal mode (`0644`, `644`).
pub fn parse_mode(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text.trim_start_matches("0o"), 8)
        .ok()
        .filter(|mode| mode & !0o777 == 0)
        .ok_or_else(|| format!("invalid mode {text:?} (octal, at most 0777)"))
}

/// Parses `UID:GID` (numbers: the container has no host user database).
pub fn parse_owner(text: &str) -> Result<(u32, u32), String> {
    let (uid, gid) = text
        .split_once(':')
        .ok_or_else(|| format!("invalid owner {text:?} (expected UID:GID)"))?;
    let number = |n: &str| {
        n.parse::<u32>()
            .map_err(|_| format!("invalid owner {text:?} (numeric UID:GID)"))
    };
    Ok((number(uid)?, number(gid)?))
}

/// Parses a signal name (`HUP`, `SIGHUP`) or number.
pub fn parse_signal(text: &str) -> Result<i32, String> {
    if let Ok(number) = text.parse::<i32>()
        && (1..=64).contains(&number)
    {
        return Ok(number);
    }
    let name = text
        .strip_prefix("SIG")
        .unwrap_or(text)
        .to_ascii_uppercase();
    let signal = match name.as_str() {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "TERM" => libc::SIGTERM,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        _ => {
            return Err(format!(
                "unknown signal {text:?} (HUP, USR1, USR2, TERM, INT, QUIT or a number)"
            ));
        }
    };
    Ok(signal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_owners_and_signals_parse() {
        assert_eq!(parse_mode("0644"), Ok(0o644));
        assert_eq!(parse_mode("600"), Ok(0o600));
        assert!(parse_mode("4755").is_err());
        assert!(parse_mode("9").is_err());
        assert_eq!(parse_owner("0:0"), Ok((0, 0)));
        assert!(parse_owner("root:root").is_err());
        assert_eq!(parse_signal("HUP"), Ok(libc::SIGHUP));
        assert_eq!(parse_signal("SIGUSR1"), Ok(libc::SIGUSR1));
        assert_eq!(parse_signal("15"), Ok(15));
        assert!(parse_signal("SIGNOPE").is_err());
    }
}
