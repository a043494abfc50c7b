//! One tool call is one run: admission (a bounded number at once, a bounded
//! queue behind them), the run on a thread of its own (Lua is not `Send`, so
//! each run gets a current-thread runtime), and its report as the call's result.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use pf_engine::RunObserver;
use pf_harness::{CancellationToken, InputBroker};
use rmcp::model::{CallToolResult, ContentBlock};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::catalog::PromptTool;
use pf_host::report::{ReportOutcome, RunReport};
use pf_host::session::{PlanArgs, RunPlan, RunSession, RunSettings, SettingsFlags, UsageError};
use pf_host::HostConfig;

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
    let seed = pf_host::session::random_seed();
    let (execution, _) = pf_engine::seeded_names(seed);
    let store_dir = match setup.store.for_call(&execution) {
        Ok(dir) => dir,
        Err(m) => return host_failure(m),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return host_failure(format!("cannot start the async runtime: {e}")),
    };
    // The model `PROMPTFORGE_MODEL` or the host file chooses; the host file's
    // `[telemetry] otlp` exports every call's run, as `promptforge run` does.
    let settings = match RunSettings::with_host(None, setup.host, &SettingsFlags::default()) {
        Ok(settings) => settings,
        Err(m) => return host_failure(m),
    };
    // Every call is a run of its own in the run log, like `promptforge run`.
    let session = RunSession::begin(RunPlan {
        file: tool.file.clone(),
        source: pf_host::prompt_files::read_prompt(&tool.file).unwrap_or_default(),
        parsed: Some(Arc::clone(&tool.prompt)),
        args: PlanArgs::Exact(args),
        seed,
        start_ms: now_ms(),
        settings,
        store_dir: Some(store_dir),
        no_log: false,
        capture: false,
        quiet: true,
        replay_of: None,
        resumed_from: None,
        batch: None,
        input_index: None,
        replay: None,
        cancel: setup.cancel,
        watchers: setup.observer.into_iter().collect(),
        // Stdin is the MCP transport (or nobody's): the operator is the client.
        input_broker: Some(setup.broker),
        after_engine: None,
    });
    let finished = match session {
        Ok(session) => runtime.block_on(session.run()),
        Err(e) => Err(e),
    };
    match finished {
        Ok(finished) => {
            // The client may read the run log as soon as it has the report.
            finished.committed();
            runtime.block_on(finished.export());
            finished.report
        }
        Err(UsageError(m)) => host_failure(m),
    }
}

/// A call the Host could not run at all (the host file's Plugins or model
/// could not be assembled, no thread): a failed report of kind `Host`.
pub fn host_failure(message: String) -> RunReport {
    RunReport {
        outcome: ReportOutcome::Failed {
            error: pf_host::report::ReportError {
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
