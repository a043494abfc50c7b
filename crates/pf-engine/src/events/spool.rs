//! Where a run's event history goes once it outgrows its window in memory: an
//! unnamed temporary file (gone with the process, however it ends), written
//! in chunks and read back by `tasks.events` (guide ch. 16: the host serves
//! the read from its run log; this is the engine's own, so `--no-log` runs
//! read the same history). Memory holds only the window and one small index
//! entry a chunk.
//!
//! The file is bounded too: it is a queue of segments of [`SEGMENT_BYTES`],
//! and once they pass [`SPOOL_LIMIT`] the oldest segment is let go (its disk
//! freed at once: each segment is its own unnamed file). `tasks.events` then
//! reads the window that is left, the newest events (guide ch. 16 has the
//! host serve reads from its log; the run log keeps every event).
//!
//! A line is `kind \t seq \t section \t fields`: the kind as its place in the
//! spool's own table of kinds, the section as a JSON string, the fields as the
//! kept event's JSON text (empty for none). JSON text has no raw tab or newline.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::{event_of, EventKind, KeptEvent, Provenance, RunEvent};

/// The most the spool keeps on disk: past it, the oldest segment goes.
pub(crate) const SPOOL_LIMIT: u64 = 256 << 20;

/// One segment's size before the next begins (the unit the spool lets go).
const SEGMENT_BYTES: u64 = 16 << 20;

/// One chunk of a task's history on file.
pub(super) struct Chunk {
    segment: u64,
    last_seq: u32,
    offset: u64,
    len: usize,
}

struct Segment {
    id: u64,
    file: File,
    len: u64,
}

#[derive(Default)]
pub(super) struct Spool {
    /// Oldest first; every id below the front's was let go.
    segments: VecDeque<Segment>,
    next_id: u64,
    /// The bytes the segments hold together.
    len: u64,
    kinds: Vec<EventKind>,
}

impl Spool {
    /// Whether `chunk` is still on file (its segment was not let go).
    pub(super) fn holds(&self, chunk: &Chunk) -> bool {
        self.segments.front().is_some_and(|s| s.id <= chunk.segment)
    }

    /// Write `events` (one task's, in order) as one chunk.
    pub(super) fn write(&mut self, events: &[Arc<KeptEvent>]) -> std::io::Result<Chunk> {
        let mut text = String::new();
        for event in events {
            let kind = match self.kinds.iter().position(|k| *k == event.kind) {
                Some(i) => i,
                None => {
                    self.kinds.push(event.kind);
                    self.kinds.len() - 1
                }
            };
            let section = serde_json::to_string(&*event.section).map_err(std::io::Error::other)?;
            text.push_str(&format!(
                "{kind}\t{}\t{section}\t{}\n",
                event.seq,
                event.fields.as_deref().unwrap_or("")
            ));
        }
        if self.segments.back().is_none_or(|s| s.len >= SEGMENT_BYTES) {
            self.segments.push_back(Segment {
                id: self.next_id,
                file: tempfile::tempfile()?,
                len: 0,
            });
            self.next_id += 1;
        }
        let Some(segment) = self.segments.back_mut() else {
            return Err(std::io::Error::other("no spool file"));
        };
        segment.file.write_all(text.as_bytes())?;
        let chunk = Chunk {
            segment: segment.id,
            last_seq: events.last().map_or(0, |e| e.seq),
            offset: segment.len,
            len: text.len(),
        };
        segment.len += text.len() as u64;
        self.len += text.len() as u64;
        // Never the segment just written: the newest events always stay.
        while self.len > SPOOL_LIMIT && self.segments.len() > 1 {
            if let Some(oldest) = self.segments.pop_front() {
                self.len -= oldest.len;
            }
        }
        Ok(chunk)
    }

    /// Hand each event of `chunk` numbered above `after` to `each`, in order.
    pub(super) fn read<E>(
        &self,
        chunk: &Chunk,
        task: &str,
        after: Option<u32>,
        each: &mut dyn FnMut(RunEvent) -> Result<(), E>,
    ) -> Result<Result<(), E>, std::io::Error> {
        if after.is_some_and(|last| chunk.last_seq <= last) {
            return Ok(Ok(()));
        }
        let Some(file) = self
            .segments
            .iter()
            .find(|s| s.id == chunk.segment)
            .map(|s| &s.file)
        else {
            // Let go past the limit: the read is the window that is left.
            return Ok(Ok(()));
        };
        let mut bytes = vec![0u8; chunk.len];
        file.read_exact_at(&mut bytes, chunk.offset)?;
        let text = String::from_utf8(bytes).map_err(std::io::Error::other)?;
        for line in text.lines() {
            let mut parts = line.splitn(4, '\t');
            let (Some(kind), Some(seq), Some(section), Some(fields)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(std::io::Error::other("a spooled event is cut short"));
            };
            let kind = kind
                .parse::<usize>()
                .ok()
                .and_then(|i| self.kinds.get(i).copied());
            let (Some(kind), Ok(seq), Ok(section)) = (
                kind,
                seq.parse::<u32>(),
                serde_json::from_str::<String>(section),
            ) else {
                return Err(std::io::Error::other("a spooled event does not read back"));
            };
            if after.is_some_and(|last| seq <= last) {
                continue;
            }
            let fields = (!fields.is_empty()).then_some(fields);
            let event = RunEvent {
                event: event_of(kind, fields).map_err(std::io::Error::other)?,
                section,
                provenance: Provenance {
                    task: task.to_string(),
                    seq,
                },
            };
            if let Err(e) = each(event) {
                return Ok(Err(e));
            }
        }
        Ok(Ok(()))
    }
}
