//! What each entry holds, how certificates pair with keys and bundles, and what is wrong.
//!
//! Per group (a directory, an object):
//! - an entry is **certificates** when it mentions `BEGIN CERTIFICATE` or is named `*.crt` /
//!   `*.cert` (then it must parse, all of it, or it is a broken row naming the file); a **key**
//!   when it is named `*.key`, or holds a private key and no certificate; anything else (tokens,
//!   kubeconfigs, public keys) is not material and is skipped;
//! - a certificate entry's key is in the entry itself (a combined file), else `X.key` beside
//!   `X.crt`/`X.cert`/`X.pem` (so `tls.crt` + `tls.key`), else `X-key.pem` beside `X.pem`;
//! - a certificate entry without a key whose certificates are all CAs is a **CA bundle**;
//! - the leaf of a pair, or the first certificate of a non-bundle entry, is checked against the
//!   `--ca-bundle` files if given, else against the bundles of its own group if any (both
//!   *required*: not chaining is a problem), else against every bundle found (not finding its
//!   issuer anywhere is then `unknown-issuer`, not a problem; a path that exists by name but
//!   fails verification still is).
//!
//! Every certificate, bundle CAs and intermediates included, is expired when now is past its
//! notAfter, not yet valid before its notBefore, and `expiring` (a warning) within
//! `--warn-within` of its notAfter. The chain is verified at now, or, for a leaf outside its own
//! validity window, at the nearest edge of that window: its expiry is reported once, as
//! `expired`, and the chain column still answers whether the right CA signed it.

use std::path::Path;
use std::time::Duration;

use super::report::{
    ChainCheck, ChainResult, Facts, KeyCheck, KeyResult, ObjectRef, Problem, ProblemKind, Role,
    Row, Status, span, time_left,
};
use super::source::{Entry, Group, Origin};
use crate::base::error::ConfigError;
use crate::base::time::rfc3339;
use crate::pki::{self, Cert, ChainError};

/// CA certificates a leaf may chain to.
#[derive(Debug, Clone)]
pub(super) struct Bundle {
    /// Where it was read, as rows name sources.
    pub source: String,
    pub certs: Vec<Cert>,
}

impl Bundle {
    /// A `--ca-bundle` file.
    ///
    /// # Errors
    /// Unreadable or not all certificates: a bad flag (exit code 2), naming the file.
    pub(super) fn from_file(path: &Path) -> Result<Bundle, ConfigError> {
        let bytes = std::fs::read(path)
            .map_err(|err| ConfigError(format!("--ca-bundle {}: {err}", path.display())))?;
        let certs = pki::parse_certs(&bytes)
            .map_err(|err| ConfigError(format!("--ca-bundle {}: {err}", path.display())))?;
        Ok(Bundle {
            source: path.display().to_string(),
            certs,
        })
    }
}

/// What an entry holds.
enum Content {
    /// Certificates, leaf first for a chain; `with_key` when the same text holds a private key.
    Certs { certs: Vec<Cert>, with_key: bool },
    /// A private key (or a `*.key` name) and no certificate: checked when a certificate pairs
    /// with it, or on its own if nothing does.
    Key,
    /// Promised certificates or a key (by name or content) and could not be read or parsed.
    Broken(String),
    /// Not certificate material.
    Other,
}

use super::source::WHOLE_OBJECT;

const CERT_MARKER: &[u8] = b"-----BEGIN CERTIFICATE-----";
const KEY_MARKER: &[u8] = b"PRIVATE KEY-----";

fn is_cert_name(name: &str) -> bool {
    name.ends_with(".crt") || name.ends_with(".cert")
}

fn is_key_name(name: &str) -> bool {
    name.ends_with(".key")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn classify(entry: &Entry) -> Content {
    let name = entry.name.as_str();
    let bytes = match &entry.bytes {
        Ok(bytes) => bytes,
        // An object that does not decode may hold certificates: reported, never skipped.
        Err(err) if is_cert_name(name) || is_key_name(name) || name == WHOLE_OBJECT => {
            return Content::Broken(err.clone());
        }
        Err(_) => return Content::Other,
    };
    let mentions_cert = contains(bytes, CERT_MARKER);
    if is_key_name(name) && !mentions_cert {
        return Content::Key;
    }
    if mentions_cert || is_cert_name(name) {
        return match pki::parse_certs(bytes) {
            Ok(certs) => Content::Certs {
                certs,
                with_key: contains(bytes, KEY_MARKER),
            },
            Err(err) => Content::Broken(err.to_string()),
        };
    }
    if contains(bytes, KEY_MARKER) {
        Content::Key
    } else {
        Content::Other
    }
}

/// The names a certificate entry's key may have, in order of preference.
fn key_names(name: &str) -> Vec<String> {
    let mut names = Vec::new();
    for extension in [".crt", ".cert", ".pem"] {
        if let Some(stem) = name.strip_suffix(extension) {
            names.push(format!("{stem}.key"));
        }
    }
    if let Some(stem) = name.strip_suffix(".pem") {
        names.push(format!("{stem}-key.pem"));
    }
    names
}

/// One group, classified and paired.
struct Analysis<'g> {
    group: &'g Group,
    contents: Vec<Content>,
    /// Per entry: the entry holding its private key.
    keys: Vec<Option<usize>>,
    /// Per entry: a certificate entry pairs with it as its key.
    is_someones_key: Vec<bool>,
    /// Per entry: a CA bundle.
    is_bundle: Vec<bool>,
}

impl<'g> Analysis<'g> {
    fn new(group: &'g Group) -> Analysis<'g> {
        let contents: Vec<Content> = group.entries.iter().map(classify).collect();
        let n = contents.len();
        let mut keys = vec![None; n];
        let mut is_someones_key = vec![false; n];
        let mut is_bundle = vec![false; n];
        for (i, content) in contents.iter().enumerate() {
            let Content::Certs { certs, with_key } = content else {
                continue;
            };
            let key = if *with_key {
                Some(i)
            } else {
                key_names(&group.entries[i].name).iter().find_map(|wanted| {
                    group
                        .entries
                        .iter()
                        .position(|e| &e.name == wanted)
                        .filter(|&k| {
                            !matches!(
                                contents[k],
                                Content::Certs {
                                    with_key: false,
                                    ..
                                }
                            )
                        })
                })
            };
            match key {
                Some(k) => {
                    keys[i] = Some(k);
                    is_someones_key[k] = true;
                }
                None => is_bundle[i] = certs.iter().all(|c| c.is_ca),
            }
        }
        Analysis {
            group,
            contents,
            keys,
            is_someones_key,
            is_bundle,
        }
    }

    fn bundles(&self) -> Vec<Bundle> {
        self.contents
            .iter()
            .enumerate()
            .filter(|(i, _)| self.is_bundle[*i])
            .filter_map(|(i, content)| match content {
                Content::Certs { certs, .. } => Some(Bundle {
                    source: self.group.origin.source(&self.group.entries[i].name),
                    certs: certs.clone(),
                }),
                _ => None,
            })
            .collect()
    }
}

/// The rows for `groups`: every certificate, and every entry that promised material and is
/// broken, in group and entry order.
pub(super) fn inspect(
    groups: &[Group],
    required: &[Bundle],
    now: i64,
    warn_within: Duration,
) -> Vec<Row> {
    let analyses: Vec<Analysis<'_>> = groups.iter().map(Analysis::new).collect();
    let everywhere: Vec<Bundle> = analyses.iter().flat_map(Analysis::bundles).collect();
    let warn_within = i64::try_from(warn_within.as_secs()).unwrap_or(i64::MAX);
    let mut rows = Vec::new();
    for analysis in &analyses {
        let local = analysis.bundles();
        let trust = if !required.is_empty() {
            Some((required, true))
        } else if !local.is_empty() {
            Some((local.as_slice(), true))
        } else if !everywhere.is_empty() {
            Some((everywhere.as_slice(), false))
        } else {
            None
        };
        for (i, entry) in analysis.group.entries.iter().enumerate() {
            let origin = &analysis.group.origin;
            match &analysis.contents[i] {
                Content::Certs { certs, .. } => {
                    let is_bundle = analysis.is_bundle[i];
                    let key = analysis.keys[i].map(|k| &analysis.group.entries[k]);
                    for (index, cert) in certs.iter().enumerate() {
                        let role = match (index, is_bundle, key) {
                            (_, true, _) => Role::Ca,
                            (0, false, Some(_)) => Role::Leaf,
                            (0, false, None) => Role::Certificate,
                            _ => Role::Intermediate,
                        };
                        let mut row = certificate_row(origin, entry, index, role, cert, now);
                        if index == 0 && !is_bundle {
                            if let Some(key) = key {
                                check_key(&mut row, origin, cert, key);
                            }
                            if let Some((bundles, required)) = trust {
                                check_chain(&mut row, certs, bundles, required, now);
                            }
                        }
                        rows.push(finish(row, now, cert.not_after, warn_within));
                    }
                }
                Content::Broken(why) if !analysis.is_someones_key[i] => {
                    rows.push(broken_row(origin, entry, why.clone()));
                }
                Content::Key if !analysis.is_someones_key[i] => {
                    // A key nothing pairs with (a service-account signing key) is not listed,
                    // unless it is not a key at all.
                    if let Ok(bytes) = &entry.bytes
                        && let Err(err) = pki::parse_key(bytes)
                    {
                        rows.push(broken_row(origin, entry, err.to_string()));
                    }
                }
                _ => {}
            }
        }
    }
    rows
}

fn base_row(origin: &Origin, entry: &Entry) -> Row {
    let source = origin.source(&entry.name);
    let (file, object) = match origin {
        Origin::Dir(_) => (Some(source.clone()), None),
        Origin::Object {
            kind,
            namespace,
            name,
        } => (
            None,
            Some(ObjectRef {
                kind: *kind,
                namespace: namespace.clone(),
                name: name.clone(),
                key: entry.name.clone(),
            }),
        ),
    };
    Row {
        source,
        file,
        object,
        index: None,
        role: None,
        certificate: None,
        key: None,
        chain: None,
        status: Status::Ok,
        problems: Vec::new(),
    }
}

fn broken_row(origin: &Origin, entry: &Entry, why: String) -> Row {
    let mut row = base_row(origin, entry);
    row.problems.push(Problem {
        kind: ProblemKind::Unreadable,
        message: why,
    });
    row.status = Status::Problem;
    row
}

fn certificate_row(
    origin: &Origin,
    entry: &Entry,
    index: usize,
    role: Role,
    cert: &Cert,
    now: i64,
) -> Row {
    let info = &cert.info;
    let mut row = base_row(origin, entry);
    row.index = Some(index);
    row.role = Some(role);
    row.certificate = Some(Facts {
        subject: info.subject.clone(),
        issuer: info.issuer.clone(),
        dns_names: info.dns_names.clone(),
        ip_addresses: info.ip_addresses.iter().map(ToString::to_string).collect(),
        serial: info.serial.clone(),
        sha256: info.sha256.clone(),
        is_ca: info.is_ca,
        not_before: rfc3339(info.not_before),
        not_after: rfc3339(info.not_after),
        seconds_left: info.not_after.saturating_sub(now),
        time_left: time_left(now, info.not_before, info.not_after),
    });
    if now > info.not_after {
        row.problems.push(Problem {
            kind: ProblemKind::Expired,
            message: format!(
                "expired at {} ({} ago)",
                rfc3339(info.not_after),
                span(now - info.not_after)
            ),
        });
    } else if now < info.not_before {
        row.problems.push(Problem {
            kind: ProblemKind::NotYetValid,
            message: format!("not valid before {}", rfc3339(info.not_before)),
        });
    }
    row
}

fn check_key(row: &mut Row, origin: &Origin, leaf: &Cert, key: &Entry) {
    let source = origin.source(&key.name);
    let fits = match &key.bytes {
        Ok(bytes) => pki::key_fits(leaf, bytes).map_err(|err| err.to_string()),
        Err(err) => Err(err.clone()),
    };
    let result = match fits {
        Ok(true) => KeyResult::Match,
        Ok(false) => {
            row.problems.push(Problem {
                kind: ProblemKind::KeyMismatch,
                message: format!("the private key in {source} does not match the certificate"),
            });
            KeyResult::Mismatch
        }
        Err(why) => {
            row.problems.push(Problem {
                kind: ProblemKind::KeyUnusable,
                message: format!("the private key in {source} is unusable: {why}"),
            });
            KeyResult::Unusable
        }
    };
    row.key = Some(KeyCheck { source, result });
}

fn check_chain(row: &mut Row, chain: &[Cert], bundles: &[Bundle], required: bool, now: i64) {
    let leaf = &chain[0];
    let at = now.clamp(leaf.not_before, leaf.not_after.max(leaf.not_before));
    let checked: Vec<String> = bundles.iter().map(|b| b.source.clone()).collect();
    let mut broken = None;
    for bundle in bundles {
        match pki::chains_to(chain, &bundle.certs, at) {
            Ok(()) => {
                row.chain = Some(ChainCheck {
                    result: ChainResult::Yes,
                    bundle: Some(bundle.source.clone()),
                    checked,
                    required,
                    error: None,
                });
                return;
            }
            Err(ChainError::UnknownIssuer) => {}
            Err(ChainError::Invalid(why)) => {
                broken.get_or_insert_with(|| format!("does not chain to {}: {why}", bundle.source));
            }
        }
    }
    let (result, error) = match broken {
        Some(why) => (ChainResult::No, Some(why)),
        None if required => (
            ChainResult::No,
            Some(format!(
                "does not chain to {}: {}",
                checked.join(", "),
                ChainError::UnknownIssuer
            )),
        ),
        None => (ChainResult::UnknownIssuer, None),
    };
    if let Some(why) = &error {
        row.problems.push(Problem {
            kind: ProblemKind::NoChain,
            message: why.clone(),
        });
    }
    row.chain = Some(ChainCheck {
        result,
        bundle: None,
        checked,
        required,
        error,
    });
}

fn finish(mut row: Row, now: i64, not_after: i64, warn_within: i64) -> Row {
    row.status = if !row.problems.is_empty() {
        Status::Problem
    } else if not_after.saturating_sub(now) <= warn_within {
        Status::Expiring
    } else {
        Status::Ok
    };
    row
}

#[cfg(test)]
mod tests;
