//! The crate's own tokio runtime, on which every set's reload task runs and reads its files
//! (blocking pool). A set then keeps reloading when the runtime that started it shuts down (a
//! library used from a short-lived runtime, a test harness, a `block_on` at start-up), and a
//! hostile or hung file can never stall the caller's async workers.
//!
//! One worker thread: the tasks only wait for events, and the reading and parsing runs on the
//! blocking pool.

use std::sync::OnceLock;

use tokio::runtime::{Builder, Runtime};

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// The runtime, created on first use.
pub(crate) fn get() -> &'static Runtime {
    RUNTIME.get_or_init(|| {
        Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("reload-lib")
            .enable_all()
            .build()
            // Only fails when no thread can be created at all, where nothing else would work.
            .expect("cannot start the reload-lib runtime thread")
    })
}
