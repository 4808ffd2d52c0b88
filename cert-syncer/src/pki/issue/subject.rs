//! The subject of a client certificate with more than one group: Kubernetes reads the user from
//! the CN and one group from each O, but rcgen's `DistinguishedName` holds one value per
//! attribute type (a second O replaces the first). So the subject is written here (CN, then one
//! RDN per group, as Go's `pkix.Name` with several organizations has them) into the certificate
//! rcgen made, which is signed again with the issuer's key.

use rcgen::{KeyPair, SigningKey};

/// The OIDs of commonName (2.5.4.3) and organizationName (2.5.4.10), DER.
const CN: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x03];
const O: &[u8] = &[0x06, 0x03, 0x55, 0x04, 0x0a];

/// `cert` (DER, issued by `issuer`) with the subject CN = `user`, O = each of `groups`.
pub(super) fn with_groups(
    cert: &[u8],
    user: &str,
    groups: &[String],
    issuer: &KeyPair,
) -> Result<Vec<u8>, String> {
    let outer = children(value(cert)?)?;
    let [tbs, algorithm, _signature] = outer[..] else {
        return Err("not a certificate".to_owned());
    };
    let mut fields: Vec<Vec<u8>> = children(value(tbs)?)?
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect();
    // version, serial, signature, issuer, validity, subject, ...
    let subject = fields
        .get_mut(5)
        .ok_or_else(|| "a certificate without a subject".to_owned())?;
    let rdn = |oid: &[u8], text: &str| {
        tlv(
            0x31,
            &tlv(0x30, &[oid, &tlv(0x0c, text.as_bytes())].concat()),
        )
    };
    let mut name = rdn(CN, user);
    for group in groups {
        name.extend(rdn(O, group));
    }
    *subject = tlv(0x30, &name);
    let tbs = tlv(0x30, &fields.concat());
    let signature = issuer
        .sign(&tbs)
        .map_err(|err| format!("signing the subject: {err}"))?;
    let mut bits = vec![0x00];
    bits.extend(signature);
    Ok(tlv(
        0x30,
        &[tbs, algorithm.to_vec(), tlv(0x03, &bits)].concat(),
    ))
}

/// A DER tag-length-value.
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
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

/// (header length, value length) of the TLV at the start of `der`.
fn header(der: &[u8]) -> Result<(usize, usize), String> {
    let bad = || "malformed DER".to_owned();
    let first = *der.get(1).ok_or_else(bad)?;
    if first < 0x80 {
        return Ok((2, usize::from(first)));
    }
    let count = usize::from(first & 0x7f);
    if count == 0 || count > 4 {
        return Err(bad());
    }
    let len = der
        .get(2..2 + count)
        .ok_or_else(bad)?
        .iter()
        .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
    Ok((2 + count, len))
}

/// The value of the TLV `der`.
fn value(der: &[u8]) -> Result<&[u8], String> {
    let (head, len) = header(der)?;
    der.get(head..head + len)
        .ok_or_else(|| "malformed DER".to_owned())
}

/// The TLVs of a constructed value, each whole.
fn children(mut content: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut out = Vec::new();
    while !content.is_empty() {
        let (head, len) = header(content)?;
        let end = head + len;
        out.push(
            content
                .get(..end)
                .ok_or_else(|| "malformed DER".to_owned())?,
        );
        content = &content[end..];
    }
    Ok(out)
}
