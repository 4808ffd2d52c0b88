//! What a load run is given, resolved before the first connection. A leaf of `load`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rustls_pki_types::ServerName;
use tokio_rustls::TlsConnector;

use super::observe::Observer;

/// Everything a run needs, resolved before the first connection: a bad file or name is one
/// configuration error, not one failure per attempt.
pub struct Settings {
    pub(super) addr: SocketAddr,
    pub(super) server_name: ServerName<'static>,
    /// Built once: every attempt sends the same bytes.
    pub(super) request: Vec<u8>,
    /// Holds the one `ClientConfig`, and so the one session store, all workers share.
    pub(super) connector: TlsConnector,
    pub(super) concurrency: u32,
    pub(super) duration: Duration,
    pub(super) requests: Option<u64>,
    pub(super) timeout: Duration,
    /// Attempts started per second across all workers; `None`: each worker starts its next
    /// attempt as soon as the last one ends (closed loop).
    pub(super) rate: Option<f64>,
    /// Where the config's verifier and session store count signature schemes and tickets.
    pub(super) observer: Option<Arc<Observer>>,
}

impl Settings {
    /// Settings for `concurrency` (at least 1) workers hitting `addr` as `server_name` for
    /// `duration`. Resumption follows `config.resumption`: workers share `config`, so a ticket
    /// one worker received can resume another worker's next connection. The request budget and the per-attempt timeout
    /// (default 5 s) are set with [`Settings::requests`] and [`Settings::timeout`].
    ///
    /// # Errors
    ///
    /// When `server_name` is neither a DNS name nor an IP address; validating it also keeps
    /// CR/LF out of the `Host` header.
    pub fn new(
        addr: SocketAddr,
        server_name: &str,
        config: Arc<rustls::ClientConfig>,
        concurrency: u32,
        duration: Duration,
    ) -> anyhow::Result<Settings> {
        let name = ServerName::try_from(server_name.to_owned())
            .with_context(|| format!("invalid server name {server_name}"))?;
        let request = format!("GET / HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n");
        Ok(Settings {
            addr,
            server_name: name,
            request: request.into_bytes(),
            connector: TlsConnector::from(config),
            concurrency: concurrency.max(1),
            duration,
            requests: None,
            timeout: Duration::from_secs(5),
            rate: None,
            observer: None,
        })
    }

    /// Stops after this many attempts in total (successes and failures), if reached before
    /// the duration.
    #[must_use]
    pub fn requests(mut self, requests: Option<u64>) -> Settings {
        self.requests = requests;
        self
    }

    /// The observer whose [`Observer::verifier`] and [`Observer::store`] the client config
    /// uses: the summary then reports signature schemes and tickets received.
    #[must_use]
    pub fn observer(mut self, observer: Arc<Observer>) -> Settings {
        self.observer = Some(observer);
        self
    }

    /// Time limit of one attempt (connect, handshake and request); an attempt over it is a
    /// `timeout` failure, so a stuck server costs time but never hangs the run.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Settings {
        self.timeout = timeout;
        self
    }

    /// Starts `rate` attempts per second in total, evenly spaced, instead of each worker starting
    /// its next attempt at once (`None`, the default). The workers still bound the attempts in
    /// flight: a server that cannot keep up falls behind the schedule, and the summary's rate
    /// shows it. Two servers measured at one rate do the same work per second, so their CPU
    /// per handshake compares like with like (a busier server batches more wake-ups).
    /// A rate that is not a finite number above zero is ignored.
    #[must_use]
    pub fn rate(mut self, rate: Option<f64>) -> Settings {
        self.rate = rate.filter(|r| r.is_finite() && *r > 0.0);
        self
    }
}
