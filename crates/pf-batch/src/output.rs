//! The batch's output file: one line per finished input, written whole as it
//! finishes (JSON Lines, or CSV with a header), and what an earlier file says
//! was done, for `--resume`.
//!
//! Each line is encoded in memory and handed to the file in one write, so a
//! reader (or a crash) never meets half a line but at the very end; a resume
//! cuts such a torn tail off before it appends.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// How the output is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputFormat {
    #[default]
    Jsonl,
    Csv,
}

/// How an input's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunOutcome {
    Completed,
    Failed,
    Cancelled,
}

impl RunOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RunOutcome::Completed => "completed",
            RunOutcome::Failed => "failed",
            RunOutcome::Cancelled => "cancelled",
        }
    }
}

/// A failed run's error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunError {
    pub kind: String,
    pub message: String,
}

/// The tokens a run used, as its models reported them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// Which input, and which repetition of it (0 without `--repeat`).
pub type ItemKey = (u64, u32);

/// One finished input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputLine {
    /// The input's place among the inputs, from 0.
    pub index: u64,
    /// Which repetition (`--repeat N`), from 0; absent without `--repeat`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<u32>,
    /// The batch id the run is logged under (`runs --batch ID`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    /// The run's execution id (its run log entry).
    pub execution: String,
    pub seed: u64,
    pub outcome: RunOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
    /// `null` when no model reported usage.
    pub usage: Option<TokenUsage>,
    pub duration_ms: u64,
    /// The text of the prompt's declared `output:` file, after a completed run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

impl OutputLine {
    pub fn key(&self) -> ItemKey {
        (self.index, self.repeat.unwrap_or(0))
    }
}

/// The CSV columns, in order.
const CSV_COLUMNS: [&str; 13] = [
    "index",
    "repeat",
    "batch",
    "execution",
    "seed",
    "outcome",
    "result",
    "error_kind",
    "error_message",
    "input_tokens",
    "output_tokens",
    "duration_ms",
    "output",
];

/// Why the output file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("cannot open the output {}: {error}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        error: io::Error,
    },
    #[error(
        "the output {} already holds results: pass --resume to continue it, or choose another file",
        path.display()
    )]
    Exists { path: PathBuf },
    #[error("cannot write the output {}: {error}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        error: io::Error,
    },
}

/// What an earlier output file says: the inputs done, and the runs to resume.
#[derive(Debug, Default)]
pub struct Previous {
    /// Inputs with a completed line.
    pub completed: HashSet<ItemKey>,
    /// Inputs whose last line is failed or cancelled: that run's execution id.
    pub unfinished: HashMap<ItemKey, String>,
    /// Lines that could not be read (not counted as done).
    pub unreadable: u64,
    /// Bytes of a torn last line that were cut off.
    pub torn_bytes: u64,
    /// The batch id of the file's first line that names one: a resumed
    /// batch logs its runs under the same id.
    pub batch: Option<String>,
}

/// Appends finished inputs to the output file.
#[derive(Debug)]
pub struct OutputWriter {
    path: PathBuf,
    file: File,
    format: OutputFormat,
    line: Vec<u8>,
}

impl OutputWriter {
    /// Open `path` for a batch. Without `resume` the file must be new or
    /// empty; with it, what the file holds is read back (a torn last line cut
    /// off) and new lines are appended.
    pub fn open(
        path: &Path,
        format: OutputFormat,
        resume: bool,
    ) -> Result<(OutputWriter, Previous), OutputError> {
        let open_error = |error| OutputError::Open {
            path: path.to_path_buf(),
            error,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(open_error)?;
        let length = file.metadata().map_err(open_error)?.len();
        let mut previous = Previous::default();
        if length > 0 {
            if !resume {
                return Err(OutputError::Exists {
                    path: path.to_path_buf(),
                });
            }
            previous.torn_bytes = cut_torn_tail(&mut file, length).map_err(open_error)?;
            file.seek(SeekFrom::Start(0)).map_err(open_error)?;
            match format {
                OutputFormat::Jsonl => read_jsonl(&file, &mut previous).map_err(open_error)?,
                OutputFormat::Csv => read_csv(&file, &mut previous).map_err(open_error)?,
            }
        }
        let mut writer = OutputWriter {
            path: path.to_path_buf(),
            file,
            format,
            line: Vec::with_capacity(1024),
        };
        let empty = writer.file.metadata().map_err(open_error)?.len() == 0;
        if format == OutputFormat::Csv && empty {
            let mut header = csv::Writer::from_writer(Vec::new());
            header
                .write_record(CSV_COLUMNS)
                .map_err(|e| writer.write_error(io::Error::other(e)))?;
            let bytes = header
                .into_inner()
                .map_err(|e| writer.write_error(io::Error::other(e.to_string())))?;
            writer
                .file
                .write_all(&bytes)
                .map_err(|e| writer.write_error(e))?;
        }
        Ok((writer, previous))
    }

    fn write_error(&self, error: io::Error) -> OutputError {
        OutputError::Write {
            path: self.path.clone(),
            error,
        }
    }

    /// Append one finished input, whole, in one write.
    pub fn write(&mut self, line: &OutputLine) -> Result<(), OutputError> {
        self.line.clear();
        match self.format {
            OutputFormat::Jsonl => {
                serde_json::to_writer(&mut self.line, line)
                    .map_err(|e| self.write_error(io::Error::other(e)))?;
                self.line.push(b'\n');
            }
            OutputFormat::Csv => {
                let mut row = csv::Writer::from_writer(std::mem::take(&mut self.line));
                row.write_record(csv_record(line))
                    .map_err(|e| self.write_error(io::Error::other(e)))?;
                self.line = row
                    .into_inner()
                    .map_err(|e| self.write_error(io::Error::other(e.to_string())))?;
            }
        }
        let file = &mut self.file;
        file.write_all(&self.line)
            .map_err(|error| OutputError::Write {
                path: self.path.clone(),
                error,
            })
    }

    /// Make what was written durable.
    pub fn sync(&mut self) -> Result<(), OutputError> {
        self.file.sync_data().map_err(|error| OutputError::Write {
            path: self.path.clone(),
            error,
        })
    }
}

fn csv_record(line: &OutputLine) -> [String; 13] {
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    [
        line.index.to_string(),
        line.repeat.map(|r| r.to_string()).unwrap_or_default(),
        text(&line.batch),
        line.execution.clone(),
        line.seed.to_string(),
        line.outcome.as_str().to_string(),
        text(&line.result),
        line.error
            .as_ref()
            .map(|e| e.kind.clone())
            .unwrap_or_default(),
        line.error
            .as_ref()
            .map(|e| e.message.clone())
            .unwrap_or_default(),
        line.usage
            .map(|u| u.input_tokens.to_string())
            .unwrap_or_default(),
        line.usage
            .map(|u| u.output_tokens.to_string())
            .unwrap_or_default(),
        line.duration_ms.to_string(),
        text(&line.output),
    ]
}

/// Cut a last line that has no line ending (a write torn by a crash) off
/// the file; how many bytes went.
fn cut_torn_tail(file: &mut File, length: u64) -> io::Result<u64> {
    let mut last = [0u8; 1];
    file.seek(SeekFrom::Start(length - 1))?;
    file.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok(0);
    }
    // Find the last line ending, reading backwards in blocks.
    let mut end = length;
    let mut block = vec![0u8; 64 * 1024];
    let keep = loop {
        if end == 0 {
            break 0;
        }
        let start = end.saturating_sub(block.len() as u64);
        let size = (end - start) as usize;
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut block[..size])?;
        if let Some(at) = block[..size].iter().rposition(|b| *b == b'\n') {
            break start + at as u64 + 1;
        }
        end = start;
    };
    file.set_len(keep)?;
    Ok(length - keep)
}

fn note(previous: &mut Previous, key: ItemKey, outcome: RunOutcome, execution: String) {
    match outcome {
        RunOutcome::Completed => {
            previous.unfinished.remove(&key);
            previous.completed.insert(key);
        }
        RunOutcome::Failed | RunOutcome::Cancelled => {
            if !previous.completed.contains(&key) {
                previous.unfinished.insert(key, execution);
            }
        }
    }
}

fn read_jsonl(file: &File, previous: &mut Previous) -> io::Result<()> {
    #[derive(Deserialize)]
    struct Done {
        index: u64,
        #[serde(default)]
        repeat: Option<u32>,
        #[serde(default)]
        batch: Option<String>,
        execution: String,
        outcome: RunOutcome,
    }
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Done>(&line) {
            Ok(done) => {
                if previous.batch.is_none() {
                    previous.batch = done.batch;
                }
                note(
                    previous,
                    (done.index, done.repeat.unwrap_or(0)),
                    done.outcome,
                    done.execution,
                )
            }
            Err(_) => previous.unreadable += 1,
        }
    }
}

fn read_csv(file: &File, previous: &mut Previous) -> io::Result<()> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .from_reader(BufReader::new(file));
    let headers = reader.headers().map_err(io::Error::other)?.clone();
    let column = |name: &str| headers.iter().position(|h| h == name);
    let batch = column("batch");
    let (Some(index), Some(repeat), Some(execution), Some(outcome)) = (
        column("index"),
        column("repeat"),
        column("execution"),
        column("outcome"),
    ) else {
        return Err(io::Error::other(
            "its header is not a batch output's (index, repeat, execution, outcome)",
        ));
    };
    for row in reader.records() {
        let Ok(row) = row else {
            previous.unreadable += 1;
            continue;
        };
        let parsed = (|| {
            let i: u64 = row.get(index)?.parse().ok()?;
            let r: u32 = match row.get(repeat)? {
                "" => 0,
                text => text.parse().ok()?,
            };
            let o = match row.get(outcome)? {
                "completed" => RunOutcome::Completed,
                "failed" => RunOutcome::Failed,
                "cancelled" => RunOutcome::Cancelled,
                _ => return None,
            };
            Some(((i, r), o, row.get(execution)?.to_string()))
        })();
        if previous.batch.is_none() {
            previous.batch = batch
                .and_then(|b| row.get(b))
                .filter(|b| !b.is_empty())
                .map(str::to_string);
        }
        match parsed {
            Some((key, o, e)) => note(previous, key, o, e),
            None => previous.unreadable += 1,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(index: u64, outcome: RunOutcome) -> OutputLine {
        OutputLine {
            index,
            repeat: None,
            batch: None,
            execution: format!("run-{index}"),
            seed: 7,
            outcome,
            result: (outcome == RunOutcome::Completed).then(|| format!("r{index}, \"q\"\nx")),
            error: (outcome == RunOutcome::Failed).then(|| RunError {
                kind: "Lua".into(),
                message: "boom".into(),
            }),
            usage: Some(TokenUsage {
                input_tokens: 3,
                output_tokens: 4,
            }),
            duration_ms: 12,
            output: None,
        }
    }

    #[test]
    fn a_fresh_file_is_written_and_an_existing_one_needs_resume() {
        for format in [OutputFormat::Jsonl, OutputFormat::Csv] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("out");
            let (mut w, prev) = OutputWriter::open(&path, format, false).unwrap();
            assert!(prev.completed.is_empty());
            w.write(&line(0, RunOutcome::Completed)).unwrap();
            w.write(&line(1, RunOutcome::Failed)).unwrap();
            w.write(&line(2, RunOutcome::Cancelled)).unwrap();
            drop(w);
            assert!(matches!(
                OutputWriter::open(&path, format, false),
                Err(OutputError::Exists { .. })
            ));
            let (mut w, prev) = OutputWriter::open(&path, format, true).unwrap();
            assert_eq!(prev.completed, HashSet::from([(0, 0)]));
            assert_eq!(prev.unfinished.len(), 2);
            assert_eq!(prev.unfinished[&(1, 0)], "run-1");
            // The failed one completes on resume: it is done, not unfinished.
            w.write(&line(1, RunOutcome::Completed)).unwrap();
            drop(w);
            let (_, prev) = OutputWriter::open(&path, format, true).unwrap();
            assert_eq!(prev.completed, HashSet::from([(0, 0), (1, 0)]));
            assert_eq!(prev.unfinished.keys().collect::<Vec<_>>(), vec![&(2, 0)]);
            assert_eq!(prev.unreadable, 0, "{format:?}");
        }
    }

    #[test]
    fn a_torn_last_line_is_cut_off_on_resume() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let (mut w, _) = OutputWriter::open(&path, OutputFormat::Jsonl, false).unwrap();
        w.write(&line(0, RunOutcome::Completed)).unwrap();
        drop(w);
        let whole = std::fs::read(&path).unwrap();
        let mut torn = whole.clone();
        torn.extend_from_slice(b"{\"index\":1,\"execution\":\"run-1\",\"outc");
        std::fs::write(&path, &torn).unwrap();
        let (_, prev) = OutputWriter::open(&path, OutputFormat::Jsonl, true).unwrap();
        assert_eq!(prev.torn_bytes, (torn.len() - whole.len()) as u64);
        assert_eq!(std::fs::read(&path).unwrap(), whole);
        assert_eq!(prev.completed, HashSet::from([(0, 0)]));
    }

    #[test]
    fn the_jsonl_line_has_the_fixed_fields() {
        let text = serde_json::to_string(&line(4, RunOutcome::Failed)).unwrap();
        assert_eq!(
            text,
            r#"{"index":4,"execution":"run-4","seed":7,"outcome":"failed","error":{"kind":"Lua","message":"boom"},"usage":{"input_tokens":3,"output_tokens":4},"duration_ms":12}"#
        );
    }
}
