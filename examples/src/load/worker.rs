//! The worker loop: one attempt after another, each a fresh connection, until time or budget
//! runs out.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustls::HandshakeKind;
use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::report::Tally;
use super::seen::{Negotiated, Seen};
use super::settings::Settings;

/// Attempts back to back (or on the `pacer`'s schedule) until the deadline passes or the shared
/// budget runs out. An attempt in flight at the deadline completes (bounded by the timeout):
/// cutting it would report a failure the server did not cause.
pub(super) async fn worker(
    settings: Arc<Settings>,
    deadline: Instant,
    budget: Arc<AtomicU64>,
    pacer: Option<Arc<Pacer>>,
) -> Tally {
    let mut tally = Tally::default();
    loop {
        if let Some(pacer) = &pacer {
            let start_at = pacer.next_start();
            if start_at >= deadline {
                break;
            }
            tokio::time::sleep_until(start_at).await;
        }
        if Instant::now() >= deadline || !take(&budget) {
            break;
        }
        match tokio::time::timeout(settings.timeout, attempt(&settings)).await {
            Ok(Ok(seen)) => tally.record(seen),
            Ok(Err(reason)) => tally.fail(reason),
            Err(_) => tally.fail("timeout".to_owned()),
        }
    }
    tally
}

/// The schedule of a fixed-rate run: attempt `k` (counted over all workers) starts at
/// `started + k / rate`. A worker takes the next slot when it is free, so when every worker is
/// busy past a slot, that attempt starts late rather than being skipped.
pub(super) struct Pacer {
    started: Instant,
    rate: f64,
    next_slot: AtomicU64,
}

impl Pacer {
    pub(super) fn new(started: Instant, rate: f64) -> Pacer {
        Pacer {
            started,
            rate,
            next_slot: AtomicU64::new(0),
        }
    }

    /// When the next unclaimed attempt is due (claiming it).
    fn next_start(&self) -> Instant {
        let slot = self.next_slot.fetch_add(1, Ordering::Relaxed);
        // Exact up to 2^53 attempts.
        let offset = Duration::from_secs_f64(slot as f64 / self.rate);
        self.started + offset
    }
}

/// Claims one attempt from the budget shared by all workers, so `--requests` is exact.
fn take(budget: &AtomicU64) -> bool {
    budget
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
}

/// One attempt: connect, handshake, `GET /`, the whole response, status 200. The error is the
/// failure reason, prefixed by the phase that failed. Reasons are grouped verbatim, so they hold
/// no per-connection detail (ports, OS error numbers).
async fn attempt(settings: &Settings) -> Result<Seen, String> {
    let start = Instant::now();
    let tcp = TcpStream::connect(settings.addr)
        .await
        .map_err(|err| reason("connect", &err))?;
    // Requests are single small writes; Nagle would only add latency. Failing to set it costs
    // accuracy, not correctness, so it is not a failure.
    let _ = tcp.set_nodelay(true);
    let mut tls = settings
        .connector
        .connect(settings.server_name.clone(), tcp)
        .await
        .map_err(|err| reason("tls", &err))?;
    let handshake_us = micros(start.elapsed());
    let (_, conn) = tls.get_ref();
    let resumed = conn.handshake_kind() == Some(HandshakeKind::Resumed);
    let negotiated = Negotiated::of(conn);
    let serial = match conn.peer_certificates().and_then(|chain| chain.first()) {
        Some(leaf) if !resumed => Some(leaf_serial(leaf)),
        _ => None,
    };
    tls.write_all(&settings.request)
        .await
        .map_err(|err| reason("http: write", &err))?;
    // tokio-rustls may report the write done while rustls still holds the bytes (the socket
    // write was refused): without a flush the request can sit there while we wait for the
    // answer.
    tls.flush()
        .await
        .map_err(|err| reason("http: write", &err))?;
    let mut response = Vec::new();
    if let Err(err) = tls.read_to_end(&mut response).await {
        // Many servers close without close_notify; with `Connection: close` the EOF ends the
        // response anyway, and `check_response` catches a truncated one.
        if err.kind() != io::ErrorKind::UnexpectedEof || response.is_empty() {
            return Err(reason("http: read", &err));
        }
    }
    check_response(&response)?;
    Ok(Seen {
        handshake_us,
        request_us: micros(start.elapsed()),
        resumed,
        serial,
        negotiated,
    })
}

/// The failure reason for an I/O error in `phase`. A rustls error is a `tls:` reason whatever
/// the phase: under TLS 1.3 the server's verdict on a client certificate arrives after the
/// client finished its handshake, on the first read.
fn reason(phase: &str, err: &io::Error) -> String {
    if let Some(tls) = err
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    {
        return format!("tls: {tls}");
    }
    let text = err.to_string();
    match text.rsplit_once(" (os error ") {
        Some((message, _)) if err.raw_os_error().is_some() => format!("{phase}: {message}"),
        _ => format!("{phase}: {text}"),
    }
}

/// Checks an HTTP/1.x response read to EOF: status 200, and a body as long as its framing says
/// (a server dropping the connection mid-response is a failure, not a success).
fn check_response(response: &[u8]) -> Result<(), String> {
    if response.is_empty() {
        return Err("http: empty response".to_owned());
    }
    let Some(header_end) = response.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Err("http: truncated headers".to_owned());
    };
    let head = String::from_utf8_lossy(&response[..header_end]);
    let body = &response[header_end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = match status_line.split(' ').collect::<Vec<_>>()[..] {
        [version, code, ..] if version.starts_with("HTTP/1.") && code.len() == 3 => code,
        _ => return Err("http: malformed status line".to_owned()),
    };
    if status != "200" {
        return Err(format!("http: status {status}"));
    }
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("content-length") {
            let length: usize = value
                .parse()
                .map_err(|_| "http: bad content-length".to_owned())?;
            if body.len() < length {
                return Err("http: truncated body".to_owned());
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            && value.eq_ignore_ascii_case("chunked")
            && !body.ends_with(b"0\r\n\r\n")
        {
            return Err("http: truncated body".to_owned());
        }
    }
    Ok(())
}

/// Saturates rather than wraps (u32 microseconds is 71 minutes; the binary caps the timeout at
/// an hour, so samples stay below that).
fn micros(elapsed: Duration) -> u32 {
    u32::try_from(elapsed.as_micros()).unwrap_or(u32::MAX)
}

/// The leaf's serial, or `unparsable` (rustls accepted the chain, so this should not happen).
fn leaf_serial(leaf: &CertificateDer<'_>) -> String {
    match x509_parser::parse_x509_certificate(leaf) {
        Ok((_, cert)) => normalize_serial(&cert.raw_serial_as_string()),
        Err(_) => "unparsable".to_owned(),
    }
}

/// `00:8f:12` → `8f12`, `0a:1b` → `0a1b`: lowercase hex, no separators, no DER sign-padding
/// bytes. This is how reload-lib logs serials and how `openssl x509 -serial` prints them (in
/// upper case), so serials from all three compare as strings.
fn normalize_serial(raw: &str) -> String {
    let bytes: Vec<&str> = raw.split(':').filter(|b| !b.is_empty()).collect();
    let first = bytes.iter().position(|b| *b != "00").unwrap_or(bytes.len());
    let hex = bytes[first..].concat().to_ascii_lowercase();
    if hex.is_empty() { "00".to_owned() } else { hex }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serials_drop_separators_and_sign_padding_but_keep_byte_pairs() {
        assert_eq!(normalize_serial("00:8f:12"), "8f12");
        assert_eq!(normalize_serial("0a:1b"), "0a1b");
        assert_eq!(normalize_serial("70:00:10:01"), "70001001");
        assert_eq!(normalize_serial("00"), "00");
        assert_eq!(normalize_serial("AB"), "ab");
    }

    #[test]
    fn responses_need_status_200_and_a_complete_body() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        assert_eq!(check_response(ok), Ok(()));
        assert_eq!(check_response(b"HTTP/1.0 200 ok\r\n\r\nanything"), Ok(()));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";
        assert_eq!(check_response(chunked), Ok(()));
        let reason = |r: &[u8]| check_response(r).unwrap_err();
        assert_eq!(
            reason(b"HTTP/1.1 503 Service Unavailable\r\n\r\n"),
            "http: status 503"
        );
        let short = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nok";
        assert_eq!(reason(short), "http: truncated body");
        assert_eq!(
            reason(b"HTTP/1.1 200 OK\r\nContent-Le"),
            "http: truncated headers"
        );
        assert_eq!(reason(b""), "http: empty response");
        assert_eq!(reason(b"SSH-2.0\r\n\r\n"), "http: malformed status line");
    }

    #[test]
    fn reasons_drop_os_error_numbers_and_name_tls_errors_as_tls() {
        let refused = io::Error::from_raw_os_error(111);
        assert_eq!(reason("connect", &refused), "connect: Connection refused");
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        let wrapped = io::Error::new(io::ErrorKind::InvalidData, alert);
        assert_eq!(
            reason("http: read", &wrapped),
            "tls: received fatal alert: CertificateRequired"
        );
    }

    #[test]
    fn the_budget_is_shared_and_exact() {
        let budget = AtomicU64::new(2);
        assert!(take(&budget) && take(&budget));
        assert!(!take(&budget));
    }
}
