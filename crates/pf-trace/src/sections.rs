//! Section entries from a run's events, the shape both the trace page and the
//! OpenTelemetry export draw: each task's walk is a stack of entries (`call`
//! nests one inside its caller), and a task's first entry sits inside the
//! entry that started the task.
//!
//! `section_started`/`section_finished` open and close an entry. Events of a
//! section that reported no `section_started` (the H1 pass, or a log from a
//! build that reports fewer kinds) get an implicit entry that lasts while its
//! task keeps reporting under that heading.

use std::collections::HashMap;

use pf_engine::EventKind;

/// Where one event or piece of host work belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// The run itself: the parse, `run_started`, the closing event.
    Run,
    /// A task's own boundary (its terminal event), outside any entry.
    Lane,
    /// The entry at this index of [`Sections::entries`].
    Entry(usize),
}

/// One entry of a section, by one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub task: String,
    /// The heading text.
    pub section: String,
    /// The enclosing entry: the caller for a called section, the entry that
    /// started the task for a task's first entry.
    pub parent: Option<usize>,
    /// Opened by `section_started` (else implicit).
    pub explicit: bool,
    /// Closed by `section_finished`.
    pub finished: bool,
    /// How many entries of the same task enclose it (`call` depth).
    pub depth: usize,
}

/// The walker: feed it every item in logged order.
#[derive(Debug, Default)]
pub struct Sections {
    pub entries: Vec<Entry>,
    /// Each task's open entries, innermost last.
    open: HashMap<String, Vec<usize>>,
    /// The entry each task was started from (by `task_started`).
    started_in: HashMap<String, usize>,
    /// Task ids in order of first appearance.
    pub tasks: Vec<String>,
}

/// Kinds that belong to the run rather than to a section.
fn is_run_kind(kind: EventKind) -> bool {
    use EventKind::*;
    matches!(
        kind,
        RunStarted
            | RunSucceeded
            | RunFailed
            | ParseStarted
            | ParseSucceeded
            | ParseFailed
            | LuaCompilationStarted
            | LuaCompilationSucceeded
            | LuaCompilationFailed
    )
}

/// A task's terminal event.
pub fn is_task_end(kind: EventKind) -> bool {
    use EventKind::*;
    matches!(
        kind,
        TaskSucceeded | TaskFailed | TaskCancelled | TaskAbandoned
    )
}

impl Sections {
    /// Place one item: an event (`kind`) or a piece of host work (`None`,
    /// as is a logged kind this version does not know), reported by `task`
    /// under `section`.
    pub fn place(&mut self, task: &str, section: &str, kind: Option<EventKind>) -> Place {
        if !self.tasks.iter().any(|t| t == task) {
            self.tasks.push(task.to_string());
        }
        match kind {
            Some(kind) if is_run_kind(kind) => return Place::Run,
            Some(kind) if is_task_end(kind) => {
                self.close_implicit(task);
                return Place::Lane;
            }
            Some(EventKind::SectionStarted) => {
                self.close_implicit(task);
                return Place::Entry(self.open_entry(task, section, true));
            }
            Some(EventKind::SectionFinished) => {
                self.close_implicit_unless(task, section);
                let top = self.top(task);
                if let Some(index) = top.filter(|&i| self.entries[i].section == section) {
                    self.entries[index].finished = true;
                    self.pop(task);
                    return Place::Entry(index);
                }
            }
            _ => {}
        }
        self.close_implicit_unless(task, section);
        match self.top(task) {
            Some(index) if self.entries[index].section == section => Place::Entry(index),
            _ => Place::Entry(self.open_entry(task, section, false)),
        }
    }

    /// Note that `child` was started from `at` (`task_started`).
    pub fn started(&mut self, child: &str, at: Place) {
        if let Place::Entry(index) = at {
            self.started_in.insert(child.to_string(), index);
        }
    }

    /// The entries still open (explicit ones a failure left unfinished).
    pub fn unfinished(&self) -> impl Iterator<Item = usize> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.explicit && !e.finished)
            .map(|(i, _)| i)
    }

    fn top(&self, task: &str) -> Option<usize> {
        self.open.get(task).and_then(|stack| stack.last().copied())
    }

    fn pop(&mut self, task: &str) {
        if let Some(stack) = self.open.get_mut(task) {
            stack.pop();
        }
    }

    /// Drop the task's implicit entries from the top of its stack.
    fn close_implicit(&mut self, task: &str) {
        while self.top(task).is_some_and(|i| !self.entries[i].explicit) {
            self.pop(task);
        }
    }

    /// As [`close_implicit`](Self::close_implicit), but stop at an entry of
    /// `section` (the heading the task still reports under).
    fn close_implicit_unless(&mut self, task: &str, section: &str) {
        while let Some(index) = self.top(task) {
            let entry = &self.entries[index];
            if entry.explicit || entry.section == section {
                break;
            }
            self.pop(task);
        }
    }

    fn open_entry(&mut self, task: &str, section: &str, explicit: bool) -> usize {
        let caller = self.top(task);
        let parent = caller.or_else(|| self.started_from(task));
        let depth = caller.map_or(0, |i| self.entries[i].depth + 1);
        self.entries.push(Entry {
            task: task.to_string(),
            section: section.to_string(),
            parent,
            explicit,
            finished: false,
            depth,
        });
        let index = self.entries.len() - 1;
        self.open.entry(task.to_string()).or_default().push(index);
        index
    }

    /// The entry a task began from: its `task_started`, else (a log without
    /// task events) where its owner, the id's prefix, is now.
    fn started_from(&self, task: &str) -> Option<usize> {
        if let Some(&index) = self.started_in.get(task) {
            return Some(index);
        }
        let (owner, _) = task.rsplit_once('.')?;
        self.top(owner)
            .or_else(|| self.entries.iter().rposition(|e| e.task == owner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(name: &str) -> Option<EventKind> {
        EventKind::from_name(name)
    }

    fn labels(s: &Sections) -> Vec<String> {
        s.entries
            .iter()
            .map(|e| {
                format!(
                    "{}:{}<{}{}",
                    e.task,
                    e.section,
                    e.parent.map_or("-".to_string(), |p| p.to_string()),
                    if e.finished { " done" } else { "" }
                )
            })
            .collect()
    }

    #[test]
    fn calls_nest_and_tasks_sit_in_their_starting_entry() {
        let mut s = Sections::default();
        assert_eq!(s.place("0", "T", k("run_started")), Place::Run);
        assert_eq!(s.place("0", "T", k("lua_chunk_started")), Place::Entry(0));
        assert_eq!(s.place("0", "A", k("section_started")), Place::Entry(1));
        assert_eq!(s.place("0", "B", k("section_started")), Place::Entry(2));
        assert_eq!(s.place("0", "B", None), Place::Entry(2));
        assert_eq!(s.place("0", "B", k("section_finished")), Place::Entry(2));
        let at = s.place("0", "A", k("task_started"));
        assert_eq!(at, Place::Entry(1));
        s.started("0.0", at);
        assert_eq!(s.place("0.0", "W", k("section_started")), Place::Entry(3));
        assert_eq!(s.place("0.0", "W", k("section_finished")), Place::Entry(3));
        assert_eq!(s.place("0.0", "W", k("task_succeeded")), Place::Lane);
        assert_eq!(s.place("0", "A", k("lua_chunk_failed")), Place::Entry(1));
        assert_eq!(labels(&s), ["0:T<-", "0:A<-", "0:B<1 done", "0.0:W<1 done"]);
        assert_eq!(s.entries[2].depth, 1);
        assert_eq!(s.unfinished().collect::<Vec<_>>(), vec![1]);
    }

    #[test]
    fn without_boundaries_a_heading_change_starts_an_implicit_entry() {
        let mut s = Sections::default();
        s.place("0", "A", k("store_write_succeeded"));
        s.place("0", "A", k("lua"));
        s.place("0.0", "W", k("store_write_succeeded"));
        s.place("0.1", "W", None);
        s.place("0", "B", k("lua"));
        assert_eq!(labels(&s), ["0:A<-", "0.0:W<0", "0.1:W<0", "0:B<-"]);
        assert_eq!(s.tasks, ["0", "0.0", "0.1"]);
        assert_eq!(s.unfinished().count(), 0);
    }
}
