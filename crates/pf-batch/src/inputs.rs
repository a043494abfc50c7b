//! A batch's inputs, read as a stream: JSON Lines (an args object or an
//! argument string per line), CSV with a header row (the columns are declared
//! args, each cell typed as `--arg` types it), or JSON Lines on stdin.
//!
//! [`Inputs::open`] reads the whole source once to check every line and count
//! the inputs, keeping nothing but the bad lines' reports (stdin is spooled to
//! an unnamed temporary file on the way, so it can be read again);
//! [`Inputs::records`] then streams them again for the runs. Memory stays flat
//! whatever the size of the file: one line (at most [`MAX_LINE_BYTES`]) at a
//! time.
//!
//! An input's `index` is its place among the inputs, from 0: a JSONL file's
//! non-blank lines, a CSV file's data rows. A bad line keeps its index, so
//! fixing it later does not renumber the rest.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, Write};
use std::path::{Path, PathBuf};

use pf_syntax::{ArgDecl, ArgType};
use serde_json::{Map, Value as Json};

/// The longest input line read; a longer one is a bad line.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// How many bad lines an error lists (their count is always given).
pub const BAD_LINES_SHOWN: usize = 20;

/// Where the inputs come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputSource {
    File(PathBuf),
    /// `-`: JSON Lines on stdin.
    Stdin,
}

impl InputSource {
    /// `-` is stdin; anything else a file.
    pub fn from_arg(arg: &Path) -> InputSource {
        if arg.as_os_str() == "-" {
            InputSource::Stdin
        } else {
            InputSource::File(arg.to_path_buf())
        }
    }

    /// How the source is named in messages.
    pub fn display(&self) -> String {
        match self {
            InputSource::File(path) => path.display().to_string(),
            InputSource::Stdin => "stdin".to_string(),
        }
    }

    /// A file ending in `.csv` (any case) is CSV; everything else JSON Lines.
    pub fn format(&self) -> InputFormat {
        match self {
            InputSource::File(path)
                if path
                    .extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("csv")) =>
            {
                InputFormat::Csv
            }
            _ => InputFormat::Jsonl,
        }
    }
}

/// How the inputs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputFormat {
    Jsonl,
    Csv,
}

/// One input, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// Its place among the inputs, from 0.
    pub index: u64,
    /// The line it starts on, from 1.
    pub line: u64,
    /// The run's argument string: the args object's JSON, or the line's string.
    pub args: String,
}

/// A line that cannot be an input, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    pub index: u64,
    pub line: u64,
    pub message: String,
}

/// What a record of the source was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Input(Input),
    Bad(BadLine),
}

/// Why a batch cannot read its inputs.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("cannot read the inputs {source_name}: {error}")]
    Read {
        source_name: String,
        #[source]
        error: io::Error,
    },
    #[error("{source_name}: {message}")]
    Header {
        source_name: String,
        message: String,
    },
}

/// The checked inputs: how many there are, which lines are bad, and a way to
/// stream them again.
#[derive(Debug)]
pub struct Inputs {
    source: InputSource,
    format: InputFormat,
    /// The spooled copy of stdin.
    spool: Option<File>,
    decls: Option<Vec<ArgDecl>>,
    /// Inputs, bad ones included.
    pub total: u64,
    /// The first [`BAD_LINES_SHOWN`] bad lines.
    pub bad: Vec<BadLine>,
    /// How many bad lines there are.
    pub bad_count: u64,
}

impl Inputs {
    /// Read `source` through once, checking every line against `decls` (the
    /// prompt's `args:`, if it declares them).
    pub fn open(source: InputSource, decls: Option<&[ArgDecl]>) -> Result<Inputs, InputError> {
        let format = source.format();
        let source_name = source.display();
        let read_error = |error| InputError::Read {
            source_name: source_name.clone(),
            error,
        };
        let mut inputs = Inputs {
            format,
            spool: None,
            decls: decls.map(<[ArgDecl]>::to_vec),
            total: 0,
            bad: Vec::new(),
            bad_count: 0,
            source,
        };
        let records = match &inputs.source {
            InputSource::File(path) => {
                let file = File::open(path).map_err(read_error)?;
                inputs.scan(Box::new(file))?
            }
            InputSource::Stdin => {
                let mut spool = tempfile::tempfile().map_err(read_error)?;
                let tee = Tee {
                    from: io::stdin().lock(),
                    to: &mut spool,
                };
                let counted = inputs.scan(Box::new(tee))?;
                inputs.spool = Some(spool);
                counted
            }
        };
        let (total, bad, bad_count) = records;
        inputs.total = total;
        inputs.bad = bad;
        inputs.bad_count = bad_count;
        Ok(inputs)
    }

    fn scan<'a>(&self, reader: Box<dyn Read + 'a>) -> Result<(u64, Vec<BadLine>, u64), InputError> {
        let mut total = 0;
        let mut bad = Vec::new();
        let mut bad_count = 0;
        for record in Records::new(reader, self.format, self.decls.as_deref(), &self.source)? {
            total += 1;
            if let Record::Bad(line) = record.map_err(|error| InputError::Read {
                source_name: self.source.display(),
                error,
            })? {
                bad_count += 1;
                if bad.len() < BAD_LINES_SHOWN {
                    bad.push(line);
                }
            }
        }
        Ok((total, bad, bad_count))
    }

    /// Stream the inputs again from the start.
    pub fn records(&self) -> Result<Records<'static>, InputError> {
        let read_error = |error| InputError::Read {
            source_name: self.source.display(),
            error,
        };
        let reader: Box<dyn Read> = match (&self.source, &self.spool) {
            (InputSource::File(path), _) => Box::new(File::open(path).map_err(read_error)?),
            (InputSource::Stdin, Some(spool)) => {
                let mut again = spool.try_clone().map_err(read_error)?;
                again.rewind().map_err(read_error)?;
                Box::new(again)
            }
            (InputSource::Stdin, None) => {
                return Err(read_error(io::Error::other("stdin was not read")))
            }
        };
        Records::new(reader, self.format, self.decls.as_deref(), &self.source)
    }

    /// The source, as messages name it.
    pub fn source_name(&self) -> String {
        self.source.display()
    }

    /// Every bad line reported, one per line, `SOURCE:LINE: message`, and a
    /// last line counting those not shown.
    pub fn bad_report(&self) -> String {
        let name = self.source_name();
        let mut text = String::new();
        for bad in &self.bad {
            text.push_str(&format!("{name}:{}: {}\n", bad.line, bad.message));
        }
        let unshown = self.bad_count.saturating_sub(self.bad.len() as u64);
        if unshown > 0 {
            text.push_str(&format!("{name}: and {unshown} more bad lines\n"));
        }
        text
    }
}

/// Copies what is read from `from` into `to`.
struct Tee<'a, R> {
    from: R,
    to: &'a mut File,
}

impl<R: Read> Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.from.read(buf)?;
        self.to.write_all(&buf[..n])?;
        Ok(n)
    }
}

/// The records of a source, in order.
pub struct Records<'a> {
    kind: Kind<'a>,
    decls: Option<Vec<ArgDecl>>,
    next_index: u64,
}

enum Kind<'a> {
    Jsonl {
        reader: BufReader<Box<dyn Read + 'a>>,
        line: u64,
        buf: Vec<u8>,
    },
    Csv {
        reader: csv::Reader<Box<dyn Read + 'a>>,
        /// Each column's arg.
        columns: Vec<ArgDecl>,
        record: csv::StringRecord,
    },
}

impl<'a> Records<'a> {
    fn new<R: Read + 'a>(
        reader: R,
        format: InputFormat,
        decls: Option<&[ArgDecl]>,
        source: &InputSource,
    ) -> Result<Records<'a>, InputError> {
        let reader: Box<dyn Read + 'a> = Box::new(reader);
        let kind = match format {
            InputFormat::Jsonl => Kind::Jsonl {
                reader: BufReader::with_capacity(64 * 1024, reader),
                line: 0,
                buf: Vec::new(),
            },
            InputFormat::Csv => {
                let header_error = |message: String| InputError::Header {
                    source_name: source.display(),
                    message,
                };
                let Some(decls) = decls else {
                    return Err(header_error(
                        "CSV inputs name the prompt's args in their header, and this prompt \
                         declares no `args:`; give a JSON Lines file of argument strings instead"
                            .to_string(),
                    ));
                };
                let mut reader = csv::ReaderBuilder::new()
                    .has_headers(true)
                    .from_reader(reader);
                let header = reader.headers().map_err(|e| match e.into_kind() {
                    csv::ErrorKind::Io(error) => InputError::Read {
                        source_name: source.display(),
                        error,
                    },
                    other => header_error(format!("line 1: the header cannot be read: {other:?}")),
                })?;
                let mut columns: Vec<ArgDecl> = Vec::new();
                for name in header.iter() {
                    let name = name.trim();
                    let Some(decl) = decls.iter().find(|d| d.name == name) else {
                        return Err(header_error(format!(
                            "line 1: column `{name}` is not a declared arg; declared: {}",
                            declared(decls)
                        )));
                    };
                    if columns.iter().any(|c| c.name == name) {
                        return Err(header_error(format!(
                            "line 1: column `{name}` appears twice"
                        )));
                    }
                    columns.push(decl.clone());
                }
                Kind::Csv {
                    reader,
                    columns,
                    record: csv::StringRecord::new(),
                }
            }
        };
        Ok(Records {
            kind,
            decls: decls.map(<[ArgDecl]>::to_vec),
            next_index: 0,
        })
    }

    fn take_index(&mut self) -> u64 {
        let index = self.next_index;
        self.next_index += 1;
        index
    }
}

impl Iterator for Records<'_> {
    type Item = io::Result<Record>;

    fn next(&mut self) -> Option<io::Result<Record>> {
        match &mut self.kind {
            Kind::Jsonl { reader, line, buf } => loop {
                buf.clear();
                let read = match read_line_capped(reader, buf) {
                    Ok(read) => read,
                    Err(error) => return Some(Err(error)),
                };
                let (too_long, number) = match read {
                    LineRead::End => return None,
                    LineRead::Line => (false, *line + 1),
                    LineRead::TooLong => (true, *line + 1),
                };
                *line = number;
                if too_long {
                    let index = self.take_index();
                    return Some(Ok(Record::Bad(BadLine {
                        index,
                        line: number,
                        message: format!(
                            "the line is longer than {} MiB",
                            MAX_LINE_BYTES / (1024 * 1024)
                        ),
                    })));
                }
                let text = match std::str::from_utf8(buf) {
                    Ok(text) => text.trim(),
                    Err(_) => {
                        let index = self.take_index();
                        return Some(Ok(Record::Bad(BadLine {
                            index,
                            line: number,
                            message: "the line is not valid UTF-8".to_string(),
                        })));
                    }
                };
                if text.is_empty() {
                    continue;
                }
                let checked = json_line(text, self.decls.as_deref());
                let index = self.take_index();
                return Some(Ok(match checked {
                    Ok(args) => Record::Input(Input {
                        index,
                        line: number,
                        args,
                    }),
                    Err(message) => Record::Bad(BadLine {
                        index,
                        line: number,
                        message,
                    }),
                }));
            },
            Kind::Csv {
                reader,
                columns,
                record,
            } => {
                let read = reader.read_record(record);
                let line = record.position().map_or(0, |p| p.line());
                // A row's args, or the line its problem was found on and the problem.
                let checked: Result<String, (u64, String)> = match read {
                    Ok(false) => return None,
                    Ok(true) => csv_row(record, columns, self.decls.as_deref().unwrap_or(&[]))
                        .map_err(|message| (line, message)),
                    Err(error) => {
                        let at = error.position().map_or(line, |p| p.line());
                        match error.into_kind() {
                            csv::ErrorKind::Io(error) => return Some(Err(error)),
                            csv::ErrorKind::UnequalLengths {
                                expected_len, len, ..
                            } => Err((
                                at,
                                format!("{len} fields where the header has {expected_len}"),
                            )),
                            csv::ErrorKind::Utf8 { .. } => {
                                Err((at, "the row is not valid UTF-8".to_string()))
                            }
                            other => Err((at, format!("the row cannot be read: {other:?}"))),
                        }
                    }
                };
                let index = self.take_index();
                Some(Ok(match checked {
                    Ok(args) => Record::Input(Input { index, line, args }),
                    Err((line, message)) => Record::Bad(BadLine {
                        index,
                        line,
                        message,
                    }),
                }))
            }
        }
    }
}

enum LineRead {
    End,
    Line,
    TooLong,
}

/// Read one line (its ending dropped) into `buf`, at most [`MAX_LINE_BYTES`];
/// the rest of a longer line is read past and dropped.
fn read_line_capped<R: BufRead>(reader: &mut R, buf: &mut Vec<u8>) -> io::Result<LineRead> {
    let mut too_long = false;
    let mut any = false;
    loop {
        let available = reader.fill_buf()?;
        if available.is_empty() {
            break;
        }
        any = true;
        let (chunk, done) = match memchr(available) {
            Some(at) => (&available[..at], Some(at + 1)),
            None => (available, None),
        };
        if !too_long {
            if buf.len() + chunk.len() > MAX_LINE_BYTES {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        let consumed = done.unwrap_or(available.len());
        reader.consume(consumed);
        if done.is_some() {
            break;
        }
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    Ok(match (any, too_long) {
        (false, _) => LineRead::End,
        (true, true) => LineRead::TooLong,
        (true, false) => LineRead::Line,
    })
}

fn memchr(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|b| *b == b'\n')
}

/// The declared args, as messages list them.
fn declared(decls: &[ArgDecl]) -> String {
    if decls.is_empty() {
        return "none".to_string();
    }
    decls
        .iter()
        .map(|d| format!("{} ({})", d.name, d.ty.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A JSONL line's argument string, or why it cannot be one.
fn json_line(text: &str, decls: Option<&[ArgDecl]>) -> Result<String, String> {
    let value: Json = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    match value {
        Json::String(args) => Ok(args),
        Json::Object(object) => {
            let Some(decls) = decls else {
                return Err(
                    "an args object needs an `args:` declaration; this prompt takes \
                            free text: give the argument string as a JSON string"
                        .to_string(),
                );
            };
            check_object(&object, decls)?;
            Ok(text.to_string())
        }
        _ => Err("expected an args object or an argument string (a JSON string)".to_string()),
    }
}

/// Every key declared, every value of its type, every required arg present.
fn check_object(object: &Map<String, Json>, decls: &[ArgDecl]) -> Result<(), String> {
    for (name, value) in object {
        let Some(decl) = decls.iter().find(|d| d.name == *name) else {
            return Err(format!(
                "`{name}` is not a declared arg; declared: {}",
                declared(decls)
            ));
        };
        if !decl.ty.admits(value) {
            return Err(format!(
                "`{name}` is {} {}, got {value}",
                article(decl.ty),
                decl.ty.name()
            ));
        }
    }
    for decl in decls {
        if !decl.optional && decl.default.is_none() && !object.contains_key(&decl.name) {
            return Err(format!("the required arg `{}` is missing", decl.name));
        }
    }
    Ok(())
}

fn article(ty: ArgType) -> &'static str {
    if ty == ArgType::Integer {
        "an"
    } else {
        "a"
    }
}

/// A CSV row's args object: empty cells left out, the rest typed by their column.
fn csv_row(
    record: &csv::StringRecord,
    columns: &[ArgDecl],
    decls: &[ArgDecl],
) -> Result<String, String> {
    let mut object = Map::new();
    for (cell, decl) in record.iter().zip(columns) {
        if cell.is_empty() {
            continue;
        }
        let value = decl.ty.value_of_text(cell).ok_or_else(|| {
            format!(
                "column `{}`: {cell:?} is not {} {}",
                decl.name,
                article(decl.ty),
                decl.ty.name()
            )
        })?;
        object.insert(decl.name.clone(), value);
    }
    check_object(&object, decls)?;
    Ok(Json::Object(object).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decl(name: &str, ty: ArgType, optional: bool) -> ArgDecl {
        ArgDecl {
            name: name.to_string(),
            ty,
            optional,
            description: None,
            default: None,
        }
    }

    fn records(text: &str, format: InputFormat, decls: Option<&[ArgDecl]>) -> Vec<Record> {
        let source = InputSource::File(PathBuf::from("in"));
        Records::new(io::Cursor::new(text.to_string()), format, decls, &source)
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn jsonl_lines_are_objects_or_strings_and_bad_ones_keep_their_index() {
        let decls = [
            decl("topic", ArgType::String, false),
            decl("n", ArgType::Integer, true),
        ];
        let got = records(
            "{\"topic\":\"tides\",\"n\":2}\n\n\"free text\"\n{\"n\":\"x\",\"topic\":\"a\"}\nnot json\n{\"n\":1}\r\n{\"other\":1,\"topic\":\"t\"}\n",
            InputFormat::Jsonl,
            Some(&decls),
        );
        assert_eq!(
            got[0],
            Record::Input(Input {
                index: 0,
                line: 1,
                args: "{\"topic\":\"tides\",\"n\":2}".into()
            })
        );
        assert_eq!(
            got[1],
            Record::Input(Input {
                index: 1,
                line: 3,
                args: "free text".into()
            })
        );
        let bad = |r: &Record| match r {
            Record::Bad(b) => (b.index, b.line, b.message.clone()),
            Record::Input(i) => panic!("expected a bad line, got {i:?}"),
        };
        assert_eq!(
            bad(&got[2]),
            (2, 4, "`n` is an integer, got \"x\"".to_string())
        );
        assert_eq!(bad(&got[3]).1, 5);
        assert!(bad(&got[3]).2.starts_with("not JSON"));
        assert_eq!(
            bad(&got[4]),
            (4, 6, "the required arg `topic` is missing".to_string())
        );
        assert!(bad(&got[5]).2.contains("`other` is not a declared arg"));
        assert_eq!(got.len(), 6);
    }

    #[test]
    fn csv_cells_are_typed_as_arg_types_them() {
        let decls = [
            decl("topic", ArgType::String, false),
            decl("n", ArgType::Integer, true),
            decl("ok", ArgType::Boolean, true),
        ];
        let got = records(
            "topic,n,ok\n\"tides, and \"\"moons\"\"\", 3 ,true\nwaves,,\nx,three,false\ny,1\n",
            InputFormat::Csv,
            Some(&decls),
        );
        assert_eq!(
            got[0],
            Record::Input(Input {
                index: 0,
                line: 2,
                args: r#"{"topic":"tides, and \"moons\"","n":3,"ok":true}"#.into()
            })
        );
        assert_eq!(
            got[1],
            Record::Input(Input {
                index: 1,
                line: 3,
                args: r#"{"topic":"waves"}"#.into()
            })
        );
        match &got[2] {
            Record::Bad(b) => {
                assert_eq!((b.index, b.line), (2, 4));
                assert_eq!(b.message, "column `n`: \"three\" is not an integer");
            }
            other => panic!("{other:?}"),
        }
        match &got[3] {
            Record::Bad(b) => {
                assert_eq!((b.index, b.line), (3, 5));
                assert_eq!(b.message, "2 fields where the header has 3");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_csv_header_must_name_declared_args() {
        let source = InputSource::File(PathBuf::from("in.csv"));
        let decls = [decl("topic", ArgType::String, false)];
        let err = Records::new(
            io::Cursor::new("topic,colour\n".to_string()),
            InputFormat::Csv,
            Some(&decls),
            &source,
        )
        .err()
        .unwrap();
        assert_eq!(
            err.to_string(),
            "in.csv: line 1: column `colour` is not a declared arg; declared: topic (string)"
        );
        let err = Records::new(
            io::Cursor::new("topic\n".to_string()),
            InputFormat::Csv,
            None,
            &source,
        )
        .err()
        .unwrap();
        assert!(err.to_string().contains("declares no `args:`"));
    }

    #[test]
    fn a_line_past_the_cap_is_bad_and_the_next_line_reads() {
        let mut text = "x".repeat(MAX_LINE_BYTES + 10);
        text.push_str("\n\"next\"\n");
        let got = records(&text, InputFormat::Jsonl, None);
        assert!(matches!(&got[0], Record::Bad(b) if b.message.contains("longer than")));
        assert_eq!(
            got[1],
            Record::Input(Input {
                index: 1,
                line: 2,
                args: "next".into()
            })
        );
    }
}
