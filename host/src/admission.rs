//! Admission of sealed requests at the relay: a fixed number of slots, a
//! bounded queue in front of them, and turns between client addresses.
//!
//! A request that finds a free slot and nobody waiting runs at once. Else it
//! waits in its client address's line, up to a limit of time; when the
//! queue (all lines together) is full it is shed at once. Freed slots go to
//! the lines in turn, one request per address per turn, so a client with a
//! hundred queued requests and one with a single request alternate rather
//! than queue behind each other. The relay cannot see users, only
//! connections; turns are by address (not by connection), so opening more
//! connections buys no more turns.
//!
//! A request costing several slots (`veil-cost`) waits at the head of its
//! line until that many are free; the turn does not pass it by, so it
//! cannot starve behind a stream of cheaper ones.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;

/// Why a request was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shed {
    /// The queue holds its limit already (or the request costs more slots
    /// than there are).
    QueueFull,
    /// The request waited its limit without a slot.
    Timeout,
}

/// Slots held by one admitted request; released (and handed to the next
/// in turn) when dropped.
#[derive(Debug)]
pub struct Grant {
    admission: Option<Arc<Admission>>,
    cost: usize,
}

impl Drop for Grant {
    fn drop(&mut self) {
        if let Some(a) = self.admission.take() {
            a.release(self.cost);
        }
    }
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    cost: usize,
    grant: oneshot::Sender<Grant>,
}

#[derive(Debug, Default)]
struct State {
    free: usize,
    queued: usize,
    /// Addresses with waiting requests, the next to be served first.
    turn: VecDeque<IpAddr>,
    lines: HashMap<IpAddr, VecDeque<Waiter>>,
}

impl State {
    /// Takes waiter `id` out of `client`'s line; whether it was there.
    fn remove(&mut self, client: IpAddr, id: u64) -> bool {
        let Some(line) = self.lines.get_mut(&client) else { return false };
        let Some(at) = line.iter().position(|w| w.id == id) else { return false };
        line.remove(at);
        self.queued -= 1;
        if line.is_empty() {
            self.lines.remove(&client);
            self.turn.retain(|ip| *ip != client);
        }
        true
    }
}

/// The relay's slots and queue.
#[derive(Debug)]
pub struct Admission {
    capacity: usize,
    max_queued: usize,
    next_id: AtomicU64,
    state: Mutex<State>,
}

/// Takes a waiter out of the queue when its request goes away unserved
/// (the client disconnected, or it timed out).
struct Queued<'a> {
    admission: &'a Arc<Admission>,
    client: IpAddr,
    id: u64,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.admission.leave(self.client, self.id);
    }
}

impl Admission {
    /// `capacity` slots with at most `max_queued` requests waiting (0: shed
    /// at once when every slot is held).
    pub fn new(capacity: usize, max_queued: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            max_queued,
            next_id: AtomicU64::new(0),
            state: Mutex::new(State { free: capacity, ..State::default() }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Slots held now.
    pub fn in_use(&self) -> usize {
        self.capacity - self.lock().free
    }

    /// Requests waiting now.
    pub fn queued(&self) -> usize {
        self.lock().queued
    }

    /// `cost` slots for a request from `client`: at once, or after waiting
    /// its turn for at most `wait`.
    pub async fn admit(self: &Arc<Self>, client: IpAddr, cost: usize, wait: Duration) -> Result<Grant, Shed> {
        let (id, mut rx) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            if cost > self.capacity {
                return Err(Shed::QueueFull);
            }
            if st.queued == 0 && st.free >= cost {
                st.free -= cost;
                return Ok(Grant { admission: Some(self.clone()), cost });
            }
            if st.queued >= self.max_queued {
                return Err(Shed::QueueFull);
            }
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            let line = st.lines.entry(client).or_default();
            if line.is_empty() {
                st.turn.push_back(client);
            }
            line.push_back(Waiter { id, cost, grant: tx });
            st.queued += 1;
            (id, rx)
        };
        let queued = Queued { admission: self, client, id };
        match tokio::time::timeout(wait, &mut rx).await {
            Ok(Ok(grant)) => Ok(grant),
            // Grants are sent under the lock: once this waiter is no longer
            // in its line, its grant is in the channel.
            Ok(Err(_)) | Err(_) => {
                std::mem::forget(queued);
                if self.leave(client, id) {
                    return Err(Shed::Timeout);
                }
                rx.try_recv().map_err(|_| Shed::Timeout)
            }
        }
    }

    /// Takes waiter `id` out of `client`'s line, if it is still there, and
    /// hands on what its leaving frees: a costly request at the head of a
    /// line may have been holding back cheaper ones behind it. Whether it
    /// was there.
    fn leave(self: &Arc<Self>, client: IpAddr, id: u64) -> bool {
        let mut st = self.lock();
        let left = st.remove(client, id);
        if left {
            self.dispatch(&mut st);
        }
        left
    }

    fn release(self: &Arc<Self>, cost: usize) {
        let mut st = self.lock();
        st.free += cost;
        self.dispatch(&mut st);
    }

    /// Hands free slots to the waiting requests, one address per turn.
    fn dispatch(self: &Arc<Self>, st: &mut State) {
        while let Some(&client) = st.turn.front() {
            let Some(line) = st.lines.get_mut(&client) else {
                st.turn.pop_front();
                continue;
            };
            let Some(head) = line.front() else {
                st.lines.remove(&client);
                st.turn.pop_front();
                continue;
            };
            if head.cost > st.free {
                break;
            }
            let Some(waiter) = line.pop_front() else { break };
            let more = !line.is_empty();
            st.turn.pop_front();
            if more {
                st.turn.push_back(client);
            } else {
                st.lines.remove(&client);
            }
            st.queued -= 1;
            st.free -= waiter.cost;
            let grant = Grant { admission: Some(self.clone()), cost: waiter.cost };
            // A waiter whose request went away: its slots come straight
            // back (not through Drop, which would take the lock held here).
            if let Err(mut unsent) = waiter.grant.send(grant) {
                unsent.admission = None;
                st.free += waiter.cost;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, n])
    }

    const LONG: Duration = Duration::from_secs(30);

    #[tokio::test(start_paused = true)]
    async fn freed_slots_go_to_addresses_in_turn_not_in_arrival_order() {
        let a = Admission::new(1, 16);
        let held = a.admit(ip(1), 1, LONG).await.unwrap();
        // Address 1 queues three requests, then address 2 one.
        let (tx, mut order) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for (n, who) in [(1u8, "1a"), (1, "1b"), (1, "1c"), (2, "2a")] {
            let (a, tx) = (a.clone(), tx.clone());
            tasks.push(tokio::spawn(async move {
                let g = a.admit(ip(n), 1, LONG).await.unwrap();
                tx.send(who).unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(g);
            }));
            tokio::task::yield_now().await;
        }
        assert_eq!(a.queued(), 4);
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        let mut got = Vec::new();
        while let Ok(w) = order.try_recv() {
            got.push(w);
        }
        // FIFO would serve 1a 1b 1c 2a; turns serve 2a second.
        assert_eq!(got, ["1a", "2a", "1b", "1c"]);
        assert_eq!((a.in_use(), a.queued()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_sheds_at_once_and_a_long_wait_times_out() {
        let a = Admission::new(1, 1);
        let _held = a.admit(ip(1), 1, LONG).await.unwrap();
        let waiting = tokio::spawn({
            let a = a.clone();
            async move { a.admit(ip(2), 1, Duration::from_secs(5)).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        assert_eq!(a.queued(), 1);
        assert_eq!(a.admit(ip(3), 1, LONG).await.map(|_| ()), Err(Shed::QueueFull));
        assert_eq!(waiting.await.unwrap(), Err(Shed::Timeout));
        assert_eq!((a.in_use(), a.queued()), (1, 0), "the timed-out waiter left the queue");
        // No queue at all: shed as soon as the slots are held.
        let none = Admission::new(1, 0);
        let _g = none.admit(ip(1), 1, LONG).await.unwrap();
        assert_eq!(none.admit(ip(2), 1, LONG).await.map(|_| ()), Err(Shed::QueueFull));
        assert_eq!(none.admit(ip(2), 2, LONG).await.map(|_| ()), Err(Shed::QueueFull), "more than there are");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_goes_away_frees_its_place_and_takes_no_slot() {
        let a = Admission::new(1, 4);
        let held = a.admit(ip(1), 1, LONG).await.unwrap();
        let gone = tokio::spawn({
            let a = a.clone();
            async move { a.admit(ip(2), 1, LONG).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        assert_eq!(a.queued(), 1);
        gone.abort();
        let _ = gone.await;
        assert_eq!(a.queued(), 0, "the client that left is out of the queue");
        drop(held);
        assert_eq!(a.in_use(), 0, "its slot was not handed to nobody");
        let _g = a.admit(ip(3), 1, LONG).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_costly_waiter_that_gives_up_lets_the_cheaper_ones_behind_it_in() {
        let a = Admission::new(2, 8);
        let _first = a.admit(ip(1), 1, LONG).await.unwrap();
        // Costs 2 with 1 free: waits, and gives up after a second.
        let big = tokio::spawn({
            let a = a.clone();
            async move { a.admit(ip(2), 2, Duration::from_secs(1)).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        let small = tokio::spawn({
            let a = a.clone();
            async move { a.admit(ip(3), 1, LONG).await.map(|g| g.cost) }
        });
        tokio::task::yield_now().await;
        assert_eq!(a.queued(), 2);
        assert_eq!(big.await.unwrap(), Err(Shed::Timeout));
        // No slot was released, yet the free one went to the cheap waiter.
        assert_eq!(small.await.unwrap(), Ok(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_costly_request_is_not_passed_by_cheaper_ones() {
        let a = Admission::new(2, 8);
        let first = a.admit(ip(1), 1, LONG).await.unwrap();
        let big = tokio::spawn({
            let a = a.clone();
            async move { a.admit(ip(2), 2, LONG).await.map(|g| g.cost) }
        });
        tokio::task::yield_now().await;
        // One slot is free, but the costly request is first in turn.
        let small = tokio::spawn({
            let a = a.clone();
            async move { a.admit(ip(3), 1, LONG).await.map(|g| g.cost) }
        });
        tokio::task::yield_now().await;
        assert_eq!((a.in_use(), a.queued()), (1, 2));
        drop(first);
        assert_eq!(big.await.unwrap(), Ok(2));
        assert_eq!(small.await.unwrap(), Ok(1));
        assert_eq!(a.in_use(), 0);
    }
}
