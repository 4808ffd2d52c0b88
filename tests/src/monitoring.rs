//! `manifests/monitoring/`: the alert rules' one source (`rules.src.yaml`) rendered into a plain
//! Prometheus rule file and a prometheus-operator `PrometheusRule`, and what the checks of
//! `tests/manifests/monitoring.rs` read from them (the metric names and matchers of an
//! expression). The binary `monitoring-rules` writes the rendered files; the test fails while
//! they differ from the source.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The source, relative to `manifests/monitoring/`.
pub const SOURCE: &str = "rules.src.yaml";
/// The plain Prometheus rule file (`rule_files:`), relative to `manifests/monitoring/`.
pub const RULE_FILE: &str = "cert-reload.rules.yaml";
/// The prometheus-operator `PrometheusRule`, relative to `manifests/monitoring/`.
pub const PROMETHEUS_RULE: &str = "prometheusrule.yaml";
/// The runbooks the rules' `runbook_url`s point at, relative to the workspace.
pub const RUNBOOKS: &str = "docs/runbooks.md";

/// `<workspace>/manifests/monitoring`.
pub fn dir() -> PathBuf {
    crate::manifests::dir().join("monitoring")
}

/// `rules.src.yaml`: the alerts as we write them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// The runbooks' URL; each alert's `runbook_url` is this + `#` + its anchor.
    pub runbooks: String,
    /// Text shared by annotations: `${name}` is replaced by `templates[name]`.
    #[serde(default)]
    pub templates: BTreeMap<String, String>,
    pub groups: Vec<SourceGroup>,
}

/// A rule group of the source.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceGroup {
    pub name: String,
    pub rules: Vec<SourceAlert>,
}

/// One alert of the source.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceAlert {
    pub alert: String,
    /// `info`, `warning` or `critical`.
    pub severity: String,
    #[serde(rename = "for")]
    pub for_: Option<String>,
    pub expr: String,
    pub summary: String,
    pub description: String,
}

/// A rule file's groups, as Prometheus reads them (`groups:`), and as a PrometheusRule's
/// `spec` holds them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    pub groups: Vec<Group>,
}

/// A rendered group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Group {
    pub name: String,
    pub rules: Vec<Rule>,
}

/// A rendered alerting rule, its fields in Prometheus' documented order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub alert: String,
    pub expr: String,
    #[serde(rename = "for", skip_serializing_if = "Option::is_none", default)]
    pub for_: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// The severities a rule may carry (kube-prometheus' and OpenShift's).
pub const SEVERITIES: [&str; 3] = ["info", "warning", "critical"];

/// The `PrometheusRule` object's metadata: in the namespace of the kube-apiserver's sidecars
/// (OpenShift's platform Prometheus reads rules of `openshift-*` namespaces labelled for
/// cluster monitoring; kube-prometheus selects every PrometheusRule by default; `kustomize`'s
/// `namespace:` moves it).
const METADATA: &str = concat!(
    "  name: cert-reload\n",
    "  namespace: openshift-kube-apiserver\n",
    "  labels:\n",
    "    app.kubernetes.io/name: cert-reload\n",
    "    app.kubernetes.io/component: alert-rules\n",
    "    prometheus: k8s\n",
    "    role: alert-rules\n",
);

fn header(what: &str) -> String {
    format!(
        "# {what}\n# Generated from {SOURCE} by `cargo run --bin monitoring-rules`: edit that file, not this one.\n"
    )
}

impl Source {
    /// Reads `manifests/monitoring/rules.src.yaml`.
    ///
    /// # Errors
    /// When it cannot be read or does not have the source's shape, naming the file.
    pub fn load() -> Result<Source, String> {
        let path = dir().join(SOURCE);
        let text = std::fs::read_to_string(&path)
            .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
        serde_norway::from_str(&text).map_err(|err| format!("{}: {err}", path.display()))
    }

    /// The rule groups: templates expanded, severity as a label, summary, description and
    /// runbook_url as annotations.
    ///
    /// # Errors
    /// An unknown severity, a `${name}` naming no template, or an empty summary or description,
    /// naming the alert.
    pub fn render(&self) -> Result<RuleFile, String> {
        let groups = self
            .groups
            .iter()
            .map(|group| {
                let rules = group
                    .rules
                    .iter()
                    .map(|alert| self.rule(alert))
                    .collect::<Result<_, _>>()?;
                Ok(Group {
                    name: group.name.clone(),
                    rules,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(RuleFile { groups })
    }

    fn rule(&self, alert: &SourceAlert) -> Result<Rule, String> {
        let name = &alert.alert;
        if !SEVERITIES.contains(&alert.severity.as_str()) {
            return Err(format!(
                "{name}: severity {:?} is not one of {SEVERITIES:?}",
                alert.severity
            ));
        }
        let summary = self.expand(name, &alert.summary)?;
        let description = self.expand(name, &alert.description)?;
        if summary.trim().is_empty() || description.trim().is_empty() {
            return Err(format!("{name}: a summary and a description are required"));
        }
        Ok(Rule {
            alert: name.clone(),
            expr: alert.expr.clone(),
            for_: alert.for_.clone(),
            labels: BTreeMap::from([("severity".to_owned(), alert.severity.clone())]),
            annotations: BTreeMap::from([
                ("summary".to_owned(), summary),
                ("description".to_owned(), description),
                (
                    "runbook_url".to_owned(),
                    format!("{}#{}", self.runbooks, anchor(name)),
                ),
            ]),
        })
    }

    /// `text` with every `${name}` replaced by its template.
    fn expand(&self, alert: &str, text: &str) -> Result<String, String> {
        let mut out = String::new();
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let end = after
                .find('}')
                .ok_or_else(|| format!("{alert}: unclosed ${{ in {text:?}"))?;
            let name = &after[..end];
            let template = self
                .templates
                .get(name)
                .ok_or_else(|| format!("{alert}: no template {name:?}"))?;
            out.push_str(template);
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }
}

/// The runbook anchor of an alert: its heading `## <Alert>` as GitHub and most Markdown
/// renderers spell the anchor (lower case).
pub fn anchor(alert: &str) -> String {
    alert.to_ascii_lowercase()
}

/// The plain Prometheus rule file's text.
///
/// # Panics
/// Never: the groups serialize.
pub fn plain_text(rules: &RuleFile) -> String {
    header("cert-reload's alert rules, as a Prometheus rule file (rule_files:).")
        + &serde_norway::to_string(rules).expect("rule groups serialize")
}

/// The PrometheusRule's text: the same groups under `spec`.
///
/// # Panics
/// Never: the groups serialize.
pub fn prometheus_rule_text(rules: &RuleFile) -> String {
    let spec = serde_norway::to_string(rules).expect("rule groups serialize");
    let indented: String = spec.lines().map(|line| format!("  {line}\n")).collect();
    header("cert-reload's alert rules, as a prometheus-operator PrometheusRule.")
        + "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata:\n"
        + METADATA
        + "spec:\n"
        + &indented
}

/// The generated files and their expected contents, relative to `manifests/monitoring/`.
///
/// # Errors
/// When the source cannot be read or rendered.
pub fn generated() -> Result<Vec<(&'static str, String)>, String> {
    let rules = Source::load()?.render()?;
    Ok(vec![
        (RULE_FILE, plain_text(&rules)),
        (PROMETHEUS_RULE, prometheus_rule_text(&rules)),
    ])
}

/// A metric an expression selects, with its label matchers (`name`, `op`, `value`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub metric: String,
    pub matchers: Vec<(String, String, String)>,
}

/// PromQL words that are not metric names.
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "inf",
    "nan",
];

/// Keywords followed by a parenthesised list of label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The metrics `expr` selects (in order, repeated as written): every identifier that is not a
/// keyword, a function (followed by `(`), a label in a matcher or a label list, a number, a
/// duration or a string.
///
/// # Errors
/// An unclosed `{`, `[`, `(` list or string.
pub fn selectors(expr: &str) -> Result<Vec<Selector>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let skip_ws = |mut i: usize| {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        i
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = end_of_string(&chars, i).ok_or_else(|| format!("unclosed string in {expr}"))?;
        } else if c == '[' {
            i = find(&chars, i, ']').ok_or_else(|| format!("unclosed [ in {expr}"))? + 1;
        } else if c == '{' {
            // Matchers without a metric name: `{__name__=~...}` is not used by our rules.
            return Err(format!("a selector without a metric name in {expr}"));
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = skip_ws(i);
            if LABEL_LISTS.contains(&word.as_str()) && chars.get(next) == Some(&'(') {
                i = find(&chars, next, ')').ok_or_else(|| format!("unclosed ( in {expr}"))? + 1;
            } else if KEYWORDS.contains(&word.as_str()) || chars.get(next) == Some(&'(') {
                // A keyword, or a function or aggregation applied to what follows.
            } else {
                let mut selector = Selector {
                    metric: word,
                    matchers: Vec::new(),
                };
                if chars.get(next) == Some(&'{') {
                    let close =
                        find(&chars, next, '}').ok_or_else(|| format!("unclosed {{ in {expr}"))?;
                    let inside: String = chars[next + 1..close].iter().collect();
                    selector.matchers = matchers(&inside)?;
                    i = close + 1;
                }
                out.push(selector);
            }
        } else {
            i += 1;
        }
    }
    Ok(out)
}

/// The index after the string literal starting at `start`.
fn end_of_string(chars: &[char], start: usize) -> Option<usize> {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() {
        if chars[i] == '\\' && quote != '`' {
            i += 2;
            continue;
        }
        if chars[i] == quote {
            return Some(i + 1);
        }
        i += 1;
    }
    None
}

/// The index of the first `close` after `start` outside string literals.
fn find(chars: &[char], start: usize, close: char) -> Option<usize> {
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => i = end_of_string(chars, i)?,
            c if c == close => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// `label op "value"` matchers, comma-separated.
fn matchers(inside: &str) -> Result<Vec<(String, String, String)>, String> {
    let mut out = Vec::new();
    let chars: Vec<char> = inside.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        while i < chars.len() && (chars[i].is_whitespace() || chars[i] == ',') {
            i += 1;
        }
        if i == chars.len() {
            break;
        }
        let start = i;
        while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
            i += 1;
        }
        let label: String = chars[start..i].iter().collect();
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        let op_start = i;
        while i < chars.len() && matches!(chars[i], '=' | '!' | '~') {
            i += 1;
        }
        let op: String = chars[op_start..i].iter().collect();
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        if label.is_empty()
            || !["=", "!=", "=~", "!~"].contains(&op.as_str())
            || !matches!(chars.get(i), Some('"' | '\'' | '`'))
        {
            return Err(format!("cannot read the matchers {{{inside}}}"));
        }
        let end = end_of_string(&chars, i).ok_or_else(|| format!("unclosed string in {inside}"))?;
        let value: String = chars[i + 1..end - 1].iter().collect();
        out.push((label, op, value));
        i = end;
    }
    Ok(out)
}

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
            let rel = file
                .strip_prefix(&root)
                .expect("under the workspace")
                .display()
                .to_string();
            for (name, handle) in registrations(&text).map_err(|err| format!("{rel}: {err}"))? {
                let what = format!("{rel}: {name}");
                let declared = declared_type(&text, &handle)
                    .ok_or_else(|| format!("{what}: no declaration of `{handle}`"))?;
                let (kind, labels) = metric_type(&text, &declared)
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

fn rust_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_are_the_metric_names_with_their_matchers_and_nothing_else() {
        let expr = r#"
            (increase(a_total{result="error", kind!~"x|y"}[10m]) > 0)
            or (b > 0 unless b offset 30m)
            or time() - max without (instance, pod) (c_seconds > 0) > 7 * 3600
            or sum by (le) (rate(d_bucket[5m])) == bool 1e3
        "#;
        let got = selectors(expr).unwrap();
        let names: Vec<&str> = got.iter().map(|s| s.metric.as_str()).collect();
        assert_eq!(names, ["a_total", "b", "b", "c_seconds", "d_bucket"]);
        assert_eq!(
            got[0].matchers,
            [
                ("result".into(), "=".into(), "error".into()),
                ("kind".into(), "!~".into(), "x|y".into())
            ]
        );
    }

    #[test]
    fn an_unclosed_matcher_is_an_error() {
        assert!(selectors(r#"a{b="c""#).is_err());
        assert!(selectors(r#"a{b}"#).is_err());
    }
}
