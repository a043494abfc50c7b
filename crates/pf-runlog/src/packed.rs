//! A commit's event lines and work lines as one compressed BLOB (the
//! `event_batches.packed` column, schema version 6).
//!
//! Layout: [`LZ4`] (one byte), the lines' length and the work's length
//! (each a `u64`, little-endian), then one LZ4 block of the lines followed
//! by the work. The text is very repetitive (the same keys, sections and
//! tasks on every line, each round's request beside the last), so a row is
//! about a seventh of its text: fewer pages in the WAL and the database,
//! which is most of what a commit costs. One block for both parts lets the
//! work's bodies match the events' text they repeat.

/// The layout's first byte: one LZ4 block follows the two lengths.
const LZ4: u8 = 1;

use std::sync::{Mutex, PoisonError};

const HEADER: usize = 1 + 8 + 8;

/// LZ4 cannot expand a byte of block into more than this many bytes of
/// text (a match's length grows by 255 per extra byte); lengths beyond it
/// are a corrupt header, refused before anything is allocated for them.
const MAX_RATIO: usize = 256;

/// Compresses a commit's lines for a backend to store (packing reuses its
/// buffers from one commit to the next).
#[derive(Debug, Default)]
pub struct Packer {
    joined: Vec<u8>,
    packed: Vec<u8>,
}

/// Packers a finished writer left, so each run does not allocate (and
/// fault in) its buffers anew; at most this many, each at most this large.
static SPARE_PACKERS: Mutex<Vec<Packer>> = Mutex::new(Vec::new());
const PACKERS_KEPT: usize = 2;
const PACKER_BYTES_MAX: usize = 8 * 1024 * 1024;

impl Packer {
    /// A packer with the buffers of one a finished writer left.
    pub(crate) fn reusing() -> Packer {
        SPARE_PACKERS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .unwrap_or_default()
    }

    /// Hand the buffers to a later writer.
    pub(crate) fn recycle(&mut self) {
        let packer = std::mem::take(self);
        if packer.joined.capacity() + packer.packed.capacity() > PACKER_BYTES_MAX {
            return;
        }
        let mut spares = SPARE_PACKERS.lock().unwrap_or_else(PoisonError::into_inner);
        if spares.len() < PACKERS_KEPT {
            spares.push(packer);
        }
    }

    /// `lines` and `work` packed, or `None` if they cannot be (the row is
    /// then stored as plain text, as version 5 stored it).
    pub fn pack(&mut self, lines: &[u8], work: &[u8]) -> Option<&[u8]> {
        self.joined.clear();
        self.joined.extend_from_slice(lines);
        self.joined.extend_from_slice(work);
        let bound = HEADER + lz4_flex::block::get_maximum_output_size(self.joined.len());
        // Only ever grown: zeroing the whole bound on every commit was about
        // a quarter of the packing's instructions (the encoder overwrites
        // what it uses, and only that part is handed on).
        if self.packed.len() < bound {
            self.packed.resize(bound, 0);
        }
        let packed = &mut self.packed[..bound];
        packed[0] = LZ4;
        packed[1..9].copy_from_slice(&u64::try_from(lines.len()).ok()?.to_le_bytes());
        packed[9..HEADER].copy_from_slice(&u64::try_from(work.len()).ok()?.to_le_bytes());
        let written = lz4_flex::block::compress_into(&self.joined, &mut packed[HEADER..]).ok()?;
        self.packed.get(..HEADER + written)
    }
}

/// A packed row's text, put back.
#[derive(Debug)]
pub(crate) struct Unpacked {
    text: String,
    lines_len: usize,
}

impl Unpacked {
    /// The event lines.
    pub(crate) fn lines(&self) -> &str {
        self.text.get(..self.lines_len).unwrap_or_default()
    }

    /// The work lines (empty when the commit had none).
    pub(crate) fn work(&self) -> &str {
        self.text.get(self.lines_len..).unwrap_or_default()
    }
}

/// Unpack a row [`Packer::pack`] wrote. The error says what is wrong with
/// the bytes; the caller names the run.
pub(crate) fn unpack(packed: &[u8]) -> Result<Unpacked, String> {
    let (header, block) = packed
        .split_at_checked(HEADER)
        .ok_or_else(|| format!("{} bytes, shorter than its header", packed.len()))?;
    if header[0] != LZ4 {
        return Err(format!("unknown layout {}", header[0]));
    }
    let length = |bytes: &[u8]| {
        <[u8; 8]>::try_from(bytes)
            .ok()
            .map(u64::from_le_bytes)
            .and_then(|n| usize::try_from(n).ok())
    };
    let lines_len = length(&header[1..9]);
    let work_len = length(&header[9..HEADER]);
    let total = lines_len
        .zip(work_len)
        .and_then(|(lines, work)| lines.checked_add(work))
        .filter(|&total| total <= block.len().saturating_mul(MAX_RATIO))
        .ok_or_else(|| format!("its lengths do not fit its {} bytes", block.len()))?;
    let lines_len = lines_len.unwrap_or_default();
    let mut text = vec![0; total];
    let written = lz4_flex::block::decompress_into(block, &mut text)
        .map_err(|err| format!("cannot decompress: {err}"))?;
    if written != total {
        return Err(format!("{written} bytes decompressed, {total} expected"));
    }
    let text = String::from_utf8(text).map_err(|err| format!("not UTF-8: {err}"))?;
    if !text.is_char_boundary(lines_len) {
        return Err("its lines end inside a character".to_owned());
    }
    Ok(Unpacked { text, lines_len })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn both_parts_come_back_as_they_went_in() {
        let mut packer = Packer::default();
        for (lines, work) in [
            ("", ""),
            ("[\"a\",\"S\",\"0\",1]\n", ""),
            ("", "[\"x\",1]\n"),
            (
                "é[\"a\"]\n".repeat(300).as_str(),
                "[\"x\",\"ü\"]\n".repeat(50).as_str(),
            ),
        ] {
            let packed = packer.pack(lines.as_bytes(), work.as_bytes()).unwrap();
            let back = unpack(packed).unwrap();
            assert_eq!((back.lines(), back.work()), (lines, work));
        }
    }

    /// The encoder is lz4_flex's fast one: every length up to a few blocks'
    /// worth, over text that matches a lot, a little and not at all, comes
    /// back byte for byte through the safe decoder, with one packer reused
    /// throughout (its buffer keeps the longest row's bytes past the end).
    #[test]
    fn rows_of_every_shape_come_back_through_a_reused_packer() {
        // Printable bytes that barely repeat: the top bits of a
        // multiplicative hash of each position (a new stream for each call).
        let mut stream = 0u64;
        let mut noise = |n: usize| -> String {
            stream += 1;
            let hash = |at: u64| (at ^ stream << 40).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58;
            (0..n as u64)
                .map(|at| char::from(b' ' + hash(at) as u8))
                .collect()
        };
        let line = "[\"tool_call_succeeded\",\"Run\",\"0\",14]\n";
        let mut packer = Packer::default();
        let mut longest = String::new();
        for len in (0..300).chain([1_000, 4_095, 4_096, 65_535, 65_536, 70_000, 300_000]) {
            let repetitive: String = line.repeat(len / line.len() + 1)[..len].to_string();
            let random = noise(len);
            let mixed: String = repetitive
                .chars()
                .zip(random.chars())
                .enumerate()
                .map(|(at, (a, b))| if at % 7 == 0 { b } else { a })
                .collect();
            for (lines, work) in [
                (&repetitive, &random),
                (&random, &repetitive),
                (&mixed, &longest),
            ] {
                let packed = packer.pack(lines.as_bytes(), work.as_bytes()).unwrap();
                let back = unpack(packed).unwrap();
                assert_eq!(back.lines(), lines.as_str(), "lines of length {len}");
                assert_eq!(back.work(), work.as_str(), "work of length {len}");
            }
            if len > longest.len() && len <= 4_096 {
                longest = mixed;
            }
        }
    }

    #[test]
    fn repetitive_lines_pack_small() {
        let lines = "[\"tool_call_started\",\"Loop\",\"0\",12,{\"tool\":\"tick\"}]\n".repeat(300);
        let packed = Packer::default().pack(lines.as_bytes(), b"").unwrap().len();
        assert!(packed * 10 < lines.len(), "{packed} of {}", lines.len());
    }

    #[test]
    fn damaged_bytes_are_an_error_never_a_panic() {
        let lines = "[\"a\",\"S\",\"0\",1,{\"k\":\"v\"}]\n".repeat(40);
        let good = Packer::default()
            .pack(lines.as_bytes(), b"[\"x\"]\n")
            .unwrap()
            .to_vec();
        assert!(unpack(&good[..5]).is_err());
        assert!(unpack(&good[..good.len() - 1]).is_err());
        let mut layout = good.clone();
        layout[0] = 9;
        assert!(unpack(&layout).unwrap_err().contains("layout"));
        let mut huge = good.clone();
        huge[1..9].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(unpack(&huge).unwrap_err().contains("lengths"));
        let mut split = good.clone();
        split[1..9].copy_from_slice(&1u64.to_le_bytes());
        assert!(unpack(&split).is_err());
        // Every single damaged byte: an error or the text, never a panic.
        for at in 0..good.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut bad = good.clone();
                bad[at] ^= flip;
                let _ = unpack(&bad);
            }
        }
    }
}
