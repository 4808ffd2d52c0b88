//! What one successful attempt saw: timings, resumption, the served serial and the negotiated
//! parameters. A leaf of `load`: the workers produce it, the report tallies it.

/// What one successful attempt saw.
pub(super) struct Seen {
    /// Connect + TLS handshake.
    pub(super) handshake_us: u32,
    /// Connect, handshake, request and the whole response.
    pub(super) request_us: u32,
    pub(super) resumed: bool,
    /// The leaf's serial, for full handshakes only: on resumption rustls reports the chain of the
    /// original session, which says nothing about what the server serves now.
    pub(super) serial: Option<String>,
    /// What the handshake negotiated, as rustls names it.
    pub(super) negotiated: Negotiated,
}

/// The handshake parameters `ClientConnection` reports, named as rustls' `Debug` prints them
/// (`TLSv1_3`, `TLS13_AES_256_GCM_SHA384`, `X25519`); `none` where nothing was negotiated.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Negotiated {
    pub(super) protocol: String,
    pub(super) cipher_suite: String,
    pub(super) group: String,
    pub(super) alpn: String,
}

impl Negotiated {
    pub(super) fn of(conn: &rustls::ClientConnection) -> Negotiated {
        fn name(value: Option<impl std::fmt::Debug>) -> String {
            value.map_or_else(|| "none".to_owned(), |v| format!("{v:?}"))
        }
        Negotiated {
            protocol: name(conn.protocol_version()),
            cipher_suite: name(conn.negotiated_cipher_suite().map(|s| s.suite())),
            group: name(conn.negotiated_key_exchange_group().map(|g| g.name())),
            alpn: conn.alpn_protocol().map_or_else(
                || "none".to_owned(),
                |p| String::from_utf8_lossy(p).into_owned(),
            ),
        }
    }
}
