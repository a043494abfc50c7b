//! `promptforge batch`: one prompt over many inputs.
//!
//! - [`inputs`]: the inputs, streamed and checked against the prompt's `args:`
//!   before any run (each bad line reported with its line number).
//! - [`output`]: the output file, one complete line per finished input, and
//!   what an earlier output file says was done (for `--resume`).
//!
//! This crate knows nothing of the Host or the Engine: the CLI hands it the
//! prompt's declared args and a function that runs one input.

pub mod inputs;
pub mod output;

pub use inputs::{BadLine, Input, InputError, InputFormat, InputSource, Inputs, Record, Records};
pub use output::{
    ItemKey, OutputError, OutputFormat, OutputLine, OutputWriter, Previous, RunError, RunOutcome,
    TokenUsage,
};
