//! `recovery-demo`: the whole localhost recovery flow on this machine, with a timeline. Exits 0
//! when the server recovered, 1 with the reason otherwise.
//!
//! Run through cargo (`cargo run -p examples --bin recovery-demo`), it first builds the
//! binaries it starts (`mini-apiserver`, `cert-syncer`) with the same profile.

use std::path::PathBuf;
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
    let options = examples::recovery::Options {
        bin_dir,
        dir: flags.dir,
        keep: flags.keep,
        timeout: Duration::from_secs(flags.timeout_secs),
    };
    match examples::recovery::run(&options) {
        Ok(_) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("recovery-demo: FAILED: {err:#}");
            ExitCode::from(1)
        }
    }
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
        let mut command = std::process::Command::new(cargo);
        command.args([
            "build",
            "--quiet",
            "-p",
            "cert-syncer",
            "--bin",
            "cert-syncer",
            "-p",
            "examples",
            "--bin",
            "mini-apiserver",
        ]);
        if dir.ends_with("release") {
            command.arg("--release");
        }
        if let Some(manifest) = option_env!("CARGO_MANIFEST_DIR") {
            command.current_dir(manifest);
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
