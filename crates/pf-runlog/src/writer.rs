//! Writing one run: a channel to a background thread that batches rows into
//! short transactions. The caller only ever sends on the channel.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, Transaction, TransactionBehavior};
use sha2::{Digest, Sha256};

use crate::buffer::{EventBuffer, Taken};
use crate::db::{connect, retry_busy, to_sql_int, BUSY_RETRIES};
use crate::records::{
    ActivationRecord, AnswerRecord, EventRecord, ExchangeDraft, ExchangeHandle, ExchangeRecord,
    Outcome, RunEnd, RunStart, TokenUsage, ToolCallRecord,
};

/// A callback that receives the writer's one warning.
pub type WarningSink = Arc<dyn Fn(&str) + Send + Sync>;

/// How a [`RunWriter`] batches and how long it waits. The defaults suit a CLI run.
#[derive(Clone)]
pub struct WriterOptions {
    /// Commit once this many rows are queued...
    pub batch_rows: usize,
    /// ...or once the oldest queued row has waited this long.
    pub batch_window: Duration,
    /// How long SQLite waits for another process's lock before reporting busy.
    pub busy_timeout: Duration,
    /// How many times a busy batch is tried again before the log gives up.
    pub busy_retries: u32,
    /// The most [`RunWriter::finish`] and [`RunWriter::flush`] wait for the writer.
    pub finish_wait: Duration,
    /// Also called with the warning, once, from the writer thread.
    pub on_warning: Option<WarningSink>,
    /// TEST-ONLY: caps the database's size (`PRAGMA max_page_count`) so a test
    /// can fill it.
    #[doc(hidden)]
    pub max_page_count: Option<u32>,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            batch_rows: 512,
            batch_window: Duration::from_millis(2),
            busy_timeout: Duration::from_secs(5),
            busy_retries: BUSY_RETRIES,
            finish_wait: Duration::from_secs(5),
            on_warning: None,
            max_page_count: None,
        }
    }
}

impl std::fmt::Debug for WriterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterOptions")
            .field("batch_rows", &self.batch_rows)
            .field("batch_window", &self.batch_window)
            .field("busy_timeout", &self.busy_timeout)
            .field("busy_retries", &self.busy_retries)
            .field("finish_wait", &self.finish_wait)
            .field("on_warning", &self.on_warning.is_some())
            .finish()
    }
}

/// What goes over the channel. Events do not: they go into the shared
/// [`EventBuffer`], which the writer takes whole at each commit.
enum Message {
    Exchange(Box<ExchangeRecord>, ExchangeHandle),
    Draft(Box<ExchangeDraft>, ExchangeHandle),
    ToolCall(Box<ToolCallRecord>),
    Answer(Box<AnswerRecord>),
    Activation(Box<ActivationRecord>),
    /// Commit what is queued, then acknowledge.
    Flush(SyncSender<()>),
    Finish(Box<RunEnd>, SyncSender<()>),
}

/// The shared warning slot: set once, read by the caller at any time.
#[derive(Clone, Default)]
struct Warning(Arc<Mutex<Option<String>>>);

impl Warning {
    fn get(&self) -> Option<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Record `message` unless a warning was already given; true if it was new.
    fn set_first(&self, message: String) -> bool {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_some() {
            return false;
        }
        *slot = Some(message);
        true
    }
}

/// Writes one run into the log. Every method returns at once; rows reach the
/// database within a few milliseconds, in order. Nothing here fails or blocks
/// the run: a database that cannot be written yields one warning
/// ([`RunWriter::warning`], the options' `on_warning`, and `tracing::warn!`),
/// and every later row is dropped.
///
/// Call [`finish`](RunWriter::finish) before the process exits: rows still
/// queued when the process ends are lost (rows already committed are not).
pub struct RunWriter {
    tx: Sender<Message>,
    events: Arc<EventBuffer>,
    /// The writer thread, woken for a flush or the finish (rows wait for its window).
    thread: Option<thread::Thread>,
    warning: Warning,
    finish_wait: Duration,
    on_warning: Option<WarningSink>,
    path: PathBuf,
    /// Whether the writer thread is inside a database call (opening or a
    /// commit): a wait that runs out then was spent on the database itself.
    in_database: Arc<AtomicBool>,
    /// The next [`ExchangeHandle`]'s number.
    next_exchange: AtomicU64,
    /// Ends when the writer thread does (behind a lock only to keep the writer `Sync`).
    tail: Mutex<Option<WriterTail>>,
}

/// The writer thread's last work after a run's end (tidying the WAL), to
/// wait on before the process exits; everything logged is committed already.
#[derive(Debug)]
pub struct WriterTail {
    done: Receiver<()>,
}

impl WriterTail {
    fn done() -> WriterTail {
        let (_, done) = mpsc::sync_channel(1);
        WriterTail { done }
    }

    /// Wait until the writer thread has ended, at most `bound`.
    pub fn wait(self, bound: Duration) {
        // The thread never sends; its end drops the sender.
        let _ = self.done.recv_timeout(bound);
    }
}

impl std::fmt::Debug for RunWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunWriter")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl RunWriter {
    /// Begin logging a run into the database at `db_path` (created if
    /// missing). Opening happens on the writer thread, so this never fails:
    /// an unusable database shows up as the writer's warning.
    pub fn begin(db_path: impl Into<PathBuf>, start: RunStart) -> RunWriter {
        RunWriter::begin_with(db_path, start, WriterOptions::default())
    }

    /// [`begin`](RunWriter::begin) with explicit options.
    pub fn begin_with(
        db_path: impl Into<PathBuf>,
        start: RunStart,
        options: WriterOptions,
    ) -> RunWriter {
        let path = db_path.into();
        let (tx, rx) = mpsc::channel();
        let warning = Warning::default();
        let finish_wait = options.finish_wait;
        let on_warning = options.on_warning.clone();
        let in_database = Arc::new(AtomicBool::new(false));
        let events = Arc::new(EventBuffer::default());
        let (tail_tx, tail_rx) = mpsc::sync_channel(1);
        let thread_state = Background {
            events: Arc::clone(&events),
            tail: tail_tx,
            path: path.clone(),
            options,
            in_database: Arc::clone(&in_database),
            warning: warning.clone(),
            disabled: false,
            run_id: None,
            next_ord: 0,
            exchange_rows: HashMap::new(),
        };
        let spawned = thread::Builder::new()
            .name("pf-runlog".into())
            .spawn(move || thread_state.run(start, rx));
        let writer = RunWriter {
            tx,
            events,
            tail: Mutex::new(Some(WriterTail { done: tail_rx })),
            thread: spawned.as_ref().ok().map(|handle| handle.thread().clone()),
            warning,
            finish_wait,
            on_warning,
            path,
            in_database,
            next_exchange: AtomicU64::new(0),
        };
        if let Err(err) = spawned {
            writer.events.close();
            writer.warn(format!("cannot start the writer thread: {err}"));
        }
        writer
    }

    /// Append one event.
    pub fn event(&self, event: EventRecord) {
        self.event_parts(
            &event.kind,
            &event.section,
            &event.task,
            event.seq,
            &event.fields,
        );
    }

    /// Append one event given by its parts, for a caller that holds it only
    /// by reference: `fields` (a JSON object) is encoded straight into the
    /// shared buffer, with no copy and, once the buffer has grown, no
    /// allocation.
    pub fn event_parts(
        &self,
        kind: &str,
        section: &str,
        task: &str,
        seq: u32,
        fields: &impl serde::Serialize,
    ) {
        self.events.push(kind, section, task, seq, fields);
    }

    /// Append one model exchange.
    pub fn exchange(&self, exchange: ExchangeRecord) -> ExchangeHandle {
        let handle = self.next_handle();
        self.send(Message::Exchange(Box::new(exchange), handle));
        handle
    }

    /// Append one model exchange whose bodies the writer thread encodes,
    /// its request possibly continuing an earlier exchange's
    /// ([`ExchangeDraft::extends`], a handle this writer returned).
    pub fn exchange_draft(&self, exchange: ExchangeDraft) -> ExchangeHandle {
        let handle = self.next_handle();
        self.send(Message::Draft(Box::new(exchange), handle));
        handle
    }

    fn next_handle(&self) -> ExchangeHandle {
        ExchangeHandle(self.next_exchange.fetch_add(1, Ordering::Relaxed))
    }

    /// Append one tool call.
    pub fn tool_call(&self, call: ToolCallRecord) {
        self.send(Message::ToolCall(Box::new(call)));
    }

    /// Append one operator answer.
    pub fn answer(&self, answer: AnswerRecord) {
        self.send(Message::Answer(Box::new(answer)));
    }

    /// Append one Plugin activation.
    pub fn activation(&self, activation: ActivationRecord) {
        self.send(Message::Activation(Box::new(activation)));
    }

    /// The warning, if the log has given up on this run.
    pub fn warning(&self) -> Option<String> {
        self.warning.get()
    }

    /// Wait (at most the options' `finish_wait`) until everything sent so far
    /// is committed. False if the wait ran out or the log has given up.
    pub fn flush(&self) -> bool {
        let (ack, done) = mpsc::sync_channel(1);
        self.send(Message::Flush(ack));
        self.wake();
        self.await_ack(&done) && self.warning().is_none()
    }

    /// Record how the run ended and wait (bounded) for every row to be
    /// committed. Returns the warning, if there was one.
    ///
    /// The writer thread may then tidy the database (a checkpoint when the
    /// WAL has grown, which costs an fsync or two): the run need not wait
    /// for that, but a process about to exit should, through
    /// [`finish_with_tail`](RunWriter::finish_with_tail).
    pub fn finish(self, end: RunEnd) -> Option<String> {
        self.finish_with_tail(end).0
    }

    /// [`finish`](RunWriter::finish), also handing back the writer thread's
    /// [`WriterTail`] to wait on before the process exits.
    pub fn finish_with_tail(mut self, end: RunEnd) -> (Option<String>, WriterTail) {
        let tail = self
            .tail
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_else(WriterTail::done);
        let warning = self.finish_inner(end);
        (warning, tail)
    }

    fn finish_inner(self, end: RunEnd) -> Option<String> {
        let (ack, done) = mpsc::sync_channel(1);
        self.send(Message::Finish(Box::new(end), ack));
        self.wake();
        if !self.await_ack(&done) {
            let why = if self.in_database.load(Ordering::SeqCst) {
                // SQLite waits out another connection's lock before it says busy.
                " (waiting on the database: locked by another process, or a stalled disk)"
            } else {
                ""
            };
            self.warn(format!(
                "still writing after {:?}{why}; the run's last records may be missing",
                self.finish_wait
            ));
        }
        self.warning()
    }

    fn await_ack(&self, done: &Receiver<()>) -> bool {
        match done.recv_timeout(self.finish_wait) {
            Ok(()) => true,
            // The writer thread is gone; it warned already if it failed.
            Err(RecvTimeoutError::Disconnected) => true,
            Err(RecvTimeoutError::Timeout) => false,
        }
    }

    fn wake(&self) {
        if let Some(thread) = &self.thread {
            thread.unpark();
        }
    }

    fn send(&self, message: Message) {
        // A closed channel means the writer thread is gone; it warned already.
        let _ = self.tx.send(message);
    }

    fn warn(&self, problem: String) {
        let message = warning_text(&self.path, &problem);
        if self.warning.set_first(message.clone()) {
            tracing::warn!("{message}");
            if let Some(sink) = &self.on_warning {
                sink(&message);
            }
        }
    }
}

fn warning_text(path: &std::path::Path, problem: &str) -> String {
    format!(
        "run log {}: {problem}; this run is not fully logged",
        path.display()
    )
}

/// How long the writer sleeps, at most, while the run logs nothing: events
/// queued then wait this long for their commit.
const IDLE_WAIT_MAX: Duration = Duration::from_millis(20);

/// A run's end checkpoints the WAL (off the run's path, see `tidy_wal`)
/// once it is larger than this: every new connection reads the whole WAL
/// back (SQLite recovers it when no other connection has the database open),
/// so a long one costs every later run.
const WAL_TIDY_BYTES: u64 = 1024 * 1024;

/// The writer thread's state.
struct Background {
    events: Arc<EventBuffer>,
    /// Dropped when the thread ends, which is what a [`WriterTail`] waits for.
    #[allow(dead_code)]
    tail: SyncSender<()>,
    path: PathBuf,
    options: WriterOptions,
    in_database: Arc<AtomicBool>,
    warning: Warning,
    /// Set once a write failed: everything after is dropped.
    disabled: bool,
    /// The run's row, once inserted.
    run_id: Option<i64>,
    next_ord: i64,
    /// The row id of each committed exchange, by handle: what a later
    /// request's `request_extends` names.
    exchange_rows: HashMap<ExchangeHandle, i64>,
}

impl Background {
    fn run(mut self, start: RunStart, rx: Receiver<Message>) {
        let started_at_ms = wall_ms();
        self.in_database.store(true, Ordering::SeqCst);
        let mut conn = match connect(
            &self.path,
            self.options.busy_timeout,
            self.options.busy_retries,
        ) {
            Ok(conn) => Some(conn),
            Err(err) => {
                self.give_up(&err.to_string());
                None
            }
        };
        if let Some(conn) = &conn {
            // Closing the last connection would checkpoint the WAL into the
            // database, fsync both and delete the WAL, which the next run then
            // recreates (fsyncing the directory): several ms per run, and a
            // busy database for a run that starts meanwhile. Committed rows
            // are in the WAL either way; SQLite's auto-checkpoint keeps it short.
            let _ = conn.set_db_config(
                rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
                true,
            );
        }
        if let (Some(conn), Some(pages)) = (&conn, self.options.max_page_count) {
            let _ = conn.pragma_update(None, "max_page_count", pages);
        }
        if let Some(conn) = &conn {
            // A checkpoint that empties the WAL lets the next writer start it
            // over; this truncates it then to what that writer commits, so
            // its length tells how much a new connection will read back.
            let _ = conn.pragma_update(None, "journal_size_limit", 0);
        }
        self.in_database.store(false, Ordering::SeqCst);
        let mut pending_start = Some((start, started_at_ms));
        let mut batch: Vec<Message> = Vec::new();
        let mut events = Taken::default();
        let mut idle = self.options.batch_window;
        let mut closed = false;
        let mut finished = false;
        while !closed {
            // Events arrive in the shared buffer without waking this thread:
            // it looks each window (less often while the run is quiet).
            match rx.recv_timeout(idle) {
                Ok(message) => batch.push(message),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => closed = true,
            }
            if !batch.is_empty() {
                closed |= self.gather(&rx, &mut batch);
            }
            self.events.take(&mut events);
            if batch.is_empty() && events.is_empty() {
                idle = (idle * 2).min(IDLE_WAIT_MAX.max(self.options.batch_window));
                continue;
            }
            idle = self.options.batch_window;
            finished |= batch.iter().any(|m| matches!(m, Message::Finish(..)));
            match conn.as_mut() {
                Some(conn) if !self.disabled => {
                    self.in_database.store(true, Ordering::SeqCst);
                    self.commit(conn, &mut pending_start, &events, &batch);
                    self.in_database.store(false, Ordering::SeqCst);
                }
                _ => {}
            }
            if self.disabled || conn.is_none() {
                self.events.close();
            }
            for message in batch.drain(..) {
                if let Message::Flush(ack) | Message::Finish(_, ack) = message {
                    let _ = ack.try_send(());
                }
            }
        }
        if let (true, false, Some(conn)) = (finished, self.disabled, &conn) {
            self.tidy_wal(conn);
        }
    }

    /// Gather the window's messages after `batch`'s first while parked, not
    /// blocked on the channel: a sender then wakes nobody. A flush or the
    /// finish unparks at once. True if the channel closed.
    fn gather(&self, rx: &Receiver<Message>, batch: &mut Vec<Message>) -> bool {
        let window_ends = Instant::now() + self.options.batch_window;
        while batch.len() < self.options.batch_rows && !ends_batch(batch.last()) {
            loop {
                match rx.try_recv() {
                    Ok(message) => {
                        batch.push(message);
                        if batch.len() >= self.options.batch_rows || ends_batch(batch.last()) {
                            return false;
                        }
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return true,
                }
            }
            let left = window_ends.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            thread::park_timeout(left);
        }
        false
    }

    /// After the run's end is committed (and acknowledged): checkpoint the
    /// WAL if it has grown, so later connections do not each read it all
    /// back. PASSIVE never blocks another writer; its fsyncs are paid here,
    /// on no run's path. A busy database skips it; a later run's end retries.
    fn tidy_wal(&self, conn: &Connection) {
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        let long = std::fs::metadata(&wal).is_ok_and(|m| m.len() > WAL_TIDY_BYTES);
        if long {
            let _ = conn.busy_timeout(Duration::from_millis(100));
            let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        }
    }

    /// Write `batch` in one transaction, retrying while the database is busy.
    fn commit(
        &mut self,
        conn: &mut Connection,
        pending_start: &mut Option<(RunStart, i64)>,
        events: &Taken,
        batch: &[Message],
    ) {
        let retries = self.options.busy_retries;
        let mut run_id = self.run_id;
        let mut next_ord = self.next_ord;
        // Rows this batch adds, kept apart until the commit holds.
        let mut new_rows = Vec::new();
        let committed_rows = &self.exchange_rows;
        let written = retry_busy(retries, || {
            new_rows.clear();
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut id = self.run_id;
            let mut ord = self.next_ord;
            if id.is_none() {
                if let Some((start, started_at_ms)) = pending_start.as_ref() {
                    id = Some(insert_run(&tx, start, *started_at_ms)?);
                }
            }
            if let Some(id) = id {
                let mut rows = ExchangeRows {
                    committed: committed_rows,
                    new: &mut new_rows,
                };
                if !events.is_empty() {
                    tx.prepare_cached(INSERT_EVENTS)?.execute(params![
                        id,
                        ord,
                        events.count,
                        events.text()
                    ])?;
                    ord += i64::from(events.count);
                }
                for message in batch {
                    write_message(&tx, id, &mut rows, message)?;
                }
            }
            tx.commit()?;
            run_id = id;
            next_ord = ord;
            Ok(())
        });
        match written {
            Ok(()) => {
                self.run_id = run_id;
                self.next_ord = next_ord;
                self.exchange_rows.extend(new_rows);
                *pending_start = None;
            }
            Err(err) => {
                let problem = crate::error::classify(&self.path, err).to_string();
                self.give_up(&problem);
            }
        }
    }

    fn give_up(&mut self, problem: &str) {
        self.disabled = true;
        let problem = problem
            .strip_prefix(&format!("run log {}: ", self.path.display()))
            .unwrap_or(problem);
        let message = warning_text(&self.path, problem);
        if self.warning.set_first(message.clone()) {
            tracing::warn!("{message}");
            if let Some(sink) = &self.options.on_warning {
                sink(&message);
            }
        }
    }
}

fn ends_batch(message: Option<&Message>) -> bool {
    matches!(message, Some(Message::Flush(_) | Message::Finish(..)))
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

fn json_text(value: &serde_json::Value) -> String {
    // Serializing a `Value` cannot fail (its keys are strings).
    serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned())
}

fn insert_run(tx: &Transaction<'_>, start: &RunStart, started_at_ms: i64) -> rusqlite::Result<i64> {
    tx.execute(
        "INSERT INTO runs (execution, prompt_path, prompt_text, prompt_sha256, args_json, seed,
             start_rfc3339, start_ms, host_file, model, store_dir, started_at_ms, pid,
             replay_of, resumed_from)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
        params![
            start.execution,
            start.prompt_path,
            start.prompt_text,
            sha256_hex(&start.prompt_text),
            json_text(&start.args),
            start.seed.to_string(),
            start.start_rfc3339,
            start.start_ms,
            start.host_file,
            start.model,
            start.store_dir,
            started_at_ms,
            std::process::id(),
            start.replay_of,
            start.resumed_from,
        ],
    )?;
    Ok(tx.last_insert_rowid())
}

fn usage_columns(usage: Option<&TokenUsage>) -> [Option<i64>; 3] {
    match usage {
        Some(u) => [
            Some(to_sql_int(u.input)),
            Some(to_sql_int(u.output)),
            Some(to_sql_int(u.total)),
        ],
        None => [None; 3],
    }
}

/// Exchange row ids by handle: those committed before, and this batch's.
struct ExchangeRows<'a> {
    committed: &'a HashMap<ExchangeHandle, i64>,
    new: &'a mut Vec<(ExchangeHandle, i64)>,
}

impl ExchangeRows<'_> {
    fn get(&self, handle: ExchangeHandle) -> Option<i64> {
        self.new
            .iter()
            .rev()
            .find(|(h, _)| *h == handle)
            .map(|(_, row)| *row)
            .or_else(|| self.committed.get(&handle).copied())
    }
}

const INSERT_EVENTS: &str = "INSERT INTO event_batches (run_id, first_ord, count, lines)
     VALUES (?1, ?2, ?3, ?4)";

const INSERT_EXCHANGE: &str = "INSERT INTO exchanges (run_id, task, seq, section, model, attempt,
         request_json, request_extends, response_json, error, status, started_ms, duration_ms,
         input_tokens, output_tokens, total_tokens)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)";

fn write_message(
    tx: &Transaction<'_>,
    run_id: i64,
    rows: &mut ExchangeRows<'_>,
    message: &Message,
) -> rusqlite::Result<()> {
    match message {
        Message::Exchange(x, handle) => {
            let [input, output, total] = usage_columns(x.usage.as_ref());
            tx.prepare_cached(INSERT_EXCHANGE)?.execute(params![
                run_id,
                x.task,
                x.seq,
                x.section,
                x.model,
                x.attempt,
                json_text(&x.request),
                None::<i64>,
                x.response.as_ref().map(json_text),
                x.error,
                x.status,
                x.started_ms,
                to_sql_int(x.duration_ms),
                input,
                output,
                total
            ])?;
            rows.new.push((*handle, tx.last_insert_rowid()));
        }
        Message::Draft(x, handle) => {
            let [input, output, total] = usage_columns(x.usage.as_ref());
            // A base the log never committed cannot be named; the writer
            // gives up on the run before that can happen (rows go in order).
            // 0 names no row, and a reader then keeps only the added messages.
            let extends = x.extends.map(|base| rows.get(base).unwrap_or(0));
            tx.prepare_cached(INSERT_EXCHANGE)?.execute(params![
                run_id,
                x.task,
                x.seq,
                x.section,
                x.model,
                x.attempt,
                x.request_json,
                extends,
                x.response_json,
                x.error,
                x.status,
                x.started_ms,
                to_sql_int(x.duration_ms),
                input,
                output,
                total
            ])?;
            rows.new.push((*handle, tx.last_insert_rowid()));
        }
        Message::ToolCall(t) => {
            tx.prepare_cached(
                "INSERT INTO tool_calls (run_id, task, seq, section, alias, path, arguments_json,
                     output, trusted, failure)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )?
            .execute(params![
                run_id,
                t.task,
                t.seq,
                t.section,
                t.alias,
                t.path,
                json_text(&t.arguments),
                t.output,
                t.trusted,
                t.failure
            ])?;
        }
        Message::Answer(a) => {
            tx.prepare_cached(
                "INSERT INTO answers (run_id, task, seq, section, question, answer)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                run_id, a.task, a.seq, a.section, a.question, a.answer
            ])?;
        }
        Message::Activation(a) => {
            tx.prepare_cached(
                "INSERT INTO activations (run_id, plugin, tools_json, error)
                 VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![
                run_id,
                a.plugin,
                a.tools.as_ref().map(json_text),
                a.error
            ])?;
        }
        Message::Finish(end, _) => {
            let (result, error_kind, error_message) = match &end.outcome {
                Outcome::Completed { result } => (Some(result.as_str()), None, None),
                Outcome::Failed { kind, message } => {
                    (None, Some(kind.as_str()), Some(message.as_str()))
                }
                Outcome::Cancelled => (None, None, None),
            };
            let [input, output, total] = usage_columns(Some(&end.usage));
            tx.execute(
                "UPDATE runs SET outcome = ?2, result = ?3, error_kind = ?4, error_message = ?5,
                     finished_at_ms = ?6, duration_ms = ?7,
                     input_tokens = ?8, output_tokens = ?9, total_tokens = ?10
                 WHERE id = ?1",
                params![
                    run_id,
                    end.outcome.label(),
                    result,
                    error_kind,
                    error_message,
                    wall_ms(),
                    to_sql_int(end.duration_ms),
                    input,
                    output,
                    total
                ],
            )?;
        }
        Message::Flush(_) => {}
    }
    Ok(())
}
