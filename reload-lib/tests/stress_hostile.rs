//! The hostile-files stress run, bounded for CI (well under a minute): hostile files at every watched
//! path (certificate, key, client-CA bundle, CRL) — FIFOs, `/dev/zero`, directories, 100 MiB
//! files, one-line keys, DER/garbage/empty CRLs — while clients keep handshaking. Must show: no
//! hang (every rejection and every handshake within a bound), bounded RSS, no fail-open (a
//! revoked client never gets in, an anonymous one always sees a good certificate), and the next
//! good write is always served. Figures are printed (`--nocapture`).

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use reload_lib::{CertKeyPaths, ClientAuth, ServingSet};

const BOUND: Duration = Duration::from_secs(10);
/// Passes over every path and kind (each pass is about a second on a quiet machine).
const ROUNDS: usize = 5;

fn vm_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Replaces whatever is at `path` by a hostile thing.
fn install(path: &Path, kind: &str, huge: &Path, one_line_key: &str) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        std::fs::remove_dir(path).unwrap();
    } else {
        let _ = std::fs::remove_file(path);
    }
    match kind {
        "fifo" => assert!(
            std::process::Command::new("mkfifo")
                .arg(path)
                .status()
                .unwrap()
                .success()
        ),
        "/dev/zero" => std::os::unix::fs::symlink("/dev/zero", path).unwrap(),
        "directory" => std::fs::create_dir(path).unwrap(),
        "100 MiB" => std::os::unix::fs::symlink(huge, path).unwrap(),
        "one-line key" => std::fs::write(path, one_line_key).unwrap(),
        "empty" => std::fs::write(path, "").unwrap(),
        "garbage" => std::fs::write(path, b"<html>502 Bad Gateway</html>\n").unwrap(),
        "DER garbage" => std::fs::write(path, [0x30, 0x82, 0x01, 0x00, 0x02]).unwrap(),
        other => panic!("unknown kind {other}"),
    }
}

/// Puts good bytes back at `path` (by rename, as writers do).
fn restore(path: &Path, bytes: &[u8]) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        std::fs::remove_dir(path).unwrap();
    }
    rename_into(path, bytes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_files_at_every_watched_path_never_hang_bloat_or_fail_open() {
    let started = Instant::now();
    let (server_ca, client_ca) = (Ca::new("server-ca"), Ca::new("client-ca"));
    let tmp = tempfile::tempdir().unwrap();
    let huge = tmp.path().join("huge.bin");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    let tls = tmp.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    let (crt, key) = (tls.join("tls.crt"), tls.join("tls.key"));
    let (bundle, crl) = (
        tmp.path().join("client-ca.crt"),
        tmp.path().join("client-ca.crl"),
    );
    let mut good = server_ca.leaf(&["localhost"], 30);
    rename_into(&key, good.key_pem.as_bytes());
    rename_into(&crt, good.cert_pem.as_bytes());
    rename_into(&bundle, client_ca.cert_pem.as_bytes());
    let alice = client_ca.client("alice");
    let crl_pem = client_ca.crl(&[alice.serial_number]);
    rename_into(&crl, crl_pem.as_bytes());
    let one_line_key = good.key_pem.replace('\n', " ");

    let set = ServingSet::builder(CertKeyPaths::new(&crt, &key))
        .client_ca(&bundle, ClientAuth::Optional)
        .client_crl(&crl)
        .resync_interval(Some(Duration::from_secs(2)))
        .start()
        .await
        .unwrap();
    let addr = echo_server(set.acceptor()).await;
    let anonymous = no_resumption(&client_config(&[&server_ca.cert_pem], None));
    let revoked = no_resumption(&client_config(&[&server_ca.cert_pem], Some(&alice)));

    // RSS sampler.
    let rss_before = vm_rss_kib();
    let rss_peak = Arc::new(AtomicU64::new(rss_before));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (Arc::clone(&rss_peak), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(vm_rss_kib(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    // Clients handshake all along: anonymous ones must always get in with a good certificate
    // (any serial the test served), the revoked one never.
    let served_serials = Arc::new(std::sync::Mutex::new(vec![good.serial.clone()]));
    let (handshakes, hangs, fail_open) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let clients = {
        let (handshakes, hangs, fail_open, stop, serials) = (
            Arc::clone(&handshakes),
            Arc::clone(&hangs),
            Arc::clone(&fail_open),
            Arc::clone(&stop),
            Arc::clone(&served_serials),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match tokio::time::timeout(BOUND, handshake(addr, "localhost", anonymous.clone()))
                    .await
                {
                    Err(_) => {
                        hangs.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Ok(seen)) => {
                        if !serials.lock().unwrap().contains(&seen.serial) {
                            fail_open.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(Err(err)) => panic!("an anonymous handshake failed: {err}"),
                }
                match tokio::time::timeout(BOUND, handshake(addr, "localhost", revoked.clone()))
                    .await
                {
                    Err(_) => {
                        hangs.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Ok(_)) => {
                        fail_open.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(Err(_)) => {}
                }
                handshakes.fetch_add(2, Ordering::Relaxed);
            }
        })
    };

    let kinds: &[(&Path, &[&str])] = &[
        (
            &crt,
            &[
                "fifo",
                "/dev/zero",
                "directory",
                "100 MiB",
                "one-line key",
                "empty",
                "garbage",
            ],
        ),
        (
            &key,
            &[
                "fifo",
                "/dev/zero",
                "directory",
                "100 MiB",
                "one-line key",
                "empty",
                "garbage",
            ],
        ),
        (
            &bundle,
            &[
                "fifo",
                "/dev/zero",
                "directory",
                "100 MiB",
                "empty",
                "garbage",
            ],
        ),
        (
            &crl,
            &[
                "fifo",
                "/dev/zero",
                "directory",
                "100 MiB",
                "empty",
                "garbage",
                "DER garbage",
            ],
        ),
    ];
    let mut rejections = 0;
    let mut rotations = 0;
    for (path, hostile) in kinds.iter().cycle().take(kinds.len() * ROUNDS) {
        for kind in *hostile {
            let before = set.status().reloads_failed;
            install(path, kind, &huge, &one_line_key);
            let mut rx = set.subscribe();
            tokio::time::timeout(BOUND, rx.wait_for(|s| s.reloads_failed > before))
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "{kind} at {} was not rejected within {BOUND:?}",
                        path.display()
                    )
                })
                .unwrap();
            rejections += 1;
            let error = set.status().last_error.unwrap().to_string();
            assert!(
                error.contains(path.file_name().unwrap().to_str().unwrap()),
                "{kind}: {error}"
            );
            // The next good write is served.
            let good_bytes: Vec<u8> = match path {
                p if *p == bundle => client_ca.cert_pem.clone().into_bytes(),
                p if *p == crl => {
                    if *kind == "garbage" {
                        // DER is a good CRL too.
                        client_ca.crl_der(&[alice.serial_number])
                    } else {
                        client_ca.crl(&[alice.serial_number]).into_bytes()
                    }
                }
                p if *p == key => good.key_pem.clone().into_bytes(),
                _ => good.cert_pem.clone().into_bytes(),
            };
            restore(path, &good_bytes);
            let next = server_ca.leaf(&["localhost"], 30);
            served_serials.lock().unwrap().push(next.serial.clone());
            rename_into(&key, next.key_pem.as_bytes());
            rename_into(&crt, next.cert_pem.as_bytes());
            tokio::time::timeout(
                BOUND,
                wait_for_serial(
                    addr,
                    "localhost",
                    &client_config(&[&server_ca.cert_pem], None),
                    &next.serial,
                ),
            )
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the good write after {kind} at {} was not served",
                    path.display()
                )
            });
            good = next;
            rotations += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    tokio::time::timeout(BOUND * 2, clients)
        .await
        .expect("the client loop hung")
        .unwrap();
    sampler.join().unwrap();
    let peak = rss_peak.load(Ordering::Relaxed);
    let growth_mib = peak.saturating_sub(rss_before) / 1024;
    println!(
        "stress: {rejections} hostile files rejected, {rotations} good writes served, {} handshakes, \
         {} hangs, {} fail-open, RSS {} MiB -> peak {} MiB (+{growth_mib} MiB), {:.1} s",
        handshakes.load(Ordering::Relaxed),
        hangs.load(Ordering::Relaxed),
        fail_open.load(Ordering::Relaxed),
        rss_before / 1024,
        peak / 1024,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(hangs.load(Ordering::Relaxed), 0, "hangs");
    assert_eq!(fail_open.load(Ordering::Relaxed), 0, "fail-open handshakes");
    assert!(handshakes.load(Ordering::Relaxed) > 0);
    assert!(growth_mib < 64, "RSS grew by {growth_mib} MiB");
}
