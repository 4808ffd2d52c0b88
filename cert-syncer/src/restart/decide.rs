//! The rule of `restart-on-change`, pure: what to do about one container, given what its pairs
//! hold now, what was decided before, its process, and the brake.
//!
//! A server reads its pairs when it starts. So a pair written after the running process
//! started is one it has not read (whatever the sidecar saw before: this holds across the
//! sidecar's own restarts), and one written before is one it has. A restart happens only when
//! the bytes are not those the running process is known to hold nor those of the last
//! decision, were written after it started, every pair is fit (parses, the key fits, valid
//! now) and the brake allows it.
//!
//! A server that also re-reads its pairs on a timer (`--reload-period`: client-go's 5 minutes
//! for kube-controller-manager and kube-scheduler) takes new bytes itself within that period.
//! It is restarted only when what it runs with is unusable before then (expired or unfit, as
//! after a sleep, or unknown to this sidecar); a healthy one is left to its re-read, because a
//! restart costs a leader-elected server its Lease (the next process waits for it to expire).

use std::time::{Duration, SystemTime};

use super::pair::{Digest, Seen};
use super::process::{Lookup, Process};

/// How long an unfit content is given to settle before it is held: a writer that is not
/// atomic (`cp` of the certificate, then of the key), or a read that straddled two writes,
/// shows a torn pair for a moment.
pub const SETTLE: Duration = Duration::from_secs(2);

/// How long no process, never seen since this sidecar started, may be found for a change
/// before the restart is held for it: a container in the kubelet's crash-loop back-off (at most
/// 5 minutes between two lives; a server whose pair was missing exits at once) reads the new pair
/// when it starts and needs no restart, so only a process this sidecar cannot see (no shared
/// PID namespace, another executable) outlasts it.
pub const NO_PROCESS_GRACE: Duration = Duration::from_secs(300);

/// Added to `--reload-period`: a server's re-read is due within the period, plus this.
pub const RELOAD_MARGIN: Duration = Duration::from_secs(60);

/// A server reads its files during its start-up, some time after the exec (Go's runtime, flag
/// parsing, config loading): bytes written within this of its start count as read by it. Found
/// on the node: kube-scheduler in crash-loop back-off for a missing pair, started again just
/// before `sync` wrote it, read it and ran; restarting it cost the Lease it had just taken. A
/// recovery's new pair comes tens of seconds after the servers start.
const START_READ_WINDOW: Duration = Duration::from_secs(2);

/// What is known about one container at the moment of deciding.
#[derive(Debug)]
pub struct Facts<'a> {
    pub seen: &'a Seen,
    /// For how long the pairs have held these bytes (as far as this sidecar saw).
    pub unchanged_for: Duration,
    /// The bytes the found process is known to have read (seen written before it started).
    pub process_has: Option<&'a Digest>,
    /// The bytes of the last decision (restarted for, held as unfit, or read by the process).
    pub decided: Option<&'a Digest>,
    /// The bytes when this sidecar started.
    pub baseline: &'a Digest,
    pub process: &'a Lookup,
    /// Whether a single process of the container has been found since this sidecar started
    /// (its PID namespace is shared and the executable right).
    pub process_seen_before: bool,
    /// `Some(wait)` when the brake withholds a restart now.
    pub brake: Option<Duration>,
    /// Until when what the found process is known to hold stays usable (`None`: unknown, or
    /// unusable now).
    pub held_usable_until: Option<SystemTime>,
    /// The server's own re-read period and the time now, when it re-reads (`--reload-period`).
    pub reload: Option<(Duration, SystemTime)>,
}

/// Why a restart is withheld (the `reason` label of
/// `cert_syncer_container_restarts_held_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HeldReason {
    InvalidPair,
    Brake,
    NoProcess,
}

impl HeldReason {
    pub const ALL: [HeldReason; 3] = [
        HeldReason::InvalidPair,
        HeldReason::Brake,
        HeldReason::NoProcess,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            HeldReason::InvalidPair => "invalid_pair",
            HeldReason::Brake => "brake",
            HeldReason::NoProcess => "no_process",
        }
    }

    /// The Event reason.
    pub fn event_reason(self) -> &'static str {
        match self {
            HeldReason::InvalidPair => "RestartHeldInvalidPair",
            HeldReason::Brake => "RestartHeldBrake",
            HeldReason::NoProcess => "RestartHeldNoProcess",
        }
    }
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing, now or later, for these bytes.
    Nothing,
    /// The running process started after these bytes were written: it has them.
    AlreadyRead,
    /// Look again after this long (a torn pair settling, a container between lives).
    Wait(Duration),
    /// Left to the server's own re-read, due within this long (what it holds stays usable
    /// until after that); looked at again then.
    LeftToServer(Duration),
    /// SIGTERM to this process: the kubelet starts the container again, which reads the pairs.
    Restart(Process),
    /// The restart is withheld; `detail` says why (for the Event and the log).
    Hold { reason: HeldReason, detail: String },
}

/// The rule (see the module docs).
pub fn decide(facts: &Facts<'_>) -> Decision {
    let seen = facts.seen;
    if facts.process_has == Some(&seen.digest) {
        return Decision::Nothing;
    }
    // What the running process holds is learnt once per process, decided bytes or not (a
    // process the kubelet started after the last restart holds what that restart was for).
    if let Lookup::Found(process) = facts.process
        && read_by(seen.written, process.started)
    {
        return Decision::AlreadyRead;
    }
    // A server that re-reads its pairs has read bytes written a re-read period ago.
    let reread_by = reread_deadline(seen.written, facts.reload);
    if let (Lookup::Found(_), Some(due), Some((_, now))) = (facts.process, reread_by, facts.reload)
        && now >= due
    {
        return Decision::AlreadyRead;
    }
    if facts.decided == Some(&seen.digest) {
        return Decision::Nothing;
    }
    // What it holds stays usable past its re-read: no restart needed.
    let left_to_server = match (reread_by, facts.held_usable_until, facts.reload) {
        (Some(due), Some(usable), Some((_, now))) if usable > due => {
            Some(due.duration_since(now).unwrap_or_default())
        }
        _ => None,
    };
    match facts.process {
        Lookup::Found(process) => match (&seen.verdict, left_to_server, facts.brake) {
            (Err(why), _, _) => unfit(why, facts.unchanged_for),
            (Ok(_), Some(due), _) => Decision::LeftToServer(due),
            (Ok(_), None, Some(wait)) => Decision::Hold {
                reason: HeldReason::Brake,
                detail: format!(
                    "the brake holds it: the last restarts used the budget of its window; the \
                     next is possible in {}s",
                    wait.as_secs().max(1)
                ),
            },
            (Ok(_), None, None) => Decision::Restart(process.clone()),
        },
        // Nothing changed since this sidecar started and nothing runs, or the container is
        // between two lives (its process was seen before): whatever starts next reads these
        // bytes.
        Lookup::Missing | Lookup::Several(_) if &seen.digest == facts.baseline => Decision::Nothing,
        Lookup::Missing if facts.process_seen_before => Decision::Nothing,
        Lookup::Missing | Lookup::Several(_) => match &seen.verdict {
            Err(why) => unfit(why, facts.unchanged_for),
            Ok(_) if facts.unchanged_for < NO_PROCESS_GRACE => {
                Decision::Wait(NO_PROCESS_GRACE - facts.unchanged_for)
            }
            Ok(_) => Decision::Hold {
                reason: HeldReason::NoProcess,
                detail: match facts.process {
                    Lookup::Several(pids) => format!(
                        "{} processes run its executable (pids {pids:?}): which one is the \
                         container's cannot be told",
                        pids.len()
                    ),
                    _ => "no process runs its executable here (is shareProcessNamespace: true \
                          set on the pod, and --container's executable the container's \
                          command?)"
                        .to_owned(),
                },
            },
        },
    }
}

/// When a server that re-reads every `reload.0` has read what was written at `written`.
fn reread_deadline(
    written: Option<SystemTime>,
    reload: Option<(Duration, SystemTime)>,
) -> Option<SystemTime> {
    let (period, _) = reload?;
    Some(written? + period + RELOAD_MARGIN)
}

/// Whether a process that started at `started` read what was written at `written`.
fn read_by(written: Option<SystemTime>, started: SystemTime) -> bool {
    written.is_some_and(|written| written <= started + START_READ_WINDOW)
}

fn unfit(why: &str, unchanged_for: Duration) -> Decision {
    if unchanged_for < SETTLE {
        return Decision::Wait(SETTLE - unchanged_for);
    }
    Decision::Hold {
        reason: HeldReason::InvalidPair,
        detail: format!("the new pair is not one to restart into: {why}"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::pair::Leaf;
    use super::super::process::Lookup;
    use super::*;

    const T0: Duration = Duration::from_secs(1_800_000_000);

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + T0 + Duration::from_secs(seconds)
    }

    fn seen(byte: u8, written: u64, fit: bool) -> Seen {
        Seen {
            digest: [byte; 32],
            written: Some(at(written)),
            verdict: if fit {
                Ok(vec![Leaf {
                    serial: "01".into(),
                    not_after: 2_000_000_000,
                }])
            } else {
                Err("tls.key does not fit".into())
            },
        }
    }

    static RUNNING_50: std::sync::LazyLock<Lookup> = std::sync::LazyLock::new(|| running(50));

    /// The baseline of the facts below: bytes other than these.
    const OTHER: Digest = [0; 32];

    fn running(started: u64) -> Lookup {
        Lookup::Found(Process::for_test(7, at(started)))
    }

    /// `seen` settled for a minute, nothing decided or known of `process` (seen before), no
    /// brake, a server that reads only at start.
    fn facts<'a>(seen: &'a Seen, process: &'a Lookup) -> Facts<'a> {
        Facts {
            seen,
            unchanged_for: Duration::from_secs(60),
            process_has: None,
            decided: None,
            baseline: &OTHER,
            process,
            process_seen_before: true,
            held_usable_until: None,
            reload: None,
            brake: None,
        }
    }

    fn decide_with(seen: &Seen, process: &Lookup, decided: Option<&Digest>) -> Decision {
        decide(&Facts {
            decided,
            ..facts(seen, process)
        })
    }

    #[test]
    fn a_fit_pair_written_after_the_process_started_restarts_it_once() {
        let new = seen(1, 100, true);
        assert_eq!(
            decide_with(&new, &running(50), None),
            Decision::Restart(Process::for_test(7, at(50)))
        );
        // Decided: the same bytes again restart nothing (the process shutting down)...
        assert_eq!(
            decide_with(&new, &running(50), Some(&new.digest)),
            Decision::Nothing
        );
        // ... and the process the kubelet starts next is learnt to hold them.
        assert_eq!(
            decide_with(&new, &running(120), Some(&new.digest)),
            Decision::AlreadyRead
        );
    }

    #[test]
    fn bytes_the_process_holds_restart_nothing_even_after_other_bytes_were_decided() {
        // It read A at its start; B (unfit) was held; A written back: nothing to do.
        let a = seen(1, 100, true);
        let held_b = [2; 32];
        let decision = decide(&Facts {
            process_has: Some(&a.digest),
            decided: Some(&held_b),
            ..facts(&a, &running(50))
        });
        assert_eq!(decision, Decision::Nothing);
    }

    #[test]
    fn a_pair_written_before_the_process_started_was_read_by_it() {
        // The process restarted by the kubelet after the write, or the sidecar started late.
        let new = seen(1, 100, true);
        assert_eq!(
            decide_with(&new, &running(101), None),
            Decision::AlreadyRead
        );
        // Within its start-up: read too.
        let mut within = new.clone();
        within.written = Some(at(100) + Duration::from_millis(1500));
        assert_eq!(
            decide_with(&within, &running(100), None),
            Decision::AlreadyRead
        );
        // Even unfit: it runs with it already, nothing to hold.
        let bad = seen(2, 100, false);
        assert_eq!(
            decide_with(&bad, &running(100), None),
            Decision::AlreadyRead
        );
    }

    #[test]
    fn an_unfit_pair_is_held_once_it_has_settled() {
        let bad = seen(2, 100, false);
        let mut facts = Facts {
            unchanged_for: Duration::from_millis(500),
            ..facts(&bad, &RUNNING_50)
        };
        assert_eq!(
            decide(&facts),
            Decision::Wait(SETTLE - Duration::from_millis(500))
        );
        facts.unchanged_for = SETTLE;
        assert!(matches!(
            decide(&facts),
            Decision::Hold { reason: HeldReason::InvalidPair, detail } if detail.contains("does not fit")
        ));
    }

    #[test]
    fn the_brake_holds_a_restart_it_has_no_budget_for() {
        let new = seen(1, 100, true);
        let decision = decide(&Facts {
            unchanged_for: Duration::ZERO,
            brake: Some(Duration::from_secs(90)),
            ..facts(&new, &running(50))
        });
        assert!(matches!(
            decision,
            Decision::Hold { reason: HeldReason::Brake, detail } if detail.contains("90s")
        ));
    }

    #[test]
    fn a_server_that_rereads_is_left_to_it_unless_what_it_holds_expires_first() {
        let period = Duration::from_secs(300);
        let new = seen(1, 100, true);
        let facts = |held_until: Option<SystemTime>, now: u64| Facts {
            held_usable_until: held_until,
            reload: Some((period, at(now))),
            ..facts(&new, &RUNNING_50)
        };
        let due = period + RELOAD_MARGIN;
        // What it holds stays valid past its re-read: left to it, looked at again when due...
        assert_eq!(
            decide(&facts(Some(at(100_000)), 110)),
            Decision::LeftToServer(due - Duration::from_secs(10))
        );
        // ... when it has read them itself.
        assert_eq!(
            decide(&facts(Some(at(100_000)), 100 + due.as_secs())),
            Decision::AlreadyRead
        );
        // Expired before its re-read (the sleep), or unknown, or unusable: restarted now.
        for held in [Some(at(200)), None] {
            assert_eq!(
                decide(&facts(held, 110)),
                Decision::Restart(Process::for_test(7, at(50)))
            );
        }
    }

    #[test]
    fn a_container_between_two_lives_needs_no_restart() {
        // Its process was seen before: the kubelet starts it again, and it reads the new pair.
        let new = seen(1, 100, true);
        let decision = decide(&Facts {
            unchanged_for: NO_PROCESS_GRACE * 2,
            ..facts(&new, &Lookup::Missing)
        });
        assert_eq!(decision, Decision::Nothing);
    }

    #[test]
    fn without_one_process_ever_seen_a_change_waits_then_is_held() {
        let new = seen(1, 100, true);
        for process in [Lookup::Missing, Lookup::Several(vec![7, 8])] {
            // Unchanged since the sidecar started: nothing to do, whatever starts reads it.
            let mut facts = Facts {
                unchanged_for: Duration::from_secs(5),
                baseline: &new.digest,
                process_seen_before: false,
                ..facts(&new, &process)
            };
            assert_eq!(decide(&facts), Decision::Nothing);
            let baseline = [9; 32];
            facts.baseline = &baseline;
            assert_eq!(
                decide(&facts),
                Decision::Wait(NO_PROCESS_GRACE - Duration::from_secs(5))
            );
            facts.unchanged_for = NO_PROCESS_GRACE;
            assert!(matches!(
                decide(&facts),
                Decision::Hold {
                    reason: HeldReason::NoProcess,
                    ..
                }
            ));
        }
    }

    #[test]
    fn an_unreadable_pair_is_never_read_by_the_process() {
        let mut gone = seen(3, 100, false);
        gone.written = None;
        assert!(matches!(
            decide_with(&gone, &running(1_000), None),
            Decision::Hold {
                reason: HeldReason::InvalidPair,
                ..
            }
        ));
    }
}
