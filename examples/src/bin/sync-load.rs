//! Run with: `cargo build --release -p cert-syncer -p mini-apiserver && cargo run --release -p examples --bin sync-load -- [--objects 1000] [--runs 3] [--idle-secs 60]`
//!
//! Measures `cert-syncer sync` against `mini-apiserver` seeded with N Secrets (default 1,000),
//! next to a 1-object baseline measured in the same run: initial sync time (process start →
//! every object on disk), the start-up requests and watch connections the apiserver saw, RSS
//! after the sync and at peak, the latency of one update (API patch → `..data` swapped; p50 and
//! p99 over `--updates` samples) and idle CPU over `--idle-secs`. Prints a progress line per
//! measurement on stderr and a Markdown table (min / median / max over runs, ratios against the
//! baseline) on stdout. The engine lives in `examples::sync_load`.
//!
//! Exit status: 0 when every measurement completed, 1 when one failed (the reason and the
//! process's last log lines are printed), 2 on bad flags.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use examples::sync_load::{self, Settings};

/// Load tool for `cert-syncer sync` with many objects.
#[derive(Debug, Parser)]
#[command(version)]
struct Flags {
    /// Secrets in the large scenario.
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(2..=100_000))]
    objects: u32,
    /// Runs of every scenario (interleaved).
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    runs: u32,
    /// Update samples per scenario and run.
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    updates: u32,
    /// Seconds of the idle CPU window.
    #[arg(long, value_name = "SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    idle_secs: u64,
    /// Also measure the large set with one watch per object (the path below the threshold).
    #[arg(long)]
    per_name: bool,
    /// Directory holding `mini-apiserver` and `cert-syncer` (default: this binary's directory).
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,
    /// Parent of the work directory (the destination files are written on its filesystem).
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Extra flag for every `cert-syncer sync` (repeatable), e.g.
    /// `--syncer-arg=--write-parallelism=4`.
    #[arg(long, value_name = "FLAG", allow_hyphen_values = true)]
    syncer_arg: Vec<String>,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let bin_dir = match flags.bin_dir {
        Some(dir) => dir,
        None => match std::env::current_exe() {
            Ok(exe) => exe.parent().map(PathBuf::from).unwrap_or_default(),
            Err(err) => {
                eprintln!("sync-load: cannot find this binary's directory: {err}; pass --bin-dir");
                return ExitCode::from(2);
            }
        },
    };
    let settings = Settings {
        bin_dir,
        work_dir: flags.work_dir.unwrap_or_else(std::env::temp_dir),
        objects: flags.objects as usize,
        runs: flags.runs as usize,
        updates: flags.updates as usize,
        idle: Duration::from_secs(flags.idle_secs),
        per_name: flags.per_name,
        syncer_args: flags.syncer_arg,
    };
    match sync_load::run(&settings) {
        Ok(results) => {
            print!("{}", sync_load::report(&settings, &results));
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("sync-load: {err:#}");
            ExitCode::FAILURE
        }
    }
}
