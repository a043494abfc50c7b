//! Test support shared by the concurrency tests: a model whose replies take
//! real time and can wait for other rounds to start, and a runner for a
//! prompt body on it. No test asserts on the clock: concurrency is proven by
//! rounds that only answer once others are in flight.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pf_engine::{Outcome, RunSetup};
use pf_harness::{
    CancellationToken, ChatRequest, ChatResponse, Harness, ModelInfo, ModelProvider, ProviderError,
    ThinkingSupport, WorkId,
};

/// A model that answers each prompt `NAME:MILLIS` with `NAME!` after MILLIS
/// milliseconds, and never answers a prompt without a delay. A prompt
/// `NAME@GATE:MILLIS` first waits until GATE rounds have started in all (a
/// rendezvous): run one after another, such rounds never answer. It counts
/// the rounds in flight and keeps the most it ever saw at once.
#[derive(Default)]
pub struct SlowModel {
    pub in_flight: AtomicUsize,
    pub most_in_flight: AtomicUsize,
    pub prompts: Mutex<Vec<String>>,
    started: AtomicUsize,
    round_started: tokio::sync::Notify,
}

impl SlowModel {
    #[allow(dead_code)] // not every test binary reads the prompts
    pub fn prompts(&self) -> Vec<String> {
        self.prompts.lock().map(|p| p.clone()).unwrap_or_default()
    }
}

/// Decrements the in-flight count however the round ends, dropped included.
struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl ModelProvider for SlowModel {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            id: "slow".into(),
            context: 50_000,
            thinking: ThinkingSupport::Never,
            description: "Slow".into(),
        }
    }

    async fn complete(
        &self,
        request: ChatRequest,
        _work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        let prompt = request
            .messages
            .last()
            .and_then(|m| m.content.as_str().map(str::to_string))
            .unwrap_or_default();
        if let Ok(mut seen) = self.prompts.lock() {
            seen.push(prompt.clone());
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        let _guard = InFlight(&self.in_flight);
        self.started.fetch_add(1, Ordering::SeqCst);
        self.round_started.notify_waiters();
        let (name, delay) = match prompt.split_once(':') {
            Some((name, millis)) => (name.to_string(), millis.parse::<u64>().ok()),
            None => (prompt.clone(), None),
        };
        let (name, gate) = match name.split_once('@') {
            Some((name, gate)) => (name.to_string(), gate.parse::<usize>().unwrap_or(0)),
            None => (name, 0),
        };
        loop {
            // Registered before the check, so a round starting in between
            // still wakes this one.
            let next_start = self.round_started.notified();
            if self.started.load(Ordering::SeqCst) >= gate {
                break;
            }
            tokio::select! {
                _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
                _ = next_start => {}
            }
        }
        let Some(delay) = delay else {
            cancel.cancelled().await;
            return Err(ProviderError::Cancelled);
        };
        tokio::select! {
            _ = cancel.cancelled() => Err(ProviderError::Cancelled),
            _ = tokio::time::sleep(Duration::from_millis(delay)) => Ok(ChatResponse {
                content: Some(format!("{name}!")),
                ..ChatResponse::default()
            }),
        }
    }
}

fn prompt(title: &str, body: &str) -> Arc<pf_syntax::Prompt> {
    let text = format!(
        "---\nname: t\ndescription: test\npromptforge: 0\nmodels:\n  w: {{}}\n---\n\n# {title}\n\n```lua shared\nmodels.default('w')\n```\n\n{body}"
    );
    match pf_syntax::parse(text.as_bytes()) {
        Ok(p) => Arc::new(p),
        Err(e) => panic!("test prompt must parse: {e:?}"),
    }
}

/// A liveness guard, not a speed assertion: far beyond any honest run, it
/// turns a hang (e.g. rounds that wait on a rendezvous run one at a time)
/// into a clear failure.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// When a test's host cancels its run, from another thread.
#[allow(dead_code)] // not every test binary cancels on prompts
#[derive(Clone, Copy)]
pub enum CancelWhen {
    Never,
    After(Duration),
    /// Once the model has been sent this many prompts (however slow the build).
    Prompts(usize),
}

/// Run `body` with `model`; `cancel_after` cancels the run from another
/// thread. Panics with "hung" if the run does not end within [`HANG_GUARD`].
pub fn run(
    title: &str,
    body: &str,
    model: Arc<SlowModel>,
    cancel_after: Option<Duration>,
) -> Outcome {
    let when = cancel_after.map_or(CancelWhen::Never, CancelWhen::After);
    run_cancelled(title, body, model, when)
}

/// [`run`], cancelled `when`.
#[allow(dead_code)] // not every test binary cancels on prompts
pub fn run_cancelled(title: &str, body: &str, model: Arc<SlowModel>, when: CancelWhen) -> Outcome {
    let (title, body) = (title.to_string(), body.to_string());
    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(run_to_end(&title, &body, model, when));
    });
    match outcome.recv_timeout(HANG_GUARD) {
        Ok(outcome) => outcome,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("the run hung: no outcome after {HANG_GUARD:?}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("the run panicked before it ended")
        }
    }
}

fn run_to_end(title: &str, body: &str, model: Arc<SlowModel>, when: CancelWhen) -> Outcome {
    let store = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let cancel = CancellationToken::new();
    let setup = RunSetup {
        seed: 3,
        start_ms: 0,
        args: String::new(),
        store_dir: store.path().to_path_buf(),
        harness: Harness::new(),
        model: Some(Arc::clone(&model) as Arc<dyn pf_harness::ModelProvider>),
        catalog: Vec::new(),
        cancel: cancel.clone(),
        ui: None,
        observer: None,
        capture: false,
        limits: Default::default(),
    };
    match when {
        CancelWhen::Never => {}
        CancelWhen::After(delay) => {
            std::thread::spawn(move || {
                std::thread::sleep(delay);
                cancel.cancel();
            });
        }
        CancelWhen::Prompts(n) => {
            let model = Arc::clone(&model);
            std::thread::spawn(move || {
                while model.prompts().len() < n {
                    std::thread::sleep(Duration::from_millis(10));
                }
                cancel.cancel();
            });
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    rt.block_on(pf_engine::run(prompt(title, body), setup))
        .outcome
}
