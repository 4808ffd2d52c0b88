//! Authentication and authorization.
//!
//! Authentication: kube-apiserver's static token file (`token,user,uid,"group1,group2"`, see
//! <https://kubernetes.io/docs/reference/access-authn-authz/authentication/#static-token-file>),
//! or a client certificate verified by TLS against `--client-ca` (user = its CN, groups = its
//! O values, as kube-apiserver does).
//!
//! Authorization: without `--authorization-file`, every authenticated user may do everything,
//! except `--read-only-user` users, who may only get, list and watch. With it, a request is
//! allowed only when a rule allows it (default deny, like RBAC). The file is CSV in the token
//! file's style, one rule per line:
//!
//! ```text
//! # subject,verbs,namespaces,resources        ("*" = any; quote lists)
//! user:cert-syncer,"get,list,watch",openshift-kube-apiserver,"secrets,configmaps"
//! group:system:masters,*,*,*
//! ```
//!
//! A subject is `user:NAME`, `group:NAME` or a bare user name. Cluster-wide list and watch (no
//! namespace in the path) need a rule whose namespaces are `*`. Discovery (`/api`, `/apis`,
//! `/version`) is open to every authenticated user.

use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user name.
    pub name: String,
    /// Groups from the token file or the certificate's O values.
    pub groups: Vec<String>,
}

/// The token table. `Debug` never shows tokens.
pub struct Tokens {
    by_token: HashMap<String, User>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("count", &self.by_token.len())
            .finish_non_exhaustive()
    }
}

impl Tokens {
    /// Reads a static token file. Errors name the file and the line (never the token).
    ///
    /// # Errors
    /// An unreadable file, a malformed line, or no token at all.
    pub fn load(path: &Path) -> anyhow::Result<Tokens> {
        let text = std::fs::read_to_string(path)
            .map_err(|err| anyhow::anyhow!("cannot read token file {}: {err}", path.display()))?;
        Tokens::parse(&text).map_err(|err| anyhow::anyhow!("token file {}: {err}", path.display()))
    }

    /// Parses the CSV content.
    ///
    /// # Errors
    /// A malformed line (by number), or no token at all.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let mut by_token = HashMap::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields = split_csv(line);
            if fields.len() < 3 || fields[0].is_empty() || fields[1].is_empty() {
                return Err(format!(
                    "line {}: expected token,user,uid[,\"groups\"]",
                    index + 1
                ));
            }
            let groups = fields.get(3).map(|g| split_list(g)).unwrap_or_default();
            by_token.insert(
                fields[0].clone(),
                User {
                    name: fields[1].clone(),
                    groups,
                },
            );
        }
        if by_token.is_empty() {
            return Err("no tokens".to_owned());
        }
        Ok(Tokens { by_token })
    }

    /// The user for an `Authorization` header value, if it carries a known bearer token.
    pub fn authenticate(&self, authorization: Option<&str>) -> Option<User> {
        // The scheme is case-insensitive (RFC 7235; kube-apiserver lowercases it too).
        let (scheme, token) = authorization?.trim_start().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let token = token.trim();
        self.by_token.get(token).cloned()
    }
}

/// What a request wants to do, for authorization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attributes<'a> {
    /// `get`, `list`, `watch`, `create`, `update`, `patch` or `delete`.
    pub verb: &'a str,
    /// The namespace in the path; `None` for cluster-wide list and watch.
    pub namespace: Option<&'a str>,
    /// The resource plural (`secrets`, `configmaps`, `events`, `leases`).
    pub resource: &'a str,
}

/// A set of names, or every name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Names {
    Any,
    Some(HashSet<String>),
}

impl Names {
    fn parse(field: &str) -> Names {
        let names = split_list(field);
        if names.iter().any(|n| n == "*") {
            Names::Any
        } else {
            Names::Some(names.into_iter().collect())
        }
    }

    fn contains(&self, name: Option<&str>) -> bool {
        match (self, name) {
            (Names::Any, _) => true,
            (Names::Some(names), Some(name)) => names.contains(name),
            (Names::Some(_), None) => false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Subject {
    User(String),
    Group(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    subject: Subject,
    verbs: Names,
    namespaces: Names,
    resources: Names,
}

/// Decides whether an authenticated user may make a request.
#[derive(Debug, Clone, Default)]
pub struct Authorizer {
    /// `None`: no rule file, everything is allowed (but see `read_only`).
    rules: Option<Vec<Rule>>,
    read_only: HashSet<String>,
}

impl Authorizer {
    /// Reads `--authorization-file` (if any) and takes the `--read-only-user` names.
    ///
    /// # Errors
    /// An unreadable file or a malformed line, named.
    pub fn load(rules: Option<&Path>, read_only_users: &[String]) -> anyhow::Result<Authorizer> {
        let mut authorizer = match rules {
            None => Authorizer::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|err| {
                    anyhow::anyhow!("cannot read authorization file {}: {err}", path.display())
                })?;
                Authorizer::parse(&text).map_err(|err| {
                    anyhow::anyhow!("authorization file {}: {err}", path.display())
                })?
            }
        };
        authorizer.read_only = read_only_users.iter().cloned().collect();
        Ok(authorizer)
    }

    /// Parses a rule file (see the module docs).
    ///
    /// # Errors
    /// A malformed line, by number.
    pub fn parse(text: &str) -> Result<Authorizer, String> {
        let mut rules = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields = split_csv(line);
            if fields.len() != 4 || fields.iter().any(String::is_empty) {
                return Err(format!(
                    "line {}: expected subject,verbs,namespaces,resources",
                    index + 1
                ));
            }
            let subject = if let Some(group) = fields[0].strip_prefix("group:") {
                Subject::Group(group.to_owned())
            } else {
                let user = fields[0].strip_prefix("user:").unwrap_or(&fields[0]);
                Subject::User(user.to_owned())
            };
            rules.push(Rule {
                subject,
                verbs: Names::parse(&fields[1]),
                namespaces: Names::parse(&fields[2]),
                resources: Names::parse(&fields[3]),
            });
        }
        Ok(Authorizer {
            rules: Some(rules),
            read_only: HashSet::new(),
        })
    }

    /// The rules that apply to `user` in `namespace`, as a SelfSubjectRulesReview lists them
    /// (`resourceRules`).
    pub fn rules_for(&self, user: &User, namespace: &str) -> Vec<serde_json::Value> {
        let read_only = self.read_only.contains(&user.name);
        let verbs = |names: &Names| -> Vec<String> {
            let all = names_list(names);
            if read_only {
                let reads = ["get", "list", "watch"].map(str::to_owned);
                if all == ["*"] {
                    return reads.to_vec();
                }
                return all.into_iter().filter(|v| reads.contains(v)).collect();
            }
            all
        };
        let rule = |verbs: Vec<String>, resources: Vec<String>| serde_json::json!({"verbs": verbs, "apiGroups": ["*"], "resources": resources});
        let Some(rules) = &self.rules else {
            return vec![rule(verbs(&Names::Any), vec!["*".to_owned()])];
        };
        rules
            .iter()
            .filter(|rule| match &rule.subject {
                Subject::User(name) => *name == user.name,
                Subject::Group(group) => user.groups.contains(group),
            })
            .filter(|r| r.namespaces.contains(Some(namespace)))
            .map(|r| rule(verbs(&r.verbs), names_list(&r.resources)))
            .filter(|r| r["verbs"].as_array().is_some_and(|v| !v.is_empty()))
            .collect()
    }

    /// Whether `user` may do what `request` describes.
    pub fn allows(&self, user: &User, request: &Attributes<'_>) -> bool {
        if self.read_only.contains(&user.name) && !matches!(request.verb, "get" | "list" | "watch")
        {
            return false;
        }
        let Some(rules) = &self.rules else {
            return true;
        };
        rules.iter().any(|rule| {
            let subject = match &rule.subject {
                Subject::User(name) => *name == user.name,
                Subject::Group(group) => user.groups.contains(group),
            };
            subject
                && rule.verbs.contains(Some(request.verb))
                && rule.namespaces.contains(request.namespace)
                && rule.resources.contains(Some(request.resource))
        })
    }
}

/// A name set as a sorted list, `["*"]` for every name.
fn names_list(names: &Names) -> Vec<String> {
    match names {
        Names::Any => vec!["*".to_owned()],
        Names::Some(set) => {
            let mut list: Vec<String> = set.iter().cloned().collect();
            list.sort();
            list
        }
    }
}

/// Splits a comma-separated list, trimmed, empty items dropped.
fn split_list(field: &str) -> Vec<String> {
    field
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Splits one CSV line with double-quoted fields.
fn split_csv(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut current).trim().to_owned()),
            c => current.push(c),
        }
    }
    fields.push(current.trim().to_owned());
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(verb: &'a str, namespace: Option<&'a str>, resource: &'a str) -> Attributes<'a> {
        Attributes {
            verb,
            namespace,
            resource,
        }
    }

    #[test]
    fn the_static_token_file_format_is_understood() {
        let tokens =
            Tokens::parse("# comment\nt0k3n,alice,1,\"system:masters,ops\"\nother,bob,2\n")
                .unwrap();
        let alice = tokens.authenticate(Some("Bearer t0k3n")).unwrap();
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.groups, ["system:masters", "ops"]);
        assert!(tokens.authenticate(Some("Bearer nope")).is_none());
        assert!(tokens.authenticate(Some("Basic t0k3n")).is_none());
        for header in ["bearer t0k3n", "BEARER t0k3n", "Bearer  t0k3n "] {
            assert_eq!(tokens.authenticate(Some(header)).unwrap().name, "alice");
        }
        assert!(tokens.authenticate(Some("Bearert0k3n")).is_none());
        assert!(tokens.authenticate(None).is_none());
        assert_eq!(
            tokens.authenticate(Some("Bearer other")).unwrap().name,
            "bob"
        );
    }

    #[test]
    fn a_malformed_token_line_is_named_by_number_without_the_token() {
        let err = Tokens::parse("ok,alice,1\ns3cr3t-only\n").err().unwrap();
        assert!(err.contains("line 2") && !err.contains("s3cr3t"), "{err}");
        assert!(Tokens::parse("# nothing\n").is_err());
    }

    #[test]
    fn debug_output_never_shows_tokens() {
        let tokens = Tokens::parse("s3cr3t,alice,1\n").unwrap();
        assert!(!format!("{tokens:?}").contains("s3cr3t"));
    }

    #[test]
    fn without_rules_everyone_may_do_everything_except_read_only_users() {
        let authorizer = Authorizer::load(None, &["bob".to_owned()]).unwrap();
        let alice = User {
            name: "alice".into(),
            groups: vec![],
        };
        let bob = User {
            name: "bob".into(),
            groups: vec![],
        };
        assert!(authorizer.allows(&alice, &request("delete", Some("ns"), "secrets")));
        assert!(authorizer.allows(&bob, &request("watch", None, "secrets")));
        assert!(!authorizer.allows(&bob, &request("update", Some("ns"), "secrets")));
    }

    #[test]
    fn rules_restrict_users_and_groups_to_verbs_namespaces_and_resources() {
        let authorizer = Authorizer::parse(
            "# subject,verbs,namespaces,resources\n\
             user:syncer,\"get,list,watch\",openshift-kube-apiserver,\"secrets,configmaps\"\n\
             group:system:masters,*,*,*\n\
             events-writer,create,*,events\n",
        )
        .unwrap();
        let syncer = User {
            name: "syncer".into(),
            groups: vec![],
        };
        let admin = User {
            name: "root".into(),
            groups: vec!["system:masters".into()],
        };
        let writer = User {
            name: "events-writer".into(),
            groups: vec![],
        };
        let ns = Some("openshift-kube-apiserver");
        assert!(authorizer.allows(&syncer, &request("watch", ns, "secrets")));
        assert!(!authorizer.allows(&syncer, &request("update", ns, "secrets")));
        assert!(!authorizer.allows(&syncer, &request("get", Some("other"), "secrets")));
        assert!(!authorizer.allows(&syncer, &request("list", None, "secrets")));
        assert!(!authorizer.allows(&syncer, &request("get", ns, "leases")));
        assert!(authorizer.allows(&admin, &request("delete", None, "leases")));
        assert!(authorizer.allows(&writer, &request("create", Some("x"), "events")));
        assert!(!authorizer.allows(&writer, &request("create", Some("x"), "secrets")));
    }

    #[test]
    fn a_malformed_rule_is_named_by_line() {
        let err = Authorizer::parse("alice,*,*,*\nbob,get\n").unwrap_err();
        assert!(err.contains("line 2"), "{err}");
    }
}
