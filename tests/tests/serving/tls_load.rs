//! `tls-load` against `https-server`: the figures it prints are the ones rotation and peer
//! comparison runs rely on.

use std::process::Command;

use e2e::{Ca, Server, bin};

fn tls_load(args: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    let output = Command::new(bin("tls-load")).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let json = serde_json::from_str(stdout.trim()).unwrap_or(serde_json::Value::Null);
    (
        output.status.code(),
        json,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn tls_load_counts_handshakes_resumptions_failures_and_serials() {
    let ca = Ca::default();
    let tmp = tempfile::tempdir().unwrap();
    let (cert, key, serial) = ca.localhost_leaf();
    std::fs::write(tmp.path().join("tls.crt"), cert).unwrap();
    std::fs::write(tmp.path().join("tls.key"), key).unwrap();
    std::fs::write(tmp.path().join("ca.crt"), &ca.cert_pem).unwrap();
    let mut command = Command::new(bin("https-server"));
    command
        .args(["--listen", "127.0.0.1:0", "--cert"])
        .arg(tmp.path().join("tls.crt"))
        .arg("--key")
        .arg(tmp.path().join("tls.key"));
    let server = Server::start(command);
    let addr = server.addr.to_string();
    let ca_path = tmp.path().join("ca.crt");
    let ca_path = ca_path.to_str().unwrap();

    let common = [
        "--connect",
        &addr,
        "--server-name",
        "localhost",
        "--ca",
        ca_path,
        "--json",
        "--duration",
        "20",
    ];
    let (code, json, stderr) =
        tls_load(&[&common[..], &["--requests", "40", "--no-resume"]].concat());
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(json["handshakes"], 40);
    assert_eq!(json["resumed"], 0);
    assert_eq!(json["failures"], 0);
    assert_eq!(json["serials"][&serial], 40, "{json}");
    assert!(json["p99_us"].as_u64().unwrap() >= json["p50_us"].as_u64().unwrap());
    // What was negotiated, every handshake alike: the workspace builds rustls without
    // `prefer-post-quantum`, so its defaults on both sides pick X25519; the server's signature
    // is checked by the verifier, which counts it; rustls sends 2 (stateful) tickets per full
    // handshake by default.
    let negotiated = &json["negotiated"];
    assert_eq!(negotiated["protocol"]["TLSv1_3"], 40, "{json}");
    assert_eq!(negotiated["group"]["X25519"], 40, "{json}");
    assert_eq!(
        negotiated["signature_scheme"]["ECDSA_NISTP256_SHA256"], 40,
        "{json}"
    );
    assert_eq!(negotiated["alpn"]["none"], 40, "{json}");
    assert_eq!(
        negotiated["cipher_suite"].as_object().unwrap().len(),
        1,
        "{json}"
    );
    assert_eq!(json["tickets_received"], 80, "{json}");

    // --groups restricts the offer, --cipher-suites the TLS 1.3 suites.
    let (code, json, stderr) = tls_load(
        &[
            &common[..],
            &[
                "--requests",
                "5",
                "--no-resume",
                "--groups",
                "x25519mlkem768,x25519",
            ],
            &["--cipher-suites", "tls13_aes_128_gcm_sha256"],
        ]
        .concat(),
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(json["negotiated"]["group"]["X25519MLKEM768"], 5, "{json}");
    let suite = &json["negotiated"]["cipher_suite"]["TLS13_AES_128_GCM_SHA256"];
    assert_eq!(suite, 5, "{json}");

    // --rate paces the attempts: 20 per second for 1 s starts the 20 slots due before the
    // deadline (0, 50, ..., 950 ms) and no more, however fast the server; back to back, 4
    // workers would make hundreds. Sleeping never ends early, so the run lasts past the last
    // slot.
    let (without_duration, _) = common.split_at(common.len() - 2);
    let paced = [
        "--no-resume",
        "--concurrency",
        "4",
        "--duration",
        "1",
        "--rate",
        "20",
    ];
    let (code, json, stderr) = tls_load(&[without_duration, &paced].concat());
    assert_eq!(code, Some(0), "{stderr}");
    let handshakes = json["handshakes"].as_u64().unwrap();
    assert!((1..=20).contains(&handshakes), "{json}");
    assert!(json["duration_secs"].as_f64().unwrap() >= 0.9, "{json}");
    let (code, _, stderr) = tls_load(&[&common[..], &["--rate", "0"]].concat());
    assert_eq!(code, Some(2));
    assert!(stderr.contains("--rate"), "{stderr}");

    // With resumption, one worker: only the first handshake is full.
    let (code, json, _) =
        tls_load(&[&common[..], &["--requests", "10", "--concurrency", "1"]].concat());
    assert_eq!(code, Some(0));
    assert_eq!(json["handshakes"], 10);
    assert_eq!(json["resumed"], 9, "{json}");
    assert_eq!(json["serials"][&serial], 1);
    assert_eq!(
        json["negotiated"]["signature_scheme"]["ECDSA_NISTP256_SHA256"], 1,
        "only the full handshake is signed: {json}"
    );

    // A server told to send no TLS 1.3 tickets: none arrive, so nothing resumes.
    let mut command = Command::new(bin("https-server"));
    command
        .args(["--listen", "127.0.0.1:0", "--tls13-tickets", "0", "--cert"])
        .arg(tmp.path().join("tls.crt"))
        .arg("--key")
        .arg(tmp.path().join("tls.key"));
    let no_tickets = Server::start(command);
    let no_tickets_addr = no_tickets.addr.to_string();
    let mut args = common.to_vec();
    args[1] = &no_tickets_addr;
    let (code, json, _) =
        tls_load(&[&args[..], &["--requests", "5", "--concurrency", "1"]].concat());
    assert_eq!(code, Some(0));
    assert_eq!(
        (&json["tickets_received"], &json["resumed"]),
        (&0.into(), &0.into()),
        "{json}"
    );

    // A name the certificate does not cover: every handshake fails, with the reason, exit 1.
    let (code, json, _) = tls_load(&[
        "--connect",
        &addr,
        "--server-name",
        "other.test",
        "--ca",
        ca_path,
        "--json",
        "--requests",
        "3",
    ]);
    assert_eq!(code, Some(1));
    assert_eq!(json["failures"], 3);
    let reasons = json["failure_reasons"].as_object().unwrap();
    assert!(
        reasons.keys().all(|r| r.contains("not valid for name")),
        "{reasons:?}"
    );

    // An unreadable CA bundle is a configuration error naming the file.
    let (code, _, stderr) = tls_load(&[
        "--connect",
        &addr,
        "--server-name",
        "localhost",
        "--ca",
        "/nonexistent/ca.crt",
    ]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("/nonexistent/ca.crt"), "{stderr}");
}
