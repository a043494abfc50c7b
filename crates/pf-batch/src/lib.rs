//! `promptforge batch`: one prompt over many inputs.
//!
//! - [`inputs`]: the inputs, streamed and checked against the prompt's `args:`
//!   before any run (each bad line reported with its line number).
//! - [`output`]: the output file, one complete line per finished input, and
//!   what an earlier output file says was done (for `--resume`).
//! - [`drive`]: the scheduler ([`execute`], shared with `promptforge test`): at most `-j` runs at once, seeds derived from
//!   the batch seed and the index, `--resume`, `--fail-fast`, `--limit`,
//!   `--repeat`, and the summary.
//!
//! This crate knows nothing of the Host or the Engine: the CLI hands it the
//! prompt's declared args and a function that runs one input.

pub mod drive;
pub mod inputs;
pub mod output;

pub use drive::{derive_seed, drive, execute, DriveError, DrivePlan, Job, Summary};
pub use inputs::{BadLine, Input, InputError, InputFormat, InputSource, Inputs, Record, Records};
pub use output::{
    ItemKey, OutputError, OutputFormat, OutputLine, OutputWriter, Previous, RunError, RunOutcome,
    TokenUsage,
};
