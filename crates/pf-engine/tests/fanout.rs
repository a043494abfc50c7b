//! `fanout` concurrency and cancellation (guide ch. 14 "Concurrency" and "Arm
//! failures"), driven by a model whose replies take real time, so arms really
//! wait on host work at once and finish out of collection order.

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
        "---\nname: t\ndescription: test\npromptforge: 0\nmodels:\n  w: {{}}\n---\n\n# Fanout\n\n```lua shared\nmodels.default('w')\n```\n\n{body}"
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

const WORKER: &str = "### Worker\n\n```lua\nreturn models.infer(item)\n```\n";

#[test]
fn arms_waiting_on_slow_host_work_all_complete_in_collection_order() {
    let model = Arc::new(SlowModel::default());
    // Later members answer sooner, so the arms finish in reverse order.
    let body = format!(
        "## Main\n\n```lua\nlocal r = fanout('### Worker', {{'a:400', 'b:300', 'c:200', 'd:100'}})\nreturn table.concat(r, ',')\n```\n\n{WORKER}"
    );
    let started = Instant::now();
    let outcome = run(&body, Arc::clone(&model), None);
    assert_eq!(outcome, Outcome::Completed("a!,b!,c!,d!".into()));
    // All four waited at once: one after another would take a full second.
    assert!(started.elapsed() < Duration::from_millis(900));
    assert_eq!(model.most_in_flight.load(Ordering::SeqCst), 4);
    assert_eq!(model.prompts(), ["a:400", "b:300", "c:200", "d:100"]);
}

#[test]
fn no_more_than_eight_arms_are_live_and_the_cap_refills() {
    let model = Arc::new(SlowModel::default());
    // The first arm is the slowest: the ninth starts as soon as any other
    // finishes, not only when the first one does.
    let body = format!(
        "## Main\n\n```lua\nlocal items = {{'m1:600'}}\nfor i = 2, 10 do items[i] = 'm' .. i .. ':50' end\nlocal r = fanout('### Worker', items)\nreturn #r .. ' ' .. r[1].text .. ' ' .. r[10].text\n```\n\n{WORKER}"
    );
    let started = Instant::now();
    let outcome = run(&body, Arc::clone(&model), None);
    assert_eq!(outcome, Outcome::Completed("10 m1! m10!".into()));
    assert_eq!(model.most_in_flight.load(Ordering::SeqCst), 8);
    // The ninth and tenth ran beside the slow first arm.
    assert!(started.elapsed() < Duration::from_millis(1100));
    let prompts = model.prompts();
    assert_eq!(prompts.len(), 10);
    assert_eq!(prompts.first().map(String::as_str), Some("m1:600"));
}

#[test]
fn a_host_cancel_ends_the_run_while_arms_wait() {
    let model = Arc::new(SlowModel::default());
    // Prompts without a delay are never answered.
    let body = format!(
        "## Main\n\n```lua\nlocal ok = pcall(fanout, '### Worker', {{'x', 'y', 'z'}})\nreturn 'kept going'\n```\n\n{WORKER}"
    );
    let started = Instant::now();
    let outcome = run(&body, Arc::clone(&model), Some(Duration::from_millis(200)));
    assert_eq!(outcome, Outcome::Cancelled);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(model.prompts(), ["x", "y", "z"]);
    assert_eq!(model.in_flight.load(Ordering::SeqCst), 0);
}

#[test]
fn a_failing_arm_cancels_its_waiting_siblings_and_frees_their_claims() {
    let model = Arc::new(SlowModel::default());
    // `hang` claims a path, then waits on a reply that never comes; `boom`
    // fails after a short wait. The caller goes on at once and may write the
    // hanging arm's path: the cancelled arm's claims went with it.
    let body = "## Main\n\n```lua\nlocal ok, err = pcall(fanout, '### Worker', {'hang', 'boom'})\nstore.write('taken.txt', 'caller')\nreturn tostring(ok) .. ' ' .. err.kind .. ' ' .. store.read('taken.txt')\n```\n\n### Worker\n\n```lua\nif item == 'hang' then\n  store.write('taken.txt', 'arm')\n  return models.infer('hang')\nend\nmodels.infer('boom:50')\nerror({})\n```\n";
    let started = Instant::now();
    let outcome = run(body, Arc::clone(&model), None);
    assert_eq!(outcome, Outcome::Completed("false lua caller".into()));
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(model.in_flight.load(Ordering::SeqCst), 0);
}
