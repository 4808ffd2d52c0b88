//! The one PEM reader of cert-syncer: PEM text into labelled DER blocks. Everything that reads
//! PEM (certificates, bundles, the host bundle of node mode, the kubelet's certificate file, a
//! CSR) goes through here and applies its own policy to the blocks; private keys are decoded by
//! [`super::parse_key`] through rustls, which knows their three encodings.
//!
//! Text outside the blocks (comments, blank lines) is ignored, as Go's `pem.Decode` does.

/// One PEM block.
pub struct Block {
    /// `CERTIFICATE`, `PRIVATE KEY`, `CERTIFICATE REQUEST`...
    pub label: String,
    pub der: Vec<u8>,
}

impl std::fmt::Debug for Block {
    // A block may be a private key: never its bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("label", &self.label)
            .field("bytes", &self.der.len())
            .finish()
    }
}

/// A block that does not decode (bad base64, an END line that does not match), or a BEGIN line
/// without its END line. Never quotes the text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PEM block {index} is malformed: {reason}")]
pub struct Malformed {
    /// Which block (0-based).
    pub index: usize,
    pub reason: String,
}

const BEGIN: &[u8] = b"-----BEGIN ";

fn begin_lines(bytes: &[u8]) -> usize {
    bytes.windows(BEGIN.len()).filter(|w| *w == BEGIN).count()
}

/// Every block of `bytes`, in order. Strict: a torn block (a BEGIN line without its END line,
/// what a reader sees of a file caught mid-write) is an error, like a block that does not
/// decode.
pub fn blocks(bytes: &[u8]) -> Result<Vec<Block>, Malformed> {
    let blocks = blocks_skipping_torn(bytes)?;
    // The parser skips a BEGIN line it cannot pair with an END: count them to catch it.
    if begin_lines(bytes) != blocks.len() {
        return Err(Malformed {
            index: blocks.len(),
            reason: "a BEGIN line without its END line".to_owned(),
        });
    }
    Ok(blocks)
}

/// Every complete block of `bytes`, in order, skipping a BEGIN line without its END line: what
/// a lenient reader (Go's) takes from the text. A block that does not decode is still an error.
pub fn blocks_skipping_torn(bytes: &[u8]) -> Result<Vec<Block>, Malformed> {
    let parsed = ::pem::parse_many(bytes).map_err(|err| Malformed {
        index: begin_lines(bytes).saturating_sub(1),
        reason: err.to_string(),
    })?;
    Ok(parsed
        .into_iter()
        .map(|block| Block {
            label: block.tag().to_owned(),
            der: block.into_contents(),
        })
        .collect())
}

/// The DER of every `CERTIFICATE` block, in order, other blocks skipped ([`blocks`]: strict).
pub fn certificates(bytes: &[u8]) -> Result<Vec<Vec<u8>>, Malformed> {
    Ok(blocks(bytes)?
        .into_iter()
        .filter(|block| block.label == "CERTIFICATE")
        .map(|block| block.der)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT: &str = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";

    #[test]
    fn blocks_keep_their_labels_and_order_and_text_around_them_is_ignored() {
        let text = format!(
            "# a comment\n{CERT}\n-----BEGIN PRIVATE KEY-----\nU0VDUkVU\n-----END PRIVATE KEY-----\n"
        );
        let read = blocks(text.as_bytes()).unwrap();
        let labels: Vec<&str> = read.iter().map(|b| b.label.as_str()).collect();
        assert_eq!(labels, ["CERTIFICATE", "PRIVATE KEY"]);
        assert_eq!(read[0].der, b"hello");
        assert!(!format!("{read:?}").contains("SECRET"));
        assert_eq!(certificates(text.as_bytes()).unwrap(), [b"hello".to_vec()]);
    }

    #[test]
    fn a_torn_block_fails_the_strict_reader_and_is_skipped_by_the_lenient_one() {
        let torn = format!("{CERT}-----BEGIN CERTIFICATE-----\naGVs");
        let err = blocks(torn.as_bytes()).unwrap_err();
        assert_eq!(err.index, 1);
        assert_eq!(blocks_skipping_torn(torn.as_bytes()).unwrap().len(), 1);
        let garbage = "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n";
        assert!(blocks(garbage.as_bytes()).is_err());
        assert!(blocks_skipping_torn(garbage.as_bytes()).is_err());
        assert!(blocks(b"no pem here").unwrap().is_empty());
    }
}
