//! One pass over the config: every object is read once (`phases::read`, with the clock check;
//! from the watches' cache in the controller's loop, by GET with `--once`), then each declared
//! object is brought to what it must be by its step (`phases`), the steps running concurrently
//! as the config's graph allows (`graph`): a step starts once the steps it waits for are done,
//! the needed chains first, and new keys are made ahead on every CPU (`keys`). Every write goes
//! through the one write (`write`), which carries the resourceVersion it was decided on and,
//! on a conflict, reads again and decides again. All replicas compute the same decisions from
//! the same data, so after one of them writes, the others find nothing to do: no double
//! regeneration, no ping-pong.

use std::sync::{Mutex, OnceLock};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared, join_all};

use super::config::ObjectRef;
use super::ctx::{Ctx, Outcome, ReadBundle, ReadSecret};
pub use super::ctx::{Pass, Reads};
use super::decide::Stored;
use super::graph::{self, Step};
use super::keys::KeyUse;
use super::phases::read::Read;
use super::phases::{bundles, copies, intermediates, read, signers, targets, unions};
pub use super::report::Report;
use super::trust::{BundleState, NotWritten};
use crate::pki::{Cert, KeyPairPem};

impl Pass<'_> {
    /// Runs the pass. Failures are collected per item; one broken item never stops the others.
    pub async fn run(&self) -> Report {
        let ctx = Ctx::new(self);
        let mut report = Report::default();
        match read::run(&ctx).await {
            Err(clock) => report.failures.push(clock),
            Ok(read) => {
                // Our own intermediate CA in the future refuses its steps, the unions and the
                // copies.
                let later_steps = match &read.intermediates_clock {
                    Err(clock) => {
                        report.failures.push(clock.clone());
                        false
                    }
                    Ok(()) => true,
                };
                keys_ahead(&ctx, &read);
                run_steps(&ctx, read, later_steps, &mut report).await;
            }
        }
        ctx.finish().await;
        report.next_deadline = report
            .deadlines
            .iter()
            .copied()
            .filter(|at| *at > self.now)
            .min();
        report
    }
}

/// What each step reads (taken once by its step) and what each left (set once).
struct Slots {
    signers: Vec<Mutex<Option<ReadSecret>>>,
    targets: Vec<Mutex<Option<ReadSecret>>>,
    bundles: Vec<Mutex<Option<ReadBundle>>>,
    intermediates: Vec<Mutex<Option<ReadSecret>>>,
    in_use: Vec<(usize, Cert)>,
    /// Each step's outcome and report, by its rank in the graph's order.
    outcomes: Vec<OnceLock<Outcome>>,
    reports: Vec<Mutex<Report>>,
}

fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).take()
}

fn slots<T>(reads: Vec<T>) -> Vec<Mutex<Option<T>>> {
    reads.into_iter().map(|r| Mutex::new(Some(r))).collect()
}

impl Slots {
    fn new(read: Read, steps: usize) -> Slots {
        Slots {
            signers: slots(read.signers),
            targets: slots(read.targets),
            bundles: slots(read.bundles),
            intermediates: slots(read.intermediates),
            in_use: read.in_use,
            outcomes: (0..steps).map(|_| OnceLock::new()).collect(),
            reports: (0..steps).map(|_| Mutex::new(Report::default())).collect(),
        }
    }

    /// The outcome of `step`, which the caller waited for.
    fn outcome(&self, ctx: &Ctx<'_>, step: Step) -> Option<&Outcome> {
        self.outcomes[ctx.graph.rank(step)].get()
    }

    /// A signer's or intermediate's pair after its step (`None`: unavailable).
    fn pair(&self, ctx: &Ctx<'_>, step: Step) -> (Option<&KeyPairPem>, bool) {
        match self.outcome(ctx, step) {
            Some(Outcome::Pair { pair, triggered }) => (pair.as_ref(), *triggered),
            _ => (None, false),
        }
    }

    /// The bundles among `steps`, after their steps.
    fn bundles(&self, ctx: &Ctx<'_>, steps: &[Step]) -> Vec<&BundleState> {
        steps
            .iter()
            .filter_map(|step| match self.outcome(ctx, *step) {
                Some(Outcome::Bundle(state)) => Some(state),
                _ => None,
            })
            .collect()
    }
}

/// Runs every step of the graph: each once the steps it waits for are done, all concurrently
/// otherwise; their reports added up in the graph's order.
async fn run_steps(ctx: &Ctx<'_>, read: Read, later_steps: bool, report: &mut Report) {
    let order = ctx.graph.order();
    let slots = Slots::new(read, order.len());
    let slots = &slots;
    let mut done: Vec<Shared<BoxFuture<'_, ()>>> = Vec::with_capacity(order.len());
    for (rank, step) in order.iter().copied().enumerate() {
        let waits: Vec<_> = ctx
            .graph
            .deps(step)
            .iter()
            .map(|dep| done[ctx.graph.rank(*dep)].clone())
            .collect();
        let run = async move {
            join_all(waits).await;
            let mut own = Report::default();
            let outcome = if later_steps
                || matches!(step, Step::Signer(_) | Step::Bundle(_) | Step::Target(_))
            {
                run_step(ctx, step, slots, &mut own).await
            } else {
                skipped(ctx, step).await
            };
            let _ = slots.outcomes[rank].set(outcome);
            *slots.reports[rank]
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = own;
        };
        done.push(run.boxed().shared());
    }
    join_all(done).await;
    for step_report in &slots.reports {
        report.add(std::mem::take(
            &mut *step_report.lock().unwrap_or_else(|p| p.into_inner()),
        ));
    }
}

/// One step, on the outcomes of the steps it waited for.
async fn run_step(ctx: &Ctx<'_>, step: Step, slots: &Slots, report: &mut Report) -> Outcome {
    let rotation = ctx.rotation;
    let graph = &ctx.graph;
    match step {
        Step::Signer(i) => {
            let read = take(&slots.signers[i]).expect("each step runs once");
            signers::step(ctx, &rotation.signers[i], read, report).await
        }
        Step::Bundle(j) => {
            let config = &rotation.bundles[j];
            let read = take(&slots.bundles[j]).expect("each step runs once");
            let pairs: Vec<Option<&KeyPairPem>> = config
                .signers
                .iter()
                .map(|s| slots.pair(ctx, Step::Signer(*s)).0)
                .collect();
            Outcome::Bundle(bundles::step(ctx, config, read, &pairs, &slots.in_use, report).await)
        }
        Step::Target(k) => {
            let config = &rotation.targets[k];
            let read = take(&slots.targets[k]).expect("each step runs once");
            let (signer, triggered) = slots.pair(ctx, Step::Signer(config.signer));
            let issuer = targets::Issuer {
                signer,
                triggered,
                roots: slots.bundles(ctx, &graph::listing(rotation, config.signer)),
                trusted_by: slots.bundles(ctx, graph.trust(step)),
            };
            targets::step(ctx, config, read, issuer, report).await;
            Outcome::Done
        }
        Step::Intermediate(i) => {
            let config = &rotation.intermediates[i];
            let read = take(&slots.intermediates[i]).expect("each step runs once");
            let (signer, triggered) = slots.pair(ctx, Step::Signer(config.signer));
            let issuer = intermediates::Issuer {
                signer,
                triggered,
                roots: slots.bundles(ctx, graph.trust(step)),
            };
            let pair = intermediates::step(ctx, config, read, issuer, report).await;
            Outcome::Pair {
                pair,
                triggered: false,
            }
        }
        Step::Collected(i) => {
            let config = &rotation.intermediates[i];
            let object = config
                .bundle
                .as_ref()
                .expect("a collected step has a bundle");
            let (pair, _) = slots.pair(ctx, Step::Intermediate(i));
            Outcome::Bundle(intermediates::collect(ctx, config, object, pair, report).await)
        }
        Step::Union(u) => {
            let ours = slots.bundles(ctx, graph.deps(step));
            Outcome::Bundle(unions::step(ctx, &rotation.unions[u], &ours, report).await)
        }
        Step::Publish(i) => {
            let (pair, _) = slots.pair(ctx, Step::Intermediate(i));
            let trusted_by = slots.bundles(ctx, graph.trust(step));
            intermediates::publish(ctx, &rotation.intermediates[i], pair, &trusted_by, report)
                .await;
            Outcome::Done
        }
        Step::Copy(c) => copies::step(ctx, &rotation.copies[c], report).await,
    }
}

/// A step the clock check refused: nothing written; a bundle as it is.
async fn skipped(ctx: &Ctx<'_>, step: Step) -> Outcome {
    let rotation = ctx.rotation;
    let object = match step {
        Step::Collected(i) => rotation.intermediates[i].bundle.as_ref(),
        Step::Union(u) => Some(&rotation.unions[u].object),
        Step::Copy(c) if rotation.copies[c].kind == crate::base::kind::Kind::ConfigMap => {
            Some(&rotation.copies[c].to)
        }
        Step::Intermediate(_) => {
            return Outcome::Pair {
                pair: None,
                triggered: false,
            };
        }
        _ => None,
    };
    match object {
        Some(object) => Outcome::Bundle(
            bundles::as_read(
                ctx,
                object,
                NotWritten::Failed("skipped: the clock check refused this step".to_owned()),
            )
            .await,
        ),
        None => Outcome::Done,
    }
}

/// Asks for the keys this pass will most likely need, before any step runs: a signer,
/// target or intermediate CA whose decision on the state as read says so, or whose signer's
/// does. Only the keys: each write still decides on what it reads (a key not taken is
/// dropped; one not asked for is made when needed). Asked for in the graph's order, so the
/// first threads start on the most needed keys.
fn keys_ahead(ctx: &Ctx<'_>, read: &Read) {
    let rotation = ctx.rotation;
    let wanted = std::cell::RefCell::new(Vec::new());
    let want = |step: Step, object: &ObjectRef, key: KeyUse| {
        wanted.borrow_mut().push((step, object.clone(), key));
    };
    let braked = |kind: &str, step: Step, object: &ObjectRef| braked(ctx, kind, step, object);
    let mut renewed = vec![false; rotation.signers.len()];
    for (i, (config, read)) in rotation.signers.iter().zip(&read.signers).enumerate() {
        if read.is_ok() && signers::reason(ctx, config, found(read)).is_some() {
            renewed[i] = true;
            if !braked("signer", Step::Signer(i), &config.object) {
                want(Step::Signer(i), &config.object, KeyUse::Ca);
            }
        }
    }
    let roots = |signer: usize| -> Vec<Cert> {
        rotation
            .bundles
            .iter()
            .zip(&read.bundles)
            .filter(|(b, _)| b.signers.contains(&signer))
            .filter_map(|(_, r)| r.as_ref().ok())
            .flat_map(|(_, certs)| certs.iter().cloned())
            .collect()
    };
    // A target or an intermediate CA: ahead when its signer is renewed, or when its own
    // decision on the state as read (`reason`: on what it holds, its roots, its signer) says so.
    type Reason<'r> = &'r dyn Fn(&Stored, &[Cert], &Cert) -> bool;
    let issued = |step: Step,
                  object: &ObjectRef,
                  signer: usize,
                  own: &ReadSecret,
                  key: KeyUse,
                  reason: Reason<'_>| {
        if own.is_err() || read.signers[signer].is_err() || braked("target", step, object) {
            return;
        }
        let needs = match usable(&read.signers[signer]) {
            Some(pair) if !renewed[signer] => reason(found(own), &roots(signer), pair.cert()),
            _ => true,
        };
        if needs {
            want(step, object, key);
        }
    };
    for (k, (config, own)) in rotation.targets.iter().zip(&read.targets).enumerate() {
        let reason = |found: &Stored, roots: &[Cert], signer: &Cert| {
            targets::reason(ctx, config, found, roots, signer, false).is_some()
        };
        issued(
            Step::Target(k),
            &config.object,
            config.signer,
            own,
            KeyUse::Leaf,
            &reason,
        );
    }
    let intermediates = rotation.intermediates.iter().zip(&read.intermediates);
    for (i, (config, own)) in intermediates.enumerate() {
        let reason = |found: &Stored, roots: &[Cert], signer: &Cert| {
            intermediates::reason(ctx, config, found, roots, signer, false).is_some()
        };
        issued(
            Step::Intermediate(i),
            &config.object,
            config.signer,
            own,
            KeyUse::Ca,
            &reason,
        );
    }
    let mut wanted = wanted.into_inner();
    wanted.sort_by_key(|(step, _, _)| ctx.graph.rank(*step));
    for (step, object, key) in wanted {
        ctx.key_ahead(step, &object, key);
    }
}

/// A pair read as usable.
fn usable(read: &ReadSecret) -> Option<&KeyPairPem> {
    match read {
        Ok((_, Stored::Usable(pair))) => Some(pair),
        _ => None,
    }
}

/// What a Secret was read to hold (a failed read: as missing, for the keys ahead only).
fn found(read: &ReadSecret) -> &Stored {
    match read {
        Ok((_, stored)) => stored,
        Err(_) => &Stored::Missing,
    }
}

/// Nothing ahead for a write the brake holds, or one whose bundles it holds: a fight would
/// otherwise cost a key every pass.
fn braked(ctx: &Ctx<'_>, kind: &str, step: Step, object: &ObjectRef) -> bool {
    ctx.brake.is_some_and(|brake| {
        brake.is_holding(kind, object)
            || ctx
                .graph
                .trust(step)
                .iter()
                .filter_map(|s| ctx.graph.object(*s))
                .any(|bundle| brake.is_holding("bundle", bundle))
    })
}
