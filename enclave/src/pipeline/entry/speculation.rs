//! The drafter's side of a session: the drafter itself, its background
//! preparation, and drafting off the async runtime when it is not cheap. What
//! k to draft and what to keep is the session core's ([`super::session`]).

use std::time::{Duration, Instant};

use crate::model::ModelError;
use crate::speculate::{Draft, DraftMode, Drafter};

/// A drafter preparing in the background, handed back when done.
type Preparing = tokio::task::JoinHandle<(Box<dyn Drafter>, Result<(), ModelError>)>;

/// One session's drafter.
#[derive(Debug)]
pub(super) struct Drafting {
    drafter: Option<Box<dyn Drafter>>,
    preparing: Option<Preparing>,
    mode: DraftMode,
}

impl Drafting {
    pub(super) fn new(drafter: Box<dyn Drafter>, mode: DraftMode) -> Self {
        Self { drafter: Some(drafter), preparing: None, mode }
    }

    /// Starts the drafter's preparation on `context` in the background.
    pub(super) fn prepare(&mut self, context: Vec<u32>) {
        if let Some(mut d) = self.drafter.take() {
            self.preparing = Some(tokio::task::spawn_blocking(move || {
                let r = d.prepare(&context);
                (d, r)
            }));
        }
    }

    /// Whether a preparation is still running.
    pub(super) fn is_preparing(&self) -> bool {
        self.preparing.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// Stops a preparation still running (the session ended).
    pub(super) fn abort(&mut self) {
        if let Some(h) = self.preparing.take() {
            h.abort();
        }
    }

    /// Waits for any background preparation, so that its time is not
    /// charged to drafting.
    async fn ready(&mut self) {
        if let Some(h) = self.preparing.take() {
            match h.await {
                Ok((d, Ok(()))) => self.drafter = Some(d),
                Ok((_, Err(e))) => tracing::warn!(error = %e, "drafter preparation failed: speculation off"),
                Err(e) => tracing::warn!(error = %e, "drafter preparation panicked: speculation off"),
            }
        }
    }

    /// Up to `k` drafted tokens for `context`, and the time drafting took
    /// (not counting a wait for preparation); an error turns speculation
    /// off for the session (plain decoding continues).
    pub(super) async fn draft(&mut self, context: &[u32], k: usize) -> (Draft, Duration) {
        self.ready().await;
        let started = Instant::now();
        let draft = self.draft_now(context, k).await;
        (draft, started.elapsed())
    }

    async fn draft_now(&mut self, context: &[u32], k: usize) -> Draft {
        let Some(mut d) = self.drafter.take() else { return Draft::default() };
        let mode = self.mode.clone();
        let result = if d.is_cheap() {
            let r = d.draft(context, k, &mode);
            Some((d, r))
        } else {
            let ctx = context.to_vec();
            tokio::task::spawn_blocking(move || {
                let r = d.draft(&ctx, k, &mode);
                (d, r)
            })
            .await
            .ok()
        };
        match result {
            Some((d, Ok(draft))) => {
                self.drafter = Some(d);
                draft
            }
            Some((_, Err(e))) => {
                tracing::warn!(error = %e, "drafter failed: speculation off for this session");
                Draft::default()
            }
            None => Draft::default(),
        }
    }
}
