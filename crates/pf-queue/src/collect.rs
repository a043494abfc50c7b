//! The batch's side of the queue: publish each job's request, and hand the
//! job its result when a worker stores it. A reader follows the batch's
//! results subject from its first message, so results stored while no batch
//! process was listening (a `--resume` after a crash) are found too, and the
//! first result for an input is the one that counts: later copies (a
//! duplicate delivery answered from the log) are dropped.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::consumer::{pull::OrderedConfig, DeliverPolicy};
use async_nats::jetstream::stream::Stream;
use futures::StreamExt;
use pf_batch::{ItemKey, OutputLine};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::error::QueueError;
use crate::message::{subject_safe, RunRequest, RunResult};
use crate::queue::{results_subject, runs_subject, Queue};

/// How long publishing a request may wait for NATS (a restart) before the
/// batch gives up on the queue.
const PUBLISH_GIVE_UP: Duration = Duration::from_secs(300);
/// How often the reader checks that it is not stalled behind stored results.
const WATCHDOG: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Routes {
    waiting: HashMap<ItemKey, oneshot::Sender<OutputLine>>,
    /// Results that came before their job asked (an earlier invocation's).
    early: HashMap<ItemKey, OutputLine>,
    answered: HashSet<ItemKey>,
}

/// Publishes a batch's requests and routes its results.
pub struct Collector {
    queue: Queue,
    batch: String,
    /// Tells this invocation's publications apart from an earlier one's, so a
    /// `--resume` republishes what JetStream would otherwise drop as a copy.
    nonce: String,
    routes: Arc<Mutex<Routes>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Collector {
    /// Start following `batch`'s results; returns once the results stored
    /// before now have been read.
    pub async fn open(queue: &Queue, batch: &str, nonce: &str) -> Result<Collector, QueueError> {
        if !subject_safe(batch) {
            return Err(QueueError::BadBatchId {
                id: batch.to_owned(),
            });
        }
        let subject = results_subject(batch);
        let last_stored = queue
            .results
            .get_last_raw_message_by_subject(&subject)
            .await
            .map(|m| m.sequence)
            .ok();
        let messages = follow(&queue.results, &subject, 1).await?;
        let routes = Arc::new(Mutex::new(Routes::default()));
        let (caught_up, mut ready) = watch::channel(last_stored.is_none());
        let into = Arc::clone(&routes);
        let results = queue.results.clone();
        let reader = tokio::spawn(async move {
            read_results(results, subject, messages, last_stored, caught_up, into).await;
        });
        let _ = ready.wait_for(|caught| *caught).await;
        Ok(Collector {
            queue: queue.clone(),
            batch: batch.to_owned(),
            nonce: nonce.to_owned(),
            routes,
            reader,
        })
    }

    /// Results stored before any job asked (an earlier invocation's).
    pub fn stored_before(&self) -> usize {
        self.routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .early
            .len()
    }

    /// Publish `request` (unless its result is stored already) and wait for
    /// its result; `None` when `cancel` stops the wait (the request stays
    /// queued and its result is stored for a `--resume`).
    pub async fn submit(
        &self,
        request: &RunRequest,
        cancel: &CancellationToken,
    ) -> Result<Option<OutputLine>, QueueError> {
        let key = (request.index, request.repeat.unwrap_or(0));
        let (tell, told) = oneshot::channel();
        {
            let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(line) = routes.early.remove(&key) {
                routes.answered.insert(key);
                return Ok(Some(line));
            }
            routes.waiting.insert(key, tell);
        }
        let payload =
            serde_json::to_vec(request).map_err(|e| QueueError::nats("encode a request", e))?;
        let msg_id = format!(
            "{}.{}.{}.{}",
            self.batch,
            request.index,
            request.repeat.unwrap_or(0),
            self.nonce
        );
        let publish = self.queue.publish_stored(
            runs_subject(&self.batch),
            Some(msg_id),
            payload.into(),
            PUBLISH_GIVE_UP,
        );
        tokio::select! {
            published = publish => { published?; }
            () = cancel.cancelled() => return Ok(None),
        }
        tokio::select! {
            line = told => Ok(line.ok()),
            () = cancel.cancelled() => Ok(None),
        }
    }
}

type Results = async_nats::jetstream::consumer::pull::Ordered;

/// An ordered consumer of `subject`'s results from stream sequence `from`.
async fn follow(stream: &Stream, subject: &str, from: u64) -> Result<Results, QueueError> {
    let consumer = stream
        .create_consumer(OrderedConfig {
            filter_subject: subject.to_owned(),
            deliver_policy: if from <= 1 {
                DeliverPolicy::All
            } else {
                DeliverPolicy::ByStartSequence {
                    start_sequence: from,
                }
            },
            ..Default::default()
        })
        .await
        .map_err(|e| QueueError::nats("follow the results", e))?;
    consumer
        .messages()
        .await
        .map_err(|e| QueueError::nats("follow the results", e))
}

/// Route every result of the batch, in stream order, each once. The client
/// follows a server restart by itself, but can go quiet for a long while
/// after one: a watchdog compares what was read with what the stream holds
/// and, when results wait unread, follows again from the first unread one.
async fn read_results(
    stream: Stream,
    subject: String,
    mut messages: Results,
    last_stored: Option<u64>,
    caught_up: watch::Sender<bool>,
    routes: Arc<Mutex<Routes>>,
) {
    let mut last_read = 0u64;
    let mut read_at_check = 0u64;
    let mut check = tokio::time::interval(WATCHDOG);
    loop {
        tokio::select! {
            item = messages.next() => match item {
                Some(Ok(message)) => {
                    let sequence = message.info().map(|i| i.stream_sequence).unwrap_or(0);
                    if sequence != 0 && sequence <= last_read {
                        continue;
                    }
                    last_read = last_read.max(sequence);
                    match serde_json::from_slice::<RunResult>(&message.payload) {
                        Ok(result) => route(&routes, result.line),
                        Err(e) => tracing::warn!("a result that does not read: {e}"),
                    }
                    if last_stored.is_some_and(|last| sequence >= last) {
                        let _ = caught_up.send(true);
                    }
                }
                Some(Err(e)) => tracing::debug!("results: {e}"),
                None => {
                    if let Ok(again) = follow(&stream, &subject, last_read + 1).await {
                        messages = again;
                    } else {
                        tokio::time::sleep(WATCHDOG).await;
                    }
                }
            },
            _ = check.tick() => {
                if last_read == read_at_check {
                    let newest = stream
                        .get_last_raw_message_by_subject(&subject)
                        .await
                        .map(|m| m.sequence)
                        .unwrap_or(0);
                    if newest > last_read {
                        tracing::debug!("results stalled at {last_read} of {newest}; following again");
                        if let Ok(again) = follow(&stream, &subject, last_read + 1).await {
                            messages = again;
                        }
                    }
                }
                read_at_check = last_read;
            }
        }
    }
}

fn route(routes: &Mutex<Routes>, line: OutputLine) {
    let key = line.key();
    let mut routes = routes.lock().unwrap_or_else(PoisonError::into_inner);
    if routes.answered.contains(&key) || routes.early.contains_key(&key) {
        return;
    }
    match routes.waiting.remove(&key) {
        Some(tell) => {
            routes.answered.insert(key);
            let _ = tell.send(line);
        }
        None => {
            routes.early.insert(key, line);
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.reader.abort();
    }
}
