//! Label and field selectors (equality-based; set-based label selectors are refused with 400).

use serde_json::Value;

use super::status::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Term {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector` plus `fieldSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    labels: Vec<Term>,
    fields: Vec<Term>,
}

impl Selector {
    /// Parses the query parameters (either may be absent or empty).
    pub fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Selector, ApiError> {
        let labels = parse_terms(labels.unwrap_or(""), true)?;
        let fields = parse_terms(fields.unwrap_or(""), false)?;
        for term in &fields {
            let key = match term {
                Term::Equals(k, _) | Term::NotEquals(k, _) => k,
                _ => return Err(ApiError::bad_request("field selectors need an operator")),
            };
            if key != "metadata.name" && key != "metadata.namespace" {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {key} (metadata.name and metadata.namespace are)"
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
            let name = key.strip_prefix("metadata.").unwrap_or(key);
            object
                .get("metadata")
                .and_then(|m| m.get(name))
                .and_then(Value::as_str)
        };
        self.labels.iter().all(|term| term_matches(term, label))
            && self.fields.iter().all(|term| term_matches(term, field))
    }
}

fn term_matches<'a>(term: &Term, value: impl Fn(&str) -> Option<&'a str>) -> bool {
    match term {
        Term::Equals(k, v) => value(k) == Some(v.as_str()),
        Term::NotEquals(k, v) => value(k) != Some(v.as_str()),
        Term::Exists(k) => value(k).is_some(),
        Term::NotExists(k) => value(k).is_none(),
    }
}

fn parse_terms(text: &str, allow_existence: bool) -> Result<Vec<Term>, ApiError> {
    let mut terms = Vec::new();
    for raw in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let term = if let Some((k, v)) = raw.split_once("!=") {
            Term::NotEquals(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = raw.split_once("==").or_else(|| raw.split_once('=')) {
            Term::Equals(k.trim().to_owned(), v.trim().to_owned())
        } else if raw.contains(' ') || raw.contains('(') {
            return Err(ApiError::bad_request(format!(
                "unsupported selector {raw:?}: only =, == and != are supported"
            )));
        } else if !allow_existence {
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
        ] {
            assert_eq!(
                Selector::parse(Some(selector), None)
                    .unwrap()
                    .matches(&object),
                want,
                "{selector}"
            );
        }
    }

    #[test]
    fn field_selectors_cover_name_and_namespace_only() {
        let object = json!({"metadata": {"name": "a", "namespace": "ns"}});
        assert!(
            Selector::parse(None, Some("metadata.name=a"))
                .unwrap()
                .matches(&object)
        );
        assert!(
            !Selector::parse(None, Some("metadata.name=b"))
                .unwrap()
                .matches(&object)
        );
        assert!(Selector::parse(None, Some("spec.x=1")).is_err());
        assert!(Selector::parse(Some("app in (a,b)"), None).is_err());
    }
}
