//! Faults, repeated (`e2e::node::ha`): rounds of the whole recovery from the slept state of
//! `kubelet_full_recovery.rs`, each with one fault injected into node 0 at a random moment of
//! the recovery (uniform over the length of a first round without fault): SIGKILL of each of
//! our containers (one test each: the six sidecars, the two restarters, the CSR approver), of kube-apiserver's container, of the kubelet (restarted as
//! systemd's `Restart=always` does), of containerd (started again at once); the kube-apiserver
//! cert dir's filesystem (a small tmpfs) full for 10 s. Before each round the tier is put back
//! to the slept state (etcd members' data, the cert dirs, the kubelet's certificates, every
//! container removed).
//!
//! Each round must end recovered (every milestone of the wake on every node), with nothing half
//! done (every `..data` generation on disk complete and as the API holds it, every certificate
//! chaining to the bundle its consumers verify it with, no CA without its bundle, no trust
//! widened) and no duplicate regeneration (no certificate written twice, no bundle written
//! twice with the same CAs, no 409): prints rounds survived / rounds run, and fails on any lost
//! round.
//!
//! `every_fault_in_turn` runs them all on one tier, a round of each in turn (one preparation
//! and one round without fault for all: the fault table's run), starting no round once
//! `E2E_HA_FAULT_BUDGET_SECS` (if set) has passed.
//!
//! `E2E_HA_FAULT_ROUNDS` (default 1; ≥ 20 for BENCHMARKS.md, with `--profile long`),
//! `E2E_HA_FAULT_NODES` (default 1: one node is enough for these faults; 3 for the three-node
//! shape), `E2E_HA_FAULT_SEED` (the random moments; printed). Skips (passing, with
//! `SKIP: <reason>`) where the node tier or namespaces are unavailable.

use std::time::{Duration, Instant};

use e2e::install_crypto_provider;
use e2e::node::ha::checks::{everything, half_done, reach};
use e2e::node::ha::faults::{Fault, Injected, inject};
use e2e::node::ha::tier::{Tier, TierOptions};
use e2e::node::ha::timeline::watch_with;
use e2e::node::ha::writes::WriteReport;

/// The kube-apiserver cert dir's tmpfs for the disk-full fault: a few times what the dir holds
/// (about 200 KiB of certificates, keys and bundles, in 4 KiB pages), so one filler file fills
/// it.
const CERT_DIR_TMPFS: u64 = 4 << 20;

/// The node the faults hit.
const FAULTED: usize = 0;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} is a number")))
        .unwrap_or(default)
}

/// What went wrong in a round that recovered (empty: nothing).
async fn judge(tier: &Tier, nodes: &[usize]) -> Vec<String> {
    let report = WriteReport::of(&tier.writes());
    let mut wrong = half_done(tier, nodes[0], nodes).await;
    wrong.extend(report.duplicates());
    wrong.extend(report.fights(&tier.names()));
    wrong
}

/// One fault's rounds: run, and the lost ones with what was wrong.
struct Tally {
    fault: Fault,
    run: u64,
    lost: Vec<(u64, Vec<String>)>,
}

impl Tally {
    fn line(&self, nodes: usize) -> String {
        format!(
            "{} on node {FAULTED} of {nodes}: {} / {} rounds survived",
            self.fault.name(),
            self.run - self.lost.len() as u64,
            self.run
        )
    }
}

/// One round with `fault` at `at` after the kubelets' start: `None` when the recovery was
/// over before that moment (the round does not count), else what went wrong (empty: nothing).
async fn one_round(
    tier: &mut Tier,
    all: &[usize],
    fault: Fault,
    at: Duration,
    label: &str,
) -> Option<Vec<String>> {
    tier.reset();
    tier.wake(all);
    let mut injected: Option<Injected> = None;
    let result = watch_with(tier, &everything(all), |tier, elapsed| {
        if injected.is_none() && elapsed >= at {
            injected = inject(tier, FAULTED, fault);
            if let Some(done) = &injected {
                eprintln!("{label}: +{} ms: {}", elapsed.as_millis(), done.what);
            }
        }
    })
    .await;
    let Some(injected) = injected else {
        eprintln!(
            "{label}: recovered before the fault's moment (+{} ms): not counted",
            at.as_millis()
        );
        return None;
    };
    injected.finish();
    Some(match result {
        Ok(_) => judge(tier, all).await,
        Err((_, missing)) => missing
            .iter()
            .map(|m| format!("not reached: {m}"))
            .collect(),
    })
}

/// `E2E_HA_FAULT_ROUNDS` rounds of each of `faults` on one tier, in turn (a cycle is one round
/// of each), starting no round once `E2E_HA_FAULT_BUDGET_SECS` (if set) has passed; prints
/// rounds survived / rounds run per fault, fails on any lost round.
async fn rounds_of(faults: &[Fault]) {
    e2e::require_ha!();
    install_crypto_provider();
    let nodes = usize::try_from(env_number("E2E_HA_FAULT_NODES", 1)).expect("a node count");
    let rounds = env_number("E2E_HA_FAULT_ROUNDS", 1);
    let budget = std::env::var("E2E_HA_FAULT_BUDGET_SECS")
        .ok()
        .map(|v| Duration::from_secs(v.parse().expect("E2E_HA_FAULT_BUDGET_SECS is a number")));
    let seed = env_number("E2E_HA_FAULT_SEED", fastrand::u64(..));
    let mut rng = fastrand::Rng::with_seed(seed);
    let options = TierOptions {
        nodes,
        cert_dir_tmpfs: faults
            .contains(&Fault::CertDirFull)
            .then_some(CERT_DIR_TMPFS),
    };
    let began = Instant::now();
    let mut tier = Tier::prepare_with(options).await;
    tier.save_pristine();
    let all: Vec<usize> = (0..nodes).collect();

    // A first round without a fault: how long the recovery takes (the faults fall in it).
    tier.wake(&all);
    let baseline = reach(&mut tier, &everything(&all)).await;
    let length = baseline.times.values().copied().max().expect("milestones");
    let wrong = judge(&tier, &all).await;
    assert!(wrong.is_empty(), "the round without a fault: {wrong:#?}");
    eprintln!(
        "{} fault(s), {nodes} node(s), {rounds} round(s) each, seed {seed}; a recovery without fault takes {} ms",
        faults.len(),
        length.as_millis()
    );

    let mut tallies: Vec<Tally> = faults
        .iter()
        .map(|&fault| Tally {
            fault,
            run: 0,
            lost: Vec::new(),
        })
        .collect();
    'cycles: for cycle in 0..rounds {
        for tally in &mut tallies {
            if budget.is_some_and(|b| began.elapsed() >= b) {
                eprintln!(
                    "the time budget ({budget:?}) is spent in cycle {} of {rounds}: stopping",
                    cycle + 1
                );
                break 'cycles;
            }
            let label = format!("{} round {}", tally.fault.name(), tally.run + 1);
            let round_began = Instant::now();
            let wrong = loop {
                let at = Duration::from_millis(rng.u64(0..length.as_millis() as u64 * 9 / 10));
                if let Some(wrong) = one_round(&mut tier, &all, tally.fault, at, &label).await {
                    break wrong;
                }
            };
            tally.run += 1;
            if wrong.is_empty() {
                eprintln!(
                    "{label}: recovered, nothing half done, no duplicate ({} ms)",
                    round_began.elapsed().as_millis()
                );
            } else {
                eprintln!("{label}: LOST:\n  {}", wrong.join("\n  "));
                tally.lost.push((tally.run, wrong));
            }
        }
        eprintln!(
            "after cycle {} ({} s):",
            cycle + 1,
            began.elapsed().as_secs()
        );
        for tally in &tallies {
            eprintln!("  {}", tally.line(nodes));
        }
    }
    eprintln!(
        "fault table (seed {seed}, {} s):",
        began.elapsed().as_secs()
    );
    for tally in &tallies {
        eprintln!("fault table: {}", tally.line(nodes));
    }
    let lost: Vec<String> = tallies
        .iter()
        .flat_map(|t| {
            t.lost.iter().map(move |(round, wrong)| {
                format!(
                    "{} round {round}:\n  {}",
                    t.fault.name(),
                    wrong.join("\n  ")
                )
            })
        })
        .collect();
    assert!(lost.is_empty(), "lost rounds:\n{}", lost.join("\n"));
}

/// Every fault below but the full cert dir in turn on one tier (one preparation, one round
/// without fault): the fault table's run (`E2E_HA_FAULT_ROUNDS` cycles,
/// `E2E_HA_FAULT_BUDGET_SECS`). The full cert dir needs its tmpfs: its own test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fault_in_turn() {
    let mut faults = Fault::OURS.to_vec();
    faults.extend([
        Fault::KUBE_APISERVER,
        Fault::KillKubelet,
        Fault::KillContainerd,
    ]);
    rounds_of(&faults).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_kube_apiserver_cert_syncer() {
    rounds_of(&[Fault::OURS[0]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_kube_apiserver_cert_regeneration_controller() {
    rounds_of(&[Fault::OURS[1]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_kube_controller_manager_cert_syncer() {
    rounds_of(&[Fault::OURS[2]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_kube_controller_manager_recovery_controller() {
    rounds_of(&[Fault::OURS[3]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_kube_scheduler_cert_syncer() {
    rounds_of(&[Fault::OURS[4]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_kube_scheduler_recovery_controller() {
    rounds_of(&[Fault::OURS[5]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_kube_controller_manager_cert_restarter() {
    rounds_of(&[Fault::OURS[6]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_kube_scheduler_cert_restarter() {
    rounds_of(&[Fault::OURS[7]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_kube_controller_manager_csr_approver() {
    rounds_of(&[Fault::OURS[8]]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_kube_apiserver() {
    rounds_of(&[Fault::KUBE_APISERVER]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_kubelet() {
    rounds_of(&[Fault::KillKubelet]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_containerd() {
    rounds_of(&[Fault::KillContainerd]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cert_dir_full_for_ten_seconds() {
    rounds_of(&[Fault::CertDirFull]).await;
}
