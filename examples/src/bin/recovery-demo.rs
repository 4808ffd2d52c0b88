//! `recovery-demo`: the whole localhost recovery flow on this machine, with a timeline. Exits 0
//! when the server recovered, 1 with the reason otherwise. `--timeline FILE` also writes the
//! timeline as a plot (`.svg`) or as milestone lines.
//!
//! Run through cargo (`cargo run --bin recovery-demo`, the README's first command), it first
//! builds the binaries it starts (`mini-apiserver`, `cert-syncer`) with the same profile.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// Runs the localhost recovery flow: expired serving certificates heal themselves.
#[derive(Debug, Parser)]
#[command(name = "recovery-demo")]
struct Flags {
    /// Work directory (kept afterwards). Default: a temporary directory, removed at the end.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the temporary work directory.
    #[arg(long)]
    keep: bool,
    /// Directory holding `mini-apiserver` and `cert-syncer` (default: next to this binary).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
    /// The apiserver: `mini` (ours), `real` (kube-apiserver + etcd from `KUBEBUILDER_ASSETS`
    /// or `../shared/envtest/setup`; it then also serves from the synced files), or `auto`
    /// (real when those are found, else mini).
    #[arg(long, value_enum, default_value_t = Choice::Auto)]
    apiserver: Choice,
    /// Also write the timeline of a recovery to FILE: a plot (SVG, drawn as `timeline-plot`
    /// draws) when FILE ends in `.svg`, else its milestone lines (`milestone +MS ms: NAME`, the
    /// format `timeline-plot` reads). Repeatable (the lines and the plot of one run).
    #[arg(long, value_name = "FILE")]
    timeline: Vec<PathBuf>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Choice {
    Mini,
    Real,
    Auto,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    let bin_dir = match flags.bin_dir.clone().map_or_else(sibling_binaries, Ok) {
        Ok(dir) => dir,
        Err(err) => {
            eprintln!("recovery-demo: {err:#}");
            return ExitCode::from(1);
        }
    };
    let apiserver = match (flags.apiserver, examples::recovery::find_envtest_assets()) {
        (Choice::Mini, _) | (Choice::Auto, None) => examples::recovery::Apiserver::Mini,
        (Choice::Real | Choice::Auto, Some(assets)) => examples::recovery::Apiserver::Real(assets),
        (Choice::Real, None) => {
            eprintln!(
                "recovery-demo: --apiserver real: no kube-apiserver found (set KUBEBUILDER_ASSETS \
                 to a directory holding kube-apiserver and etcd)"
            );
            return ExitCode::from(1);
        }
    };
    match &apiserver {
        examples::recovery::Apiserver::Mini => println!("apiserver: mini-apiserver"),
        examples::recovery::Apiserver::Real(assets) => println!(
            "apiserver: real kube-apiserver + etcd from {}",
            assets.display()
        ),
    }
    let options = examples::recovery::Options {
        bin_dir,
        dir: flags.dir,
        keep: flags.keep,
        timeout: Duration::from_secs(flags.timeout_secs),
        apiserver,
    };
    match examples::recovery::run(&options) {
        Ok(recovered) => match flags
            .timeline
            .iter()
            .try_for_each(|path| write_timeline(path, &recovered))
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("recovery-demo: {err:#}");
                ExitCode::from(1)
            }
        },
        Err(err) => {
            eprintln!("recovery-demo: FAILED: {err:#}");
            ExitCode::from(1)
        }
    }
}

/// `--timeline FILE`: the plot when FILE ends in `.svg`, else the milestone lines.
fn write_timeline(path: &Path, recovered: &examples::recovery::Recovered) -> anyhow::Result<()> {
    use examples::milestones;
    let text = if path.extension().is_some_and(|e| e == "svg") {
        milestones::svg(
            "recovery-demo: expired serving certificates heal over localhost",
            &milestones::rows(std::slice::from_ref(&recovered.milestones)),
        )
    } else {
        recovered
            .milestones
            .iter()
            .map(|m| m.line() + "\n")
            .collect()
    };
    std::fs::write(path, text)
        .map_err(|err| anyhow::anyhow!("cannot write the timeline to {}: {err}", path.display()))?;
    println!("timeline written to {}", path.display());
    Ok(())
}

/// The directory of this executable; under `cargo run`, the binaries it needs are built there
/// first (a no-op when they are fresh).
fn sibling_binaries() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow::anyhow!("no directory for {}", exe.display()))?
        .to_owned();
    if let Some(cargo) = std::env::var_os("CARGO") {
        // Said before cargo starts: on a fresh clone this build takes minutes, and a pause
        // after "Running target/debug/recovery-demo" looks like a hang.
        eprintln!(
            "recovery-demo: building the two programs the demo starts, cert-syncer and \
             mini-apiserver (a no-op when they are fresh; on a fresh clone about 2 minutes on 2 \
             cores, cargo's progress below); the demo itself then takes seconds"
        );
        // No `-p`: cargo then resolves dependency features for the whole workspace, as it did
        // for `cargo run --bin recovery-demo` (and does for `cargo build --workspace`), so this
        // build reuses every dependency already compiled. With `-p cert-syncer -p
        // mini-apiserver` against a `-p examples` run, tokio, futures and k8s-openapi differ in
        // features and everything above them (hyper, kube, rustls' tokio glue, ...) is
        // compiled a second time: the silent minutes a fresh clone used to see here.
        let mut command = std::process::Command::new(cargo);
        command.args(["build", "--bin", "cert-syncer", "--bin", "mini-apiserver"]);
        if dir.ends_with("release") {
            command.arg("--release");
        }
        // From the workspace root (this package is `examples/` in it): inside `examples/`,
        // cargo would select that package alone.
        if let Some(root) =
            option_env!("CARGO_MANIFEST_DIR").and_then(|dir| Path::new(dir).parent())
        {
            command.current_dir(root);
        }
        let status = command.status()?;
        anyhow::ensure!(
            status.success(),
            "building cert-syncer and mini-apiserver failed"
        );
    }
    for name in ["cert-syncer", "mini-apiserver"] {
        anyhow::ensure!(
            dir.join(name).exists(),
            "{} not found; build the workspace binaries (cargo build --workspace --bins) or pass --bin-dir",
            dir.join(name).display()
        );
    }
    Ok(dir)
}
