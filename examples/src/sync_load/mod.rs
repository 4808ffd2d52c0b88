//! The engine of `sync-load`: `cert-syncer sync` against `mini-apiserver` seeded with N
//! Secrets, measured from outside the processes.
//!
//! Per scenario and run: a fresh `mini-apiserver` seeded (`--seed-dir`) with the scenario's
//! Secrets, a fresh destination directory, then `cert-syncer sync` for all of them (all
//! required, so `/readyz` answers 200 exactly when every object is on disk), and:
//! - initial sync: process start → `/readyz` 200 (polled every 5 ms), then every file checked;
//! - start-up requests: lists and GETs of Secrets the apiserver served until then, and the
//!   watch connections it holds (its `/metrics`);
//! - memory: `VmRSS` after the initial sync, `VmHWM` (peak) at the end;
//! - update latency: one Secret patched through the API → its `..data` link swapped (inotify),
//!   content checked; samples spread over the set (stride 7919), one at a time, 20 ms apart;
//! - idle CPU: user + system time of the syncer (and of the apiserver) over `--idle-secs`
//!   after the updates settled.
//!
//! The machine is shared and noisy: compare scenarios within one run (the ratios), not absolute
//! figures across machines.

pub mod fixture;
mod measure;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use fixture::{Fixture, NAMESPACE, TOKEN, object_name, secret_data};
use measure::{Landings, cpu_time, http_status, memory_kib, metric_value, percentile, spread};
use testkit::process::Child as Proc;

/// What to run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where `mini-apiserver` and `cert-syncer` are.
    pub bin_dir: PathBuf,
    /// Parent of the work directory (its filesystem is the one written to).
    pub work_dir: PathBuf,
    /// Objects of the large scenario.
    pub objects: usize,
    /// Runs of every scenario.
    pub runs: usize,
    /// Update samples per scenario and run.
    pub updates: usize,
    /// Length of the idle CPU window.
    pub idle: Duration,
    /// Also run the large set with one watch per object (the path below the threshold).
    pub per_name: bool,
    /// Extra flags for every `cert-syncer sync`.
    pub syncer_args: Vec<String>,
}

/// One configuration measured.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Shown in the report.
    pub label: String,
    /// Secrets seeded and synced.
    pub objects: usize,
    /// Flags added to the syncer's.
    pub args: Vec<String>,
}

/// The figures of one scenario in one run.
#[derive(Debug, Clone)]
pub struct Figures {
    /// Process start → ready (every object on disk).
    pub initial_sync: Duration,
    /// Secret lists and GETs the apiserver served until ready.
    pub startup_lists: f64,
    /// See `startup_lists`.
    pub startup_gets: f64,
    /// Secret watch connections open at the end.
    pub watches: f64,
    /// `VmRSS` after the initial sync, KiB.
    pub rss_kib: u64,
    /// `VmHWM` at the end, KiB.
    pub hwm_kib: u64,
    /// Update → `..data` swapped, median.
    pub update_p50: Duration,
    /// Update → `..data` swapped, 99th percentile.
    pub update_p99: Duration,
    /// Syncer CPU over the idle window.
    pub idle_cpu: Duration,
    /// Apiserver CPU over the same window.
    pub apiserver_idle_cpu: Duration,
}

/// The scenarios, the baseline (1 object, default flags) first.
pub fn scenarios(settings: &Settings) -> Vec<Scenario> {
    let n = settings.objects;
    let mut scenarios = vec![
        Scenario {
            label: "1 object (baseline: per-object watch)".to_owned(),
            objects: 1,
            args: Vec::new(),
        },
        Scenario {
            label: "1 object, namespace-wide watch (threshold 0)".to_owned(),
            objects: 1,
            args: vec!["--namespace-watch-threshold".to_owned(), "0".to_owned()],
        },
        Scenario {
            label: format!("{n} objects (default flags)"),
            objects: n,
            args: Vec::new(),
        },
    ];
    if settings.per_name {
        scenarios.push(Scenario {
            label: format!("{n} objects, one watch per object (threshold {n})"),
            objects: n,
            args: vec!["--namespace-watch-threshold".to_owned(), n.to_string()],
        });
    }
    scenarios
}

/// Runs every scenario `settings.runs` times (interleaved: run 1 of each, then run 2, ...),
/// printing one progress line per measurement on stderr.
///
/// # Errors
/// A missing binary, a process that does not start or exits, a sync that does not complete or
/// writes wrong content, an update that does not land within 30 s.
pub fn run(settings: &Settings) -> anyhow::Result<Vec<(Scenario, Vec<Figures>)>> {
    for bin in ["mini-apiserver", "cert-syncer"] {
        let path = settings.bin_dir.join(bin);
        if !path.exists() {
            bail!(
                "{} not found (build it: cargo build --release -p cert-syncer -p mini-apiserver, or pass --bin-dir)",
                path.display()
            );
        }
    }
    let fixture = Fixture::create(&settings.work_dir, settings.objects)?;
    let mut landings = Landings::start()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start a tokio runtime")?;
    let mut results: Vec<(Scenario, Vec<Figures>)> = scenarios(settings)
        .into_iter()
        .map(|s| (s, Vec::new()))
        .collect();
    let mut measurement = 0;
    for run in 1..=settings.runs {
        for (scenario, figures) in &mut results {
            measurement += 1;
            let measured = Measurement {
                settings,
                fixture: &fixture,
                scenario,
                runtime: &runtime,
                dest: fixture.dir.join(format!("dest-{measurement}")),
            }
            .run(&mut landings)
            .with_context(|| format!("run {run}, {}", scenario.label))?;
            eprintln!(
                "run {run}: {}: initial sync {:.0} ms, RSS {:.1} MiB, update p50 {:.2} ms, idle CPU {:.0} ms",
                scenario.label,
                ms(measured.initial_sync),
                mib(measured.rss_kib),
                ms(measured.update_p50),
                ms(measured.idle_cpu)
            );
            figures.push(measured);
        }
    }
    Ok(results)
}

/// The report as a Markdown table: min / median / max over runs, ratios against the baseline
/// scenario measured in the same run.
pub fn report(settings: &Settings, results: &[(Scenario, Vec<Figures>)]) -> String {
    let baseline = &results[0].1;
    let mut text = format!(
        "{} runs; {} update samples per scenario and run; idle window {} s. Figures: min / median / max over runs.\n\n",
        settings.runs,
        settings.updates,
        settings.idle.as_secs_f64()
    );
    text.push_str(
        "| scenario | watch connections | start-up lists / GETs | initial sync ms | ratio vs baseline | RSS after sync MiB | peak RSS MiB | update p50 ms | update p99 ms | p50 ratio vs baseline | idle CPU ms (syncer) | idle CPU ms (apiserver) |\n",
    );
    text.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let show = |values: Vec<f64>, digits: usize| {
        let (min, median, max) = spread(&values);
        format!("{min:.digits$} / {median:.digits$} / {max:.digits$}")
    };
    for (scenario, figures) in results {
        let ratio = |value: fn(&Figures) -> f64| {
            figures
                .iter()
                .zip(baseline)
                .map(|(f, b)| value(f) / value(b))
                .collect::<Vec<f64>>()
        };
        let each = |value: fn(&Figures) -> f64| figures.iter().map(value).collect::<Vec<f64>>();
        text.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            scenario.label,
            show(each(|f| f.watches), 0),
            format_args!(
                "{} / {}",
                show(each(|f| f.startup_lists), 0),
                show(each(|f| f.startup_gets), 0)
            ),
            show(each(|f| ms(f.initial_sync)), 0),
            show(ratio(|f| ms(f.initial_sync)), 2),
            show(each(|f| mib(f.rss_kib)), 1),
            show(each(|f| mib(f.hwm_kib)), 1),
            show(each(|f| ms(f.update_p50)), 2),
            show(each(|f| ms(f.update_p99)), 2),
            show(ratio(|f| ms(f.update_p50)), 2),
            show(each(|f| ms(f.idle_cpu)), 0),
            show(each(|f| ms(f.apiserver_idle_cpu)), 0),
        ));
    }
    text
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// One scenario measured once.
struct Measurement<'a> {
    settings: &'a Settings,
    fixture: &'a Fixture,
    scenario: &'a Scenario,
    runtime: &'a tokio::runtime::Runtime,
    dest: PathBuf,
}

impl Measurement<'_> {
    fn run(&self, landings: &mut Landings) -> anyhow::Result<Figures> {
        let objects = self.scenario.objects;
        let (apiserver, addr) = self.start_apiserver()?;
        let names: Vec<String> = (0..objects).map(object_name).collect();
        let started = Instant::now();
        let mut syncer = Proc::spawn_logging(
            "cert-syncer sync",
            self.syncer_command(addr, &names),
            |_| {},
        )
        .map_err(anyhow::Error::msg)?;
        let metrics_addr = syncer
            .wait_listening(Duration::from_secs(30))
            .map_err(anyhow::Error::msg)?;
        while http_status(metrics_addr, "/readyz") != 200 {
            if let Ok(Some(status)) = syncer.child.try_wait() {
                bail!("cert-syncer exited ({status}):\n{}", syncer.tail(20));
            }
            if started.elapsed() > Duration::from_secs(300) {
                bail!("not ready after 300 s:\n{}", syncer.tail(20));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let initial_sync = started.elapsed();
        let pid = syncer.child.id();
        let (rss_kib, _) = memory_kib(pid)?;
        for (i, name) in names.iter().enumerate() {
            let dir = self.dest.join("secrets").join(name);
            let cert = std::fs::read_to_string(dir.join("tls.crt"))
                .with_context(|| format!("{name} not synced"))?;
            if cert != self.fixture.pairs[i].cert {
                bail!("{name}: wrong tls.crt on disk");
            }
            let mode = std::fs::metadata(dir.join("tls.key"))?.permissions().mode() & 0o777;
            if mode != 0o600 {
                bail!("{name}: tls.key has mode {mode:o}");
            }
        }
        let client = self
            .runtime
            .block_on(async { client(addr, &self.fixture.ca_pem) })?;
        let startup = self.runtime.block_on(apiserver_metrics(&client))?;
        let series = |verb: &str| {
            metric_value(
                &startup,
                &format!("mini_apiserver_requests_total{{verb=\"{verb}\",resource=\"secrets\"}}"),
            )
            .unwrap_or(0.0)
        };
        let (startup_lists, startup_gets) = (series("list"), series("get"));

        let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
        let mut holding: HashMap<usize, usize> = HashMap::new();
        let mut latencies = Vec::with_capacity(self.settings.updates);
        for k in 0..self.settings.updates {
            let i = (k * 7919) % objects;
            let next = usize::from(holding.get(&i) == Some(&0));
            let pair = &self.fixture.updates[next];
            let dir = self.dest.join("secrets").join(&names[i]);
            let wd = landings.arm(&dir)?;
            let sent = Instant::now();
            let patch = Patch::Merge(serde_json::json!({ "data": secret_data(pair) }));
            self.runtime
                .block_on(secrets.patch(&names[i], &PatchParams::default(), &patch))
                .with_context(|| format!("cannot patch {}", names[i]))?;
            let landed = landings
                .wait(wd, Duration::from_secs(30))
                .with_context(|| format!("update of {}:\n{}", names[i], syncer.tail(10)))?;
            latencies.push(landed.saturating_duration_since(sent));
            if std::fs::read_to_string(dir.join("tls.crt"))? != pair.cert {
                bail!("{}: the update landed with the wrong content", names[i]);
            }
            holding.insert(i, next);
            std::thread::sleep(Duration::from_millis(20));
        }
        latencies.sort();

        std::thread::sleep(Duration::from_secs(1));
        let apiserver_pid = apiserver.child.id();
        let (syncer_before, apiserver_before) = (cpu_time(pid)?, cpu_time(apiserver_pid)?);
        std::thread::sleep(self.settings.idle);
        let idle_cpu = cpu_time(pid)?.saturating_sub(syncer_before);
        let apiserver_idle_cpu = cpu_time(apiserver_pid)?.saturating_sub(apiserver_before);
        let (_, hwm_kib) = memory_kib(pid)?;
        let end = self.runtime.block_on(apiserver_metrics(&client))?;
        let watches =
            metric_value(&end, "mini_apiserver_watches_open{resource=\"secrets\"}").unwrap_or(0.0);
        drop(client);
        let _ = std::fs::remove_dir_all(&self.dest);
        Ok(Figures {
            initial_sync,
            startup_lists,
            startup_gets,
            watches,
            rss_kib,
            hwm_kib,
            update_p50: percentile(&latencies, 50.0),
            update_p99: percentile(&latencies, 99.0),
            idle_cpu,
            apiserver_idle_cpu,
        })
    }

    fn start_apiserver(&self) -> anyhow::Result<(Proc, std::net::SocketAddr)> {
        let seed = self.fixture.seed_dir(self.scenario.objects)?;
        let (cert, key, tokens) = &self.fixture.serving;
        let mut command = Command::new(self.settings.bin_dir.join("mini-apiserver"));
        command
            .args(["--listen", "127.0.0.1:0", "--cert"])
            .arg(cert)
            .arg("--key")
            .arg(key)
            .arg("--token-auth-file")
            .arg(tokens)
            .arg("--seed-dir")
            .arg(&seed)
            .env("RUST_LOG", "warn");
        let mut apiserver =
            Proc::spawn_logging("mini-apiserver", command, |_| {}).map_err(anyhow::Error::msg)?;
        let addr = apiserver
            .wait_listening(Duration::from_secs(30))
            .map_err(anyhow::Error::msg)?;
        Ok((apiserver, addr))
    }

    /// The syncer as the static pod runs it (log level info), every object required.
    fn syncer_command(&self, addr: std::net::SocketAddr, names: &[String]) -> Command {
        let mut command = Command::new(self.settings.bin_dir.join("cert-syncer"));
        command
            .arg("sync")
            .args(["--server", &format!("https://{addr}")])
            .args(["--tls-server-name-override", "localhost-recovery"])
            .arg("--ca-file")
            .arg(&self.fixture.ca_file)
            .arg("--token-file")
            .arg(&self.fixture.token_file)
            .args(["--namespace", NAMESPACE, "--metrics-listen", "127.0.0.1:0"])
            .arg("--destination-dir")
            .arg(&self.dest)
            .args(["--secrets", &names.join(",")])
            .args(&self.scenario.args)
            .args(&self.settings.syncer_args)
            .env("RUST_LOG", "info");
        command
    }
}

/// A client that connects as the syncer does: SNI `localhost-recovery`, the fixture's CA, the
/// token. Must be called inside the runtime (kube spawns its request buffer there).
fn client(addr: std::net::SocketAddr, ca_pem: &str) -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::new(format!("https://{addr}").parse()?);
    config.root_cert = Some(vec![
        CertificateDer::from_pem_slice(ca_pem.as_bytes())?.to_vec(),
    ]);
    config.tls_server_name = Some("localhost-recovery".to_owned());
    config.auth_info.token = Some(TOKEN.to_owned().into());
    Ok(kube::Client::try_from(config)?)
}

async fn apiserver_metrics(client: &kube::Client) -> anyhow::Result<String> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    client
        .request_text(request)
        .await
        .context("cannot read the apiserver's /metrics")
}
