//! The worker loop: pull at most as many requests as there are free slots,
//! run each through the caller's function, keep its delivery alive while it
//! runs, store its result, then acknowledge it.
//!
//! What keeps a result exactly once: a request is acknowledged only after
//! its result is stored, and before a request runs the [`Ledger`] (the run
//! log) is asked whether its run completed already (then the logged result
//! is published again and the request acknowledged, nothing run) or began
//! on a worker that was lost (then that run is resumed, its logged model
//! answers reused).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use futures::future::LocalBoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use pf_batch::{OutputLine, RunOutcome};
use serde::Deserialize;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::error::QueueError;
use crate::message::{Decoded, RunRequest, RunResult, REQUEST_VERSION};
use crate::queue::{Queue, QueueSettings, RUNS_STREAM, WORKERS_CONSUMER};

/// The error kind of a failed result the queue made, not a run.
pub const QUEUE_FAILURE_KIND: &str = "Queue";
/// How long a worker keeps trying to store a result while NATS is away.
const RESULT_GIVE_UP: Duration = Duration::from_secs(300);
/// How long one pull request waits for messages.
const PULL_EXPIRES: Duration = Duration::from_secs(2);
/// How long a stopping worker waits for NATS to take its last hand-backs and
/// flush: a server that is gone redelivers those requests after their ack
/// deadline anyway, and a worker told to stop must not wait for it forever.
const STOP_GIVE_UP: Duration = Duration::from_secs(5);
/// How long past its expiry a pull request's batch is waited for.
const PULL_SLACK: Duration = Duration::from_millis(500);

/// What the run log says of a request's input: the worker's one question to
/// the log, so the log's backend can change behind it.
#[derive(Debug, Clone, PartialEq)]
pub enum Logged {
    /// Its run completed: the line to answer with, nothing run.
    Completed(OutputLine),
    /// A run of it began and did not complete (a lost worker's): resume it.
    Unfinished { execution: String },
    /// No run of it is logged.
    Absent,
}

/// The worker's view of the run log.
pub trait Ledger {
    /// What the log holds for `request`'s input.
    fn lookup(&self, request: &RunRequest) -> Logged;
    /// The execution id a run with `seed` is logged under.
    fn execution(&self, seed: u64) -> String;
}

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerPlan {
    /// Runs at once.
    pub jobs: usize,
    /// This worker's name in results and NATS.
    pub name: String,
    pub settings: QueueSettings,
    /// The settings were given explicitly: update the consumer to them.
    pub update_settings: bool,
}

/// What a worker did before it stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerSummary {
    pub completed: u64,
    pub failed: u64,
    pub cancelled: u64,
    /// Runs resumed from a lost worker's logged run.
    pub resumed: u64,
    /// Deliveries of finished inputs, acknowledged without running.
    pub duplicates: u64,
    /// Runs stopped by the worker's own stop, handed back (nak).
    pub handed_back: u64,
    /// Requests that ran out of deliveries, answered as failed.
    pub exhausted: u64,
}

impl WorkerSummary {
    pub fn line(&self) -> String {
        format!(
            "worker: {} completed, {} failed, {} cancelled, {} resumed, {} duplicates acknowledged, \
             {} handed back, {} out of deliveries",
            self.completed,
            self.failed,
            self.cancelled,
            self.resumed,
            self.duplicates,
            self.handed_back,
            self.exhausted
        )
    }
}

/// What one delivery came to.
enum Handled {
    Ran {
        outcome: RunOutcome,
        resumed: bool,
    },
    Duplicate,
    HandedBack,
    Refused,
    /// Could not be finished here (no result stored): left to redelivery.
    Left,
}

/// A delivery the puller took, with the slot it holds.
type Delivery = (jetstream::Message, OwnedSemaphorePermit);

/// Pull and run requests until `stop` is cancelled (then: pull no more,
/// cancel the runs in flight and hand each back with a nak, so another
/// worker resumes it from the log). `run` runs one request (resuming the
/// execution it is given, if any) and returns its OUT line.
pub async fn serve<L, F, Fut>(
    queue: &Queue,
    plan: &WorkerPlan,
    ledger: &L,
    mut run: F,
    stop: &CancellationToken,
) -> Result<WorkerSummary, QueueError>
where
    L: Ledger,
    F: FnMut(RunRequest, Option<String>, CancellationToken) -> Fut,
    Fut: Future<Output = OutputLine>,
{
    let consumer = queue
        .workers_consumer(plan.settings, plan.update_settings)
        .await?;
    let settings = queue.consumer_settings().await.unwrap_or(plan.settings);
    let jobs = plan.jobs.max(1);
    let slots = Arc::new(Semaphore::new(jobs));
    let (deliveries, mut delivered) = mpsc::channel::<Delivery>(jobs);
    let puller = tokio::spawn(pull(consumer, Arc::clone(&slots), deliveries));
    let mut exhausted = queue
        .client
        .queue_subscribe(
            format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{RUNS_STREAM}.{WORKERS_CONSUMER}"),
            "promptforge-exhausted".to_owned(),
        )
        .await
        .map_err(|e| QueueError::nats("subscribe to max_deliver advisories", e))?;
    let mut summary = WorkerSummary::default();
    let mut running = FuturesUnordered::new();
    let mut stopping = false;
    loop {
        tokio::select! {
            Some((message, slot)) = delivered.recv(), if !stopping => {
                let task: LocalBoxFuture<'_, Handled> = match prepare(&plan.name, ledger, &message) {
                    Prepared::Answer(result, done) => Box::pin(async move {
                        let _slot = slot;
                        store_then_ack(queue, &message, &result, done).await
                    }),
                    Prepared::Garbage => Box::pin(async move {
                        let _slot = slot;
                        let _ = message.ack_with(AckKind::Term).await;
                        Handled::Refused
                    }),
                    Prepared::Run { request, resume_from, resumed } => {
                        let runs = run(*request, resume_from, stop.child_token());
                        Box::pin(supervise(queue, &plan.name, settings, message, slot, runs, stop, resumed))
                    }
                };
                running.push(task);
            }
            Some(done) = running.next(), if !running.is_empty() => tally(&mut summary, done),
            Some(advisory) = exhausted.next() => {
                if give_up(queue, &plan.name, settings, ledger, &advisory.payload).await {
                    summary.exhausted += 1;
                }
            }
            () = stop.cancelled(), if !stopping => {
                stopping = true;
                puller.abort();
                // Taken but not started: hand back at once.
                delivered.close();
                let give_up = tokio::time::Instant::now() + STOP_GIVE_UP;
                while let Some((message, _slot)) = delivered.recv().await {
                    let _ = tokio::time::timeout_at(give_up, message.ack_with(AckKind::Nak(None))).await;
                    summary.handed_back += 1;
                }
            }
        }
        if stopping && running.is_empty() {
            break;
        }
    }
    let _ = tokio::time::timeout(STOP_GIVE_UP, queue.client.flush()).await;
    Ok(summary)
}

fn tally(summary: &mut WorkerSummary, done: Handled) {
    match done {
        Handled::Ran { outcome, resumed } => {
            match outcome {
                RunOutcome::Completed => summary.completed += 1,
                RunOutcome::Failed => summary.failed += 1,
                RunOutcome::Cancelled => summary.cancelled += 1,
            }
            summary.resumed += u64::from(resumed);
        }
        Handled::Duplicate => summary.duplicates += 1,
        Handled::HandedBack => summary.handed_back += 1,
        Handled::Refused => summary.failed += 1,
        Handled::Left => {}
    }
}

/// Ask for as many messages as there are free slots, hand each on with its
/// slot; keep asking through errors (a NATS restart) until aborted.
async fn pull(
    consumer: jetstream::consumer::PullConsumer,
    slots: Arc<Semaphore>,
    deliveries: mpsc::Sender<Delivery>,
) {
    loop {
        let Ok(first) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let mut held = vec![first];
        while let Ok(more) = Arc::clone(&slots).try_acquire_owned() {
            held.push(more);
        }
        let batch = consumer
            .batch()
            .max_messages(held.len())
            .expires(PULL_EXPIRES)
            .messages()
            .await;
        let mut batch = match batch {
            Ok(batch) => batch,
            Err(e) => {
                tracing::debug!("pull request failed ({e}); retrying");
                drop(held);
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        // A pull request the server lost (a restart) never ends its batch:
        // stop waiting when it should have expired, and ask again.
        let deadline = tokio::time::Instant::now() + PULL_EXPIRES + PULL_SLACK;
        while let Ok(Some(item)) = tokio::time::timeout_at(deadline, batch.next()).await {
            match item {
                Ok(message) => {
                    let Some(slot) = held.pop() else { break };
                    if deliveries.send((message, slot)).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::debug!("pull interrupted ({e})");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    break;
                }
            }
        }
    }
}

/// What a delivery needs, decided before anything runs.
enum Prepared {
    /// Answered without running (a refused request, a finished input).
    Answer(Box<RunResult>, Handled),
    /// Not a request: terminated.
    Garbage,
    Run {
        request: Box<RunRequest>,
        resume_from: Option<String>,
        resumed: bool,
    },
}

fn prepare<L: Ledger>(worker: &str, ledger: &L, message: &jetstream::Message) -> Prepared {
    let request = match Decoded::from_bytes(&message.payload) {
        Decoded::Request(request) => request,
        Decoded::Refused { head, why } => {
            let result = RunResult::failed(
                worker,
                &head.batch,
                (head.index, head.repeat),
                head.seed,
                ledger.execution(head.seed),
                QUEUE_FAILURE_KIND,
                why,
            );
            return Prepared::Answer(Box::new(result), Handled::Refused);
        }
        Decoded::Garbage(why) => {
            tracing::warn!("{}: {why}; dropped", message.subject);
            return Prepared::Garbage;
        }
    };
    match ledger.lookup(&request) {
        Logged::Completed(line) => Prepared::Answer(
            Box::new(RunResult {
                version: REQUEST_VERSION,
                worker: worker.to_owned(),
                duplicate: true,
                line,
            }),
            Handled::Duplicate,
        ),
        Logged::Unfinished { execution } => Prepared::Run {
            request,
            resume_from: Some(execution),
            resumed: true,
        },
        Logged::Absent => {
            let resume_from = request.resume.clone();
            Prepared::Run {
                request,
                resume_from,
                resumed: false,
            }
        }
    }
}

/// Keep the delivery alive while its run runs, then store the result and
/// acknowledge (or, when our own stop cancelled the run, hand it back).
#[allow(clippy::too_many_arguments)]
async fn supervise(
    queue: &Queue,
    worker: &str,
    settings: QueueSettings,
    message: jetstream::Message,
    slot: OwnedSemaphorePermit,
    running: impl Future<Output = OutputLine>,
    stop: &CancellationToken,
    resumed: bool,
) -> Handled {
    let _slot = slot;
    tokio::pin!(running);
    // Extend the delivery's deadline well before it passes.
    let mut extend = tokio::time::interval(settings.ack_wait / 3);
    extend.tick().await;
    let line = loop {
        tokio::select! {
            line = &mut running => break line,
            _ = extend.tick() => {
                if let Err(e) = message.ack_with(AckKind::Progress).await {
                    tracing::debug!("cannot extend a delivery ({e})");
                }
            }
        }
    };
    if stop.is_cancelled() && line.outcome == RunOutcome::Cancelled {
        // Our own stop cancelled it: the log keeps what it did, and another
        // worker resumes it now rather than after the deadline.
        let _ = message.ack_with(AckKind::Nak(None)).await;
        return Handled::HandedBack;
    }
    let outcome = line.outcome;
    let result = RunResult {
        version: REQUEST_VERSION,
        worker: worker.to_owned(),
        duplicate: false,
        line,
    };
    store_then_ack(queue, &message, &result, Handled::Ran { outcome, resumed }).await
}

/// Store the result, then acknowledge the request: never the other way
/// round, so a worker lost between the two leaves a request that is
/// redelivered and answered from the log.
async fn store_then_ack(
    queue: &Queue,
    message: &jetstream::Message,
    result: &RunResult,
    done: Handled,
) -> Handled {
    if let Err(e) = queue.publish_result(result, RESULT_GIVE_UP).await {
        tracing::warn!(
            "input {} of {}: cannot store its result ({e}); left for redelivery",
            result.line.index,
            result.line.batch.as_deref().unwrap_or("?")
        );
        return Handled::Left;
    }
    if let Err(e) = message.double_ack().await {
        // Redelivered later and answered from the log.
        tracing::debug!("acknowledgement not confirmed ({e})");
    }
    done
}

/// JetStream's advisory that a request ran out of deliveries.
#[derive(Debug, Deserialize)]
struct MaxDeliveries {
    stream_seq: u64,
    deliveries: u64,
}

/// Turn a request that ran out of deliveries into a failed result naming
/// why, and take it off the work queue. Returns whether it did.
async fn give_up<L: Ledger>(
    queue: &Queue,
    worker: &str,
    settings: QueueSettings,
    ledger: &L,
    advisory: &[u8],
) -> bool {
    let Ok(advisory) = serde_json::from_slice::<MaxDeliveries>(advisory) else {
        return false;
    };
    let Ok(stored) = queue.runs.get_raw_message(advisory.stream_seq).await else {
        // Gone already (another process answered it).
        return false;
    };
    let head = match Decoded::from_bytes(&stored.payload) {
        Decoded::Request(r) => (r.batch.clone(), r.index, r.repeat, r.seed),
        Decoded::Refused { head, .. } => (head.batch, head.index, head.repeat, head.seed),
        Decoded::Garbage(_) => {
            let _ = queue.runs.delete_message(advisory.stream_seq).await;
            return false;
        }
    };
    let (batch, index, repeat, seed) = head;
    let execution = ledger.execution(seed);
    let why = format!(
        "gave up after {} deliveries (the consumer's max_deliver is {}): every worker that \
         took this input stopped before finishing it (killed, lost or shut down); its logged \
         run {execution}, if any, keeps what it did, and `batch --resume` runs it on",
        advisory.deliveries, settings.max_deliver
    );
    let result = RunResult::failed(
        worker,
        &batch,
        (index, repeat),
        seed,
        execution,
        QUEUE_FAILURE_KIND,
        why,
    );
    if queue.publish_result(&result, RESULT_GIVE_UP).await.is_err() {
        return false;
    }
    let _ = queue.runs.delete_message(advisory.stream_seq).await;
    true
}
