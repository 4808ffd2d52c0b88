//! Leader election with a coordination.k8s.io/v1 Lease, as client-go's `leaderelection` does
//! it: the holder renews the Lease every retry period; a candidate takes it over once the
//! record has not changed for the lease duration **as measured by the candidate's own monotonic
//! clock** (never by comparing the holder's timestamps with the local wall clock, so clock skew
//! between nodes cannot make two leaders). Every write carries the resourceVersion it read.
//! While holding the Lease, a renewal updates the record it wrote last without reading it first
//! (client-go's fast path since 1.27): one request per retry period instead of two; anyone
//! else's change makes that update fail with 409, and the renewal then reads the Lease.
//!
//! Optional for `regenerate`: optimistic concurrency already makes replicas safe; a leader keeps
//! the recovery logs in one pod, as OpenShift does.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::base::error::is_conflict;

/// Timing, defaults as OpenShift's cert-regeneration-controller (137 s / 107 s / 26 s).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// One candidate.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timing: Timing,
    /// The last record seen (resourceVersion) and when we first saw it.
    observed: Option<(String, Instant)>,
    /// The Lease as our last successful write left it, while we hold it (the fast renewal).
    written: Option<Lease>,
    /// While waiting: blocked (`lease`) only while the Lease cannot be read or written, so a
    /// standby that can take over is Ready.
    readiness: Option<crate::base::readiness::Readiness>,
}

impl Elector {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: String,
        timing: Timing,
    ) -> Elector {
        Elector {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity,
            timing,
            observed: None,
            written: None,
            readiness: None,
        }
    }

    /// Reports the candidate's state to `readiness` while it waits (see the field).
    pub fn with_readiness(mut self, readiness: crate::base::readiness::Readiness) -> Elector {
        self.readiness = Some(readiness);
        self
    }

    /// Waits until this candidate holds the Lease. `false` when `shutdown` came first.
    pub async fn acquire(&mut self, shutdown: &CancellationToken) -> bool {
        let mut logged_holder = String::new();
        loop {
            let attempt = self.try_acquire_or_renew().await;
            if let Some(readiness) = &self.readiness {
                match &attempt {
                    Ok(_) => readiness.clear("lease"),
                    Err(err) => {
                        readiness.block("lease", format!("cannot read or write the lease: {err}"))
                    }
                }
            }
            match attempt {
                Ok(Attempt::Held) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "became leader");
                    return true;
                }
                Ok(Attempt::HeldBy(holder)) => {
                    if holder != logged_holder {
                        tracing::info!(lease = %self.name, %holder, "waiting: the lease is held by another replica");
                        logged_holder = holder;
                    }
                }
                Err(err) => {
                    tracing::warn!(lease = %self.name, error = %crate::base::error::chain(&err), "cannot read or write the lease")
                }
            }
            tokio::select! {
                () = tokio::time::sleep(self.timing.retry_period) => {}
                () = shutdown.cancelled() => return false,
            }
        }
    }

    /// Renews until the Lease is lost (someone else holds it, or no renewal succeeded within
    /// the renew deadline) or `shutdown`. Returns the reason it was lost, `None` on shutdown.
    ///
    /// Each renewal attempt is bounded by what is left of the renew deadline (client-go's
    /// `renewDeadline` context): a request that hangs (an apiserver that accepted the
    /// connection and never answers) cannot keep us acting as leader after a standby took the
    /// Lease over.
    pub async fn hold(&mut self, shutdown: &CancellationToken) -> Option<String> {
        let mut last_renewal = Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.timing.retry_period) => {}
                () = shutdown.cancelled() => return None,
            }
            let deadline = last_renewal + self.timing.renew_deadline;
            let attempt = tokio::select! {
                attempt = tokio::time::timeout_at(deadline, self.try_acquire_or_renew()) => attempt,
                () = shutdown.cancelled() => return None,
            };
            match attempt {
                Ok(Ok(Attempt::Held)) => last_renewal = Instant::now(),
                Ok(Ok(Attempt::HeldBy(holder))) => {
                    return Some(format!("lease {} taken over by {holder}", self.name));
                }
                Ok(Err(err)) => {
                    tracing::warn!(lease = %self.name, error = %crate::base::error::chain(&err), "cannot renew the lease")
                }
                Err(_) => {
                    // The attempt was cut off: what it wrote, if anything, is unknown; the
                    // next acquire reads the Lease.
                    self.written = None;
                    tracing::warn!(lease = %self.name, "a lease renewal did not finish within the renew deadline");
                }
            }
            if last_renewal.elapsed() >= self.timing.renew_deadline {
                return Some(format!(
                    "lease {} not renewed within {:?}",
                    self.name, self.timing.renew_deadline
                ));
            }
        }
    }

    /// Gives the Lease up on a clean shutdown so a standby takes over at once.
    pub async fn release(&mut self) {
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() == Some(self.identity.as_str()) {
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
                if let Err(err) = self
                    .api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                {
                    tracing::warn!(lease = %self.name, error = %crate::base::error::chain(&err), "cannot release the lease");
                } else {
                    tracing::info!(lease = %self.name, "released the lease");
                }
            }
        }
    }

    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, kube::Error> {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let duration_secs = self.timing.lease_duration.as_secs().max(1) as i32;
        if let Some(mut lease) = self.written.take() {
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.lease_duration_seconds = Some(duration_secs);
            spec.renew_time = Some(now.clone());
            match self
                .api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
            {
                Ok(written) => return Ok(self.renewed(written)),
                // Changed by someone else (409) or not written: read it (below) and decide.
                Err(err) => {
                    tracing::debug!(lease = %self.name, error = %crate::base::error::chain(&err), "renewing without a read failed; reading the lease")
                }
            }
        }
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(written) => Ok(self.renewed(written)),
                Err(err) if is_conflict(&err) => Ok(Attempt::HeldBy("a concurrent creator".into())),
                Err(err) => Err(err),
            };
        };
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let observed_at = match &self.observed {
            Some((seen, at)) if *seen == version => *at,
            _ => {
                let at = Instant::now();
                self.observed = Some((version, at));
                at
            }
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let their_duration =
            Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
        let ours = holder == self.identity;
        let free = holder.is_empty() || observed_at.elapsed() > their_duration;
        if !ours && !free {
            return Ok(Attempt::HeldBy(holder));
        }
        if !ours {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.holder_identity = Some(self.identity.clone());
        spec.lease_duration_seconds = Some(duration_secs);
        spec.renew_time = Some(now);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(written) => Ok(self.renewed(written)),
            Err(err) if is_conflict(&err) => Ok(Attempt::HeldBy("a concurrent writer".into())),
            Err(err) => Err(err),
        }
    }

    /// Our write of the Lease succeeded: we hold it, and renew from this record next time.
    fn renewed(&mut self, written: Lease) -> Attempt {
        self.observed = written
            .metadata
            .resource_version
            .clone()
            .map(|v| (v, Instant::now()));
        self.written = Some(written);
        Attempt::Held
    }
}

enum Attempt {
    Held,
    HeldBy(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::fake_api::FakeApi;

    const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/lock";
    const TIMING: Timing = Timing {
        lease_duration: Duration::from_secs(10),
        renew_deadline: Duration::from_secs(8),
        retry_period: Duration::from_secs(2),
    };

    fn elector(api: &FakeApi, identity: &str) -> Elector {
        Elector::new(api.client(), "ns", "lock", identity.to_owned(), TIMING)
    }

    fn spec(api: &FakeApi, field: &str) -> serde_json::Value {
        api.get(LEASE).expect("the lease exists")["spec"][field].clone()
    }

    fn renewals(api: &FakeApi) -> usize {
        api.requests()
            .iter()
            .filter(|r| *r == &format!("PUT {LEASE}"))
            .count()
    }

    #[tokio::test(start_paused = true)]
    async fn a_candidate_acquires_a_free_lease_renews_it_every_retry_period_and_releases_it() {
        let api = FakeApi::new();
        let shutdown = CancellationToken::new();
        let mut a = elector(&api, "a");
        let start = Instant::now();
        assert!(a.acquire(&shutdown).await);
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "a free lease is taken at once"
        );
        assert_eq!(spec(&api, "holderIdentity"), "a");
        assert_eq!(spec(&api, "leaseDurationSeconds"), 10);

        let holding = {
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let lost = a.hold(&shutdown).await;
                (a, lost)
            })
        };
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert_eq!(renewals(&api), 3, "renewed at 2 s, 4 s and 6 s");
        assert_eq!(
            api.requests()
                .iter()
                .filter(|r| *r == &format!("GET {LEASE}"))
                .count(),
            1,
            "read once to acquire; renewals update the record written last, without a read"
        );
        shutdown.cancel();
        let (mut a, lost) = holding.await.unwrap();
        assert_eq!(lost, None, "a shutdown is not a loss");
        a.release().await;
        assert_eq!(spec(&api, "holderIdentity"), serde_json::Value::Null);
        assert_eq!(spec(&api, "leaseDurationSeconds"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_leader_gives_up_once_it_could_not_renew_within_the_renew_deadline() {
        let api = FakeApi::new();
        let shutdown = CancellationToken::new();
        let mut a = elector(&api, "a");
        assert!(a.acquire(&shutdown).await);
        api.set_failing(true);
        let start = Instant::now();
        let lost = a.hold(&shutdown).await.expect("lost");
        assert!(lost.contains("not renewed within"), "{lost}");
        // Attempts at 2, 4, 6 and 8 s: the one at the 8 s deadline has no time left; gives up.
        assert_eq!(start.elapsed(), Duration::from_secs(8));
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_that_hangs_is_cut_off_at_the_renew_deadline() {
        let api = FakeApi::new();
        let shutdown = CancellationToken::new();
        let mut a = elector(&api, "a");
        assert!(a.acquire(&shutdown).await);
        // The apiserver accepts the renewal and never answers it.
        api.hang(&format!("PUT {LEASE}"));
        let start = Instant::now();
        let lost = tokio::time::timeout(Duration::from_secs(60), a.hold(&shutdown))
            .await
            .expect("a hanging renewal must not keep the leader leading")
            .expect("lost");
        assert!(lost.contains("not renewed within"), "{lost}");
        // The renewal sent at 2 s is bounded by what is left of the 8 s renew deadline: the
        // leader steps down at 8 s, before a standby may take over (10 s).
        assert_eq!(start.elapsed(), TIMING.renew_deadline);
        assert!(start.elapsed() < TIMING.lease_duration);
        assert_eq!(renewals(&api), 1, "one renewal, which hung");
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_hears_of_a_new_holder_steps_down() {
        let api = FakeApi::new();
        let shutdown = CancellationToken::new();
        let mut a = elector(&api, "a");
        assert!(a.acquire(&shutdown).await);
        let mut lease = api.get(LEASE).unwrap();
        lease["spec"]["holderIdentity"] = "b".into();
        api.put(LEASE, lease);
        let lost = a.hold(&shutdown).await.expect("lost");
        assert!(lost.contains("taken over by b"), "{lost}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_takes_over_only_after_the_lease_duration_without_renewal() {
        let api = FakeApi::new();
        let shutdown = CancellationToken::new();
        let mut a = elector(&api, "a");
        assert!(a.acquire(&shutdown).await);

        // While a renews, b waits, however long.
        let holding = {
            let shutdown = shutdown.clone();
            tokio::spawn(async move { a.hold(&shutdown).await })
        };
        let mut b = elector(&api, "b");
        let waited = tokio::time::timeout(Duration::from_secs(60), b.acquire(&shutdown)).await;
        assert!(waited.is_err(), "b must not take a renewed lease");
        assert_eq!(spec(&api, "holderIdentity"), "a");

        // a dies without releasing. A fresh standby c takes over once the record has not
        // changed for the lease duration by its own clock: first seen now, free after more
        // than 10 s, so at its attempt at 12 s (never by comparing a's timestamps with its
        // wall clock).
        holding.abort();
        let _ = holding.await;
        let mut c = elector(&api, "c");
        let start = Instant::now();
        assert!(c.acquire(&shutdown).await);
        assert_eq!(start.elapsed(), Duration::from_secs(12));
        assert_eq!(spec(&api, "holderIdentity"), "c");
        assert_eq!(spec(&api, "leaseTransitions"), 1);
        // b, which has watched the unchanged record of a all along, lost the race to c's
        // write and sees c as the holder now.
        let again = tokio::time::timeout(Duration::from_secs(5), b.acquire(&shutdown)).await;
        assert!(again.is_err());
    }
}
