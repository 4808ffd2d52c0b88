//! The CSR approver's reading of a request (`cert_syncer::kubelet_csr`): our Go-faithful PEM
//! framing, the one-block CSR shape, the strict DER reader and the kubelet policy, over bytes a
//! bootstrap-token holder chooses.
//!
//! Input: the request bytes as they arrive in `spec.request` (seeds: the kubelet's request and
//! the odd ones of issue 35 in `seeds/kubelet_csr/`).
//!
//! Properties, besides no panic:
//! - a refusal has a reason on one line that never quotes the request's text (no run of 48
//!   base64 characters from it: more than the 40 characters of a PEM type a reason may quote);
//! - whatever is accepted as node `n`'s kubelet request is exactly one block that Go's
//!   `pem.Decode` reads too: the first block Go finds (`go_first_block`) is a `CERTIFICATE
//!   REQUEST` with the same DER as the accepted one, and nothing but blanks is around it;
//! - reading is deterministic.

#![no_main]

use cert_syncer::kubelet_csr::{der_of, go_first_block, kubelet_request};
use libfuzzer_sys::fuzz_target;

const NODE: &str = "n";

fuzz_target!(|data: &[u8]| {
    let verdict = kubelet_request(data, NODE);
    assert_eq!(verdict, kubelet_request(data, NODE), "not deterministic");
    match verdict {
        Err(refused) => {
            assert!(!refused.reason.trim().is_empty(), "a refusal without a reason");
            assert!(!refused.reason.contains('\n'), "a reason on several lines");
            if let Ok(text) = std::str::from_utf8(data) {
                for run in text
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '+' || c == '/'))
                    .filter(|run| run.len() >= 48)
                {
                    assert!(!refused.reason.contains(run), "the reason quotes the request");
                }
            }
        }
        Ok(_) => {
            let der = der_of(data).expect("accepted, so framed");
            let (label, go_der) = go_first_block(data).expect("Go reads a block");
            assert_eq!(label, "CERTIFICATE REQUEST");
            assert_eq!(go_der, der, "Go reads another block");
            assert!(!data.contains(&b'\r'));
        }
    }
});
