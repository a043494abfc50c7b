//! `promptforge test`: prompt tests for users. A YAML test file ([`format`])
//! holds cases (args, seed, fixtures) and their expectations; each case runs
//! in this process through a `RunSession` ([`run`], [`session`]) on
//! `pf_batch`'s executor, `-j` at a time, against each column of the
//! comparison matrix ([`matrix`]: `--model` × `--prompt`), is checked
//! ([`assert`], [`judge`]), and reported as a line, JSON, JUnit ([`junit`])
//! or an HTML grid ([`html`]); `--update` writes the current results back as
//! expectations ([`update`]). docs/testing.md is the user guide.
//!
//! Events and tool calls come from the run itself: a collecting observer
//! ([`session::Collector`]) hears them as the engine reports them.

pub mod assert;
pub mod catalog;
pub mod fixtures;
pub mod format;
pub mod html;
pub mod judge;
pub mod junit;
pub mod matrix;
pub mod run;
pub mod session;
pub mod update;
pub mod web;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};

use serde::Serialize;
use serde_json::Value as Json;

use assert::Failure;
use format::{Expect, Loaded, Malformed, TextMatch};
use run::{Observed, Settings, Variant};

/// The boundaries every run reports around its own work (parsing, sections,
/// Lua chunks and teardown, scope checks, waits, captured bodies): `--update`
/// leaves them out of an `events: {}` it fills.
const ROUTINE_EVENT_KINDS: &[&str] = &[
    "parse_started",
    "parse_succeeded",
    "run_started",
    "section_started",
    "section_finished",
    "lua_shared_load_started",
    "lua_shared_load_succeeded",
    "lua_chunk_started",
    "lua_chunk_succeeded",
    "lua_teardown_started",
    "lua_teardown_succeeded",
    "lua_compilation_started",
    "lua_compilation_succeeded",
    "tool_scope_validation_started",
    "tool_scope_validation_succeeded",
    "user_input_wait_started",
    "request",
    "response",
];

/// How to run the loaded cases.
#[derive(Debug, Clone)]
pub struct Options {
    /// Only cases whose `FILE: NAME` contains this.
    pub filter: Option<String>,
    pub update: bool,
    /// Runs per case.
    pub repeat: u32,
    /// A case passes when at least this share of its runs passed.
    pub pass_rate: f64,
    /// Runs at once, over all columns.
    pub jobs: usize,
    /// The matrix's columns (one, the cases' own model and prompt, without
    /// `--model` or `--prompt`).
    pub variants: Vec<Variant>,
    /// Stops starting runs and cancels those in flight (a signal).
    pub cancel: pf_harness::CancellationToken,
}

/// One case's outcome over its runs.
#[derive(Debug, Clone, Serialize)]
pub struct CaseOutcome {
    pub file: String,
    pub line: usize,
    pub name: String,
    pub passed: bool,
    pub runs: u32,
    pub passes: u32,
    pub pass_rate: f64,
    /// Wall time of all its runs together.
    pub duration_ms: u64,
    /// The first failing run's failed assertions.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<Failure>,
    /// Why a run could not be made at all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether `--update` rewrote its expectations.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub updated: bool,
    /// What each run cost and where it is logged (runs against a catalog
    /// model, a matrix, `--cache`, `--html`).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub cell: Option<Cell>,
}

/// One cell of the comparison matrix: a case against one column's model and
/// prompt, over its runs.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// The column's name (model id, prompt file, or both).
    pub column: String,
    /// The column's index in `matrix.columns`.
    #[serde(skip)]
    pub column_index: usize,
    /// Each run's execution id, in run order.
    pub executions: Vec<String>,
    /// Each run's place in the run log (`#N`, for `show`), when it was logged.
    pub logged: Vec<String>,
    /// Tokens every run used, model rounds and judge calls (cached rounds included).
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// What was paid for (cached rounds excluded), when the catalog prices the model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// Model rounds answered by `--cache`, and their tokens and cost.
    pub cached_rounds: u64,
    pub saved_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saved_cost: Option<f64>,
    /// Every model round of every run came from the cache.
    pub cached: bool,
    /// The median run's wall time.
    pub latency_ms: u64,
    /// With more than one run: the pass rate's 95% Wilson interval.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<[f64; 2]>,
    /// The first run's result (or error message).
    pub result: String,
    /// Each run's scratch store, as its logged run names it (to find it in the log).
    #[serde(skip)]
    pub stores: Vec<String>,
}

/// The 95% Wilson score interval for `passes` of `runs`.
pub fn wilson(passes: u32, runs: u32) -> [f64; 2] {
    if runs == 0 {
        return [0.0, 1.0];
    }
    let n = f64::from(runs);
    let p = f64::from(passes) / n;
    let z = 1.959_963_984_540_054_f64;
    let z2 = z * z;
    let denominator = 1.0 + z2 / n;
    let center = (p + z2 / (2.0 * n)) / denominator;
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denominator;
    [(center - half).max(0.0), (center + half).min(1.0)]
}

impl CaseOutcome {
    /// The failures for a person, one after another.
    pub fn details(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        if let Some(e) = &self.error {
            parts.push(format!("cannot run: {e}"));
        }
        parts.extend(self.failures.iter().map(Failure::render));
        parts.join("\n")
    }
}

/// The test files under `paths`, in name order, each once. A `.md` path means
/// the test file beside it; a missing path is an error naming it.
pub fn discover(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut found = Vec::new();
    for path in paths {
        if path.is_dir() {
            walk(path, &mut found);
        } else if path.is_file() {
            if path.extension().is_some_and(|e| e == "md") {
                let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
                let beside = path.with_file_name(format!("{stem}.test.yaml"));
                if beside.is_file() {
                    found.push(beside);
                } else {
                    return Err(format!("{} has no {}", path.display(), beside.display()));
                }
            } else {
                found.push(path.clone());
            }
        } else {
            return Err(format!("{}: no such file or folder", path.display()));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    found.retain(|p| seen.insert(p.clone()));
    Ok(found)
}

fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() {
            // Build output, VCS data and dependencies hold no user tests.
            if !name.starts_with('.') && name != "target" && name != "node_modules" {
                walk(&p, found);
            }
        } else if format::is_test_file(&p) {
            found.push(p);
        }
    }
}

/// Load every file; all the malformed ones are reported, not only the first.
pub fn load_all(files: &[PathBuf]) -> Result<Vec<Loaded>, Vec<Malformed>> {
    let (mut loaded, mut bad) = (Vec::new(), Vec::new());
    for f in files {
        match format::load(f) {
            Ok(l) => loaded.push(l),
            Err(m) => bad.push(m),
        }
    }
    if bad.is_empty() {
        Ok(loaded)
    } else {
        Err(bad)
    }
}

/// A path for messages: as given, without a leading `./`.
pub fn shown(path: &Path) -> String {
    let text = path.display().to_string();
    text.strip_prefix("./").map(str::to_string).unwrap_or(text)
}

/// One run's verdict, and (with `--update`) the case's new `expect`.
struct Attempt {
    failures: Vec<Failure>,
    error: Option<String>,
    millis: u64,
    new_expect: Option<Json>,
    /// What the run cost and where it is logged.
    spent: Spent,
}

/// One run's costs and identity, for a matrix cell.
#[derive(Default)]
struct Spent {
    execution: Option<String>,
    store: Option<String>,
    input_tokens: u64,
    output_tokens: u64,
    /// `None` when no model it used has prices.
    cost: Option<f64>,
    cached_rounds: u64,
    saved_tokens: u64,
    saved_cost: Option<f64>,
    /// Every model round it made came from the cache.
    all_cached: bool,
    result: String,
    logged: Option<pf_host::session::Finished>,
}

impl Spent {
    fn add_cost(&mut self, cost: Option<f64>) {
        if let Some(c) = cost {
            *self.cost.get_or_insert(0.0) += c;
        }
    }
}

/// One run to make: selected case `s`, column `v`, repetition `r`.
#[derive(Clone, Copy)]
struct CellRun {
    s: usize,
    v: usize,
    r: usize,
}

/// Run the selected cases against every column (`jobs` runs at once, on
/// `pf_batch`'s executor, as `batch` runs its inputs), calling `done` with
/// each cell's outcome in file, case and column order as soon as it and
/// those before it are known. With `update`, rewrites the files and reports
/// which. The logged runs' ends are settled before it returns.
pub fn run_all(
    settings: &Settings,
    loaded: &[Loaded],
    options: &Options,
    mut done: impl FnMut(&CaseOutcome),
) -> (Vec<CaseOutcome>, Vec<String>) {
    let selected: Vec<(usize, usize)> = loaded
        .iter()
        .enumerate()
        .flat_map(|(f, l)| (0..l.tests.cases.len()).map(move |c| (f, c)))
        .filter(|(f, c)| {
            let id = format!(
                "{}: {}",
                shown(&loaded[*f].file),
                loaded[*f].tests.cases[*c].name
            );
            options
                .filter
                .as_ref()
                .is_none_or(|s| id.contains(s.as_str()))
        })
        .collect();
    let default_variant = [Variant::default()];
    let variants: &[Variant] = if options.variants.is_empty() {
        &default_variant
    } else {
        &options.variants
    };
    let columns = variants.len();
    let repeat = options.repeat.max(1) as usize;
    let jobs: Vec<CellRun> = (0..selected.len())
        .flat_map(|s| (0..columns).flat_map(move |v| (0..repeat).map(move |r| CellRun { s, v, r })))
        .collect();
    let raw: Vec<Json> = loaded
        .iter()
        .map(|l| serde_norway::from_str(&l.text).unwrap_or(Json::Null))
        .collect();
    let cells = selected.len() * columns;
    let next = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<(CellRun, Attempt)>();
    let mut attempts: Vec<Vec<Option<Attempt>>> = (0..cells)
        .map(|_| (0..repeat).map(|_| None).collect())
        .collect();
    let mut outcomes: Vec<CaseOutcome> = Vec::new();
    let mut pending: Vec<(usize, usize, usize, Json)> = Vec::new();
    let logged: Mutex<Vec<pf_host::session::Finished>> = Mutex::new(Vec::new());
    // Lua runs on the thread that starts it: one executor per core keeps
    // scripted cases as parallel as before, and each keeps its share of
    // `jobs` runs in flight, so live cells wait on the model, not a thread.
    let cores = std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get);
    let threads = options.jobs.max(1).min(cores).min(jobs.len().max(1));
    // `jobs` in flight over all threads: the first `jobs % threads` take one more.
    let share = |thread: usize| {
        options.jobs.max(1) / threads + usize::from(thread < options.jobs.max(1) % threads)
    };
    let cancel = &options.cancel;
    std::thread::scope(|scope| {
        for thread in 0..threads {
            let per_thread = share(thread);
            let tx = tx.clone();
            let (next, jobs, selected, raw) = (&next, &jobs, &selected, &raw);
            scope.spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        // No runtime: every job this thread takes fails, so none is lost.
                        while let Some(&job) = jobs.get(next.fetch_add(1, Ordering::SeqCst)) {
                            let _ = tx.send((
                                job,
                                failed_attempt(format!("cannot start the async runtime: {e}")),
                            ));
                        }
                        return;
                    }
                };
                runtime.block_on(pf_batch::execute(
                    per_thread,
                    cancel,
                    || jobs.get(next.fetch_add(1, Ordering::SeqCst)).copied(),
                    |job: CellRun, cancel| async move {
                        let (f, c) = selected[job.s];
                        let original = &raw[f]["cases"][c]["expect"];
                        let update = options.update && job.r == 0;
                        let attempt = attempt(
                            settings,
                            &loaded[f],
                            c,
                            &variants[job.v],
                            original,
                            update,
                            cancel,
                        )
                        .await;
                        (job, attempt)
                    },
                    |(job, attempt)| {
                        let _ = tx.send((job, attempt));
                    },
                ));
            });
        }
        drop(tx);
        let mut printed = 0;
        for (job, mut a) in rx {
            if let Some(finished) = a.spent.logged.take() {
                logged
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(finished);
            }
            attempts[job.s * columns + job.v][job.r] = Some(a);
            while printed < cells && attempts[printed].iter().all(Option::is_some) {
                let (s, v) = (printed / columns, printed % columns);
                let (f, c) = selected[s];
                let runs: Vec<Attempt> = attempts[printed]
                    .iter_mut()
                    .filter_map(Option::take)
                    .collect();
                let column = (settings.log || columns > 1).then_some((v, &variants[v]));
                let (outcome, new_expect) =
                    summarize(&loaded[f], c, runs, options.pass_rate, column);
                done(&outcome);
                if let Some(e) = new_expect {
                    pending.push((outcomes.len(), f, c, e));
                }
                outcomes.push(outcome);
                printed += 1;
            }
        }
    });
    // Every run's end is queued; wait (bounded) until the log holds them.
    for finished in logged
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        finished.settle();
    }
    let updated = if options.update {
        write_updates(loaded, pending, &mut outcomes)
    } else {
        Vec::new()
    };
    (outcomes, updated)
}

fn failed_attempt(error: String) -> Attempt {
    Attempt {
        failures: Vec::new(),
        error: Some(error),
        millis: 0,
        new_expect: None,
        spent: Spent::default(),
    }
}

/// One run of case `c` of `file` against `variant`, checked; with
/// `update`, also its new `expect`.
async fn attempt(
    settings: &Settings,
    file: &Loaded,
    c: usize,
    variant: &Variant,
    original: &Json,
    update: bool,
    cancel: pf_harness::CancellationToken,
) -> Attempt {
    let case = &file.tests.cases[c];
    let mut obs = match run::run_case(settings, file, case, variant, cancel).await {
        Ok(obs) => obs,
        Err(error) => return failed_attempt(error),
    };
    let millis = obs.wall.as_millis() as u64;
    let (expect, new_expect) = if update {
        let new = updated_expect(original, &case.expect, &obs);
        match serde_json::from_value::<Expect>(new.clone()) {
            Ok(e) if new != *original => (e, Some(new)),
            _ => (case.expect.clone(), None),
        }
    } else {
        (case.expect.clone(), None)
    };
    let mut spent = spent_of(&mut obs);
    let mut failures = assert::check(&expect, &obs);
    if failures.is_empty() {
        failures.extend(judges(settings, &expect, &obs, &mut spent).await);
    }
    Attempt {
        failures,
        error: None,
        millis,
        new_expect,
        spent,
    }
}

/// What a run cost, from its report and the cache's tally.
fn spent_of(obs: &mut Observed) -> Spent {
    let prices = obs.model.as_ref().map(|m| m.prices).unwrap_or_default();
    let (input_tokens, output_tokens) = obs
        .report
        .usage
        .map_or((0, 0), |u| (u.input_tokens, u.output_tokens));
    let (cached_rounds, (saved_in, saved_out)) = obs.cached.unwrap_or((0, (0, 0)));
    let saved_cost = prices.cost(saved_in, saved_out);
    let cost = prices.cost(input_tokens, output_tokens).map(|all| {
        // What was paid: every round less those the cache answered.
        (all - saved_cost.unwrap_or(0.0)).max(0.0)
    });
    let seen = assert::seen(obs);
    Spent {
        execution: obs.report.execution.clone(),
        store: obs
            .logged
            .is_some()
            .then(|| pf_host::session::display_path(&obs.store)),
        input_tokens,
        output_tokens,
        cost,
        cached_rounds,
        saved_tokens: saved_in + saved_out,
        saved_cost: saved_cost.filter(|_| cached_rounds > 0),
        all_cached: cached_rounds > 0 && cached_rounds as usize >= obs.requests.len(),
        result: match seen.error {
            Some((kind, message)) => format!("{kind}: {message}"),
            None => seen.result,
        },
        logged: obs.logged.take(),
    }
}

/// The `judge` assertions: each asks its model about the result (logged and
/// cached as the runs are); their tokens and cost are the run's too.
async fn judges(
    settings: &Settings,
    expect: &Expect,
    obs: &Observed,
    spent: &mut Spent,
) -> Vec<Failure> {
    let Some(judges) = &expect.judge else {
        return Vec::new();
    };
    let result = assert::seen(obs).result;
    let cache = settings
        .cache
        .as_ref()
        .map(|c| pf_host::cache::CacheUse::new(std::sync::Arc::clone(c)));
    let asking = judge::Asking {
        log: settings.log.then_some(&settings.run_log),
        cache: cache.as_ref(),
    };
    let mut bad = Vec::new();
    for j in judges.items() {
        let name = format!("judge[{}]", j.model);
        let verdict = match catalog::lookup(settings.host.as_deref(), &j.model) {
            Ok(model) => {
                let cached_before = cache.as_ref().map_or(0, |c| c.tally.rounds());
                let judged = judge::ask(&model, &j.rubric, &result, asking).await;
                if let Ok(judge::Judged {
                    usage: Some((input, output)),
                    ..
                }) = &judged
                {
                    spent.input_tokens += input;
                    spent.output_tokens += output;
                    let cost = model.prices.cost(*input, *output);
                    if cache.as_ref().map_or(0, |c| c.tally.rounds()) > cached_before {
                        spent.cached_rounds += 1;
                        spent.saved_tokens += input + output;
                        if let Some(c) = cost {
                            *spent.saved_cost.get_or_insert(0.0) += c;
                        }
                        spent.add_cost(cost.map(|_| 0.0));
                    } else {
                        spent.add_cost(cost);
                    }
                }
                judged.map(|j| j.verdict)
            }
            Err(e) => Err(e),
        };
        let problem = match verdict {
            Ok(judge::Verdict::Pass) => continue,
            Ok(judge::Verdict::Fail(reason)) if reason.is_empty() => "the judge said FAIL".into(),
            Ok(judge::Verdict::Fail(reason)) => format!("the judge said FAIL: {reason}"),
            Ok(judge::Verdict::Unclear(reply)) => {
                format!("the judge answered neither PASS nor FAIL: {reply:?}")
            }
            Err(e) => e,
        };
        bad.push(Failure {
            assertion: name,
            message: format!("{problem}\n  rubric: {}", j.rubric),
            expected: None,
            actual: Some(result.clone()),
        });
    }
    bad
}

/// A case's outcome over its runs against one column (`column` given when
/// the report shows cells), and the first run's new `expect` (with `--update`).
fn summarize(
    file: &Loaded,
    c: usize,
    runs: Vec<Attempt>,
    pass_rate: f64,
    column: Option<(usize, &Variant)>,
) -> (CaseOutcome, Option<Json>) {
    let total = runs.len() as u32;
    let passes = runs
        .iter()
        .filter(|a| a.error.is_none() && a.failures.is_empty())
        .count() as u32;
    let rate = if total == 0 {
        0.0
    } else {
        f64::from(passes) / f64::from(total)
    };
    let first_bad = runs
        .iter()
        .find(|a| a.error.is_some() || !a.failures.is_empty());
    let new_expect = runs.first().and_then(|a| a.new_expect.clone());
    let cell = column.map(|(index, variant)| cell_of(index, variant, &runs, passes, total));
    let outcome = CaseOutcome {
        file: shown(&file.file),
        line: file.case_lines.get(c).copied().unwrap_or(1),
        name: file.tests.cases[c].name.clone(),
        passed: total > 0 && rate + 1e-9 >= pass_rate,
        runs: total,
        passes,
        pass_rate: rate,
        duration_ms: runs.iter().map(|a| a.millis).sum(),
        failures: first_bad.map(|a| a.failures.clone()).unwrap_or_default(),
        error: first_bad.and_then(|a| a.error.clone()),
        updated: new_expect.is_some(),
        cell,
    };
    (outcome, new_expect)
}

/// The cell of one case against one column, over its runs.
fn cell_of(index: usize, variant: &Variant, runs: &[Attempt], passes: u32, total: u32) -> Cell {
    let mut millis: Vec<u64> = runs.iter().map(|a| a.millis).collect();
    millis.sort_unstable();
    let sum_cost = |cost: fn(&Spent) -> Option<f64>| {
        runs.iter()
            .filter_map(|a| cost(&a.spent))
            .fold(None, |acc: Option<f64>, c| Some(acc.unwrap_or(0.0) + c))
    };
    Cell {
        column: variant.label.clone(),
        column_index: index,
        executions: runs
            .iter()
            .filter_map(|a| a.spent.execution.clone())
            .collect(),
        logged: Vec::new(),
        input_tokens: runs.iter().map(|a| a.spent.input_tokens).sum(),
        output_tokens: runs.iter().map(|a| a.spent.output_tokens).sum(),
        cost: sum_cost(|s| s.cost),
        cached_rounds: runs.iter().map(|a| a.spent.cached_rounds).sum(),
        saved_tokens: runs.iter().map(|a| a.spent.saved_tokens).sum(),
        saved_cost: sum_cost(|s| s.saved_cost),
        cached: !runs.is_empty() && runs.iter().all(|a| a.spent.all_cached),
        latency_ms: median(&millis),
        interval: (total > 1).then(|| wilson(passes, total)),
        result: runs
            .first()
            .map(|a| match &a.error {
                Some(e) => format!("cannot run: {e}"),
                None => a.spent.result.clone(),
            })
            .unwrap_or_default(),
        stores: runs.iter().filter_map(|a| a.spent.store.clone()).collect(),
    }
}

/// The median of sorted `values` (the lower middle of an even count).
pub fn median(values: &[u64]) -> u64 {
    if values.is_empty() {
        0
    } else {
        values[(values.len() - 1) / 2]
    }
}

/// Rewrite each file whose cases got new expectations (`(outcome index,
/// file, case, expect)`); the files written. A file that cannot be rewritten
/// fails its updated cases with the reason.
fn write_updates(
    loaded: &[Loaded],
    pending: Vec<(usize, usize, usize, Json)>,
    outcomes: &mut [CaseOutcome],
) -> Vec<String> {
    let mut by_file: BTreeMap<usize, Vec<(usize, usize, Json)>> = BTreeMap::new();
    for (o, f, c, expect) in pending {
        by_file.entry(f).or_default().push((o, c, expect));
    }
    let mut written = Vec::new();
    for (f, updates) in by_file {
        let file = &loaded[f];
        let edits: Vec<(usize, Json)> = updates.iter().map(|(_, c, e)| (*c, e.clone())).collect();
        let result = update::rewrite(&file.text, &edits).and_then(|text| {
            std::fs::write(&file.file, text)
                .map_err(|e| format!("cannot write {}: {e}", file.file.display()))
        });
        match result {
            Ok(()) => written.push(shown(&file.file)),
            Err(e) => {
                for (o, _, _) in &updates {
                    let outcome = &mut outcomes[*o];
                    outcome.updated = false;
                    outcome.passed = false;
                    outcome.error = Some(format!("--update: {e}"));
                }
            }
        }
    }
    written
}

/// The case's `expect` rewritten from what the run did: the snapshot values
/// (`outcome`, a plain `result`, `error`'s kind and plain message, plain or
/// absent `store` files, `events` counts, `tool_calls`) take the actual
/// values; matchers, `offered`, `budget` and `judge` are assertions and stay.
/// A case without `expect` gets its outcome and result (or error).
pub fn updated_expect(original: &Json, expect: &Expect, obs: &Observed) -> Json {
    let s = assert::seen(obs);
    let result_or_error = |m: &mut serde_json::Map<String, Json>| match &s.error {
        Some((kind, message)) => {
            m.insert(
                "error".into(),
                serde_json::json!({"kind": kind, "message": message}),
            );
        }
        None => {
            m.insert("result".into(), Json::String(s.result.clone()));
        }
    };
    let Json::Object(original) = original else {
        let mut m = serde_json::Map::new();
        if s.outcome == "cancelled" {
            m.insert("outcome".into(), Json::String(s.outcome.into()));
        } else {
            result_or_error(&mut m);
        }
        return Json::Object(m);
    };
    let mut m = original.clone();
    if s.outcome != expect.outcome().as_str() {
        m.insert("outcome".into(), Json::String(s.outcome.into()));
        match s.outcome {
            "completed" => {
                m.shift_remove("error");
                m.entry("result").or_insert(Json::String(s.result.clone()));
            }
            "failed" if !m.contains_key("error") => result_or_error(&mut m),
            _ => {}
        }
        if s.outcome == "failed" {
            m.shift_remove("result");
        }
    }
    if matches!(expect.result, Some(TextMatch::Equals(_))) && s.outcome == "completed" {
        m.insert("result".into(), Json::String(s.result.clone()));
    }
    if let (Some(Json::Object(e)), Some((kind, message))) = (m.get_mut("error"), &s.error) {
        if e.contains_key("kind") {
            e.insert("kind".into(), Json::String(kind.clone()));
        }
        if e.get("message").is_some_and(|v| !v.is_object()) {
            e.insert("message".into(), Json::String(message.clone()));
        }
    }
    if let Some(Json::Object(store)) = m.get_mut("store") {
        for (path, want) in store.iter_mut() {
            if !want.is_object() {
                *want = assert::store_file(obs, path).map_or(Json::Null, Json::String);
            }
        }
    }
    if let Some(Json::Object(events)) = m.get_mut("events") {
        let counts = assert::event_counts(&obs.events);
        if events.is_empty() {
            // What the prompt did, not the engine's routine boundaries every
            // run reports; a case can still name any kind by hand.
            for (kind, n) in counts {
                if !ROUTINE_EVENT_KINDS.contains(&kind.as_str()) {
                    events.insert(kind, n.into());
                }
            }
        } else {
            for (kind, n) in events.iter_mut() {
                *n = counts.get(kind).copied().unwrap_or(0).into();
            }
        }
    }
    if let Some(want) = &expect.tool_calls {
        let bare = !want.is_empty() && want.iter().all(|w| w.bare);
        let calls: Vec<Json> = obs
            .calls
            .iter()
            .cloned()
            .map(|c| match c.arguments.filter(|_| !bare) {
                Some(a) => {
                    let a = serde_json::from_str(&assert::unweb(obs, &a.to_string())).unwrap_or(a);
                    serde_json::json!({"alias": c.alias, "arguments": a})
                }
                None => Json::String(c.alias),
            })
            .collect();
        m.insert("tool_calls".into(), Json::Array(calls));
    }
    Json::Object(m)
}
