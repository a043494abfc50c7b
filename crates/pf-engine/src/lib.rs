//! The Engine: prepares and runs a parsed prompt.
//!
//! Architecture invariant: the Engine sees Plugins, Host services and model
//! providers only through the `pf-harness` traits; it never reads the host file,
//! never prints, and knows nothing of the CLI or the JSON report.

mod claims;
mod ctx;
mod error;
pub mod event;
mod events;
mod io_files;
mod json;
mod memory;
mod namespaces;
mod run;
pub mod settings;
mod setup;
mod text;
mod vm;

pub use error::{RunError, RunErrorKind};
pub use event::{Event, LoggedEvent};
pub use events::{
    EventKind, LiveText, LuaTraceback, Provenance, RoundNotice, RunEvent, RunObserver, SharedEvent,
    ToolCallNotice, MAIN_TASK,
};
pub use io_files::{collect_output, missing_input, place_input, CollectedOutput, MAX_OUTPUT_BYTES};
pub use memory::DEFAULT_RUN_MEMORY;
pub use run::{check_version, report_parse_failure, run, seeded_names, testing};
pub use setup::{Checkpoint, Outcome, RunLimits, RunReport, RunSetup, REPORTED_CHECKPOINTS};
pub use text::{envelope, format_when};
