//! The connection and what it needs on the server: a work-queue stream of run
//! requests, the workers' one durable pull consumer on it, and a stream of
//! results. Every process ensures them (create if missing), so it does not
//! matter whether a worker or a batch comes first.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use async_nats::HeaderMap;
use bytes::Bytes;

use crate::error::QueueError;
use crate::message::{subject_safe, RunResult};

/// The stream holding run requests until a worker acknowledges them.
pub const RUNS_STREAM: &str = "PROMPTFORGE_RUNS";
/// The stream holding results, which `batch --queue` reads (and re-reads on
/// `--resume`) per batch subject.
pub const RESULTS_STREAM: &str = "PROMPTFORGE_RESULTS";
/// The workers' durable pull consumer: every worker pulls from this one.
pub const WORKERS_CONSUMER: &str = "promptforge-workers";
const RUNS_PREFIX: &str = "promptforge.run";
const RESULTS_PREFIX: &str = "promptforge.result";
/// How long the results stream keeps a batch's results.
const RESULTS_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long JetStream remembers a request's id to drop a republished copy.
const DEDUPE_WINDOW: Duration = Duration::from_secs(120);

/// The consumer's settings, which the first process to create it fixes and a
/// worker given explicit values updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSettings {
    /// Deliveries of one request before it becomes a failed result.
    pub max_deliver: i64,
    /// How long a delivery may go unacknowledged (and unextended) before
    /// JetStream gives it to another worker.
    pub ack_wait: Duration,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            max_deliver: 5,
            ack_wait: Duration::from_secs(30),
        }
    }
}

/// A connection to NATS with JetStream, its streams ensured.
#[derive(Clone)]
pub struct Queue {
    pub(crate) url: String,
    pub(crate) client: async_nats::Client,
    pub(crate) js: jetstream::Context,
    pub(crate) runs: stream::Stream,
    pub(crate) results: stream::Stream,
}

/// The subject a batch's requests are published on.
pub fn runs_subject(batch: &str) -> String {
    format!("{RUNS_PREFIX}.{batch}")
}

/// The subject a batch's results are published on.
pub fn results_subject(batch: &str) -> String {
    format!("{RESULTS_PREFIX}.{batch}")
}

impl Queue {
    /// Connect to `url` (`nats://HOST:PORT`) and ensure both streams. The
    /// client reconnects by itself for as long as the process lives.
    pub async fn connect(url: &str, name: &str) -> Result<Queue, QueueError> {
        if !(url.starts_with("nats://") || url.starts_with("tls://")) {
            return Err(QueueError::BadUrl {
                url: url.to_owned(),
            });
        }
        let client = async_nats::ConnectOptions::new()
            .name(name)
            .connection_timeout(Duration::from_secs(5))
            .max_reconnects(None)
            .connect(url)
            .await
            .map_err(|e| QueueError::Connect {
                url: url.to_owned(),
                cause: e.to_string(),
            })?;
        let js = jetstream::new(client.clone());
        let jetstream_error = |e: &dyn std::fmt::Display| QueueError::JetStream {
            url: url.to_owned(),
            cause: e.to_string(),
        };
        let runs = js
            .get_or_create_stream(stream::Config {
                name: RUNS_STREAM.to_owned(),
                subjects: vec![format!("{RUNS_PREFIX}.>")],
                retention: stream::RetentionPolicy::WorkQueue,
                storage: stream::StorageType::File,
                duplicate_window: DEDUPE_WINDOW,
                ..Default::default()
            })
            .await
            .map_err(|e| jetstream_error(&e))?;
        let results = js
            .get_or_create_stream(stream::Config {
                name: RESULTS_STREAM.to_owned(),
                subjects: vec![format!("{RESULTS_PREFIX}.>")],
                retention: stream::RetentionPolicy::Limits,
                storage: stream::StorageType::File,
                max_age: RESULTS_KEPT,
                duplicate_window: DEDUPE_WINDOW,
                ..Default::default()
            })
            .await
            .map_err(|e| jetstream_error(&e))?;
        Ok(Queue {
            url: url.to_owned(),
            client,
            js,
            runs,
            results,
        })
    }

    /// The server's address as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The workers' consumer: created with `settings` if missing, updated to
    /// them when `update` (a worker given explicit values).
    pub(crate) async fn workers_consumer(
        &self,
        settings: QueueSettings,
        update: bool,
    ) -> Result<consumer::PullConsumer, QueueError> {
        let config = consumer::pull::Config {
            durable_name: Some(WORKERS_CONSUMER.to_owned()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: settings.ack_wait,
            max_deliver: settings.max_deliver,
            filter_subject: format!("{RUNS_PREFIX}.>"),
            ..Default::default()
        };
        if update {
            if let Ok(consumer) = self.runs.create_consumer(config.clone()).await {
                return Ok(consumer);
            }
            // An older server refuses to change a durable's settings by
            // creating it again: say so once, and use it as it is.
            tracing::warn!(
                "NATS kept the workers' consumer's existing settings (max_deliver, ack_wait)"
            );
        }
        self.runs
            .get_or_create_consumer(WORKERS_CONSUMER, config)
            .await
            .map_err(|e| QueueError::nats("the workers' consumer", e))
    }

    /// The consumer's settings as the server holds them.
    pub async fn consumer_settings(&self) -> Result<QueueSettings, QueueError> {
        let mut consumer: consumer::PullConsumer =
            self.runs
                .get_consumer(WORKERS_CONSUMER)
                .await
                .map_err(|e| QueueError::nats("the workers' consumer", e))?;
        let info = consumer
            .info()
            .await
            .map_err(|e| QueueError::nats("the workers' consumer", e))?;
        Ok(QueueSettings {
            max_deliver: info.config.max_deliver,
            ack_wait: info.config.ack_wait,
        })
    }

    /// Publish `payload` on `subject` and wait for JetStream to store it,
    /// retrying while the server is away (a restart), until `give_up` passes.
    pub(crate) async fn publish_stored(
        &self,
        subject: String,
        msg_id: Option<String>,
        payload: Bytes,
        give_up: Duration,
    ) -> Result<u64, QueueError> {
        let deadline = tokio::time::Instant::now() + give_up;
        let mut pause = Duration::from_millis(50);
        loop {
            let mut headers = HeaderMap::new();
            if let Some(id) = &msg_id {
                headers.insert("Nats-Msg-Id", id.as_str());
            }
            let attempt = async {
                self.js
                    .publish_with_headers(subject.clone(), headers, payload.clone())
                    .await
                    .map_err(|e| e.to_string())?
                    .await
                    .map_err(|e| e.to_string())
            };
            match attempt.await {
                Ok(ack) => return Ok(ack.sequence),
                Err(cause) if tokio::time::Instant::now() + pause < deadline => {
                    tracing::debug!("publish to {subject} failed ({cause}); retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(cause) => return Err(QueueError::nats("publish", cause)),
            }
        }
    }

    /// Store `result` on its batch's results subject (retrying through a
    /// server restart for up to `give_up`).
    pub async fn publish_result(
        &self,
        result: &RunResult,
        give_up: Duration,
    ) -> Result<(), QueueError> {
        let batch = result.line.batch.clone().unwrap_or_default();
        if !subject_safe(&batch) {
            return Err(QueueError::BadBatchId { id: batch });
        }
        let payload =
            serde_json::to_vec(result).map_err(|e| QueueError::nats("encode a result", e))?;
        self.publish_stored(results_subject(&batch), None, payload.into(), give_up)
            .await
            .map(|_| ())
    }
}
