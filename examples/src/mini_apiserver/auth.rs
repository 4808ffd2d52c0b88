//! Authentication with kube-apiserver's static token file (`token,user,uid,"group1,group2"`), or
//! a client certificate verified by TLS (user = its CN). Authorization: every authenticated user
//! may do everything, except that `--read-only-user` users may only get, list and watch.

use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user name.
    pub name: String,
    /// Groups from the token file.
    pub groups: Vec<String>,
}

/// The token table. `Debug` never shows tokens.
pub struct Tokens {
    by_token: HashMap<String, User>,
    read_only: HashSet<String>,
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
    pub fn load(path: &Path, read_only: &[String]) -> anyhow::Result<Tokens> {
        let text = std::fs::read_to_string(path)
            .map_err(|err| anyhow::anyhow!("cannot read token file {}: {err}", path.display()))?;
        Tokens::parse(&text, read_only)
            .map_err(|err| anyhow::anyhow!("token file {}: {err}", path.display()))
    }

    /// Parses the CSV content.
    pub fn parse(text: &str, read_only: &[String]) -> Result<Tokens, String> {
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
            let groups = fields
                .get(3)
                .map(|g| {
                    g.split(',')
                        .map(str::trim)
                        .filter(|g| !g.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
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
        Ok(Tokens {
            by_token,
            read_only: read_only.iter().cloned().collect(),
        })
    }

    /// The user for an `Authorization` header value, if it carries a known bearer token.
    pub fn authenticate(&self, authorization: Option<&str>) -> Option<User> {
        let token = authorization?.strip_prefix("Bearer ")?.trim();
        self.by_token.get(token).cloned()
    }

    /// Whether `user` may perform `verb`.
    pub fn allows(&self, user: &User, verb: &str) -> bool {
        !self.read_only.contains(&user.name) || matches!(verb, "get" | "list" | "watch")
    }
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

    #[test]
    fn the_static_token_file_format_is_understood() {
        let tokens = Tokens::parse(
            "# comment\nt0k3n,alice,1,\"system:masters,ops\"\nother,bob,2\n",
            &["bob".into()],
        )
        .unwrap();
        let alice = tokens.authenticate(Some("Bearer t0k3n")).unwrap();
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.groups, ["system:masters", "ops"]);
        assert!(tokens.authenticate(Some("Bearer nope")).is_none());
        assert!(tokens.authenticate(Some("Basic t0k3n")).is_none());
        let bob = tokens.authenticate(Some("Bearer other")).unwrap();
        assert!(tokens.allows(&bob, "watch") && !tokens.allows(&bob, "update"));
        assert!(tokens.allows(&alice, "delete"));
    }

    #[test]
    fn debug_output_never_shows_tokens() {
        let tokens = Tokens::parse("s3cr3t,alice,1\n", &[]).unwrap();
        assert!(!format!("{tokens:?}").contains("s3cr3t"));
    }
}
