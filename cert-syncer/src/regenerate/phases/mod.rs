//! The phases of a pass, in dependency order (`pass` runs them): [`read`] (every declared
//! signer, target, bundle and intermediate, and the clock check), [`signers`], [`bundles`],
//! [`targets`], [`intermediates`] (intermediate CAs, the bundles that collect them, unions,
//! the delayed publication), [`copies`]. Each takes what the earlier ones stored (the types in
//! `ctx`) and writes through `write`; none calls another.

pub(super) mod bundles;
pub(super) mod copies;
pub(super) mod intermediates;
pub(super) mod read;
pub(super) mod signers;
pub(super) mod targets;
