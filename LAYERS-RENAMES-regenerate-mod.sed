# Only for cert-syncer/src/regenerate/mod.rs (keys.rs moved to pki/issue/keys.rs).
/^mod keys;$/d
/^pub use keys::KeyType;$/d
/^\/\/! - `keys`: the type of new keys/d
