//! A round's verdict taken by the session: the stages' KV lengths checked,
//! the drafts verified against the last stage's distributions, tokens
//! committed and emitted, later rounds cancelled on a rejection, a
//! prompt's scores kept, and the round counted.

use super::*;

impl SessionCore<'_> {
    /// Takes the verdicts of the oldest rounds, in order, while they are here.
    pub(super) fn take_verdicts(&mut self, now: Instant) {
        self.dry = false;
        while self.inflight.front().is_some_and(Round::answered) && !matches!(self.state, Expect::Done) {
            let Some(round) = self.inflight.pop_front() else { return };
            self.on_verdict(round, now);
        }
    }

    fn on_verdict(&mut self, mut round: Round, now: Instant) {
        let Some(v) = round.verdict.take() else { return };
        let elapsed = now.saturating_duration_since(round.sent);
        // Every stage must hold exactly the committed positions plus those
        // of the rounds sent so far: rejected drafts were rolled back.
        if let Err(e) = check_kv_lens(&v.kv_lens, self.cfg.stages, round.kv_end) {
            return self.fail(e);
        }
        self.warm = false;
        if !round.scoring.is_empty() {
            match self.prompt_scores(&round.scoring) {
                Ok(lps) => self.prompt_logprobs = Some(lps),
                Err(e) => return self.fail(e),
            }
        }
        if self.max_tokens == 0 {
            // Only the prompt's scores were asked for.
            self.prompt_round = false;
            return self.finish(false);
        }
        let greedy = self.params.temperature == 0.0;
        // A base round's frame is the last committed token then its drafts;
        // a continuation's is its drafts, the first already checked.
        let n = round.draft.tokens.len() + usize::from(round.base);
        if v.positions.len() < n || n == 0 {
            return self.fail(SessionError::ShortVerdict { got: v.positions.len(), want: n.max(1) });
        }
        let p = &v.positions[v.positions.len() - n..];
        // Committed token j of this verdict was decided at position p[j].
        let logprobs = match self.params.logprobs {
            None => None,
            Some(_) if v.logprobs.len() != v.positions.len() => {
                return self.fail(SessionError::NoLogprobs { got: v.logprobs.len(), want: v.positions.len() })
            }
            Some(top) => Some((&v.logprobs[v.logprobs.len() - n..], usize::from(top))),
        };
        let skip = usize::from(!round.base);
        let check = Draft {
            tokens: round.draft.tokens[skip..].to_vec(),
            q: round.draft.q.get(skip..).map(<[_]>::to_vec).unwrap_or_default(),
        };
        let (checked, tail) = p.split_at(n - 1);
        let outcome = verify_drafts(&check, checked, greedy, &mut self.sampler);
        let mut tokens = outcome.tokens;
        let accepted = outcome.accepted + usize::from(round.head_kept);
        let mut rejected = outcome.accepted < check.tokens.len();
        if !rejected {
            // The last distribution checks the next round's first draft, or
            // draws the bonus token when nothing follows.
            match self.inflight.front_mut() {
                Some(next) => {
                    let head = Draft {
                        tokens: next.draft.tokens[..1].to_vec(),
                        q: next.draft.q.first().cloned().into_iter().collect(),
                    };
                    let o = verify_drafts(&head, tail, greedy, &mut self.sampler);
                    next.head_kept = o.accepted == 1;
                    rejected = !next.head_kept;
                    if rejected {
                        let drafting = next.drafting;
                        if let Some(sp) = self.spec.as_mut() {
                            // One draft of the cancelled round checked, and rejected.
                            sp.k.observe_drafts(1, 0, drafting);
                            sp.stats.drafted += 1;
                            sp.stats.draft_micros += drafting.as_micros() as u64;
                        }
                    }
                    tokens.extend(o.tokens);
                }
                None => {
                    let last = &tail[0];
                    tokens.push(if greedy { last.first().map_or(0, |e| e.0) } else { self.sampler.draw(last) });
                }
            }
        }
        if rejected {
            self.cancel_in_flight(true);
        }
        self.count_round(&round, accepted, tokens.len(), elapsed);
        self.time_tokens(tokens.len(), now);
        self.prompt_round = false;
        for (j, next) in tokens.into_iter().enumerate() {
            if self.stop_ids.contains(&next) {
                self.cancel_in_flight(false);
                return self.finish(false);
            }
            if let Some((rows, top)) = logprobs {
                let Some(lp) = rows.get(j).map(|row| token_logprob(row, top, next)) else {
                    return self.fail(SessionError::NoLogprobs { got: rows.len(), want: j + 1 });
                };
                match lp {
                    Some(lp) => {
                        self.logprobs.push(lp.clone());
                        self.out.push_back(Action::Logprobs(vec![lp]));
                    }
                    None => return self.fail(SessionError::NoLogprobs { got: j, want: j + 1 }),
                }
            }
            self.history.push(next);
            self.generated += 1;
            let Some(stream) = self.stream.as_mut() else { return };
            let step = match stream.push(next) {
                Ok(step) => step,
                Err(e) => return self.fail(SessionError::Text(e.to_string())),
            };
            if !step.piece.is_empty() {
                self.out.push_back(Action::Emit(step.piece));
            }
            if step.stopped || self.generated >= self.max_tokens {
                self.cancel_in_flight(false);
                return self.finish(step.stopped);
            }
        }
        if self.inflight.is_empty() {
            self.pending = (self.history.len() - 1, false);
        }
    }

    /// The prompt's scores from its scoring frames' verdicts: per position,
    /// the next prompt token's log-probability and the top alternatives.
    fn prompt_scores(&self, frames: &[Scoring]) -> Result<Vec<TokenLogprob>, SessionError> {
        let top = usize::from(self.params.logprobs.unwrap_or(0));
        let mut out = Vec::with_capacity(self.prompt_len.saturating_sub(1));
        for s in frames {
            let rows = s.rows.as_deref().unwrap_or_default();
            if rows.len() != s.len {
                return Err(SessionError::NoLogprobs { got: rows.len(), want: s.len });
            }
            for (i, row) in rows.iter().enumerate() {
                let next = self.history[s.start + i + 1];
                let lp = token_logprob(row, top, next)
                    .ok_or(SessionError::NoLogprobs { got: out.len(), want: out.len() + 1 })?;
                out.push(lp);
            }
        }
        Ok(out)
    }

    /// Times `committed` tokens that arrived `now`: the first of a session
    /// against its start, later ones against the previous commit.
    fn time_tokens(&mut self, committed: usize, now: Instant) {
        if committed == 0 {
            return;
        }
        match self.last_commit {
            None => self.counters.ttft.observe(now.saturating_duration_since(self.started)),
            Some(last) => {
                let each = now.saturating_duration_since(last) / committed as u32;
                self.counters.inter_token.observe_n(each, committed as u64);
            }
        }
        self.last_commit = Some(now);
    }

    /// Counts a verified round: `accepted` of its drafts kept, `committed`
    /// tokens committed by it, `elapsed` from sending to verdict.
    fn count_round(&mut self, round: &Round, accepted: usize, committed: usize, elapsed: Duration) {
        let c = self.counters;
        if !round.decode {
            if let Some(sp) = self.spec.as_mut() {
                sp.stats.kv_checked += 1;
            }
            return;
        }
        c.rounds.fetch_add(1, Ordering::Relaxed);
        c.committed.fetch_add(committed as u64, Ordering::Relaxed);
        let Some(sp) = self.spec.as_mut() else { return };
        let k = round.draft.tokens.len();
        sp.stats.kv_checked += 1;
        sp.k.observe(k, accepted.min(k), elapsed, round.drafting);
        sp.stats.rounds += 1;
        sp.stats.spec_rounds += u64::from(k > 0);
        sp.stats.drafted += k as u64;
        sp.stats.accepted += accepted as u64;
        sp.stats.draft_micros += round.drafting.as_micros() as u64;
        sp.stats.round_micros += elapsed.as_micros() as u64;
        if sp.stats.rounds_by_k.len() <= k {
            sp.stats.rounds_by_k.resize(k + 1, 0);
        }
        sp.stats.rounds_by_k[k] += 1;
        c.spec_rounds.fetch_add(u64::from(k > 0), Ordering::Relaxed);
        c.drafted.fetch_add(k as u64, Ordering::Relaxed);
        c.accepted.fetch_add(accepted as u64, Ordering::Relaxed);
    }
}

/// Token `token`'s entry in a verdict position's log-probabilities, with the
/// first `top` of them as its alternatives; `None` when the verdict left it
/// out (a shard that broke the protocol).
fn token_logprob(row: &[(u32, f32)], top: usize, token: u32) -> Option<TokenLogprob> {
    let logprob = row.iter().find(|e| e.0 == token)?.1;
    Some(TokenLogprob { token, logprob, top: row[..top.min(row.len())].to_vec() })
}

/// After a round every stage (the entry first) must hold exactly `expected`
/// positions of the session: the committed ones plus those just verified, so
/// drafts a previous round rejected were rolled back everywhere.
pub(super) fn check_kv_lens(kv_lens: &[u32], stages: usize, expected: u32) -> Result<(), SessionError> {
    if kv_lens.len() != stages || kv_lens.iter().any(|&l| l != expected) {
        return Err(SessionError::KvLengths { got: kv_lens.to_vec(), expected });
    }
    Ok(())
}
