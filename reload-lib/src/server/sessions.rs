//! Resumption under a trust epoch. A resumed session skips client-certificate verification, so a
//! session (stateful or a stateless ticket) established under client trust that has since shrunk
//! (a CA removed, a CRL changed) must not resume. The set's own session cache is replaced on a
//! shrink; whatever a caller's `configure` installed (a shared ticketer, its own session store)
//! is wrapped here so that its sessions are bound to the epoch they were made in.
//!
//! The default configuration has no ticketer and the set's own cache, so nothing is wrapped and
//! the handshake path is unchanged.

use std::sync::Arc;

use rustls::server::{ProducesTickets, StoresServerSessions};

/// Identifies one state of client trust; changes exactly when trust shrinks.
pub(crate) type Epoch = [u8; 8];

/// Tickets whose plaintext starts with the epoch they were issued in: a ticket from another epoch
/// decrypts (the key is the caller's) but is refused, so the client does a full handshake.
#[derive(Debug)]
pub(crate) struct EpochTicketer {
    pub(crate) inner: Arc<dyn ProducesTickets>,
    pub(crate) epoch: Epoch,
}

impl ProducesTickets for EpochTicketer {
    fn enabled(&self) -> bool {
        self.inner.enabled()
    }

    fn lifetime(&self) -> u32 {
        self.inner.lifetime()
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let mut tagged = Vec::with_capacity(self.epoch.len() + plain.len());
        tagged.extend_from_slice(&self.epoch);
        tagged.extend_from_slice(plain);
        self.inner.encrypt(&tagged)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        let mut plain = self.inner.decrypt(cipher)?;
        if plain.get(..self.epoch.len()) != Some(&self.epoch[..]) {
            return None;
        }
        plain.drain(..self.epoch.len());
        Some(plain)
    }
}

/// A caller's session store with keys prefixed by the epoch: sessions of another epoch are never
/// found.
#[derive(Debug)]
pub(crate) struct EpochStore {
    pub(crate) inner: Arc<dyn StoresServerSessions>,
    pub(crate) epoch: Epoch,
}

impl EpochStore {
    fn key(&self, key: &[u8]) -> Vec<u8> {
        let mut tagged = Vec::with_capacity(self.epoch.len() + key.len());
        tagged.extend_from_slice(&self.epoch);
        tagged.extend_from_slice(key);
        tagged
    }
}

impl StoresServerSessions for EpochStore {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.inner.put(self.key(&key), value)
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.get(&self.key(key))
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.take(&self.key(key))
    }

    fn can_cache(&self) -> bool {
        self.inner.can_cache()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_of_another_epoch_is_refused() {
        let inner = rustls::crypto::aws_lc_rs::Ticketer::new().unwrap();
        let old = EpochTicketer {
            inner: Arc::clone(&inner),
            epoch: [1; 8],
        };
        let new = EpochTicketer {
            inner,
            epoch: [2; 8],
        };
        let ticket = old.encrypt(b"session").unwrap();
        assert_eq!(old.decrypt(&ticket).as_deref(), Some(&b"session"[..]));
        assert_eq!(new.decrypt(&ticket), None);
    }
}
