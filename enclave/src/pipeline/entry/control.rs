//! Control links: one per shard on the route, dialled by the entry. Each is
//! verified (RA-TLS, the shard in its role on this route), carries heartbeats,
//! verdicts and per-session errors, and is dropped when the shard goes quiet
//! or speaks for a session it does not carry (see [`crate::pipeline::sessions`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use veil_attestation::EvidenceBundle;

use super::session::SessionEvent;
use super::Entry;
use crate::link::frame::{Frame, LinkRole, SessionId};
use crate::pipeline::net::PeerInRole;
use crate::pipeline::sessions::{Admit, Said};

#[derive(Debug, Default)]
pub(super) struct Replica {
    pub(super) control: Option<mpsc::Sender<Frame>>,
    pub(super) evidence: Option<(PeerInRole, EvidenceBundle)>,
    pub(super) sessions: usize,
}

impl Entry {
    /// Hands an event from the entry's own stage to its session.
    pub(super) async fn dispatch(&self, session: SessionId, event: SessionEvent) {
        if let Some(tx) = self.sessions.lock().await.sink(session) {
            let _ = tx.try_send(event);
        }
    }

    /// Hands a frame that arrived on the control link of (`stage`,
    /// `replica`) to its session if that link carries it; a violation (a
    /// frame for a session the link does not carry) drops the link.
    async fn admit(
        &self,
        stage: usize,
        replica: u8,
        session: SessionId,
        event: SessionEvent,
    ) -> Result<(), &'static str> {
        let said = if matches!(event, SessionEvent::Verdict(_)) { Said::Verdict } else { Said::Error };
        let sessions = self.sessions.lock().await;
        match sessions.admit(stage, replica, session, said) {
            // A session reads one event per answer it awaits: a peer that
            // fills its queue is flooding it.
            (Admit::Deliver, Some(tx)) => match tx.try_send(event) {
                Err(mpsc::error::TrySendError::Full(_)) => Err("a flood of frames for one session"),
                _ => Ok(()),
            },
            (Admit::Deliver | Admit::Ignore, _) => Ok(()),
            (Admit::Violation(why), _) => Err(why),
        }
    }

    pub(super) async fn control_loop(self: Arc<Self>, stage: usize, replica: u8) {
        let spec = self.route.stages[stage].clone();
        let addr = spec.replicas[usize::from(replica)];
        let mut backoff = Duration::from_millis(100);
        // The kind of failure last warned about: a retry that fails the
        // same way stays quiet, but a change (the shard came up, then
        // failed attestation) is what an operator must see.
        let mut warned = None;
        loop {
            match self.trust.dial(addr, &spec, LinkRole::Control).await {
                Err(e) => {
                    let kind = std::mem::discriminant(&e);
                    if warned != Some(kind) {
                        tracing::warn!(stage, %addr, error = %e, "shard not available (retrying with backoff)");
                        warned = Some(kind);
                    }
                }
                Ok((tx, mut reader, peer, bundle)) => {
                    tracing::info!(stage, %addr, layers = ?spec.layers, "shard verified; control link up");
                    backoff = Duration::from_millis(100);
                    warned = None;
                    {
                        let mut reps = self.replicas.lock().await;
                        let r = &mut reps[stage - 1][usize::from(replica)];
                        r.control = Some(tx.clone());
                        r.evidence = Some((peer, bundle));
                    }
                    let hb = self.route.heartbeat;
                    let pinger = tx.clone();
                    let heartbeat = tokio::spawn(async move {
                        let mut n = 0u64;
                        loop {
                            tokio::time::sleep(hb).await;
                            n += 1;
                            if pinger.send(Frame::Ping(n)).await.is_err() {
                                return;
                            }
                        }
                    });
                    let why = loop {
                        match tokio::time::timeout(hb * 4, reader.next()).await {
                            Err(_) => break "missed heartbeats".to_owned(),
                            Ok(Ok(None)) => break "closed".to_owned(),
                            Ok(Err(e)) => break e.to_string(),
                            Ok(Ok(Some(Frame::Verdict(v)))) => {
                                if let Err(why) = self.admit(stage, replica, v.session, SessionEvent::Verdict(v)).await
                                {
                                    break format!("protocol violation: {why}");
                                }
                            }
                            Ok(Ok(Some(Frame::Error(err)))) => match err.session {
                                Some(s) => {
                                    if let Err(why) = self.admit(stage, replica, s, SessionEvent::Error(err)).await {
                                        break format!("protocol violation: {why}");
                                    }
                                }
                                None => {
                                    tracing::warn!(stage, %addr, code = ?err.code, message = %err.message, "shard error")
                                }
                            },
                            Ok(Ok(Some(_))) => {}
                        }
                    };
                    heartbeat.abort();
                    tracing::warn!(stage, %addr, reason = %why, "shard lost");
                    {
                        let mut reps = self.replicas.lock().await;
                        let r = &mut reps[stage - 1][usize::from(replica)];
                        r.control = None;
                        r.evidence = None;
                    }
                    for tx in self.sessions.lock().await.sinks() {
                        let _ = tx.try_send(SessionEvent::Down { stage, replica });
                    }
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }
}
