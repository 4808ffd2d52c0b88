//! The one PEM reader of cert-syncer: PEM text into labelled DER blocks, framed exactly as Go's
//! `encoding/pem.Decode` frames them (Go 1.19, the toolchain of the kube-apiserver and
//! kube-controller-manager 1.20 we run against; `src/encoding/pem/pem.go`), so that what we
//! check is what the Go side that consumes the same bytes acts on. Everything that reads PEM
//! (certificates, bundles, the host bundle of node mode, the kubelet's certificate file, a CSR)
//! goes through here and applies its own policy to the blocks; private keys are decoded by
//! [`super::parse_key`] through rustls, which knows their three encodings.
//!
//! Go's framing, which [`Scanner`] follows step by step:
//! - a block starts with `-----BEGIN ` at the start of the data or right after a `\n`; one in
//!   the middle of a line is text, not a block;
//! - the rest of that line, trailing spaces and tabs (and the `\r` of a CRLF) removed, must end
//!   with `-----`; what is before is the type;
//! - lines with a `:` right after it are headers; then the first `\n-----END ` (or, with no
//!   headers, `-----END ` at once), followed by the same type and `-----` and nothing but spaces
//!   and tabs on that line;
//! - the text between is standard base64 with padding, spaces and tabs removed, `\r` and `\n`
//!   ignored;
//! - a candidate that fails any of these is skipped and the search goes on after its BEGIN line
//!   (or its headers): so a later block, even one inside the skipped one's text, is what Go
//!   reads.
//!
//! Text outside the blocks (comments, blank lines) is ignored, as Go does. The strict reader of
//! a CSR ([`sole_block`]) accepts only the shape the kubelet writes and nothing Go could read
//! differently.

use base64::Engine as _;

/// One PEM block.
pub struct Block {
    /// `CERTIFICATE`, `PRIVATE KEY`, `CERTIFICATE REQUEST`...
    pub label: String,
    pub der: Vec<u8>,
    /// The block had `Key: Value` header lines (Go's certificate readers, `AppendCertsFromPEM`
    /// and client-go's `ParseCertsPEM`, skip such a block).
    pub has_headers: bool,
}

impl std::fmt::Debug for Block {
    // A block may be a private key: never its bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("label", &self.label)
            .field("bytes", &self.der.len())
            .field("has_headers", &self.has_headers)
            .finish()
    }
}

/// A block that does not decode (bad base64, an END line that does not match), or a BEGIN line
/// without its END line. Never quotes the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PEM block {index} is malformed: {reason}")]
pub struct Malformed {
    /// Which block (0-based, counting the blocks read and skipped before it).
    pub index: usize,
    pub reason: String,
}

const BEGIN: &[u8] = b"-----BEGIN ";
const END: &[u8] = b"-----END ";
const DASHES: &[u8] = b"-----";

/// Why Go's `pem.Decode` skips a candidate block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// No END line of its own: the text ends, or another BEGIN line comes first (a file caught
    /// mid-write).
    Torn,
    /// The BEGIN line does not end with `-----`.
    BeginLine,
    /// The END line names another type, or has more than blanks after its `-----`.
    EndLine,
    /// The text between is not base64 as Go decodes it.
    Base64,
}

impl Skip {
    fn reason(self) -> &'static str {
        match self {
            Skip::Torn => "a BEGIN line without its END line",
            Skip::BeginLine => "a BEGIN line that does not end with -----",
            Skip::EndLine => "an END line that does not match its BEGIN line",
            Skip::Base64 => "its text is not base64",
        }
    }
}

/// What one step of Go's reading finds.
#[derive(Debug)]
pub enum Item {
    /// A block Go returns, and where its text lies in the input (from its BEGIN line to the end
    /// of its END line, the line end included).
    Block(Block, std::ops::Range<usize>),
    /// A candidate Go skips.
    Skipped(Skip),
}

/// Go's `pem.Decode`, called again and again on what it leaves: every block and every skipped
/// candidate of a text, in order.
pub struct Scanner<'a> {
    data: &'a [u8],
    /// Where Go's `rest` starts.
    pos: usize,
}

impl<'a> Scanner<'a> {
    pub fn new(data: &'a [u8]) -> Scanner<'a> {
        Scanner { data, pos: 0 }
    }
}

impl Iterator for Scanner<'_> {
    type Item = Item;

    fn next(&mut self) -> Option<Item> {
        let data = self.data;
        let rest = &data[self.pos..];
        // BEGIN at the start of what is left (the data's start, or a line start after a block
        // or a skipped candidate), else the first one right after a newline.
        let begin = if rest.starts_with(BEGIN) {
            self.pos
        } else {
            self.pos + find(rest, b"\n-----BEGIN ")? + 1
        };
        let after_begin = begin + BEGIN.len();
        let (type_line, line_len) = go_line(&data[after_begin..]);
        self.pos = after_begin + line_len;
        let Some(label) = type_line.strip_suffix(DASHES) else {
            return Some(Item::Skipped(Skip::BeginLine));
        };
        // Header lines: a `:` in the line. Go returns nothing at all when the text ends here.
        let mut has_headers = false;
        loop {
            if self.pos == data.len() {
                return Some(Item::Skipped(Skip::Torn));
            }
            let (line, line_len) = go_line(&data[self.pos..]);
            if !line.contains(&b':') {
                break;
            }
            has_headers = true;
            self.pos += line_len;
        }
        let rest = &data[self.pos..];
        let (end_index, trailer_index) = if !has_headers && rest.starts_with(END) {
            (0, END.len())
        } else {
            match find(rest, b"\n-----END ") {
                Some(i) => (i, i + 1 + END.len()),
                None => return Some(Item::Skipped(Skip::Torn)),
            }
        };
        // The END Go found may belong to a later block (this one torn): Go then skips this one
        // as a mismatch or bad base64; we name it what it is.
        let own_end = find(&rest[..end_index], b"\n-----BEGIN ").is_none();
        let trailer = &rest[trailer_index..];
        let trailer_len = label.len() + DASHES.len();
        if trailer.len() < trailer_len
            || !trailer.starts_with(label)
            || &trailer[label.len()..trailer_len] != DASHES
            || !go_line(&trailer[trailer_len..]).0.is_empty()
        {
            return Some(Item::Skipped(if own_end {
                Skip::EndLine
            } else {
                Skip::Torn
            }));
        }
        let Some(der) = go_base64(&rest[..end_index]) else {
            return Some(Item::Skipped(if own_end {
                Skip::Base64
            } else {
                Skip::Torn
            }));
        };
        // Go's rest: after the END line (the `-1` of `len(pemEnd)-1`: the END line starts at
        // `end_index` or one after it).
        let end_line = self.pos + end_index + END.len();
        self.pos = end_line + go_line(&data[end_line..]).1;
        let block = Block {
            label: String::from_utf8_lossy(label).into_owned(),
            der,
            has_headers,
        };
        Some(Item::Block(block, begin..self.pos))
    }
}

/// Go's `getLine`: the line at the start of `data` (up to the first `\n`, a `\r` right before
/// it dropped) with trailing spaces and tabs removed, and the length to the next line's start.
fn go_line(data: &[u8]) -> (&[u8], usize) {
    let (line, next) = match data.iter().position(|&b| b == b'\n') {
        None => (data, data.len()),
        Some(i) if i > 0 && data[i - 1] == b'\r' => (&data[..i - 1], i + 1),
        Some(i) => (&data[..i], i + 1),
    };
    let trimmed = line.len()
        - line
            .iter()
            .rev()
            .take_while(|&&b| b == b' ' || b == b'\t')
            .count();
    (&line[..trimmed], next)
}

/// Go's base64 of a PEM body: spaces and tabs removed (pem), `\r` and `\n` ignored
/// (`base64.StdEncoding`), padding required, unused trailing bits not checked (Go's decoder is
/// not `Strict`).
fn go_base64(text: &[u8]) -> Option<Vec<u8>> {
    const GO_STD: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireCanonical),
    );
    let compact: Vec<u8> = text
        .iter()
        .copied()
        .filter(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
        .collect();
    GO_STD.decode(compact).ok()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Every block of `bytes`, in order. Strict: any candidate Go would skip (a torn block, what a
/// reader sees of a file caught mid-write, or one that does not decode) is an error, and so is
/// a block with headers (Go's certificate readers skip it).
pub fn blocks(bytes: &[u8]) -> Result<Vec<Block>, Malformed> {
    let mut blocks = Vec::new();
    for (index, item) in Scanner::new(bytes).enumerate() {
        match item {
            Item::Block(block, _) if block.has_headers => {
                return Err(Malformed {
                    index,
                    reason: "it has PEM headers".to_owned(),
                });
            }
            Item::Block(block, _) => blocks.push(block),
            Item::Skipped(skip) => {
                return Err(Malformed {
                    index,
                    reason: skip.reason().to_owned(),
                });
            }
        }
    }
    Ok(blocks)
}

/// Every block of `bytes` Go reads, in order, skipping a torn block (a BEGIN line without its
/// END line) as Go does: what a lenient reader (Go's) takes from a file that may be caught
/// mid-write. A block that does not decode is still an error. Blocks with headers are kept
/// (`has_headers`): the caller decides, as Go's callers do.
pub fn blocks_skipping_torn(bytes: &[u8]) -> Result<Vec<Block>, Malformed> {
    let mut blocks = Vec::new();
    for (index, item) in Scanner::new(bytes).enumerate() {
        match item {
            Item::Block(block, _) => blocks.push(block),
            Item::Skipped(Skip::Torn) => {}
            Item::Skipped(skip) => {
                return Err(Malformed {
                    index,
                    reason: skip.reason().to_owned(),
                });
            }
        }
    }
    Ok(blocks)
}

/// The DER of every `CERTIFICATE` block, in order, other blocks skipped ([`blocks`]: strict).
pub fn certificates(bytes: &[u8]) -> Result<Vec<Vec<u8>>, Malformed> {
    Ok(blocks(bytes)?
        .into_iter()
        .filter(|block| block.label == "CERTIFICATE")
        .map(|block| block.der)
        .collect())
}

/// The DER of `bytes` when they are one `label` block and nothing else, in the one shape that
/// every PEM reader reads alike: optional blank lines before, `-----BEGIN <label>-----`, lines
/// of canonical base64 (no blanks in them, no empty line), `-----END <label>-----`, optional
/// blank lines after; LF line ends only, no headers. Go's reading ([`Scanner`]) must find
/// exactly this block. Anything else is refused with a reason that never quotes the text: for a
/// request that another party signs, reading "roughly the same" is not enough.
pub fn sole_block(bytes: &[u8], label: &str) -> Result<Vec<u8>, String> {
    if bytes.contains(&b'\r') {
        return Err("it has a carriage return (CR or CRLF line ends; only LF is read)".to_owned());
    }
    let items: Vec<Item> = Scanner::new(bytes).collect();
    let (block, span) = match items.as_slice() {
        [] => return Err("it has no PEM block".to_owned()),
        [Item::Block(block, span)] => (block, span.clone()),
        [Item::Skipped(skip)] => {
            return Err(format!(
                "its PEM block is skipped by Go's reader: {}",
                skip.reason()
            ));
        }
        more => {
            let skipped = more
                .iter()
                .filter(|i| matches!(i, Item::Skipped(_)))
                .count();
            return Err(format!(
                "it has {} PEM blocks and {skipped} skipped by Go's reader (Go reads only the first block it can decode)",
                more.len() - skipped
            ));
        }
    };
    if block.label != label {
        return Err(format!(
            "its PEM block is {}, not {label}",
            crate::base::error::quoted(&block.label, 40)
        ));
    }
    if block.has_headers {
        return Err("its PEM block has headers".to_owned());
    }
    let blank = |text: &[u8]| text.iter().all(|b| matches!(b, b' ' | b'\t' | b'\n'));
    let (before, after) = (&bytes[..span.start], &bytes[span.end..]);
    if !blank(before) || !blank(after) {
        return Err("it has text around its PEM block".to_owned());
    }
    let text = &bytes[span];
    let begin = format!("-----BEGIN {label}-----\n");
    let end = format!("-----END {label}-----");
    let body = text
        .strip_prefix(begin.as_bytes())
        .ok_or("its BEGIN line has blanks after it")?;
    let body = body.strip_suffix(b"\n").unwrap_or(body);
    let body = body
        .strip_suffix(end.as_bytes())
        .ok_or("its END line has blanks after it")?;
    let lines: Vec<&[u8]> = body
        .strip_suffix(b"\n")
        .ok_or("its END line does not start a line")?
        .split(|&b| b == b'\n')
        .collect();
    let base64_line = |line: &&[u8]| {
        !line.is_empty()
            && line
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
    };
    if !lines.iter().all(base64_line) {
        return Err("its body has an empty line, or blanks or other text in a line".to_owned());
    }
    let compact = lines.concat();
    let canonical = base64::engine::general_purpose::STANDARD.encode(&block.der);
    if compact != canonical.as_bytes() {
        return Err("its base64 is not canonical (padding or unused bits)".to_owned());
    }
    Ok(block.der.clone())
}

#[cfg(test)]
#[path = "pem_tests.rs"]
mod tests;
