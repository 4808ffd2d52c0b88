//! Certificates: parsing ([`parse`], over the one PEM reader [`pem`]; certificate requests,
//! strictly, in [`csr`]; [`trusted_bundle`], the rule for a host file others trust: certificates
//! and nothing else), chain and identity checks ([`verify`]) and the issuing of new signers and
//! leaves ([`issue`], with the key types). `regenerate` uses all three; `inspect`, `sync`, `node`
//! and `approve` read and verify only. Depends on the base layer alone.

pub mod csr;
pub(crate) mod issue;
pub(crate) mod parse;
pub mod pem;
pub(crate) mod trusted_bundle;
pub(crate) mod verify;

pub use issue::{KeyType, ca_params, check_serving_names, new_leaf_of, new_signer_of, signing_key};
#[cfg(test)]
pub use issue::{new_leaf, new_signer};
pub use parse::{Cert, KeyPairPem, bundle_pem, key_fits, parse_bundle, parse_certs, parse_key};
pub use verify::{ChainError, Identity, chains_to, issued_by, verify_chain};
