//! The localhost recovery flow end to end, as processes: `recovery-demo` starts
//! `mini-apiserver` with an expired serving certificate and a valid `localhost-recovery` SNI
//! certificate, then `cert-syncer sync` and `cert-syncer regenerate` over the recovery
//! connection; it exits 0 only once a client trusting the synced CA bundle verifies the new
//! certificate for `localhost`. Run with `--apiserver mini` and `--apiserver real` (a real
//! kube-apiserver with etcd, which then also serves from the synced files; skipped with a
//! printed reason when there is none). Its `--timeline` files: the milestone lines are the steps
//! it printed, at their times, and `timeline-plot` draws them (as does `--timeline FILE.svg`).

use std::path::Path;
use std::process::Command;

use e2e::{Backend, bin_path, both_backends};

both_backends!(expired_serving_certificates_heal_themselves_over_localhost);

async fn expired_serving_certificates_heal_themselves_over_localhost(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let mut command = Command::new(bin_path("recovery-demo"));
    match backend {
        Backend::Mini => command.args(["--apiserver", "mini"]),
        Backend::Real => command
            .args(["--apiserver", "real"])
            .env("KUBEBUILDER_ASSETS", e2e::envtest::assets().unwrap()),
    };
    let (lines, plot) = (
        dir.path().join("timeline.txt"),
        dir.path().join("timeline.svg"),
    );
    let output = command
        .arg("--timeline")
        .arg(&lines)
        .arg("--timeline")
        .arg(&plot)
        .arg("--bin-dir")
        .arg(bin_path("cert-syncer").parent().unwrap())
        .arg("--dir")
        .arg(dir.path())
        .output()
        .expect("recovery-demo runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let which = match backend {
        Backend::Mini => "apiserver: mini-apiserver",
        Backend::Real => "apiserver: real kube-apiserver",
    };
    assert!(
        stdout.contains(which),
        "says which apiserver it used:\n{stdout}"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}\n{stderr}");
    assert!(
        output.status.success(),
        "recovery failed:\n{stdout}\n{stderr}"
    );

    // The steps happened, in causal order.
    let order = [
        "refused (invalid peer certificate: certificate expired",
        "regenerate: expired signer replaced",
        "regenerate: CA bundle updated",
        "regenerate: serving certificate re-issued",
        "RECOVERED",
        "localhost-recovery certificate untouched",
    ];
    let positions: Vec<usize> = order
        .iter()
        .map(|step| {
            stdout
                .find(step)
                .unwrap_or_else(|| panic!("missing step {step:?}:\n{stdout}"))
        })
        .collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "steps out of order:\n{stdout}"
    );
    // The sync and the server log from their own processes, so their lines may land on either
    // side of the demo's own RECOVERED line; they must follow the re-issue.
    // (kube-apiserver's reload shows as the RECOVERED handshake itself.)
    let server_steps: &[&str] = match backend {
        Backend::Mini => &[
            "sync: wrote the new serving certificate",
            "mini-apiserver: reloaded the new serving certificate",
        ],
        Backend::Real => &["sync: wrote the new serving certificate"],
    };
    for step in server_steps {
        let at = stdout
            .find(step)
            .unwrap_or_else(|| panic!("missing step {step:?}:\n{stdout}"));
        assert!(positions[3] < at, "{step:?} before the re-issue:\n{stdout}");
    }
    let millis: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("recovered in "))
        .and_then(|l| l.strip_suffix(" ms"))
        .and_then(|n| n.parse().ok())
        .expect("a recovered-in line");
    eprintln!("recovery flow: start -> recovered in {millis} ms (debug build)");
    // The resource dir now holds the new certificate, synced through the `..data` layout.
    let synced = dir
        .path()
        .join("resources/secrets/localhost-serving-cert-certkey/..data");
    assert!(
        std::fs::symlink_metadata(synced)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    timeline_files_hold_the_printed_steps(&stdout, &lines, &plot);
}

/// `--timeline`: the lines file is the steps printed on stdout (`[   12 ms] what`), in order and
/// at the same times, up to the recovery at least (a sidecar's last log line may still be marked
/// while the demo stops it); `timeline-plot` draws a row for each, as the demo's own `.svg` does.
fn timeline_files_hold_the_printed_steps(stdout: &str, lines: &Path, plot: &Path) {
    use examples::milestones::{self, Milestone};
    let printed: Vec<(u128, String)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix('['))
        .filter_map(|l| l.split_once(" ms] "))
        .map(|(ms, what)| (ms.trim().parse().unwrap(), what.to_owned()))
        .collect();
    assert!(printed.len() >= 6, "{stdout}");
    let runs = milestones::runs(&std::fs::read_to_string(lines).unwrap());
    assert_eq!(runs.len(), 1, "one run");
    let written: Vec<(u128, String)> = runs[0]
        .iter()
        .map(|m: &Milestone| (m.at.as_millis(), m.name.clone()))
        .collect();
    assert!(
        printed.starts_with(&written) && written.iter().any(|(_, w)| w.ends_with("RECOVERED")),
        "written:\n{written:#?}\nprinted:\n{printed:#?}"
    );
    let drawn = Command::new(bin_path("timeline-plot"))
        .args(["--title", "recovery-demo"])
        .arg(lines)
        .output()
        .unwrap();
    assert!(
        drawn.status.success(),
        "{}",
        String::from_utf8_lossy(&drawn.stderr)
    );
    let own = std::fs::read_to_string(plot).unwrap();
    for svg in [String::from_utf8(drawn.stdout).unwrap(), own] {
        assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"));
        for (_, what) in &written {
            let name: String = what
                .chars()
                .take(60)
                .collect::<String>()
                .replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
                .replace('"', "&quot;");
            assert!(
                svg.contains(&format!("<title>{name}")),
                "no row for {what:?}"
            );
        }
    }
}
