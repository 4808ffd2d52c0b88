//! HTTP/1.1 as raw bytes, for tests that write a request by hand (exact headers, bad input) and
//! read the answer of a `Connection: close` exchange.

/// A whole HTTP/1.1 response: the status (0 when the status line is not one), the head (status
/// line and headers) and the body, as sent (chunked bodies are not decoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawResponse {
    /// The status code; 0 when there is none.
    pub status: u16,
    /// The status line and headers.
    pub head: String,
    /// What follows the blank line.
    pub body: String,
}

impl RawResponse {
    /// Splits `bytes` (lossily decoded as UTF-8) at the first blank line.
    pub fn parse(bytes: &[u8]) -> RawResponse {
        let text = String::from_utf8_lossy(bytes);
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        RawResponse {
            status,
            head: head.to_owned(),
            body: body.to_owned(),
        }
    }

    /// (status, body).
    pub fn status_and_body(self) -> (u16, String) {
        (self.status, self.body)
    }
}
