//! A PKCS#10 certificate request (RFC 2986) read strictly: every element of the structure, with
//! nothing Go's `x509.ParseCertificateRequest` (Go 1.19, `encoding/asn1`) could read otherwise.
//!
//! Go's reader is lenient in ways a check must not be: it allows elements after the last field
//! of a SEQUENCE (certificationRequestInfo, the request itself), keeps the last CN of a subject
//! and appends every O, ignores attributes it cannot parse, reads only the first value of each
//! extensionRequest attribute, and lets the last subjectAltName extension win. So this reader
//! takes nothing on trust: DER only (definite, minimal lengths; one-byte tags), every SEQUENCE
//! consumed exactly, no trailing bytes at any level, and it hands the caller *every* subject
//! attribute and *every* attribute of the request with all its values, in order, for the
//! caller's policy to refuse what it does not expect. The signature is verified over the exact
//! bytes of certificationRequestInfo (x509-parser over aws-lc-rs), as Go's `CheckSignature`
//! does.
//!
//! ```text
//! CertificationRequest ::= SEQUENCE {
//!   certificationRequestInfo SEQUENCE {
//!     version INTEGER (0), subject Name, subjectPKInfo SEQUENCE { algorithm, BIT STRING },
//!     attributes [0] IMPLICIT SET OF SEQUENCE { type OID, values SET OF ANY } },
//!   signatureAlgorithm AlgorithmIdentifier, signature BIT STRING }
//! ```

/// The request's parts, as read.
#[derive(Debug, Clone)]
pub struct CertificateRequest<'a> {
    /// The subject's RDNs in order, each with its attributes (one, unless multi-valued).
    pub subject: Vec<Vec<SubjectAttribute<'a>>>,
    /// The subjectPublicKeyInfo's algorithm OID (dotted).
    pub key_algorithm: String,
    /// Every attribute of the request, in order, with all its values.
    pub attributes: Vec<RequestAttribute<'a>>,
}

/// One attribute of the subject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectAttribute<'a> {
    /// Dotted OID (`2.5.4.3` is CN, `2.5.4.10` O).
    pub oid: String,
    /// The value's DER tag (`0x0c` UTF8String, `0x13` PrintableString...).
    pub tag: u8,
    /// The value's content bytes.
    pub value: &'a [u8],
}

/// One attribute of the request (`extensionRequest`, `challengePassword`...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestAttribute<'a> {
    /// Dotted OID (`1.2.840.113549.1.9.14` is extensionRequest).
    pub oid: String,
    /// Each value, whole (tag, length and content).
    pub values: Vec<&'a [u8]>,
}

/// One requested extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extension {
    /// Dotted OID (`2.5.29.17` is subjectAltName).
    pub oid: String,
    pub critical: bool,
}

/// CN.
pub const OID_COMMON_NAME: &str = "2.5.4.3";
/// O.
pub const OID_ORGANIZATION: &str = "2.5.4.10";
/// PKCS#9 extensionRequest.
pub const OID_EXTENSION_REQUEST: &str = "1.2.840.113549.1.9.14";
/// subjectAltName.
pub const OID_SUBJECT_ALT_NAME: &str = "2.5.29.17";
/// rsaEncryption.
pub const OID_RSA: &str = "1.2.840.113549.1.1.1";

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
const OCTET_STRING: u8 = 0x04;
const OID: u8 = 0x06;
const BOOLEAN: u8 = 0x01;
const ATTRIBUTES: u8 = 0xa0;

impl<'a> CertificateRequest<'a> {
    /// Reads `der` and verifies its signature.
    ///
    /// # Errors
    /// What is wrong and where, never the bytes.
    pub fn parse(der: &'a [u8]) -> Result<CertificateRequest<'a>, String> {
        let mut outer = Der::new(der);
        let mut request = outer.nested(SEQUENCE, "the request")?;
        outer.finish("the request")?;
        let (info_content, info_whole) = request.expect(SEQUENCE, "certificationRequestInfo")?;
        let (_, algorithm_whole) = request.expect(SEQUENCE, "signatureAlgorithm")?;
        let (_, signature_whole) = request.expect(BIT_STRING, "signature")?;
        request.finish("the request")?;
        let mut info = Der::new(info_content);
        if info.element(INTEGER, "version")? != [0] {
            return Err("version is not 0 (v1)".to_owned());
        }
        let subject = read_subject(&mut info.nested(SEQUENCE, "subject")?)?;
        let (key_content, key_whole) = info.expect(SEQUENCE, "subjectPublicKeyInfo")?;
        let mut key = Der::new(key_content);
        let mut algorithm = key.nested(SEQUENCE, "the key's algorithm")?;
        let key_algorithm = oid_string(algorithm.element(OID, "the key's algorithm")?)?;
        key.element(BIT_STRING, "the public key")?;
        key.finish("subjectPublicKeyInfo")?;
        let attributes = read_attributes(&mut info.nested(ATTRIBUTES, "attributes")?)?;
        info.finish("certificationRequestInfo")?;
        verify_signature(info_whole, key_whole, algorithm_whole, signature_whole)?;
        Ok(CertificateRequest {
            subject,
            key_algorithm,
            attributes,
        })
    }
}

fn read_subject<'a>(name: &mut Der<'a>) -> Result<Vec<Vec<SubjectAttribute<'a>>>, String> {
    let mut rdns = Vec::new();
    while !name.is_empty() {
        let mut rdn = name.nested(SET, "a subject RDN")?;
        let mut attributes = Vec::new();
        while !rdn.is_empty() {
            let mut pair = rdn.nested(SEQUENCE, "a subject attribute")?;
            let oid = oid_string(pair.element(OID, "a subject attribute's type")?)?;
            let (tag, value) = pair.any("a subject attribute's value")?;
            pair.finish("a subject attribute")?;
            attributes.push(SubjectAttribute { oid, tag, value });
        }
        if attributes.is_empty() {
            return Err("the subject has an empty RDN".to_owned());
        }
        rdns.push(attributes);
    }
    Ok(rdns)
}

fn read_attributes<'a>(set: &mut Der<'a>) -> Result<Vec<RequestAttribute<'a>>, String> {
    let mut attributes = Vec::new();
    while !set.is_empty() {
        let mut attribute = set.nested(SEQUENCE, "an attribute")?;
        let oid = oid_string(attribute.element(OID, "an attribute's type")?)?;
        let mut values_set = attribute.nested(SET, "an attribute's values")?;
        attribute.finish("an attribute")?;
        let mut values = Vec::new();
        while !values_set.is_empty() {
            values.push(values_set.whole("an attribute's value")?);
        }
        attributes.push(RequestAttribute { oid, values });
    }
    Ok(attributes)
}

/// The extensions of one extensionRequest value (`SEQUENCE OF Extension`), read whole.
///
/// # Errors
/// A value that is not such a sequence.
pub fn extensions(value: &[u8]) -> Result<Vec<Extension>, String> {
    let mut outer = Der::new(value);
    let mut list = outer.nested(SEQUENCE, "an extensionRequest value")?;
    outer.finish("an extensionRequest value")?;
    let mut extensions = Vec::new();
    while !list.is_empty() {
        let mut extension = list.nested(SEQUENCE, "an extension")?;
        let oid = oid_string(extension.element(OID, "an extension's id")?)?;
        let critical = if extension.peek() == Some(BOOLEAN) {
            extension.element(BOOLEAN, "an extension's criticality")? != [0]
        } else {
            false
        };
        extension.element(OCTET_STRING, "an extension's value")?;
        extension.finish("an extension")?;
        extensions.push(Extension { oid, critical });
    }
    Ok(extensions)
}

/// The signature over the exact bytes of certificationRequestInfo, with the request's own key
/// (x509-parser's verifier over aws-lc-rs; each part parsed on its own, so that its reading of
/// the rest of the request plays no part).
fn verify_signature(
    info: &[u8],
    key: &[u8],
    algorithm: &[u8],
    signature: &[u8],
) -> Result<(), String> {
    use x509_parser::der_parser::asn1_rs::{self, BitString, FromDer};
    let unreadable = |what: &str| format!("its {what} is not readable for the signature check");
    let (_, key) = x509_parser::x509::SubjectPublicKeyInfo::from_der(key)
        .map_err(|_| unreadable("public key"))?;
    let (_, algorithm) = x509_parser::x509::AlgorithmIdentifier::from_der(algorithm)
        .map_err(|_| unreadable("signature algorithm"))?;
    let (_, signature) = <BitString<'_> as FromDer<'_, asn1_rs::Error>>::from_der(signature)
        .map_err(|_| unreadable("signature"))?;
    x509_parser::verify::verify_signature(&key, &algorithm, &signature, info)
        .map_err(|err| format!("its signature does not verify: {err}"))
}

/// A dotted OID from DER content: every arc minimally encoded.
fn oid_string(content: &[u8]) -> Result<String, String> {
    let malformed = || "an OID is not minimally encoded".to_owned();
    if content.is_empty() || content.last().is_some_and(|b| b & 0x80 != 0) {
        return Err(malformed());
    }
    let mut arcs: Vec<u128> = Vec::new();
    let mut arc: u128 = 0;
    let mut start = true;
    for &byte in content {
        if start && byte == 0x80 {
            return Err(malformed());
        }
        arc = arc
            .checked_mul(128)
            .ok_or_else(|| "an OID arc is too large".to_owned())?
            | u128::from(byte & 0x7f);
        start = byte & 0x80 == 0;
        if start {
            arcs.push(arc);
            arc = 0;
        }
    }
    let first = arcs[0];
    let (a, b) = match first {
        0..40 => (0, first),
        40..80 => (1, first - 40),
        _ => (2, first - 80),
    };
    let mut out = format!("{a}.{b}");
    for arc in &arcs[1..] {
        out.push_str(&format!(".{arc}"));
    }
    Ok(out)
}

/// A strict DER reader over one level of content.
struct Der<'a> {
    rest: &'a [u8],
}

impl<'a> Der<'a> {
    fn new(bytes: &'a [u8]) -> Der<'a> {
        Der { rest: bytes }
    }

    fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    fn peek(&self) -> Option<u8> {
        self.rest.first().copied()
    }

    /// The next element: its tag, content and whole encoding.
    fn next(&mut self, what: &str) -> Result<(u8, &'a [u8], &'a [u8]), String> {
        let truncated = || format!("{what} is truncated");
        let bytes = self.rest;
        let tag = *bytes.first().ok_or_else(|| format!("{what} is missing"))?;
        if tag & 0x1f == 0x1f {
            return Err(format!("{what} has a multi-byte tag"));
        }
        let first = *bytes.get(1).ok_or_else(truncated)?;
        let (header, len) = match first {
            0..=0x7f => (2, usize::from(first)),
            0x80 => return Err(format!("{what} has an indefinite length (BER, not DER)")),
            0x81..=0x84 => {
                let count = usize::from(first & 0x7f);
                let len_bytes = bytes.get(2..2 + count).ok_or_else(truncated)?;
                if len_bytes[0] == 0 {
                    return Err(format!("{what} has a length with a leading zero"));
                }
                let len = len_bytes
                    .iter()
                    .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
                if len < 0x80 {
                    return Err(format!("{what} has a long-form length under 128"));
                }
                (2 + count, len)
            }
            _ => return Err(format!("{what} has a length over 4 bytes")),
        };
        let end = header
            .checked_add(len)
            .filter(|end| *end <= bytes.len())
            .ok_or_else(truncated)?;
        self.rest = &bytes[end..];
        Ok((tag, &bytes[header..end], &bytes[..end]))
    }

    fn expect(&mut self, tag: u8, what: &str) -> Result<(&'a [u8], &'a [u8]), String> {
        let (got, content, whole) = self.next(what)?;
        if got != tag {
            return Err(format!("{what} has tag {got:#04x}, not {tag:#04x}"));
        }
        Ok((content, whole))
    }

    /// The content of the next element, which must have `tag`.
    fn element(&mut self, tag: u8, what: &str) -> Result<&'a [u8], String> {
        Ok(self.expect(tag, what)?.0)
    }

    /// A reader over the content of the next element, which must have `tag`.
    fn nested(&mut self, tag: u8, what: &str) -> Result<Der<'a>, String> {
        Ok(Der::new(self.element(tag, what)?))
    }

    /// The next element of any primitive or constructed type: its tag and content.
    fn any(&mut self, what: &str) -> Result<(u8, &'a [u8]), String> {
        let (tag, content, _) = self.next(what)?;
        Ok((tag, content))
    }

    /// The next element whole (tag, length and content).
    fn whole(&mut self, what: &str) -> Result<&'a [u8], String> {
        Ok(self.next(what)?.2)
    }

    /// Nothing may follow (Go allows more elements at the end of a SEQUENCE; we do not).
    fn finish(&self, what: &str) -> Result<(), String> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(format!("{what} has more elements or bytes than it should"))
        }
    }
}

#[cfg(test)]
#[path = "csr_tests.rs"]
mod tests;
