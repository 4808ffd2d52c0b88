//! `https-server` as a process: certificates rotated on disk under continuous handshake load, and
//! the polling fallback when inotify cannot be had.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use e2e::{Ca, Server, bin};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Clone, Copy)]
enum Writer {
    Rename,
    InPlace,
    Kubelet,
}

fn rename_into(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn write_pair(dir: &Path, writer: Writer, generation: u64, cert: &str, key: &str) {
    match writer {
        Writer::Rename => {
            rename_into(&dir.join("tls.crt"), cert.as_bytes());
            rename_into(&dir.join("tls.key"), key.as_bytes());
        }
        Writer::InPlace => {
            std::fs::write(dir.join("tls.crt"), cert).unwrap();
            std::fs::write(dir.join("tls.key"), key).unwrap();
        }
        Writer::Kubelet => {
            let ts = format!("..gen_{generation}");
            std::fs::create_dir(dir.join(&ts)).unwrap();
            std::fs::write(dir.join(&ts).join("tls.crt"), cert).unwrap();
            std::fs::write(dir.join(&ts).join("tls.key"), key).unwrap();
            let old = std::fs::read_link(dir.join("..data")).ok();
            std::os::unix::fs::symlink(&ts, dir.join("..data_tmp")).unwrap();
            std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
            for name in ["tls.crt", "tls.key"] {
                if std::fs::symlink_metadata(dir.join(name)).is_err() {
                    std::os::unix::fs::symlink(Path::new("..data").join(name), dir.join(name))
                        .unwrap();
                }
            }
            if let Some(old) = old {
                std::fs::remove_dir_all(dir.join(old)).unwrap();
            }
        }
    }
}

/// One full handshake and one `GET /`; returns the served serial.
async fn get(addr: SocketAddr, client: &Arc<rustls::ClientConfig>) -> Result<String, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(client));
    let mut tls = tokio::time::timeout(
        Duration::from_secs(5),
        connector.connect(ServerName::try_from("localhost").unwrap(), tcp),
    )
    .await
    .map_err(|_| "handshake timeout".to_owned())?
    .map_err(|e| format!("tls: {e}"))?;
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let serial = x509_parser::parse_x509_certificate(&leaf)
        .unwrap()
        .1
        .raw_serial_as_string()
        .replace(':', "");
    tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    if !response.starts_with(b"HTTP/1.1 200") {
        return Err(format!(
            "http: {}",
            String::from_utf8_lossy(&response)
                .lines()
                .next()
                .unwrap_or("")
        ));
    }
    Ok(serial.trim_start_matches('0').to_owned())
}

/// A `GET /` on an open keep-alive connection.
async fn get_keep_alive(tls: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>) -> bool {
    if tls
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .is_err()
    {
        return false;
    }
    // The body is "ok\n": read until the end of it.
    let mut response = Vec::new();
    let mut buf = [0u8; 1024];
    while !response.ends_with(b"\r\n\r\nok\n") {
        match tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => response.extend_from_slice(&buf[..n]),
            _ => return false,
        }
    }
    response.starts_with(b"HTTP/1.1 200")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotations_under_load_fail_no_handshake_and_keep_open_connections() {
    let ca = Ca::default();
    let client = ca.client_config();
    let tmp = tempfile::tempdir().unwrap();
    let mut generation = 0;
    let mut servers = Vec::new();
    for writer in [Writer::Rename, Writer::InPlace, Writer::Kubelet] {
        let dir = tmp.path().join(format!("{writer:?}"));
        std::fs::create_dir(&dir).unwrap();
        let (cert, key, _) = ca.localhost_leaf();
        generation += 1;
        write_pair(&dir, writer, generation, &cert, &key);
        let mut command = Command::new(bin("https-server"));
        command
            .args(["--listen", "127.0.0.1:0", "--cert"])
            .arg(dir.join("tls.crt"))
            .arg("--key")
            .arg(dir.join("tls.key"));
        servers.push((writer, dir, Server::start(command)));
    }

    for (writer, dir, server) in &servers {
        let addr = server.addr;
        let stop = Arc::new(AtomicBool::new(false));
        let (ok, failed) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(std::sync::Mutex::new(Vec::new())),
        );
        let mut load = Vec::new();
        for _ in 0..2 {
            let (stop, ok, failed, client) =
                (stop.clone(), ok.clone(), failed.clone(), client.clone());
            load.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match get(addr, &client).await {
                        Ok(_) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(reason) => {
                            failed.lock().unwrap().push(reason);
                            0
                        }
                    };
                }
            }));
        }
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut keep_alive = tokio_rustls::TlsConnector::from(client.clone())
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap();

        let mut settle = Vec::new();
        for _ in 0..100 {
            let (cert, key, serial) = ca.localhost_leaf();
            generation += 1;
            let written = Instant::now();
            write_pair(dir, *writer, generation, &cert, &key);
            loop {
                if get(addr, &client).await.ok().as_deref() == Some(serial.as_str()) {
                    break;
                }
                assert!(
                    written.elapsed() < Duration::from_secs(10),
                    "{writer:?}: serial {serial} not served"
                );
            }
            settle.push(written.elapsed());
            // Settled: every later handshake sees the new certificate.
            for _ in 0..3 {
                assert_eq!(
                    get(addr, &client).await.unwrap(),
                    serial,
                    "{writer:?}: older certificate served after settling"
                );
            }
            assert!(
                get_keep_alive(&mut keep_alive).await,
                "{writer:?}: keep-alive connection broke"
            );
        }
        stop.store(true, Ordering::Relaxed);
        for task in load {
            task.await.unwrap();
        }
        settle.sort();
        let failures = failed.lock().unwrap().clone();
        eprintln!(
            "{writer:?}: 100 rotations, {} background handshakes, {} failures, settle p50 {:?} max {:?}",
            ok.load(Ordering::Relaxed),
            failures.len(),
            settle[50],
            settle[99]
        );
        assert!(
            failures.is_empty(),
            "{writer:?}: failed handshakes: {failures:?}"
        );
        assert!(ok.load(Ordering::Relaxed) > 0);
    }
}

/// Runs as `nobody` so that exhausting that user's inotify instances does not disturb other
/// processes: a helper holds every instance the limit allows, then the server starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_inotify_instances_the_server_polls_and_still_rotates() {
    const NOBODY: u32 = 65534;
    if !nix_is_root() {
        eprintln!("skipped: needs root to run processes as nobody");
        return;
    }
    let ca = Ca::default();
    let client = ca.client_config();
    let tmp = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (cert, key, _) = ca.localhost_leaf();
    write_pair(tmp.path(), Writer::Rename, 1, &cert, &key);
    for name in ["tls.crt", "tls.key"] {
        std::fs::set_permissions(
            tmp.path().join(name),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
    }

    // Holds all of nobody's inotify instances until killed.
    let mut hog = Command::new("python3")
        .args([
            "-c",
            "import ctypes,sys,time\nlibc=ctypes.CDLL(None,use_errno=True)\nn=0\nwhile libc.inotify_init()>=0: n+=1\nprint('held',n,flush=True)\ntime.sleep(120)",
        ])
        .uid(NOBODY)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(hog.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("held"), "{line}");

    let mut command = Command::new(bin("https-server"));
    command
        .args(["--listen", "127.0.0.1:0", "--cert"])
        .arg(tmp.path().join("tls.crt"))
        .arg("--key")
        .arg(tmp.path().join("tls.key"))
        .uid(NOBODY);
    let server = Server::start(command);
    let (cert, key, serial) = ca.localhost_leaf();
    rename_into(&tmp.path().join("tls.key"), key.as_bytes());
    rename_into(&tmp.path().join("tls.crt"), cert.as_bytes());
    for name in ["tls.crt", "tls.key"] {
        std::fs::set_permissions(
            tmp.path().join(name),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
    }
    let start = Instant::now();
    while get(server.addr, &client).await.ok().as_deref() != Some(serial.as_str()) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "not rotated by polling within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = hog.kill();
    let _ = hog.wait();
    let log = server.stderr_text();
    assert!(log.contains("inotify is unavailable"), "{log}");
    assert!(log.contains("watching by polling"), "{log}");
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// `tls-load` for `secs` against `addr` (full handshakes): (handshakes, failures, reasons).
fn tls_load_slice(addr: SocketAddr, ca: &Path, secs: &str) -> (u64, u64, String) {
    let output = Command::new(bin("tls-load"))
        .args([
            "--connect",
            &addr.to_string(),
            "--server-name",
            "localhost",
            "--ca",
        ])
        .arg(ca)
        .args([
            "--duration",
            secs,
            "--concurrency",
            "2",
            "--no-resume",
            "--json",
        ])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("tls-load printed no JSON: {output:?}"));
    (
        report["handshakes"].as_u64().unwrap_or(0),
        report["failures"].as_u64().unwrap_or(0),
        report["failure_reasons"].to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_random_rewrites_per_writer_style_serve_no_torn_pair() {
    let ca = Ca::default();
    let tmp = tempfile::tempdir().unwrap();
    let ca_file = tmp.path().join("ca.crt");
    std::fs::write(&ca_file, &ca.cert_pem).unwrap();
    // A pool of pairs: any cert served with another entry's key would fail the handshake.
    let pool: Vec<(String, String, String)> = (0..16).map(|_| ca.localhost_leaf()).collect();
    let rewrites: u64 = std::env::var("E2E_REWRITES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
        | 1;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut generation = 0;
    for writer in [Writer::Rename, Writer::InPlace, Writer::Kubelet] {
        let dir = tmp.path().join(format!("{writer:?}"));
        std::fs::create_dir(&dir).unwrap();
        generation += 1;
        write_pair(&dir, writer, generation, &pool[0].0, &pool[0].1);
        let mut command = Command::new(bin("https-server"));
        command
            .args(["--listen", "127.0.0.1:0", "--cert"])
            .arg(dir.join("tls.crt"))
            .arg("--key")
            .arg(dir.join("tls.key"));
        let server = Server::start(command);
        let addr = server.addr;

        // Load in back-to-back slices on a thread, for as long as the rewrites run.
        let stop = Arc::new(AtomicBool::new(false));
        let load = {
            let (stop, ca_file) = (stop.clone(), ca_file.clone());
            std::thread::spawn(move || {
                let (mut handshakes, mut failures, mut reasons) = (0, 0, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    let (h, f, r) = tls_load_slice(addr, &ca_file, "1");
                    handshakes += h;
                    failures += f;
                    if f > 0 {
                        reasons.push(r);
                    }
                }
                (handshakes, failures, reasons)
            })
        };
        let started = Instant::now();
        let mut last = 0;
        for _ in 0..rewrites {
            let pick = (next() % pool.len() as u64) as usize;
            let (cert, key, _) = &pool[pick];
            generation += 1;
            match writer {
                // Either order: a reader may see the new cert with the old key or the reverse.
                Writer::Rename if next() % 2 == 0 => {
                    rename_into(&dir.join("tls.key"), key.as_bytes());
                    rename_into(&dir.join("tls.crt"), cert.as_bytes());
                }
                Writer::InPlace if next() % 2 == 0 => {
                    std::fs::write(dir.join("tls.key"), key).unwrap();
                    std::fs::write(dir.join("tls.crt"), cert).unwrap();
                }
                _ => write_pair(&dir, writer, generation, cert, key),
            }
            last = pick;
            if next() % 8 == 0 {
                std::thread::sleep(Duration::from_micros(next() % 2000));
            }
        }
        let rewriting = started.elapsed();
        // The last pair written is what settles.
        let client = ca.client_config();
        let want = &pool[last].2;
        let settle = Instant::now();
        while get(addr, &client).await.ok().as_ref() != Some(want) {
            assert!(
                settle.elapsed() < Duration::from_secs(10),
                "{writer:?}: the last pair is not served"
            );
        }
        stop.store(true, Ordering::Relaxed);
        let (handshakes, failures, reasons) = load.join().unwrap();
        eprintln!(
            "{writer:?}: {rewrites} rewrites in {rewriting:?}; {handshakes} full handshakes meanwhile, {failures} failed"
        );
        assert!(handshakes > 100, "{writer:?}: too little load to judge");
        assert_eq!(failures, 0, "{writer:?}: failed handshakes: {reasons:?}");
    }
}
