//! Certificates and requests rcgen cannot make, built from its DER: a few DER helpers (enough
//! for the certificates rcgen writes, and for [`crate::csr::RawRequest`]) and a
//! subjectUniqueID inserted and signed again.

use rcgen::KeyPair;

/// A DER tag-length-value.
pub(crate) fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// The TLVs of a DER content, each whole (tag, length and value).
fn children(mut content: &[u8]) -> Vec<&[u8]> {
    let mut children = Vec::new();
    while !content.is_empty() {
        let (header, len) = match content[1] {
            n if n < 0x80 => (2, usize::from(n)),
            n => {
                let count = usize::from(n & 0x7f);
                let len = content[2..2 + count]
                    .iter()
                    .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
                (2 + count, len)
            }
        };
        children.push(&content[..header + len]);
        content = &content[header + len..];
    }
    children
}

/// The value of a DER TLV.
fn value(tlv: &[u8]) -> &[u8] {
    let header = if tlv[1] < 0x80 {
        2
    } else {
        2 + usize::from(tlv[1] & 0x7f)
    };
    &tlv[header..]
}

/// `cert` (self-signed by `key`) with a subjectUniqueID (`[2] IMPLICIT BIT STRING`) after its
/// subjectPublicKeyInfo, signed again by `key`.
pub(crate) fn with_subject_unique_id(cert: &[u8], key: &KeyPair) -> Vec<u8> {
    use rcgen::SigningKey;
    let outer = children(value(cert));
    let (tbs, algorithm) = (outer[0], outer[1]);
    let mut fields: Vec<Vec<u8>> = children(value(tbs))
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect();
    // version, serial, signature, issuer, validity, subject, subjectPublicKeyInfo, then [3].
    fields.insert(7, tlv(0x82, &[0x00, 0x7e, 0x57, 0x1d]));
    let tbs = tlv(0x30, &fields.concat());
    let signature = key.sign(&tbs).expect("signing");
    let mut bits = vec![0x00];
    bits.extend(signature);
    tlv(0x30, &[tbs, algorithm.to_vec(), tlv(0x03, &bits)].concat())
}

/// A certificate's PEM text.
pub(crate) fn pem_of(der: &[u8]) -> String {
    pem::encode_config(
        &pem::Pem::new("CERTIFICATE", der.to_vec()),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

/// The DER of an OBJECT IDENTIFIER given dotted (`2.5.4.3`).
///
/// # Panics
/// On a malformed dotted OID (a test bug).
pub(crate) fn oid(dotted: &str) -> Vec<u8> {
    let arcs: Vec<u64> = dotted
        .split('.')
        .map(|a| a.parse().expect("a dotted OID"))
        .collect();
    let mut content = Vec::new();
    let mut push = |mut arc: u64| {
        let mut bytes = vec![(arc & 0x7f) as u8];
        arc >>= 7;
        while arc > 0 {
            bytes.push(0x80 | (arc & 0x7f) as u8);
            arc >>= 7;
        }
        bytes.reverse();
        content.extend(bytes);
    };
    push(arcs[0] * 40 + arcs[1]);
    for arc in &arcs[2..] {
        push(*arc);
    }
    tlv(0x06, &content)
}
