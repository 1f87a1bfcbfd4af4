//! Per-link protocol state (sans-IO): what each side may send, in which
//! order. A violation is final; the transport drops the link and the shard
//! keeps serving its other links.

use std::collections::HashMap;

use veil_attestation::{LayerRange, ManifestRoot};

use super::frame::{Frame, Hello, LinkRole, SessionId, PROTOCOL_VERSION};

/// Which end of the link we are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The end that dialled: upstream on a data link, the entry on a control link.
    Dialer,
    /// The end that accepted.
    Acceptor,
}

/// What we require of the peer's hello.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerRequirement {
    /// The role the link must have (acceptors may take either: `None`).
    pub role: Option<LinkRole>,
    /// The layers the peer must serve, when pinned.
    pub layers: Option<LayerRange>,
    /// The manifest root the peer must have loaded, when pinned.
    pub manifest_root: Option<ManifestRoot>,
}

/// Why a peer broke the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// The first frame was not a hello, or a second hello came.
    #[error("expected a hello first and only once, got {0}")]
    Hello(&'static str),
    /// Different protocol version.
    #[error("peer speaks protocol version {peer}, this shard {ours}")]
    Version {
        /// The peer's.
        peer: u16,
        /// Ours.
        ours: u16,
    },
    /// The peer is not who the route says (role, layers or weights).
    #[error("peer does not match the route: {0}")]
    WrongPeer(String),
    /// A frame this end of this kind of link may not send.
    #[error("{frame} frame not allowed from the {from:?} on a {role:?} link")]
    NotAllowed {
        /// The frame.
        frame: &'static str,
        /// Who sent it.
        from: Side,
        /// The link's role.
        role: LinkRole,
    },
    /// A session's frames out of order.
    #[error("session frame sequence went from {last} to {got}")]
    OutOfOrder {
        /// Last sequence number seen.
        last: u64,
        /// The one received.
        got: u64,
    },
}

/// The protocol state of one link, from our end.
#[derive(Debug)]
pub struct LinkState {
    side: Side,
    require: PeerRequirement,
    peer: Option<Hello>,
    last_seq: HashMap<SessionId, u64>,
    /// Sessions in `last_seq`, oldest first (bounded by [`MAX_TRACKED_SESSIONS`]).
    order: std::collections::VecDeque<SessionId>,
}

/// Sessions whose sequence numbers one link tracks; the oldest are forgotten
/// beyond this, so neither a peer inventing session ids nor a long-lived data
/// link (which never sees the end of a session) grows without limit.
pub const MAX_TRACKED_SESSIONS: usize = 1 << 16;

impl LinkState {
    /// A link on which we are `side`, expecting a peer meeting `require`.
    pub fn new(side: Side, require: PeerRequirement) -> Self {
        Self { side, require, peer: None, last_seq: HashMap::new(), order: Default::default() }
    }

    /// The peer's hello, once received.
    pub fn peer(&self) -> Option<&Hello> {
        self.peer.as_ref()
    }

    /// Checks a frame received from the peer against the protocol.
    pub fn on_receive(&mut self, frame: &Frame) -> Result<(), Violation> {
        let Some(peer) = &self.peer else {
            let Frame::Hello(h) = frame else { return Err(Violation::Hello(frame.name())) };
            if h.version != PROTOCOL_VERSION {
                return Err(Violation::Version { peer: h.version, ours: PROTOCOL_VERSION });
            }
            if let Some(role) = self.require.role {
                if h.role != role {
                    return Err(Violation::WrongPeer(format!("link role {:?}, expected {role:?}", h.role)));
                }
            }
            if let Some(layers) = self.require.layers {
                if h.layers != layers {
                    return Err(Violation::WrongPeer(format!("serves layers {}, the route says {layers}", h.layers)));
                }
            }
            if let Some(root) = self.require.manifest_root {
                if h.manifest_root != root {
                    return Err(Violation::WrongPeer("manifest root differs from the route's".into()));
                }
            }
            self.peer = Some(h.clone());
            return Ok(());
        };
        let from = match self.side {
            Side::Dialer => Side::Acceptor,
            Side::Acceptor => Side::Dialer,
        };
        let role = peer.role;
        let allowed = match (frame, role, from) {
            (Frame::Hello(_), ..) => return Err(Violation::Hello("hello")),
            (Frame::Ping(_) | Frame::Pong(_) | Frame::Error(_), ..) => true,
            (Frame::Forward(_), LinkRole::Data, Side::Dialer) => true,
            (Frame::EndSession(_), _, Side::Dialer) => true,
            // Only the entry, which knows which drafts a verdict rejected, cancels.
            (Frame::Cancel(_), LinkRole::Control, Side::Dialer) => true,
            (Frame::Verdict(_), LinkRole::Control, Side::Acceptor) => true,
            _ => false,
        };
        if !allowed {
            return Err(Violation::NotAllowed { frame: frame.name(), from, role });
        }
        let seq = match frame {
            Frame::Forward(f) => Some((f.session, f.seq)),
            Frame::Verdict(v) => Some((v.session, v.seq)),
            _ => None,
        };
        if let Some((session, seq)) = seq {
            if !self.last_seq.contains_key(&session) {
                if self.order.len() >= MAX_TRACKED_SESSIONS {
                    if let Some(old) = self.order.pop_front() {
                        self.last_seq.remove(&old);
                    }
                }
                self.order.push_back(session);
            }
            let last = self.last_seq.entry(session).or_insert(0);
            if seq <= *last {
                return Err(Violation::OutOfOrder { last: *last, got: seq });
            }
            *last = seq;
        }
        if let Frame::EndSession(s) = frame {
            if self.last_seq.remove(s).is_some() {
                self.order.retain(|x| x != s);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::frame::{Forward, Precision, Want};
    use super::*;

    fn hello(role: LinkRole, (a, b): (u32, u32), root: u8) -> Frame {
        let layers = LayerRange::new(a, b).unwrap();
        Frame::Hello(Hello { version: PROTOCOL_VERSION, role, layers, manifest_root: ManifestRoot([root; 32]) })
    }

    fn forward(session: u64, seq: u64) -> Frame {
        Frame::Forward(Forward {
            session: SessionId(session),
            seq,
            start: 0,
            truncate_to: None,
            want: Want::Nothing,
            route: vec![],
            shadow: vec![],
            mirror: false,
            kv_lens: vec![],
            sampling: None,
            precision: Precision::F32,
            width: 1,
            hidden: vec![0.0],
        })
    }

    #[test]
    fn tracked_sessions_are_bounded() {
        let mut s = LinkState::new(Side::Acceptor, PeerRequirement { role: None, layers: None, manifest_root: None });
        s.on_receive(&hello(LinkRole::Data, (0, 1), 1)).unwrap();
        for session in 0..(MAX_TRACKED_SESSIONS as u64 + 1000) {
            s.on_receive(&forward(session, 1)).unwrap();
        }
        assert_eq!(s.last_seq.len(), MAX_TRACKED_SESSIONS);
        assert_eq!(s.order.len(), MAX_TRACKED_SESSIONS);
        // The newest are still checked.
        let newest = MAX_TRACKED_SESSIONS as u64 + 999;
        assert!(s.on_receive(&forward(newest, 1)).is_err());
    }

    fn require() -> PeerRequirement {
        PeerRequirement {
            role: None,
            layers: Some(LayerRange::new(0, 10).unwrap()),
            manifest_root: Some(ManifestRoot([1; 32])),
        }
    }

    #[test]
    fn hello_first_then_frames_in_order() {
        let mut s = LinkState::new(Side::Acceptor, require());
        assert_eq!(s.on_receive(&Frame::Ping(1)), Err(Violation::Hello("ping")));
        s.on_receive(&hello(LinkRole::Data, (0, 10), 1)).unwrap();
        s.on_receive(&forward(1, 1)).unwrap();
        s.on_receive(&forward(2, 1)).unwrap();
        s.on_receive(&forward(1, 2)).unwrap();
        assert_eq!(s.on_receive(&forward(1, 2)), Err(Violation::OutOfOrder { last: 2, got: 2 }));
        assert!(matches!(s.on_receive(&hello(LinkRole::Data, (0, 10), 1)), Err(Violation::Hello(_))));
    }

    #[test]
    fn wrong_peers_and_wrong_directions_are_refused() {
        let mut s = LinkState::new(Side::Acceptor, require());
        assert!(matches!(s.on_receive(&hello(LinkRole::Data, (0, 10), 2)), Err(Violation::WrongPeer(_))));
        let mut s = LinkState::new(Side::Acceptor, require());
        assert!(matches!(s.on_receive(&hello(LinkRole::Data, (0, 11), 1)), Err(Violation::WrongPeer(_))));
        let mut bad_version = LinkState::new(Side::Acceptor, require());
        let layers = LayerRange::new(0, 10).unwrap();
        let old =
            Frame::Hello(Hello { version: 0, role: LinkRole::Data, layers, manifest_root: ManifestRoot([1; 32]) });
        assert!(matches!(bad_version.on_receive(&old), Err(Violation::Version { .. })));
        // A downstream shard may not send activations upstream.
        let mut s = LinkState::new(Side::Dialer, require());
        s.on_receive(&hello(LinkRole::Data, (0, 10), 1)).unwrap();
        assert!(matches!(s.on_receive(&forward(1, 1)), Err(Violation::NotAllowed { .. })));
        // Verdicts only on control links, from the shard.
        let mut s = LinkState::new(Side::Acceptor, require());
        s.on_receive(&hello(LinkRole::Control, (0, 10), 1)).unwrap();
        let v = Frame::Verdict(super::super::frame::Verdict {
            session: SessionId(1),
            seq: 1,
            positions: vec![vec![(0, 1.0)]],
            kv_lens: vec![],
            logprobs: Vec::new(),
        });
        assert!(matches!(s.on_receive(&v), Err(Violation::NotAllowed { .. })));
        // Cancels only from the entry on a control link: an upstream shard
        // may not cancel another stage's work on a data link, nor a shard
        // send one back to the entry.
        let cancel = Frame::Cancel(super::super::frame::Cancel { session: SessionId(1), through: 4 });
        let mut s = LinkState::new(Side::Acceptor, require());
        s.on_receive(&hello(LinkRole::Control, (0, 10), 1)).unwrap();
        s.on_receive(&cancel).unwrap();
        let mut s = LinkState::new(Side::Acceptor, require());
        s.on_receive(&hello(LinkRole::Data, (0, 10), 1)).unwrap();
        assert!(matches!(s.on_receive(&cancel), Err(Violation::NotAllowed { frame: "cancel", .. })));
        let mut s = LinkState::new(Side::Dialer, require());
        s.on_receive(&hello(LinkRole::Control, (0, 10), 1)).unwrap();
        assert!(matches!(s.on_receive(&cancel), Err(Violation::NotAllowed { .. })));
    }
}
