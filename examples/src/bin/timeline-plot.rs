//! `timeline-plot`: milestone lines (the format of `examples::milestones`: what the recovery
//! tests print and `recovery-demo --timeline FILE.txt` writes) to an SVG plot. Reads the files
//! given, or standard input; a whole test log can be given, other lines are skipped. Exits 1
//! when the input holds no milestone, 2 on bad flags.
//!
//! ```sh
//! cargo run --bin timeline-plot -- --title "The whole recovery" run.log -o docs/recovery.svg
//! ```

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use examples::milestones;

/// Plots milestone lines (`milestone [SERIES] +TIME ms|s: NAME`) as SVG.
#[derive(Debug, Parser)]
#[command(name = "timeline-plot")]
struct Flags {
    /// The plot's title.
    #[arg(long, default_value = "Timeline")]
    title: String,
    /// Where to write the SVG (default: standard output).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Files to read (default: standard input). Runs are split where a milestone repeats, in
    /// each file.
    inputs: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    match run(&flags) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("timeline-plot: {err:#}");
            ExitCode::from(1)
        }
    }
}

fn run(flags: &Flags) -> anyhow::Result<()> {
    let mut runs = Vec::new();
    if flags.inputs.is_empty() {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        runs.extend(milestones::runs(&text));
    }
    for path in &flags.inputs {
        let text = std::fs::read_to_string(path)
            .map_err(|err| anyhow::anyhow!("cannot read {}: {err}", path.display()))?;
        runs.extend(milestones::runs(&text));
    }
    anyhow::ensure!(
        !runs.is_empty(),
        "no milestone lines (`milestone [SERIES] +TIME ms|s: NAME`) in the input"
    );
    let svg = milestones::svg(&flags.title, &milestones::rows(&runs));
    match &flags.output {
        Some(path) => std::fs::write(path, svg)
            .map_err(|err| anyhow::anyhow!("cannot write {}: {err}", path.display()))?,
        None => print!("{svg}"),
    }
    Ok(())
}
