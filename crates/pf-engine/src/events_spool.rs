//! Where a run's event history goes once it outgrows its window in memory: an
//! unnamed temporary file (gone with the process, however it ends), written
//! in chunks and read back by `tasks.events` (guide ch. 16: the host serves
//! the read from its run log; this is the engine's own, so `--no-log` runs
//! read the same history). Memory holds only the window and one small index
//! entry a chunk.
//!
//! A line is `kind \t seq \t section \t fields`: the kind as its place in the
//! spool's own table of kinds, the section as a JSON string, the fields as the
//! kept event's JSON text (empty for none). JSON text has no raw tab or newline.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use super::{event_of, EventKind, KeptEvent, Provenance, RunEvent};

/// One chunk of a task's history on file.
pub(super) struct Chunk {
    last_seq: u32,
    offset: u64,
    len: usize,
}

#[derive(Default)]
pub(super) struct Spool {
    file: Option<File>,
    len: u64,
    kinds: Vec<EventKind>,
}

impl Spool {
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
        if self.file.is_none() {
            self.file = Some(tempfile::tempfile()?);
        }
        let Some(file) = self.file.as_mut() else {
            return Err(std::io::Error::other("no spool file"));
        };
        file.write_all(text.as_bytes())?;
        let chunk = Chunk {
            last_seq: events.last().map_or(0, |e| e.seq),
            offset: self.len,
            len: text.len(),
        };
        self.len += text.len() as u64;
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
        let Some(file) = self.file.as_ref() else {
            return Err(std::io::Error::other("no spool file"));
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
