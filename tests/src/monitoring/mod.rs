//! `manifests/monitoring/`: the alert rules' one source (`rules.src.yaml`) rendered into a plain
//! Prometheus rule file and a prometheus-operator `PrometheusRule`, and what the checks of
//! `tests/manifests/monitoring.rs` read from them and from our code: the metric names and
//! matchers of an expression ([`selectors`], `promql.rs`) and the metric families our code
//! registers ([`registered_metrics`], `registered.rs`). The binary `monitoring-rules` writes the
//! rendered files; the test fails while they differ from the source.

mod promql;
mod registered;

pub use promql::{Selector, selectors};
pub use registered::{REGISTERING_CODE, Registered, registered_metrics};

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
