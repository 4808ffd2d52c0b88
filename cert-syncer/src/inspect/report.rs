//! The rows of `cert-syncer inspect` and their two renderings: an aligned table for people and
//! a JSON array for programs. The JSON shape is documented in `cert-syncer/README.md` and kept
//! stable: fields are added, never renamed or removed.

use std::io::Write;

use serde::Serialize;

use crate::base::kind::Kind;

/// One certificate (or one entry that could not be read).
#[derive(Debug, Serialize)]
pub(super) struct Row {
    /// The file's path, or `secrets/NAME/KEY` / `configmaps/NAME/KEY`.
    pub source: String,
    /// The file, when read from a directory.
    pub file: Option<String>,
    /// The object and key, when read through the API.
    pub object: Option<ObjectRef>,
    /// Position of the certificate in its file or key, 0 for the first.
    pub index: Option<usize>,
    pub role: Option<Role>,
    pub certificate: Option<Facts>,
    /// The private key paired with a leaf, and whether it matches.
    pub key: Option<KeyCheck>,
    /// Whether a leaf chains to a CA bundle.
    pub chain: Option<ChainCheck>,
    pub status: Status,
    /// Everything wrong with this row; non-empty means exit code 1.
    pub problems: Vec<Problem>,
}

/// An object and key read through the API.
#[derive(Debug, Serialize)]
pub(super) struct ObjectRef {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    pub key: String,
}

/// What a certificate is in its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Role {
    /// The first certificate of a file paired with a private key.
    Leaf,
    /// A certificate after the first in a chain file.
    Intermediate,
    /// A certificate of a CA bundle (CA certificates and no key).
    Ca,
    /// The first certificate of a file without a key that is not a CA bundle.
    Certificate,
}

/// What a certificate says about itself, and the time left at the evaluation time.
#[derive(Debug, Serialize)]
pub(super) struct Facts {
    /// RFC 4514 style, e.g. `CN=api,O=example`.
    pub subject: String,
    pub issuer: String,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<String>,
    /// Lowercase hex.
    pub serial: String,
    /// SHA-256 of the DER, lowercase hex.
    pub sha256: String,
    pub is_ca: bool,
    /// RFC 3339, UTC.
    pub not_before: String,
    /// RFC 3339, UTC.
    pub not_after: String,
    /// notAfter minus now; negative once expired.
    pub seconds_left: i64,
    /// `29d 23h`, `expired 3d 2h ago`, `valid in 5m 10s`.
    pub time_left: String,
}

/// The key paired with a leaf.
#[derive(Debug, Serialize)]
pub(super) struct KeyCheck {
    /// Where the key was read (the certificate's own source for a combined file).
    pub source: String,
    pub result: KeyResult,
}

/// Whether the key belongs to the certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum KeyResult {
    Match,
    Mismatch,
    /// Unreadable, not a private key, or an unsupported one.
    Unusable,
}

/// The chain check of a leaf.
#[derive(Debug, Serialize)]
pub(super) struct ChainCheck {
    pub result: ChainResult,
    /// The bundle it chains to.
    pub bundle: Option<String>,
    /// Every bundle it was checked against.
    pub checked: Vec<String>,
    /// Whether `no` counts as a problem for `unknown-issuer` (a `--ca-bundle` or a bundle in the
    /// same directory or object), as opposed to a search of every bundle found.
    pub required: bool,
    /// Why it does not chain.
    pub error: Option<String>,
}

/// The outcome of a chain check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum ChainResult {
    Yes,
    No,
    /// No bundle found holds the issuer, and no bundle was required.
    UnknownIssuer,
}

/// A row's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Status {
    Ok,
    /// Valid, but expires within `--warn-within`.
    Expiring,
    /// At least one problem.
    Problem,
}

/// One thing wrong with a row.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Problem {
    pub kind: ProblemKind,
    /// A sentence naming what is wrong (and the other file involved, if any).
    pub message: String,
}

/// The kinds of problems.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum ProblemKind {
    Expired,
    NotYetValid,
    KeyMismatch,
    KeyUnusable,
    NoChain,
    /// The file or key could not be read or is not what its name or content promises.
    Unreadable,
}

impl ProblemKind {
    fn label(self) -> &'static str {
        match self {
            ProblemKind::Expired => "expired",
            ProblemKind::NotYetValid => "not-yet-valid",
            ProblemKind::KeyMismatch => "key-mismatch",
            ProblemKind::KeyUnusable => "key-unusable",
            ProblemKind::NoChain => "no-chain",
            ProblemKind::Unreadable => "unreadable",
        }
    }
}

/// The rows as a JSON array, pretty-printed, with a final newline.
pub(super) fn write_json(out: &mut impl Write, rows: &[Row]) -> std::io::Result<()> {
    serde_json::to_writer_pretty(&mut *out, rows)?;
    writeln!(out)
}

/// The rows as aligned columns under a header; nothing for no rows.
pub(super) fn write_table(out: &mut impl Write, rows: &[Row]) -> std::io::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let mut table = comfy_table::Table::new();
    table.load_style(comfy_table::presets::NOTHING);
    table.set_header([
        "SOURCE",
        "SUBJECT",
        "SANS",
        "ISSUER",
        "NOT BEFORE",
        "NOT AFTER",
        "LEFT",
        "KEY",
        "CHAIN",
        "STATUS",
    ]);
    for row in rows {
        table.add_row(cells(row));
    }
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    for line in table.lines() {
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

fn cells(row: &Row) -> Vec<String> {
    let source = match row.index {
        Some(index) if index > 0 => format!("{}[{index}]", row.source),
        _ => row.source.clone(),
    };
    let dash = || "-".to_owned();
    let (subject, sans, issuer, not_before, not_after, left) = match &row.certificate {
        Some(facts) => {
            let sans: Vec<&str> = facts
                .dns_names
                .iter()
                .chain(&facts.ip_addresses)
                .map(String::as_str)
                .collect();
            (
                facts.subject.clone(),
                if sans.is_empty() {
                    dash()
                } else {
                    sans.join(",")
                },
                facts.issuer.clone(),
                facts.not_before.clone(),
                facts.not_after.clone(),
                facts.time_left.clone(),
            )
        }
        None => (dash(), dash(), dash(), dash(), dash(), dash()),
    };
    let key = row.key.as_ref().map_or_else(dash, |key| {
        match key.result {
            KeyResult::Match => "yes",
            KeyResult::Mismatch => "NO",
            KeyResult::Unusable => "BAD",
        }
        .to_owned()
    });
    let chain = row.chain.as_ref().map_or_else(dash, |chain| {
        match chain.result {
            ChainResult::Yes => "yes",
            ChainResult::No => "NO",
            ChainResult::UnknownIssuer => "unknown",
        }
        .to_owned()
    });
    let status = match row.status {
        Status::Ok => "ok".to_owned(),
        Status::Expiring => "expiring".to_owned(),
        Status::Problem => row
            .problems
            .iter()
            .map(|p| match p.kind {
                // Nothing else in the row says what is wrong with an unreadable entry.
                ProblemKind::Unreadable => format!("unreadable: {}", p.message),
                other => other.label().to_owned(),
            })
            .collect::<Vec<_>>()
            .join(","),
    };
    vec![
        source, subject, sans, issuer, not_before, not_after, left, key, chain, status,
    ]
}

/// `29d 23h`, `expired 3d 2h ago`, `valid in 5m 10s`: the two largest units.
pub(super) fn time_left(now: i64, not_before: i64, not_after: i64) -> String {
    if now < not_before {
        format!("valid in {}", span(not_before - now))
    } else if now > not_after {
        format!("expired {} ago", span(now - not_after))
    } else {
        span(not_after - now)
    }
}

/// `3d 2h`, `5m 10s`: a duration in its two largest units.
pub(super) fn span(seconds: i64) -> String {
    let (days, hours) = (seconds / 86_400, seconds % 86_400 / 3600);
    let (minutes, secs) = (seconds % 3600 / 60, seconds % 60);
    if days > 0 {
        format!("{days}d {hours}h")
    } else if hours > 0 {
        format!("{hours}h {minutes}m")
    } else if minutes > 0 {
        format!("{minutes}m {secs}s")
    } else {
        format!("{secs}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_left_shows_the_two_largest_units_and_the_direction() {
        let day = 86_400;
        assert_eq!(time_left(0, -day, 30 * day - 3600), "29d 23h");
        assert_eq!(time_left(0, -day, 2 * 3600 + 5 * 60), "2h 5m");
        assert_eq!(time_left(0, -day, 70), "1m 10s");
        assert_eq!(time_left(0, -day, 0), "0s");
        assert_eq!(time_left(3 * day + 7200, -day, 0), "expired 3d 2h ago");
        assert_eq!(time_left(0, 310, day), "valid in 5m 10s");
    }
}
