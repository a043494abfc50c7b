//! Which section each task is running: the run log files host work under it.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use pf_engine::{Event, RunEvent};

/// Which section each task is running, as its events tell: host work (a
/// model round, a tool call, an operator wait) names only its task, and the
/// run log files it under that task's current section.
///
/// A task's sections nest only through `call`, so a stack per task follows
/// them: `section_started` pushes, `section_finished` pops back to the caller.
/// Outside any walked section (the H1 pass) the latest event's label holds.
#[derive(Debug, Default)]
pub struct SectionTracker {
    tasks: Mutex<Tasks>,
}

/// Every task's sections, with the task the last event named looked up
/// first: a run's events come in long stretches from one task, and a hash
/// of its id per event was most of what following them cost.
#[derive(Debug, Default)]
struct Tasks {
    at: HashMap<String, usize>,
    sections: Vec<TaskSections>,
    last: Option<usize>,
}

impl Tasks {
    /// Where `task`'s sections are kept, the last event's task checked first.
    fn find(&self, task: &str) -> Option<usize> {
        match self.last {
            Some(at) if self.sections.get(at).is_some_and(|t| t.task == task) => Some(at),
            _ => self.at.get(task).copied(),
        }
    }

    fn of(&mut self, task: &str) -> &mut TaskSections {
        let at = self.find(task).unwrap_or_else(|| {
            self.at.insert(task.to_string(), self.sections.len());
            self.sections.push(TaskSections {
                task: task.to_string(),
                ..TaskSections::default()
            });
            self.sections.len() - 1
        });
        self.last = Some(at);
        &mut self.sections[at]
    }

    fn get(&self, task: &str) -> Option<&TaskSections> {
        self.find(task).and_then(|at| self.sections.get(at))
    }
}

#[derive(Debug, Default)]
struct TaskSections {
    task: String,
    open: Vec<String>,
    latest: String,
}

impl SectionTracker {
    pub(crate) fn heard(&self, event: &RunEvent) {
        let section = event.section.as_str();
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        let task = tasks.of(&event.provenance.task);
        match event.event {
            Event::SectionStarted => task.open.push(section.to_string()),
            Event::SectionFinished if task.open.last().is_some_and(|open| open == section) => {
                task.open.pop();
            }
            _ => {}
        }
        if task.latest != section {
            section.clone_into(&mut task.latest);
        }
    }

    /// The section `task` is running now (empty before its first event).
    pub fn current(&self, task: &str) -> String {
        let tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        tasks
            .get(task)
            .map(|t| t.open.last().unwrap_or(&t.latest).clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_called_section_hands_back_to_its_caller() {
        let tracker = SectionTracker::default();
        let heard = |event: Event, section: &str, task: &str| {
            tracker.heard(&RunEvent {
                event,
                section: section.to_string(),
                provenance: pf_engine::Provenance {
                    task: task.to_string(),
                    seq: 0,
                },
            });
        };
        heard(Event::RunStarted, "Title", "0");
        assert_eq!(tracker.current("0"), "Title");
        heard(Event::SectionStarted, "Outer", "0");
        heard(Event::SectionStarted, "Inner", "0");
        heard(Event::LuaChunkStarted, "Inner", "0");
        assert_eq!(tracker.current("0"), "Inner");
        heard(Event::SectionFinished, "Inner", "0");
        assert_eq!(tracker.current("0"), "Outer");
        heard(Event::SectionStarted, "Arm", "0.1");
        assert_eq!(tracker.current("0.1"), "Arm");
        assert_eq!(tracker.current("0"), "Outer");
        assert_eq!(tracker.current("0.7"), "");
        // Back and forth between tasks: each keeps its own stack.
        heard(Event::SectionStarted, "Deeper", "0.1");
        heard(Event::LuaChunkStarted, "Outer", "0");
        assert_eq!(tracker.current("0.1"), "Deeper");
        heard(Event::SectionFinished, "Deeper", "0.1");
        assert_eq!(tracker.current("0.1"), "Arm");
        assert_eq!(tracker.current("0"), "Outer");
        heard(Event::SectionFinished, "Outer", "0");
        assert_eq!(tracker.current("0"), "Outer");
        heard(Event::RunSucceeded, "Title", "0");
        assert_eq!(tracker.current("0"), "Title");
    }
}
