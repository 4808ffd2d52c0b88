//! Benchmarks of reload-lib. Run with `cargo bench -p reload-lib`.
//!
//! - `handshake/{static,reloading}`: a full TLS 1.3 ECDSA P-256 handshake over an in-memory
//!   duplex, through a plain tokio-rustls acceptor on a fixed `ServerConfig` versus the reloading
//!   `Acceptor`. Criterion measures the two one after the other (seconds apart), so on a shared
//!   machine their ratio carries whatever the load did in between: use the interleaved figure.
//! - Interleaved handshakes (printed before criterion runs): rounds of K static and K reloading
//!   handshakes, the order swapped every round, timed by the thread's CPU clock (time the thread
//!   was descheduled does not count); the reloading/static ratio per round, its median and
//!   spread. This is the overhead of reloadability. `RELOAD_BENCH_ONLY=static:N` (or
//!   `reloading:N`) runs only N handshakes of one side after the common setup and exits, for
//!   instruction counts: `valgrind --tool=callgrind` of `static:N` vs `reloading:N` differ by
//!   exactly the reloading side's extra instructions (client + server).
//!   `RELOAD_BENCH_ONLY=pass-ecdsa:N` (or `pass-rsa:N`) runs N explicit reload passes that
//!   publish (two pairs alternating) and `rename-ecdsa:N` (or `rename-rsa:N`) N renames through
//!   inotify, each awaited until published: under callgrind, the difference between two values
//!   of N divided by their difference is the instructions of one pass (one rotation).
//! - `reload/{ecdsa-p256,rsa-2048}`: one reload pass that publishes (read both files, parse,
//!   check the key, build the config, swap), driven through `ServingSet::reload`.
//! - Before criterion runs, percentile figures (criterion reports means): reload cost p50/p99,
//!   and rename → new snapshot published through inotify p50/p99.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use reload_lib::{CertKeyPaths, ServingSet};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use testkit::files::rename_into;
use testkit::pki::{CertSpec, KeyKind};
use tokio::runtime::Runtime;

struct Pair {
    cert: String,
    key: String,
}

/// A self-signed certificate for `localhost`, valid for 30 days: RSA 2048 or ECDSA P-256.
fn pair(rsa: bool) -> Pair {
    let kind = if rsa {
        KeyKind::Rsa2048
    } else {
        KeyKind::EcdsaP256
    };
    let issued = testkit::pki::self_signed(&CertSpec::server(&["localhost"]).key(kind).days(30));
    Pair {
        cert: issued.cert_pem,
        key: issued.key_pem,
    }
}

/// Writes the pair as one bundle file (key + chain), so one rename is one atomic change.
fn write_bundle(path: &Path, pair: &Pair) {
    rename_into(path, format!("{}{}", pair.key, pair.cert).as_bytes());
}

fn client_for(pair: &Pair) -> Arc<rustls::ClientConfig> {
    testkit::tls::no_resumption(&testkit::tls::client_config(&[&pair.cert], None))
}

fn static_acceptor(pair: &Pair) -> tokio_rustls::TlsAcceptor {
    let chain = vec![CertificateDer::from_pem_slice(pair.cert.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(pair.key.as_bytes()).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_protocol_versions(rustls::ALL_VERSIONS)
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(1024);
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

/// One full handshake over an in-memory duplex; `accept` is the server side under test.
async fn handshake<F, Fut>(client: &Arc<rustls::ClientConfig>, accept: F)
where
    F: FnOnce(tokio::io::DuplexStream) -> Fut,
    Fut: std::future::Future<
            Output = std::io::Result<tokio_rustls::server::TlsStream<tokio::io::DuplexStream>>,
        >,
{
    let (c, s) = tokio::io::duplex(64 * 1024);
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(client));
    let name = ServerName::try_from("localhost").unwrap();
    let (client, server) = tokio::join!(connector.connect(name, c), accept(s));
    client.unwrap();
    server.unwrap();
}

/// A set that reloads only when asked (no watch traffic), so each `reload()` is exactly one pass.
fn start_polled(rt: &Runtime, bundle: &Path) -> ServingSet {
    rt.block_on(
        ServingSet::builder(CertKeyPaths::bundle(bundle))
            .poll_only(true)
            .poll_interval(Duration::from_secs(3600))
            .start(),
    )
    .unwrap()
}

fn handshakes(c: &mut Criterion) {
    let rt = Runtime::new().unwrap();
    let f = handshake_fixture(&rt);
    let (reloading, fixed, client) = (&f.reloading, &f.fixed, &f.client);
    let mut group = c.benchmark_group("handshake");
    // One after the other: for the ratio, see `interleaved_handshakes`.
    group.bench_function("static", |b| {
        b.iter(|| rt.block_on(handshake(client, |s| fixed.accept(s))))
    });
    group.bench_function("reloading", |b| {
        b.iter(|| rt.block_on(handshake(client, |s| reloading.accept(s))))
    });
    group.finish();
}

/// Everything both handshake measurements need: a started set and its acceptor, the static
/// acceptor on the same pair, a client that trusts it.
struct HandshakeFixture {
    _dir: tempfile::TempDir,
    _set: ServingSet,
    reloading: reload_lib::Acceptor,
    fixed: tokio_rustls::TlsAcceptor,
    client: Arc<rustls::ClientConfig>,
}

fn handshake_fixture(rt: &Runtime) -> HandshakeFixture {
    let dir = tempfile::tempdir().unwrap();
    let pair = pair(false);
    let bundle = dir.path().join("credential.pem");
    write_bundle(&bundle, &pair);
    let set = rt
        .block_on(ServingSet::builder(CertKeyPaths::bundle(&bundle)).start())
        .unwrap();
    HandshakeFixture {
        reloading: set.acceptor(),
        fixed: static_acceptor(&pair),
        client: client_for(&pair),
        _set: set,
        _dir: dir,
    }
}

/// CPU time of the calling thread (`/proc/thread-self/schedstat`: nanoseconds on a CPU): unlike
/// wall time, it stops while the thread waits for a core.
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    let ns: u64 = stat.split_whitespace().next().unwrap().parse().unwrap();
    Duration::from_nanos(ns)
}

/// `n` handshakes through one side; thread CPU time and wall time they took. The runtime is a
/// current-thread one, so client, server and the duplex run on this thread: its CPU clock is
/// the whole cost.
fn timed_handshakes(
    rt: &Runtime,
    f: &HandshakeFixture,
    reloading: bool,
    n: u32,
) -> (Duration, Duration) {
    let (cpu0, wall0) = (thread_cpu(), Instant::now());
    for _ in 0..n {
        if reloading {
            rt.block_on(handshake(&f.client, |s| f.reloading.accept(s)));
        } else {
            rt.block_on(handshake(&f.client, |s| f.fixed.accept(s)));
        }
    }
    (thread_cpu() - cpu0, wall0.elapsed())
}

/// Rounds of `K` handshakes per side, alternating which side goes first, and the per-round
/// reloading/static ratio: both sides see the same machine within a fraction of a second.
fn interleaved_handshakes() {
    const ROUNDS: u32 = 40;
    const K: u32 = 50;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let f = handshake_fixture(&rt);
    timed_handshakes(&rt, &f, false, K);
    timed_handshakes(&rt, &f, true, K);
    let (mut cpu_ratios, mut wall_ratios) = (Vec::new(), Vec::new());
    let (mut cpu_static, mut cpu_reloading) = (Duration::ZERO, Duration::ZERO);
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        let mut got = [(Duration::ZERO, Duration::ZERO); 2];
        for reloading in order {
            got[usize::from(reloading)] = timed_handshakes(&rt, &f, reloading, K);
        }
        let [(s_cpu, s_wall), (r_cpu, r_wall)] = got;
        cpu_ratios.push(r_cpu.as_secs_f64() / s_cpu.as_secs_f64());
        wall_ratios.push(r_wall.as_secs_f64() / s_wall.as_secs_f64());
        cpu_static += s_cpu;
        cpu_reloading += r_cpu;
    }
    let spread = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        format!(
            "{:.4} (min {:.4}, max {:.4})",
            v[v.len() / 2],
            v[0],
            v[v.len() - 1]
        )
    };
    let n = ROUNDS * K;
    println!(
        "interleaved handshake/reloading vs handshake/static, {ROUNDS} rounds x {K} per side: \
         thread CPU per handshake {:?} vs {:?}, ratio per round median {}; wall ratio median {}",
        cpu_reloading / n,
        cpu_static / n,
        spread(&mut cpu_ratios),
        spread(&mut wall_ratios)
    );
}

/// `RELOAD_BENCH_ONLY=static:N` or `reloading:N`: the common setup, then N handshakes of one
/// side; `pass-ecdsa:N`, `pass-rsa:N`, `rename-ecdsa:N`, `rename-rsa:N`: N reload passes.
fn only_one_side(spec: &str) {
    let (side, n) = spec
        .split_once(':')
        .expect("RELOAD_BENCH_ONLY=static:N or reloading:N");
    let n: u32 = n.parse().expect("RELOAD_BENCH_ONLY: N must be a number");
    let reloading = match side {
        "static" => false,
        "reloading" => true,
        "pass-ecdsa" | "pass-rsa" | "rename-ecdsa" | "rename-rsa" => {
            return only_passes(side.starts_with("rename"), side.ends_with("rsa"), n);
        }
        _ => panic!("RELOAD_BENCH_ONLY: side must be static, reloading, pass-* or rename-*"),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let f = handshake_fixture(&rt);
    timed_handshakes(&rt, &f, reloading, n);
}

/// N publishing passes, after the same setup for any N: explicit reloads of a polled set, or
/// renames through inotify awaited until published.
fn only_passes(through_inotify: bool, rsa: bool, n: u32) {
    let rt = Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pairs = [pair(rsa), pair(rsa)];
    let bundle = dir.path().join("credential.pem");
    write_bundle(&bundle, &pairs[0]);
    if through_inotify {
        let set = rt
            .block_on(ServingSet::builder(CertKeyPaths::bundle(&bundle)).start())
            .unwrap();
        let mut rx = set.subscribe();
        for i in 1..=n {
            let target = set.status().generation + 1;
            write_bundle(&bundle, &pairs[(i % 2) as usize]);
            testkit::wait::block_until_generation(&rt, &mut rx, target);
        }
    } else {
        let set = start_polled(&rt, &bundle);
        for i in 1..=n {
            write_bundle(&bundle, &pairs[(i % 2) as usize]);
            assert!(rt.block_on(set.reload()).unwrap());
        }
    }
}

fn reloads(c: &mut Criterion) {
    let rt = Runtime::new().unwrap();
    let mut group = c.benchmark_group("reload");
    for (name, rsa) in [("ecdsa-p256", false), ("rsa-2048", true)] {
        let dir = tempfile::tempdir().unwrap();
        let pairs = [pair(rsa), pair(rsa)];
        let bundle = dir.path().join("credential.pem");
        write_bundle(&bundle, &pairs[0]);
        // No watch traffic: only explicit reloads, so each iteration is exactly one pass.
        let set = start_polled(&rt, &bundle);
        let mut i = 0usize;
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    i += 1;
                    write_bundle(&bundle, &pairs[i % 2]);
                    let start = Instant::now();
                    assert!(rt.block_on(set.reload()).unwrap());
                    total += start.elapsed();
                }
                total
            })
        });
    }
    group.finish();
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

/// p50/p99 of a reload pass and of rename → published, printed as one line each.
fn percentiles() {
    let rt = Runtime::new().unwrap();
    for (name, rsa) in [("ecdsa-p256", false), ("rsa-2048", true)] {
        let dir = tempfile::tempdir().unwrap();
        let pairs = [pair(rsa), pair(rsa)];
        let bundle = dir.path().join("credential.pem");
        write_bundle(&bundle, &pairs[0]);
        let polled = start_polled(&rt, &bundle);
        let (mut round_trips, mut work) = (Vec::new(), Vec::new());
        for i in 1..=1000 {
            write_bundle(&bundle, &pairs[i % 2]);
            let start = Instant::now();
            assert!(rt.block_on(polled.reload()).unwrap());
            round_trips.push(start.elapsed());
            work.push(polled.status().last_reload_duration);
        }
        println!(
            "percentiles reload-pass/{name}: p50 {:?} p99 {:?} (n=1000; read, parse, check, build, publish)",
            percentile(&mut work, 0.5),
            percentile(&mut work, 0.99)
        );
        println!(
            "percentiles reload-call/{name}: p50 {:?} p99 {:?} (n=1000; ServingSet::reload round trip to the reload task)",
            percentile(&mut round_trips, 0.5),
            percentile(&mut round_trips, 0.99)
        );
        drop(polled);

        let watched = rt
            .block_on(ServingSet::builder(CertKeyPaths::bundle(&bundle)).start())
            .unwrap();
        let mut rx = watched.subscribe();
        let mut samples = Vec::new();
        for i in 1..=1000u64 {
            let target = watched.status().generation + 1;
            let start = Instant::now();
            write_bundle(&bundle, &pairs[(i % 2) as usize]);
            testkit::wait::block_until_generation(&rt, &mut rx, target);
            samples.push(start.elapsed());
        }
        println!(
            "percentiles rename-to-published/{name}: p50 {:?} p99 {:?} (n=1000, includes the write)",
            percentile(&mut samples, 0.5),
            percentile(&mut samples, 0.99)
        );
    }
}

criterion_group!(benches, handshakes, reloads);

fn main() {
    if let Ok(spec) = std::env::var("RELOAD_BENCH_ONLY") {
        only_one_side(&spec);
        return;
    }
    // `cargo test --benches` / `--no-run` smoke runs pass `--bench` only when benchmarking.
    if std::env::args().any(|a| a == "--bench") {
        interleaved_handshakes();
        percentiles();
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
