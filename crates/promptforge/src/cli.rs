//! The command line, declared once with clap's derive: help, completions, a man
//! page and the CLI reference all come from these types. Flag groups that
//! several subcommands share are declared here once and `#[command(flatten)]`ed.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "promptforge", version, about = "Runs promptforge prompt files")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// One variant per subcommand; each has its module under `commands/`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a prompt; ARGS is the run's argument string.
    Run(RunArgs),
    /// Parse only; print each problem as FILE:LINE:COL: Kind: message.
    Check(CheckArgs),
    /// List the host file's model catalog and which model is current.
    Models(ModelsArgs),
    /// List logged runs, newest first.
    #[command(after_help = RUNS_EXAMPLES)]
    Runs(RunsArgs),
    /// Show one logged run: a summary, then its timeline.
    #[command(after_help = SHOW_EXAMPLES)]
    Show(ShowArgs),
    /// Rerun a logged run, answering every model round, tool call and
    /// operator question from the log (offline).
    #[command(after_help = REPLAY_EXAMPLES)]
    Replay(ReplayArgs),
}

const REPLAY_EXAMPLES: &str = "\
The prompt text, args, seed and start come from the log; so does every
answer, looked up by the work's task and number, so no model, MCP server or
web request is contacted. The replay is logged too, with replay_of RUN.

With --prompt FILE (an edited prompt), the first request that differs from
the logged one stops the replay (exit 1, error kind `Replay`, with a diff of
the two requests); with --live, that request and everything after it go to the
host file's real models, Plugins and operator instead.

Examples:
  promptforge replay last
  promptforge replay 3f2a --json
  promptforge replay last --prompt edited.md --live";

const RUNS_EXAMPLES: &str = "\
The run log is one SQLite database in the data directory: $PROMPTFORGE_HOME,
else $XDG_DATA_HOME/promptforge, else ~/.local/share/promptforge.

Examples:
  promptforge runs                       the 20 newest runs
  promptforge runs -n 5 --outcome failed the 5 newest failed runs
  promptforge runs --prompt notes --json runs of prompts whose path contains `notes`, as JSON";

const SHOW_EXAMPLES: &str = "\
RUN is an execution id (run-3f2a...), a unique prefix of one (3f2a), `last`
(the newest run) or `#N` (the log's own number, from `runs`). A RUN that
matches no run, or several, is a usage error (exit 2) listing candidates.

Examples:
  promptforge show last
  promptforge show 3f2a --json
  promptforge show last --all            every event, the section VM's too";

#[derive(Debug, Args)]
pub struct RunArgs {
    pub file: PathBuf,
    pub args: Option<String>,
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub seed: SeedArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub log: LogArgs,
    /// Run again a logged run that failed or was cancelled: the answers it
    /// logged are reused (its seed, start and args too unless given), the
    /// rest goes live. RUN as for `show`.
    #[arg(long, value_name = "RUN")]
    pub resume: Option<String>,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The run: an execution id, a unique prefix of one, `last`, or `#N`.
    pub run: String,
    /// Replay this (edited) prompt file instead of the logged prompt text.
    #[arg(long, value_name = "FILE")]
    pub prompt: Option<PathBuf>,
    /// At the first request the log does not hold, go on live instead of stopping.
    #[arg(long)]
    pub live: bool,
    /// Do not record this replay in the run log.
    #[arg(long)]
    pub no_log: bool,
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    pub file: PathBuf,
}

#[derive(Debug, Args)]
pub struct ModelsArgs {
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct RunsArgs {
    /// Show at most N runs.
    #[arg(short = 'n', long = "limit", value_name = "N", default_value_t = 20)]
    pub limit: usize,
    /// Only runs whose prompt path contains SUBSTR.
    #[arg(long, value_name = "SUBSTR")]
    pub prompt: Option<String>,
    /// Only runs that ended this way (`running`: no recorded end yet, or killed).
    #[arg(long, value_enum)]
    pub outcome: Option<OutcomeFilter>,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Which catalog model is the run's current model.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// The current model's catalog id. Default: $PROMPTFORGE_MODEL, else the
    /// host file's default_model, else its only model.
    #[arg(long = "model", value_name = "ID")]
    pub model: Option<String>,
}

impl ModelArgs {
    /// `--model`, else `$PROMPTFORGE_MODEL`.
    pub fn chosen(&self) -> Option<String> {
        crate::host::chosen_model(self.model.as_deref())
    }
}

/// The outcomes `runs --outcome` filters on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutcomeFilter {
    Completed,
    Failed,
    Cancelled,
    Running,
}

impl OutcomeFilter {
    /// The label the run log stores.
    pub fn label(self) -> &'static str {
        match self {
            OutcomeFilter::Completed => "completed",
            OutcomeFilter::Failed => "failed",
            OutcomeFilter::Cancelled => "cancelled",
            OutcomeFilter::Running => pf_runlog::RUNNING,
        }
    }
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The run: an execution id, a unique prefix of one, `last`, or `#N`.
    pub run: String,
    /// Show every event in the timeline, the section VM's phases included.
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Whether and how a run is logged.
#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// Do not record this run in the run log.
    #[arg(long)]
    pub no_log: bool,
    /// Also record each model round's raw request and response bodies as
    /// `request`/`response` events (debug capture; they hold the full prompt).
    #[arg(long)]
    pub capture: bool,
}

/// Which host file configures the Host.
#[derive(Debug, Clone, Args)]
pub struct HostArgs {
    /// Host file (TOML). Default: $PROMPTFORGE_HOST, else
    /// $XDG_CONFIG_HOME/promptforge/host.toml, else ~/.config/promptforge/host.toml.
    #[arg(long = "host")]
    pub host: Option<PathBuf>,
}

impl HostArgs {
    /// The host file to read: `--host`, else the default location (if any).
    pub fn path(&self) -> Option<PathBuf> {
        self.host.clone().or_else(crate::host::default_host_path)
    }
}

/// What fixes a run's randomness and clock, so it can be repeated.
#[derive(Debug, Clone, Args)]
pub struct SeedArgs {
    /// Run seed. Default: random.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run start instant (RFC 3339). Default: now.
    #[arg(long)]
    pub start: Option<String>,
}

impl SeedArgs {
    /// The given seed, else a random one.
    pub fn seed_or_random(&self) -> u64 {
        self.seed.unwrap_or_else(rand::random)
    }

    /// The start instant in milliseconds since the epoch: `--start`, else now.
    pub fn start_ms(&self) -> Result<i64, String> {
        match &self.start {
            Some(text) => parse_start(text),
            None => Ok(now_ms()),
        }
    }
}

fn parse_start(text: &str) -> Result<i64, String> {
    let t = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("--start {text:?} is not an RFC 3339 instant: {e}"))?;
    Ok((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The run's store directory.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// The run's store directory. Default: a fresh directory.
    #[arg(long = "store")]
    pub store: Option<PathBuf>,
}

/// How results are printed.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Print JSON instead of text: `run` its report object, `runs` an array of
    /// runs, `show` the run with its events.
    #[arg(long)]
    pub json: bool,
}

/// Whether output is for a person or for a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    Human,
    Json,
}

impl OutputArgs {
    pub fn format(&self) -> OutputFormat {
        if self.json {
            OutputFormat::Json
        } else {
            OutputFormat::Human
        }
    }
}
