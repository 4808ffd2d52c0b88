//! The tokens every apiserver of the harness accepts. A leaf: the apiserver starters use it,
//! and the log scanner looks for them in every log.

/// The token of the `admin` user (group `system:masters`) in the token file.
pub const ADMIN_TOKEN: &str = "e2e-token-0123456789";
/// The token of the `viewer` user, started as `--read-only-user`.
pub const VIEWER_TOKEN: &str = "read-only-token";
