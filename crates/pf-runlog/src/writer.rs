//! Writing one run: rows queue up (events and host work, encoded into one
//! shared buffer by whoever reports them) and are committed in short
//! transactions, by a background thread while the run goes and by the
//! caller itself at a flush or a synchronous finish.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, Transaction, TransactionBehavior};
use sha2::{Digest, Sha256};

use crate::buffer::{EventBuffer, Taken};
use crate::db::{connect, retry_busy, to_sql_int, BUSY_RETRIES};
use crate::error::is_busy;
use crate::packed::Packer;
use crate::records::{
    ActivationRecord, AnswerRecord, EventRecord, ExchangeDraft, ExchangeHandle, ExchangeParts,
    ExchangeRecord, Outcome, RunEnd, RunStart, TokenUsage, ToolCallRecord,
};

/// A callback that receives the writer's one warning.
pub type WarningSink = Arc<dyn Fn(&str) + Send + Sync>;

/// How a [`RunWriter`] batches and how long it waits. The defaults suit a CLI run.
#[derive(Clone)]
pub struct WriterOptions {
    /// The background thread commits what is queued once this many rows
    /// (events aside) are waiting...
    pub batch_rows: usize,
    /// ...or after this long once the run logs; each window that had rows
    /// to commit doubles the next...
    pub batch_window: Duration,
    /// ...up to this: a long run commits a few large batches rather than
    /// many small ones (each commit rewrites the same index pages), and a
    /// killed process loses at most this much of its last rows.
    pub batch_window_max: Duration,
    /// How long SQLite waits for another process's lock before reporting busy.
    pub busy_timeout: Duration,
    /// How many times a busy batch is tried again before the log gives up.
    pub busy_retries: u32,
    /// The most [`RunWriter::finish`] and [`RunWriter::flush`] wait for the database.
    pub finish_wait: Duration,
    /// Also called with the warning, once.
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
            // Longer than a short run (a scripted 50-round loop takes ~5 ms):
            // such a run commits once, at its end, instead of two or three
            // times (each commit rewrites page 1 and every touched leaf).
            batch_window: Duration::from_millis(16),
            batch_window_max: Duration::from_millis(32),
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
            .field("batch_window_max", &self.batch_window_max)
            .field("busy_timeout", &self.busy_timeout)
            .field("busy_retries", &self.busy_retries)
            .field("finish_wait", &self.finish_wait)
            .field("on_warning", &self.on_warning.is_some())
            .finish()
    }
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

/// Writes one run into the log. Every method but [`flush`](RunWriter::flush)
/// and [`finish`](RunWriter::finish) returns at once; rows reach the
/// database within a few milliseconds, in order. Nothing here fails or
/// blocks the run: a database that cannot be written yields one warning
/// ([`RunWriter::warning`], the options' `on_warning`, and `tracing::warn!`),
/// and every later row is dropped.
///
/// Call [`finish`](RunWriter::finish) before the process exits: rows still
/// queued when the process ends are lost (rows already committed are not).
pub struct RunWriter {
    shared: Arc<Shared>,
    /// The background thread, woken at the end (rows wait for its window).
    thread: Option<thread::Thread>,
    /// Whether closing wakes the background thread (a deferred finish
    /// leaves that to whoever waits for it, see `finish_deferred`).
    wake_on_close: bool,
    /// Ends when the background thread does (behind a lock only to keep the writer `Sync`).
    tail: Mutex<Option<WriterTail>>,
}

/// The background thread's last work after a run's end: committing what
/// [`RunWriter::finish_deferred`] left to it, then tidying the WAL. Wait on
/// it before the process exits (or before telling anyone the run is logged).
pub struct WriterTail {
    shared: Option<Arc<Shared>>,
    /// The background thread, woken before any wait (a deferred finish does
    /// not wake it).
    thread: Option<thread::Thread>,
    /// Closed once the run's rows and end are committed (or the log gave up).
    committed: Receiver<()>,
    /// Closed when the background thread ends.
    done: Receiver<()>,
}

impl std::fmt::Debug for WriterTail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterTail").finish_non_exhaustive()
    }
}

impl WriterTail {
    fn done() -> WriterTail {
        let (_, committed) = mpsc::sync_channel(1);
        let (_, done) = mpsc::sync_channel(1);
        WriterTail {
            shared: None,
            thread: None,
            committed,
            done,
        }
    }

    /// Wait until every row and the end are committed, at most the options'
    /// `finish_wait` (as [`RunWriter::finish`] waits). Returns the warning,
    /// if there was one; running out of time gives one.
    pub fn wait_committed(&mut self) -> Option<String> {
        let shared = self.shared.clone()?;
        if let Here::Done = finish_here(&shared, false) {
            // Its thread tidies and hands the connection back.
            self.wake();
            return shared.warning.get();
        }
        self.wake();
        // The thread never sends; dropping the sender is the signal.
        if let Err(mpsc::RecvTimeoutError::Timeout) =
            self.committed.recv_timeout(shared.options.finish_wait)
        {
            shared.still_writing(shared.in_database.load(Ordering::SeqCst));
        }
        shared.warning.get()
    }

    /// Wait as [`wait_committed`](WriterTail::wait_committed) does, then
    /// until the background thread has tidied and ended, at most `bound` more.
    pub fn wait(self, bound: Duration) -> Option<String> {
        let shared = self.shared.clone()?;
        if let Here::Done = finish_here(&shared, true) {
            // Nothing is left for the thread but to end (not waited for).
            self.wake();
            return shared.warning.get();
        }
        self.wake();
        // The thread ends after the commit: waiting for its end alone wakes
        // the caller once, not twice (each wake takes a core's turn).
        if let Err(mpsc::RecvTimeoutError::Timeout) =
            self.done.recv_timeout(shared.options.finish_wait)
        {
            if let Err(mpsc::TryRecvError::Empty) = self.committed.try_recv() {
                shared.still_writing(shared.in_database.load(Ordering::SeqCst));
            }
            let _ = self.done.recv_timeout(bound);
        }
        shared.warning.get()
    }
}

/// How [`finish_here`] went.
enum Here {
    /// Everything is committed (and, when asked, tidied).
    Done,
    /// Left to the background thread: it holds the core, holds no
    /// connection yet, the log gave up, or the database is locked (the
    /// thread waits that out with its own timeout and retries, as always).
    Left,
}

/// Commit a closed writer's rows and end on the waiting thread, when its
/// background thread holds the connection and is waiting out its window:
/// waking that thread and then being woken by it are two cross-core wakes
/// (each tens of µs on a virtual machine, and the thread's caches are cold),
/// while the waiting thread, idle anyway, has the rows in its own cache.
/// With `tidy`, also what the thread does after (checkpoint a grown WAL,
/// recycle the buffers, hand the connection to the next writer), so it has
/// nothing left to do but end. One try that never waits for a lock: a
/// locked database leaves everything to the thread, and the wait to its
/// usual bounds.
fn finish_here(shared: &Shared, tidy: bool) -> Here {
    if !shared.closing.load(Ordering::SeqCst) || shared.options.busy_timeout.is_zero() {
        return Here::Left;
    }
    let mut core = match shared.core.try_lock() {
        Ok(core) => core,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => return Here::Left,
    };
    if core.disabled || core.conn.is_none() {
        return Here::Left;
    }
    // A zero busy timeout, below the options' own: a locked database
    // comes back as `Busy` with the rows kept, never as giving up.
    if let Committed::Busy = core.commit_queued(shared, Duration::ZERO, 0) {
        return Here::Left;
    }
    if !core.ended {
        // The log gave up (or the run never ended): the thread tidies up.
        return Here::Left;
    }
    if tidy {
        core.tidy_wal(shared);
        let keep = !core.disabled && shared.options.max_page_count.is_none();
        let conn = core.conn.take().filter(|_| keep);
        core.events.recycle();
        core.spare.recycle();
        core.packer.recycle();
        shared.events.recycle();
        drop(core);
        closed_on(shared, conn);
        // All the thread has left is to end this job: list it now, so a run
        // that begins before it has ended hands it the next job (waiting in
        // its channel) instead of spawning another thread.
        if let Some(me) = lock(&shared.listing).take() {
            idle_threads().push(me);
        }
    }
    Here::Done
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl WriterTail {
    /// Let a closed writer's background thread commit now rather than at
    /// its window's end (nothing if it is awake already, or was woken).
    fn wake(&self) {
        if let Some(thread) = &self.thread {
            thread.unpark();
        }
    }
}

impl std::fmt::Debug for RunWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunWriter")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

/// What the caller and the background thread share.
struct Shared {
    path: PathBuf,
    options: WriterOptions,
    events: EventBuffer,
    /// The connection and everything queued but not committed. Whoever
    /// holds it commits: the background thread each window, the caller at a
    /// flush or the finish.
    core: Mutex<Core>,
    /// The run's end, handed over by `finish` and not yet taken into the core.
    end: Mutex<Option<RunEnd>>,
    warning: Warning,
    /// Whether someone is inside a database call (opening or a commit): a
    /// wait that runs out then was spent on the database itself.
    in_database: AtomicBool,
    /// The run has ended (or the writer was dropped): the background thread
    /// commits what is left, tidies, and ends.
    closing: AtomicBool,
    /// The writer thread running this writer's background work, until it
    /// is listed among the idle ones: by itself when its work ends, or by
    /// a wait that did that work for it ([`finish_here`]), so the next run
    /// finds it even before it has ended the last one's job.
    listing: Mutex<Option<IdleThread>>,
}

impl Shared {
    fn warn(&self, problem: &str) {
        let message = warning_text(&self.path, problem);
        if self.warning.set_first(message.clone()) {
            tracing::warn!("{message}");
            if let Some(sink) = &self.options.on_warning {
                sink(&message);
            }
        }
    }

    /// The core, waiting at most until `deadline` for whoever holds it.
    fn core_until(&self, deadline: Instant) -> Option<MutexGuard<'_, Core>> {
        loop {
            match self.core.try_lock() {
                Ok(core) => return Some(core),
                Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
                Err(TryLockError::WouldBlock) => {}
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_micros(200));
        }
    }

    fn core(&self) -> MutexGuard<'_, Core> {
        self.core.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn still_writing(&self, on_the_database: bool) {
        let why = if on_the_database {
            // SQLite waits out another connection's lock before it says busy.
            " (waiting on the database: locked by another process, or a stalled disk)"
        } else {
            " (waiting on the database)"
        };
        self.warn(&format!(
            "still writing after {:?}{why}; the run's last records may be missing",
            self.options.finish_wait
        ));
    }
}

/// The database side: opened by whoever needs it first.
struct Core {
    conn: Option<Connection>,
    /// Whether opening was tried (it is tried once).
    opened: bool,
    /// Set once a write failed: everything after is dropped.
    disabled: bool,
    pending_start: Option<(RunStart, i64)>,
    /// The run's row, once inserted.
    run_id: Option<i64>,
    next_ord: i64,
    /// Events and host work taken from the buffer and not yet committed (a
    /// busy database keeps them here for the next try).
    events: Taken,
    spare: Taken,
    /// Compresses each commit's lines (`packed.rs`).
    packer: Packer,
    /// The run's end, once handed over and not yet committed.
    end: Option<RunEnd>,
    /// The end is committed.
    ended: bool,
}

/// How a commit went.
enum Committed {
    Done,
    /// The database stayed busy; the rows are kept for another try.
    Busy,
}

impl Core {
    /// Open the connection if nobody has tried yet.
    fn ensure_open(&mut self, shared: &Shared) {
        if self.opened {
            return;
        }
        self.opened = true;
        let options = &shared.options;
        if options.max_page_count.is_none() {
            if let Some(conn) = idle_connection(shared, None) {
                self.conn = Some(conn);
                return;
            }
        }
        shared.in_database.store(true, Ordering::SeqCst);
        match connect(&shared.path, options.busy_timeout, options.busy_retries) {
            Ok(conn) => {
                // Closing the last connection would checkpoint the WAL into
                // the database, fsync both and delete the WAL, which the next
                // run then recreates (fsyncing the directory): several ms per
                // run, and a busy database for a run that starts meanwhile.
                // Committed rows are in the WAL either way; a run's end
                // checkpoints it once it grew (`tidy_wal`).
                let _ = conn.set_db_config(
                    rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
                    true,
                );
                // A checkpoint that empties the WAL lets the next writer start
                // it over; this truncates it then to what that writer commits,
                // so its length tells how much a new connection reads back.
                // (Keeping its length instead made commits overwrite pages
                // still under writeback, which stalls them for milliseconds.)
                let _ = conn.pragma_update(None, "journal_size_limit", 0);
                if let Some(pages) = options.max_page_count {
                    let _ = conn.pragma_update(None, "max_page_count", pages);
                }
                self.conn = Some(conn);
            }
            Err(err) => self.give_up(shared, &err.to_string()),
        }
        shared.in_database.store(false, Ordering::SeqCst);
    }

    /// Move what is queued into the uncommitted batch.
    fn gather(&mut self, shared: &Shared) {
        if let Some(end) = shared
            .end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            self.end = Some(end);
        }
        if self.events.is_empty() {
            shared.events.take(&mut self.events);
        } else {
            // A busy commit left some: append after them.
            shared.events.take(&mut self.spare);
            self.events.append(&self.spare);
        }
    }

    fn has_work(&self) -> bool {
        !self.events.is_empty() || self.end.is_some() || self.pending_start.is_some()
    }

    /// Gather and commit everything queued, trying a busy database `retries`
    /// more times with `busy_timeout` each.
    fn commit_queued(
        &mut self,
        shared: &Shared,
        busy_timeout: Duration,
        retries: u32,
    ) -> Committed {
        self.ensure_open(shared);
        self.gather(shared);
        if self.disabled || self.conn.is_none() {
            self.drop_queued(shared);
            return Committed::Done;
        }
        if !self.has_work() {
            return Committed::Done;
        }
        shared.in_database.store(true, Ordering::SeqCst);
        let outcome = self.commit(shared, busy_timeout, retries);
        shared.in_database.store(false, Ordering::SeqCst);
        outcome
    }

    fn drop_queued(&mut self, shared: &Shared) {
        shared.events.close();
        self.events.clear();
        self.end = None;
    }

    /// Write the events, the host work and the end in one transaction:
    /// one `event_batches` row holds the commit's events and work lines.
    fn commit(&mut self, shared: &Shared, busy_timeout: Duration, retries: u32) -> Committed {
        let Some(conn) = self.conn.as_mut() else {
            return Committed::Done;
        };
        let _ = conn.busy_timeout(busy_timeout);
        let mut run_id = self.run_id;
        let mut next_ord = self.next_ord;
        let (pending_start, events, end) = (&self.pending_start, &self.events, &self.end);
        // Packed once, on the committing thread, before any retry.
        let packed = if events.is_empty() {
            None
        } else {
            self.packer.pack(&events.lines, &events.work)
        };
        let written = retry_busy(retries, || {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut id = self.run_id;
            let mut ord = self.next_ord;
            if id.is_none() {
                if let Some((start, started_at_ms)) = pending_start.as_ref() {
                    id = Some(insert_run(&tx, start, *started_at_ms)?);
                }
            }
            if let Some(id) = id {
                if !events.is_empty() {
                    let work = &events.work;
                    let mut insert = tx.prepare_cached(INSERT_EVENTS)?;
                    match packed {
                        Some(packed) => insert.execute(params![
                            id,
                            ord,
                            events.count,
                            "",
                            None::<&str>,
                            packed
                        ])?,
                        None => insert.execute(params![
                            id,
                            ord,
                            events.count,
                            JsonText(&events.lines),
                            (!work.is_empty()).then_some(JsonText(work)),
                            None::<&[u8]>
                        ])?,
                    };
                    ord += i64::from(events.count);
                }
                if let Some(end) = end {
                    write_end(&tx, id, end)?;
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
                self.pending_start = None;
                self.events.clear();
                if self.end.take().is_some() {
                    self.ended = true;
                }
                Committed::Done
            }
            Err(err) if is_busy(&err) && busy_timeout < shared.options.busy_timeout => {
                Committed::Busy
            }
            Err(err) => {
                let problem = crate::error::classify(&shared.path, err).to_string();
                self.give_up(shared, &problem);
                self.drop_queued(shared);
                Committed::Done
            }
        }
    }

    fn give_up(&mut self, shared: &Shared, problem: &str) {
        self.disabled = true;
        let problem = problem
            .strip_prefix(&format!("run log {}: ", shared.path.display()))
            .unwrap_or(problem);
        shared.warn(problem);
    }

    /// After the run's end is committed: checkpoint the WAL if it has grown,
    /// so later connections do not each read it all back (SQLite recovers
    /// the WAL when no other connection has the database open). PASSIVE
    /// never blocks another writer; its fsyncs are paid here, on no run's
    /// path. A busy database skips it; a later run's end tries again.
    fn tidy_wal(&self, shared: &Shared) {
        let Some(conn) = &self.conn else { return };
        if self.disabled || !self.ended {
            return;
        }
        let mut wal = shared.path.clone().into_os_string();
        wal.push("-wal");
        let long = std::fs::metadata(&wal).is_ok_and(|m| m.len() > WAL_TIDY_BYTES);
        if long {
            let _ = conn.busy_timeout(Duration::from_millis(100));
            let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        }
    }
}

impl RunWriter {
    /// Begin logging a run into the database at `db_path` (created if
    /// missing). Opening happens on the background thread, so this never
    /// fails: an unusable database shows up as the writer's warning.
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
        let shared = Arc::new(Shared {
            path,
            options,
            events: EventBuffer::reusing(),
            core: Mutex::new(Core {
                conn: None,
                opened: false,
                disabled: false,
                pending_start: Some((start, wall_ms())),
                run_id: None,
                next_ord: 0,
                events: Taken::reusing(),
                spare: Taken::default(),
                packer: Packer::reusing(),
                end: None,
                ended: false,
            }),
            end: Mutex::new(None),
            warning: Warning::default(),
            in_database: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            listing: Mutex::new(None),
        });
        let (committed_tx, committed_rx) = mpsc::sync_channel(1);
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        let background = Arc::clone(&shared);
        let spawned = on_writer_thread(Box::new(move |me| {
            *lock(&background.listing) = Some(me);
            background_thread(&background, committed_tx);
            // Listed already if a wait did the thread's last work.
            let listed = lock(&background.listing).take().is_none();
            (done_tx, listed)
        }));
        let tail = WriterTail {
            shared: Some(Arc::clone(&shared)),
            thread: spawned.as_ref().ok().cloned(),
            committed: committed_rx,
            done: done_rx,
        };
        let writer = RunWriter {
            thread: spawned.as_ref().ok().cloned(),
            wake_on_close: true,
            shared,
            tail: Mutex::new(Some(tail)),
        };
        if let Err(err) = spawned {
            writer
                .shared
                .warn(&format!("cannot start the writer thread: {err}"));
            writer.shared.core().disabled = true;
            writer.shared.events.close();
        }
        writer
    }

    /// Append one event.
    pub fn event(&self, event: EventRecord) {
        match &event.fields {
            serde_json::Value::Object(fields) => {
                self.event_fields(&event.kind, &event.section, &event.task, event.seq, fields);
            }
            // Not an object (no event the engine reports): serde's line.
            other => {
                self.shared
                    .events
                    .push(&event.kind, &event.section, &event.task, event.seq, other);
            }
        }
    }

    /// Append one event given by its parts, for a caller that holds it only
    /// by reference: its fields (a JSON object, as every event's are) are
    /// written as JSON straight into the shared buffer, with no copy and,
    /// once the buffer has grown, no allocation.
    pub fn event_fields(
        &self,
        kind: &str,
        section: &str,
        task: &str,
        seq: u32,
        fields: &serde_json::Map<String, serde_json::Value>,
    ) {
        self.shared
            .events
            .push_map(kind, section, task, seq, fields);
    }

    /// Append one model exchange (its bodies encoded straight into the
    /// shared buffer, as [`exchange_parts`](RunWriter::exchange_parts) does).
    pub fn exchange(&self, exchange: ExchangeRecord) -> ExchangeHandle {
        let x = &exchange;
        let parts = ExchangeParts {
            task: &x.task,
            seq: x.seq,
            section: &x.section,
            model: &x.model,
            attempt: x.attempt,
            extends: None,
            same_tools: false,
            error: x.error.as_deref(),
            status: x.status,
            started_ms: x.started_ms,
            duration_ms: x.duration_ms,
            usage: x.usage,
        };
        self.exchange_parts(&parts, &x.request, x.response.as_ref())
    }

    /// Append one model exchange given as JSON text, its request possibly
    /// continuing an earlier exchange's ([`ExchangeDraft::extends`], a
    /// handle this writer returned).
    pub fn exchange_draft(&self, exchange: ExchangeDraft) -> ExchangeHandle {
        self.exchange_line(|out, handle| crate::work::draft_line(out, handle, &exchange))
    }

    /// Append one model exchange given by its parts and its bodies, for a
    /// caller that holds them only by reference: `request` and `response`
    /// (the response body, when one arrived) are encoded as JSON straight
    /// into the shared buffer, on the calling thread, with no copy. Read
    /// back, it is as if [`exchange_draft`](RunWriter::exchange_draft) had
    /// been handed the same fields and the bodies' JSON text.
    pub fn exchange_parts<Q: serde::Serialize, R: serde::Serialize>(
        &self,
        exchange: &ExchangeParts<'_>,
        request: &Q,
        response: Option<&R>,
    ) -> ExchangeHandle {
        self.exchange_line(|out, handle| {
            crate::work::exchange(out, handle, exchange, |out| {
                crate::work::push_body(out, request);
                if let Some(response) = response {
                    crate::work::push_body(out, response);
                }
            })
        })
    }

    /// [`exchange_parts`](RunWriter::exchange_parts) for a caller that
    /// writes its bodies' JSON itself (with [`crate::json`]), each exactly
    /// one JSON value: `request`, then `response` when one arrived.
    pub fn exchange_written(
        &self,
        exchange: &ExchangeParts<'_>,
        request: impl FnOnce(&mut Vec<u8>),
        response: Option<impl FnOnce(&mut Vec<u8>)>,
    ) -> ExchangeHandle {
        self.exchange_line(|out, handle| {
            crate::work::exchange(out, handle, exchange, |out| {
                out.push(b',');
                request(out);
                if let Some(response) = response {
                    out.push(b',');
                    response(out);
                }
            })
        })
    }

    /// Append an exchange's line, which `write` encodes given its handle.
    fn exchange_line(&self, write: impl FnOnce(&mut Vec<u8>, u64) -> bool) -> ExchangeHandle {
        ExchangeHandle(self.shared.events.push_work(true, write))
    }

    /// Append one tool call.
    pub fn tool_call(&self, call: ToolCallRecord) {
        self.shared
            .events
            .push_work(false, |out, _| crate::work::tool_call_line(out, &call));
    }

    /// Append one operator answer.
    pub fn answer(&self, answer: AnswerRecord) {
        self.shared
            .events
            .push_work(false, |out, _| crate::work::answer_line(out, &answer));
    }

    /// Append one Plugin activation.
    pub fn activation(&self, activation: ActivationRecord) {
        self.shared.events.push_work(false, |out, _| {
            crate::work::activation_line(out, &activation)
        });
    }

    /// The warning, if the log has given up on this run.
    pub fn warning(&self) -> Option<String> {
        self.shared.warning.get()
    }

    /// Commit everything sent so far, on the calling thread, waiting at most
    /// the options' `finish_wait`. False if that ran out or the log has given up.
    pub fn flush(&self) -> bool {
        self.commit_now(None) && self.warning().is_none()
    }

    /// Record how the run ended and commit every row, on the calling thread
    /// (bounded by the options' `finish_wait`). Returns the warning, if
    /// there was one.
    ///
    /// The background thread may then tidy the database (a checkpoint when
    /// the WAL has grown, which costs an fsync or two): the run need not
    /// wait for that, but a process about to exit should, through
    /// [`finish_with_tail`](RunWriter::finish_with_tail).
    pub fn finish(self, end: RunEnd) -> Option<String> {
        self.finish_with_tail(end).0
    }

    /// The background thread's tail (a finished one if it was taken already).
    fn take_tail(&mut self) -> WriterTail {
        self.tail
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_else(WriterTail::done)
    }

    /// [`finish`](RunWriter::finish), also handing back the background
    /// thread's [`WriterTail`] to wait on before the process exits.
    pub fn finish_with_tail(mut self, end: RunEnd) -> (Option<String>, WriterTail) {
        let tail = self.take_tail();
        self.commit_now(Some(end));
        (self.warning(), tail)
    }

    /// Record how the run ended and leave every commit to the background
    /// thread: returns at once, so the run's end pays nothing for the log,
    /// not even waking that thread (a futex wake that costs a run tens of
    /// µs on a virtual machine). The thread commits when the tail is
    /// waited on, when the next writer on the same database in this
    /// process wants its connection (that writer's thread wakes it), or at
    /// the end of the window it is in (at most `batch_window_max`), so a
    /// killed process still loses at most that much. Wait on the returned
    /// tail before the process exits or before telling anyone the run is
    /// logged.
    ///
    /// The next writer on the same database in this process starts with
    /// this one's connection once it is done (`promptforge mcp`, benches):
    /// its background thread waits for it, bounded; the run does not.
    pub fn finish_deferred(mut self, end: RunEnd) -> WriterTail {
        self.wake_on_close = false;
        let tail = self.take_tail();
        *self
            .shared
            .end
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(end);
        // Dropping `self` closes the writer and wakes the background thread.
        tail
    }

    /// Commit what is queued (and `end`) here and now; on a database that
    /// stays busy past `finish_wait`, leave it to the background thread and
    /// warn. True if everything is committed.
    fn commit_now(&self, end: Option<RunEnd>) -> bool {
        let shared = &self.shared;
        let deadline = Instant::now() + shared.options.finish_wait;
        if let Some(end) = end {
            // Whoever commits next writes it (the background thread, if the
            // wait below runs out).
            *shared.end.lock().unwrap_or_else(PoisonError::into_inner) = Some(end);
        }
        let Some(mut core) = shared.core_until(deadline) else {
            // The background thread holds the core: inside a database call
            // (a lock held elsewhere, a stalled disk) or about to be.
            self.still_writing(shared.in_database.load(Ordering::SeqCst));
            return false;
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let busy = left.min(shared.options.busy_timeout);
            match core.commit_queued(shared, busy, 0) {
                Committed::Done => return true,
                Committed::Busy if Instant::now() < deadline => {}
                Committed::Busy => break,
            }
        }
        drop(core);
        // The database stayed busy: another process holds its lock.
        self.still_writing(true);
        self.wake();
        false
    }

    fn still_writing(&self, on_the_database: bool) {
        self.shared.still_writing(on_the_database);
    }

    fn wake(&self) {
        if let Some(thread) = &self.thread {
            thread.unpark();
        }
    }
}

impl Drop for RunWriter {
    fn drop(&mut self) {
        // Finished or not, the background thread commits what is left, tidies and ends.
        if self.thread.is_some() {
            closing_on(&self.shared, self.thread.clone());
        }
        self.shared.closing.store(true, Ordering::SeqCst);
        if self.wake_on_close {
            self.wake();
        }
    }
}

fn warning_text(path: &std::path::Path, problem: &str) -> String {
    format!(
        "run log {}: {problem}; this run is not fully logged",
        path.display()
    )
}

/// A run's end checkpoints the WAL (off the run's path, see `tidy_wal`)
/// once it is larger than this: every new connection reads the whole WAL
/// back, so a long one costs every later run.
const WAL_TIDY_BYTES: u64 = 1024 * 1024;

/// The connection the last run of this process left, for the next run on
/// the same database (a process running many runs, like `promptforge mcp`):
/// opening one costs a schema parse, its statements' preparation and, with
/// no other connection open, reading the WAL back. Also which databases a
/// closed writer's background thread is still working on, so the next
/// writer there can wait for its connection.
static IDLE: Mutex<Idle> = Mutex::new(Idle {
    kept: None,
    closing: Vec::new(),
    working: Vec::new(),
});

/// Signalled when a closing writer's background thread ends.
static IDLE_BACK: Condvar = Condvar::new();

/// The most a new writer's background thread waits for the last writer's
/// connection before it opens its own.
const IDLE_WAIT: Duration = Duration::from_secs(1);

struct Idle {
    kept: Option<(PathBuf, Connection)>,
    /// One entry per closed writer whose background thread has not ended:
    /// its database and which writer it is.
    closing: Vec<(PathBuf, WriterId, Option<thread::Thread>)>,
    /// Writers whose background thread is past its wait: it holds a
    /// connection, or is opening one, and hands it back when it ends.
    working: Vec<WriterId>,
}

fn idle_lock() -> MutexGuard<'static, Idle> {
    IDLE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A writer, by the address of what it shares with its background thread.
type WriterId = usize;

fn writer_id(shared: &Shared) -> WriterId {
    std::ptr::from_ref(shared) as usize
}

/// The kept connection for `shared`'s database, if there is one; with
/// `until`, waiting until then while another closed writer there may still
/// hand one back (never for `shared`'s own writer: a run that ends before
/// its background thread starts is closed already).
fn idle_connection(shared: &Shared, until: Option<Instant>) -> Option<Connection> {
    let path = shared.path.as_path();
    let me = writer_id(shared);
    let mut idle = idle_lock();
    loop {
        // Only a closed writer whose thread holds a connection will hand
        // one back soon; threads that are all waiting would wait each other out.
        let mut others = false;
        for (_, _, thread) in idle
            .closing
            .iter()
            .filter(|(p, id, _)| p == path && *id != me && idle.working.contains(id))
        {
            others = true;
            // A deferred finish left its thread waiting out its window:
            // waking it is this thread's job, off the runs' own threads;
            // even when a kept connection is at hand (a writer whose job
            // started late may have left one after a later writer's thread
            // began to wait out its window).
            if until.is_some() {
                if let Some(thread) = thread {
                    thread.unpark();
                }
            }
        }
        if idle.kept.as_ref().is_some_and(|(kept, _)| kept == path) {
            return idle.kept.take().map(|(_, conn)| conn);
        }
        let left = until?.saturating_duration_since(Instant::now());
        if left.is_zero() || !others {
            return None;
        }
        idle = IDLE_BACK
            .wait_timeout(idle, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

fn closing_on(shared: &Shared, thread: Option<thread::Thread>) {
    idle_lock()
        .closing
        .push((shared.path.clone(), writer_id(shared), thread));
}

/// A closed writer's background thread ends, keeping `conn` for the next.
fn closed_on(shared: &Shared, conn: Option<Connection>) {
    let path = shared.path.as_path();
    let me = writer_id(shared);
    if let Some(conn) = &conn {
        let _ = conn.busy_timeout(WriterOptions::default().busy_timeout);
    }
    let replaced = {
        let mut idle = idle_lock();
        if let Some(at) = idle.closing.iter().position(|(_, id, _)| *id == me) {
            idle.closing.swap_remove(at);
        }
        if let Some(at) = idle.working.iter().position(|id| *id == me) {
            idle.working.swap_remove(at);
        }
        conn.and_then(|conn| idle.kept.replace((path.to_owned(), conn)))
    };
    IDLE_BACK.notify_all();
    // Closing a replaced connection (another database's) outside the lock.
    drop(replaced);
}

/// Keep `conn` for the next writer on `path`.
fn keep_idle(path: &std::path::Path, conn: Connection) {
    let _ = conn.busy_timeout(WriterOptions::default().busy_timeout);
    let replaced = idle_lock().kept.replace((path.to_owned(), conn));
    IDLE_BACK.notify_all();
    // Closing a replaced connection (another database's) outside the lock.
    drop(replaced);
}

/// One run's background work, for a writer thread (given the thread's own
/// listing). What it returns is dropped once the thread is back among the
/// idle ones (what a [`WriterTail`] waits for), so a run that begins after
/// that finds it; and whether the thread is listed already.
type Job = Box<dyn FnOnce(IdleThread) -> (SyncSender<()>, bool) + Send>;

/// A writer thread between runs, and where its next run goes.
struct IdleThread {
    thread: thread::Thread,
    jobs: SyncSender<Job>,
}

/// Writer threads waiting for a run: a process running many runs
/// (`promptforge mcp`, `promptforge test`, the benches) spawns none per
/// run, only one for each run going at the same time.
static IDLE_THREADS: Mutex<Vec<IdleThread>> = Mutex::new(Vec::new());

/// How long a writer thread waits for another run before it ends.
const THREAD_IDLE: Duration = Duration::from_secs(30);

fn idle_threads() -> MutexGuard<'static, Vec<IdleThread>> {
    IDLE_THREADS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Run `job` on an idle writer thread, or on a new one; the thread it runs on.
fn on_writer_thread(job: Job) -> std::io::Result<thread::Thread> {
    let mut job = job;
    while let Some(idle) = idle_threads().pop() {
        // A thread taken from the list waits for its job (see `writer_thread`).
        match idle.jobs.send(job) {
            Ok(()) => return Ok(idle.thread),
            Err(mpsc::SendError(back)) => job = back,
        }
    }
    thread::Builder::new()
        .name("pf-runlog".into())
        .spawn(move || writer_thread(job))
        .map(|handle| handle.thread().clone())
}

/// A writer thread: runs its job, then waits in [`IDLE_THREADS`] for the
/// next, ending after [`THREAD_IDLE`] without one.
fn writer_thread(first: Job) {
    let (jobs, next) = mpsc::sync_channel::<Job>(1);
    let me = thread::current();
    let mut job = first;
    loop {
        let (done, listed) = job(IdleThread {
            thread: me.clone(),
            jobs: jobs.clone(),
        });
        if !listed {
            idle_threads().push(IdleThread {
                thread: me.clone(),
                jobs: jobs.clone(),
            });
        }
        drop(done);
        job = match next.recv_timeout(THREAD_IDLE) {
            Ok(job) => job,
            Err(_) => {
                let mut idle = idle_threads();
                if let Some(at) = idle.iter().position(|t| t.thread.id() == me.id()) {
                    idle.swap_remove(at);
                    return;
                }
                drop(idle);
                // Taken from the list meanwhile: its job is on the way.
                match next.recv() {
                    Ok(job) => job,
                    Err(_) => return,
                }
            }
        };
    }
}

/// The background thread: open the database, then commit what is queued
/// each window until the writer is dropped; then commit the rest (and the
/// end), close `committed`, tidy and return (the writer thread then closes
/// the run's `done`, which is what a [`WriterTail`] waits for).
fn background_thread(shared: &Shared, committed: SyncSender<()>) {
    // Off the run's path: a writer just closed on this database may still
    // be committing; its connection saves opening one.
    let reused = if shared.options.max_page_count.is_none() {
        idle_connection(shared, Some(Instant::now() + IDLE_WAIT))
    } else {
        None
    };
    idle_lock().working.push(writer_id(shared));
    {
        let mut core = shared.core();
        if let Some(conn) = reused {
            if !core.opened {
                core.opened = true;
                core.conn = Some(conn);
            } else {
                // The run opened one itself meanwhile (a flush): keep this for the next.
                keep_idle(&shared.path, conn);
            }
        }
        core.ensure_open(shared);
    }
    let window = shared.options.batch_window;
    let longest = shared.options.batch_window_max.max(window);
    let mut wait = window;
    let mut core = loop {
        // Senders never wake this thread: it looks each window; the end
        // unparks it. The thread serves one run after another, so a wake
        // meant for an earlier run may still be pending: only the end or
        // the window's end stop the wait.
        let due = Instant::now() + wait;
        while !shared.closing.load(Ordering::SeqCst) {
            let left = due.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            thread::park_timeout(left);
        }
        let closing = shared.closing.load(Ordering::SeqCst);
        let mut core = shared.core();
        let busy_timeout = shared.options.busy_timeout;
        let retries = shared.options.busy_retries;
        let _ = core.commit_queued(shared, busy_timeout, retries);
        if closing {
            break core;
        }
        // Each window doubles the next: while the run logs, fewer and
        // larger commits; while it is quiet, fewer wake-ups.
        wait = (wait * 2).min(longest);
    };
    drop(committed);
    core.tidy_wal(shared);
    let keep = !core.disabled && shared.options.max_page_count.is_none();
    let conn = core.conn.take().filter(|_| keep);
    if !core.has_work() {
        core.events.recycle();
        core.spare.recycle();
        core.packer.recycle();
        shared.events.recycle();
    }
    drop(core);
    closed_on(shared, conn);
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
    tx.prepare_cached(
        "INSERT INTO runs (execution, prompt_path, prompt_text, prompt_sha256, args_json, seed,
             start_rfc3339, start_ms, host_file, model, store_dir, started_at_ms, pid,
             replay_of, resumed_from)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
    )?
    .execute(params![
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
    ])?;
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

/// Lines the writer encoded as JSON (so UTF-8), bound as TEXT as they are:
/// `str::from_utf8` over a commit's 40-odd KB, on the commit's path, proved
/// nothing.
struct JsonText<'a>(&'a [u8]);

impl rusqlite::ToSql for JsonText<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(rusqlite::types::ToSqlOutput::Borrowed(
            rusqlite::types::ValueRef::Text(self.0),
        ))
    }
}

const INSERT_EVENTS: &str =
    "INSERT INTO event_batches (run_id, first_ord, count, lines, work, packed)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

fn write_end(tx: &Transaction<'_>, run_id: i64, end: &RunEnd) -> rusqlite::Result<()> {
    let (result, error_kind, error_message) = match &end.outcome {
        Outcome::Completed { result } => (Some(result.as_str()), None, None),
        Outcome::Failed { kind, message } => (None, Some(kind.as_str()), Some(message.as_str())),
        Outcome::Cancelled => (None, None, None),
    };
    let [input, output, total] = usage_columns(Some(&end.usage));
    tx.prepare_cached(
        "UPDATE runs SET outcome = ?2, result = ?3, error_kind = ?4, error_message = ?5,
             finished_at_ms = ?6, duration_ms = ?7,
             input_tokens = ?8, output_tokens = ?9, total_tokens = ?10
         WHERE id = ?1",
    )?
    .execute(params![
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
    ])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::RunLog;

    fn start(execution: &str) -> RunStart {
        RunStart {
            execution: execution.to_owned(),
            prompt_path: "p.md".to_owned(),
            prompt_text: "# P\n".to_owned(),
            args: serde_json::json!({}),
            seed: 1,
            start_rfc3339: "2025-01-02T03:04:05Z".to_owned(),
            start_ms: 0,
            host_file: None,
            model: None,
            store_dir: None,
            replay_of: None,
            resumed_from: None,
        }
    }

    fn completed() -> RunEnd {
        RunEnd {
            outcome: Outcome::Completed {
                result: "done".to_owned(),
            },
            duration_ms: 3,
            usage: TokenUsage::default(),
        }
    }

    /// The tests that look at the process-wide idle pool (its kept
    /// connection) take turns.
    static IDLE_POOL_TESTS: Mutex<()> = Mutex::new(());

    /// A writer with hour-long windows that logged one event and was closed
    /// (deferred) while its thread waits out its window: nobody wakes that
    /// thread, so only the tail's own commit can end a short wait.
    fn closed_while_waiting_out_its_window(
        path: &std::path::Path,
        id: &str,
    ) -> (WriterTail, thread::Thread, Arc<Shared>) {
        let options = WriterOptions {
            batch_window: Duration::from_secs(3600),
            batch_window_max: Duration::from_secs(3600),
            ..WriterOptions::default()
        };
        let writer = RunWriter::begin_with(path, start(id), options);
        writer.event_fields("lua", "Run", "0", 0, &serde_json::Map::new());
        // Until its thread holds the connection (bounded far above the
        // milliseconds it takes), and then until it waits out its window: a
        // thread that reaches its loop after the close commits at once itself
        // (microseconds after it opened; this leaves it far more).
        for _ in 0..6000 {
            if writer.shared.core().conn.is_some() {
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        thread::sleep(Duration::from_millis(100));
        let mut tail = writer.finish_deferred(completed());
        let thread = tail.thread.take().expect("a writer thread");
        let shared = tail.shared.clone().expect("shared");
        (tail, thread, shared)
    }

    #[test]
    fn a_tail_commits_on_the_waiting_thread_while_the_writer_thread_waits_out_its_window() {
        let _turn = IDLE_POOL_TESTS
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        let (tail, thread, shared) = closed_while_waiting_out_its_window(&path, "run-here");
        assert_eq!(tail.wait(Duration::from_millis(10)), None);
        // Committed, and the connection is back for the next writer.
        assert!(shared.core().ended);
        assert!(idle_lock().kept.as_ref().is_some_and(|(p, _)| *p == path));
        let log = RunLog::open(&path).unwrap();
        let id = log.resolve("run-here").unwrap();
        assert_eq!(log.run(id).unwrap().unwrap().end, Some(completed()));
        assert_eq!(log.events(id).unwrap().len(), 1);
        thread.unpark();
    }

    /// A run that logs `events` events of about 4 KB each, ended and settled.
    /// The text is pseudo-random, so packing leaves it about as long.
    fn settled_run(path: &std::path::Path, id: &str, events: usize) {
        let writer = RunWriter::begin(path, start(id));
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..events {
            let text: String = (0..4000)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    char::from(b'a' + (state % 26) as u8)
                })
                .collect();
            let mut fields = serde_json::Map::new();
            fields.insert("text".into(), serde_json::Value::String(text));
            writer.event_fields("lua", "Run", "0", 0, &fields);
        }
        let (warning, tail) = writer.finish_with_tail(completed());
        assert_eq!(warning, None);
        assert_eq!(tail.wait(Duration::from_secs(60)), None);
    }

    fn file_len(path: &std::path::Path, suffix: &str) -> u64 {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        std::fs::metadata(name).map_or(0, |m| m.len())
    }

    /// The tidy's two halves: a run's end checkpoints a WAL over
    /// `WAL_TIDY_BYTES`, and the next commit starts it over, cut to its own
    /// length (`journal_size_limit = 0`): keeping the file's length instead
    /// made commits overwrite pages still being written back, which stalled
    /// them for milliseconds (docs/perf-log8.md).
    #[test]
    fn a_long_wal_is_checkpointed_at_a_runs_end_and_started_over_short() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        settled_run(&path, "run-small", 1);
        let db_small = file_len(&path, "");
        assert!(file_len(&path, "-wal") < WAL_TIDY_BYTES);
        // 300 lines of 4 KB: the end checkpoints, copying the pages into
        // the database file.
        settled_run(&path, "run-long", 300);
        assert!(file_len(&path, "-wal") > WAL_TIDY_BYTES);
        assert!(file_len(&path, "") > db_small + WAL_TIDY_BYTES);
        // The next commit starts the WAL over and cuts the file to it.
        settled_run(&path, "run-after", 1);
        assert!(file_len(&path, "-wal") < 64 * 1024);
        let log = RunLog::open(&path).unwrap();
        for (id, events) in [("run-small", 1), ("run-long", 300), ("run-after", 1)] {
            let run = log.resolve(id).unwrap();
            assert_eq!(log.events(run).unwrap().len(), events, "{id}");
            assert_eq!(log.run(run).unwrap().unwrap().end, Some(completed()));
        }
    }

    #[test]
    fn a_locked_database_leaves_the_tails_commit_to_the_writer_thread_rows_kept() {
        let _turn = IDLE_POOL_TESTS
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        let (tail, thread, shared) = closed_while_waiting_out_its_window(&path, "run-locked-here");
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        // Another process's write lock: no wait, no giving up, no warning.
        // (The writer thread may already be at its own try, if it reached its
        // window's loop after the close: the tail then finds its lock taken
        // and leaves it too. Neither may commit, nor give up.)
        assert!(matches!(finish_here(&shared, true), Here::Left));
        assert_eq!(shared.warning.get(), None);
        holder.execute_batch("COMMIT").unwrap();
        // Committed by whichever thread gets there, rows kept.
        thread.unpark();
        assert_eq!(tail.wait(Duration::from_secs(60)), None);
        {
            let core = shared.core();
            assert!(core.ended && !core.disabled);
        }
        let log = RunLog::open(&path).unwrap();
        let id = log.resolve("run-locked-here").unwrap();
        assert_eq!(log.run(id).unwrap().unwrap().end, Some(completed()));
        assert_eq!(log.events(id).unwrap().len(), 1);
    }
}
