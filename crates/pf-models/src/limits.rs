//! Per-model limits shared by every run in the process: how many requests may
//! be in flight to a model (`concurrency`), how many may start in any minute
//! (`requests_per_minute`), how many tokens they may use in any minute
//! (`tokens_per_minute`), and a pause a server asked for (a `Retry-After`).
//!
//! One [`ModelGate`] per model, found in a process-wide registry by its
//! catalog id and endpoint ([`ModelGate::shared`]), so fanout arms, tasks,
//! batch inputs, test cases and MCP calls all queue at the same gate however
//! many Hosts the process assembles. The HTTP provider passes each attempt
//! through it ([`ModelGate::admit`]); the Engine never sees it.
//!
//! Waiters are admitted in arrival order (tokio's semaphore and mutex are
//! fair), so a long batch cannot starve a run that asked first.

use std::collections::{HashMap, VecDeque};
use std::num::{NonZeroU32, NonZeroU64};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use pf_harness::{CancellationToken, ProviderError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// The window `requests_per_minute` and `tokens_per_minute` count over.
const WINDOW: Duration = Duration::from_secs(60);

/// What the host file sets for one model; every limit optional.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ModelLimits {
    /// Requests in flight at once, across the process.
    pub concurrency: Option<NonZeroU32>,
    /// Requests started in any 60 seconds.
    pub requests_per_minute: Option<NonZeroU32>,
    /// Tokens (request and reply, as the server counts them) in any 60 seconds.
    pub tokens_per_minute: Option<NonZeroU64>,
}

/// The queue in front of one model.
#[derive(Debug)]
pub struct ModelGate {
    limits: ModelLimits,
    /// Free request slots (`concurrency`); `None` when unlimited.
    slots: Option<Arc<Semaphore>>,
    /// Held by the waiter at the head of the queue while it waits for the
    /// windows and a pause: later waiters queue behind it in order.
    head: tokio::sync::Mutex<()>,
    state: Mutex<Windows>,
}

/// What was sent in the last minute, and any pause a server asked for.
#[derive(Debug, Default)]
struct Windows {
    paused_until: Option<Instant>,
    /// When each request of the last minute started.
    starts: VecDeque<Instant>,
    /// The tokens each request of the last minute was charged, by charge id.
    charges: VecDeque<Charge>,
    next_charge: u64,
}

#[derive(Debug)]
struct Charge {
    id: u64,
    at: Instant,
    tokens: u64,
}

impl Windows {
    fn forget_before(&mut self, now: Instant) {
        while self
            .starts
            .front()
            .is_some_and(|at| now.duration_since(*at) >= WINDOW)
        {
            self.starts.pop_front();
        }
        while self
            .charges
            .front()
            .is_some_and(|c| now.duration_since(c.at) >= WINDOW)
        {
            self.charges.pop_front();
        }
    }

    /// When a request of `tokens` may start, or `None` for now.
    fn ready_at(&self, now: Instant, limits: &ModelLimits, tokens: u64) -> Option<Instant> {
        let mut ready = self.paused_until.filter(|until| *until > now);
        let mut later = |at: Instant| ready = Some(ready.map_or(at, |r| r.max(at)));
        if let Some(rpm) = limits.requests_per_minute {
            let rpm = rpm.get() as usize;
            if self.starts.len() >= rpm {
                // The start that must leave the window before one more fits.
                if let Some(at) = self.starts.get(self.starts.len() - rpm) {
                    later(*at + WINDOW);
                }
            }
        }
        if let Some(tpm) = limits.tokens_per_minute {
            let tpm = tpm.get();
            let mut used: u64 = self.charges.iter().map(|c| c.tokens).sum();
            // A request larger than the whole budget goes alone into an empty
            // window rather than never.
            let mut leaving = self.charges.iter();
            while used > 0 && used.saturating_add(tokens) > tpm {
                match leaving.next() {
                    Some(charge) => {
                        used -= charge.tokens.min(used);
                        later(charge.at + WINDOW);
                    }
                    None => break,
                }
            }
        }
        ready
    }
}

/// One admitted request: holds its slot until dropped, and settles its token
/// charge with what the server reported.
#[derive(Debug)]
pub struct Admission {
    gate: Arc<ModelGate>,
    _slot: Option<OwnedSemaphorePermit>,
    charge: Option<u64>,
}

impl Admission {
    /// Replace the estimate charged at admission with the tokens the server
    /// counted (request and reply).
    pub fn settle(&self, tokens: u64) {
        let Some(id) = self.charge else { return };
        if let Ok(mut state) = self.gate.state.lock() {
            if let Some(charge) = state.charges.iter_mut().find(|c| c.id == id) {
                charge.tokens = tokens;
            }
        }
    }
}

type Registry = Mutex<HashMap<String, Arc<ModelGate>>>;

fn registry() -> &'static Registry {
    static GATES: OnceLock<Registry> = OnceLock::new();
    GATES.get_or_init(Registry::default)
}

impl ModelGate {
    /// A gate on its own (tests; a Host uses [`ModelGate::shared`]).
    pub fn new(limits: ModelLimits) -> ModelGate {
        ModelGate {
            limits,
            slots: limits
                .concurrency
                .map(|n| Arc::new(Semaphore::new(n.get() as usize))),
            head: tokio::sync::Mutex::new(()),
            state: Mutex::new(Windows::default()),
        }
    }

    /// The process's gate for the model `id` at `endpoint`. Every provider
    /// built for that model in this process shares it; a Host whose limits
    /// differ from the gate's gets a fresh gate (runs already holding the old
    /// one finish under it).
    pub fn shared(id: &str, endpoint: &str, limits: ModelLimits) -> Arc<ModelGate> {
        let key = format!("{id}\u{0}{endpoint}");
        let Ok(mut gates) = registry().lock() else {
            return Arc::new(ModelGate::new(limits));
        };
        match gates.get(&key) {
            Some(gate) if gate.limits == limits => Arc::clone(gate),
            _ => {
                let gate = Arc::new(ModelGate::new(limits));
                gates.insert(key, Arc::clone(&gate));
                gate
            }
        }
    }

    /// The limits this gate keeps.
    pub fn limits(&self) -> ModelLimits {
        self.limits
    }

    /// Wait until a request estimated at `tokens` may be sent: a free slot,
    /// room in both windows and no pause. `Cancelled` as soon as `cancel` fires.
    pub async fn admit(
        self: &Arc<Self>,
        tokens: u64,
        cancel: &CancellationToken,
    ) -> Result<Admission, ProviderError> {
        let slot = match &self.slots {
            Some(slots) => tokio::select! {
                _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
                slot = Arc::clone(slots).acquire_owned() => Some(slot.map_err(|_| ProviderError::Cancelled)?),
            },
            None => None,
        };
        let _head = tokio::select! {
            _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
            head = self.head.lock() => head,
        };
        loop {
            let now = Instant::now();
            let wait = {
                let mut state = self
                    .state
                    .lock()
                    .map_err(|_| ProviderError::Failed("model gate poisoned".to_string()))?;
                state.forget_before(now);
                match state.ready_at(now, &self.limits, tokens) {
                    Some(at) => at,
                    None => {
                        let charge = self.limits.tokens_per_minute.map(|_| {
                            let id = state.next_charge;
                            state.next_charge += 1;
                            state.charges.push_back(Charge {
                                id,
                                at: now,
                                tokens,
                            });
                            id
                        });
                        if self.limits.requests_per_minute.is_some() {
                            state.starts.push_back(now);
                        }
                        return Ok(Admission {
                            gate: Arc::clone(self),
                            _slot: slot,
                            charge,
                        });
                    }
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
                _ = tokio::time::sleep_until(wait) => {}
            }
        }
    }

    /// Hold every request not yet sent for `wait` (a server's `Retry-After`);
    /// a longer pause already set stays.
    pub fn pause(&self, wait: Duration) {
        let until = Instant::now() + wait;
        if let Ok(mut state) = self.state.lock() {
            if state.paused_until.is_none_or(|current| current < until) {
                state.paused_until = Some(until);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(concurrency: u32, rpm: u32, tpm: u64) -> ModelLimits {
        ModelLimits {
            concurrency: NonZeroU32::new(concurrency),
            requests_per_minute: NonZeroU32::new(rpm),
            tokens_per_minute: NonZeroU64::new(tpm),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn concurrency_holds_the_third_request_until_a_slot_frees() {
        let gate = Arc::new(ModelGate::new(limits(2, 0, 0)));
        let cancel = CancellationToken::new();
        let a = gate.admit(1, &cancel).await.unwrap();
        let _b = gate.admit(1, &cancel).await.unwrap();
        let third = tokio::time::timeout(Duration::from_secs(5), gate.admit(1, &cancel)).await;
        assert!(third.is_err(), "a third request was admitted");
        drop(a);
        tokio::time::timeout(Duration::from_secs(5), gate.admit(1, &cancel))
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn requests_per_minute_spreads_starts_over_the_window() {
        let gate = Arc::new(ModelGate::new(limits(0, 3, 0)));
        let cancel = CancellationToken::new();
        let began = tokio::time::Instant::now();
        for _ in 0..3 {
            gate.admit(1, &cancel).await.unwrap();
        }
        assert!(began.elapsed() < Duration::from_secs(1));
        gate.admit(1, &cancel).await.unwrap();
        assert!(began.elapsed() >= WINDOW);
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_per_minute_counts_what_the_server_reported() {
        let gate = Arc::new(ModelGate::new(limits(0, 0, 1000)));
        let cancel = CancellationToken::new();
        let began = tokio::time::Instant::now();
        // Estimated small, reported large: the next request waits for the window.
        gate.admit(10, &cancel).await.unwrap().settle(990);
        gate.admit(10, &cancel).await.unwrap();
        assert!(began.elapsed() < Duration::from_secs(1));
        gate.admit(10, &cancel).await.unwrap();
        assert!(began.elapsed() >= WINDOW);
        // Larger than the whole budget: admitted once the window is empty.
        let later = tokio::time::Instant::now();
        gate.admit(5000, &cancel).await.unwrap();
        assert!(later.elapsed() >= WINDOW);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_new_requests_and_cancel_ends_the_wait() {
        let gate = Arc::new(ModelGate::new(ModelLimits::default()));
        let cancel = CancellationToken::new();
        gate.pause(Duration::from_secs(1));
        let began = tokio::time::Instant::now();
        gate.admit(1, &cancel).await.unwrap();
        assert!(began.elapsed() >= Duration::from_secs(1));
        gate.pause(Duration::from_secs(30));
        cancel.cancel();
        assert!(matches!(
            gate.admit(1, &cancel).await,
            Err(ProviderError::Cancelled)
        ));
    }

    #[test]
    fn the_registry_shares_a_gate_per_model_and_limits() {
        let one = ModelGate::shared("m-registry", "http://a", limits(2, 0, 0));
        let same = ModelGate::shared("m-registry", "http://a", limits(2, 0, 0));
        assert!(Arc::ptr_eq(&one, &same));
        let other_endpoint = ModelGate::shared("m-registry", "http://b", limits(2, 0, 0));
        assert!(!Arc::ptr_eq(&one, &other_endpoint));
        let changed = ModelGate::shared("m-registry", "http://a", limits(3, 0, 0));
        assert!(!Arc::ptr_eq(&one, &changed));
    }
}
