//! The PEM reader against Go's `pem.Decode` (Go 1.19), case by case: each expectation is what
//! Go's loop does with the same bytes (the steps are in the module's docs), and the CSR shape of
//! [`sole_block`] refuses every text Go could read otherwise.

use super::*;

const CERT: &str = "-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n";

/// What Go's repeated `pem.Decode` returns: (type, bytes, has headers) per block.
fn go_reads(text: &str) -> Vec<(String, Vec<u8>, bool)> {
    Scanner::new(text.as_bytes())
        .filter_map(|item| match item {
            Item::Block(block, _) => Some((block.label, block.der, block.has_headers)),
            Item::Skipped(_) => None,
        })
        .collect()
}

fn skips(text: &str) -> Vec<Skip> {
    Scanner::new(text.as_bytes())
        .filter_map(|item| match item {
            Item::Skipped(skip) => Some(skip),
            Item::Block(..) => None,
        })
        .collect()
}

fn one(label: &str, der: &[u8]) -> Vec<(String, Vec<u8>, bool)> {
    vec![(label.to_owned(), der.to_vec(), false)]
}

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
    // Torn in the middle: Go's END search finds the next block's END, the base64 between fails,
    // and Go goes on to read the next block.
    let torn_first = format!("-----BEGIN CERTIFICATE-----\naGVs\n{CERT}");
    assert_eq!(skips(&torn_first), [Skip::Torn]);
    assert_eq!(go_reads(&torn_first), one("CERTIFICATE", b"hello"));
    assert_eq!(
        blocks_skipping_torn(torn_first.as_bytes()).unwrap().len(),
        1
    );
    assert!(blocks(torn_first.as_bytes()).is_err());
    let garbage = "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n";
    assert!(blocks(garbage.as_bytes()).is_err());
    assert!(blocks_skipping_torn(garbage.as_bytes()).is_err());
    assert!(blocks(b"no pem here").unwrap().is_empty());
}

#[test]
fn a_begin_line_counts_only_at_the_start_of_the_text_or_of_a_line() {
    // In the middle of a line it is text (Go's `\n-----BEGIN `).
    assert!(go_reads(&format!("junk {CERT}")).is_empty());
    assert!(go_reads(&format!(" {CERT}")).is_empty());
    assert_eq!(
        go_reads(&format!("junk\n{CERT}")),
        one("CERTIFICATE", b"hello")
    );
    // The two-block request of issue 35: a reader that finds BEGIN anywhere reads node-a, Go
    // reads node-b.
    let a = "-----BEGIN CERTIFICATE REQUEST-----\nbm9kZS1h\n-----END CERTIFICATE REQUEST-----\n";
    let b = "-----BEGIN CERTIFICATE REQUEST-----\nbm9kZS1i\n-----END CERTIFICATE REQUEST-----\n";
    let two = format!("x{a}{b}");
    assert_eq!(go_reads(&two), one("CERTIFICATE REQUEST", b"node-b"));
}

#[test]
fn go_skips_a_malformed_candidate_and_reads_a_later_block() {
    // A BEGIN line not ending in -----: skipped, the search goes on on the next line.
    let text = format!("-----BEGIN CERTIFICATE----- x\n{CERT}");
    assert_eq!(skips(&text), [Skip::BeginLine]);
    assert_eq!(go_reads(&text), one("CERTIFICATE", b"hello"));
    // An END line of another type: skipped; the search restarts after its BEGIN line.
    let text = format!("-----BEGIN A-----\naGVsbG8=\n-----END B-----\n{CERT}");
    assert_eq!(skips(&text), [Skip::EndLine]);
    assert_eq!(go_reads(&text), one("CERTIFICATE", b"hello"));
    // Text after the END line's dashes.
    let text = "-----BEGIN A-----\naGVsbG8=\n-----END A----- x\n";
    assert_eq!(skips(text), [Skip::EndLine]);
    // Bad base64, then a block inside the skipped one's text is what Go reads.
    let text = format!("-----BEGIN A-----\n!!\n{CERT}-----END A-----\n");
    assert_eq!(go_reads(&text), one("CERTIFICATE", b"hello"));
    // Missing padding.
    assert_eq!(
        skips("-----BEGIN A-----\naGVsbG8\n-----END A-----\n"),
        [Skip::Base64]
    );
}

#[test]
fn line_ends_follow_go() {
    // CRLF is a line end.
    let crlf = CERT.replace('\n', "\r\n");
    assert_eq!(go_reads(&crlf), one("CERTIFICATE", b"hello"));
    // A lone CR is not: the BEGIN line runs on into the body.
    assert!(go_reads("-----BEGIN A-----\raGVsbG8=\n-----END A-----\n").is_empty());
    // A lone CR after the END line is not a blank.
    assert_eq!(
        skips("-----BEGIN A-----\naGVsbG8=\n-----END A-----\r"),
        [Skip::EndLine]
    );
    // Inside the body the base64 decoder ignores it.
    assert_eq!(
        go_reads("-----BEGIN A-----\naGVs\rbG8=\n-----END A-----\n"),
        one("A", b"hello")
    );
    // Blanks after a BEGIN or END line are trimmed.
    assert_eq!(
        go_reads("-----BEGIN A----- \t\naGVsbG8=\n-----END A-----\t \n"),
        one("A", b"hello")
    );
}

#[test]
fn headers_blanks_in_base64_and_empty_blocks_follow_go() {
    let text =
        "-----BEGIN A-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: x\n\naGVsbG8=\n-----END A-----\n";
    assert_eq!(
        go_reads(text),
        vec![("A".to_owned(), b"hello".to_vec(), true)]
    );
    assert!(blocks(text.as_bytes()).is_err(), "strict: headers refused");
    assert!(blocks_skipping_torn(text.as_bytes()).unwrap()[0].has_headers);
    // Spaces and tabs inside the base64 are removed.
    assert_eq!(
        go_reads("-----BEGIN A-----\naG Vs\tbG8=\n-----END A-----\n"),
        one("A", b"hello")
    );
    // An END line right after the BEGIN line: an empty block.
    assert_eq!(
        go_reads("-----BEGIN A-----\n-----END A-----\n"),
        one("A", b"")
    );
    // Unused bits set in the last base64 character: Go's decoder is not strict.
    assert_eq!(
        go_reads("-----BEGIN A-----\naGVsbG9=\n-----END A-----\n"),
        one("A", b"hello")
    );
}

const CSR_LABEL: &str = "CERTIFICATE REQUEST";

fn request_pem(body: &str) -> String {
    format!("-----BEGIN {CSR_LABEL}-----\n{body}\n-----END {CSR_LABEL}-----\n")
}

#[test]
fn the_csr_shape_is_one_lf_block_of_canonical_base64_with_blanks_around() {
    let der = vec![0x30u8; 100];
    let b64 = base64::engine::general_purpose::STANDARD.encode(&der);
    let (first, second) = b64.split_at(64);
    let pem = request_pem(&format!("{first}\n{second}"));
    assert_eq!(sole_block(pem.as_bytes(), CSR_LABEL).unwrap(), der);
    for around in [
        format!("\n\n{pem}"),
        format!(" \t\n{pem}\n \t\n"),
        pem.trim_end().to_owned(),
    ] {
        assert_eq!(
            sole_block(around.as_bytes(), CSR_LABEL).unwrap(),
            der,
            "{around:?}"
        );
    }
    let single_line = request_pem(&b64);
    assert_eq!(sole_block(single_line.as_bytes(), CSR_LABEL).unwrap(), der);
}

#[test]
fn every_other_csr_text_is_refused_whatever_go_reads_from_it() {
    let der = vec![0x30u8; 10];
    let b64 = base64::engine::general_purpose::STANDARD.encode(&der);
    let pem = request_pem(&b64);
    let cases: Vec<(String, &str)> = vec![
        (pem.replace('\n', "\r\n"), "carriage return"),
        (pem.replacen('\n', "\r", 1), "carriage return"),
        (format!("junk\n{pem}"), "text around"),
        (format!("{pem}junk\n"), "text around"),
        (format!("  {pem}"), "no PEM block"),
        (format!("x{pem}{pem}"), "text around"),
        (format!("{pem}{pem}"), "2 PEM blocks"),
        (
            format!("-----BEGIN {CSR_LABEL}-----\n!!\n-----END {CSR_LABEL}-----\n{pem}"),
            "skipped by Go",
        ),
        (
            format!("-----BEGIN {CSR_LABEL}-----\n{b64}"),
            "skipped by Go",
        ),
        (
            pem.replace(CSR_LABEL, "NEW CERTIFICATE REQUEST"),
            "not CERTIFICATE REQUEST",
        ),
        (
            pem.replace(CSR_LABEL, "CERTIFICATE"),
            "not CERTIFICATE REQUEST",
        ),
        (
            pem.replacen("-----\n", "-----\nProc-Type: 4,ENCRYPTED\n", 1),
            "headers",
        ),
        (
            pem.replacen("-----\n", "----- \n", 1),
            "BEGIN line has blanks",
        ),
        (
            pem.replace(&b64, &format!("{} {}", &b64[..4], &b64[4..])),
            "blanks",
        ),
        (
            pem.replace(&b64, &format!("{}\n\n{}", &b64[..4], &b64[4..])),
            "empty line",
        ),
        (pem.replace(&b64, &format!("{}\t", &b64)), "blanks"),
        (String::new(), "no PEM block"),
    ];
    for (text, want) in cases {
        let err = sole_block(text.as_bytes(), CSR_LABEL).unwrap_err();
        assert!(err.contains(want), "{text:?}: {want:?} not in {err:?}");
        assert!(
            !err.contains(&b64[..8]),
            "the reason quotes the text: {err}"
        );
    }
    // Unused bits set (Go accepts it, the bytes are the same, but no encoder writes it).
    let odd = request_pem("aGVsbG9=");
    assert!(
        sole_block(odd.as_bytes(), CSR_LABEL)
            .unwrap_err()
            .contains("canonical")
    );
}
