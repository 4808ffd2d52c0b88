//! Many rotations against one watched `ServingSet`: resident memory must stay flat, and what a
//! rotation costs the reload side (passes, CPU) is reported next to what one pass costs.
//!
//! Run with `cargo bench -p reload-lib --bench rotations` (100,000 rotations of a bundle file,
//! each a freshly generated ECDSA P-256 certificate and key, so nothing keyed by certificate can
//! hide in a cache of two), or with `-- --rotations N --warm-up N --bound-kib N` and `--pair`
//! (certificate and key in two files, renamed one after the other: two inotify events per
//! rotation) and `--pool N` (N pairs generated up front and cycled, so the writer's key
//! generation does not run during the measurement). Each rotation is a real `rename(2)` into the watched directory and waits until the
//! set published the new generation, so it goes through inotify, the reload task and the
//! publication like production rotations do.
//!
//! Exit status: 0 when RSS after the warm-up grew by at most `--bound-kib` (default 1 MiB over
//! the rest of the run), a panic (non-zero) otherwise. `cargo test --benches` runs 200
//! rotations as a smoke test, without the bound.

use std::time::{Duration, Instant};

use reload_lib::{CertKeyPaths, ServingSet};
use testkit::files::rename_into;
use testkit::pki::CertSpec;
use tokio::runtime::Runtime;

struct Options {
    rotations: u64,
    warm_up: u64,
    bound_kib: u64,
    pair: bool,
    /// Distinct pairs generated before the run and cycled (0: a fresh pair every rotation).
    pool: u64,
    smoke: bool,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|v| {
                v.parse::<u64>()
                    .unwrap_or_else(|_| panic!("{name}: not a number: {v}"))
            })
    };
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: a short smoke run then.
    let smoke = !args.iter().any(|a| a == "--bench");
    let rotations = value("--rotations").unwrap_or(if smoke { 200 } else { 100_000 });
    Options {
        rotations,
        warm_up: value("--warm-up").unwrap_or(rotations / 10),
        bound_kib: value("--bound-kib").unwrap_or(1024),
        pair: args.iter().any(|a| a == "--pair"),
        pool: value("--pool").unwrap_or(0),
        smoke,
    }
}

/// A fresh self-signed ECDSA P-256 certificate and key for `localhost`: (cert PEM, key PEM).
fn fresh_pair() -> (String, String) {
    let issued = testkit::pki::self_signed(&CertSpec::server(&["localhost"]).days(30));
    (issued.cert_pem, issued.key_pem)
}

/// Resident set size of this process, in KiB (`VmRSS` of `/proc/self/status`).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// CPU time of every thread of this process except the main one, which writes the files and
/// generates the keys: what is left is the reload side (tokio workers running the watcher and
/// the reload task). From `/proc/self/task/*/schedstat` (nanoseconds on a CPU).
fn reload_side_cpu() -> Duration {
    let main = std::process::id().to_string();
    let mut ns = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let task = task.unwrap();
        if task.file_name().to_string_lossy() == main {
            continue;
        }
        // A thread that exited between the listing and the read counts no more.
        if let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) {
            ns += stat
                .split_whitespace()
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap();
        }
    }
    Duration::from_nanos(ns)
}

/// Per thread of this process but the main one (see [`reload_side_cpu`]): its name, CPU time
/// and how many times it was switched in (`/proc/self/task/*/schedstat`: ns on a CPU, ns
/// waiting, timeslices), keyed by thread id.
fn threads() -> std::collections::BTreeMap<String, (String, Duration, u64)> {
    let main = std::process::id().to_string();
    let mut threads = std::collections::BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let task = task.unwrap();
        let tid = task.file_name().to_string_lossy().into_owned();
        if tid == main {
            continue;
        }
        let (Ok(name), Ok(stat)) = (
            std::fs::read_to_string(task.path().join("comm")),
            std::fs::read_to_string(task.path().join("schedstat")),
        ) else {
            continue;
        };
        let fields: Vec<u64> = stat
            .split_whitespace()
            .map(|f| f.parse().unwrap())
            .collect();
        threads.insert(
            tid,
            (
                name.trim().to_owned(),
                Duration::from_nanos(fields[0]),
                fields[2],
            ),
        );
    }
    threads
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let o = options();
    let rt = Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (crt, key, bundle) = (
        dir.path().join("tls.crt"),
        dir.path().join("tls.key"),
        dir.path().join("tls.pem"),
    );
    let write = |(cert, key_pem): &(String, String)| {
        if o.pair {
            rename_into(&crt, cert.as_bytes());
            rename_into(&key, key_pem.as_bytes());
        } else {
            rename_into(&bundle, format!("{key_pem}{cert}").as_bytes());
        }
    };
    write(&fresh_pair());
    let paths = if o.pair {
        CertKeyPaths::new(&crt, &key)
    } else {
        CertKeyPaths::bundle(&bundle)
    };
    let set = rt.block_on(ServingSet::builder(paths).start()).unwrap();
    let mut rx = set.subscribe();
    let what = if o.pair {
        "cert and key files, two renames"
    } else {
        "one bundle file, one rename"
    };
    println!(
        "rotations: {} ({what}), warm-up {}, RSS bound {} KiB after the warm-up",
        o.rotations, o.warm_up, o.bound_kib
    );

    // Samples go into memory allocated and touched before the first RSS reading: growing vectors
    // here would be the bench's own growth (32 bytes per rotation), not the library's.
    let measured = usize::try_from(o.rotations - o.warm_up.min(o.rotations)).unwrap();
    let (mut passes, mut round_trips) = (
        vec![Duration::ZERO; measured],
        vec![Duration::ZERO; measured],
    );
    let (mut rss_after_warm_up, mut cpu_after_warm_up) = (rss_kib(), reload_side_cpu());
    let mut threads_after_warm_up = threads();
    let mut status_after_warm_up = set.status();
    let rss_start = rss_kib();
    let started = Instant::now();
    let checkpoint = (o.rotations / 10).max(1);
    let pool: Vec<_> = (0..o.pool).map(|_| fresh_pair()).collect();
    for i in 1..=o.rotations {
        let pair = if pool.is_empty() {
            fresh_pair()
        } else {
            pool[usize::try_from(i % o.pool).unwrap()].clone()
        };
        let target = set.status().generation + 1;
        let start = Instant::now();
        write(&pair);
        testkit::wait::block_until_generation(&rt, &mut rx, target);
        if i > o.warm_up {
            let sample = usize::try_from(i - o.warm_up - 1).unwrap();
            round_trips[sample] = start.elapsed();
            passes[sample] = set.status().last_reload_duration;
        }
        if i == o.warm_up {
            // Before the RSS reading: the map is the bench's own allocation.
            threads_after_warm_up = threads();
            rss_after_warm_up = rss_kib();
            cpu_after_warm_up = reload_side_cpu();
            status_after_warm_up = set.status();
        }
        if i % checkpoint == 0 {
            println!(
                "  after {i:>7} rotations: RSS {} KiB ({:+} KiB since start), {:.1} s",
                rss_kib(),
                rss_kib() as i64 - rss_start as i64,
                started.elapsed().as_secs_f64()
            );
        }
    }
    // Before anything below allocates (sorting the samples would: 1.4 MB for 90,000).
    let rss_end = rss_kib();
    // Let a retry or late event settle before reading the counters.
    std::thread::sleep(Duration::from_millis(200));
    let measured = measured as u64;
    let status = set.status();
    let cpu = reload_side_cpu() - cpu_after_warm_up;
    // CPU and switches-in per rotation by thread name (tokio's workers share one).
    let mut by_name = std::collections::BTreeMap::<String, (Duration, u64)>::new();
    for (tid, (name, cpu, switches)) in threads() {
        let (cpu0, switches0) = threads_after_warm_up
            .get(&tid)
            .map_or((Duration::ZERO, 0), |(_, cpu, switches)| (*cpu, *switches));
        let entry = by_name.entry(name).or_default();
        entry.0 += cpu - cpu0;
        entry.1 += switches - switches0;
    }
    passes.sort_unstable();
    round_trips.sort_unstable();
    let ok = status.reloads_ok - status_after_warm_up.reloads_ok;
    let failed = status.reloads_failed - status_after_warm_up.reloads_failed;
    let growth = rss_end as i64 - rss_after_warm_up as i64;
    println!(
        "after the warm-up, {measured} rotations: published passes {ok} ({:.2} per rotation), \
         rejected passes {failed} ({:.2} per rotation)",
        ok as f64 / measured.max(1) as f64,
        failed as f64 / measured.max(1) as f64
    );
    if !passes.is_empty() {
        println!(
            "  publishing pass p50 {:?} p99 {:?}; rename -> published p50 {:?} p99 {:?}",
            percentile(&passes, 0.5),
            percentile(&passes, 0.99),
            percentile(&round_trips, 0.5),
            percentile(&round_trips, 0.99)
        );
        let per_rotation = cpu / u32::try_from(measured.max(1)).unwrap_or(u32::MAX);
        println!(
            "  reload-side CPU {:?} per rotation (all threads but the writer's) = {:.1}x the \
             pass p50",
            per_rotation,
            per_rotation.as_secs_f64() / percentile(&passes, 0.5).as_secs_f64()
        );
        for (name, (cpu, switches)) in &by_name {
            if *switches > 0 {
                println!(
                    "    {name}: {:?} CPU and {:.2} switches-in per rotation",
                    *cpu / u32::try_from(measured.max(1)).unwrap_or(u32::MAX),
                    *switches as f64 / measured.max(1) as f64
                );
            }
        }
    }
    println!(
        "RSS: start {rss_start} KiB, after the warm-up {rss_after_warm_up} KiB, end {rss_end} \
         KiB: {growth:+} KiB over {measured} rotations ({:.2} bytes per rotation)",
        growth as f64 * 1024.0 / measured.max(1) as f64
    );
    assert_eq!(status.served.len(), 1, "one pair served");
    if !o.smoke {
        assert!(
            growth <= o.bound_kib as i64,
            "RSS grew by {growth} KiB after the warm-up, over the bound of {} KiB",
            o.bound_kib
        );
    }
}
