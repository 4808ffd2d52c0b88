//! New keys for one pass: generated on blocking threads, at most one per CPU at a time, the
//! most needed first (issue 37 item 2; k0s did the same, k0sproject/k0s #256).
//!
//! An RSA-2048 key is a random search for two primes: 50–300 ms of one CPU each, and a pass
//! over a slept control plane makes about twenty. One after the other they were most of the
//! sidecars' share of the recovery (BENCHMARKS.md). Here a pass asks for the keys it will most
//! likely need as soon as it has read the objects (`Pass::run`, before any write), each with its
//! step's rank in the graph (`graph`), and a write takes its key when it is built: the
//! `localhost` chain's keys come first, and on a machine with two CPUs two are made at once.
//! Every write still decides on what it read and writes with that resourceVersion: only the
//! key is made ahead, never the decision.
//!
//! A key nobody takes (the write was kept, held or refused after all) is dropped with the pool
//! at the end of the pass; one not started by then is never made. Keys never leave the process
//! except in the Secret they were made for.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use rcgen::KeyPair;
use tokio::sync::oneshot;

use crate::pki::KeyType;

/// What a key is for: library-go pairs a P-384 CA with P-256 leaves under `ecdsa-p384`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyUse {
    Ca,
    Leaf,
}

/// The keys of one pass (see the module docs).
pub(super) struct KeyPool {
    key_type: KeyType,
    /// Keys made at once: the CPUs this process may use.
    workers: usize,
    queue: Arc<Mutex<Queue>>,
}

/// Keys asked for and not yet started.
#[derive(Default)]
struct Queue {
    /// By (rank, order of the request): the lowest first.
    jobs: BTreeMap<(usize, u64), Job>,
    requests: u64,
    /// Threads making keys now.
    running: usize,
}

struct Job {
    used_for: KeyUse,
    reply: oneshot::Sender<Result<KeyPair, String>>,
}

/// A key asked for: [`Ticket::key`] waits for it; dropped, the key is not made (or dropped).
pub(super) struct Ticket(oneshot::Receiver<Result<KeyPair, String>>);

impl Ticket {
    pub(super) async fn key(self) -> Result<KeyPair, String> {
        self.0
            .await
            .map_err(|_| "the key's generation was stopped".to_owned())?
    }
}

impl KeyPool {
    /// A pool making `key_type` keys on as many threads as the process has CPUs.
    pub(super) fn new(key_type: KeyType) -> KeyPool {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        KeyPool::with_workers(key_type, cpus.max(1))
    }

    /// A pool making keys on at most `workers` threads (none: the tests make them one by one).
    pub(super) fn with_workers(key_type: KeyType, workers: usize) -> KeyPool {
        KeyPool {
            key_type,
            workers,
            queue: Arc::new(Mutex::new(Queue::default())),
        }
    }

    /// Asks for a key; `rank` orders it among the others waiting (lower first).
    pub(super) fn request(&self, rank: usize, used_for: KeyUse) -> Ticket {
        let (reply, receiver) = oneshot::channel();
        let start_worker = {
            let mut queue = lock(&self.queue);
            let order = queue.requests;
            queue.requests += 1;
            queue.jobs.insert((rank, order), Job { used_for, reply });
            let start = queue.running < self.workers;
            if start {
                queue.running += 1;
            }
            start
        };
        if start_worker {
            let (queue, key_type) = (Arc::clone(&self.queue), self.key_type);
            tokio::task::spawn_blocking(move || work(&queue, key_type));
        }
        Ticket(receiver)
    }
}

impl Drop for KeyPool {
    /// Keys not started are never made.
    fn drop(&mut self) {
        lock(&self.queue).jobs.clear();
    }
}

fn lock(queue: &Mutex<Queue>) -> MutexGuard<'_, Queue> {
    queue.lock().unwrap_or_else(|p| p.into_inner())
}

/// One thread: the most needed waiting key, until none is left.
fn work(queue: &Mutex<Queue>, key_type: KeyType) {
    /// The thread counts as running until it ends, however it ends.
    struct Running<'q>(&'q Mutex<Queue>);
    impl Drop for Running<'_> {
        fn drop(&mut self) {
            lock(self.0).running -= 1;
        }
    }
    let _running = Running(queue);
    while make_next(queue, key_type) {}
}

/// Makes the most needed key still wanted; `false` when none is left.
fn make_next(queue: &Mutex<Queue>, key_type: KeyType) -> bool {
    loop {
        let Some((_, job)) = lock(queue).jobs.pop_first() else {
            return false;
        };
        if job.reply.is_closed() {
            // Its write no longer needs it.
            continue;
        }
        let key = match job.used_for {
            KeyUse::Ca => key_type.generate(),
            KeyUse::Leaf => key_type.generate_leaf(),
        };
        let _ = job.reply.send(key);
        return true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(ticket: &mut Ticket) -> Option<KeyPair> {
        ticket.0.try_recv().ok().map(Result::unwrap)
    }

    /// Keys are made in rank order whatever the order of the requests; a request whose ticket
    /// was dropped is never made; a P-384 pool gives P-256 leaves (made one by one here: a pool
    /// with no threads).
    #[test]
    fn keys_are_made_most_needed_first_and_a_dropped_request_never() {
        let pool = KeyPool::with_workers(KeyType::EcdsaP384, 0);
        let mut last = pool.request(100, KeyUse::Ca);
        let mut leaf = pool.request(9, KeyUse::Leaf);
        let dropped = pool.request(1, KeyUse::Ca);
        let mut urgent = pool.request(2, KeyUse::Ca);
        drop(dropped);
        let make = || make_next(&pool.queue, KeyType::EcdsaP384);
        assert!(make());
        let key = ready(&mut urgent).expect("the most urgent wanted key first");
        assert_eq!(key.algorithm(), &rcgen::PKCS_ECDSA_P384_SHA384);
        assert!(ready(&mut leaf).is_none() && ready(&mut last).is_none());
        assert!(make());
        let key = ready(&mut leaf).expect("then rank 9");
        assert_eq!(key.algorithm(), &rcgen::PKCS_ECDSA_P256_SHA256);
        assert!(make());
        assert!(ready(&mut last).is_some());
        assert!(!make(), "the dropped request was skipped, nothing is left");
    }

    /// With threads: every ticket gets its key, and the pool ends its threads when idle.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pool_with_threads_gives_every_ticket_its_key() {
        let pool = KeyPool::with_workers(KeyType::EcdsaP256, 2);
        let tickets: Vec<Ticket> = (0..6).map(|i| pool.request(i, KeyUse::Leaf)).collect();
        for ticket in tickets {
            ticket.key().await.unwrap();
        }
        for _ in 0..100 {
            if lock(&pool.queue).running == 0 {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the key threads did not end");
    }
}
