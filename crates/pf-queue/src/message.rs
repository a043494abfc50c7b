//! The messages on the queue: a self-contained run request and its result.
//!
//! A request carries everything a run needs but credentials and endpoints,
//! which come from the worker's own host file (its model named by catalog
//! id). Both messages carry a `version`; a worker refuses (as a failed
//! result) a request newer than it understands rather than guess.

use pf_batch::{OutputLine, RunError, RunOutcome};
use serde::{Deserialize, Serialize};

/// The request format this build writes and reads.
pub const REQUEST_VERSION: u32 = 1;

/// One input of a batch, to run on any worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRequest {
    pub version: u32,
    /// The batch id the run is logged under (`runs --batch ID`).
    pub batch: String,
    /// The input's place among the batch's inputs, from 0.
    pub index: u64,
    /// Which repetition (`--repeat`); absent without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat: Option<u32>,
    /// The prompt file's path as the batch named it (shown and logged only).
    pub prompt_path: String,
    /// The prompt file's whole text.
    pub prompt_text: String,
    /// The run's argument string, exactly as a local batch passes it.
    pub args: String,
    pub seed: u64,
    /// The batch's start instant (`sys.when`), milliseconds since the epoch.
    pub start_ms: i64,
    /// The model's catalog id in the worker's host file; `None`: its default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// An earlier run of this input to resume (`batch --resume`), by execution id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<String>,
    /// Log whole request and response bodies (`--capture`).
    #[serde(default)]
    pub capture: bool,
}

/// What every request has, read first so that even a request this worker
/// cannot use gets a result under its key.
#[derive(Debug, Clone, Deserialize)]
pub struct RequestHead {
    pub version: u32,
    pub batch: String,
    pub index: u64,
    #[serde(default)]
    pub repeat: Option<u32>,
    #[serde(default)]
    pub seed: u64,
}

/// A request read off the queue.
#[derive(Debug)]
pub enum Decoded {
    Request(Box<RunRequest>),
    /// Keyed but unusable: answered with a failed result naming why.
    Refused {
        head: RequestHead,
        why: String,
    },
    /// Not a request at all: nothing to answer; it is terminated.
    Garbage(String),
}

impl Decoded {
    pub fn from_bytes(payload: &[u8]) -> Decoded {
        let head: RequestHead = match serde_json::from_slice(payload) {
            Ok(head) => head,
            Err(e) => return Decoded::Garbage(format!("not a run request: {e}")),
        };
        if head.version > REQUEST_VERSION {
            let why = format!(
                "run request version {} is newer than this worker reads ({REQUEST_VERSION}); \
                 upgrade the worker",
                head.version
            );
            return Decoded::Refused { head, why };
        }
        match serde_json::from_slice::<RunRequest>(payload) {
            Ok(request) => Decoded::Request(Box::new(request)),
            Err(e) => Decoded::Refused {
                why: format!("the run request does not read: {e}"),
                head,
            },
        }
    }
}

/// A worker's answer: the input's OUT line, as a local batch writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub version: u32,
    /// Which worker answered (its `--name`, or host name and pid).
    pub worker: String,
    /// Answered from the log: the input had finished before this delivery.
    #[serde(default)]
    pub duplicate: bool,
    pub line: OutputLine,
}

impl RunResult {
    /// A failed result for a request (or its head) with `kind` and `message`.
    pub fn failed(
        worker: &str,
        batch: &str,
        key: (u64, Option<u32>),
        seed: u64,
        execution: String,
        kind: &str,
        message: String,
    ) -> RunResult {
        RunResult {
            version: REQUEST_VERSION,
            worker: worker.to_owned(),
            duplicate: false,
            line: OutputLine {
                index: key.0,
                repeat: key.1,
                batch: Some(batch.to_owned()),
                execution,
                seed,
                outcome: RunOutcome::Failed,
                result: None,
                error: Some(RunError {
                    kind: kind.to_owned(),
                    message,
                }),
                usage: None,
                duration_ms: 0,
                output: None,
            },
        }
    }
}

/// A batch id is a NATS subject token: letters, digits, `-` and `_`.
pub fn subject_safe(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> RunRequest {
        RunRequest {
            version: REQUEST_VERSION,
            batch: "batch-1".into(),
            index: 3,
            repeat: None,
            prompt_path: "p.md".into(),
            prompt_text: "# P\n".into(),
            args: "{}".into(),
            seed: 9,
            start_ms: 1,
            model: Some("m".into()),
            resume: None,
            capture: false,
        }
    }

    #[test]
    fn a_request_reads_back_whole() {
        let bytes = serde_json::to_vec(&request()).unwrap();
        match Decoded::from_bytes(&bytes) {
            Decoded::Request(r) => assert_eq!(*r, request()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_newer_or_broken_request_is_refused_under_its_key_and_garbage_is_not_keyed() {
        let mut newer = serde_json::to_value(request()).unwrap();
        newer["version"] = 2.into();
        match Decoded::from_bytes(newer.to_string().as_bytes()) {
            Decoded::Refused { head, why } => {
                assert_eq!(head.index, 3);
                assert!(why.contains("version 2 is newer"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        let broken = r#"{"version":1,"batch":"b","index":4,"args":7}"#;
        assert!(matches!(
            Decoded::from_bytes(broken.as_bytes()),
            Decoded::Refused { head, .. } if head.index == 4
        ));
        assert!(matches!(Decoded::from_bytes(b"hello"), Decoded::Garbage(_)));
    }

    #[test]
    fn batch_ids_are_single_subject_tokens() {
        assert!(subject_safe("batch-00ff_1"));
        for bad in ["", "a.b", "a b", "a*", "a>"] {
            assert!(!subject_safe(bad), "{bad}");
        }
    }
}
