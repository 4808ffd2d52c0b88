//! `cert-syncer inspect`: every certificate of some directories (a resource directory written by
//! `sync`, or plain PEM files) or of a namespace's Secrets and ConfigMaps, with its validity,
//! whether its private key matches and whether it chains to a CA bundle.
//!
//! - [`scan`] and [`api`]: where the bytes come from, as [`source::Group`]s of named entries (a
//!   directory's files, an object's keys);
//! - [`check`]: what each entry holds (certificates, a key, a bundle, garbage), how certificates
//!   pair with keys and bundles, and the facts and problems of each certificate;
//! - [`report`]: the rows as a table or as JSON.
//!
//! Reading never stops at a bad file: it becomes a row with the reason, and the exit code says
//! that something is wrong.

mod api;
mod check;
mod report;
mod scan;
mod source;

use std::io::Write;

use anyhow::Context;

use crate::base::error::ConfigError;
use crate::base::time::unix_now;
use crate::kube::connection::Connection;

/// What `inspect` looks at and how it reports.
#[derive(Debug)]
pub(crate) struct Settings {
    /// Used with `namespace` (connected by the app shell).
    pub connection: crate::kube::connection::Settings,
    /// Directories to read, recursively.
    pub dirs: Vec<std::path::PathBuf>,
    /// A namespace whose Secrets and ConfigMaps are read through the API.
    pub namespace: Option<String>,
    /// CA bundle files every certificate must chain to.
    pub ca_bundles: Vec<std::path::PathBuf>,
    /// Certificates expiring within this are `expiring`.
    pub warn_within: std::time::Duration,
    /// A JSON array instead of the table.
    pub json: bool,
    /// Evaluate at this time (Unix seconds) instead of now.
    pub now: Option<i64>,
}

/// Inspects what the settings name and prints the rows. `Err` when any row has a problem (exit
/// code 1, one line per problem on stderr), or when nothing could be inspected at all.
/// `connection` is the app shell's, set when `namespace` is.
pub(crate) async fn run(args: Settings, connection: Option<Connection>) -> anyhow::Result<()> {
    let now = args.now.unwrap_or_else(unix_now);
    let required = args
        .ca_bundles
        .iter()
        .map(|path| check::Bundle::from_file(path))
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let mut groups = Vec::new();
    for dir in &args.dirs {
        groups.extend(scan::directory(dir)?);
    }
    if let (Some(namespace), Some(connection)) = (&args.namespace, &connection) {
        groups.extend(api::namespace(connection, namespace).await?);
    }
    let rows = check::inspect(&groups, &required, now, args.warn_within);

    let mut stdout = std::io::stdout().lock();
    if args.json {
        report::write_json(&mut stdout, &rows)
    } else {
        report::write_table(&mut stdout, &rows)
    }
    .and_then(|()| stdout.flush())
    .context("cannot write the report to stdout")?;

    let certificates = rows.iter().filter(|row| row.certificate.is_some()).count();
    let problems: Vec<_> = rows
        .iter()
        .flat_map(|row| row.problems.iter().map(move |p| (row, p)))
        .collect();
    if problems.is_empty() && certificates == 0 {
        anyhow::bail!("no certificate found");
    }
    if problems.is_empty() {
        return Ok(());
    }
    let mut stderr = std::io::stderr().lock();
    for (row, problem) in &problems {
        let _ = writeln!(stderr, "{}: {}", row.source, problem.message);
    }
    let rows_with_problems = rows.iter().filter(|row| !row.problems.is_empty()).count();
    anyhow::bail!("{rows_with_problems} of {} rows have problems", rows.len())
}
