//! Bounded polling for conditions that have no event to await (a file's content, a metric, a
//! served certificate), checking often and failing with what was awaited.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often a condition is checked.
pub const POLL: Duration = Duration::from_millis(20);

/// Waits until `condition` holds, checking every [`POLL`], for at most `timeout`.
///
/// # Panics
/// On timeout, naming `what`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The blocking [`wait_until`], for threads outside a runtime: `Some(value)` as soon as
/// `probe` returns one, `None` after `timeout`.
pub fn poll_until<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

/// Blocks on `rt` until the serving set behind `rx` has published generation `target` or a
/// later one (a reload pass took a change), for at most 10 s.
///
/// # Panics
/// When it was not published within 10 s, or the set stopped.
pub fn block_until_generation(
    rt: &tokio::runtime::Runtime,
    rx: &mut tokio::sync::watch::Receiver<reload_lib::Status>,
    target: u64,
) {
    rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(10),
            rx.wait_for(|s| s.generation >= target),
        )
        .await
        .unwrap_or_else(|_| panic!("generation {target} was not published within 10 s"))
        .expect("the serving set is running");
    });
}
