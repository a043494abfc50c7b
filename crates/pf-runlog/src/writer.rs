//! Writing runs: each run's rows queue up (events and host work, encoded
//! into the run's buffer by whoever reports them) and are committed in short
//! transactions, one for every run writing to the same database in this
//! process, by that database's thread each window and by a caller itself at
//! a flush, a synchronous finish or a tail's wait.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use crate::backend::{
    CommitConnection, CommitError, ConnectSettings, PendingRun, RunLogBackend, SqliteBackend,
};
use crate::buffer::{EventBuffer, LogEvent, Taken};
use crate::db::BUSY_RETRIES;
use crate::packed::Packer;
use crate::records::{
    ActivationRecord, AnswerRecord, EventRecord, ExchangeDraft, ExchangeHandle, ExchangeParts,
    ExchangeRecord, RunEnd, RunStart, ToolCallRecord,
};

/// A callback that receives the writer's one warning.
pub type WarningSink = Arc<dyn Fn(&str) + Send + Sync>;

/// How a [`RunWriter`] batches and how long it waits. The defaults suit a CLI run.
/// Runs on one database share its thread and connection when their
/// windows, busy handling and `max_page_count` agree; runs whose options
/// differ there get a thread and a connection of their own.
#[derive(Clone)]
pub struct WriterOptions {
    /// Unused (kept so options written for earlier versions still build).
    pub batch_rows: usize,
    /// The database's thread commits what is queued after this long once a
    /// run begins; each window doubles the next...
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
            // Longer than a short run (a scripted 50-round loop takes 2-5 ms):
            // runs back to back share a commit instead of paying one each
            // (each commit rewrites page 1 and every touched leaf).
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
    /// Whether closing wakes the database's thread (a deferred finish
    /// leaves that to whoever waits for it, see `finish_deferred`).
    wake_on_close: bool,
    /// The run's part of the database thread's work after its end (behind
    /// a lock only to keep the writer `Sync`).
    tail: Mutex<Option<WriterTail>>,
}

/// The database thread's last work for a run after its end: committing
/// what [`RunWriter::finish_deferred`] left to it, then tidying the WAL.
/// Wait on it before the process exits (or before telling anyone the run
/// is logged).
pub struct WriterTail {
    shared: Option<Arc<Shared>>,
    /// Closed once the run's rows and end are committed (or the log gave up).
    committed: Receiver<()>,
    /// Closed once the run is done with: committed and the WAL tidied.
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
            return shared.warning.get();
        }
        shared.db.wake();
        // Nobody sends; dropping the sender is the signal.
        if let Err(mpsc::RecvTimeoutError::Timeout) =
            self.committed.recv_timeout(shared.options.finish_wait)
        {
            shared.still_writing(shared.db.in_database.load(Ordering::SeqCst));
        }
        shared.warning.get()
    }

    /// Wait as [`wait_committed`](WriterTail::wait_committed) does, then
    /// until the WAL is tidied after it, at most `bound` more.
    pub fn wait(self, bound: Duration) -> Option<String> {
        let shared = self.shared.clone()?;
        if let Here::Done = finish_here(&shared, true) {
            return shared.warning.get();
        }
        shared.db.wake();
        // The run is done after its commit: waiting for that alone wakes
        // the caller once, not twice (each wake takes a core's turn).
        if let Err(mpsc::RecvTimeoutError::Timeout) =
            self.done.recv_timeout(shared.options.finish_wait)
        {
            if let Err(mpsc::TryRecvError::Empty) = self.committed.try_recv() {
                shared.still_writing(shared.db.in_database.load(Ordering::SeqCst));
            }
            let _ = self.done.recv_timeout(bound);
        }
        shared.warning.get()
    }
}

/// A run's event queue, kept beside its [`RunWriter`]
/// ([`RunWriter::event_queue`]) so events go in without the writer's lock.
/// Once the writer is finished or dropped, nothing more is queued.
#[derive(Clone)]
pub struct EventQueue {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EventQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventQueue").finish_non_exhaustive()
    }
}

impl EventQueue {
    /// Append one event, in order with the run's other events: its line is
    /// written here, on the caller's thread.
    pub fn push(&self, event: &(impl LogEvent + ?Sized)) {
        if self.shared.closing.load(Ordering::Relaxed) {
            return;
        }
        self.shared.events.push_event(event);
    }
}

/// How [`finish_here`] went.
enum Here {
    /// Everything is committed (and, when asked, tidied).
    Done,
    /// Left to the database thread: it holds the connection, or the
    /// database is locked (the thread waits that out with its own timeout
    /// and retries, as always).
    Left,
}

/// Commit a closed writer's rows and end on the waiting thread, when the
/// database thread is waiting out its window: waking that thread and then
/// being woken by it are two cross-core wakes (each tens of µs on a virtual
/// machine, and the thread's caches are cold), while the waiting thread,
/// idle anyway, has the rows in its own cache. It commits every run's rows
/// queued there (one transaction, as the thread would). With `tidy`, also
/// what the thread does after (checkpoint a grown WAL, recycle the run's
/// buffers). One try that never waits for a lock: a locked database leaves
/// everything to the thread, and the wait to its usual bounds.
fn finish_here(shared: &Arc<Shared>, tidy: bool) -> Here {
    let db = &shared.db;
    if !shared.closing.load(Ordering::SeqCst) || db.schedule.busy_timeout.is_zero() {
        return Here::Left;
    }
    let mut core = match db.core.try_lock() {
        Ok(core) => core,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(TryLockError::WouldBlock) => return Here::Left,
    };
    // A zero busy timeout, below the options' own: a locked database
    // comes back as `Busy` with the rows kept, never as giving up.
    if let Committed::Busy = core.commit_all(db, Duration::ZERO, 0) {
        return Here::Left;
    }
    if tidy {
        core.retire(db);
        if core.holds(shared) {
            // Not closed when its rows were gathered (it was, see the top).
            return Here::Left;
        }
        return Here::Done;
    }
    match core.state_of(shared) {
        Some(run) if !run.ended && !run.disabled => Here::Left,
        _ => Here::Done,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl std::fmt::Debug for RunWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunWriter")
            .field("log", &self.shared.db.name)
            .finish_non_exhaustive()
    }
}

/// What a run's writer shares with whoever commits its rows.
struct Shared {
    db: Arc<Database>,
    /// The run's own options: its warning sink and how long it waits.
    options: WriterOptions,
    events: EventBuffer,
    /// The run's end, handed over by `finish` and not yet taken by a commit.
    end: Mutex<Option<RunEnd>>,
    warning: Warning,
    /// The run has ended (or the writer was dropped): its rows are all
    /// queued, and once they are committed the run is done with.
    closing: AtomicBool,
}

impl Shared {
    fn warn(&self, problem: &str) {
        let message = warning_text(&self.db.name, problem);
        if self.warning.set_first(message.clone()) {
            tracing::warn!("{message}");
            if let Some(sink) = &self.options.on_warning {
                sink(&message);
            }
        }
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

/// One database this process logs runs into, with the options that shape
/// its commits: one connection and one thread for every run writing there
/// at the same time or one after another (`promptforge mcp`, `promptforge
/// test`, the benches). Each window's commit is one transaction for every
/// run with rows queued: runs that overlap share its page writes, its
/// locks and its wake-up, and a run that begins wakes nobody while the
/// thread is still looking each window.
struct Database {
    backend: Arc<dyn RunLogBackend>,
    /// The backend's key: runs on the same key share this database.
    key: String,
    /// The backend's name, as warnings say it.
    name: String,
    /// Runs with other schedule options get a database of their own.
    schedule: Schedule,
    /// The connection and every run's uncommitted rows. Whoever holds it
    /// commits: the thread each window, a caller at a flush, a finish or a
    /// tail's wait.
    core: Mutex<Core>,
    /// Runs that began and are not in the core yet: a run's start never
    /// waits for a commit in progress.
    joining: Mutex<Vec<RunState>>,
    /// Runs registered and not yet done with (the thread ends at none).
    active: AtomicUsize,
    /// Whether someone is inside a database call (opening or a commit): a
    /// wait that runs out then was spent on the database itself.
    in_database: AtomicBool,
    signal: Mutex<Signal>,
    bell: Condvar,
}

/// What the database thread is waiting for.
#[derive(Default)]
struct Signal {
    /// Wake now: a tail is waiting, or a run began while the thread was idle.
    woken: bool,
    /// The thread waits for a run to begin (no window, no deadline but its end).
    idle: bool,
}

/// The options a database's thread and connection follow: runs whose
/// options differ here write through a database of their own.
#[derive(Clone, PartialEq, Eq)]
struct Schedule {
    batch_window: Duration,
    batch_window_max: Duration,
    busy_timeout: Duration,
    busy_retries: u32,
    max_page_count: Option<u32>,
}

impl Schedule {
    fn of(options: &WriterOptions) -> Schedule {
        Schedule {
            batch_window: options.batch_window,
            batch_window_max: options.batch_window_max,
            busy_timeout: options.busy_timeout,
            busy_retries: options.busy_retries,
            max_page_count: options.max_page_count,
        }
    }
}

/// The databases this process logs into, each while it has a thread.
static DATABASES: Mutex<Vec<Arc<Database>>> = Mutex::new(Vec::new());

/// How long a database's thread waits for another run before it ends.
const THREAD_IDLE: Duration = Duration::from_secs(30);

impl Database {
    /// Register a run on the database at `path` with `schedule`, starting
    /// its thread if it has none. `make` builds the run's shared part given
    /// the database.
    fn join(
        backend: Arc<dyn RunLogBackend>,
        schedule: Schedule,
        make: impl FnOnce(Arc<Database>) -> Arc<Shared>,
    ) -> (Arc<Shared>, std::io::Result<()>) {
        let key = backend.key();
        let (db, started) = {
            let mut databases = lock(&DATABASES);
            let found = databases
                .iter()
                .find(|db| db.key == key && db.schedule == schedule)
                .cloned();
            match found {
                Some(db) => {
                    db.active.fetch_add(1, Ordering::SeqCst);
                    (db, Ok(()))
                }
                None => {
                    let db = Arc::new(Database {
                        name: backend.name(),
                        backend,
                        key,
                        schedule,
                        core: Mutex::new(Core::default()),
                        joining: Mutex::new(Vec::new()),
                        active: AtomicUsize::new(1),
                        in_database: AtomicBool::new(false),
                        signal: Mutex::new(Signal::default()),
                        bell: Condvar::new(),
                    });
                    let for_thread = Arc::clone(&db);
                    let started = thread::Builder::new()
                        .name("pf-runlog".into())
                        .spawn(move || database_thread(&for_thread))
                        .map(|_| ());
                    if started.is_ok() {
                        databases.push(Arc::clone(&db));
                    }
                    (db, started)
                }
            }
        };
        (make(db), started)
    }

    /// Let the thread commit now rather than at its window's end.
    fn wake(&self) {
        lock(&self.signal).woken = true;
        self.bell.notify_one();
    }

    /// A run began: wake the thread only if it waits without a window.
    fn arrived(&self) {
        let mut signal = lock(&self.signal);
        if signal.idle {
            signal.woken = true;
            drop(signal);
            self.bell.notify_one();
        }
    }

    /// Wait until `due` or a wake, whichever is first; an `idle` wait ends
    /// only at `due` or when a run begins (a wake meant for a run that is
    /// done with by now must not end it).
    fn wait_until(&self, due: Instant, idle: bool) {
        let mut signal = lock(&self.signal);
        signal.idle = idle;
        loop {
            let begun = self.active.load(Ordering::SeqCst) > 0;
            if (signal.woken && !idle) || (idle && begun) {
                break;
            }
            let left = due.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            signal = self
                .bell
                .wait_timeout(signal, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        signal.woken = false;
        signal.idle = false;
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
}

/// A database's thread: each window, commit every run's queued rows in one
/// transaction and let go of the runs that are done; with no run left,
/// wait for the next, and end after [`THREAD_IDLE`] without one.
fn database_thread(db: &Arc<Database>) {
    let window = db.schedule.batch_window;
    let longest = db.schedule.batch_window_max.max(window);
    let mut wait = window;
    loop {
        if db.active.load(Ordering::SeqCst) == 0 {
            db.wait_until(Instant::now() + THREAD_IDLE, true);
            if db.active.load(Ordering::SeqCst) == 0 {
                // A run registers under this lock, so none can slip in.
                let mut databases = lock(&DATABASES);
                if db.active.load(Ordering::SeqCst) == 0 {
                    databases.retain(|other| !Arc::ptr_eq(other, db));
                    drop(databases);
                    let mut core = lock(&db.core);
                    core.packer.recycle();
                    // Closed without a checkpoint (`SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE`).
                    core.conn = None;
                    return;
                }
                continue;
            }
            // A run began: its rows get a first window.
            wait = window;
        }
        // Runs never wake this thread: it looks each window; a tail's
        // wait wakes it.
        db.wait_until(Instant::now() + wait, false);
        let mut core = lock(&db.core);
        let _ = core.commit_all(db, db.schedule.busy_timeout, db.schedule.busy_retries);
        core.retire(db);
        drop(core);
        // Each window doubles the next: while runs log, fewer and larger
        // commits; while they are quiet, fewer wake-ups.
        wait = (wait * 2).min(longest);
    }
}

/// The database side: the connection, opened by whoever commits first, and
/// every registered run's uncommitted rows.
struct Core {
    conn: Option<Box<dyn CommitConnection>>,
    /// Whether opening was tried since the last run joined (a connection
    /// that cannot be opened is tried again for the next run, not each window).
    opened: bool,
    /// Why the last try to open failed.
    open_problem: Option<String>,
    /// Compresses each run's lines of a commit (`packed.rs`).
    packer: Packer,
    /// In the order the runs began.
    runs: Vec<RunState>,
}

/// One run as the core keeps it.
struct RunState {
    shared: Arc<Shared>,
    /// Set once a write failed: everything after is dropped.
    disabled: bool,
    pending_start: Option<(RunStart, i64)>,
    /// `(batch, input index)` when the run runs one input of a batch.
    input: Option<(String, u64)>,
    /// The run's row, once inserted.
    run_id: Option<i64>,
    next_ord: i64,
    /// Events and host work taken from the buffer and not yet committed (a
    /// busy database keeps them here for the next try).
    events: Taken,
    spare: Taken,
    /// The run's end, once handed over and not yet committed.
    end: Option<RunEnd>,
    /// The end is committed.
    ended: bool,
    /// The run was closed when its rows were last gathered: once they are
    /// committed, the run is done with.
    closed: bool,
    /// Dropped once the end is committed or the log gave up.
    committed: Option<SyncSender<()>>,
    /// Dropped once the run is done with.
    done: Option<SyncSender<()>>,
}

/// How a commit went.
enum Committed {
    Done,
    /// The database stayed busy; the rows are kept for another try.
    Busy,
}

impl RunState {
    /// Move what is queued into the uncommitted batch.
    fn gather(&mut self) {
        // Read first: a run closed by now has queued all it will.
        self.closed = self.shared.closing.load(Ordering::SeqCst);
        if let Some(end) = lock(&self.shared.end).take() {
            self.end = Some(end);
        }
        if self.events.is_empty() {
            self.shared.events.take(&mut self.events);
        } else {
            // A busy commit left some: append after them.
            self.shared.events.take(&mut self.spare);
            self.events.append(&self.spare);
        }
    }

    fn has_work(&self) -> bool {
        !self.events.is_empty() || self.end.is_some() || self.pending_start.is_some()
    }

    fn give_up(&mut self, name: &str, problem: &str) {
        self.disabled = true;
        let problem = problem
            .strip_prefix(&format!("run log {name}: "))
            .unwrap_or(problem);
        self.shared.warn(problem);
        self.drop_queued();
    }

    fn drop_queued(&mut self) {
        self.shared.events.close();
        self.events.clear();
        self.end = None;
        self.pending_start = None;
        self.committed = None;
    }
}

impl Default for Core {
    fn default() -> Core {
        Core {
            conn: None,
            opened: false,
            open_problem: None,
            packer: Packer::reusing(),
            runs: Vec::new(),
        }
    }
}

impl Core {
    /// Take the runs that began since the last commit.
    fn admit(&mut self, db: &Database) {
        let mut joining = lock(&db.joining);
        if joining.is_empty() {
            return;
        }
        if self.conn.is_none() {
            // A new run tries a database that failed to open again.
            self.opened = false;
        }
        self.runs.append(&mut joining);
    }

    fn state_of(&self, shared: &Arc<Shared>) -> Option<&RunState> {
        self.runs
            .iter()
            .find(|run| Arc::ptr_eq(&run.shared, shared))
    }

    fn holds(&self, shared: &Arc<Shared>) -> bool {
        self.state_of(shared).is_some()
    }

    /// Open the connection if nobody has tried since the last run joined.
    fn ensure_open(&mut self, db: &Database) {
        if self.opened {
            return;
        }
        self.opened = true;
        let options = &db.schedule;
        db.in_database.store(true, Ordering::SeqCst);
        let settings = ConnectSettings {
            busy_timeout: options.busy_timeout,
            busy_retries: options.busy_retries,
            max_page_count: options.max_page_count,
        };
        match db.backend.connect(&settings) {
            Ok(conn) => {
                self.conn = Some(conn);
                self.open_problem = None;
            }
            Err(problem) => self.open_problem = Some(problem),
        }
        db.in_database.store(false, Ordering::SeqCst);
    }

    /// Gather every run's queued rows and commit them in one transaction,
    /// trying a busy database `retries` more times with `busy_timeout` each.
    fn commit_all(&mut self, db: &Database, busy_timeout: Duration, retries: u32) -> Committed {
        self.admit(db);
        let mut work = false;
        for run in &mut self.runs {
            run.gather();
            if run.disabled {
                run.drop_queued();
            } else {
                work |= run.has_work();
            }
        }
        if !work {
            return Committed::Done;
        }
        self.ensure_open(db);
        if self.conn.is_none() {
            let problem = self
                .open_problem
                .clone()
                .unwrap_or_else(|| "cannot open the database".to_owned());
            for run in self.runs.iter_mut().filter(|run| !run.disabled) {
                if run.has_work() {
                    run.give_up(&db.name, &problem);
                }
            }
            return Committed::Done;
        }
        db.in_database.store(true, Ordering::SeqCst);
        let outcome = self.commit(db, busy_timeout, retries);
        db.in_database.store(false, Ordering::SeqCst);
        outcome
    }

    /// Write every run's events, host work and end in one transaction: one
    /// `event_batches` row a run holds its events and work lines.
    fn commit(&mut self, db: &Database, busy_timeout: Duration, retries: u32) -> Committed {
        let Some(conn) = self.conn.as_mut() else {
            return Committed::Done;
        };
        let pending: Vec<PendingRun<'_>> = self
            .runs
            .iter()
            .map(|run| {
                let active = !run.disabled && run.has_work();
                PendingRun {
                    run_id: run.run_id,
                    start: run
                        .pending_start
                        .as_ref()
                        .filter(|_| active)
                        .map(|(start, at)| (start, *at)),
                    next_ord: run.next_ord,
                    lines: if active { &run.events.lines } else { &[] },
                    count: if active { run.events.count } else { 0 },
                    work: if active { &run.events.work } else { &[] },
                    end: run.end.as_ref().filter(|_| active),
                    input: run
                        .input
                        .as_ref()
                        .map(|(batch, index)| (batch.as_str(), *index)),
                }
            })
            .collect();
        let written = conn.commit(&pending, &mut self.packer, busy_timeout, retries);
        drop(pending);
        match written {
            Ok(placed) => {
                for (run, placed) in self.runs.iter_mut().zip(placed) {
                    if run.disabled || !run.has_work() {
                        continue;
                    }
                    run.run_id = placed.run_id;
                    run.next_ord = placed.next_ord;
                    run.pending_start = None;
                    run.events.clear();
                    if run.end.take().is_some() {
                        run.ended = true;
                        run.committed = None;
                    }
                }
                Committed::Done
            }
            Err(CommitError::Busy(_)) if busy_timeout < db.schedule.busy_timeout => Committed::Busy,
            Err(CommitError::Busy(problem) | CommitError::Failed(problem)) => {
                for run in self.runs.iter_mut().filter(|run| !run.disabled) {
                    if run.has_work() {
                        run.give_up(&db.name, &problem);
                    }
                }
                Committed::Done
            }
        }
    }

    /// Let go of the runs that were closed when their rows were gathered
    /// and have nothing left to commit: tidy the WAL if one of them ended,
    /// recycle their buffers and tell their tails.
    fn retire(&mut self, db: &Database) {
        let finished = |run: &RunState| run.closed && (run.disabled || !run.has_work());
        if !self.runs.iter().any(finished) {
            return;
        }
        let (done, kept): (Vec<RunState>, Vec<RunState>) = std::mem::take(&mut self.runs)
            .into_iter()
            .partition(finished);
        self.runs = kept;
        if done.iter().any(|run| run.ended) {
            if let Some(conn) = self.conn.as_mut() {
                conn.tidy();
            }
        }
        for mut run in done {
            run.events.recycle();
            run.spare.recycle();
            run.shared.events.recycle();
            run.committed = None;
            run.done = None;
            db.active.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl RunWriter {
    /// Begin logging a run into the database at `db_path` (created if
    /// missing). Opening happens on the database's thread, so this never
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
        RunWriter::begin_on(SqliteBackend::shared(db_path), start, options)
    }

    /// Begin logging a run into `backend`'s log (SQLite or another; see
    /// [`RunLogBackend`]). Opening happens on the database's thread, so this
    /// never fails: an unusable log shows up as the writer's warning.
    pub fn begin_on(
        backend: Arc<dyn RunLogBackend>,
        start: RunStart,
        options: WriterOptions,
    ) -> RunWriter {
        let (committed_tx, committed_rx) = mpsc::sync_channel(1);
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        let schedule = Schedule::of(&options);
        let input = start.batch.clone().zip(start.input_index);
        let (shared, started) = Database::join(backend, schedule, |db| {
            Arc::new(Shared {
                db,
                options,
                events: EventBuffer::reusing(),
                end: Mutex::new(None),
                warning: Warning::default(),
                closing: AtomicBool::new(false),
            })
        });
        let run = RunState {
            shared: Arc::clone(&shared),
            disabled: false,
            pending_start: Some((start, wall_ms())),
            input,
            run_id: None,
            next_ord: 0,
            events: Taken::reusing(),
            spare: Taken::default(),
            end: None,
            ended: false,
            closed: false,
            committed: Some(committed_tx),
            done: Some(done_tx),
        };
        let tail = WriterTail {
            shared: Some(Arc::clone(&shared)),
            committed: committed_rx,
            done: done_rx,
        };
        if let Err(err) = started {
            // Never registered: nothing will commit, and the tail's
            // channels are closed with the run's state.
            shared.warn(&format!("cannot start the writer thread: {err}"));
            shared.events.close();
            drop(run);
            return RunWriter {
                shared,
                wake_on_close: false,
                tail: Mutex::new(Some(WriterTail::done())),
            };
        }
        lock(&shared.db.joining).push(run);
        shared.db.arrived();
        RunWriter {
            shared,
            wake_on_close: true,
            tail: Mutex::new(Some(tail)),
        }
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

    /// A handle that appends events (in order with the events appended by
    /// the other methods), for a reporter to keep beside the writer: the
    /// run's thread reports hundreds of events a model loop, and reaching
    /// the writer through the reporter's own lock each time cost as much as
    /// writing the event's line.
    pub fn event_queue(&self) -> EventQueue {
        EventQueue {
            shared: Arc::clone(&self.shared),
        }
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
    /// The database's thread may then tidy the database (a checkpoint when
    /// the WAL has grown, which costs an fsync or two): the run need not
    /// wait for that, but a process about to exit should, through
    /// [`finish_with_tail`](RunWriter::finish_with_tail).
    pub fn finish(self, end: RunEnd) -> Option<String> {
        self.finish_with_tail(end).0
    }

    /// The run's tail (a finished one if it was taken already).
    fn take_tail(&mut self) -> WriterTail {
        self.tail
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_else(WriterTail::done)
    }

    /// [`finish`](RunWriter::finish), also handing back the run's
    /// [`WriterTail`] to wait on before the process exits.
    pub fn finish_with_tail(mut self, end: RunEnd) -> (Option<String>, WriterTail) {
        let tail = self.take_tail();
        self.commit_now(Some(end));
        (self.warning(), tail)
    }

    /// Record how the run ended and leave every commit to the database's
    /// thread: returns at once, so the run's end pays nothing for the log,
    /// not even waking that thread (a futex wake that costs a run tens of
    /// µs on a virtual machine). The thread commits at the end of the
    /// window it is in (at most `batch_window_max`), with the rows of every
    /// other run on the same database in this process, or sooner when the
    /// tail is waited on; so a killed process still loses at most that
    /// much. Wait on the returned tail before the process exits or before
    /// telling anyone the run is logged.
    pub fn finish_deferred(mut self, end: RunEnd) -> WriterTail {
        self.wake_on_close = false;
        let tail = self.take_tail();
        *lock(&self.shared.end) = Some(end);
        // Dropping `self` closes the writer.
        tail
    }

    /// Commit what is queued (and `end`) here and now; on a database that
    /// stays busy past `finish_wait`, leave it to the database's thread and
    /// warn. True if everything is committed.
    fn commit_now(&self, end: Option<RunEnd>) -> bool {
        let shared = &self.shared;
        let db = &shared.db;
        let deadline = Instant::now() + shared.options.finish_wait;
        if let Some(end) = end {
            // Whoever commits next writes it (the database's thread, if the
            // wait below runs out).
            *lock(&shared.end) = Some(end);
        }
        let Some(mut core) = db.core_until(deadline) else {
            // The thread holds the core: inside a database call (a lock
            // held elsewhere, a stalled disk) or about to be.
            shared.still_writing(db.in_database.load(Ordering::SeqCst));
            return false;
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let busy = left.min(db.schedule.busy_timeout);
            match core.commit_all(db, busy, 0) {
                Committed::Done => return true,
                Committed::Busy if Instant::now() < deadline => {}
                Committed::Busy => break,
            }
        }
        drop(core);
        // The database stayed busy: another process holds its lock.
        shared.still_writing(true);
        db.wake();
        false
    }
}

impl Drop for RunWriter {
    fn drop(&mut self) {
        // Finished or not, the database's thread commits what is left and
        // lets the run go.
        self.shared.closing.store(true, Ordering::SeqCst);
        if self.wake_on_close {
            self.shared.db.wake();
        }
    }
}

fn warning_text(name: &str, problem: &str) -> String {
    format!("run log {name}: {problem}; this run is not fully logged")
}

pub(crate) fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

pub(crate) fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::records::{Outcome, TokenUsage};
    use crate::sqlite_commit::WAL_TIDY_BYTES;
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
            batch: None,
            input_index: None,
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

    /// A writer with hour-long windows that logged one event and was closed
    /// (deferred) while its database's thread waits out its window: nobody
    /// wakes that thread, so only the tail's own commit can end a short wait.
    fn closed_while_waiting_out_its_window(
        path: &std::path::Path,
        id: &str,
    ) -> (WriterTail, Arc<Shared>) {
        let options = WriterOptions {
            batch_window: Duration::from_secs(3600),
            batch_window_max: Duration::from_secs(3600),
            ..WriterOptions::default()
        };
        let writer = RunWriter::begin_with(path, start(id), options);
        // Opened and the run's row in: the connection exists before any
        // lock a test takes.
        assert!(writer.flush());
        writer.event_fields("lua", "Run", "0", 0, &serde_json::Map::new());
        let mut tail = writer.finish_deferred(completed());
        let shared = tail.shared.clone().expect("shared");
        tail.shared = Some(Arc::clone(&shared));
        (tail, shared)
    }

    #[test]
    fn a_tail_commits_on_the_waiting_thread_while_the_database_thread_waits_out_its_window() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        let (tail, shared) = closed_while_waiting_out_its_window(&path, "run-here");
        assert_eq!(tail.wait(Duration::from_millis(10)), None);
        // Committed, and let go of.
        assert!(!lock(&shared.db.core).holds(&shared));
        let log = RunLog::open(&path).unwrap();
        let id = log.resolve("run-here").unwrap();
        assert_eq!(log.run(id).unwrap().unwrap().end, Some(completed()));
        assert_eq!(log.events(id).unwrap().len(), 1);
    }

    #[test]
    fn runs_on_one_database_share_its_thread_and_a_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        let options = WriterOptions {
            batch_window: Duration::from_secs(3600),
            batch_window_max: Duration::from_secs(3600),
            ..WriterOptions::default()
        };
        let mut tails = Vec::new();
        let mut databases = Vec::new();
        for run in 0..5 {
            let writer =
                RunWriter::begin_with(&path, start(&format!("run-{run}")), options.clone());
            for seq in 0..3 {
                writer.event_fields("lua", "Run", "0", seq, &serde_json::Map::new());
            }
            databases.push(Arc::clone(&writer.shared.db));
            tails.push(writer.finish_deferred(completed()));
        }
        assert!(databases.iter().all(|db| Arc::ptr_eq(db, &databases[0])));
        // One wait commits every run queued there, in one transaction.
        let last = tails.pop().unwrap();
        assert_eq!(last.wait(Duration::from_secs(60)), None);
        let conn = rusqlite::Connection::open(&path).unwrap();
        let batches: i64 = conn
            .query_row("SELECT COUNT(*) FROM event_batches", [], |row| row.get(0))
            .unwrap();
        assert_eq!(batches, 5);
        let log = RunLog::open(&path).unwrap();
        for run in 0..5 {
            let id = log.resolve(&format!("run-{run}")).unwrap();
            assert_eq!(log.run(id).unwrap().unwrap().end, Some(completed()));
            assert_eq!(log.events(id).unwrap().len(), 3);
        }
        // Their tails say so at once.
        for mut tail in tails {
            assert_eq!(tail.wait_committed(), None);
        }
        // Other schedule options: a database of their own.
        let other = RunWriter::begin(&path, start("run-other"));
        assert!(!Arc::ptr_eq(&other.shared.db, &databases[0]));
        assert_eq!(other.finish(completed()), None);
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
        assert!(
            file_len(&path, "-wal") < 64 * 1024,
            "{}",
            file_len(&path, "-wal")
        );
        let log = RunLog::open(&path).unwrap();
        for (id, events) in [("run-small", 1), ("run-long", 300), ("run-after", 1)] {
            let run = log.resolve(id).unwrap();
            assert_eq!(log.events(run).unwrap().len(), events, "{id}");
            assert_eq!(log.run(run).unwrap().unwrap().end, Some(completed()));
        }
    }

    #[test]
    fn a_locked_database_leaves_the_tails_commit_to_the_database_thread_rows_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        let (tail, shared) = closed_while_waiting_out_its_window(&path, "run-locked-here");
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        // Another process's write lock: no wait, no giving up, no warning.
        assert!(matches!(finish_here(&shared, true), Here::Left));
        assert_eq!(shared.warning.get(), None);
        holder.execute_batch("COMMIT").unwrap();
        // Committed by whichever thread gets there, rows kept.
        shared.db.wake();
        assert_eq!(tail.wait(Duration::from_secs(60)), None);
        assert!(!lock(&shared.db.core).holds(&shared));
        let log = RunLog::open(&path).unwrap();
        let id = log.resolve("run-locked-here").unwrap();
        assert_eq!(log.run(id).unwrap().unwrap().end, Some(completed()));
        assert_eq!(log.events(id).unwrap().len(), 1);
    }
}
