//! What a Host hands the Engine for one run and what it gets back.

use std::path::PathBuf;
use std::sync::Arc;

use pf_harness::{CancellationToken, Harness, ModelProvider};

use crate::error::RunError;
use crate::events::RunObserver;
use crate::memory::DEFAULT_RUN_MEMORY;

/// A checkpoint recorded by `log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub section: String,
    pub message: String,
}

/// Everything the Host supplies for one run.
pub struct RunSetup {
    pub seed: u64,
    /// The run's start instant, in milliseconds since the Unix epoch.
    pub start_ms: i64,
    /// The run's argument string.
    pub args: String,
    pub store_dir: PathBuf,
    pub harness: Harness,
    /// The current model: every role binds to it (guide ch. 10).
    pub model: Option<Arc<dyn ModelProvider>>,
    /// The Host's catalog models, by their `info().id`: with a `ui` snapshot,
    /// a `models.get(id)` handle for one of them runs its rounds on it (ch. 10
    /// "Model ids from the host"); an id not listed runs on the current model.
    pub catalog: Vec<Arc<dyn ModelProvider>>,
    pub cancel: CancellationToken,
    /// The host-state snapshot for `ui()`, when the Host has one.
    pub ui: Option<serde_json::Value>,
    /// The Host's observer: hears every event as it happens, and live output
    /// when it asks for it ([`RunObserver::wants_live_text`]).
    pub observer: Option<Arc<dyn RunObserver>>,
    /// Debug capture: when true, each model round also reports `request` and
    /// `response` events with the bodies exchanged (guide ch. 16).
    pub capture: bool,
    /// The limits the Host sets for this run.
    pub limits: RunLimits,
}

/// Limits the Host sets (guide ch. 17 "Limits at a glance"); the defaults are the guide's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    /// The run-wide memory budget, in bytes: the Lua heaps of every VM the run
    /// holds at once (section VMs, `call` chains, fanout arms, tasks) together.
    /// Past it an allocation fails with Lua's `not enough memory`, as past a
    /// VM's own ceiling.
    pub memory_budget: usize,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            memory_budget: DEFAULT_RUN_MEMORY,
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Completed(String),
    Failed(RunError),
    Cancelled,
}

/// How many checkpoints a [`RunReport`] keeps, the first ones (each is an
/// event of kind `lua` as well, which the run log keeps however many).
pub const REPORTED_CHECKPOINTS: usize = 4096;

/// The outcome with what the run recorded.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub outcome: Outcome,
    pub execution: String,
    /// The run's first [`REPORTED_CHECKPOINTS`] checkpoints.
    pub checkpoints: Vec<Checkpoint>,
}
