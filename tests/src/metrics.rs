//! The metrics and health endpoints in tests: one plain-HTTP GET, and sums over Prometheus
//! text. A leaf of the harness.

/// The sum of the samples of metric `name` (Prometheus text) whose labels contain every one of
/// `labels` (`kind="secret"`, ...); 0 when there is none.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?;
            (rest.is_empty() || rest.starts_with('{')).then_some((rest, value))
        })
        .filter(|(series, _)| labels.iter().all(|label| series.contains(label)))
        .filter_map(|(_, value)| value.parse::<f64>().ok())
        .sum()
}

/// One plain-HTTP `GET` (metrics and health endpoints); returns (status code, body).
pub fn plain_http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut tcp = std::net::TcpStream::connect(addr).unwrap();
    write!(
        tcp,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = Vec::new();
    tcp.read_to_end(&mut response).unwrap();
    testkit::http::RawResponse::parse(&response).status_and_body()
}
