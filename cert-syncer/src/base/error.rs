//! Errors and how they are shown: the configuration error every layer shares (bad flags, a bad
//! config file, an unusable kubeconfig; the binary maps it to exit code 2, anything else is a
//! runtime failure, exit code 1), an error's cause chain for logs, and parser messages with the
//! quoted content removed (they may quote a token).

/// A configuration error: exit code 2. The text names the flag, file or item and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Shows an error with its whole cause chain, `outer: cause: root cause`, for logs: the
/// `Display` of most errors is only their own layer (`error = %err` would drop why).
///
/// ```text
/// tracing::warn!(error = %chain(&err), "watch failed");
/// ```
pub(crate) fn chain<'a>(err: &'a (dyn std::error::Error + 'static)) -> Chain<'a> {
    Chain(err)
}

/// See [`chain`].
pub(crate) struct Chain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut shown = self.0.to_string();
        let mut source = self.0.source();
        while let Some(cause) = source {
            let text = cause.to_string();
            // Many errors repeat their cause in their own message: show each text once.
            if !shown.contains(&text) {
                write!(f, ": {text}")?;
                shown = text;
            }
            source = cause.source();
        }
        Ok(())
    }
}

/// Whether the apiserver refused a write with 409: a stale resourceVersion (Conflict) or a
/// create of a name that exists (AlreadyExists). Either way someone else wrote first.
pub(crate) fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

/// The first line of a parser message with every quoted part (`'…'`, `"…"`, `` `…` ``)
/// replaced by `…`, at most 300 characters: what is wrong and where, never the content.
pub(crate) fn redact_parse_error(message: &str) -> String {
    let first = message.lines().next().unwrap_or_default();
    let mut out = String::new();
    let mut quote: Option<char> = None;
    for c in first.chars() {
        match quote {
            Some(q) if c == q => {
                out.push('…');
                out.push(c);
                quote = None;
            }
            Some(_) => {}
            None if matches!(c, '\'' | '"' | '`') => {
                out.push(c);
                quote = Some(c);
            }
            None => out.push(c),
        }
    }
    if quote.is_some() {
        out.push('…');
    }
    if out.chars().count() > 300 {
        out = out.chars().take(300).collect::<String>() + "…";
    }
    out
}

/// A string from the API or from a request (a username, a subject attribute), for a log line or
/// a condition's message: quoted and escaped as Rust's `Debug` shows it (quotes, control
/// characters and newlines as escapes, so it cannot forge a log line), cut to `max` characters.
pub(crate) fn quoted(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return format!("{text:?}");
    }
    let cut: String = text.chars().take(max).collect();
    format!("{cut:?}…")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read the lease")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn the_chain_shows_every_cause_once() {
        let err = Outer(std::io::Error::other("connection refused"));
        assert_eq!(
            chain(&err).to_string(),
            "cannot read the lease: connection refused"
        );
        let repeated = std::io::Error::other(Outer(std::io::Error::other("reset")));
        assert_eq!(chain(&repeated).to_string(), "cannot read the lease: reset");
    }

    #[test]
    fn quoted_escapes_and_cuts() {
        assert_eq!(quoted("system:nodes", 40), "\"system:nodes\"");
        assert_eq!(quoted("a\nb\"c", 40), "\"a\\nb\\\"c\"");
        assert_eq!(quoted("abcdef", 3), "\"abc\"…");
    }
}
