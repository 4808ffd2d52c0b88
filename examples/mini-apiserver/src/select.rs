//! Label selectors (equality- and set-based: `=`, `==`, `!=`, `in`, `notin`, `key`, `!key`) and
//! the field selectors kube-apiserver supports for the served kinds: `metadata.name` and
//! `metadata.namespace` everywhere; Events: `involvedObject.*`, `reason`, `reportingComponent`,
//! `source`, `type`; Secrets: `type`. Others get 400 as from kube-apiserver.

use serde_json::Value;

use crate::resource::Resource;
use crate::status::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Term {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed `labelSelector` plus `fieldSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    labels: Vec<Term>,
    fields: Vec<Term>,
}

impl Selector {
    /// Parses the query parameters (either may be absent or empty) for `resource`.
    pub fn parse(
        resource: Resource,
        labels: Option<&str>,
        fields: Option<&str>,
    ) -> Result<Selector, ApiError> {
        let labels = parse_terms(labels.unwrap_or(""), true)?;
        let fields = parse_terms(fields.unwrap_or(""), false)?;
        for term in &fields {
            let key = match term {
                Term::Equals(k, _) | Term::NotEquals(k, _) => k,
                _ => return Err(ApiError::bad_request("field selectors need = or !=")),
            };
            if field_path(resource, key).is_none() {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {key}"
                )));
            }
        }
        Ok(Selector { labels, fields })
    }

    /// Whether `object` matches every term.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.get("metadata").and_then(|m| m.get("labels"));
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        let field = |key: &str| {
            // `source` is the Event's `source.component`.
            let path = if key == "source" {
                "source.component"
            } else {
                key
            };
            path.split('.')
                .try_fold(object, |value, part| value.get(part))?
                .as_str()
        };
        self.labels.iter().all(|term| term_matches(term, label))
            && self.fields.iter().all(|term| term_matches(term, field))
    }
}

/// Whether `key` is a field selector `resource` supports.
fn field_path(resource: Resource, key: &str) -> Option<()> {
    let supported = match key {
        "metadata.name" | "metadata.namespace" => true,
        "type" => matches!(resource, Resource::Events | Resource::Secrets),
        "reason" | "reportingComponent" | "source" => resource == Resource::Events,
        _ => {
            resource == Resource::Events
                && key.strip_prefix("involvedObject.").is_some_and(|f| {
                    matches!(
                        f,
                        "kind"
                            | "namespace"
                            | "name"
                            | "uid"
                            | "apiVersion"
                            | "resourceVersion"
                            | "fieldPath"
                    )
                })
        }
    };
    supported.then_some(())
}

fn term_matches<'a>(term: &Term, value: impl Fn(&str) -> Option<&'a str>) -> bool {
    match term {
        Term::Equals(k, v) => value(k) == Some(v.as_str()),
        Term::NotEquals(k, v) => value(k) != Some(v.as_str()),
        Term::Exists(k) => value(k).is_some(),
        Term::NotExists(k) => value(k).is_none(),
        Term::In(k, values) => value(k).is_some_and(|v| values.iter().any(|w| w == v)),
        Term::NotIn(k, values) => value(k).is_none_or(|v| values.iter().all(|w| w != v)),
    }
}

/// Splits on commas outside parentheses (`a in (x,y),b` is two terms).
fn split_terms(text: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms
}

/// `key in (a,b)` / `key notin (a,b)`.
fn parse_set_term(raw: &str) -> Option<Result<Term, ApiError>> {
    let (key, rest, negated) = if let Some((k, r)) = raw.split_once(" notin ") {
        (k, r, true)
    } else {
        let (k, r) = raw.split_once(" in ")?;
        (k, r, false)
    };
    let key = key.trim().to_owned();
    let Some(list) = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
    else {
        return Some(Err(ApiError::bad_request(format!(
            "unable to parse requirement {raw:?}: expected a parenthesized list"
        ))));
    };
    let values: Vec<String> = list
        .split(',')
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .collect();
    Some(Ok(if negated {
        Term::NotIn(key, values)
    } else {
        Term::In(key, values)
    }))
}

fn parse_terms(text: &str, labels: bool) -> Result<Vec<Term>, ApiError> {
    let mut terms = Vec::new();
    for raw in split_terms(text)
        .into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
    {
        let term = if labels && let Some(term) = parse_set_term(raw) {
            term?
        } else if let Some((k, v)) = raw.split_once("!=") {
            Term::NotEquals(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = raw.split_once("==").or_else(|| raw.split_once('=')) {
            if v.contains('=') {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement {raw:?}"
                )));
            }
            Term::Equals(k.trim().to_owned(), v.trim().to_owned())
        } else if raw.contains(' ') || raw.contains('(') {
            return Err(ApiError::bad_request(format!(
                "unable to parse requirement {raw:?}"
            )));
        } else if !labels {
            return Err(ApiError::bad_request(format!(
                "invalid field selector {raw:?}"
            )));
        } else if let Some(key) = raw.strip_prefix('!') {
            Term::NotExists(key.to_owned())
        } else {
            Term::Exists(raw.to_owned())
        };
        terms.push(term);
    }
    Ok(terms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn equality_inequality_and_existence_terms_match_labels() {
        let object = json!({"metadata": {"name": "a", "labels": {"app": "api", "tier": "cp"}}});
        for (selector, want) in [
            ("app=api", true),
            ("app==api,tier=cp", true),
            ("app!=api", false),
            ("tier", true),
            ("!tier", false),
            ("missing", false),
            ("", true),
            ("app in (api,web)", true),
            ("app in (web),tier=cp", false),
            ("app notin (web, db),tier", true),
            ("missing notin (x)", true),
            ("missing in (x)", false),
        ] {
            assert_eq!(
                Selector::parse(Resource::Secrets, Some(selector), None)
                    .unwrap()
                    .matches(&object),
                want,
                "{selector}"
            );
        }
    }

    #[test]
    fn field_selectors_are_those_of_the_kind() {
        let object = json!({"metadata": {"name": "a", "namespace": "ns"}});
        let matches = |resource, fields: &str, object: &Value| {
            Selector::parse(resource, None, Some(fields))
                .unwrap()
                .matches(object)
        };
        assert!(matches(Resource::Secrets, "metadata.name=a", &object));
        assert!(!matches(Resource::Secrets, "metadata.name=b", &object));
        let event = json!({"metadata": {"name": "e"}, "type": "Warning", "reason": "Failed",
            "involvedObject": {"kind": "ConfigMap", "name": "c"}, "source": {"component": "k"}});
        assert!(matches(
            Resource::Events,
            "involvedObject.kind=ConfigMap,involvedObject.name=c,type=Warning,source=k",
            &event
        ));
        assert!(!matches(Resource::Events, "reason!=Failed", &event));
        assert!(Selector::parse(Resource::Secrets, None, Some("spec.x=1")).is_err());
        assert!(Selector::parse(Resource::ConfigMaps, None, Some("type=x")).is_err());
        assert!(Selector::parse(Resource::Secrets, Some("app in a,b"), None).is_err());
    }
}
