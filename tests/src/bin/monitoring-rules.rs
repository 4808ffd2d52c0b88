//! `monitoring-rules`: writes `manifests/monitoring/cert-reload.rules.yaml` and
//! `prometheusrule.yaml` from the one source, `manifests/monitoring/rules.src.yaml`.
//! `--check` writes nothing and exits 1 when a file differs from what the source renders
//! (the test `manifests::monitoring` checks the same).

use std::process::ExitCode;

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(other) => {
            eprintln!(
                "monitoring-rules: unknown argument {other:?} (usage: monitoring-rules [--check])"
            );
            return ExitCode::from(2);
        }
    };
    let files = match e2e::monitoring::generated() {
        Ok(files) => files,
        Err(err) => {
            eprintln!("monitoring-rules: {err}");
            return ExitCode::from(1);
        }
    };
    let mut stale = false;
    for (name, text) in files {
        let path = e2e::monitoring::dir().join(name);
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
            continue;
        }
        if check {
            eprintln!("monitoring-rules: {} is stale", path.display());
            stale = true;
        } else if let Err(err) = std::fs::write(&path, text) {
            eprintln!("monitoring-rules: cannot write {}: {err}", path.display());
            return ExitCode::from(1);
        } else {
            println!("wrote {}", path.display());
        }
    }
    if stale {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
