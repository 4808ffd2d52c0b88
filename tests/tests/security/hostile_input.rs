//! Hostile or careless input to `cert-syncer`: servers that are not what they claim
//! (plain HTTP, mute), kubeconfigs that break, and special files where the token and the CA
//! should be. Each case runs the binary as a process against real sockets and asserts the exit
//! code, the message and what reached the socket; none may hang.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e::{Ca, CertSpec, bin_path};

/// What a finished (or killed) process left.
#[derive(Debug)]
struct Outcome {
    /// Exit code; `None` when it was still running at the limit (then killed).
    code: Option<i32>,
    stderr: String,
}

/// Runs `command` for at most `limit`.
fn run(mut command: Command, limit: Duration) -> Outcome {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cert-syncer starts");
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + limit;
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Outcome {
        code,
        stderr: reader.join().unwrap(),
    }
}

fn syncer(args: &[&str]) -> Command {
    let mut command = Command::new(bin_path("cert-syncer"));
    command.args(args).env("RUST_LOG", "info");
    command
}

const TOKEN: &str = "s3cr3t-e2e-token-that-must-never-travel-in-clear-0123456789abcdef";

/// A CA file and a 0600 token file in `dir`.
fn credentials(dir: &Path) -> (PathBuf, PathBuf) {
    let ca = dir.join("ca.crt");
    std::fs::write(&ca, Ca::default().cert_pem).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, TOKEN).unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    (ca, token)
}

/// A plain-HTTP impostor: records the request head of every connection, answers 500.
fn impostor() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            sink.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&head).into_owned());
            let _ = stream.write_all(
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
        }
    });
    (addr, seen)
}

fn kubeconfig(server: &str, token_line: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: {server}\n  name: c\n\
         users:\n- name: u\n  user:\n{token_line}\ncontexts:\n- context: {{cluster: c, user: u}}\n  \
         name: x\ncurrent-context: x\n"
    )
}

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn plain_http_servers_are_refused_and_never_see_a_token() {
    let tmp = tempfile::tempdir().unwrap();
    let (ca, token) = credentials(tmp.path());
    let (addr, seen) = impostor();
    let url = format!("http://{addr}");
    let dest = tmp.path().join("dest");
    let sync_flags = |extra: &[&str]| {
        let mut args = vec![
            "sync",
            "--namespace",
            "ns",
            "--secrets",
            "serving-cert",
            "--destination-dir",
            dest.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        args.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()
    };
    let ca = ca.to_str().unwrap();
    let token = token.to_str().unwrap();

    // --server http:// with a CA and a token: refused before any connection.
    let args = sync_flags(&["--server", &url, "--ca-file", ca, "--token-file", token]);
    let outcome = run(
        syncer(&args.iter().map(String::as_str).collect::<Vec<_>>()),
        LIMIT,
    );
    assert_eq!(outcome.code, Some(2), "{outcome:?}");
    assert!(
        outcome.stderr.contains("refusing server") && outcome.stderr.contains("https"),
        "{outcome:?}"
    );

    // The same through a kubeconfig with an inline token.
    let config = tmp.path().join("kubeconfig");
    std::fs::write(&config, kubeconfig(&url, &format!("    token: {TOKEN}"))).unwrap();
    let args = sync_flags(&["--kubeconfig", config.to_str().unwrap()]);
    let outcome = run(
        syncer(&args.iter().map(String::as_str).collect::<Vec<_>>()),
        LIMIT,
    );
    assert_eq!(outcome.code, Some(2), "{outcome:?}");
    assert!(outcome.stderr.contains("refusing server"), "{outcome:?}");

    // --insecure-plain-http does not make a token acceptable.
    for extra in [
        vec![
            "--server",
            &url,
            "--token-file",
            token,
            "--insecure-plain-http",
        ],
        vec![
            "--kubeconfig",
            config.to_str().unwrap(),
            "--insecure-plain-http",
        ],
        vec!["--server", &url, "--ca-file", ca, "--insecure-plain-http"],
    ] {
        let args = sync_flags(&extra);
        let outcome = run(
            syncer(&args.iter().map(String::as_str).collect::<Vec<_>>()),
            LIMIT,
        );
        assert_eq!(outcome.code, Some(2), "{extra:?}: {outcome:?}");
        assert!(
            outcome.stderr.contains("never sent in clear text"),
            "{extra:?}: {outcome:?}"
        );
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "a refused configuration still connected: {:?}",
        seen.lock().unwrap()
    );

    // With the flag and no credentials it connects (a loud warning), without Authorization.
    let outcome = run(
        syncer(&[
            "inspect",
            "--namespace",
            "ns",
            "--server",
            &url,
            "--insecure-plain-http",
        ]),
        LIMIT,
    );
    assert_eq!(
        outcome.code,
        Some(1),
        "the impostor answers 500: {outcome:?}"
    );
    assert!(outcome.stderr.contains("INSECURE"), "{outcome:?}");
    let requests = seen.lock().unwrap().clone();
    assert!(!requests.is_empty(), "no request reached the server");
    for request in &requests {
        assert!(
            !request.to_ascii_lowercase().contains("authorization") && !request.contains(TOKEN),
            "{request}"
        );
    }
    std::fs::remove_dir_all(&dest).ok();
}

#[test]
fn kubeconfig_errors_never_print_the_token_and_a_newline_in_it_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("dest");
    let config = tmp.path().join("kubeconfig");
    // A syntax error on the line after the token: the parser's snippet shows both lines.
    let broken = kubeconfig(
        "https://127.0.0.1:1",
        &format!("    token: {TOKEN}\n   bad: [x"),
    );
    std::fs::write(&config, broken).unwrap();
    let args = [
        "sync",
        "--kubeconfig",
        config.to_str().unwrap(),
        "--namespace",
        "ns",
        "--secrets",
        "a",
        "--destination-dir",
        dest.to_str().unwrap(),
    ];
    let outcome = run(syncer(&args), LIMIT);
    assert_eq!(outcome.code, Some(2), "{outcome:?}");
    assert!(
        outcome.stderr.contains("cannot parse kubeconfig") && outcome.stderr.contains("line 11"),
        "{outcome:?}"
    );
    assert!(
        !outcome.stderr.contains(&TOKEN[..24]),
        "token printed: {outcome:?}"
    );

    // An inline token with a newline: a clear error, not a panic (exit 101).
    let newline = kubeconfig(
        "https://127.0.0.1:1",
        &format!("    token: \"{}\\n{}\"", &TOKEN[..30], &TOKEN[30..]),
    );
    std::fs::write(&config, newline).unwrap();
    let outcome = run(syncer(&args), LIMIT);
    assert_eq!(outcome.code, Some(2), "{outcome:?}");
    assert!(outcome.stderr.contains("token"), "{outcome:?}");
    assert!(
        !outcome.stderr.contains(&TOKEN[..24]),
        "token printed: {outcome:?}"
    );
}

#[test]
fn fifos_as_token_file_or_ca_file_are_refused_at_start_up() {
    let tmp = tempfile::tempdir().unwrap();
    let (ca, token) = credentials(tmp.path());
    let fifo = tmp.path().join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let dest = tmp.path().join("dest");
    let fifo = fifo.to_str().unwrap();
    for (ca, token) in [
        (fifo, token.to_str().unwrap()),
        (ca.to_str().unwrap(), fifo),
    ] {
        let outcome = run(
            syncer(&[
                "sync",
                "--server",
                "https://127.0.0.1:1",
                "--ca-file",
                ca,
                "--token-file",
                token,
                "--namespace",
                "ns",
                "--secrets",
                "a",
                "--destination-dir",
                dest.to_str().unwrap(),
            ]),
            LIMIT,
        );
        assert_eq!(outcome.code, Some(2), "{outcome:?}");
        assert!(
            outcome.stderr.contains("a FIFO") && outcome.stderr.contains(fifo),
            "{outcome:?}"
        );
    }
}

/// Accepts connections and never sends a byte (holds them open).
fn mute_tcp() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held: Vec<TcpStream> = Vec::new();
        for stream in listener.incoming() {
            match stream {
                Ok(stream) => held.push(stream),
                Err(_) => return,
            }
        }
    });
    addr
}

/// Completes the TLS handshake (certificate for `localhost`), then never answers.
fn mute_tls(ca: &mut Ca) -> String {
    e2e::install_crypto_provider();
    let issued = ca.issue(&CertSpec::server(&["localhost"]));
    use rustls_pki_types::pem::PemObject;
    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut conn = rustls::ServerConnection::new(Arc::clone(&config)).unwrap();
            while conn.is_handshaking() {
                if conn.complete_io(&mut stream).is_err() {
                    break;
                }
            }
            held.push((conn, stream));
        }
    });
    addr
}

const ROTATION: &str = r#"
namespace: ns
signers:
  - { name: serving-signer, validity: 30d, refresh: 15d }
bundles:
  - { name: serving-ca, signers: [serving-signer] }
targets:
  - name: serving-cert
    signer: serving-signer
    serving: { hostnames: [localhost] }
    validity: 10d
    refresh: 5d
"#;

#[test]
fn a_mute_server_is_an_error_for_one_shot_jobs_and_a_logged_retry_for_sync() {
    let tmp = tempfile::tempdir().unwrap();
    let (ca_file, token) = credentials(tmp.path());
    let config = tmp.path().join("rotation.yaml");
    std::fs::write(&config, ROTATION).unwrap();
    let mute = mute_tcp();
    let mut ca = Ca::default();
    std::fs::write(&ca_file, &ca.cert_pem).unwrap();
    let silent_after_handshake = mute_tls(&mut ca);
    let connection = |addr: &str| -> Vec<String> {
        [
            "--server",
            &format!("https://{addr}"),
            "--tls-server-name-override",
            "localhost",
            "--ca-file",
            ca_file.to_str().unwrap(),
            "--token-file",
            token.to_str().unwrap(),
            "--connect-timeout",
            "2s",
            "--read-idle-timeout",
            "3s",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    };
    for addr in [&mute, &silent_after_handshake] {
        // One-shot jobs: an error exit, well before the test's limit.
        let mut inspect = syncer(&["inspect", "--namespace", "ns"]);
        inspect.args(connection(addr));
        let started = Instant::now();
        let outcome = run(inspect, LIMIT);
        assert_eq!(outcome.code, Some(1), "inspect against {addr}: {outcome:?}");
        assert!(started.elapsed() < Duration::from_secs(25));
        assert!(outcome.stderr.contains("cannot list"), "{outcome:?}");

        let mut regenerate = syncer(&["regenerate", "--once", "--config"]);
        regenerate.arg(&config).args(connection(addr));
        let outcome = run(regenerate, LIMIT);
        assert_eq!(
            outcome.code,
            Some(1),
            "regenerate against {addr}: {outcome:?}"
        );
        assert!(outcome.stderr.contains("cannot read"), "{outcome:?}");

        // The long-running job logs each failure and retries.
        let mut sync = syncer(&["sync", "--namespace", "ns", "--secrets", "serving-cert"]);
        sync.arg("--destination-dir")
            .arg(tmp.path().join("dest"))
            .args(connection(addr));
        let outcome = run(sync, Duration::from_secs(10));
        assert_eq!(outcome.code, None, "sync keeps running: {outcome:?}");
        assert!(
            outcome.stderr.matches("watch failed; retrying").count() >= 2,
            "sync against {addr} must log each failed attempt: {outcome:?}"
        );
    }
}

#[test]
fn a_token_file_readable_by_others_gets_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let (ca, token) = credentials(tmp.path());
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let dest = tmp.path().join("dest");
    let outcome = run(
        syncer(&[
            "sync",
            "--server",
            &format!("https://{}", mute_tcp()),
            "--ca-file",
            ca.to_str().unwrap(),
            "--token-file",
            token.to_str().unwrap(),
            "--namespace",
            "ns",
            "--secrets",
            "a",
            "--destination-dir",
            dest.to_str().unwrap(),
            "--connect-timeout",
            "1s",
        ]),
        Duration::from_secs(3),
    );
    assert!(
        outcome.stderr.contains("readable by group or others") && outcome.stderr.contains("644"),
        "{outcome:?}"
    );
    assert!(!outcome.stderr.contains(TOKEN), "{outcome:?}");
}

/// Counts the TCP connections it accepts (and closes them).
fn connection_counter() -> (String, Arc<Mutex<usize>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let count = Arc::new(Mutex::new(0));
    let sink = Arc::clone(&count);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            if stream.is_err() {
                return;
            }
            *sink.lock().unwrap() += 1;
        }
    });
    (addr, count)
}

/// A kubeconfig for `server` with extra `cluster:` lines and `user:` lines (each indented 4).
fn kubeconfig_with(server: &str, cluster_lines: &str, user_lines: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- cluster:\n    server: {server}\n{cluster_lines}  \
         name: c\nusers:\n- name: u\n  user:\n{user_lines}contexts:\n- context: {{cluster: c, user: u}}\n  \
         name: x\ncurrent-context: x\n"
    )
}

#[test]
fn a_kubeconfig_that_skips_verification_or_names_no_ca_is_refused_before_any_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, token) = credentials(tmp.path());
    let (addr, connections) = connection_counter();
    let url = format!("https://{addr}");
    let config = tmp.path().join("kubeconfig");
    let inspect = |extra: &[&str]| {
        let mut args = vec!["inspect", "--namespace", "ns", "--connect-timeout", "2s"];
        args.extend_from_slice(extra);
        run(syncer(&args), LIMIT)
    };

    // insecure-skip-tls-verify: the token would go to whoever answers.
    std::fs::write(
        &config,
        kubeconfig_with(
            &url,
            "    insecure-skip-tls-verify: true\n",
            &format!("    token: {TOKEN}\n"),
        ),
    )
    .unwrap();
    let outcome = inspect(&["--kubeconfig", config.to_str().unwrap()]);
    assert_eq!(outcome.code, Some(2), "{outcome:?}");
    assert!(
        outcome.stderr.contains("insecure-skip-tls-verify")
            && outcome.stderr.contains(config.to_str().unwrap()),
        "the message names the setting and the kubeconfig: {outcome:?}"
    );
    assert!(!outcome.stderr.contains(TOKEN), "{outcome:?}");

    // No certificate-authority at all: never the platform's trust store.
    std::fs::write(
        &config,
        kubeconfig_with(&url, "", &format!("    token: {TOKEN}\n")),
    )
    .unwrap();
    let outcome = inspect(&["--kubeconfig", config.to_str().unwrap()]);
    assert_eq!(outcome.code, Some(2), "{outcome:?}");
    assert!(
        outcome.stderr.contains("platform's trust store")
            && outcome.stderr.contains(config.to_str().unwrap()),
        "{outcome:?}"
    );
    let outcome = inspect(&["--server", &url, "--token-file", token.to_str().unwrap()]);
    assert_eq!(outcome.code, Some(2), "{outcome:?}");
    assert!(
        outcome.stderr.contains("no --ca-file")
            && outcome.stderr.contains("platform's trust store"),
        "{outcome:?}"
    );
    assert_eq!(
        *connections.lock().unwrap(),
        0,
        "a refused configuration still connected"
    );
}

/// Each handshake an [`mtls_server`] saw: `Ok(client certificates presented)` or the error.
type Handshakes = Arc<Mutex<Vec<Result<usize, String>>>>;

/// A TLS server for `localhost` that requires a client certificate of `client_ca`, records
/// each handshake (`Ok(client certificates presented)` or the error), and answers every
/// request with a 500.
fn mtls_server(server_ca: &Ca, client_ca: &Ca) -> (String, Handshakes) {
    use rustls_pki_types::pem::PemObject;
    e2e::install_crypto_provider();
    let issued = server_ca.issue(&CertSpec::server(&["localhost"]));
    let certs = rustls_pki_types::CertificateDer::pem_slice_iter(issued.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(issued.key_pem.as_bytes()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(client_ca.cert_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
        .build()
        .unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            stream
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let mut conn = rustls::ServerConnection::new(Arc::clone(&config)).unwrap();
            let mut failed = None;
            while conn.is_handshaking() {
                if let Err(err) = conn.complete_io(&mut stream) {
                    failed = Some(err.to_string());
                    break;
                }
            }
            if let Some(err) = failed {
                sink.lock().unwrap().push(Err(err));
                continue;
            }
            let presented = conn.peer_certificates().map_or(0, <[_]>::len);
            sink.lock().unwrap().push(Ok(presented));
            let mut tls = rustls::Stream::new(&mut conn, &mut stream);
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && tls.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            let _ = tls.write_all(
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
            let _ = tls.flush();
        }
    });
    (addr, seen)
}

#[test]
fn ca_file_is_honoured_with_a_kubeconfig_client_certificate() {
    let tmp = tempfile::tempdir().unwrap();
    let (server_ca, client_ca, unrelated) = (Ca::default(), Ca::default(), Ca::default());
    let (addr, handshakes) = mtls_server(&server_ca, &client_ca);
    let dir = tmp.path();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let ca_file = write("server-ca.crt", &server_ca.cert_pem);
    let unrelated_ca = write("unrelated-ca.crt", &unrelated.cert_pem);
    let client = client_ca.issue(&CertSpec::client("system:admin"));
    let client_crt = write("client.crt", &client.cert_pem);
    let client_key = write("client.key", &client.key_pem);
    // The kubeconfig's own CA does not sign the server's certificate: only --ca-file does.
    let config = write(
        "kubeconfig",
        &kubeconfig_with(
            &format!("https://{addr}"),
            &format!("    certificate-authority: {}\n", unrelated_ca.display()),
            &format!(
                "    client-certificate: {}\n    client-key: {}\n",
                client_crt.display(),
                client_key.display()
            ),
        ),
    );
    let outcome = run(
        syncer(&[
            "inspect",
            "--namespace",
            "ns",
            "--kubeconfig",
            config.to_str().unwrap(),
            "--ca-file",
            ca_file.to_str().unwrap(),
            "--tls-server-name-override",
            "localhost",
            "--connect-timeout",
            "2s",
        ]),
        LIMIT,
    );
    let seen = handshakes.lock().unwrap().clone();
    assert!(
        !seen.is_empty() && seen.iter().all(|h| *h == Ok(1)),
        "every handshake verified the server with --ca-file and presented the kubeconfig's \
         client certificate: {seen:?}\n{outcome:?}"
    );
    // The server answers 500: a listing error (exit 1), not a TLS one.
    assert_eq!(outcome.code, Some(1), "{outcome:?}");
    assert!(
        outcome.stderr.contains("cannot list") && !outcome.stderr.contains("not trusted"),
        "{outcome:?}"
    );
}
