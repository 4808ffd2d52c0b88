//! Command-line flags and the settings resolved from them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::store::DEFAULT_HISTORY;

/// Flags of `mini-apiserver`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "mini-apiserver",
    version,
    about = "A small Kubernetes-API-compatible server for Secrets, ConfigMaps, Events and Leases",
    long_about = "A small Kubernetes-API-compatible server for Secrets, ConfigMaps, Events and \
                  Leases, serving TLS through reload-lib (certificate files are watched and \
                  reloaded). Prints `listening on ADDR` on stdout when ready; logs go to stderr \
                  (RUST_LOG)."
)]
pub struct Flags {
    /// Address to listen on (port 0 picks a free port; the address is printed as `listening on ADDR`).
    #[arg(long, default_value = "127.0.0.1:6443")]
    pub listen: SocketAddr,
    /// Default serving certificate chain (PEM).
    #[arg(long)]
    pub cert: PathBuf,
    /// Private key of the default certificate.
    #[arg(long)]
    pub key: PathBuf,
    /// Certificate for one SNI name: NAME=CERT,KEY (repeatable), e.g. localhost-recovery=...
    #[arg(long, value_name = "NAME=CERT,KEY")]
    pub sni: Vec<String>,
    /// Static token file: lines of `token,user,uid,"group1,group2"`.
    #[arg(long)]
    pub token_auth_file: PathBuf,
    /// Authorization rules, one `subject,verbs,namespaces,resources` line each; when given,
    /// anything no rule allows is forbidden (see `mini_apiserver::auth`).
    #[arg(long)]
    pub authorization_file: Option<PathBuf>,
    /// Users (from the token file or client certificates) that may only get, list and watch.
    #[arg(long, value_delimiter = ',')]
    pub read_only_user: Vec<String>,
    /// CA bundle for client certificates: a verified certificate authenticates its CN as user
    /// (and its O values as groups). A certificate that does not verify (expired, unknown
    /// issuer) does not end the connection: the request falls back to its bearer token, else
    /// 401, as in kube-apiserver. `--client-ca-file` (kube-apiserver's name) works too.
    #[arg(long, alias = "client-ca-file")]
    pub client_ca: Option<PathBuf>,
    /// Save the objects (and the newest watch history) here after every change, and load them at
    /// start (atomic writes, mode 0600).
    #[arg(long)]
    pub state_file: Option<PathBuf>,
    /// Load YAML or JSON manifests (`*.yaml`, `*.yml`, `*.json`; `---` separated documents or
    /// `List`s) at start; objects that already exist are left as they are.
    #[arg(long)]
    pub seed_dir: Option<PathBuf>,
    /// Watch history length; watches from older resourceVersions get 410 Gone.
    #[arg(long, default_value_t = DEFAULT_HISTORY)]
    pub history: usize,
    /// Seconds between bookmarks on watches that allow them.
    #[arg(long, default_value_t = 5.0)]
    pub bookmark_interval: f64,
    /// Append one JSON line per authenticated request on objects (user, verb, apiGroup,
    /// resource, namespace, name, code) to this file, for checking RBAC rules against what
    /// clients really do (see `mini_apiserver::audit`).
    #[arg(long)]
    pub audit_log: Option<PathBuf>,
}

/// One SNI certificate: the name and its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SniPair {
    /// The SNI name (matched case-insensitively by reload-lib).
    pub name: String,
    /// Certificate chain file.
    pub cert: PathBuf,
    /// Key file.
    pub key: PathBuf,
}

/// Everything `run` needs, checked.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Default certificate chain file.
    pub cert: PathBuf,
    /// Default key file.
    pub key: PathBuf,
    /// SNI certificates.
    pub sni: Vec<SniPair>,
    /// Static token file.
    pub token_auth_file: PathBuf,
    /// Rule file, if any.
    pub authorization_file: Option<PathBuf>,
    /// Users limited to get, list and watch.
    pub read_only_users: Vec<String>,
    /// Client CA bundle, if client certificates authenticate.
    pub client_ca: Option<PathBuf>,
    /// State file, if state survives restarts.
    pub state_file: Option<PathBuf>,
    /// Manifests to load at start.
    pub seed_dir: Option<PathBuf>,
    /// Watch history length.
    pub history: usize,
    /// Time between bookmarks.
    pub bookmark_interval: Duration,
    /// Request log, if any.
    pub audit_log: Option<PathBuf>,
}

impl Flags {
    /// Checks the flags that clap cannot (the `--sni` syntax, ranges).
    ///
    /// # Errors
    /// The offending flag and value.
    pub fn settings(self) -> anyhow::Result<Settings> {
        let sni = self
            .sni
            .iter()
            .map(|entry| parse_sni(entry))
            .collect::<anyhow::Result<Vec<_>>>()?;
        if self.history == 0 {
            anyhow::bail!("--history must be at least 1");
        }
        let bookmark_interval = Duration::try_from_secs_f64(self.bookmark_interval)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--bookmark-interval {}: expected a positive number of seconds",
                    self.bookmark_interval
                )
            })?;
        Ok(Settings {
            listen: self.listen,
            cert: self.cert,
            key: self.key,
            sni,
            token_auth_file: self.token_auth_file,
            authorization_file: self.authorization_file,
            read_only_users: self.read_only_user,
            client_ca: self.client_ca,
            state_file: self.state_file,
            seed_dir: self.seed_dir,
            history: self.history,
            bookmark_interval,
            audit_log: self.audit_log,
        })
    }
}

fn parse_sni(entry: &str) -> anyhow::Result<SniPair> {
    let parsed = entry.split_once('=').and_then(|(name, pair)| {
        let (cert, key) = pair.split_once(',')?;
        (!name.is_empty() && !cert.is_empty() && !key.is_empty()).then(|| SniPair {
            name: name.to_owned(),
            cert: cert.into(),
            key: key.into(),
        })
    });
    parsed.ok_or_else(|| anyhow::anyhow!("--sni {entry}: expected NAME=CERT,KEY"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn flags(extra: &[&str]) -> Flags {
        let mut args = vec![
            "mini-apiserver",
            "--cert",
            "c",
            "--key",
            "k",
            "--token-auth-file",
            "t",
        ];
        args.extend_from_slice(extra);
        Flags::try_parse_from(args).unwrap()
    }

    #[test]
    fn sni_flags_become_name_and_files() {
        let settings = flags(&["--sni", "localhost-recovery=/r/tls.crt,/r/tls.key"])
            .settings()
            .unwrap();
        assert_eq!(
            settings.sni,
            [SniPair {
                name: "localhost-recovery".into(),
                cert: "/r/tls.crt".into(),
                key: "/r/tls.key".into()
            }]
        );
        assert_eq!(settings.bookmark_interval, Duration::from_secs(5));
    }

    #[test]
    fn malformed_flags_are_named() {
        for (bad, culprit) in [
            (vec!["--sni", "no-equals"], "--sni no-equals"),
            (vec!["--sni", "name=only-cert"], "--sni name=only-cert"),
            (vec!["--history", "0"], "--history"),
            (vec!["--bookmark-interval", "0"], "--bookmark-interval"),
        ] {
            let err = flags(&bad).settings().unwrap_err().to_string();
            assert!(err.contains(culprit), "{err}");
        }
    }
}
