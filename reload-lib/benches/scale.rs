//! Scale benchmarks: serving sets of 1 to 10,000 SNI pairs. Run with
//! `cargo bench -p reload-lib --bench scale`.
//!
//! - `handshake-sni/{1,100,1000,10000}`: a full TLS 1.3 ECDSA P-256 handshake (real rustls client
//!   and server over an in-memory duplex) against a set with that many configured SNI pairs,
//!   the SNI name moving across the whole set from one handshake to the next.
//! - `swap-one/{1,1000,10000}`: rename one pair's bundle file in a set of that many pairs →
//!   inotify → a pass that reads and parses that pair only → new snapshot published.
//! - Before criterion runs (means only), figures measured side by side in one run and printed
//!   as ratios: handshake cost vs the 1-pair set (interleaved rounds, median), the swap pass
//!   (`Status::last_reload_duration`) and rename → published p50/p99 vs the 1-pair set, and the
//!   RSS of 10,000 ECDSA pairs (measured in a fresh child process, so nothing the parent
//!   allocated while generating certificates is counted).
//!
//! Certificates: one ECDSA P-256 CA; 10,000 leaves, each with its own name, serial and
//! signature, but sharing 16 leaf key pairs (generating 10,000 keys adds nothing to what is
//! measured: each pair's key is still parsed and loaded into its own aws-lc key object).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group};
use reload_lib::{Acceptor, CertKeyPaths, ServingSet};
use rustls_pki_types::ServerName;
use testkit::files::rename_into;
use testkit::pki::{Ca, CertSpec, KeyKind};
use tokio::runtime::Runtime;

/// Leaf key pairs shared by the generated certificates.
const LEAF_KEYS: usize = 16;
/// Handshakes per size per interleaved round, and rounds.
const HANDSHAKES_PER_ROUND: usize = 100;
const ROUNDS: usize = 15;
/// Swaps measured per size for the percentiles.
const SWAPS: usize = 300;

/// Generated material on disk: `dir/default.pem` and `dir/host-<i>.pem` (key + chain bundles).
struct Fixture {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    count: usize,
    ca: Ca,
    /// Leaf private keys, PEM.
    keys: Vec<String>,
    names: Vec<ServerName<'static>>,
}

fn name(i: usize) -> String {
    format!("host-{i}.scale.test")
}

fn bundle_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("host-{i}.pem"))
}

impl Fixture {
    fn generate(count: usize) -> Fixture {
        let started = Instant::now();
        let tmp = tempfile::tempdir().unwrap();
        let fixture = Fixture {
            dir: tmp.path().to_owned(),
            _tmp: tmp,
            count,
            ca: Ca::new("scale-ca"),
            keys: (0..LEAF_KEYS)
                .map(|_| testkit::pki::key_pair_pem(KeyKind::EcdsaP256).0)
                .collect(),
            names: (0..count)
                .map(|i| ServerName::try_from(name(i)).unwrap())
                .collect(),
        };
        std::fs::write(
            fixture.dir.join("default.pem"),
            fixture.bundle("default.scale.test", 0, 0),
        )
        .unwrap();
        for i in 0..count {
            std::fs::write(bundle_path(&fixture.dir, i), fixture.bundle(&name(i), i, 1)).unwrap();
        }
        println!(
            "fixture: {count} ECDSA P-256 leaves + default, one CA, {LEAF_KEYS} shared leaf key pairs, \
             written as key+chain bundles in {:.1?}",
            started.elapsed()
        );
        fixture
    }

    /// Key + chain PEM for `name`; `version` makes a distinct certificate (serial) per call.
    fn bundle(&self, name: &str, i: usize, version: u64) -> String {
        let spec = CertSpec::server(&[name])
            .serial((i as u64) << 20 | version)
            .days(30)
            .reuse_key(&self.keys[i % LEAF_KEYS]);
        self.ca.issue(&spec).bundle()
    }

    /// A set of the default pair plus SNI pairs `0..size`, each configured with its name.
    fn start(&self, rt: &Runtime, size: usize) -> ServingSet {
        let mut builder = ServingSet::builder(CertKeyPaths::bundle(self.dir.join("default.pem")))
            .resync_interval(None);
        for i in 0..size {
            builder = builder.sni(name(i), CertKeyPaths::bundle(bundle_path(&self.dir, i)));
        }
        rt.block_on(builder.start()).unwrap()
    }

    fn client(&self) -> Arc<rustls::ClientConfig> {
        self.ca.client_config()
    }
}

/// One full handshake for `name` over an in-memory duplex; checks the served leaf is the one for
/// `name` (the client verifies the name against it).
async fn handshake(
    client: &Arc<rustls::ClientConfig>,
    acceptor: &Acceptor,
    name: ServerName<'static>,
) {
    let (c, s) = tokio::io::duplex(64 * 1024);
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(client));
    let (client, server) = tokio::join!(connector.connect(name, c), acceptor.accept(s));
    client.unwrap();
    server.unwrap();
}

/// Spreads consecutive handshakes over the whole set (a stride coprime with the sizes used).
fn spread(k: usize, size: usize) -> usize {
    k.wrapping_mul(7919) % size
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Handshake cost per set size, interleaved round by round so machine noise hits all sizes
/// alike; prints the median of the per-round means and the ratio to the 1-pair set.
fn handshake_ratios(fixture: &Fixture, sizes: &[usize]) {
    let rt = Runtime::new().unwrap();
    let client = fixture.client();
    let acceptors: Vec<Acceptor> = sizes
        .iter()
        .map(|size| fixture.start(&rt, *size).acceptor())
        .collect();
    let mut per_size: Vec<Vec<f64>> = vec![Vec::new(); sizes.len()];
    let mut k = 0usize;
    for _ in 0..ROUNDS {
        for (index, (size, acceptor)) in sizes.iter().zip(&acceptors).enumerate() {
            let start = Instant::now();
            rt.block_on(async {
                for _ in 0..HANDSHAKES_PER_ROUND {
                    k += 1;
                    let name = fixture.names[spread(k, *size)].clone();
                    handshake(&client, acceptor, name).await;
                }
            });
            per_size[index].push(start.elapsed().as_secs_f64() / HANDSHAKES_PER_ROUND as f64);
        }
    }
    let medians: Vec<f64> = per_size.iter_mut().map(|s| median(s)).collect();
    // The SNI lookup alone, to separate it from what a larger set costs otherwise (each
    // handshake touching a different key and chain: colder caches).
    let lookups = 1_000_000;
    let mut per_lookup = Vec::new();
    for size in sizes {
        let set = fixture.start(&rt, *size);
        let snapshot = set.current();
        let names: Vec<String> = (0..*size).map(name).collect();
        let start = Instant::now();
        for k in 0..lookups {
            std::hint::black_box(snapshot.certified_key_for(Some(&names[spread(k, *size)])));
        }
        per_lookup.push(start.elapsed().as_secs_f64() / lookups as f64);
    }
    for ((size, m), lookup) in sizes.iter().zip(&medians).zip(&per_lookup) {
        println!(
            "handshake-sni/{size}: {:.1} µs per handshake, ratio {:.3} vs 1 pair \
             (median of {ROUNDS} interleaved rounds of {HANDSHAKES_PER_ROUND}; names spread over the set); \
             SNI lookup alone {:.0} ns (ServingSnapshot::certified_key_for, lower-cases into a String first)",
            m * 1e6,
            m / medians[0],
            lookup * 1e9,
        );
    }
}

/// A set of `size` pairs and alternative versions of the pairs a swap rotates.
struct SwapTarget {
    set: ServingSet,
    rt: Runtime,
    targets: Vec<(PathBuf, [String; 2])>,
    swaps: usize,
}

impl SwapTarget {
    fn new(fixture: &Fixture, size: usize) -> SwapTarget {
        let rt = Runtime::new().unwrap();
        let started = Instant::now();
        let set = fixture.start(&rt, size);
        let took = started.elapsed();
        if size > 1 {
            println!(
                "start-up/{size}: {took:.1?} to read, parse and publish {size} SNI pairs + default"
            );
        }
        let mut indices = vec![0, size / 2, size - 1];
        indices.dedup();
        let targets = indices
            .into_iter()
            .map(|i| {
                let path = bundle_path(&fixture.dir, i);
                let original = std::fs::read_to_string(&path).unwrap();
                (path, [fixture.bundle(&name(i), i, 2), original])
            })
            .collect();
        SwapTarget {
            set,
            rt,
            targets,
            swaps: 0,
        }
    }

    /// Rotates one pair and waits until the set published it; returns the round trip.
    fn swap(&mut self) -> Duration {
        let (path, versions) = &self.targets[self.swaps % self.targets.len()];
        let version = &versions[(self.swaps / self.targets.len()) % 2];
        self.swaps += 1;
        let mut rx = self.set.subscribe();
        let target = rx.borrow_and_update().generation + 1;
        let start = Instant::now();
        rename_into(path, version.as_bytes());
        testkit::wait::block_until_generation(&self.rt, &mut rx, target);
        start.elapsed()
    }
}

/// Swap of one pair per set size: the pass (`last_reload_duration`) and rename → published,
/// p50/p99, with ratios to the 1-pair set.
fn swap_figures(fixture: &Fixture, sizes: &[usize]) {
    let mut baseline = None;
    for size in sizes {
        let mut target = SwapTarget::new(fixture, *size);
        for _ in 0..20 {
            target.swap();
        }
        let (mut passes, mut round_trips) = (Vec::new(), Vec::new());
        for _ in 0..SWAPS {
            round_trips.push(target.swap());
            let status = target.set.status();
            assert_eq!(
                (
                    status.last_reload_sources_read,
                    status.last_reload_sources_parsed
                ),
                (1, 1),
                "a swap reads and parses one pair"
            );
            passes.push(status.last_reload_duration);
        }
        let pass = (percentile(&mut passes, 0.5), percentile(&mut passes, 0.99));
        let trip = (
            percentile(&mut round_trips, 0.5),
            percentile(&mut round_trips, 0.99),
        );
        let (base_pass, base_trip) = *baseline.get_or_insert((pass.0, trip.0));
        println!(
            "swap-one/{size}: pass p50 {:?} p99 {:?} (ratio p50 {:.2} vs 1 pair); rename→published p50 {:?} p99 {:?} \
             (ratio p50 {:.2}); n={SWAPS}, each pass read 1 source and parsed 1",
            pass.0,
            pass.1,
            pass.0.as_secs_f64() / base_pass.as_secs_f64(),
            trip.0,
            trip.1,
            trip.0.as_secs_f64() / base_trip.as_secs_f64(),
        );
    }
}

/// `VmRSS` and `VmHWM` of this process, in bytes.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

const RSS_CHILD: &str = "RELOAD_LIB_SCALE_RSS_DIR";

/// In a fresh child process: RSS with a 1-pair set, then with 10,000 more pairs loaded.
fn rss(fixture: &Fixture) {
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .env(RSS_CHILD, &fixture.dir)
        .env("RELOAD_LIB_SCALE_RSS_COUNT", fixture.count.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "RSS child failed");
}

fn rss_child(dir: PathBuf) {
    let count: usize = std::env::var("RELOAD_LIB_SCALE_RSS_COUNT")
        .unwrap()
        .parse()
        .unwrap();
    let rt = Runtime::new().unwrap();
    // Runtime, provider, inotify thread and one set's worth of fixed costs are in the baseline.
    let small = rt
        .block_on(
            ServingSet::builder(CertKeyPaths::bundle(dir.join("default.pem")))
                .resync_interval(None)
                .start(),
        )
        .unwrap();
    let (before, _) = memory();
    let started = Instant::now();
    let mut builder =
        ServingSet::builder(CertKeyPaths::bundle(dir.join("default.pem"))).resync_interval(None);
    for i in 0..count {
        builder = builder.sni(name(i), CertKeyPaths::bundle(bundle_path(&dir, i)));
    }
    let set = rt.block_on(builder.start()).unwrap();
    let took = started.elapsed();
    let (after, peak) = memory();
    let per_cert = (after - before) as f64 / count as f64;
    println!(
        "rss/{count}-ecdsa-pairs: RSS {:.1} MiB before, {:.1} MiB after (+{:.1} MiB), {:.0} bytes per pair \
         (key, chain, facts, SNI map entries, source state, watch interest); peak (VmHWM) {:.1} MiB; start-up {took:.1?}",
        mib(before),
        mib(after),
        mib(after - before),
        per_cert,
        mib(peak),
    );
    // Swaps must not make memory grow: rewrite one pair 200 times (alternating with a copy that
    // has a trailing newline: different bytes, so each rewrite is parsed and published).
    let path = bundle_path(&dir, count / 2);
    let original = std::fs::read(&path).unwrap();
    let versions = [[&original[..], b"\n"].concat(), original];
    let mut rx = set.subscribe();
    for i in 0..200 {
        let target = rx.borrow_and_update().generation + 1;
        rename_into(&path, &versions[i % 2]);
        testkit::wait::block_until_generation(&rt, &mut rx, target);
    }
    let (after_swaps, _) = memory();
    println!(
        "rss/{count}-ecdsa-pairs: {:.1} MiB after 200 swaps of one pair",
        mib(after_swaps)
    );
    drop(small);
    drop(set);
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

static FIXTURE: OnceLock<(Fixture, Vec<usize>, Vec<usize>)> = OnceLock::new();

fn handshakes(c: &mut Criterion) {
    let (fixture, sizes, _) = FIXTURE.get().unwrap();
    let rt = Runtime::new().unwrap();
    let client = fixture.client();
    let mut group = c.benchmark_group("handshake-sni");
    for size in sizes {
        let acceptor = fixture.start(&rt, *size).acceptor();
        let mut k = 0usize;
        group.bench_with_input(BenchmarkId::from_parameter(size), size, |b, size| {
            b.iter(|| {
                k += 1;
                let name = fixture.names[spread(k, *size)].clone();
                rt.block_on(handshake(&client, &acceptor, name))
            })
        });
    }
    group.finish();
}

fn swaps(c: &mut Criterion) {
    let (fixture, _, sizes) = FIXTURE.get().unwrap();
    let mut group = c.benchmark_group("swap-one");
    for size in sizes {
        let mut target = SwapTarget::new(fixture, *size);
        group.bench_function(BenchmarkId::from_parameter(size), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| target.swap()).sum())
        });
    }
    group.finish();
}

criterion_group!(benches, handshakes, swaps);

fn main() {
    if let Some(dir) = std::env::var_os(RSS_CHILD) {
        rss_child(dir.into());
        return;
    }
    // `cargo test --benches` / `--no-run` smoke runs pass `--bench` only when benchmarking.
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let (count, handshake_sizes, swap_sizes) = if benchmarking {
        (10_000, vec![1, 100, 1_000, 10_000], vec![1, 1_000, 10_000])
    } else {
        (10, vec![1, 10], vec![1, 10])
    };
    let fixture = Fixture::generate(count);
    if benchmarking {
        handshake_ratios(&fixture, &handshake_sizes);
        swap_figures(&fixture, &swap_sizes);
        rss(&fixture);
    }
    let _ = FIXTURE.set((fixture, handshake_sizes, swap_sizes));
    benches();
    Criterion::default().configure_from_args().final_summary();
}
