//! Which control link may speak for which session.
//!
//! Every attested shard can write frames on its control link to the entry,
//! but a shard may only speak for the sessions routed through it: a verdict
//! comes only from the last-stage replica the session is routed through, an
//! error only from a replica on its route. A frame for a session the link
//! does not carry (or never carried) is a protocol violation: the entry drops
//! that link, and no other session is touched. Session ids are random, so a
//! shard cannot guess the ids of sessions it does not carry.
//!
//! Synchronous and pure: the entry's control loops consult it under a lock.

use crate::link::frame::SessionId;
use std::collections::{HashMap, VecDeque};

/// How many ended sessions are remembered (late frames from replicas that
/// carried them are ignored rather than treated as violations).
pub const ENDED_REMEMBERED: usize = 4096;

/// What arrived on a control link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Said {
    /// A verdict (only the last stage sends them).
    Verdict,
    /// An error report for a session.
    Error,
}

/// What to do with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Hand it to the session.
    Deliver,
    /// Stale: the link carried this session on an earlier route, or the
    /// session ended; drop the frame, keep the link.
    Ignore,
    /// The link spoke for a session it does not carry: drop the link.
    Violation(&'static str),
}

#[derive(Debug)]
struct Slot<T> {
    sink: T,
    /// Replica per stage after the entry.
    route: Vec<u8>,
    /// Every (stage, replica) the session was ever routed through.
    carried: Vec<(usize, u8)>,
}

/// Live sessions with their routes, and recently ended ones.
#[derive(Debug)]
pub struct SessionTable<T> {
    live: HashMap<SessionId, Slot<T>>,
    ended: VecDeque<(SessionId, Vec<(usize, u8)>)>,
    last_stage: usize,
}

impl<T> SessionTable<T> {
    /// A table for a route whose last stage is `last_stage` (≥ 1).
    pub fn new(last_stage: usize) -> Self {
        Self { live: HashMap::new(), ended: VecDeque::new(), last_stage }
    }

    /// Registers a session under a fresh id drawn from `random` (retried on
    /// the astronomically unlikely collision or zero).
    pub fn open(&mut self, sink: T, mut random: impl FnMut() -> u64) -> SessionId {
        loop {
            let id = SessionId(random());
            if id.0 != 0 && !self.live.contains_key(&id) && !self.ended.iter().any(|(e, _)| *e == id) {
                self.live.insert(id, Slot { sink, route: Vec::new(), carried: Vec::new() });
                return id;
            }
        }
    }

    /// Sets the session's (new) route: replica per stage after the entry.
    pub fn route(&mut self, id: SessionId, route: &[u8]) {
        if let Some(slot) = self.live.get_mut(&id) {
            slot.route = route.to_vec();
            for (i, &r) in route.iter().enumerate() {
                if !slot.carried.contains(&(i + 1, r)) {
                    slot.carried.push((i + 1, r));
                }
            }
        }
    }

    /// Ends a session.
    pub fn close(&mut self, id: SessionId) {
        if let Some(slot) = self.live.remove(&id) {
            if self.ended.len() >= ENDED_REMEMBERED {
                self.ended.pop_front();
            }
            self.ended.push_back((id, slot.carried));
        }
    }

    /// The session's sink, for frames from the entry's own stage.
    pub fn sink(&self, id: SessionId) -> Option<&T> {
        self.live.get(&id).map(|s| &s.sink)
    }

    /// Every live session's sink.
    pub fn sinks(&self) -> impl Iterator<Item = &T> {
        self.live.values().map(|s| &s.sink)
    }

    /// Judges a frame about `session` that arrived on the control link of
    /// `replica` of `stage`; the sink to deliver to when admitted.
    pub fn admit(&self, stage: usize, replica: u8, session: SessionId, said: Said) -> (Admit, Option<&T>) {
        if said == Said::Verdict && stage != self.last_stage {
            return (Admit::Violation("a verdict from a stage other than the last"), None);
        }
        let this = (stage, replica);
        match self.live.get(&session) {
            Some(slot) if slot.route.get(stage.wrapping_sub(1)) == Some(&replica) => (Admit::Deliver, Some(&slot.sink)),
            Some(slot) if slot.carried.contains(&this) => (Admit::Ignore, None),
            Some(_) => (Admit::Violation("a frame for a session this link does not carry"), None),
            None if self.ended.iter().any(|(id, carried)| *id == session && carried.contains(&this)) => {
                (Admit::Ignore, None)
            }
            None => (Admit::Violation("a frame for a session this link never carried"), None),
        }
    }

    /// Number of live sessions.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }
}

/// A random session id (never zero).
pub fn random_id() -> u64 {
    let n = veil_attestation::Nonce::random();
    let mut b = [0u8; 8];
    b.copy_from_slice(&n.as_bytes()[..8]);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> (SessionTable<&'static str>, SessionId, SessionId) {
        let mut t = SessionTable::new(2);
        let mut ids = [11u64, 22].into_iter();
        let a = t.open("a", || ids.next().unwrap_or(99));
        let b = t.open("b", || ids.next().unwrap_or(99));
        t.route(a, &[0, 0]); // stage 1 replica 0, stage 2 replica 0
        t.route(b, &[1, 0]); // stage 1 replica 1, stage 2 replica 0
        (t, a, b)
    }

    #[test]
    fn verdicts_only_from_the_last_stage_replica_on_the_route() {
        let (t, a, b) = table();
        assert_eq!(t.admit(2, 0, a, Said::Verdict), (Admit::Deliver, Some(&"a")));
        assert_eq!(t.admit(2, 0, b, Said::Verdict), (Admit::Deliver, Some(&"b")));
        // A middle shard that carries the session still may not send its verdict.
        assert!(matches!(t.admit(1, 0, a, Said::Verdict).0, Admit::Violation(_)));
        // The last stage's other replica does not carry either session.
        assert!(matches!(t.admit(2, 1, a, Said::Verdict).0, Admit::Violation(_)));
    }

    #[test]
    fn errors_only_from_replicas_on_the_route() {
        let (t, a, b) = table();
        assert_eq!(t.admit(1, 0, a, Said::Error).0, Admit::Deliver);
        assert!(matches!(t.admit(1, 0, b, Said::Error).0, Admit::Violation(_)));
        assert_eq!(t.admit(1, 1, b, Said::Error).0, Admit::Deliver);
        assert!(matches!(t.admit(1, 1, a, Said::Error).0, Admit::Violation(_)));
    }

    #[test]
    fn unknown_sessions_are_violations_and_old_routes_are_ignored() {
        let (mut t, a, _) = table();
        assert!(matches!(t.admit(2, 0, SessionId(12345), Said::Verdict).0, Admit::Violation(_)));
        // Re-routed: the old middle replica's late frames are stale, not hostile.
        t.route(a, &[1, 0]);
        assert_eq!(t.admit(1, 0, a, Said::Error).0, Admit::Ignore);
        assert_eq!(t.admit(1, 1, a, Said::Error).0, Admit::Deliver);
        // Ended: replicas that carried it are ignored, others are not.
        t.close(a);
        assert_eq!(t.admit(2, 0, a, Said::Verdict).0, Admit::Ignore);
        assert!(matches!(t.admit(1, 2, a, Said::Error).0, Admit::Violation(_)));
        assert!(t.sink(a).is_none());
    }

    #[test]
    fn ids_are_random_nonzero_and_unique() {
        let mut t: SessionTable<()> = SessionTable::new(1);
        let mut draws = [0u64, 7, 7, 8].into_iter();
        let a = t.open((), || draws.next().unwrap_or(9));
        let b = t.open((), || draws.next().unwrap_or(9));
        assert_eq!((a, b), (SessionId(7), SessionId(8)));
        let ids: std::collections::HashSet<u64> = (0..1000).map(|_| random_id()).collect();
        assert!(ids.len() > 990, "random ids repeat");
    }

    #[test]
    fn ended_memory_is_bounded() {
        let mut t: SessionTable<()> = SessionTable::new(1);
        let mut n = 0u64;
        for _ in 0..ENDED_REMEMBERED + 10 {
            let id = t.open((), || {
                n += 1;
                n
            });
            t.close(id);
        }
        assert_eq!(t.ended.len(), ENDED_REMEMBERED);
        assert!(t.is_empty());
    }
}
