//! What can go wrong talking to NATS.

/// A failure of the queue itself (not of a run: runs end in results).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("--queue {url}: not a NATS address (expected nats://HOST:PORT)")]
    BadUrl { url: String },
    #[error("cannot connect to NATS at {url}: {cause}")]
    Connect { url: String, cause: String },
    #[error("NATS at {url}: JetStream is not available ({cause}); start nats-server with -js")]
    JetStream { url: String, cause: String },
    #[error("NATS: {what}: {cause}")]
    Nats { what: &'static str, cause: String },
    #[error("batch id {id:?} cannot name a NATS subject: use letters, digits, '-' and '_'")]
    BadBatchId { id: String },
}

impl QueueError {
    pub(crate) fn nats(what: &'static str, cause: impl std::fmt::Display) -> QueueError {
        QueueError::Nats {
            what,
            cause: cause.to_string(),
        }
    }
}
