//! One tool call is one run: admission (a bounded number at once, a bounded
//! queue behind them), the run on a thread of its own (Lua is not `Send`, so
//! each run gets a current-thread runtime), and its report as the call's result.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use pf_engine::{Outcome, RunObserver, RunSetup};
use pf_harness::{CancellationToken, InputBroker};
use rmcp::model::{CallToolResult, ContentBlock};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::catalog::PromptTool;
use crate::host::HostConfig;
use crate::report::{ReportOutcome, RunReport};

/// How many runs go at once, and how many calls may wait for a slot.
pub struct Admission {
    slots: Arc<Semaphore>,
    max_concurrent: usize,
    waiting: AtomicUsize,
    queue: usize,
}

/// Why a call got no run slot.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    QueueFull { running: usize, queue: usize },
    Cancelled,
}

impl Admission {
    pub fn new(max_concurrent: usize, queue: usize) -> Self {
        let max_concurrent = max_concurrent.max(1);
        Admission {
            slots: Arc::new(Semaphore::new(max_concurrent)),
            max_concurrent,
            waiting: AtomicUsize::new(0),
            queue,
        }
    }

    /// A run slot: at once if one is free, else after waiting in the queue;
    /// refused when the queue is full or the call is cancelled while waiting.
    pub async fn admit(&self, cancel: &CancellationToken) -> Result<OwnedSemaphorePermit, Refused> {
        if let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() {
            return Ok(permit);
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.queue {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Refused::QueueFull {
                running: self.max_concurrent,
                queue: self.queue,
            });
        }
        let permit = tokio::select! {
            permit = Arc::clone(&self.slots).acquire_owned() => permit.map_err(|_| Refused::Cancelled),
            _ = cancel.cancelled() => Err(Refused::Cancelled),
        };
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        permit
    }

    /// Wait until every run has given its slot back (at shutdown).
    pub async fn drain(&self) {
        let all = u32::try_from(self.max_concurrent).unwrap_or(u32::MAX);
        let _ = self.slots.acquire_many(all).await;
    }
}

/// Where stores go: `--store DIR` for every call, else a fresh private
/// directory per call under one folder of this server's own.
#[derive(Debug, Clone)]
pub enum StorePlace {
    Shared(PathBuf),
    FreshUnder(PathBuf),
}

static STORE_COUNT: AtomicU64 = AtomicU64::new(0);

impl StorePlace {
    fn for_call(&self, execution: &str) -> Result<PathBuf, String> {
        match self {
            StorePlace::Shared(dir) => Ok(dir.clone()),
            StorePlace::FreshUnder(root) => {
                let n = STORE_COUNT.fetch_add(1, Ordering::SeqCst);
                let dir = root.join(format!("{execution}-{n}"));
                private_dir(&dir)?;
                Ok(dir)
            }
        }
    }
}

/// Create `dir` readable by this user only.
pub fn private_dir(dir: &std::path::Path) -> Result<(), String> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder
        .create(dir)
        .map_err(|e| format!("cannot create the store {}: {e}", dir.display()))
}

/// What a call needs besides the prompt and its arguments.
pub struct CallSetup {
    pub host: Arc<HostConfig>,
    pub store: StorePlace,
    pub cancel: CancellationToken,
    pub observer: Option<Arc<dyn RunObserver>>,
    /// Answers `input.ask` unless the host file fixes the answers.
    pub broker: Arc<dyn InputBroker>,
}

/// Run the prompt on a thread of its own and wait for its report. The slot
/// is held until the run has really ended, even if the caller stops waiting.
pub async fn run_prompt(
    tool: Arc<PromptTool>,
    args: String,
    setup: CallSetup,
    permit: OwnedSemaphorePermit,
) -> RunReport {
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let thread_name = format!("run-{}", tool.name);
    let spawned = std::thread::Builder::new()
        .name(thread_name)
        .spawn(move || {
            let report = run_on_this_thread(&tool, args, setup);
            drop(permit);
            let _ = sender.send(report);
        });
    if let Err(e) = spawned {
        return host_failure(format!("cannot start a thread for the run: {e}"));
    }
    receiver
        .await
        .unwrap_or_else(|_| host_failure("the run ended without a report".to_string()))
}

fn run_on_this_thread(tool: &PromptTool, args: String, setup: CallSetup) -> RunReport {
    let seed: u64 = rand::random();
    let (execution, _) = pf_engine::seeded_names(seed);
    let store_dir = match setup.store.for_call(&execution) {
        Ok(dir) => dir,
        Err(m) => return host_failure(m),
    };
    crate::commands::run::place_input(&tool.prompt, &tool.file, &store_dir, true);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return host_failure(format!("cannot start the async runtime: {e}")),
    };
    let prompt = Arc::clone(&tool.prompt);
    let began = std::time::Instant::now();
    let current = match setup
        .host
        .current_id(crate::host::chosen_model(None).as_deref())
    {
        Ok(id) => id,
        Err(m) => return host_failure(m),
    };
    // Every call is a run of its own in the run log, like `promptforge run`.
    let start_ms = now_ms();
    let absolute = |path: &std::path::Path| {
        std::path::absolute(path)
            .unwrap_or_else(|_| path.to_path_buf())
            .to_string_lossy()
            .into_owned()
    };
    let sink = crate::host::data::begin_run_log(pf_runlog::RunStart {
        execution: execution.clone(),
        prompt_path: absolute(&tool.file),
        prompt_text: crate::commands::read_prompt(&tool.file)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default(),
        args: serde_json::Value::String(args.clone()),
        seed,
        start_rfc3339: pf_engine::format_when(start_ms),
        start_ms,
        host_file: None,
        model: current.clone(),
        store_dir: Some(absolute(&store_dir)),
        replay_of: None,
        resumed_from: None,
    });
    let sections = Arc::new(crate::host::observe::SectionTracker::default());
    let work = match &sink {
        Some(sink) => crate::host::HostWork::Recorded(Arc::new(
            crate::host::record::Recorder::new(Arc::clone(sink), Arc::clone(&sections), &prompt),
        )),
        None => crate::host::HostWork::Direct,
    };
    let logging = crate::host::observe::HostObserver::new(sink.clone(), None, sections)
        .with_prompt_file(&tool.file)
        .streaming(setup.host.stream);
    let observer: Arc<dyn RunObserver> = match setup.observer {
        Some(progress) => Arc::new(BothObservers(Arc::new(logging), progress)),
        None => Arc::new(logging),
    };
    let finished = runtime.block_on(async {
        let mut host = setup.host.assemble_for(current.as_deref(), &work)?;
        // Stdin is the MCP transport (or nobody's): the operator is the client.
        if setup.host.answers.is_none() {
            host.harness.services.input_broker = Some(setup.broker);
        }
        let run_setup = RunSetup {
            seed,
            start_ms,
            args,
            store_dir: store_dir.clone(),
            harness: host.harness,
            model: host.model,
            catalog: host.catalog,
            cancel: setup.cancel,
            ui: host.ui,
            observer: Some(observer),
            capture: false,
            limits: host.limits,
        };
        Ok::<_, String>(pf_engine::run(Arc::clone(&prompt), run_setup).await)
    });
    drop(work);
    let duration = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
    let report = match finished {
        Ok(finished) => {
            let mut report = RunReport::of_run(seed, &finished, &store_dir);
            if matches!(finished.outcome, Outcome::Completed(_)) {
                report.output = crate::commands::run::collect_output(&prompt, &store_dir, true);
            }
            report
        }
        Err(m) => host_failure(m),
    };
    if let Some(sink) = &sink {
        sink.finish(logged_outcome(&report), duration);
        // The client may read the run log as soon as it has the report.
        sink.committed();
    }
    report
}

/// The run log's outcome for a call's report.
fn logged_outcome(report: &RunReport) -> pf_runlog::Outcome {
    match &report.outcome {
        ReportOutcome::Completed { result } => pf_runlog::Outcome::Completed {
            result: result.clone(),
        },
        ReportOutcome::Failed { error } => pf_runlog::Outcome::Failed {
            kind: error.kind.clone(),
            message: error.message.clone(),
        },
        ReportOutcome::Cancelled => pf_runlog::Outcome::Cancelled,
    }
}

/// A call's run is observed twice: by the run log and by the client's progress.
struct BothObservers(Arc<dyn RunObserver>, Arc<dyn RunObserver>);

impl RunObserver for BothObservers {
    fn event(&self, execution: &str, event: &pf_engine::RunEvent) {
        self.0.event(execution, event);
        self.1.event(execution, event);
    }

    fn tool_call(&self, execution: &str, call: &pf_engine::ToolCallNotice<'_>) {
        self.0.tool_call(execution, call);
    }

    fn wants_kept(&self) -> bool {
        self.0.wants_kept() || self.1.wants_kept()
    }

    fn kept(&self, execution: &str, event: pf_engine::SharedEvent) {
        if self.0.wants_kept() {
            self.0.kept(execution, event.clone());
        }
        if self.1.wants_kept() {
            self.1.kept(execution, event);
        }
    }

    fn lua_traceback(&self, execution: &str, trace: &pf_engine::LuaTraceback<'_>) {
        self.0.lua_traceback(execution, trace);
    }

    // The host file's `stream = true` reaches the Engine through the log's observer.
    fn wants_live_text(&self) -> bool {
        self.0.wants_live_text() || self.1.wants_live_text()
    }
}

/// A call the Host could not run at all (the host file's Plugins or model
/// could not be assembled, no thread): a failed report of kind `Host`.
pub fn host_failure(message: String) -> RunReport {
    RunReport {
        outcome: ReportOutcome::Failed {
            error: crate::report::ReportError {
                kind: "Host".to_string(),
                phase: None,
                message,
                line: None,
                column: None,
            },
        },
        seed: None,
        execution: None,
        store: None,
        output: None,
        usage: None,
    }
}

/// The call's result: the run's result as text, or `isError` with the error
/// kind and message; the report itself as `structuredContent`.
pub fn call_result(report: &RunReport) -> CallToolResult {
    let structured = serde_json::to_value(report).ok();
    let (text, is_error) = match &report.outcome {
        ReportOutcome::Completed { result } => (result.clone(), false),
        ReportOutcome::Failed { error } => {
            (format!("error[{}]: {}", error.kind, error.message), true)
        }
        ReportOutcome::Cancelled => ("cancelled".to_string(), true),
    };
    let mut result = if is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    result.structured_content = structured;
    result
}

/// An error result that is not a run (unknown tool, full queue).
pub fn refusal(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_queue_refuses_and_a_freed_slot_admits() {
        let admission = Arc::new(Admission::new(1, 1));
        let cancel = CancellationToken::new();
        let first = admission.admit(&cancel).await.expect("a free slot");
        let waiter = {
            let admission = Arc::clone(&admission);
            let cancel = cancel.clone();
            tokio::spawn(async move { admission.admit(&cancel).await.is_ok() })
        };
        // The waiter is queued once it has counted itself; yield until it has.
        while admission.waiting.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            admission.admit(&cancel).await.err(),
            Some(Refused::QueueFull {
                running: 1,
                queue: 1
            })
        );
        drop(first);
        assert!(waiter.await.expect("waiter joins"));
    }

    #[tokio::test]
    async fn a_cancelled_wait_gives_up_its_place() {
        let admission = Admission::new(1, 4);
        let _held = admission
            .admit(&CancellationToken::new())
            .await
            .expect("slot");
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert_eq!(
            admission.admit(&cancel).await.err(),
            Some(Refused::Cancelled)
        );
        assert_eq!(admission.waiting.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn results_carry_text_error_and_report() {
        let failed = host_failure("no model".into());
        let result = call_result(&failed);
        assert_eq!(result.is_error, Some(true));
        assert_eq!(
            result.structured_content,
            Some(
                serde_json::json!({"outcome": "failed", "error": {"kind": "Host", "message": "no model"}})
            )
        );
    }
}
