//! `cert-syncer restart-on-change`'s rules end to end, with real processes, real files and the
//! real kube-apiserver's Events (docs/restart-on-change.md; the happy path on a node is
//! `kubelet_full_recovery.rs`). Two "containers" run on the host: `a` (opted in: `--container`
//! and `--pair`) and `b` (not opted in), each a real process (`sleep`, with the container's
//! executable as `argv[0]`) that the test starts again whenever it exits, as the kubelet does.
//! In one PID namespace (the host's here, the pod's shared one on a node) the sidecar finds `a`
//! by its executable.
//!
//! 1. Started after `a` read its pair: nothing happens, and `/readyz` turns ready (the process
//!    was seen).
//! 2. A pair whose key does not fit, then an expired pair, written to `a`'s watched path: no
//!    restart (the same process runs on), an Event `RestartHeldInvalidPair` each naming the
//!    problem, `held{reason="invalid_pair"}` 2.
//! 3. `a`'s original bytes written back: no restart (the process holds them), no Event.
//! 4. `b`'s pair replaced by a new valid one: `b` is never touched (same process to the end).
//! 5. A new valid pair for `a`: SIGTERM (its exit status says so), the Event
//!    `RestartingContainer`, `restarts_total` 1; the "kubelet" starts it again, which reads it.
//! 6. The brake (2 restarts per 8 s): a second new pair restarts it (2); a third is held (Event
//!    `RestartHeldBrake`, `held{reason="brake"}` 1, the process runs on), then restarted into
//!    once the first restart leaves the window (3).
//!
//! And with `--reload-period 5m` (the pods' setting, for a server that re-reads its pair
//! itself): a rotation between valid pairs restarts nothing (logged as left to the server's own
//! re-read); the server started on an expired pair (after a sleep) is restarted into a valid one
//! at once.
//!
//! Real kube-apiserver only (the Events); skips with a printed reason otherwise.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e::envtest::RealApiServer;
use e2e::{
    Ca, CertSpec, ChildProcess, install_crypto_provider, metric_sum, plain_http_get,
    require_real_apiserver, wait_until,
};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};
use testkit::rename::rename_into_with_mode;

const POD: &str = "restarter-test";
const RESTARTS: &str = "cert_syncer_container_restarts_total";
const HELD: &str = "cert_syncer_container_restarts_held_total";

/// A "container": a process the test starts again whenever it exits (the kubelet's part).
struct Container {
    executable: String,
    process: std::process::Child,
    /// When the current process started.
    since: std::time::Instant,
    /// How each earlier life ended.
    ended: Vec<std::process::ExitStatus>,
}

impl Container {
    fn start(executable: &str) -> Container {
        Container {
            executable: executable.to_owned(),
            process: spawn(executable),
            since: std::time::Instant::now(),
            ended: Vec::new(),
        }
    }

    /// Waits until the current process is past its start-up: the sidecar counts bytes written
    /// within 2 s of a server's start as read by it (servers read their files while starting).
    async fn past_start_up(&self) {
        let past = self.since + Duration::from_millis(2_200);
        tokio::time::sleep_until(past.into()).await;
    }

    /// Starts it again if it exited; whether it did.
    fn keep_running(&mut self) -> bool {
        match self.process.try_wait().expect("try_wait") {
            None => false,
            Some(status) => {
                self.ended.push(status);
                self.process = spawn(&self.executable);
                self.since = std::time::Instant::now();
                true
            }
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// `sleep` with `executable` as its `argv[0]`, as a container's `command` shows in `/proc`.
fn spawn(executable: &str) -> std::process::Child {
    let child = Command::new("sleep")
        .arg0(executable)
        .arg("3600")
        .spawn()
        .expect("sleep runs");
    // Until it has exec'd, /proc shows the test's command line: let it.
    std::thread::sleep(Duration::from_millis(100));
    child
}

/// Writes `cert` and `key` as `dir/tls.crt` and `dir/tls.key` (renamed into place).
fn write_pair(dir: &Path, cert: &str, key: &str) {
    rename_into_with_mode(&dir.join("tls.crt"), cert.as_bytes(), 0o644);
    rename_into_with_mode(&dir.join("tls.key"), key.as_bytes(), 0o600);
}

/// The reasons and messages of the Events on the sidecar's pod, oldest first.
async fn events(client: &kube::Client) -> Vec<(String, String)> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    let mut list = api
        .list(&ListParams::default().fields(&format!("involvedObject.name={POD}")))
        .await
        .expect("the Events")
        .items;
    list.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    list.into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

fn count(events: &[(String, String)], reason: &str) -> usize {
    events.iter().filter(|(r, _)| r == reason).count()
}

struct Sidecar {
    process: ChildProcess,
}

impl Sidecar {
    /// `restart-on-change` for container `a` (`executable`) and its pair in `dir`, Events on
    /// [`POD`], plus `extra`.
    fn start(api: &RealApiServer, executable: &str, dir: &Path, extra: &[&str]) -> Sidecar {
        let mut command = e2e::syncer::recovery_command("restart-on-change", api);
        command
            .args(["--container", &format!("a={executable}")])
            .args([
                "--pair",
                &format!(
                    "a={},{}",
                    dir.join("tls.crt").display(),
                    dir.join("tls.key").display()
                ),
            ])
            .args(["--recheck-interval", "1s"])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(["--pod-name", POD, "--pod-namespace", "default"])
            .args(extra);
        Sidecar {
            process: ChildProcess::start(command),
        }
    }

    fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        metric_sum(
            &plain_http_get(&self.process.addr.to_string(), "/metrics").1,
            name,
            labels,
        )
    }
}

/// Keeps both containers running (as the kubelet) while waiting for `done` to hold of `a`
/// and the Events.
async fn wait_keeping(
    (a, b): (&mut Container, &mut Container),
    client: &kube::Client,
    what: &str,
    done: impl Fn(&Container, &[(String, String)]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        a.keep_running();
        b.keep_running();
        if done(a, &events(client).await) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not within 60 s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_only_the_opted_in_container_only_into_valid_pairs_and_braked() {
    require_real_apiserver!();
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = RealApiServer::start(&tmp.path().join("apiserver"));
    let client = api.recovery_client();
    let (dir_a, dir_b): (PathBuf, PathBuf) = (tmp.path().join("a"), tmp.path().join("b"));
    std::fs::create_dir_all(&dir_a).unwrap();
    std::fs::create_dir_all(&dir_b).unwrap();
    let ca = Ca::new("restart-on-change-test");
    let leaf = |cn: &str| ca.issue(&CertSpec::client(cn));
    let (first_a, first_b) = (leaf("a"), leaf("b"));
    write_pair(&dir_a, &first_a.cert_pem, &first_a.key_pem);
    write_pair(&dir_b, &first_b.cert_pem, &first_b.key_pem);
    std::thread::sleep(Duration::from_millis(50));
    let exe = |name: &str| format!("/test/{}/{name}", std::process::id());
    let (mut a, mut b) = (Container::start(&exe("a")), Container::start(&exe("b")));
    let b_pid = b.process.id();

    let sidecar = Sidecar::start(
        &api,
        &exe("a"),
        &dir_a,
        &["--max-restarts", "2", "--restart-window", "8s"],
    );
    let addr = sidecar.process.addr.to_string();

    // 1. Ready once it saw `a`'s process; `a` read its pair: nothing to do.
    wait_until(
        "the sidecar ready (a's process seen)",
        Duration::from_secs(30),
        || async { plain_http_get(&addr, "/readyz").0 == 200 },
    )
    .await;

    // 2. Unfit pairs at the watched path: held, each once, with why.
    a.past_start_up().await;
    let (x, y) = (leaf("a"), leaf("a"));
    write_pair(&dir_a, &x.cert_pem, &y.key_pem);
    wait_keeping(
        (&mut a, &mut b),
        &client,
        "the mismatched pair held",
        |_, e| count(e, "RestartHeldInvalidPair") == 1,
    )
    .await;
    let expired = ca.issue(&CertSpec::client("a").expired(2));
    write_pair(&dir_a, &expired.cert_pem, &expired.key_pem);
    wait_keeping(
        (&mut a, &mut b),
        &client,
        "the expired pair held",
        |_, e| count(e, "RestartHeldInvalidPair") == 2,
    )
    .await;
    let seen = events(&client).await;
    let held: Vec<&String> = seen
        .iter()
        .filter(|(r, _)| r == "RestartHeldInvalidPair")
        .map(|(_, m)| m)
        .collect();
    assert!(held[0].contains("does not fit"), "{}", held[0]);
    assert!(held[1].contains("expired"), "{}", held[1]);
    assert!(seen.iter().all(|(_, m)| !m.contains("PRIVATE KEY")));
    assert_eq!(sidecar.metric(HELD, &["reason=\"invalid_pair\""]), 2.0);

    // 3. `a`'s own bytes back: it holds them, nothing to do.
    write_pair(&dir_a, &first_a.cert_pem, &first_a.key_pem);
    // 4. `b` is not opted in: its new pair touches nothing.
    let second_b = leaf("b");
    write_pair(&dir_b, &second_b.cert_pem, &second_b.key_pem);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !a.keep_running() && !b.keep_running(),
        "neither a (its own bytes) nor b (not opted in) restarted"
    );
    assert_eq!(
        events(&client).await.len(),
        2,
        "{:?}",
        events(&client).await
    );
    assert_eq!(sidecar.metric(RESTARTS, &[]), 0.0);

    // 5. A new valid pair: SIGTERM, an Event, a metric; started again by the "kubelet".
    let second_a = leaf("a");
    write_pair(&dir_a, &second_a.cert_pem, &second_a.key_pem);
    wait_keeping((&mut a, &mut b), &client, "a restarted", |_, e| {
        count(e, "RestartingContainer") == 1
    })
    .await;
    wait_keeping((&mut a, &mut b), &client, "a's first life over", |a, _| {
        !a.ended.is_empty()
    })
    .await;
    assert_eq!(a.ended[0].signal(), Some(libc::SIGTERM), "{:?}", a.ended);
    assert_eq!(sidecar.metric(RESTARTS, &["container=\"a\""]), 1.0);
    let message = events(&client)
        .await
        .into_iter()
        .find(|(r, _)| r == "RestartingContainer");
    assert!(
        message
            .as_ref()
            .is_some_and(|(_, m)| m.contains("SIGTERM to container a")),
        "{message:?}"
    );

    // 6. The brake: a second restart within the window, a third held, then done once the
    // first leaves it.
    a.past_start_up().await;
    let third_a = leaf("a");
    write_pair(&dir_a, &third_a.cert_pem, &third_a.key_pem);
    wait_keeping((&mut a, &mut b), &client, "a restarted twice", |a, _| {
        a.ended.len() == 2
    })
    .await;
    a.past_start_up().await;
    let fourth_a = leaf("a");
    write_pair(&dir_a, &fourth_a.cert_pem, &fourth_a.key_pem);
    wait_keeping(
        (&mut a, &mut b),
        &client,
        "the third restart held",
        |_, e| count(e, "RestartHeldBrake") == 1,
    )
    .await;
    assert_eq!(a.ended.len(), 2, "held: the process runs on");
    assert_eq!(sidecar.metric(HELD, &["reason=\"brake\""]), 1.0);
    wait_keeping(
        (&mut a, &mut b),
        &client,
        "the held restart done",
        |a, _| a.ended.len() == 3,
    )
    .await;
    assert!(a.ended.iter().all(|s| s.signal() == Some(libc::SIGTERM)));
    assert_eq!(sidecar.metric(RESTARTS, &["container=\"a\""]), 3.0);
    assert_eq!(count(&events(&client).await, "RestartingContainer"), 3);
    assert!(
        b.ended.is_empty() && b.process.id() == b_pid,
        "b never touched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_rereads_is_restarted_only_when_what_it_runs_with_is_unusable() {
    // `--reload-period 5m` (the pods' setting: client-go's re-read): a rotation between valid
    // pairs is left to the server (a leader keeps its Lease); a server running on an expired
    // pair (the sleep) is restarted into a valid one at once.
    require_real_apiserver!();
    install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let api = RealApiServer::start(&tmp.path().join("apiserver"));
    let client = api.recovery_client();
    let dir = tmp.path().join("a");
    std::fs::create_dir_all(&dir).unwrap();
    let ca = Ca::new("restart-on-change-reload");
    let leaf = || ca.issue(&CertSpec::client("a"));
    let first = leaf();
    write_pair(&dir, &first.cert_pem, &first.key_pem);
    std::thread::sleep(Duration::from_millis(50));
    let exe = |name: &str| format!("/test/{}/reload-{name}", std::process::id());
    let (mut a, mut b) = (Container::start(&exe("a")), Container::start(&exe("b")));
    let sidecar = Sidecar::start(&api, &exe("a"), &dir, &["--reload-period", "5m"]);
    let addr = sidecar.process.addr.to_string();
    wait_until("the sidecar ready", Duration::from_secs(30), || async {
        plain_http_get(&addr, "/readyz").0 == 200
    })
    .await;

    // A valid pair over the valid one it runs with: left to its re-read.
    a.past_start_up().await;
    let rotated = leaf();
    write_pair(&dir, &rotated.cert_pem, &rotated.key_pem);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !a.keep_running(),
        "a rotation between valid pairs restarts nothing"
    );
    assert_eq!(sidecar.metric(RESTARTS, &[]), 0.0);
    assert!(
        sidecar
            .process
            .stderr_text()
            .contains("left to the server's own re-read"),
        "{}",
        sidecar.process.tail(20)
    );

    // After a sleep: it starts on an expired pair, then a valid one comes: restarted at once.
    let expired = ca.issue(&CertSpec::client("a").expired(2));
    write_pair(&dir, &expired.cert_pem, &expired.key_pem);
    std::thread::sleep(Duration::from_millis(50));
    a.process.kill().unwrap();
    wait_keeping(
        (&mut a, &mut b),
        &client,
        "a started on the expired pair",
        |a, _| a.ended.len() == 1,
    )
    .await;
    a.past_start_up().await;
    let recovered = leaf();
    write_pair(&dir, &recovered.cert_pem, &recovered.key_pem);
    wait_keeping(
        (&mut a, &mut b),
        &client,
        "a restarted into the valid pair",
        |a, _| a.ended.len() == 2,
    )
    .await;
    assert_eq!(a.ended[1].signal(), Some(libc::SIGTERM));
    assert_eq!(sidecar.metric(RESTARTS, &["container=\"a\""]), 1.0);
    assert!(b.ended.is_empty(), "b never touched");
}
