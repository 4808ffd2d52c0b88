//! Object metadata: reading its fields, and the values the server assigns on create (`uid`,
//! `creationTimestamp`, the `generateName` suffix).

use serde_json::Value;

/// `metadata.<field>` as a string, empty when absent.
pub fn meta_str(object: &Value, field: &str) -> String {
    meta_str_opt(object, field).unwrap_or_default()
}

/// `metadata.<field>` as a string, `None` when absent or not a string.
pub fn meta_str_opt(object: &Value, field: &str) -> Option<String> {
    object
        .get("metadata")?
        .get(field)?
        .as_str()
        .map(str::to_owned)
}

/// Now, as `creationTimestamp` is written (RFC 3339, whole seconds).
pub fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or_else(|_| time::OffsetDateTime::now_utc());
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// A UUID-shaped identifier, unique within this store's life (and across restarts, by mixing in
/// the start time).
pub fn uid(counter: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let hex = format!(
        "{:016x}{:016x}",
        nanos,
        counter.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    );
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Five characters from `[bcdfghjklmnpqrstvwxz2456789]`, as generateName uses.
pub fn random_suffix(seed: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    let mut x = (seed ^ nanos).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..5)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % ALPHABET.len() as u64) as usize] as char
        })
        .collect()
}
