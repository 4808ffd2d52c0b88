//! The one error type every layer shares: a configuration error (bad flags, a bad config file,
//! an unusable kubeconfig). The binary maps it to exit code 2; anything else is a runtime
//! failure (exit code 1).

/// A configuration error: exit code 2. The text names the flag, file or item and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);
