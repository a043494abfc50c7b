//! The run's task table: every task's record, kept for the whole run.
//!
//! A leaf: it knows task records and their states, not chains or section VMs,
//! so the run state in `ctx` can hold it without importing the `tasks` namespace.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::Waker;

use crate::error::HostError;

/// Who started a task: block code (`tasks.spawn`) or a model (the `task` tool).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskOrigin {
    Author,
    Model,
}

impl TaskOrigin {
    const NAMES: [(TaskOrigin, &'static str); 2] =
        [(TaskOrigin::Author, "author"), (TaskOrigin::Model, "model")];

    /// The origin's name, as `tasks.status` and the `pending` filter spell it.
    pub fn as_str(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(origin, _)| *origin == self)
            .map_or("author", |(_, name)| name)
    }

    /// The origin a filter names, if any.
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(origin, _)| *origin)
    }
}

/// What a task's own chain waits on (`blocked` in `tasks.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blocked {
    /// A model round.
    Chat,
    /// A wait on other tasks.
    Tasks,
    /// A called chain.
    Call,
    /// A store operation.
    Store,
    /// A bound tool call.
    ToolCall,
    /// Operator input.
    UserInput,
}

impl Blocked {
    /// The state's name, as `tasks.status` and the model's status line show it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Blocked::Chat => "chat",
            Blocked::Tasks => "tasks",
            Blocked::Call => "call",
            Blocked::Store => "store",
            Blocked::ToolCall => "tool_call",
            Blocked::UserInput => "user_input",
        }
    }
}

pub(crate) type TaskFuture = Pin<Box<dyn Future<Output = ()>>>;

/// How a task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Running,
    Done,
    Cancelled,
    Abandoned,
}

impl State {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Done => "done",
            State::Cancelled => "cancelled",
            State::Abandoned => "abandoned",
        }
    }
}

/// One task's record; it lasts for the whole run.
pub(crate) struct TaskEntry {
    /// The id of the chain that spawned it (only that chain may use it).
    pub(crate) owner: String,
    pub(crate) origin: TaskOrigin,
    pub(crate) target: String,
    pub(crate) depth: u32,
    pub(crate) state: State,
    /// The section's result or failure, once it has ended as `Done`.
    pub(crate) result: Option<Result<String, HostError>>,
    pub(crate) delivered: bool,
    pub(crate) note: Option<String>,
    pub(crate) future: Option<TaskFuture>,
    /// For a model task, the section entry whose model started it.
    pub(crate) owner_section: String,
    /// The owner section's heading and the task its chain runs inside: where
    /// the model task's notices are reported.
    pub(crate) owner_label: String,
    pub(crate) owner_task: String,
    /// When the task ended, in the run's end order (notices arrive in it).
    pub(crate) ended_seq: Option<u64>,
    /// The model task's notice, queued when it ended and not yet taken.
    pub(crate) notice: Option<String>,
    /// The section the task's own chain is in now (`section` in its status).
    pub(crate) section: Option<String>,
    /// What the task's own chain waits on now (`blocked` in its status).
    pub(crate) blocked: Option<Blocked>,
}

/// A task id as its numeric components, so ids order in spawn order (`0.9` before `0.10`).
pub(crate) type TaskKey = Vec<u32>;

/// Every task of the run, and the wakers of the waits parked on them.
#[derive(Default)]
pub(crate) struct TaskTable {
    pub(crate) entries: BTreeMap<TaskKey, TaskEntry>,
    pub(crate) waiters: Vec<Waker>,
    pub(crate) ends: u64,
}

pub(crate) fn key_text(key: &[u32]) -> String {
    key.iter().map(u32::to_string).collect::<Vec<_>>().join(".")
}

pub(crate) fn parse_key(text: &str) -> Option<TaskKey> {
    text.split('.')
        .map(|part| {
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            part.parse::<u32>().ok()
        })
        .collect()
}

impl TaskTable {
    /// Record that the task behind `key` ended now.
    pub(crate) fn mark_ended(&mut self, key: &TaskKey) {
        let seq = self.ends;
        self.ends += 1;
        if let Some(entry) = self.entries.get_mut(key) {
            entry.ended_seq.get_or_insert(seq);
        }
    }

    pub(crate) fn wake_waiters(&mut self) {
        for waker in self.waiters.drain(..) {
            waker.wake();
        }
    }

    /// The ids of the live tasks `owner` spawned, in spawn order: running, or
    /// ended with a result no wait has taken yet.
    pub(crate) fn live_owned(&self, owner: &str, origin: Option<TaskOrigin>) -> Vec<String> {
        self.entries
            .iter()
            .filter(|(_, e)| {
                e.owner == owner
                    && (e.state == State::Running || (e.state == State::Done && !e.delivered))
            })
            .filter(|(_, e)| origin.is_none_or(|o| e.origin == o))
            .map(|(k, _)| key_text(k))
            .collect()
    }

    /// The running tasks `owner` spawned, in spawn order.
    pub(crate) fn running_owned(&self, owner: &str) -> Vec<TaskKey> {
        self.entries
            .iter()
            .filter(|(_, e)| e.owner == owner && e.state == State::Running)
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// Why a live task was ended along with its owner (`task_abandoned.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AbandonReason {
    OwnerReturned,
    OwnerFailed,
    ToolLoopExhausted,
    OwnerAborted,
    RunTerminated,
}

impl AbandonReason {
    /// The reason's name in `task_abandoned`.
    pub fn as_str(self) -> &'static str {
        match self {
            AbandonReason::OwnerReturned => "owner_returned",
            AbandonReason::OwnerFailed => "owner_failed",
            AbandonReason::ToolLoopExhausted => "tool_loop_exhausted",
            AbandonReason::OwnerAborted => "owner_aborted",
            AbandonReason::RunTerminated => "run_terminated",
        }
    }

    /// The phrase the abandoned notice ends with (only ever in notice text).
    pub(crate) fn phrase(self) -> &'static str {
        match self {
            AbandonReason::OwnerReturned => "the section ended",
            AbandonReason::OwnerFailed => "the owner failed",
            AbandonReason::ToolLoopExhausted => "the tool loop was exhausted",
            AbandonReason::OwnerAborted => "the owner was aborted",
            AbandonReason::RunTerminated => "the run ended",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_parse_as_dot_separated_numbers_and_order_numerically() {
        assert_eq!(parse_key("0.10"), Some(vec![0, 10]));
        assert_eq!(parse_key("0..1"), None);
        assert_eq!(parse_key("0.-1"), None);
        assert_eq!(parse_key("nope"), None);
        assert_eq!(parse_key("4294967296"), None);
        assert!(parse_key("0.9") < parse_key("0.10"));
        assert_eq!(key_text(&[0, 2, 1]), "0.2.1");
    }
}
