//! The peer, on a node (issue 27, item 5): the sleep of `kubelet_recovery.rs` (every signer and
//! target of the `openshift-kube-apiserver` PKI expired but `localhost-recovery`, the cert dir
//! as `sync` left it) run twice in one test, once with our sidecars (`manifests/static-pod`) and
//! once with OpenShift's own (`manifests/static-pod-openshift-peer`: the operator binary's
//! `cert-syncer` and `cert-regeneration-controller`, image from `scripts/build-images`), the same
//! kube-apiserver, kubelet and control plane otherwise.
//!
//! Per side: the time from the kubelet's start to a handshake verified by a client trusting only
//! the `localhost-serving-ca` bundle (kept on the host by `cert-syncer node`, the same for both),
//! and each sidecar container's CPU and memory from its own cgroup (`e2e::node::cgroup`): over
//! the recovery (container start → verified handshake and every profile Secret valid in the
//! API) and over an idle period of `E2E_PEER_IDLE_SECS` seconds (default 20; BENCHMARKS.md's
//! figures use 600). Asserted: both sides recover, no sidecar container restarts, every figure
//! is measured. Printed: the table and ours/theirs ratios (whatever they are; BENCHMARKS.md
//! "Peer on a node" says what they mean).
//!
//! `E2E_NODE_LOCK=/tmp/node.lock`: each side holds that lock only while its node runs (two
//! holds of ~12 minutes with 600 s idle, instead of one of ~25), so run the test WITHOUT an outer
//! `flock` on the same file then (it would wait for itself). `E2E_NODE_IMAGE_PROFILE=release`
//! builds our images from the release profile (the figures are measured so). Skips (passing,
//! with `SKIP: <reason>`) where the node tier cannot run or the operator binary is absent.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use e2e::install_crypto_provider;
use e2e::manifests::{REGENERATE_CONTAINER, SYNC_CONTAINER};
use e2e::node::cgroup::{ContainerCgroup, MemorySamples, Sampler};
use e2e::node::images::{self, OPENSHIFT_SIDECARS_IMAGE};
use e2e::node::pod::{OPENSHIFT_PEER_DIR, STATIC_POD_DIR};
use e2e::node::profile_objects::{self, POD};
use e2e::node::scenario::{WakeOptions, Woken, not_after, now};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

/// The two sidecars, by container name (the same names in both pods).
const SIDECARS: [(&str, &str); 2] = [
    (SYNC_CONTAINER, "cert-syncer (sync)"),
    (REGENERATE_CONTAINER, "regeneration controller"),
];

/// One side of the comparison.
struct Side {
    label: &'static str,
    pod_dir: &'static str,
}

const OURS: Side = Side {
    label: "ours",
    pod_dir: STATIC_POD_DIR,
};
const THEIRS: Side = Side {
    label: "OpenShift's",
    pod_dir: OPENSHIFT_PEER_DIR,
};

/// One sidecar's figures over one window.
#[derive(Debug, Clone, Default)]
struct Use {
    /// CPU time, µs.
    cpu_usec: u64,
    /// The kernel's memory peak over the window, if kept (else the sampled maximum).
    peak: Option<u64>,
    memory: MemorySamples,
}

impl Use {
    fn peak_or_sampled(&self) -> u64 {
        self.peak.unwrap_or(self.memory.max_current)
    }
}

/// What one side measured.
#[derive(Debug)]
struct Figures {
    /// kube-apiserver answers `localhost-recovery` (the sidecars can reach it from then on).
    answers: Duration,
    /// The synced `localhost` serving pair is valid again in the cert dir.
    cert_dir: Duration,
    handshake: Duration,
    recovered: Duration,
    recovery: BTreeMap<&'static str, Use>,
    idle: BTreeMap<&'static str, Use>,
    v2: bool,
}

/// `E2E_PEER_IDLE_SECS`, default 20.
fn idle() -> Duration {
    Duration::from_secs(
        std::env::var("E2E_PEER_IDLE_SECS")
            .ok()
            .map(|v| {
                v.parse()
                    .expect("E2E_PEER_IDLE_SECS is a number of seconds")
            })
            .unwrap_or(20),
    )
}

/// `E2E_NODE_LOCK` (relative to the repository root; created if missing, in a directory that
/// must exist), held (exclusively) until dropped; none when unset.
fn node_lock() -> Option<std::fs::File> {
    let path = testkit::env::path("E2E_NODE_LOCK")?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|err| {
            panic!(
                "{}",
                testkit::env::missing("E2E_NODE_LOCK", &path, &format!("cannot be opened: {err}"))
            )
        });
    let waited = Instant::now();
    file.lock().expect("lock E2E_NODE_LOCK");
    eprintln!(
        "holding {} (waited {} s)",
        path.display(),
        waited.elapsed().as_secs()
    );
    Some(file)
}

/// The cgroup and container id of each sidecar, once it runs.
fn find_cgroups(
    woken: &Woken,
    sampler: &Sampler,
    found: &mut BTreeMap<&'static str, (String, ContainerCgroup)>,
) {
    for (name, _) in SIDECARS {
        if found.contains_key(name) {
            continue;
        }
        let Some(id) = woken.node.running_container(POD, name) else {
            continue;
        };
        let Some(pid) = woken.node.containerd.task_pid(&id) else {
            continue;
        };
        let cgroup = ContainerCgroup::of_pid(pid).unwrap_or_else(|err| panic!("{name}: {err}"));
        sampler.add(name, cgroup.clone());
        found.insert(name, (id, cgroup));
    }
}

/// The Secrets of the profile still expired in the API.
async fn still_expired(woken: &Woken) -> Vec<String> {
    let admin = woken.plane.admin();
    let mut expired = Vec::new();
    for (ns, name) in profile_objects::profile_secrets() {
        let Ok(secret) = Api::<Secret>::namespaced(admin.clone(), ns).get(name).await else {
            expired.push(format!("{ns}/{name} (unreadable)"));
            continue;
        };
        let pem = secret
            .data
            .and_then(|d| {
                d.get("tls.crt")
                    .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            })
            .unwrap_or_default();
        if pem.is_empty() || not_after(&pem) < now() {
            expired.push(format!("{ns}/{name}"));
        }
    }
    expired
}

/// The CPU time of sidecar `name` (container `id`); fails with the node's logs when its cgroup
/// is gone (the container exited or was restarted).
fn cpu_of(woken: &Woken, name: &str, id: &str, cgroup: &ContainerCgroup) -> u64 {
    cgroup.cpu_usec().unwrap_or_else(|| {
        let now = tokio::task::block_in_place(|| woken.node.running_container(POD, name));
        woken.fail(&format!(
            "{name}: the cgroup of container {id} is gone ({}); running now: {now:?}; the \
             previous life's log:\n{}",
            cgroup.cpu_dir.display(),
            woken.node.previous_container_log(POD, name),
        ))
    })
}

async fn measure(side: &Side, idle: Duration) -> Figures {
    let _lock = node_lock();
    eprintln!("=== {}: manifests/{} ===", side.label, side.pod_dir);
    let mut woken = Woken::start(WakeOptions {
        pod_dir: Some(side.pod_dir),
        ..WakeOptions::default()
    })
    .await;
    if side.pod_dir == OPENSHIFT_PEER_DIR {
        assert!(
            woken
                .node
                .containerd
                .images()
                .iter()
                .any(|i| i == OPENSHIFT_SIDECARS_IMAGE),
            "scripts/build-images did not build {OPENSHIFT_SIDECARS_IMAGE}"
        );
    }
    let sampler = Sampler::start();
    let mut found = BTreeMap::new();

    // The recovery, with the sidecars' cgroups picked up as soon as their containers run.
    woken.apiserver_running().await;
    let deadline = woken.started + e2e::node::scenario::WITHIN;
    while found.len() < SIDECARS.len() {
        tokio::task::block_in_place(|| find_cgroups(&woken, &sampler, &mut found));
        if Instant::now() > deadline {
            woken.fail("the sidecars' containers did not run");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answers = woken.recovery_answers().await;
    let cert_dir = woken.cert_dir_healed().await;
    let (handshake, _) = woken.verified().await;
    let recovered = woken
        .wait("every profile Secret valid in the API", || async {
            still_expired(&woken).await.is_empty()
        })
        .await;
    let memory = sampler.take_window();
    let v2 = found.values().all(|(_, c)| c.v2);
    let mut recovery = BTreeMap::new();
    let mut idle_start = BTreeMap::new();
    for (name, (id, cgroup)) in &found {
        let cpu = cpu_of(&woken, name, id, cgroup);
        recovery.insert(
            *name,
            Use {
                cpu_usec: cpu,
                peak: cgroup.memory_peak(),
                memory: memory[*name].clone(),
            },
        );
        let reset = cgroup.reset_memory_peak();
        idle_start.insert(*name, (cpu, reset));
    }

    // Idle: nothing changes in the API.
    eprintln!("idle for {} s", idle.as_secs());
    tokio::time::sleep(idle).await;
    let memory = sampler.take_window();
    let mut idle_use = BTreeMap::new();
    for (name, (id, cgroup)) in &found {
        let (cpu_before, reset) = idle_start[name];
        let cpu = cpu_of(&woken, name, id, cgroup);
        idle_use.insert(
            *name,
            Use {
                cpu_usec: cpu - cpu_before,
                peak: if reset { cgroup.memory_peak() } else { None },
                memory: memory[*name].clone(),
            },
        );
        // One container life per sidecar: a restart would split its figures.
        let now_running = tokio::task::block_in_place(|| woken.node.running_container(POD, name));
        assert_eq!(
            now_running.as_deref(),
            Some(id.as_str()),
            "{}: {name} restarted during the measurement",
            side.label
        );
    }
    assert!(
        still_expired(&woken).await.is_empty(),
        "{}: expired again while idle",
        side.label
    );
    drop(sampler);
    drop(woken);
    Figures {
        answers,
        cert_dir,
        handshake,
        recovered,
        recovery,
        idle: idle_use,
        v2,
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1024.0 * 1024.0))
}

fn ratio(ours: f64, theirs: f64) -> String {
    if theirs == 0.0 {
        "–".to_owned()
    } else {
        format!("{:.2}", ours / theirs)
    }
}

/// The table (Markdown), one row per figure.
fn table(ours: &Figures, theirs: &Figures, idle: Duration) -> String {
    let mut rows = vec![
        "| figure | ours | OpenShift's | ours/theirs |".to_owned(),
        "|---|---|---|---|".to_owned(),
    ];
    let mut row = |what: String, a: f64, b: f64, fmt: &dyn Fn(f64) -> String| {
        rows.push(format!(
            "| {what} | {} | {} | {} |",
            fmt(a),
            fmt(b),
            ratio(a, b)
        ));
    };
    let ms = |v: f64| format!("{v:.0} ms");
    let cpu = |v: f64| format!("{:.0} ms", v / 1000.0);
    let mem = |v: f64| format!("{} MiB", mib(v as u64));
    row(
        "kubelet start → verified handshake".into(),
        ours.handshake.as_millis() as f64,
        theirs.handshake.as_millis() as f64,
        &ms,
    );
    row(
        "kube-apiserver answers `localhost-recovery` → verified handshake (the sidecars' part)"
            .into(),
        (ours.handshake - ours.answers).as_millis() as f64,
        (theirs.handshake - theirs.answers).as_millis() as f64,
        &ms,
    );
    row(
        "kubelet start → kube-apiserver answers `localhost-recovery`".into(),
        ours.answers.as_millis() as f64,
        theirs.answers.as_millis() as f64,
        &ms,
    );
    row(
        "kubelet start → synced `localhost` pair valid in the cert dir".into(),
        ours.cert_dir.as_millis() as f64,
        theirs.cert_dir.as_millis() as f64,
        &ms,
    );
    row(
        "kubelet start → every profile Secret valid".into(),
        ours.recovered.as_millis() as f64,
        theirs.recovered.as_millis() as f64,
        &ms,
    );
    let peak_source = if ours.v2 {
        "memory.peak"
    } else {
        "memory.max_usage_in_bytes"
    };
    for (period, pick) in [
        (
            "recovery",
            (|f: &Figures| &f.recovery) as fn(&Figures) -> &BTreeMap<&str, Use>,
        ),
        ("idle", |f: &Figures| &f.idle),
    ] {
        let label = if period == "idle" {
            format!("idle {} s", idle.as_secs())
        } else {
            period.to_owned()
        };
        for (name, title) in SIDECARS {
            let (a, b) = (&pick(ours)[name], &pick(theirs)[name]);
            row(
                format!("{title}: CPU, {label}"),
                a.cpu_usec as f64,
                b.cpu_usec as f64,
                &cpu,
            );
            let peak_what = if a.peak.is_some() && b.peak.is_some() {
                peak_source
            } else {
                "sampled max"
            };
            row(
                format!("{title}: memory peak ({peak_what}), {label}"),
                a.peak_or_sampled() as f64,
                b.peak_or_sampled() as f64,
                &mem,
            );
            row(
                format!("{title}: memory mean (sampled), {label}"),
                a.memory.mean_current() as f64,
                b.memory.mean_current() as f64,
                &mem,
            );
            row(
                format!("{title}: anonymous memory mean (sampled), {label}"),
                a.memory.mean_anon() as f64,
                b.memory.mean_anon() as f64,
                &mem,
            );
        }
    }
    rows.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ours_and_openshifts_sidecars_recover_the_same_slept_node_measured_from_their_cgroups() {
    e2e::require_node!();
    if e2e::node::openshift_dir().is_err() {
        eprintln!("SKIP: no ../shared/openshift (set E2E_OPENSHIFT_DIR)");
        return;
    }
    install_crypto_provider();
    let idle = idle();
    eprintln!(
        "images: profile {}; idle {} s",
        images::profile(),
        idle.as_secs()
    );
    let ours = measure(&OURS, idle).await;
    let theirs = measure(&THEIRS, idle).await;

    for (side, figures) in [(&OURS, &ours), (&THEIRS, &theirs)] {
        for (name, _) in SIDECARS {
            let r = &figures.recovery[name];
            let i = &figures.idle[name];
            assert!(
                r.cpu_usec > 0,
                "{}: {name} used no CPU in the recovery",
                side.label
            );
            assert!(
                r.memory.count > 0 && i.memory.count > 0,
                "{}: {name}: no memory samples ({} recovery, {} idle)",
                side.label,
                r.memory.count,
                i.memory.count
            );
            assert!(
                r.peak_or_sampled() > 0 && i.memory.mean_current() > 0,
                "{}: {name}: no memory measured",
                side.label
            );
        }
    }
    eprintln!(
        "\npeer on a node (cgroup {}, images {}, idle {} s):\n{}\n",
        if ours.v2 { "v2" } else { "v1" },
        images::profile(),
        idle.as_secs(),
        table(&ours, &theirs, idle)
    );
    let total = |f: &Figures, pick: fn(&Figures) -> &BTreeMap<&'static str, Use>| -> u64 {
        pick(f).values().map(|u| u.cpu_usec).sum()
    };
    eprintln!(
        "both sidecars' CPU: recovery ours {} ms / theirs {} ms ({}), idle ours {} ms / theirs {} ms ({})",
        total(&ours, |f| &f.recovery) / 1000,
        total(&theirs, |f| &f.recovery) / 1000,
        ratio(
            total(&ours, |f| &f.recovery) as f64,
            total(&theirs, |f| &f.recovery) as f64
        ),
        total(&ours, |f| &f.idle) / 1000,
        total(&theirs, |f| &f.idle) / 1000,
        ratio(
            total(&ours, |f| &f.idle) as f64,
            total(&theirs, |f| &f.idle) as f64
        ),
    );
}
