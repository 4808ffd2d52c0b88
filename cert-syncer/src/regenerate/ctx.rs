//! What every phase of a pass works with ([`Ctx`]): the pass's inputs (the config, the mode,
//! the time) and its reads — from the watches' cache in the controller's loop, by GET with
//! `--once` — and what one phase hands the next. Writes are `write`'s.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use std::collections::BTreeMap;

use super::annotations;
use super::brake::Brake;
use super::cache::{Cache, Cached};
use super::config::{ObjectRef, Rotation};
use super::decide::{self, Mode, Stored};
use super::graph::{Graph, Step};
use super::keys::{KeyPool, KeyUse, Ticket};
use super::trust::BundleState;
use crate::base::error::chain;
use crate::base::time::rfc3339;
use crate::kube::decode::Raw;
use crate::kube::events::EventRecorder;
use crate::pki::{self, Cert, KeyPairPem};

/// After a conflict, how long a pass reading from the cache waits for the watch to bring the
/// newer version (normally milliseconds) before it gives the item up until the next pass.
const CONFLICT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A Secret as read (absent: `None`) with its parsed pair.
pub(super) type ReadSecret = Result<(Option<Secret>, Stored), String>;
/// A CA bundle ConfigMap as read, with its parsed certificates.
pub(super) type ReadBundle = Result<(Option<ConfigMap>, Vec<Cert>), String>;

/// What a step of the pass leaves for the steps that wait for it (`graph`).
#[derive(Debug)]
pub(super) enum Outcome {
    /// A signer or an intermediate CA: the pair stored now (`None`: failed or skipped), and
    /// for a signer whether the manual trigger rotated it in this pass (see `annotations`).
    Pair {
        pair: Option<KeyPairPem>,
        triggered: bool,
    },
    /// A CA bundle, a union, an intermediate's bundle or a ConfigMap copy, as stored.
    Bundle(BundleState),
    /// Nothing another step reads (a target, a publication, a Secret copy).
    Done,
}

/// Where a pass reads the declared objects.
#[derive(Clone, Copy)]
pub enum Reads<'a> {
    /// A GET of each object (`--once`: one pass, no watches worth opening).
    Live,
    /// The namespace-wide watches' cache (the controller's loop): no request per object.
    Cached(&'a Cache),
}

/// What the pass needs from outside.
pub struct Pass<'a> {
    /// For writes, and for reads with [`Reads::Live`].
    pub client: &'a kube::Client,
    pub reads: Reads<'a>,
    pub rotation: &'a Rotation,
    pub mode: Mode,
    /// The time decisions use: `decide::trusted_now` of the local clock and `apiserver_now`.
    pub now: i64,
    /// The apiserver's clock at the start of the pass (`clock::apiserver_time`), if it answered.
    pub apiserver_now: Option<i64>,
    pub events: &'a Arc<EventRecorder>,
    /// The per-object write budget of the controller's loop (`None`: `--once`, one pass).
    pub brake: Option<&'a Brake>,
    /// With `--leader-elect`: cancelled when the Lease is lost. Checked before every write, so
    /// a pass running when the Lease is lost writes nothing more (a standby may be leading).
    pub lease_lost: Option<&'a CancellationToken>,
}

/// What every step works with: the pass's inputs ([`Pass`], through `Deref`), the config's
/// graph, the keys asked for ahead, and the Events it has sent.
pub(super) struct Ctx<'a> {
    pass: &'a Pass<'a>,
    /// The steps, what each waits for, their order.
    pub graph: Graph,
    /// New keys, made ahead on blocking threads (`keys`).
    keys: KeyPool,
    /// Keys asked for ahead, by the object they are for.
    ahead: Mutex<BTreeMap<ObjectRef, Ticket>>,
    /// Events of this pass, sent off the write path; [`Ctx::finish`] waits for them.
    pub pending_events: Mutex<Vec<JoinHandle<()>>>,
}

impl<'a> Ctx<'a> {
    pub(super) fn new(pass: &'a Pass<'a>) -> Ctx<'a> {
        Ctx {
            graph: Graph::of(pass.rotation),
            keys: KeyPool::new(pass.rotation.key_type),
            ahead: Mutex::new(BTreeMap::new()),
            pass,
            pending_events: Mutex::new(Vec::new()),
        }
    }

    /// Asks for the key `object` (written by `step`) will most likely need, ranked by the
    /// step's place in the order: made while other steps run, taken by [`Ctx::key`].
    pub(super) fn key_ahead(&self, step: Step, object: &ObjectRef, used_for: KeyUse) {
        let ticket = self.keys.request(self.graph.rank(step), used_for);
        self.ahead
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(object.clone(), ticket);
    }

    /// A new key for `object`: the one asked for ahead, else one made now, before any other
    /// waiting key.
    pub(super) async fn key(
        &self,
        object: &ObjectRef,
        used_for: KeyUse,
    ) -> Result<rcgen::KeyPair, String> {
        let ahead = self
            .ahead
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(object);
        match ahead {
            Some(ticket) => ticket.key().await,
            None => self.keys.request(0, used_for).key().await,
        }
    }
}

impl<'a> std::ops::Deref for Ctx<'a> {
    type Target = Pass<'a>;

    fn deref(&self) -> &Pass<'a> {
        self.pass
    }
}

impl Ctx<'_> {
    /// The object as read: `None` when it does not exist.
    pub(super) async fn read<K: Cached>(&self, object: &ObjectRef) -> Result<Option<K>, String> {
        match self.reads {
            Reads::Cached(cache) => cache.get::<K>(object),
            Reads::Live => {
                // Raw, then decoded here: kube-client would log the whole body (keys) on a bad
                // field.
                let api: Api<Raw<K>> = Api::namespaced(self.client.clone(), &object.namespace);
                api.get_opt(&object.name)
                    .await
                    .map_err(|err| format!("cannot read: {}", chain(&err)))?
                    .map(|raw| raw.decode())
                    .transpose()
                    .map_err(|err| format!("cannot decode: {err}"))
            }
        }
    }

    /// After a write of `object` based on `read` was refused with 409: the object as it is
    /// now. From the cache, once the watch has brought a version other than `read`'s (the
    /// cache was stale, or someone wrote since): never a write over a version not seen.
    pub(super) async fn read_again<K: Cached>(
        &self,
        object: &ObjectRef,
        read: Option<&K>,
    ) -> Result<Option<K>, String> {
        let Reads::Cached(cache) = self.reads else {
            return self.read(object).await;
        };
        let based_on = read.and_then(|o| o.meta().resource_version.clone());
        if !cache
            .newer::<K>(object, based_on.as_deref(), CONFLICT_WAIT)
            .await
        {
            return Err(format!(
                "changed since read, and the watch has not brought the new version within {}s; \
                 the next pass decides again",
                CONFLICT_WAIT.as_secs()
            ));
        }
        cache.get::<K>(object)
    }

    /// Our own successful write, into the cache (see [`Cache::written`]).
    pub(super) fn remember<K: Cached>(&self, object: &ObjectRef, read: Option<&K>, written: &K) {
        if let Reads::Cached(cache) = self.reads {
            let based_on = read.and_then(|o| o.meta().resource_version.clone());
            cache.written(object, based_on.as_deref(), written);
        }
    }

    pub(super) async fn read_secret(&self, object: &ObjectRef) -> ReadSecret {
        let secret = self.read::<Secret>(object).await?;
        let stored = stored(secret.as_ref());
        Ok((secret, stored))
    }

    pub(super) async fn read_bundle(&self, object: &ObjectRef) -> ReadBundle {
        let map = self.read::<ConfigMap>(object).await?;
        let certs = bundle_certs(object, map.as_ref());
        Ok((map, certs))
    }

    /// Someone else's certificate from the future, by our clock (and by the apiserver's too
    /// when `apiserver_now` is given): why it is left alone. Ours (see [`written_by_us`]), or
    /// one within the margin: `None`.
    pub(super) fn foreign_from_the_future(
        &self,
        object: &ObjectRef,
        secret: Option<&Secret>,
        cert: &Cert,
        apiserver_now: Option<i64>,
    ) -> Option<String> {
        if secret.is_some_and(|secret| written_by_us(secret, cert)) {
            return None;
        }
        decide::clock_check(
            [(format!("secret {object}").as_str(), cert)],
            self.rotation.backdate,
            self.now,
            apiserver_now,
        )
        .err()
    }

    /// Waits for the Events this pass sent (off the write path), so none is lost when the
    /// process ends after a `--once` pass.
    pub(super) async fn finish(&self) {
        let pending = std::mem::take(
            &mut *self
                .pending_events
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        for event in pending {
            let _ = event.await;
        }
    }
}

/// What a Secret (`None`: absent) holds.
pub(super) fn stored(secret: Option<&Secret>) -> Stored {
    match secret.map(parse_secret) {
        None => Stored::Missing,
        Some(Err(why)) => Stored::Unusable(why),
        Some(Ok(pair)) => Stored::Usable(pair),
    }
}

/// The pair in a Secret, or why it is unusable.
fn parse_secret(secret: &Secret) -> Result<KeyPairPem, String> {
    let data = secret.data.as_ref();
    let get = |key: &str| data.and_then(|d| d.get(key)).map(|b| b.0.as_slice());
    match (get("tls.crt"), get("tls.key")) {
        (Some(cert), Some(key)) if !cert.is_empty() && !key.is_empty() => {
            KeyPairPem::parse(cert, key)
        }
        _ => Err("tls.crt or tls.key is missing or empty".to_owned()),
    }
}

/// The CAs in a bundle's `ca-bundle.crt` (none when it is absent); unparsable blocks are logged
/// and left out (the next write drops them).
pub(super) fn bundle_certs(object: &ObjectRef, map: Option<&ConfigMap>) -> Vec<Cert> {
    let text = map
        .and_then(|m| m.data.as_ref())
        .and_then(|d| d.get("ca-bundle.crt"))
        .map(String::as_str)
        .unwrap_or_default();
    let (certs, problems) = pki::parse_bundle(text.as_bytes());
    for problem in problems {
        tracing::warn!(configmap = %object, %problem, "unparsable block in ca-bundle.crt; it will be dropped");
    }
    certs
}

/// Whether a regenerate wrote this Secret: its not-before annotation is the certificate's.
pub(super) fn written_by_us(secret: &Secret, cert: &Cert) -> bool {
    secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::NOT_BEFORE))
        .is_some_and(|at| *at == rfc3339(cert.not_before))
}
