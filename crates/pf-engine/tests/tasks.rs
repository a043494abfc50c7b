//! Tasks (guide ch. 15) with a model whose replies take real time, so tasks
//! really wait on host work beside their owner and end out of spawn order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pf_engine::{Outcome, RunSetup};
use pf_harness::{
    CancellationToken, ChatRequest, ChatResponse, Harness, ModelInfo, ModelProvider, ProviderError,
    ThinkingSupport,
};

/// A model that answers each prompt `NAME:MILLIS` with `NAME!` after MILLIS
/// milliseconds, and never answers a prompt without a delay. It counts the
/// rounds in flight and keeps the most it ever saw at once.
#[derive(Default)]
struct SlowModel {
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    prompts: Mutex<Vec<String>>,
}

impl SlowModel {
    fn prompts(&self) -> Vec<String> {
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
        let (name, delay) = match prompt.split_once(':') {
            Some((name, millis)) => (name.to_string(), millis.parse::<u64>().ok()),
            None => (prompt.clone(), None),
        };
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

fn prompt(body: &str) -> Arc<pf_syntax::Prompt> {
    let text = format!(
        "---\nname: t\ndescription: test\npromptforge: 0\nmodels:\n  w: {{}}\n---\n\n# Tasks\n\n```lua shared\nmodels.default('w')\n```\n\n{body}"
    );
    match pf_syntax::parse(text.as_bytes()) {
        Ok(p) => Arc::new(p),
        Err(e) => panic!("test prompt must parse: {e:?}"),
    }
}

/// Run `body` with `model`; `cancel_after` cancels the run from another thread.
fn run(body: &str, model: Arc<SlowModel>, cancel_after: Option<Duration>) -> Outcome {
    let store = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let cancel = CancellationToken::new();
    let setup = RunSetup {
        seed: 3,
        start_ms: 0,
        args: String::new(),
        store_dir: store.path().to_path_buf(),
        harness: Harness::new(),
        model: Some(model),
        cancel: cancel.clone(),
        ui: None,
        live: None,
    };
    if let Some(delay) = cancel_after {
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            cancel.cancel();
        });
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    rt.block_on(pf_engine::run(prompt(body), setup)).outcome
}

/// A task section that asks the model for its own argument string.
const JOB: &str = "### Job\n\n```lua\nreturn models.infer(args)\n```\n";

#[test]
fn tasks_wait_on_host_work_at_once_and_the_first_to_end_is_delivered_first() {
    let model = Arc::new(SlowModel::default());
    let body = format!(
        "## Main\n\n```lua\nlocal slow = tasks.spawn('### Job', {{ input = 'slow:400' }})\nlocal quick = tasks.spawn('### Job', {{ input = 'quick:100' }})\nlocal first, ok, r = tasks.when_any({{ slow, quick }})\nlocal _, _, r2 = tasks.when_any({{ slow }})\nreturn first.task .. ' ' .. r .. ' ' .. r2\n```\n\n{JOB}"
    );
    let started = Instant::now();
    let outcome = run(&body, Arc::clone(&model), None);
    assert_eq!(outcome, Outcome::Completed("0.1 quick! slow!".into()));
    assert_eq!(model.most_in_flight.load(Ordering::SeqCst), 2);
    // Both rounds were in flight together: one after the other takes 500 ms.
    assert!(started.elapsed() < Duration::from_millis(490));
    assert_eq!(model.prompts(), ["slow:400", "quick:100"]);
}

#[test]
fn a_cancelled_task_drops_its_model_round_and_the_owner_goes_on() {
    let model = Arc::new(SlowModel::default());
    // `never` is never answered: only the cancel ends that task.
    let body = format!(
        "## Main\n\n```lua\nlocal t = tasks.spawn('### Job', {{ input = 'never' }})\nlocal quick = tasks.spawn('### Job', {{ input = 'q:50' }})\ntasks.when_any({{ quick }})\ntasks.cancel(t)\nlocal _, ok, err = tasks.when_any({{ t }})\nreturn tostring(ok) .. ' ' .. err.kind .. ' ' .. #tasks.pending()\n```\n\n{JOB}"
    );
    let outcome = run(&body, Arc::clone(&model), None);
    assert_eq!(outcome, Outcome::Completed("false cancelled 0".into()));
    assert_eq!(model.in_flight.load(Ordering::SeqCst), 0);
}

#[test]
fn a_host_cancel_ends_the_run_while_the_owner_waits_on_a_task() {
    let model = Arc::new(SlowModel::default());
    let body = format!(
        "## Main\n\n```lua\nlocal t = tasks.spawn('### Job', {{ input = 'never' }})\npcall(tasks.when_all, {{ t }})\nreturn 'kept going'\n```\n\n{JOB}"
    );
    let started = Instant::now();
    let outcome = run(&body, Arc::clone(&model), Some(Duration::from_millis(150)));
    assert_eq!(outcome, Outcome::Cancelled);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(model.in_flight.load(Ordering::SeqCst), 0);
}

#[test]
fn a_timed_wait_returns_nil_and_leaves_the_task_running() {
    let model = Arc::new(SlowModel::default());
    let body = format!(
        "## Main\n\n```lua\nlocal t = tasks.spawn('### Job', {{ input = 'late:300' }})\nlocal first = tasks.when_any({{ t }}, {{ timeout = 0.05 }})\nlocal s = tasks.status(t).state\nlocal _, _, r = tasks.when_any({{ t }})\nreturn tostring(first) .. ' ' .. s .. ' ' .. r\n```\n\n{JOB}"
    );
    let outcome = run(&body, Arc::clone(&model), None);
    assert_eq!(outcome, Outcome::Completed("nil running late!".into()));
}
