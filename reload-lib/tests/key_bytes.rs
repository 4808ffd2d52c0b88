//! No byte of a key file in errors, logs or `Debug`: a key whose newlines were lost is refused
//! at start-up and on reload, and neither the errors, the `Status`, the set's `Debug` nor the
//! log lines hold any piece of it.
//!
//! A file of its own because it installs the process's global log subscriber to capture every
//! line: in a binary with other tests (under plain `cargo test`) another test may install one
//! first.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use reload_lib::ServingSet;

/// Captures every log line of the process.
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn install() -> Logs {
        let logs = Logs::default();
        let writer = logs.clone();
        tracing_subscriber::fmt()
            .with_env_filter("reload_lib=trace")
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .init();
        logs
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Fails if `text` holds any piece of the key: its base64 body, or its bytes as a list.
fn assert_no_key_bytes(what: &str, text: &str, key_pem: &str) {
    let body: String = key_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    for window in body.as_bytes().chunks(8).take(8) {
        let chunk = std::str::from_utf8(window).unwrap();
        assert!(
            !text.contains(chunk),
            "{what} holds key text {chunk:?}: {text}"
        );
        let list = window
            .iter()
            .map(|b| b.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        assert!(
            !text.contains(&list),
            "{what} holds key bytes [{list}]: {text}"
        );
    }
}

fn error_text(err: &dyn std::error::Error) -> String {
    let mut text = format!("{err} / {err:?}");
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(&format!(" / {cause} / {cause:?}"));
        source = cause.source();
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_newlines_were_lost_never_reaches_errors_logs_or_debug() {
    let logs = Logs::install();
    let ca = Ca::new("ca");
    let tmp = tempfile::tempdir().unwrap();
    let good = ca.leaf(&["localhost"], 30);
    let next = ca.leaf(&["localhost"], 30);
    let one_line = next.key_pem.replace('\n', " ");
    let mut dir = PairDir::new(tmp.path(), Writer::Rename, &good);

    // At start-up.
    rename_into(&dir.key(), one_line.as_bytes());
    let err = ServingSet::builder(dir.paths()).start().await.unwrap_err();
    assert!(
        err.to_string().contains(&dir.key().display().to_string()),
        "{err}"
    );
    assert_no_key_bytes("the start() error", &error_text(&err), &next.key_pem);
    // A bundle file (key and chain in one file) too.
    let bundle = tmp.path().join("credential.pem");
    std::fs::write(&bundle, format!("{one_line}{}", next.cert_pem)).unwrap();
    let err = ServingSet::builder(reload_lib::CertKeyPaths::bundle(&bundle))
        .start()
        .await
        .unwrap_err();
    assert_no_key_bytes("the bundle error", &error_text(&err), &next.key_pem);

    // After start-up: status, its Debug, the logs.
    dir.write(&good);
    let set = ServingSet::builder(dir.paths())
        .warn_after(Duration::ZERO)
        .resync_interval(None)
        .start()
        .await
        .unwrap();
    dir.write_raw(next.cert_pem.as_bytes(), one_line.as_bytes());
    let status = wait_status(&set, |s| {
        s.last_error
            .as_ref()
            .is_some_and(|e| e.to_string().contains("tls.key"))
    })
    .await;
    let err = status.last_error.clone().unwrap();
    assert_no_key_bytes("Status.last_error", &error_text(&*err), &next.key_pem);
    assert_no_key_bytes("Status Debug", &format!("{status:?}"), &next.key_pem);
    assert_no_key_bytes(
        "ServingSet Debug",
        &format!("{set:?} {:?}", set.current()),
        &next.key_pem,
    );
    let _ = set.reload().await;
    let text = logs.text();
    assert!(text.contains("tls.key"), "the rejection is logged: {text}");
    assert_no_key_bytes("the logs", &text, &next.key_pem);
}
