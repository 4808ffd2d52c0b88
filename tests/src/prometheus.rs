//! A real Prometheus (Debian's `prometheus` package) started by a test on 127.0.0.1, with its
//! own data directory and the configuration the test writes; its active alerts read from
//! `/api/v1/alerts`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::ChildProcess;

/// The `prometheus` binary: `E2E_PROMETHEUS` (an error when that path does not exist), else
/// `prometheus` on `PATH`.
///
/// # Errors
/// Why there is none: the reason a test prints when it skips.
///
/// # Panics
/// When `E2E_PROMETHEUS` names a path that does not exist.
pub fn binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("E2E_PROMETHEUS") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "E2E_PROMETHEUS={} does not exist",
            path.display()
        );
        return Ok(path);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("prometheus"))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            "prometheus is not installed (Debian: apt-get install prometheus; or set E2E_PROMETHEUS)"
                .to_owned()
        })
}

/// Returns from the calling test (which passes) after printing `SKIP: <reason>` when no
/// `prometheus` binary is found; else evaluates to its path.
#[macro_export]
macro_rules! require_prometheus {
    () => {
        match $crate::prometheus::binary() {
            Ok(path) => path,
            Err(reason) => {
                eprintln!("SKIP: {reason}");
                return;
            }
        }
    };
}

/// A running Prometheus, killed on drop.
#[derive(Debug)]
pub struct Prometheus {
    process: ChildProcess,
}

/// One active alert (`pending` or `firing`) as `/api/v1/alerts` gives it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub state: String,
    pub active_at: Option<String>,
    pub value: String,
}

impl Alert {
    /// The label `name`, or "".
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

impl Prometheus {
    /// Starts `binary` with `config` (its text, written to `dir/prometheus.yml`; rule files it
    /// names are relative to `dir`), data in `dir/data`, listening on a free 127.0.0.1 port, and
    /// waits for `/-/ready`.
    ///
    /// # Panics
    /// When it does not start or become ready within 30 s (the message has its log).
    pub fn start(binary: &Path, dir: &Path, config: &str) -> Prometheus {
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let [port] = testkit::envtest::free_ports::<1>();
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let mut command = Command::new(binary);
        command
            .current_dir(dir)
            .arg("--config.file=prometheus.yml")
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"));
        let log = dir.join("prometheus.log");
        let process =
            ChildProcess::spawn_logged(command, &log, addr).unwrap_or_else(|err| panic!("{err}"));
        let prometheus = Prometheus { process };
        let ready = testkit::wait::poll_until(Duration::from_secs(30), || {
            (std::net::TcpStream::connect(addr).is_ok() && prometheus.get("/-/ready").0 == 200)
                .then_some(())
        });
        assert!(
            ready.is_some(),
            "prometheus not ready within 30 s; log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        prometheus
    }

    /// `host:port`.
    pub fn addr(&self) -> String {
        self.process.addr.to_string()
    }

    /// One `GET` as HTTP/1.0 (Go's server then sends the body whole, not chunked).
    fn get(&self, path: &str) -> (u16, String) {
        use std::io::{Read, Write};
        let mut tcp = std::net::TcpStream::connect(self.process.addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(tcp, "GET {path} HTTP/1.0\r\nHost: prometheus\r\n\r\n").unwrap();
        let mut response = Vec::new();
        tcp.read_to_end(&mut response).unwrap();
        testkit::http::RawResponse::parse(&response).status_and_body()
    }

    /// The active alerts (pending and firing).
    ///
    /// # Panics
    /// When the API does not answer with alerts.
    pub fn alerts(&self) -> Vec<Alert> {
        #[derive(serde::Deserialize)]
        struct Data {
            alerts: Vec<Alert>,
        }
        #[derive(serde::Deserialize)]
        struct Response {
            data: Data,
        }
        let (status, body) = self.get("/api/v1/alerts");
        assert_eq!(status, 200, "/api/v1/alerts: {body}");
        serde_json::from_str::<Response>(&body)
            .unwrap_or_else(|err| panic!("/api/v1/alerts: {err}: {body}"))
            .data
            .alerts
    }

    /// The health of every scrape target (`up`, `down`, `unknown`) by job.
    ///
    /// # Panics
    /// When the API does not answer with targets.
    pub fn target_health(&self) -> BTreeMap<String, String> {
        let (status, body) = self.get("/api/v1/targets");
        assert_eq!(status, 200, "/api/v1/targets: {body}");
        let value: serde_json::Value = serde_json::from_str(&body).unwrap();
        value["data"]["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                (
                    t["labels"]["job"].as_str().unwrap_or("").to_owned(),
                    t["health"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }
}
