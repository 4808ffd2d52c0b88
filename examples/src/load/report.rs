//! Tallies of what the workers saw, and the summary printed from them.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::Duration;

use super::observe::Observer;
use super::seen::Seen;

/// What one worker saw; each worker owns its tally, so recording takes no lock.
///
/// Latencies are kept exactly, merged and sorted at the end: 4 bytes a sample and two samples a
/// handshake, so a million handshakes cost 8 MB. Runs are seconds long, so that beats pulling in
/// a histogram crate (`hdrhistogram` is not a dependency) and its approximations.
#[derive(Debug, Default)]
pub(super) struct Tally {
    handshake_us: Vec<u32>,
    request_us: Vec<u32>,
    resumed: u64,
    failures: BTreeMap<String, u64>,
    serials: BTreeMap<String, u64>,
    /// Successful handshakes by what they negotiated: category (`protocol`, `cipher_suite`,
    /// `group`, `alpn`) → value → count.
    negotiated: BTreeMap<&'static str, BTreeMap<String, u64>>,
}

impl Tally {
    pub(super) fn record(&mut self, seen: Seen) {
        self.handshake_us.push(seen.handshake_us);
        self.request_us.push(seen.request_us);
        self.resumed += u64::from(seen.resumed);
        if let Some(serial) = seen.serial {
            *self.serials.entry(serial).or_default() += 1;
        }
        let n = seen.negotiated;
        for (category, value) in [
            ("protocol", n.protocol),
            ("cipher_suite", n.cipher_suite),
            ("group", n.group),
            ("alpn", n.alpn),
        ] {
            *self
                .negotiated
                .entry(category)
                .or_default()
                .entry(value)
                .or_default() += 1;
        }
    }

    pub(super) fn fail(&mut self, reason: String) {
        *self.failures.entry(reason).or_default() += 1;
    }

    pub(super) fn merge(&mut self, other: Tally) {
        self.handshake_us.extend(other.handshake_us);
        self.request_us.extend(other.request_us);
        self.resumed += other.resumed;
        for (reason, n) in other.failures {
            *self.failures.entry(reason).or_default() += n;
        }
        for (serial, n) in other.serials {
            *self.serials.entry(serial).or_default() += n;
        }
        for (category, values) in other.negotiated {
            let mine = self.negotiated.entry(category).or_default();
            for (value, n) in values {
                *mine.entry(value).or_default() += n;
            }
        }
    }
}

/// Exact percentiles of one latency series, in microseconds.
#[derive(Debug, Default, PartialEq)]
struct Percentiles {
    p50: u32,
    p90: u32,
    p99: u32,
    max: u32,
}

impl Percentiles {
    fn of(mut samples: Vec<u32>) -> Percentiles {
        samples.sort_unstable();
        Percentiles {
            p50: percentile(&samples, 50),
            p90: percentile(&samples, 90),
            p99: percentile(&samples, 99),
            max: samples.last().copied().unwrap_or(0),
        }
    }
}

/// Nearest-rank percentile (the smallest sample with at least `pct`% of samples at or below it),
/// so every figure reported is a latency that was actually measured; 0 when there are none.
fn percentile(sorted: &[u32], pct: u64) -> u32 {
    let rank = (sorted.len() as u64 * pct).div_ceil(100).max(1);
    sorted
        .get(usize::try_from(rank - 1).unwrap_or(usize::MAX))
        .copied()
        .unwrap_or(0)
}

/// The figures of a run. `handshakes` counts successful attempts only (handshake and a complete
/// 200 response); every other attempt is one failure with its reason.
#[derive(Debug)]
pub struct Summary {
    /// Successful attempts.
    pub handshakes: u64,
    /// Successful attempts whose handshake resumed a session.
    pub resumed: u64,
    /// Failed attempts.
    pub failures: u64,
    failure_reasons: BTreeMap<String, u64>,
    hs_per_sec: f64,
    handshake: Percentiles,
    request: Percentiles,
    serials: BTreeMap<String, u64>,
    negotiated: BTreeMap<&'static str, BTreeMap<String, u64>>,
    /// TLS 1.3 session tickets received, when the config counted them.
    tickets: Option<u64>,
    elapsed: Duration,
}

impl Summary {
    pub(super) fn new(tally: Tally, elapsed: Duration, observer: Option<&Observer>) -> Summary {
        let handshakes = tally.handshake_us.len() as u64;
        let mut negotiated = tally.negotiated;
        if let Some(observer) = observer {
            negotiated.insert("signature_scheme", observer.signature_schemes());
        }
        Summary {
            handshakes,
            resumed: tally.resumed,
            failures: tally.failures.values().sum(),
            failure_reasons: tally.failures,
            hs_per_sec: handshakes as f64 / elapsed.as_secs_f64().max(f64::EPSILON),
            handshake: Percentiles::of(tally.handshake_us),
            request: Percentiles::of(tally.request_us),
            serials: tally.serials,
            negotiated,
            tickets: observer.map(Observer::tickets),
            elapsed,
        }
    }

    /// One JSON object on one line. The `p*_us`/`max_us` keys are connect + handshake latencies,
    /// the `request_*` keys run through the whole response.
    ///
    /// # Errors
    ///
    /// When `out` fails.
    pub fn write_json(&self, out: &mut impl Write) -> io::Result<()> {
        let json = serde_json::json!({
            "handshakes": self.handshakes,
            "resumed": self.resumed,
            "failures": self.failures,
            "failure_reasons": self.failure_reasons,
            "hs_per_sec": (self.hs_per_sec * 10.0).round() / 10.0,
            "p50_us": self.handshake.p50,
            "p90_us": self.handshake.p90,
            "p99_us": self.handshake.p99,
            "max_us": self.handshake.max,
            "request_p50_us": self.request.p50,
            "request_p90_us": self.request.p90,
            "request_p99_us": self.request.p99,
            "request_max_us": self.request.max,
            "serials": self.serials,
            "negotiated": self.negotiated,
            "tickets_received": self.tickets,
            "duration_secs": (self.elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
        });
        writeln!(out, "{json}")
    }

    /// The human-readable summary.
    ///
    /// # Errors
    ///
    /// When `out` fails.
    pub fn write_text(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "handshakes: {} ok ({} resumed, {} full) in {:.2} s = {:.1}/s",
            self.handshakes,
            self.resumed,
            self.handshakes - self.resumed,
            self.elapsed.as_secs_f64(),
            self.hs_per_sec,
        )?;
        writeln!(out, "failures:   {}", self.failures)?;
        for (reason, n) in &self.failure_reasons {
            writeln!(out, "  {n:>8}  {reason}")?;
        }
        writeln!(out, "latency us:        p50       p90       p99       max")?;
        let series = [
            ("  handshake", &self.handshake),
            ("  request  ", &self.request),
        ];
        for (label, p) in series {
            let (p50, p90, p99, max) = (p.p50, p.p90, p.p99, p.max);
            writeln!(out, "{label} {p50:>9} {p90:>9} {p99:>9} {max:>9}")?;
        }
        writeln!(
            out,
            "  (handshake: connect + TLS; request: through the whole response)"
        )?;
        writeln!(
            out,
            "negotiated (successful handshakes; signature schemes: full ones):"
        )?;
        for (category, values) in &self.negotiated {
            let values: Vec<String> = values.iter().map(|(v, n)| format!("{v} x{n}")).collect();
            writeln!(out, "  {category:<17} {}", values.join(", "))?;
        }
        if let Some(tickets) = self.tickets {
            let per = tickets as f64 / self.handshakes.max(1) as f64;
            writeln!(
                out,
                "  {:<17} {tickets} ({per:.2} per handshake)",
                "session tickets"
            )?;
        }
        writeln!(out, "serials seen in full handshakes:")?;
        for (serial, n) in &self.serials {
            writeln!(out, "  {n:>8}  {serial}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::seen::Negotiated;

    fn seen(us: u32, resumed: bool, serial: Option<&str>) -> Seen {
        Seen {
            handshake_us: us,
            request_us: us + 1,
            resumed,
            serial: serial.map(str::to_owned),
            negotiated: Negotiated {
                protocol: "TLSv1_3".to_owned(),
                cipher_suite: "TLS13_AES_256_GCM_SHA384".to_owned(),
                group: if resumed { "X25519" } else { "secp256r1" }.to_owned(),
                alpn: "none".to_owned(),
            },
        }
    }

    #[test]
    fn percentiles_are_nearest_rank_samples() {
        let p = Percentiles::of((1..=100).rev().collect());
        assert_eq!((p.p50, p.p90, p.p99, p.max), (50, 90, 99, 100));
        let one = Percentiles::of(vec![7]);
        assert_eq!((one.p50, one.p90, one.p99, one.max), (7, 7, 7, 7));
        assert_eq!(Percentiles::of(Vec::new()), Percentiles::default());
    }

    #[test]
    fn merged_tallies_add_up_in_the_json_report() {
        let mut a = Tally::default();
        a.record(seen(10, false, Some("0a1b")));
        a.record(seen(20, true, None));
        a.fail("timeout".to_owned());
        let mut b = Tally::default();
        b.record(seen(30, false, Some("0a1b")));
        b.fail("timeout".to_owned());
        b.fail("http: status 503".to_owned());
        a.merge(b);
        let summary = Summary::new(a, Duration::from_secs(2), None);
        let mut out = Vec::new();
        summary.write_json(&mut out).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(json["handshakes"], 3);
        assert_eq!(json["resumed"], 1);
        assert_eq!(json["failures"], 3);
        assert_eq!(json["failure_reasons"]["timeout"], 2);
        assert_eq!(json["failure_reasons"]["http: status 503"], 1);
        assert_eq!(json["serials"]["0a1b"], 2);
        assert_eq!(json["hs_per_sec"], 1.5);
        assert_eq!(
            (json["p50_us"].as_u64(), json["max_us"].as_u64()),
            (Some(20), Some(30))
        );
        assert_eq!(json["request_max_us"], 31);
        assert_eq!(json["duration_secs"], 2.0);
        assert_eq!(json["negotiated"]["protocol"]["TLSv1_3"], 3);
        assert_eq!(json["negotiated"]["group"]["secp256r1"], 2);
        assert_eq!(json["negotiated"]["group"]["X25519"], 1);
        assert!(json["tickets_received"].is_null());
    }
}
