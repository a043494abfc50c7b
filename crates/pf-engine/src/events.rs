//! The run's event stream (guide ch. 16) and live output (guide ch. 11, "Turns
//! and live output").
//!
//! Every event names its kind, the section it is filed under, and its
//! provenance: the reporting task (always the main walk, `0`, until tasks exist)
//! and a sequence number. One counter per task numbers both the host work the
//! task asks for (model calls, store operations, bound tool calls, input waits)
//! and the events it reports, so event numbers skip where host work took one.
//!
//! Events say that something happened, never everything about it: no `_failed`
//! event holds a message, and no event holds prompt text or a credential.

use std::collections::HashMap;
use std::sync::Arc;

mod spool;

use pf_harness::WorkId;
use serde_json::{json, Map, Value as Json};

/// The id of the main walk's task.
pub const MAIN_TASK: &str = "0";

pub use crate::event::{Event, EventKind};

/// Which task reported an event, and where it falls in that task's count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    pub task: String,
    pub seq: u32,
}

/// One report the run made as it worked.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEvent {
    /// The kind and its own fields.
    pub event: Event,
    /// The heading text of the section that reported it (the H1 title for the H1 pass).
    pub section: String,
    pub provenance: Provenance,
}

impl RunEvent {
    pub fn kind(&self) -> EventKind {
        self.event.kind()
    }

    /// The round count the event carries, for the kinds that carry one.
    pub fn turn(&self) -> Option<u32> {
        self.event.turn()
    }

    /// The run-log line: `kind`, `execution`, `section`, `provenance`, then the kind's fields.
    pub fn to_json(&self, execution: &str) -> Json {
        let mut line = Map::new();
        line.insert("kind".into(), Json::String(self.kind().as_str().into()));
        line.insert("execution".into(), Json::String(execution.into()));
        line.insert("section".into(), Json::String(self.section.clone()));
        line.insert(
            "provenance".into(),
            json!({"task": self.provenance.task, "seq": self.provenance.seq}),
        );
        line.extend(self.event.fields());
        Json::Object(line)
    }
}

/// One fragment of a loop round's reply text, as the Host's live output receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveText<'a> {
    /// The section running the loop.
    pub section: &'a str,
    /// The number the round gets when it completes (a failed round's number is reused).
    pub turn: u32,
    pub text: &'a str,
}

/// A tool call as the Engine dispatches it, before it runs. Not an event of
/// ch. 16 (events carry no arguments): the Host's debug log and prompt tests
/// read it, so a script's `tools.call` is seen with its arguments too.
#[derive(Debug, Clone, Copy)]
pub struct ToolCallNotice<'a> {
    /// The task making the call and the section it is in.
    pub task: &'a str,
    pub section: &'a str,
    pub alias: &'a str,
    pub arguments: &'a Json,
    /// The model's call id; `None` for a script's `tools.call`.
    pub call_id: Option<&'a str>,
}

/// A model round's answer as it arrived, for the Host's telemetry: what the
/// provider said the round cost. Not an event of ch. 16: only a text reply's
/// `assistant_reply` carries metrics, and a round that ends in tool calls
/// costs tokens too, so the Host counts every round from this. Told right
/// after the round's `model_turn_completed`.
#[derive(Debug, Clone, Copy)]
pub struct RoundNotice<'a> {
    pub task: &'a str,
    pub section: &'a str,
    pub turn: u32,
    /// `None` when the provider reported no usage.
    pub usage: Option<&'a pf_harness::Usage>,
}

/// The Lua stack when a block raised the error that failed it (debug detail
/// for the Host's log; the run error itself stays the guide's message).
#[derive(Debug, Clone, Copy)]
pub struct LuaTraceback<'a> {
    pub task: &'a str,
    pub section: &'a str,
    /// The failed block's location label (``section `Main` prologue``); frames
    /// in the traceback name it as `[string "LABEL"]:LINE:`, with the prompt
    /// file's absolute line.
    pub label: &'a str,
    /// `debug.traceback` at the raise: `stack traceback:` and one frame a line.
    pub traceback: &'a str,
}

/// The one seam through which a run reports what happens: the run log, live
/// output and progress all observe a run through it, and none reaches into the
/// engine.
///
/// Both methods are called synchronously on the run's thread, as things happen
/// and in order. They must not block: an observer that writes anywhere slow
/// hands the event to a channel or a buffer and returns. A panicking observer
/// never fails the run (the panic is caught; a `live_text` panic counts as
/// having stopped listening).
pub trait RunObserver: Send + Sync {
    /// One event, the moment it is reported. `execution` is the run's id
    /// (`sys.execution`), the same for every event of the run.
    fn event(&self, execution: &str, event: &RunEvent);

    /// Whether the Host shows live output. When true, `models.loop` rounds stream
    /// and each text fragment reaches [`RunObserver::live_text`] (`models.infer`
    /// rounds never stream).
    fn wants_live_text(&self) -> bool {
        false
    }

    /// One fragment of a streaming round's text, in arrival order. It returns
    /// `false` once it stops listening; the run then sends it nothing more, and
    /// the round goes on as if it were still there.
    fn live_text(&self, text: LiveText<'_>) -> bool {
        let _ = text;
        false
    }

    /// A tool call about to be dispatched (model or script, every kind of tool).
    fn tool_call(&self, execution: &str, call: &ToolCallNotice<'_>) {
        let _ = (execution, call);
    }

    /// A model round's answer arrived (every completed round, text reply or tool calls).
    fn model_round(&self, execution: &str, round: &RoundNotice<'_>) {
        let _ = (execution, round);
    }

    /// A block failed on a raised error: the Lua stack at the raise.
    fn lua_traceback(&self, execution: &str, trace: &LuaTraceback<'_>) {
        let _ = (execution, trace);
    }

    /// Whether the observer takes each event again as the run keeps it
    /// ([`RunObserver::kept`]); asked once, when the run starts.
    fn wants_kept(&self) -> bool {
        false
    }

    /// The event just given to [`RunObserver::event`], as its task's
    /// history keeps it: shared and never changed, so an observer may hold
    /// it and read it later on another thread, and its fields are already
    /// their JSON text (the run log copies that text into its line). Called
    /// only when [`RunObserver::wants_kept`] said so, right after `event`, in
    /// the same order.
    fn kept(&self, execution: &str, event: SharedEvent) {
        let _ = (execution, event);
    }
}

/// An event as its task's history keeps it, shared with an observer
/// ([`RunObserver::kept`]): the same kind, section, task, number and fields
/// as the [`RunEvent`] the observer heard.
#[derive(Clone)]
pub struct SharedEvent {
    event: Arc<KeptEvent>,
    task: Arc<str>,
}

impl std::fmt::Debug for SharedEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedEvent")
            .field("kind", &self.event.kind)
            .field("task", &self.task)
            .field("seq", &self.event.seq)
            .finish_non_exhaustive()
    }
}

impl SharedEvent {
    pub fn kind(&self) -> EventKind {
        self.event.kind
    }

    pub fn section(&self) -> &str {
        &self.event.section
    }

    pub fn task(&self) -> &str {
        &self.task
    }

    pub fn seq(&self) -> u32 {
        self.event.seq
    }

    /// The kind's fields as one compact JSON object, `None` for an event
    /// with none (a boundary event): the bytes `serde_json` writes for the
    /// [`RunEvent`]'s `fields` map, in its key order.
    pub fn fields_json(&self) -> Option<&str> {
        self.event.fields.as_deref()
    }

    /// The event as a [`RunEvent`] (a copy); an error only if its kept
    /// fields no longer read as its kind, which the run never writes.
    pub fn to_event(&self) -> Result<RunEvent, serde_json::Error> {
        self.event.event(&self.task)
    }
}

/// Tell the observer something that is not an event; a panic is caught.
pub(crate) fn notify(observer: Option<&Arc<dyn RunObserver>>, tell: impl FnOnce(&dyn RunObserver)) {
    if let Some(observer) = observer {
        let heard =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tell(observer.as_ref())));
        if heard.is_err() {
            tracing::warn!("the run observer panicked; the run goes on");
        }
    }
}

/// Hand one fragment to the Host. An observer that panics counts as one that
/// stopped listening: showing output must never fail a round.
pub(crate) fn deliver(observer: &dyn RunObserver, text: LiveText<'_>) -> bool {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| observer.live_text(text)))
        .unwrap_or(false)
}

/// The store operations that report events (`store.exists` reports nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreOp {
    Write,
    Append,
    Read,
    ReadNumbered,
    Replace,
    Delete,
    Glob,
}

impl StoreOp {
    pub(crate) fn outcome(self, ok: bool) -> Event {
        use Event::*;
        match (self, ok) {
            (StoreOp::Write, true) => StoreWriteSucceeded,
            (StoreOp::Write, false) => StoreWriteFailed,
            (StoreOp::Append, true) => StoreAppendSucceeded,
            (StoreOp::Append, false) => StoreAppendFailed,
            (StoreOp::Read, true) => StoreReadSucceeded,
            (StoreOp::Read, false) => StoreReadFailed,
            (StoreOp::ReadNumbered, true) => StoreReadNumberedSucceeded,
            (StoreOp::ReadNumbered, false) => StoreReadNumberedFailed,
            (StoreOp::Replace, true) => StoreReplaceSucceeded,
            (StoreOp::Replace, false) => StoreReplaceFailed,
            (StoreOp::Delete, true) => StoreDeleteSucceeded,
            (StoreOp::Delete, false) => StoreDeleteFailed,
            (StoreOp::Glob, true) => StoreGlobSucceeded,
            (StoreOp::Glob, false) => StoreGlobFailed,
        }
    }
}

/// Every task's count and history: the one recording path every event takes,
/// and the place the Host's observer hears each event as it happens.
///
/// One counter per task numbers both its host work and its events (guide ch.
/// 16, "Provenance"). The per-task histories are what `tasks.events` reads: the
/// same events, in the same order, that the Host's run log receives.
///
/// The histories are bounded in memory: past [`HISTORY_WINDOW`] bytes of kept
/// events (all tasks together) they move to an unnamed temporary file (a
/// chunk a task, `events/spool.rs`), and reads take them back from there, so a
/// prompt that logs without end costs the run disk, not memory; the file keeps
/// the newest [`spool::SPOOL_LIMIT`] bytes, so the disk it takes is bounded too.
#[derive(Default)]
pub(crate) struct EventLog {
    tasks: HashMap<String, TaskHistory>,
    observer: Option<Arc<dyn RunObserver>>,
    /// The observer takes each event again, shared ([`RunObserver::kept`]).
    observer_keeps: bool,
    /// About how many bytes the histories' events in memory take.
    held: usize,
    spool: spool::Spool,
    /// The spool could not be written: histories stay in memory (warned once).
    spool_failed: bool,
}

/// The bytes of kept events the histories hold in memory before they move to the spool.
pub(crate) const HISTORY_WINDOW: usize = 4 << 20;

struct TaskHistory {
    /// The task's id, shared with the events handed to the observer.
    task: Arc<str>,
    next_seq: u32,
    /// Shared: an observer may hold an event until its own thread reads it.
    /// The newest events; the older ones are in `spilled`.
    events: Vec<Arc<KeptEvent>>,
    /// The task's older events, on the spool, oldest first.
    spilled: Vec<spool::Chunk>,
    /// The chain that started the task, which may read its history.
    owner: Option<String>,
}

impl TaskHistory {
    fn new(task: &str) -> TaskHistory {
        TaskHistory {
            task: Arc::from(task),
            next_seq: 0,
            events: Vec::new(),
            spilled: Vec::new(),
            owner: None,
        }
    }
}

/// An event as a task's history keeps it until `tasks.events` reads it back:
/// the same kind, section, number and fields as the [`RunEvent`] the observer
/// heard, in a fraction of its room. The task is the history's own; the
/// section is shared with the event before it when it is the same (a
/// section's events come in a row); a boundary event keeps no fields.
/// A wide fanout keeps every arm's history for the whole call (its caller may
/// read any arm's), and as `RunEvent`s those histories were most of the fresh
/// memory a pure-Lua arm made the kernel zero.
///
/// The fields are kept as their JSON text, written once as the event is
/// recorded: one allocation an event instead of one a key and a string, and
/// the run log copies the text rather than walking a tree that another
/// thread built (and then freeing it there). `tasks.events` parses it back
/// (`serde_json` with `float_roundtrip`: its exact float parser, so a number
/// always reads back as the same `f64`, not merely a close one).
struct KeptEvent {
    kind: EventKind,
    seq: u32,
    section: Arc<str>,
    fields: Option<Box<str>>,
}

/// An event kept as `kind` and its fields' text, typed again.
fn event_of(kind: EventKind, fields: Option<&str>) -> Result<Event, serde_json::Error> {
    Event::parse_text(kind, fields)
}

impl KeptEvent {
    /// About how many bytes the event takes in memory.
    fn size(&self) -> usize {
        std::mem::size_of::<KeptEvent>() + 32 + self.fields.as_deref().map_or(0, str::len)
    }

    fn keep(event: RunEvent, before: Option<&KeptEvent>) -> KeptEvent {
        let fields = event.event.fields_text().map(String::into_boxed_str);
        let section = match before {
            Some(last) if *last.section == *event.section => Arc::clone(&last.section),
            _ => Arc::from(event.section),
        };
        KeptEvent {
            kind: event.event.kind(),
            seq: event.provenance.seq,
            section,
            fields,
        }
    }

    fn event(&self, task: &str) -> Result<RunEvent, serde_json::Error> {
        Ok(RunEvent {
            event: event_of(self.kind, self.fields.as_deref())?,
            section: self.section.to_string(),
            provenance: Provenance {
                task: task.to_string(),
                seq: self.seq,
            },
        })
    }
}

impl EventLog {
    pub(crate) fn new(observer: Option<Arc<dyn RunObserver>>) -> Self {
        let observer_keeps = observer.as_ref().is_some_and(|o| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| o.wants_kept()))
                .unwrap_or(false)
        });
        EventLog {
            tasks: HashMap::new(),
            observer,
            observer_keeps,
            held: 0,
            spool: spool::Spool::default(),
            spool_failed: false,
        }
    }

    /// The next number of `task`'s count (saturating at the top of the `u32` range).
    fn take_seq(&mut self, task: &str) -> u32 {
        let history = match self.tasks.get_mut(task) {
            Some(h) => h,
            None => self
                .tasks
                .entry(task.to_string())
                .or_insert_with(|| TaskHistory::new(task)),
        };
        let n = history.next_seq;
        history.next_seq = n.saturating_add(1);
        n
    }

    /// Number one piece of `task`'s host work, so later events keep their place against it.
    pub(crate) fn host_work(&mut self, task: &str) -> WorkId {
        WorkId::new(task, self.take_seq(task))
    }

    /// Record an event of `task` under `section`, hand it to the observer and
    /// log it at debug level.
    pub(crate) fn record(&mut self, execution: &str, task: &str, section: &str, event: Event) {
        let event = RunEvent {
            event,
            section: section.to_string(),
            provenance: Provenance {
                task: task.to_string(),
                seq: self.take_seq(task),
            },
        };
        tracing::debug!(target: "promptforge::events", "{}", event.to_json(execution));
        if let Some(observer) = &self.observer {
            let heard = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                observer.event(execution, &event)
            }));
            if heard.is_err() {
                tracing::warn!("the run observer panicked on an event; the run goes on");
            }
        }
        if let Some(history) = self.tasks.get_mut(task) {
            let kept = Arc::new(KeptEvent::keep(event, history.events.last().map(|e| &**e)));
            if let (true, Some(observer)) = (self.observer_keeps, &self.observer) {
                let shared = SharedEvent {
                    event: Arc::clone(&kept),
                    task: Arc::clone(&history.task),
                };
                let heard = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    observer.kept(execution, shared)
                }));
                if heard.is_err() {
                    tracing::warn!("the run observer panicked on a kept event; the run goes on");
                }
            }
            self.held += kept.size();
            history.events.push(kept);
            if self.held > HISTORY_WINDOW && !self.spool_failed {
                self.spill();
            }
        }
    }

    /// Move every history's events in memory to the spool.
    fn spill(&mut self) {
        for history in self.tasks.values_mut() {
            if history.events.is_empty() {
                continue;
            }
            match self.spool.write(&history.events) {
                Ok(chunk) => {
                    history.spilled.push(chunk);
                    history.events = Vec::new();
                }
                Err(e) => {
                    tracing::warn!(
                        "the run's event history could not move to a temporary file ({e}); it stays in memory"
                    );
                    self.spool_failed = true;
                    return;
                }
            }
        }
        self.held = 0;
        // Chunks whose segment the spool let go are gone from every history.
        for history in self.tasks.values_mut() {
            let spool = &self.spool;
            history.spilled.retain(|chunk| spool.holds(chunk));
        }
    }

    /// Make room in `task`'s history for `additional` more events (a fanout
    /// reports one `task_started` per arm there), so a wide fanout does not
    /// copy the history as it doubles. A task with no history yet is left alone.
    pub(crate) fn reserve(&mut self, task: &str, additional: usize) {
        if let Some(history) = self.tasks.get_mut(task) {
            history.events.reserve(additional);
        }
    }

    /// Record that the chain `owner` started `task` (so it may read its history).
    pub(crate) fn set_owner(&mut self, task: &str, owner: &str) {
        self.tasks
            .entry(task.to_string())
            .or_insert_with(|| TaskHistory::new(task))
            .owner = Some(owner.to_string());
    }

    /// The chain that started `task`, if a chain did.
    pub(crate) fn owner(&self, task: &str) -> Option<&str> {
        self.tasks.get(task).and_then(|h| h.owner.as_deref())
    }

    /// `task`'s events with a sequence number above `after` (all of them for `None`), in order.
    #[cfg(test)]
    pub(crate) fn history(&self, task: &str, after: Option<u32>) -> Vec<RunEvent> {
        let mut out = Vec::new();
        let read = self.for_each(task, after, &mut |e| {
            out.push(e);
            Ok::<(), ()>(())
        });
        assert!(matches!(read, Ok(Ok(()))));
        out
    }

    /// Hand `task`'s events numbered above `after` (all of them for `None`)
    /// to `each`, in order, one at a time (a reader builds its copy as they
    /// come, under its own memory limit); stops at the first error `each`
    /// returns. The outer error: the spool could not be read back.
    pub(crate) fn for_each<E>(
        &self,
        task: &str,
        after: Option<u32>,
        each: &mut dyn FnMut(RunEvent) -> Result<(), E>,
    ) -> std::io::Result<Result<(), E>> {
        let Some(history) = self.tasks.get(task) else {
            return Ok(Ok(()));
        };
        for chunk in &history.spilled {
            if let Err(e) = self.spool.read(chunk, task, after, each)? {
                return Ok(Err(e));
            }
        }
        for event in &history.events {
            if after.is_none_or(|last| event.seq > last) {
                let event = event.event(task).map_err(std::io::Error::other)?;
                if let Err(e) = each(event) {
                    return Ok(Err(e));
                }
            }
        }
        Ok(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{
        CapturedRequest, Checkpoint, TaskEnded, TaskOrigin, TaskStarted, ToolResult,
    };

    fn lua(message: String) -> Event {
        Event::Lua(Checkpoint { message })
    }

    /// A `task_started` whose `var` snapshot is `var` (any JSON).
    fn started(var: Json) -> Event {
        Event::TaskStarted(TaskStarted {
            task: "0.1".into(),
            target: "Arm".into(),
            origin: TaskOrigin::Author,
            input: None,
            item: None,
            index: None,
            var,
        })
    }

    #[test]
    fn the_run_log_line_puts_the_coordinates_first() {
        let event = RunEvent {
            event: Event::ToolResult(ToolResult {
                turn: 2,
                tool_call_id: String::new(),
                alias: "a".into(),
                content: "x".into(),
                trusted: true,
            }),
            section: "Gather".into(),
            provenance: Provenance {
                task: "0".into(),
                seq: 9,
            },
        };
        assert_eq!(
            event.to_json("run-1").to_string(),
            r#"{"kind":"tool_result","execution":"run-1","section":"Gather","provenance":{"task":"0","seq":9},"turn":2,"tool_call_id":"","alias":"a","content":"x","trusted":true}"#
        );
        assert_eq!(event.turn(), Some(2));
    }

    struct Terminal {
        gone: bool,
    }

    impl RunObserver for Terminal {
        fn event(&self, _: &str, _: &RunEvent) {
            panic!("the log went away");
        }
        fn live_text(&self, text: LiveText<'_>) -> bool {
            if self.gone {
                panic!("the terminal went away");
            }
            text.text == "hi"
        }
    }

    #[test]
    fn a_panicking_listener_counts_as_gone() {
        let text = LiveText {
            section: "S",
            turn: 1,
            text: "hi",
        };
        assert!(!deliver(&Terminal { gone: true }, text));
        assert!(deliver(&Terminal { gone: false }, text));
    }

    /// Whatever a history keeps an event as, `tasks.events` reads back the
    /// event the observer heard: kind, section, task, number and fields.
    #[test]
    fn a_history_gives_back_the_events_the_observer_heard() {
        struct Heard(std::sync::Mutex<Vec<RunEvent>>);
        impl RunObserver for Heard {
            fn event(&self, _: &str, event: &RunEvent) {
                self.0.lock().expect("heard").push(event.clone());
            }
            fn live_text(&self, _: LiveText<'_>) -> bool {
                false
            }
        }
        let heard = Arc::new(Heard(std::sync::Mutex::new(Vec::new())));
        let mut log = EventLog::new(Some(Arc::clone(&heard) as Arc<dyn RunObserver>));
        log.set_owner("0.1", "0");
        log.record("run-1", "0.1", "Arm", Event::SectionStarted);
        log.record("run-1", "0.1", "Arm", Event::LuaChunkStarted);
        log.host_work("0.1");
        log.record("run-1", "0.1", "Next", Event::SectionStarted);
        log.record(
            "run-1",
            "0.1",
            "Next",
            started(
                json!({"task": "0.1", "n": 1.5, "neg": -3, "big": u64::MAX, "t": true,
                "nested": {"z": [1, null, "s", {}], "a": [], "m": {"y": 1, "b": 2}}}),
            ),
        );
        log.record("run-1", "0.1", "Arm", Event::SectionFinished);
        let kept = log.history("0.1", None);
        assert_eq!(kept, *heard.0.lock().expect("heard"));
        assert_eq!(kept[2].provenance.seq, 3);
        // (maps compare without order: the order is checked on its own)
        let keys = |m: &Map<String, Json>| m.keys().cloned().collect::<Vec<_>>();
        let Event::TaskStarted(start) = &kept[3].event else {
            panic!("{:?}", kept[3]);
        };
        let var = start.var.as_object().expect("var");
        assert_eq!(keys(var), ["task", "n", "neg", "big", "t", "nested"]);
        let nested = var["nested"].as_object().expect("nested");
        assert_eq!(keys(nested), ["z", "a", "m"]);
        let inner = nested["m"].as_object().expect("m");
        assert_eq!(keys(inner), ["y", "b"]);
        assert_eq!(var["big"], json!(u64::MAX));
        assert_eq!(var["n"], json!(1.5));
        assert_eq!(log.history("0.1", Some(2)), kept[2..].to_vec());
    }

    #[test]
    fn each_task_counts_its_own_work_and_events_and_a_panicking_observer_is_survived() {
        let mut log = EventLog::new(Some(Arc::new(Terminal { gone: false })));
        log.record("run-1", "0", "A", Event::SectionStarted);
        assert_eq!(log.host_work("0"), WorkId::new("0", 1));
        log.record("run-1", "0.0", "B", Event::SectionStarted);
        log.record("run-1", "0", "A", Event::SectionStarted);
        let seqs = |task| -> Vec<u32> {
            log.history(task, None)
                .iter()
                .map(|e| e.provenance.seq)
                .collect()
        };
        assert_eq!(seqs("0"), vec![0, 2]);
        assert_eq!(seqs("0.0"), vec![0]);
        assert_eq!(log.history("0", Some(0)).len(), 1);
    }

    /// Past the window, histories move to the spool and read back the same:
    /// every event, in order, with `last` as before; memory keeps the window.
    #[test]
    fn a_long_history_moves_to_the_spool_and_reads_back_the_same() {
        let mut log = EventLog::new(None);
        log.set_owner("0", "main");
        log.set_owner("0.1", "main");
        let text = "x".repeat(200);
        for i in 0..40_000u32 {
            let task = if i % 3 == 0 { "0.1" } else { "0" };
            let section = if i % 5 == 0 { "Tab\there" } else { "S" };
            log.record(
                "run-1",
                task,
                section,
                Event::Request(CapturedRequest {
                    turn: i,
                    body: format!("{i} {text}"),
                }),
            );
            if i % 7 == 0 {
                log.record("run-1", task, section, Event::SectionStarted);
            }
        }
        assert!(log.held <= HISTORY_WINDOW, "{}", log.held);
        assert!(!log.tasks["0"].spilled.is_empty());
        let all = log.history("0", None);
        let seqs: Vec<u32> = all.iter().map(|e| e.provenance.seq).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]));
        let messages = all
            .iter()
            .filter(|e| e.kind() == EventKind::Request)
            .count();
        assert_eq!(messages, 26_666);
        let first = &all[0];
        assert_eq!(first.section, "S");
        assert_eq!(
            first.event,
            Event::Request(CapturedRequest {
                turn: 1,
                body: format!("1 {text}"),
            })
        );
        let tab = all.iter().find(|e| e.section != "S").expect("tab");
        assert_eq!(tab.section, "Tab\there");
        let later = log.history("0", Some(seqs[20_000]));
        assert_eq!(later, all[20_001..].to_vec());
        assert_eq!(log.history("0.1", None).len(), 13_334 + 1_905);
    }

    /// Fields kept as text read back equal to the map that was recorded:
    /// floats bit for bit (subnormals, the extremes, -0.0, values that need
    /// all 17 digits), the extremes of each integer type, escapes and
    /// non-ASCII text, nested key order and empty containers.
    #[test]
    fn fields_kept_as_text_read_back_equal() {
        let floats = [
            0.1 + 0.2,
            1e-300,
            5e-324,
            f64::MAX,
            f64::MIN_POSITIVE,
            2.225_073_858_507_201_4e-308,
            9_007_199_254_740_993.0,
            -0.0,
            1.0 / 3.0,
        ];
        let recorded = started(json!({
            "floats": floats,
            "ints": [i64::MIN, -1, 0, u64::MAX],
            "text": "tab\t quote\" nul\u{0} é 🦀 \u{2028}",
            "nested": {"z": {"b": [], "a": {}}, "a": null, "m": [true, false]},
        }));
        let mut log = EventLog::new(None);
        log.set_owner("0", "main");
        log.record("run-1", "0", "S", recorded.clone());
        log.record("run-1", "0", "S", lua("checkpoint".into()));
        log.record(
            "run-1",
            "0",
            "S",
            Event::TaskSucceeded(TaskEnded { task: "0.1".into() }),
        );
        let back = log.history("0", None);
        assert_eq!(back.len(), 3);
        assert_eq!(back[0].event, recorded);
        assert_eq!(back[1].event, lua("checkpoint".into()));
        assert_eq!(back[0].event.fields_text(), recorded.fields_text());
        let var = back[0].event.fields()["var"].clone();
        for (at, float) in floats.iter().enumerate() {
            let read = var["floats"][at].as_f64().unwrap();
            assert_eq!(read.to_bits(), float.to_bits(), "{float:e}");
        }
    }
}
