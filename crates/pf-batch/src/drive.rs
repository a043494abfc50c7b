//! The scheduler: inputs in order, at most `jobs` runs at once, each line of
//! the output written as its run finishes.
//!
//! It knows nothing of how an input runs: the caller's function turns a
//! [`Job`] into an [`OutputLine`]. The futures it returns run concurrently on
//! the calling task (a run is `!Send`), so they must make progress by
//! awaiting, as the Engine does.
//!
//! A cancel (Ctrl-C, `--fail-fast`'s first failure) stops starting inputs;
//! the runs in flight see the same token, end as cancelled, and are written.

use std::future::Future;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::inputs::{Input, Record, Records};
use crate::output::{OutputError, OutputLine, OutputWriter, Previous, RunOutcome};

/// One run to make: an input, which repetition, its seed, and the logged run
/// to resume when an earlier batch left it failed or cancelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub input: Input,
    /// `Some` only under `--repeat`.
    pub repeat: Option<u32>,
    pub seed: u64,
    pub resume_from: Option<String>,
}

/// How the batch runs.
#[derive(Debug, Clone)]
pub struct DrivePlan {
    /// Runs at once (at least 1).
    pub jobs: usize,
    /// Stop at the first failure (the runs in flight are cancelled).
    pub fail_fast: bool,
    /// Only the first this-many inputs.
    pub limit: Option<u64>,
    /// Each input this many times (at least 1); `repeat` fields only when > 1.
    pub repeat: u32,
    /// The batch seed every run's seed derives from.
    pub seed: u64,
}

/// What a batch did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub completed: u64,
    pub failed: u64,
    pub cancelled: u64,
    /// Bad input lines left out (`--skip-bad`).
    pub skipped: u64,
    /// Runs a completed line in the earlier output covered (`--resume`).
    pub already_done: u64,
    /// Runs never started (a cancel, `--fail-fast`).
    pub not_started: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub elapsed: Duration,
}

impl Summary {
    /// Every run the batch asked for completed (now or before).
    pub fn all_completed(&self) -> bool {
        self.failed == 0 && self.cancelled == 0 && self.skipped == 0 && self.not_started == 0
    }

    /// Runs finished per second (this invocation's).
    pub fn rate(&self) -> f64 {
        let finished = (self.completed + self.failed + self.cancelled) as f64;
        let seconds = self.elapsed.as_secs_f64();
        if seconds > 0.0 {
            finished / seconds
        } else {
            0.0
        }
    }

    /// The one summary line.
    pub fn line(&self) -> String {
        let mut text = format!(
            "batch: {} completed, {} failed, {} cancelled",
            self.completed, self.failed, self.cancelled
        );
        if self.skipped > 0 {
            text.push_str(&format!(", {} bad lines skipped", self.skipped));
        }
        if self.not_started > 0 {
            text.push_str(&format!(", {} not started", self.not_started));
        }
        if self.already_done > 0 {
            text.push_str(&format!(", {} already done", self.already_done));
        }
        text.push_str(&format!(
            "; {:.1} runs/s over {:.1} s; tokens {} in, {} out",
            self.rate(),
            self.elapsed.as_secs_f64(),
            self.input_tokens,
            self.output_tokens
        ));
        text
    }
}

/// A run's seed: the batch seed mixed with the input's index and
/// repetition (SplitMix64's finalizer), so a batch repeats exactly and
/// neighbouring inputs get unrelated seeds.
pub fn derive_seed(batch_seed: u64, index: u64, repeat: u32) -> u64 {
    let mut z = batch_seed
        .wrapping_add(index.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(u64::from(repeat).wrapping_mul(0xD1B5_4A32_D192_ED03));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Why a batch stopped before its inputs were done.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error("cannot read the inputs: {0}")]
    Input(#[from] std::io::Error),
}

/// The jobs of a batch in order, less those done before.
struct JobQueue<'a> {
    records: Records<'a>,
    previous: &'a Previous,
    plan: &'a DrivePlan,
    current: Option<Input>,
    next_repeat: u32,
    taken_inputs: u64,
    skipped: u64,
    already_done: u64,
}

impl JobQueue<'_> {
    fn next_job(&mut self) -> Result<Option<Job>, std::io::Error> {
        loop {
            if let Some(input) = &self.current {
                if self.next_repeat < self.plan.repeat {
                    let repeat = self.next_repeat;
                    self.next_repeat += 1;
                    let key = (input.index, repeat);
                    if self.previous.completed.contains(&key) {
                        self.already_done += 1;
                        continue;
                    }
                    return Ok(Some(Job {
                        input: input.clone(),
                        repeat: (self.plan.repeat > 1).then_some(repeat),
                        seed: derive_seed(self.plan.seed, input.index, repeat),
                        resume_from: self.previous.unfinished.get(&key).cloned(),
                    }));
                }
                self.current = None;
            }
            if self
                .plan
                .limit
                .is_some_and(|limit| self.taken_inputs >= limit)
            {
                return Ok(None);
            }
            match self.records.next() {
                None => return Ok(None),
                Some(record) => {
                    self.taken_inputs += 1;
                    match record? {
                        Record::Input(input) => {
                            self.current = Some(input);
                            self.next_repeat = 0;
                        }
                        Record::Bad(_) => self.skipped += u64::from(self.plan.repeat),
                    }
                }
            }
        }
    }

    /// Count what is left without starting it.
    fn count_rest(&mut self) -> Result<u64, std::io::Error> {
        let mut rest = 0;
        while self.next_job()?.is_some() {
            rest += 1;
        }
        Ok(rest)
    }
}

/// The executor every command that runs many prompts in one process shares
/// (`batch`'s inputs, `test`'s cells): take jobs from `next_job` while fewer
/// than `limit` run and `cancel` is not tripped, start each with `start`
/// (handing it a child of `cancel`), and pass each result to `finished` as it
/// comes. The futures run concurrently on the calling task, so they need not
/// be `Send` (a run is not); per-model limits are kept where every request
/// of the process passes (the model gate), not here. Returns when every
/// started job has finished.
pub async fn execute<J, F, Fut>(
    limit: usize,
    cancel: &CancellationToken,
    mut next_job: impl FnMut() -> Option<J>,
    mut start: F,
    mut finished: impl FnMut(Fut::Output),
) where
    F: FnMut(J, CancellationToken) -> Fut,
    Fut: Future,
{
    let limit = limit.max(1);
    let mut running = FuturesUnordered::new();
    let mut exhausted = false;
    loop {
        while !exhausted && !cancel.is_cancelled() && running.len() < limit {
            match next_job() {
                Some(job) => running.push(start(job, cancel.child_token())),
                None => exhausted = true,
            }
        }
        let Some(output) = running.next().await else {
            break;
        };
        finished(output);
    }
}

/// Run every job of `records` not done in `previous`, at most `plan.jobs` at
/// once ([`execute`]), writing each finished run's line to `writer` (and
/// handing it to `on_line`, for progress). Returns when every started run
/// has been written.
pub async fn drive<F, Fut>(
    records: Records<'_>,
    previous: &Previous,
    plan: &DrivePlan,
    writer: &mut OutputWriter,
    cancel: &CancellationToken,
    run: F,
    mut on_line: impl FnMut(&OutputLine),
) -> Result<Summary, DriveError>
where
    F: FnMut(Job, CancellationToken) -> Fut,
    Fut: Future<Output = OutputLine>,
{
    let began = Instant::now();
    let mut queue = JobQueue {
        records,
        previous,
        plan,
        current: None,
        next_repeat: 0,
        taken_inputs: 0,
        skipped: 0,
        already_done: 0,
    };
    let mut summary = Summary::default();
    let mut exhausted = false;
    let mut input_failure: Option<DriveError> = None;
    let mut output_failure: Option<DriveError> = None;
    execute(
        plan.jobs,
        cancel,
        || match queue.next_job() {
            Ok(Some(job)) => Some(job),
            Ok(None) => {
                exhausted = true;
                None
            }
            Err(error) => {
                // The inputs broke off: finish what runs, start nothing more.
                input_failure = Some(error.into());
                exhausted = true;
                cancel.cancel();
                None
            }
        },
        run,
        |line: OutputLine| {
            match line.outcome {
                RunOutcome::Completed => summary.completed += 1,
                RunOutcome::Failed => summary.failed += 1,
                RunOutcome::Cancelled => summary.cancelled += 1,
            }
            if let Some(usage) = line.usage {
                summary.input_tokens += usage.input_tokens;
                summary.output_tokens += usage.output_tokens;
            }
            if let Err(error) = writer.write(&line) {
                // Nothing more can be recorded: stop, and let the runs in flight end.
                output_failure.get_or_insert(error.into());
                cancel.cancel();
            }
            on_line(&line);
            if plan.fail_fast && line.outcome == RunOutcome::Failed {
                cancel.cancel();
            }
        },
    )
    .await;
    if !exhausted || cancel.is_cancelled() {
        summary.not_started = queue.count_rest().unwrap_or(0);
    }
    summary.skipped = queue.skipped;
    summary.already_done = queue.already_done;
    summary.elapsed = began.elapsed();
    writer.sync()?;
    match input_failure.or(output_failure) {
        Some(error) => Err(error),
        None => Ok(summary),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::{InputSource, Inputs};
    use crate::output::{OutputFormat, TokenUsage};
    use std::cell::Cell;
    use std::rc::Rc;

    fn line_for(job: &Job, outcome: RunOutcome) -> OutputLine {
        OutputLine {
            index: job.input.index,
            repeat: job.repeat,
            batch: None,
            execution: format!("run-{}-{:?}", job.input.index, job.repeat),
            seed: job.seed,
            outcome,
            result: None,
            error: None,
            usage: Some(TokenUsage {
                input_tokens: 1,
                output_tokens: 2,
            }),
            duration_ms: 1,
            output: None,
        }
    }

    fn inputs(dir: &std::path::Path, lines: usize) -> Inputs {
        let path = dir.join("in.jsonl");
        let text: String = (0..lines).map(|i| format!("\"input {i}\"\n")).collect();
        std::fs::write(&path, text).unwrap();
        Inputs::open(InputSource::File(path), None).unwrap()
    }

    fn plan(jobs: usize) -> DrivePlan {
        DrivePlan {
            jobs,
            fail_fast: false,
            limit: None,
            repeat: 1,
            seed: 7,
        }
    }

    #[tokio::test]
    async fn at_most_jobs_run_at_once_and_every_line_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let inputs = inputs(dir.path(), 50);
        let out = dir.path().join("out.jsonl");
        let (mut writer, previous) = OutputWriter::open(&out, OutputFormat::Jsonl, false).unwrap();
        let live = Rc::new(Cell::new(0usize));
        let peak = Rc::new(Cell::new(0usize));
        let summary = drive(
            inputs.records().unwrap(),
            &previous,
            &plan(4),
            &mut writer,
            &CancellationToken::new(),
            |job, _| {
                let (live, peak) = (Rc::clone(&live), Rc::clone(&peak));
                async move {
                    live.set(live.get() + 1);
                    peak.set(peak.get().max(live.get()));
                    tokio::time::sleep(Duration::from_millis(1 + job.input.index % 3)).await;
                    live.set(live.get() - 1);
                    line_for(&job, RunOutcome::Completed)
                }
            },
            |_| {},
        )
        .await
        .unwrap();
        assert_eq!(peak.get(), 4);
        assert_eq!(summary.completed, 50);
        assert!(summary.all_completed());
        assert_eq!(summary.output_tokens, 100);
        let written = std::fs::read_to_string(&out).unwrap();
        assert_eq!(written.lines().count(), 50);
    }

    #[tokio::test]
    async fn execute_starts_nothing_after_a_cancel_and_waits_for_what_runs() {
        let cancel = CancellationToken::new();
        let mut jobs = 0..100u32;
        let mut finished = Vec::new();
        let started = Rc::new(Cell::new(0u32));
        execute(
            3,
            &cancel,
            || jobs.next(),
            |job, token| {
                let (started, cancel) = (Rc::clone(&started), cancel.clone());
                async move {
                    started.set(started.get() + 1);
                    if job == 4 {
                        cancel.cancel();
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    (job, token.is_cancelled())
                }
            },
            |out| finished.push(out),
        )
        .await;
        // Jobs 0-2 start, then each finish starts one more until job 4
        // cancels: 3 in flight at most, none after the cancel.
        assert!(started.get() <= 7, "started {}", started.get());
        assert_eq!(
            finished.len() as u32,
            started.get(),
            "every started job finished"
        );
        assert!(finished
            .iter()
            .any(|(job, cancelled)| *job == 4 && *cancelled));
    }

    #[tokio::test]
    async fn resume_skips_completed_and_passes_the_run_to_resume() {
        let dir = tempfile::tempdir().unwrap();
        let inputs = inputs(dir.path(), 6);
        let out = dir.path().join("out.jsonl");
        let (mut writer, previous) = OutputWriter::open(&out, OutputFormat::Jsonl, false).unwrap();
        // First pass: odd inputs fail.
        drive(
            inputs.records().unwrap(),
            &previous,
            &plan(2),
            &mut writer,
            &CancellationToken::new(),
            |job, _| async move {
                let outcome = if job.input.index % 2 == 1 {
                    RunOutcome::Failed
                } else {
                    RunOutcome::Completed
                };
                line_for(&job, outcome)
            },
            |_| {},
        )
        .await
        .unwrap();
        drop(writer);
        let (mut writer, previous) = OutputWriter::open(&out, OutputFormat::Jsonl, true).unwrap();
        let mut seen = Vec::new();
        let summary = drive(
            inputs.records().unwrap(),
            &previous,
            &plan(2),
            &mut writer,
            &CancellationToken::new(),
            |job, _| {
                seen.push((job.input.index, job.resume_from.clone()));
                async move { line_for(&job, RunOutcome::Completed) }
            },
            |_| {},
        )
        .await
        .unwrap();
        seen.sort();
        assert_eq!(
            seen,
            vec![
                (1, Some("run-1-None".to_string())),
                (3, Some("run-3-None".to_string())),
                (5, Some("run-5-None".to_string()))
            ]
        );
        assert_eq!(summary.already_done, 3);
        assert!(summary.all_completed());
    }

    #[tokio::test]
    async fn fail_fast_cancels_the_rest_and_repeat_and_limit_shape_the_jobs() {
        let dir = tempfile::tempdir().unwrap();
        let inputs = inputs(dir.path(), 10);
        let out = dir.path().join("out.jsonl");
        let (mut writer, previous) = OutputWriter::open(&out, OutputFormat::Jsonl, false).unwrap();
        let mut plan = plan(1);
        plan.fail_fast = true;
        let summary = drive(
            inputs.records().unwrap(),
            &previous,
            &plan,
            &mut writer,
            &CancellationToken::new(),
            |job, _| async move {
                let outcome = if job.input.index == 2 {
                    RunOutcome::Failed
                } else {
                    RunOutcome::Completed
                };
                line_for(&job, outcome)
            },
            |_| {},
        )
        .await
        .unwrap();
        assert_eq!((summary.completed, summary.failed), (2, 1));
        assert_eq!(summary.not_started, 7);
        assert!(!summary.all_completed());

        let out = dir.path().join("out2.jsonl");
        let (mut writer, previous) = OutputWriter::open(&out, OutputFormat::Jsonl, false).unwrap();
        let plan = DrivePlan {
            jobs: 3,
            fail_fast: false,
            limit: Some(4),
            repeat: 3,
            seed: 11,
        };
        let mut seeds = Vec::new();
        let summary = drive(
            inputs.records().unwrap(),
            &previous,
            &plan,
            &mut writer,
            &CancellationToken::new(),
            |job, _| {
                seeds.push(job.seed);
                async move { line_for(&job, RunOutcome::Completed) }
            },
            |_| {},
        )
        .await
        .unwrap();
        assert_eq!(summary.completed, 12);
        seeds.sort_unstable();
        seeds.dedup();
        assert_eq!(seeds.len(), 12, "every run gets its own seed");
        assert_eq!(derive_seed(11, 3, 2), derive_seed(11, 3, 2));
    }
}
