//! promptforge on NATS JetStream: runs handed to workers on other machines.
//!
//! - [`message`]: the typed, versioned [`RunRequest`] a batch publishes and the
//!   [`RunResult`] a worker answers with (an OUT line, as a local batch writes it).
//! - [`queue`]: the connection, the two streams (a work queue of requests, a
//!   store of results) and the workers' durable pull consumer.
//! - [`worker`]: the worker loop: pull as many requests as there are free
//!   slots, run each, extend its deadline while it runs, publish its result,
//!   then acknowledge it; a duplicate of a finished input is answered from the
//!   log without running.
//! - [`collect`]: the batch's side: publish requests and hand each job its
//!   result, as `pf_batch::drive` expects of a function that runs one input.
//!
//! This crate knows neither the Host nor the Engine: the CLI hands the worker
//! a function that runs one request and a [`Ledger`], its narrow view of the
//! run log.

pub mod collect;
pub mod error;
pub mod message;
pub mod queue;
pub mod worker;

pub use collect::Collector;
pub use error::QueueError;
pub use message::{RunRequest, RunResult, REQUEST_VERSION};
pub use queue::{Queue, QueueSettings};
pub use worker::{serve, Ledger, Logged, WorkerPlan, WorkerSummary};
