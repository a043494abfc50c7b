//! Events and host work on their way to the writer thread: encoded back to
//! back, one JSON line each (events and work lines in two byte buffers),
//! into one buffer that the run's threads append to and the writer thread
//! takes whole at each commit, storing it as one row (see `schema.rs`,
//! versions 4 and 5).
//!
//! A run reports hundreds of events per model loop and thousands per wide
//! fanout. Sent one by one, each cost a few allocations that the writer
//! thread then freed (which defeats the allocator's per-thread caches on
//! both sides), a channel operation, and an SQLite row with two indexes.
//! Appending here allocates nothing once the buffer has grown (the writer
//! hands its drained buffer back) and wakes nobody: the writer looks at each
//! window's end.

use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

/// One event's line as version 4 wrote it: an object with its coordinates,
/// then the kind's own fields.
#[derive(Debug, Deserialize)]
struct EventLine {
    kind: String,
    section: String,
    task: String,
    seq: u32,
    fields: serde_json::Value,
}

/// One event's line since version 5: `[kind, section, task, seq, fields]`,
/// with `fields` left out when it is `{}` (most events have none). The
/// object's keys were a third of the bytes a commit wrote.
#[derive(Debug, Deserialize)]
pub(crate) struct DenseLine(
    pub String,
    pub String,
    pub String,
    pub u32,
    #[serde(default = "empty_fields")] pub serde_json::Value,
);

fn empty_fields() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

/// An event line of either form, as `(kind, section, task, seq, fields)`.
pub(crate) fn parse_line(
    line: &str,
) -> serde_json::Result<(String, String, String, u32, serde_json::Value)> {
    if line.starts_with('[') {
        let DenseLine(kind, section, task, seq, fields) = serde_json::from_str(line)?;
        Ok((kind, section, task, seq, fields))
    } else {
        let line: EventLine = serde_json::from_str(line)?;
        Ok((line.kind, line.section, line.task, line.seq, line.fields))
    }
}

/// An event the log encodes from its parts, on the thread that reports it.
/// Its fields come as JSON text already (a task's history keeps them so),
/// so its line is a few copies; the event itself stays with its reporter.
/// (Handing events over to be encoded on the database's thread kept each one
/// alive until the next commit and freed it there, away from the allocator
/// cache of the thread that made it: more CPU on both threads than copying
/// its text at once.)
pub trait LogEvent {
    fn kind(&self) -> &str;
    fn section(&self) -> &str;
    fn task(&self) -> &str;
    fn seq(&self) -> u32;
    /// Append the fields as one JSON object, the bytes serde writes for
    /// them; false, having written nothing, when the event has none.
    fn write_fields(&self, out: &mut Vec<u8>) -> bool;
}

/// What a line with no fields ends with before they are cut.
const NO_FIELDS: &[u8] = b",{}]";

/// The shared buffer: JSON lines, and how many.
#[derive(Debug, Default)]
pub(crate) struct EventBuffer {
    state: Mutex<Taken>,
}

/// What [`EventBuffer::take`] hands over.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    pub lines: Vec<u8>,
    pub count: u32,
    /// The host work's lines (`work.rs`), encoded by whoever did the work.
    pub work: Vec<u8>,
    /// The next exchange's handle: numbered as their lines go in, so the
    /// lines are in handle order.
    next_exchange: u64,
    /// Set when the writer will write no more: appending is then a no-op.
    closed: bool,
    /// The appending side's last event place (never swapped on a take).
    place: EventPlace,
}

/// The last event's section and task, and the line bytes they became
/// (`"section","task",`). A run's events come in rows from one task in one
/// section, so most events reuse those bytes: two comparisons and one copy
/// instead of two strings checked and written.
#[derive(Debug, Default)]
struct EventPlace {
    section: String,
    task: String,
    encoded: Vec<u8>,
}

impl EventPlace {
    /// Append `"section","task",` to `out`.
    fn push(&mut self, out: &mut Vec<u8>, section: &str, task: &str) {
        // Empty only before the first event (even `"",""` has its quotes).
        if !self.encoded.is_empty() && self.task == task && self.section == section {
            out.extend_from_slice(&self.encoded);
            return;
        }
        let start = out.len();
        push_str(out, section);
        out.push(b',');
        push_str(out, task);
        out.push(b',');
        self.encoded.clear();
        self.encoded
            .extend_from_slice(out.get(start..).unwrap_or_default());
        self.section.clear();
        self.section.push_str(section);
        self.task.clear();
        self.task.push_str(task);
    }
}

impl Taken {
    /// No event and no work line.
    pub fn is_empty(&self) -> bool {
        self.count == 0 && self.work.is_empty()
    }

    /// Drop the lines (keeping their capacity).
    pub fn clear(&mut self) {
        self.lines.clear();
        self.work.clear();
        self.count = 0;
    }

    /// Start an event's line: `["kind","section","task",`.
    fn push_head(&mut self, kind: &str, section: &str, task: &str) {
        self.lines.push(b'[');
        push_str(&mut self.lines, kind);
        self.lines.push(b',');
        self.place.push(&mut self.lines, section, task);
    }

    /// One event's line, from its parts.
    fn push_event_line(&mut self, event: &(impl LogEvent + ?Sized)) {
        self.push_head(event.kind(), event.section(), event.task());
        let out = &mut self.lines;
        push_u64(out, u64::from(event.seq()));
        let before = out.len();
        out.push(b',');
        if !event.write_fields(out) {
            out.truncate(before);
        }
        out.extend_from_slice(b"]\n");
    }

    /// Append `more`'s lines after these (a busy commit left these).
    pub fn append(&mut self, more: &Taken) {
        self.lines.extend_from_slice(&more.lines);
        self.work.extend_from_slice(&more.work);
        self.count = self.count.saturating_add(more.count);
    }

    /// The work lines as text (written as JSON, so always UTF-8).
    #[cfg(test)]
    pub fn work_text(&self) -> &str {
        std::str::from_utf8(&self.work).unwrap_or("")
    }

    /// The lines as text (they were written as JSON, so always UTF-8).
    #[cfg(test)]
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.lines).unwrap_or("")
    }
}

/// Line buffers a finished writer left, for the next run's (a process
/// running many runs would otherwise grow a new pair from nothing each run:
/// a dozen reallocations, each copying what was written, on the run's thread).
static SPARE_LINES: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// At most this many buffers are kept, each at most this large.
const SPARES_KEPT: usize = 4;
const SPARE_BYTES_MAX: usize = 4 * 1024 * 1024;

/// An empty buffer, with the capacity of one a finished writer left.
pub(crate) fn spare_lines() -> Vec<u8> {
    SPARE_LINES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop()
        .unwrap_or_default()
}

/// Keep `lines`' capacity for a later writer.
pub(crate) fn recycle_lines(mut lines: Vec<u8>) {
    if lines.capacity() == 0 || lines.capacity() > SPARE_BYTES_MAX {
        return;
    }
    lines.clear();
    let mut spares = SPARE_LINES.lock().unwrap_or_else(PoisonError::into_inner);
    if spares.len() < SPARES_KEPT {
        spares.push(lines);
    }
}

impl Taken {
    /// A taken buffer that starts with a finished writer's capacity.
    pub fn reusing() -> Taken {
        Taken {
            lines: spare_lines(),
            work: spare_lines(),
            ..Taken::default()
        }
    }

    /// Hand both buffers' capacity to a later writer.
    pub fn recycle(&mut self) {
        recycle_lines(std::mem::take(&mut self.lines));
        recycle_lines(std::mem::take(&mut self.work));
        self.count = 0;
    }
}

impl EventBuffer {
    /// A buffer that starts with a finished writer's capacity.
    pub fn reusing() -> EventBuffer {
        EventBuffer {
            state: Mutex::new(Taken::reusing()),
        }
    }

    /// Hand the buffer's capacity to a later writer (the writer is done).
    pub fn recycle(&self) {
        let mut taken = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.closed = true;
            Taken {
                lines: std::mem::take(&mut state.lines),
                work: std::mem::take(&mut state.work),
                ..Taken::default()
            }
        };
        taken.recycle();
    }

    /// Append one work line, which `write` encodes (without its newline)
    /// into the buffer; false from `write` drops what it wrote. With
    /// `exchange`, the line is an exchange's and `write` gets its handle,
    /// the run's next (also given back; numbered even when the writer
    /// writes no more and the line is dropped).
    pub fn push_work(&self, exchange: bool, write: impl FnOnce(&mut Vec<u8>, u64) -> bool) -> u64 {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let state = &mut *state;
        let handle = state.next_exchange;
        if exchange {
            state.next_exchange += 1;
        }
        if state.closed {
            return handle;
        }
        let start = state.work.len();
        if write(&mut state.work, handle) {
            state.work.push(b'\n');
        } else {
            state.work.truncate(start);
        }
        handle
    }

    /// Append one event, encoding its fields in place.
    pub fn push(&self, kind: &str, section: &str, task: &str, seq: u32, fields: &impl Serialize) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.closed || state.count == u32::MAX {
            return;
        }
        let start = state.lines.len();
        if serde_json::to_writer(&mut state.lines, &(kind, section, task, seq, fields)).is_err() {
            // Fields that are not JSON (never from a `Map`): the event goes
            // in without them rather than not at all.
            state.lines.truncate(start);
            if serde_json::to_writer(&mut state.lines, &(kind, section, task, seq)).is_err() {
                state.lines.truncate(start);
                return;
            }
        } else if state.lines.ends_with(NO_FIELDS) {
            let end = state.lines.len() - NO_FIELDS.len();
            state.lines.truncate(end);
            state.lines.push(b']');
        }
        state.lines.push(b'\n');
        state.count += 1;
    }

    /// Append one event whose fields are a JSON object, written directly
    /// (see [`push_object`]): the same bytes as [`push`](EventBuffer::push),
    /// without serde's generic machinery, through the one line writer every
    /// event takes ([`push_event`](EventBuffer::push_event)).
    pub fn push_map(
        &self,
        kind: &str,
        section: &str,
        task: &str,
        seq: u32,
        fields: &serde_json::Map<String, serde_json::Value>,
    ) {
        self.push_event(&MapEvent {
            kind,
            section,
            task,
            seq,
            fields,
        });
    }

    /// Append one event, encoded from its parts (its fields already text).
    pub fn push_event(&self, event: &(impl LogEvent + ?Sized)) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.closed || state.count == u32::MAX {
            return;
        }
        state.push_event_line(event);
        state.count += 1;
    }

    /// Take everything appended so far into `into`, leaving `into`'s old
    /// (emptied) buffer in its place so the next appends reuse its capacity.
    pub fn take(&self, into: &mut Taken) {
        into.clear();
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            std::mem::swap(&mut state.lines, &mut into.lines);
            std::mem::swap(&mut state.work, &mut into.work);
            std::mem::swap(&mut state.count, &mut into.count);
        }
    }

    /// No more lines will be written: drop what is queued and every later one.
    pub fn close(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.closed = true;
        state.lines = Vec::new();
        state.work = Vec::new();
        state.count = 0;
    }
}

/// An event line's end, after its place: `seq`, the fields unless empty, `]`.
/// An event whose fields are a JSON map, encoded from its parts.
struct MapEvent<'a> {
    kind: &'a str,
    section: &'a str,
    task: &'a str,
    seq: u32,
    fields: &'a serde_json::Map<String, serde_json::Value>,
}

impl LogEvent for MapEvent<'_> {
    fn kind(&self) -> &str {
        self.kind
    }

    fn section(&self) -> &str {
        self.section
    }

    fn task(&self) -> &str {
        self.task
    }

    fn seq(&self) -> u32 {
        self.seq
    }

    fn write_fields(&self, out: &mut Vec<u8>) -> bool {
        if self.fields.is_empty() {
            return false;
        }
        push_object(out, self.fields);
        true
    }
}

pub fn push_value(out: &mut Vec<u8>, value: &serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(number) => {
            if let Some(n) = number.as_u64() {
                push_u64(out, n);
            } else if let Some(n) = number.as_i64() {
                push_i64(out, n);
            } else {
                // Floats as serde_json writes them (a `Number` cannot fail).
                let _ = serde_json::to_writer(&mut *out, number);
            }
        }
        Value::String(text) => push_str(out, text),
        Value::Array(items) => {
            out.push(b'[');
            for (at, item) in items.iter().enumerate() {
                if at > 0 {
                    out.push(b',');
                }
                push_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => push_object(out, map),
    }
}

fn push_object(out: &mut Vec<u8>, map: &serde_json::Map<String, serde_json::Value>) {
    out.push(b'{');
    for (at, (key, value)) in map.iter().enumerate() {
        if at > 0 {
            out.push(b',');
        }
        push_str(out, key);
        out.push(b':');
        push_value(out, value);
    }
    out.push(b'}');
}

pub fn push_u64(out: &mut Vec<u8>, n: u64) {
    // Most numbers the log writes (sequence numbers, turns, handles) are
    // below 100: those go in without the digit loop or a copy call.
    if n < 10 {
        // `n` is a digit.
        out.push(b'0' + n as u8);
        return;
    }
    if n < 100 {
        // `n / 10` and `n % 10` are digits.
        out.extend_from_slice(&[b'0' + (n / 10) as u8, b'0' + (n % 10) as u8]);
        return;
    }
    push_u64_digits(out, n);
}

/// A signed integer as serde_json writes it.
pub(crate) fn push_i64(out: &mut Vec<u8>, n: i64) {
    if n < 0 {
        out.push(b'-');
    }
    push_u64(out, n.unsigned_abs());
}

/// "00" to "99", for writing two digits at a time.
static DIGIT_PAIRS: [u8; 200] = {
    let mut table = [0u8; 200];
    let mut n = 0;
    while n < 100 {
        // `n / 10` and `n % 10` are digits.
        table[2 * n] = b'0' + (n / 10) as u8;
        table[2 * n + 1] = b'0' + (n % 10) as u8;
        n += 1;
    }
    table
};

/// A number of any size, two digits a step (a run's `started_ms` has 13):
/// out of line, so the small numbers' path above saves no registers for it.
#[inline(never)]
fn push_u64_digits(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    while n >= 100 {
        // Below 100, so a pair's index.
        let pair = 2 * (n % 100) as usize;
        n /= 100;
        at -= 2;
        digits[at] = DIGIT_PAIRS[pair];
        digits[at + 1] = DIGIT_PAIRS[pair + 1];
    }
    if n >= 10 {
        // Below 100, so a pair's index.
        let pair = 2 * n as usize;
        at -= 2;
        digits[at] = DIGIT_PAIRS[pair];
        digits[at + 1] = DIGIT_PAIRS[pair + 1];
    } else {
        at -= 1;
        // `n` is a digit.
        digits[at] = b'0' + n as u8;
    }
    out.extend_from_slice(&digits[at..]);
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Whether any of the eight bytes is `"`, `\` or below 0x20.
fn needs_escape(word: u64) -> bool {
    let zero_byte = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
    (below_space
        | zero_byte(word ^ (ONES * u64::from(b'"')))
        | zero_byte(word ^ (ONES * u64::from(b'\\'))))
        != 0
}

/// What each byte becomes in a JSON string: 0 as it is, `u` as `\u00xx`,
/// else a backslash and this letter (serde_json's table).
static ESCAPE: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut byte = 0;
    while byte < 0x20 {
        table[byte] = b'u';
        byte += 1;
    }
    table[0x08] = b'b';
    table[0x0c] = b'f';
    table[b'\n' as usize] = b'n';
    table[b'\r' as usize] = b'r';
    table[b'\t' as usize] = b't';
    table[b'"' as usize] = b'"';
    table[b'\\' as usize] = b'\\';
    table
};

/// The eight bytes at `at`.
fn word_at(bytes: &[u8], at: usize) -> Option<[u8; 8]> {
    let word = bytes.get(at..at.checked_add(8)?)?;
    <[u8; 8]>::try_from(word).ok()
}

/// The four bytes at `at`.
fn half_word_at(bytes: &[u8], at: usize) -> Option<[u8; 4]> {
    let word = bytes.get(at..at.checked_add(4)?)?;
    <[u8; 4]>::try_from(word).ok()
}

/// A JSON string, escaped as serde_json escapes: `\"`, `\\`, the short
/// forms of backspace, form feed, newline, return and tab, `\u00xx` for the
/// other control characters; everything else as it is. Most text has
/// nothing to escape and goes in as it is.
#[inline]
pub fn push_str(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    out.push(b'"');
    if bytes.len() <= 16 {
        push_short(out, bytes);
    } else {
        push_long(out, bytes);
    }
    out.push(b'"');
}

/// Up to 16 bytes (names, ids, numbers as text: most strings the log
/// writes). Checked and copied as two overlapping words of a fixed size
/// (or three single bytes), with no loop and no copy call: the second word
/// goes in after the first is cut back to where the second begins (a byte
/// checked or written twice is the same byte).
fn push_short(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = bytes.len();
    let end = out.len() + len;
    if len >= 8 {
        if let (Some(first), Some(last)) = (word_at(bytes, 0), word_at(bytes, len - 8)) {
            if !needs_escape(u64::from_le_bytes(first)) && !needs_escape(u64::from_le_bytes(last)) {
                out.extend_from_slice(&first);
                out.truncate(end - 8);
                out.extend_from_slice(&last);
                return;
            }
        }
    } else if len >= 4 {
        if let (Some(first), Some(last)) = (half_word_at(bytes, 0), half_word_at(bytes, len - 4)) {
            let word =
                u64::from(u32::from_le_bytes(first)) | u64::from(u32::from_le_bytes(last)) << 32;
            if !needs_escape(word) {
                out.extend_from_slice(&first);
                out.truncate(end - 4);
                out.extend_from_slice(&last);
                return;
            }
        }
    } else if let (Some(&first), Some(&last)) = (bytes.first(), bytes.last()) {
        // The first, middle and last bytes are all of them.
        let middle = bytes.get(len / 2).copied().unwrap_or(last);
        let escape = |byte: u8| ESCAPE[usize::from(byte)];
        if escape(first) | escape(middle) | escape(last) == 0 {
            out.extend_from_slice(&[first, middle, last]);
            out.truncate(end);
            return;
        }
    } else {
        return;
    }
    push_escaped(out, bytes);
}

/// More than 16 bytes: checked eight at a time (the last word overlapping
/// the one before it), then copied whole.
#[inline(never)]
fn push_long(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = bytes.len();
    let mut at = 0;
    let clean = loop {
        if at + 8 >= len {
            break word_at(bytes, len.saturating_sub(8))
                .is_some_and(|word| !needs_escape(u64::from_le_bytes(word)));
        }
        if word_at(bytes, at).is_none_or(|word| needs_escape(u64::from_le_bytes(word))) {
            break false;
        }
        at += 8;
    };
    if clean {
        out.extend_from_slice(bytes);
    } else {
        push_escaped(out, bytes);
    }
}

/// `bytes` escaped, without the quotes (out of line: the fast path above
/// then saves no registers for this loop).
#[cold]
#[inline(never)]
fn push_escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut clean = 0;
    for (at, &byte) in bytes.iter().enumerate() {
        let escape = ESCAPE[usize::from(byte)];
        if escape == 0 {
            continue;
        }
        out.extend_from_slice(&bytes[clean..at]);
        out.push(b'\\');
        out.push(escape);
        if escape == b'u' {
            out.extend_from_slice(b"00");
            out.push(HEX[usize::from(byte >> 4)]);
            out.push(HEX[usize::from(byte & 0xf)]);
        }
        clean = at + 1;
    }
    out.extend_from_slice(&bytes[clean..]);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn events_become_json_lines_and_the_spare_is_reused() {
        let buffer = EventBuffer::default();
        let fields = serde_json::json!({"path": "a.md", "n": 1});
        buffer.push("store_write_succeeded", "Gather \"é\"", "0.1", 7, &fields);
        buffer.push("lua", "", "0", 0, &serde_json::Map::new());
        let mut taken = Taken::default();
        buffer.take(&mut taken);
        assert_eq!(taken.count, 2);
        assert_eq!(
            taken.text(),
            "[\"store_write_succeeded\",\"Gather \\\"é\\\"\",\"0.1\",7,{\"path\":\"a.md\",\"n\":1}]\n\
             [\"lua\",\"\",\"0\",0]\n"
        );
        let lines: Vec<_> = taken
            .text()
            .lines()
            .map(|l| parse_line(l).unwrap())
            .collect();
        assert_eq!(lines[0].1, "Gather \"é\"");
        assert_eq!(lines[0].4, fields);
        assert_eq!(lines[1].4, serde_json::json!({}));
        // Version 4's object lines still read.
        let old = parse_line(
            "{\"kind\":\"lua\",\"section\":\"\",\"task\":\"0\",\"seq\":3,\"fields\":{\"a\":1}}",
        )
        .unwrap();
        assert_eq!(
            (old.0.as_str(), old.3, old.4),
            ("lua", 3, serde_json::json!({"a": 1}))
        );
        buffer.push("a", "b", "c", 1, &fields);
        buffer.take(&mut taken);
        assert_eq!(taken.count, 1);
        buffer.close();
        buffer.push("a", "b", "c", 2, &fields);
        buffer.take(&mut taken);
        assert!(taken.is_empty() && taken.lines.is_empty());
    }

    #[test]
    fn an_event_line_written_directly_is_the_line_serde_writes() {
        let awkward = [
            "",
            "plain",
            "exactly8",
            "quote \" and \\ backslash",
            "\u{0}\u{1}\u{8}\u{9}\u{a}\u{b}\u{c}\u{d}\u{1f}\u{7f} controls",
            "é ü 漢字 🦀 and a longer run of plain text past eight bytes\n",
            "12345678\"12345678\\",
            "</script>\u{2028}\u{2029}",
        ];
        let mut cases: Vec<serde_json::Map<String, serde_json::Value>> =
            vec![serde_json::Map::new()];
        for text in awkward {
            let fields = serde_json::json!({
                text: text,
                "n": 0, "big": u64::MAX, "neg": i64::MIN, "minus": -7,
                "f": 1.0, "g": -0.000123, "h": 1e300, "i": 2.5e-8,
                "list": [null, true, false, [], {}, [text, 3]],
                "nested": {"a": {"b": [text]}, "z": null},
            });
            if let serde_json::Value::Object(map) = fields {
                cases.push(map);
            }
        }
        for (n, fields) in cases.iter().enumerate() {
            for (kind, section, task, seq) in [
                ("tool_call_succeeded", "Run", "0", 156),
                (awkward[3], awkward[4], awkward[5], u32::MAX),
                ("", "", "", 0),
            ] {
                let buffer = EventBuffer::default();
                buffer.push(kind, section, task, seq, fields);
                buffer.push_map(kind, section, task, seq, fields);
                let mut taken = Taken::default();
                buffer.take(&mut taken);
                let lines: Vec<&str> = taken.text().lines().collect();
                assert_eq!(lines.len(), 2);
                assert_eq!(lines[1], lines[0], "case {n}");
            }
        }
    }

    #[test]
    fn events_in_rows_and_switching_places_are_the_lines_serde_writes() {
        // A place is reused only while both its section and its task stay
        // the same: runs of one place, then every kind of switch (section
        // only, task only, both, to a place one string of which is the
        // other's, back again, to empty strings and back).
        let places = [
            ("Run", "0"),
            ("Run", "0"),
            ("Run", "0.1"),
            ("Loop \"x\"", "0.1"),
            ("Loop \"x\"", "0.1"),
            ("Run", "0"),
            ("0", "Run"),
            ("", ""),
            ("", ""),
            ("", "0"),
            ("0", ""),
            ("é\n漢字 and a section name past sixteen bytes", "0.12.7"),
            ("é\n漢字 and a section name past sixteen bytes", "0.12.7"),
            ("Run", "0"),
            ("Run", "0"),
        ];
        let fields = serde_json::json!({"turn": 3, "alias": "tick"});
        let fields = fields.as_object().unwrap();
        let (direct, serde) = (EventBuffer::default(), EventBuffer::default());
        let mut none = serde_json::Map::new();
        for (seq, (section, task)) in places.iter().enumerate() {
            let seq = u32::try_from(seq * 37).unwrap();
            let fields = if seq % 2 == 0 { fields } else { &none };
            direct.push_map("tool_result", section, task, seq, fields);
            serde.push("tool_result", section, task, seq, fields);
        }
        none.insert("k".into(), serde_json::Value::Null);
        // After a take the place is still known, and still right.
        let (mut taken_direct, mut taken_serde) = (Taken::default(), Taken::default());
        direct.take(&mut taken_direct);
        serde.take(&mut taken_serde);
        assert_eq!(taken_direct.text(), taken_serde.text());
        assert_eq!(taken_direct.count, 15);
        direct.push_map("a", "Run", "0", 1, &none);
        serde.push("a", "Run", "0", 1, &none);
        direct.push_map("a", "Run", "1", 2, &none);
        serde.push("a", "Run", "1", 2, &none);
        direct.take(&mut taken_direct);
        serde.take(&mut taken_serde);
        assert_eq!(taken_direct.text(), taken_serde.text());
        assert_eq!(taken_direct.text().lines().count(), 2);
    }

    /// An event encoded from its parts, with its fields as a JSON map.
    #[derive(Clone)]
    struct Owned(
        String,
        String,
        String,
        u32,
        serde_json::Map<String, serde_json::Value>,
    );

    impl LogEvent for Owned {
        fn kind(&self) -> &str {
            &self.0
        }
        fn section(&self) -> &str {
            &self.1
        }
        fn task(&self) -> &str {
            &self.2
        }
        fn seq(&self) -> u32 {
            self.3
        }
        fn write_fields(&self, out: &mut Vec<u8>) -> bool {
            if self.4.is_empty() {
                return false;
            }
            serde_json::to_writer(out, &self.4).is_ok()
        }
    }

    #[test]
    fn events_from_their_parts_are_the_lines_and_order_of_direct_ones() {
        // Events from their parts (owned and as trait objects) mixed with
        // events from a map, across takes, sharing the last place: the
        // bytes and their order are those of all-map pushes.
        let fields = serde_json::json!({"turn": 3, "text": "quote \" é\n"});
        let fields = fields.as_object().unwrap().clone();
        let none = serde_json::Map::new();
        let events: Vec<Owned> = (0..40u32)
            .map(|n| {
                let section = if n % 7 < 3 { "Run" } else { "Loop \"x\"" };
                let task = if n % 5 == 0 { "0.1" } else { "0" };
                let f = if n % 3 == 0 {
                    none.clone()
                } else {
                    fields.clone()
                };
                Owned(
                    format!("kind_{n}"),
                    section.to_string(),
                    task.to_string(),
                    n,
                    f,
                )
            })
            .collect();
        let (direct, mixed) = (EventBuffer::default(), EventBuffer::default());
        let (mut taken_direct, mut taken_mixed) = (Taken::default(), Taken::default());
        let (mut all_direct, mut all_mixed) = (String::new(), String::new());
        let mut count = 0;
        for (n, event) in events.iter().enumerate() {
            let Owned(kind, section, task, seq, f) = event;
            direct.push_map(kind, section, task, *seq, f);
            match n % 4 {
                1 => mixed.push_map(kind, section, task, *seq, f),
                3 => mixed.push_event(event as &dyn LogEvent),
                _ => mixed.push_event(event),
            }
            if n % 9 == 8 {
                direct.take(&mut taken_direct);
                mixed.take(&mut taken_mixed);
                assert_eq!(taken_mixed.count, taken_direct.count);
                count += taken_mixed.count;
                all_direct.push_str(taken_direct.text());
                all_mixed.push_str(taken_mixed.text());
            }
        }
        direct.take(&mut taken_direct);
        mixed.take(&mut taken_mixed);
        count += taken_mixed.count;
        all_direct.push_str(taken_direct.text());
        all_mixed.push_str(taken_mixed.text());
        assert_eq!(count, 40);
        assert_eq!(all_mixed, all_direct);
        let seqs: Vec<u32> = all_mixed
            .lines()
            .map(|l| parse_line(l).unwrap().3)
            .collect();
        assert_eq!(seqs, (0..40).collect::<Vec<_>>());
        // A closed buffer takes no event either.
        mixed.close();
        mixed.push_event(&Owned("a".into(), "b".into(), "c".into(), 1, none));
        mixed.take(&mut taken_mixed);
        assert!(taken_mixed.is_empty() && taken_mixed.lines.is_empty());
    }

    #[test]
    fn strings_and_numbers_of_every_short_length_are_written_as_serde_writes() {
        // Every length the word checks split differently (up to three
        // bytes, four to seven, eight to 16, longer in whole and partial
        // words), clean and with
        // each byte that needs escaping at every position, and with
        // multi-byte UTF-8 around it.
        let mut texts = Vec::new();
        const PLAIN: &str = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGH";
        for len in 0..=PLAIN.len() {
            let clean = PLAIN[..len].to_string();
            texts.push(clean.clone());
            texts.push(format!("é{clean}"));
            for at in 0..len {
                for escape in [
                    '"', '\\', '\n', '\u{0}', '\u{1f}', '\u{7f}', '\u{2028}', ' ', '~',
                ] {
                    let mut text = clean.clone();
                    text.replace_range(at..=at, escape.encode_utf8(&mut [0; 4]));
                    texts.push(text);
                }
            }
        }
        for text in &texts {
            let mut written = Vec::new();
            push_str(&mut written, text);
            assert_eq!(
                String::from_utf8(written).unwrap(),
                serde_json::to_string(text).unwrap(),
                "{text:?}"
            );
        }
        let mut numbers: Vec<u64> = (0..=1_000).collect();
        numbers.extend([9_999, 10_000, u64::from(u32::MAX), u64::MAX - 1, u64::MAX]);
        // Every digit count, odd and even, with zeros inside and at the end.
        let mut power = 1u64;
        while let Some(next) = power.checked_mul(10) {
            numbers.extend([power, power + 7, next - 1, next / 3, power * 10 - power / 2]);
            power = next;
        }
        numbers.extend([1_733_000_000_123, 1_000_000_000_005, 10_203_040_506_070_809]);
        for n in numbers {
            let mut written = Vec::new();
            push_u64(&mut written, n);
            assert_eq!(written, serde_json::to_vec(&n).unwrap(), "{n}");
            let signed = i64::try_from(n).map_or(i64::MIN, |n| -n);
            let mut written = Vec::new();
            push_i64(&mut written, signed);
            assert_eq!(written, serde_json::to_vec(&signed).unwrap(), "{signed}");
        }
    }

    #[test]
    fn work_lines_number_exchanges_in_line_order_and_a_failed_one_goes() {
        let buffer = EventBuffer::default();
        let write = |text: &'static str| {
            move |out: &mut Vec<u8>, handle: u64| {
                out.extend_from_slice(format!("{text}{handle}").as_bytes());
                true
            }
        };
        assert_eq!(buffer.push_work(true, write("x")), 0);
        assert_eq!(buffer.push_work(false, write("t")), 1);
        assert_eq!(buffer.push_work(true, write("x")), 1);
        // A line that fails to encode leaves nothing of itself.
        let failed = buffer.push_work(true, |out, _| {
            out.extend_from_slice(b"half");
            false
        });
        assert_eq!(failed, 2);
        buffer.push("e", "", "0", 0, &serde_json::Map::new());
        let mut taken = Taken::default();
        buffer.take(&mut taken);
        assert_eq!(taken.work_text(), "x0\nt1\nx1\n");
        assert_eq!((taken.count, taken.is_empty()), (1, false));
        buffer.close();
        assert_eq!(buffer.push_work(true, write("x")), 3);
        buffer.take(&mut taken);
        assert!(taken.is_empty() && taken.work.is_empty());
    }
}
