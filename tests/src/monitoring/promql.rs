//! The metrics a PromQL expression selects, with their label matchers: enough of the language
//! for our rules (selectors, functions, aggregations with `by`/`without`, vector matching,
//! `offset`, ranges), not a parser of all of it.

/// A metric an expression selects, with its label matchers (`name`, `op`, `value`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub metric: String,
    pub matchers: Vec<(String, String, String)>,
}

/// PromQL words that are not metric names (besides [`LABEL_LISTS`]).
const KEYWORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
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

/// Keywords followed by a parenthesised list of label names (`group_left` and `group_right` may
/// also stand alone).
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
            } else if KEYWORDS.contains(&word.as_str())
                || LABEL_LISTS.contains(&word.as_str())
                || chars.get(next) == Some(&'(')
            {
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
