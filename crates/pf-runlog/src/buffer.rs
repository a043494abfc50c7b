//! Events on their way to the writer thread: encoded back to back into one
//! byte buffer that the run's threads append to and the writer thread takes
//! whole at each commit.
//!
//! A run reports hundreds of events per model loop and thousands per wide
//! fanout. Sent one by one, each cost a few allocations that the writer
//! thread then freed, which defeats the allocator's per-thread caches on
//! both sides, and a channel operation. Appending here allocates nothing
//! once the buffer has grown (the writer hands its drained buffer back), and
//! wakes nobody: the writer looks at each window's end.

use std::sync::{Mutex, PoisonError};

use serde::Serialize;

/// One event as the buffer hands it back, borrowing from the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BufferedEvent<'a> {
    pub kind: &'a str,
    pub section: &'a str,
    pub task: &'a str,
    pub seq: u32,
    pub fields_json: &'a str,
}

/// The shared buffer. Each event is `kind`, `section`, `task`, `seq` and
/// the fields' JSON text, each string prefixed by its length (u32, native
/// byte order: the bytes never leave the process).
#[derive(Debug, Default)]
pub(crate) struct EventBuffer {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    bytes: Vec<u8>,
    /// Set when the writer will write no more: appending is then a no-op.
    closed: bool,
}

impl EventBuffer {
    /// Append one event, encoding its fields in place.
    pub fn push(&self, kind: &str, section: &str, task: &str, seq: u32, fields: &impl Serialize) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.closed {
            return;
        }
        let bytes = &mut state.bytes;
        let start = bytes.len();
        put_str(bytes, kind);
        put_str(bytes, section);
        put_str(bytes, task);
        bytes.extend_from_slice(&seq.to_ne_bytes());
        let at = bytes.len();
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        if serde_json::to_writer(&mut *bytes, fields).is_err() {
            // Fields that are not JSON (never from a `Map`): the event goes
            // in without them rather than not at all.
            bytes.truncate(at + 4);
            bytes.extend_from_slice(b"{}");
        }
        let len = bytes.len() - at - 4;
        match u32::try_from(len) {
            Ok(len) => bytes[at..at + 4].copy_from_slice(&len.to_ne_bytes()),
            // Over 4 GiB of fields cannot be framed; drop the event.
            Err(_) => bytes.truncate(start),
        }
    }

    /// Take everything appended so far, leaving `spare` (emptied) in its
    /// place so the next appends reuse its capacity.
    pub fn take(&self, spare: &mut Vec<u8>) {
        spare.clear();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut state.bytes, spare);
    }

    /// No more events will be written: drop what is queued and every later one.
    pub fn close(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.closed = true;
        state.bytes = Vec::new();
    }
}

fn put_str(bytes: &mut Vec<u8>, text: &str) {
    // Strings longer than 4 GiB do not occur here; cut one rather than misframe.
    let text = &text.as_bytes()[..text.len().min(u32::MAX as usize)];
    let len = u32::try_from(text.len()).unwrap_or(u32::MAX);
    bytes.extend_from_slice(&len.to_ne_bytes());
    bytes.extend_from_slice(text);
}

/// The events in `bytes`, in the order they were appended.
pub(crate) fn events(bytes: &[u8]) -> Events<'_> {
    Events { rest: bytes }
}

pub(crate) struct Events<'a> {
    rest: &'a [u8],
}

impl<'a> Events<'a> {
    fn u32(&mut self) -> Option<u32> {
        let (head, rest) = self.rest.split_first_chunk::<4>()?;
        self.rest = rest;
        Some(u32::from_ne_bytes(*head))
    }

    fn str(&mut self) -> Option<&'a str> {
        let len = usize::try_from(self.u32()?).ok()?;
        if len > self.rest.len() {
            return None;
        }
        let (text, rest) = self.rest.split_at(len);
        self.rest = rest;
        std::str::from_utf8(text).ok()
    }
}

impl<'a> Iterator for Events<'a> {
    type Item = BufferedEvent<'a>;

    fn next(&mut self) -> Option<BufferedEvent<'a>> {
        let event = (|| {
            Some(BufferedEvent {
                kind: self.str()?,
                section: self.str()?,
                task: self.str()?,
                seq: self.u32()?,
                fields_json: self.str()?,
            })
        })();
        if event.is_none() {
            // Only the buffer's own encoding is ever read; stop at anything else.
            self.rest = &[];
        }
        event
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn events_read_back_in_order_and_the_spare_is_reused() {
        let buffer = EventBuffer::default();
        let fields = serde_json::json!({"path": "a.md", "n": 1});
        buffer.push("store_write_succeeded", "Gather é", "0.1", 7, &fields);
        buffer.push("lua", "", "0", 0, &serde_json::Map::new());
        let mut taken = Vec::with_capacity(4096);
        buffer.take(&mut taken);
        let read: Vec<_> = events(&taken).collect();
        assert_eq!(
            read,
            [
                BufferedEvent {
                    kind: "store_write_succeeded",
                    section: "Gather é",
                    task: "0.1",
                    seq: 7,
                    fields_json: r#"{"path":"a.md","n":1}"#,
                },
                BufferedEvent {
                    kind: "lua",
                    section: "",
                    task: "0",
                    seq: 0,
                    fields_json: "{}",
                },
            ]
        );
        let mut spare = taken;
        buffer.push("a", "b", "c", 1, &fields);
        buffer.take(&mut spare);
        assert_eq!(events(&spare).count(), 1);
        assert_eq!(events(&spare[..spare.len() - 1]).count(), 0);
        buffer.close();
        buffer.push("a", "b", "c", 2, &fields);
        buffer.take(&mut spare);
        assert!(spare.is_empty());
    }
}
