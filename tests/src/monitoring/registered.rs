//! The metric families our code registers, read from its source: each
//! `registry.register("name", "help", handle.clone())` with the handle's declared type and the
//! fields of its label set.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// What a metric family registered by our code looks like on `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The source file that registers it, relative to the workspace.
    pub file: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// Its label names (the fields of its label set).
    pub labels: std::collections::BTreeSet<String>,
}

/// The folders whose `registry.register(...)` calls are "our code" for the rules (the sidecars
/// and the library servers link).
pub const REGISTERING_CODE: [&str; 2] = ["cert-syncer/src", "reload-lib/src"];

/// Every metric family `REGISTERING_CODE` registers, by the name it has on `/metrics`
/// (prometheus-client adds `_total` to a counter's name): read from the source, each
/// `register("name", "help", handle)` with the handle's declared type (`Family<Labels,
/// Counter>`, `Counter`, `Gauge`, ...) and the fields of `Labels`, all in the same file.
///
/// # Errors
/// A registration whose handle, type or label set cannot be found in its file, naming it.
pub fn registered_metrics() -> Result<BTreeMap<String, Registered>, String> {
    let root = crate::manifests::dir()
        .parent()
        .expect("manifests/ is in the workspace")
        .to_owned();
    let mut out = BTreeMap::new();
    for dir in REGISTERING_CODE {
        for file in rust_files(&root.join(dir)) {
            let text = std::fs::read_to_string(&file)
                .map_err(|err| format!("cannot read {}: {err}", file.display()))?;
            let text = without_tests(&text);
            let rel = file
                .strip_prefix(&root)
                .expect("under the workspace")
                .display()
                .to_string();
            for (name, handle) in registrations(text).map_err(|err| format!("{rel}: {err}"))? {
                let what = format!("{rel}: {name}");
                let declared = declared_type(text, &handle)
                    .ok_or_else(|| format!("{what}: no declaration of `{handle}`"))?;
                let (kind, labels) = metric_type(text, &declared)
                    .ok_or_else(|| format!("{what}: cannot read the type `{declared}`"))?;
                let exposed = match kind {
                    "counter" => format!("{name}_total"),
                    _ => name,
                };
                out.insert(
                    exposed,
                    Registered {
                        file: rel.clone(),
                        kind,
                        labels,
                    },
                );
            }
        }
    }
    Ok(out)
}

/// `text` up to its inline test module (`#[cfg(test)]` then `mod … {`: the house style puts it
/// last), so registrations in unit tests do not count as our code's (test modules in files of
/// their own, `*_tests.rs`, are skipped whole).
fn without_tests(text: &str) -> &str {
    let mut from = 0;
    while let Some(at) = text[from..].find("#[cfg(test)]") {
        let at = from + at;
        let item = text[at + "#[cfg(test)]".len()..]
            .trim_start()
            .lines()
            .next()
            .unwrap_or_default();
        let module = item.starts_with("mod ") || item.starts_with("pub") && item.contains(" mod ");
        if module && item.trim_end().ends_with('{') {
            return &text[..at];
        }
        from = at + 1;
    }
    text
}

fn rust_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                && !path.to_string_lossy().ends_with("_tests.rs")
            {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// `(name, handle)` of each `.register("name", "help", handle.clone())` in `text`: the handle
/// is the last identifier before `.clone()` (`metrics.syncs.clone()` gives `syncs`). Calls whose
/// first argument is not a string literal are not metric registrations.
///
/// # Errors
/// A registration with a name but no `handle.clone()`.
fn registrations(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices(".register(") {
        let rest = text[at + ".register(".len()..].trim_start();
        let Some(rest) = rest.strip_prefix('"') else {
            continue;
        };
        let Some(end) = rest.find('"') else { continue };
        let name = rest[..end].to_owned();
        let clone = rest
            .find(".clone()")
            .ok_or_else(|| format!("{name}: the registered handle is not `handle.clone()`"))?;
        let before = &rest[..clone];
        let handle: String = before
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        out.push((name, handle));
    }
    Ok(out)
}

/// The type text of `handle: TYPE` (a struct field or a `let`) in `text`, up to the `,`, `;`,
/// `=` or `}` that ends it outside `<>`.
fn declared_type(text: &str, handle: &str) -> Option<String> {
    let pattern = format!("{handle}: ");
    for (at, _) in text.match_indices(&pattern) {
        let preceded = text[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        if !preceded {
            continue;
        }
        let rest = &text[at + pattern.len()..];
        let mut depth = 0;
        for (i, c) in rest.char_indices() {
            match c {
                '<' => depth += 1,
                '>' => depth -= 1,
                ',' | ';' | '=' | '}' | '\n' if depth == 0 => {
                    let ty = rest[..i].trim();
                    if ty.contains("Counter") || ty.contains("Gauge") || ty.contains("Histogram") {
                        return Some(ty.to_owned());
                    }
                    break;
                }
                _ => {}
            }
        }
    }
    None
}

/// The kind and label names of a declared metric type: `Counter`, `Gauge`, or
/// `Family<Labels, Counter>` whose `struct Labels { a: ..., b: ... }` is in `text`.
fn metric_type(
    text: &str,
    declared: &str,
) -> Option<(&'static str, std::collections::BTreeSet<String>)> {
    let kind = if declared.contains("Counter") {
        "counter"
    } else if declared.contains("Gauge") {
        "gauge"
    } else if declared.contains("Histogram") {
        "histogram"
    } else {
        return None;
    };
    let Some(inner) = declared.strip_prefix("Family<") else {
        return Some((kind, std::collections::BTreeSet::new()));
    };
    let labels_type = inner.split(',').next()?.trim();
    let start = text.find(&format!("struct {labels_type} {{"))?;
    let body = &text[start..];
    let body = &body[body.find('{')? + 1..body.find('}')?];
    let labels = body
        .split(',')
        .filter_map(|field| {
            let name = field.split(':').next()?.trim();
            let name = name.rsplit(' ').next()?.trim();
            (!name.is_empty()).then(|| name.to_owned())
        })
        .collect();
    Some((kind, labels))
}
