//! The one error type every layer shares: a configuration error (bad flags, a bad config file,
//! an unusable kubeconfig). The binary maps it to exit code 2; anything else is a runtime
//! failure (exit code 1).

/// A configuration error: exit code 2. The text names the flag, file or item and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Shows an error with its whole cause chain, `outer: cause: root cause`, for logs: the
/// `Display` of most errors is only their own layer (`error = %err` would drop why).
///
/// ```ignore
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
}
