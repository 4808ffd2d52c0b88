//! The steps of a pass (`pass` runs them in the order of `graph`, concurrently where nothing
//! waits): [`read`] (every declared signer, target, bundle and intermediate, and the clock
//! check), then one step per declared object: [`signers`], [`bundles`], [`targets`],
//! [`intermediates`] (an intermediate CA, the bundle collecting it, its delayed publication),
//! [`unions`], [`copies`]. Each takes what the steps it waits for left (the types in `ctx` and
//! `trust`) and writes through `write`; none calls another.

pub(super) mod bundles;
pub(super) mod copies;
pub(super) mod intermediates;
pub(super) mod read;
pub(super) mod signers;
pub(super) mod targets;
pub(super) mod unions;
