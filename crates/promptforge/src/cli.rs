//! The command line, declared once with clap's derive: help, completions, a man
//! page and the CLI reference all come from these types. Flag groups that
//! several subcommands share are declared here once and `#[command(flatten)]`ed.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "promptforge",
    version,
    about = "Runs promptforge prompt files",
    after_help = MAIN_EXAMPLES
)]
pub struct Cli {
    /// When to colour output and log lines: auto (where the text goes is a terminal and NO_COLOR is unset), always, never.
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    #[command(subcommand)]
    pub command: Command,
}

/// One variant per subcommand; each has its module under `commands/`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a prompt; ARGS is the run's argument string.
    #[command(after_help = RUN_EXAMPLES)]
    Run(RunArgs),
    /// Run a prompt over many inputs (JSONL, CSV or stdin), one output line per input.
    #[command(after_help = BATCH_EXAMPLES)]
    Batch(BatchArgs),
    /// Check prompt files and folders; print each problem as FILE:LINE:COL: Kind: message.
    #[command(after_help = CHECK_EXAMPLES)]
    Check(CheckArgs),
    /// List the host file's model catalog and which model is current.
    Models(ModelsArgs),
    /// List logged runs, newest first.
    #[command(after_help = RUNS_EXAMPLES)]
    Runs(RunsArgs),
    /// Show one logged run: a summary, then its timeline.
    #[command(after_help = SHOW_EXAMPLES)]
    Show(ShowArgs),
    /// Run prompt tests (NAME.test.yaml beside NAME.md, or tests/*.yaml); exit 1 on any failure.
    Test(TestArgs),
    // --- added by the CLI-UX work (info, init, completions, man, reference) ---
    /// Show a prompt's name, description, args, roles, Plugins, tool slots and sections.
    #[command(after_help = INFO_EXAMPLES)]
    Info(InfoArgs),
    /// Scaffold a prompt NAME.md, a host file NAME.host.toml and a test NAME.test.yaml.
    #[command(after_help = INIT_EXAMPLES)]
    Init(InitArgs),
    /// Print a shell completion script (bash, zsh, fish) on stdout.
    #[command(after_help = COMPLETIONS_EXAMPLES)]
    Completions(CompletionsArgs),
    /// Print the man page (roff) on stdout.
    #[command(hide = true)]
    Man,
    /// Print the CLI reference (Markdown) that docs/src/reference/cli.md holds.
    #[command(hide = true)]
    Reference,
    /// Serve prompts as MCP tools: stdio by default, --http ADDR for streamable HTTP.
    Mcp(McpArgs),
    /// Rerun a logged run, answering every model round, tool call and
    /// operator question from the log (offline).
    #[command(after_help = REPLAY_EXAMPLES)]
    Replay(ReplayArgs),
    /// Run batch inputs from a NATS JetStream queue (`batch --queue`) until SIGINT/SIGTERM.
    #[command(after_help = WORKER_EXAMPLES)]
    Worker(WorkerArgs),
}

const WORKER_EXAMPLES: &str = "\
A request names its model by catalog id; the model's endpoint and key come
from this worker's host file. A request whose run began on a worker that was
lost resumes that logged run (its model answers reused); a request whose
input already completed is acknowledged without running. SIGINT/SIGTERM stop
pulling, cancel the runs in flight and hand them back to the queue.

Examples:
  promptforge worker --queue nats://127.0.0.1:4222 --host examples/label-ticket.host.toml -j 8   # on each machine
  promptforge batch examples/label-ticket.md examples/tickets.csv -o labels.jsonl --queue nats://127.0.0.1:4222";

const BATCH_EXAMPLES: &str = "\
INPUTS is JSON Lines (each line an args object for the prompt's `args:`, or a
JSON string: the argument string), a .csv file whose header names declared
args (each cell typed as --arg types it; an empty cell leaves the arg out), or
- for JSON Lines on stdin. Bad lines are listed with their line numbers and
refuse the batch before any run, unless --skip-bad.

OUT gets one line per input as it finishes: index, (repeat,) batch, execution,
seed, outcome, result or error {kind, message}, usage, duration_ms, and the
declared output file's text. Every run is logged under the batch id printed at
the start (`promptforge runs --batch ID`). Exit 0 when every input completed,
1 otherwise, 130 on Ctrl-C (runs in flight are cancelled and written as
cancelled; a second Ctrl-C exits at once). --resume skips inputs with a
completed line and resumes failed or cancelled runs from the log, reusing
their logged model answers.

Examples:
  promptforge batch examples/label-ticket.md examples/tickets.csv -o labels.jsonl -j 16 --host examples/label-ticket.host.toml
  promptforge batch examples/label-ticket.md examples/tickets.csv -o labels.csv --format csv --host examples/label-ticket.host.toml
  promptforge batch examples/label-ticket.md examples/tickets.csv -o labels.jsonl --resume --host examples/label-ticket.host.toml
  printf '\"tides\"\\n\"moon\"\\n' | promptforge batch examples/hello.md - -o greetings.jsonl --seed 7 --repeat 3";

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
  promptforge replay '#1' --json
  promptforge replay last --prompt examples/hello.md --live";

const RUNS_EXAMPLES: &str = "\
The run log is one SQLite database in the data directory: $PROMPTFORGE_HOME,
else $XDG_DATA_HOME/promptforge, else ~/.local/share/promptforge.

Examples:
  promptforge runs                           # the 20 newest runs
  promptforge runs -n 5 --outcome failed     # the 5 newest failed runs
  promptforge runs --prompt notes --json     # runs of prompts whose path contains `notes`
  promptforge runs --search 'refund invoice' --outcome failed
                                             # failed runs whose prompt path, args, result
                                             # or error hold both words
  promptforge runs prune --older-than 30d    # delete runs older than 30 days";

const SHOW_EXAMPLES: &str = "\
RUN is an execution id (run-3f2a...), a unique prefix of one (3f2a), `last`
(the newest run) or `#N` (the log's own number, from `runs`). A RUN that
matches no run, or several, is a usage error (exit 2) listing candidates.

Examples:
  promptforge show last
  promptforge show '#1' --json
  promptforge show last --all                # every event, the section VM's too
  promptforge show last --html -o run.html   # the run as a self-contained trace page
  promptforge show last --open               # write the page and open it in the browser";

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The prompt file.
    pub file: PathBuf,
    /// The run's argument string (JSON object for declared args, else prose); `-` reads stdin.
    pub args: Option<String>,
    /// One declared argument, typed by the prompt's `args:`; instead of ARGS.
    #[arg(long = "arg", value_name = "NAME=VALUE")]
    pub arg: Vec<String>,
    /// No live output, progress or warnings: only the result and errors.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Never stream model replies (no live text; for servers without streaming);
    /// wins over the host file's `stream`.
    #[arg(long)]
    pub no_stream: bool,
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
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
    /// Run again whenever the prompt, its input file, the host file or its
    /// replies files change, until Ctrl-C.
    #[arg(long, conflicts_with = "resume")]
    pub watch: bool,
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
    /// Prompt files, or folders searched for `*.md` files that start with `---`.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Also make the checks prepare would make against this host file (Plugins' tools, roles).
    #[arg(long = "host", value_name = "FILE")]
    pub host: Option<PathBuf>,
    /// How problems print: one line each, or rich snippets. Default: rich when stdout is a terminal.
    #[arg(long, value_enum)]
    pub format: Option<CheckFormat>,
    #[command(flatten)]
    pub output: OutputArgs,
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
pub struct BatchArgs {
    /// The prompt file.
    pub prompt: PathBuf,
    /// The inputs: a JSON Lines file, a .csv file with a header row, or - for JSON Lines on stdin.
    pub inputs: PathBuf,
    /// The output file: one line per finished input.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: PathBuf,
    /// Runs at once.
    #[arg(short = 'j', long = "jobs", value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub jobs: u16,
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub model: ModelArgs,
    /// Continue OUT: skip inputs with a completed line; resume failed or
    /// cancelled runs from the log (their logged model answers reused).
    #[arg(long)]
    pub resume: bool,
    /// How OUT is written.
    #[arg(long, value_enum, default_value_t = BatchFormat::Jsonl)]
    pub format: BatchFormat,
    /// Stop at the first failed input (the runs in flight are cancelled).
    #[arg(long)]
    pub fail_fast: bool,
    /// Only the first N inputs.
    #[arg(long, value_name = "N")]
    pub limit: Option<u64>,
    /// Run each input N times, each with its own seed (OUT lines get `repeat`).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,
    /// The batch seed: each run's seed is derived from it and the input's index
    /// (and repetition), so a batch repeats exactly. Default: random, printed at the start.
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
    /// Leave bad input lines out (each is listed) instead of refusing the batch.
    #[arg(long)]
    pub skip_bad: bool,
    /// No progress line.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    #[command(flatten)]
    pub log: LogArgs,
    /// Publish the inputs to NATS JetStream at URL (nats://HOST:PORT) for
    /// `promptforge worker`s to run, and collect their results into OUT.
    /// -j is then how many inputs wait in the queue at once. Workers always
    /// log their runs (a lost run resumes from the log), so not with --no-log;
    /// queued runs cannot be called back, so not with --fail-fast.
    #[arg(long, value_name = "URL", conflicts_with_all = ["no_log", "fail_fast"])]
    pub queue: Option<String>,
}

/// `promptforge worker`: run requests from a NATS JetStream queue.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The NATS server with JetStream (nats://HOST:PORT).
    #[arg(long, value_name = "URL")]
    pub queue: String,
    #[command(flatten)]
    pub host: HostArgs,
    /// Runs at once.
    #[arg(short = 'j', long = "jobs", value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub jobs: u16,
    /// This worker's name in results and in NATS. Default: host name and process id.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Deliveries of one request before it becomes a failed result (sets the
    /// workers' shared consumer; default: as the consumer has it, else 5).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i64).range(1..))]
    pub max_deliver: Option<i64>,
    /// Seconds a delivery may go unextended before JetStream gives it to
    /// another worker (a running run extends it every third of this; sets
    /// the shared consumer; default: as the consumer has it, else 30).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub ack_wait: Option<u64>,
}

/// `batch --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BatchFormat {
    /// One JSON object a line.
    Jsonl,
    /// A header row, then one row a run.
    Csv,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RunsArgs {
    #[command(subcommand)]
    pub action: Option<RunsAction>,
    /// Only runs whose prompt path, args, result or error contain every word
    /// of TEXT (case-insensitive; words match as prefixes).
    #[arg(long, value_name = "TEXT")]
    pub search: Option<String>,
    /// Show at most N runs.
    #[arg(short = 'n', long = "limit", value_name = "N", default_value_t = 20)]
    pub limit: usize,
    /// Only runs whose prompt path contains SUBSTR.
    #[arg(long, value_name = "SUBSTR")]
    pub prompt: Option<String>,
    /// Only runs that ended this way (`running`: no recorded end yet, or killed).
    #[arg(long, value_enum)]
    pub outcome: Option<OutcomeFilter>,
    /// Only the runs of this batch (the id `promptforge batch` prints when it starts).
    #[arg(long, value_name = "ID")]
    pub batch: Option<String>,
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// What `runs` can do besides listing.
#[derive(Debug, Subcommand)]
pub enum RunsAction {
    /// Delete finished runs from the run log, with their events and host
    /// work, and the default store directories of the runs deleted.
    #[command(after_help = PRUNE_EXAMPLES)]
    Prune(PruneArgs),
}

const PRUNE_EXAMPLES: &str = "\
A run still running is never pruned. Store directories given with --store
are yours and are left alone; only the default ones under the data
directory's stores/ are deleted with their runs.

Examples:
  promptforge runs prune --older-than 30d --dry-run   # what would go
  promptforge runs prune --older-than 12h
  promptforge runs prune --keep 100 --json";

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["older_than", "keep"])))]
pub struct PruneArgs {
    /// Delete runs that started longer ago than DURATION: a number and a
    /// unit (s, m, h, d, w), or several, as 1d12h.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub older_than: Option<std::time::Duration>,
    /// Keep the newest N runs and delete the rest.
    #[arg(long, value_name = "N")]
    pub keep: Option<usize>,
    /// Only report what would be deleted.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `--older-than`'s value: `<n><unit>` groups, units s, m, h, d, w.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let bad = || {
        format!("invalid duration `{text}`: expected a number and a unit (s, m, h, d, w), as 30d or 1d12h")
    };
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in text.trim().chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit: u64 = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            'w' => 604_800,
            _ => return Err(bad()),
        };
        let n: u64 = digits.parse().map_err(|_| bad())?;
        total = n
            .checked_mul(unit)
            .and_then(|s| total.checked_add(s))
            .ok_or_else(bad)?;
        digits.clear();
    }
    if !digits.is_empty() || text.trim().is_empty() {
        return Err(bad());
    }
    Ok(std::time::Duration::from_secs(total))
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
        pf_host::chosen_model(self.model.as_deref())
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
    pub host: HostArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub page: PageArgs,
}

/// `show --html`: the run as one self-contained trace page.
#[derive(Debug, Clone, Args)]
pub struct PageArgs {
    /// Write the run as one self-contained HTML trace page (no external
    /// scripts, styles or fonts), to stdout unless --output is given.
    #[arg(long, conflicts_with = "json")]
    pub html: bool,
    /// Write the page to FILE instead of stdout (implies --html).
    #[arg(long, short = 'o', value_name = "FILE", conflicts_with = "json")]
    pub output: Option<PathBuf>,
    /// Write the page (to --output, else into the data directory's `pages/`)
    /// and open it in the browser with xdg-open (open on macOS) (implies --html).
    #[arg(long, conflicts_with = "json")]
    pub open: bool,
}

impl PageArgs {
    /// Whether the page was asked for.
    pub fn wanted(&self) -> bool {
        self.html || self.open || self.output.is_some()
    }
}

/// Where a run's trace goes, beside the run log.
#[derive(Debug, Clone, Args)]
pub struct TelemetryArgs {
    /// Export the run as an OpenTelemetry trace over OTLP/HTTP (protobuf) to
    /// URL (POST URL/v1/traces), e.g. http://127.0.0.1:4318; overrides the
    /// host file's `[telemetry] otlp`. Export never slows or fails the run.
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
}

/// `check --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CheckFormat {
    /// `FILE:LINE:COL: Kind: message`, one problem a line, on stdout.
    Short,
    /// rustc-style snippets with help, on stdout.
    Rich,
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The prompt file.
    pub file: PathBuf,
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

#[derive(Debug, Args)]
pub struct TestArgs {
    /// Test files, prompts (their NAME.test.yaml) or folders to search. Default: `.`.
    #[arg(default_value = ".")]
    pub paths: Vec<PathBuf>,
    /// Only cases whose `FILE: NAME` contains this text.
    #[arg(long, value_name = "SUBSTR")]
    pub filter: Option<String>,
    /// Write the current results as the new expectations.
    #[arg(long)]
    pub update: bool,
    /// Write a JUnit XML report to FILE.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Run every case against this catalog model instead of its scripted
    /// replies. Repeat it to compare models: each is a column of the matrix.
    #[arg(long = "model", value_name = "ID")]
    pub model: Vec<String>,
    /// Run the cases against this edited copy of their prompt instead.
    /// Repeat it to compare prompt versions: each is a column (times each --model).
    #[arg(long = "prompt", value_name = "FILE")]
    pub prompt: Vec<PathBuf>,
    /// Runs per case (and column); the line shows the pass rate, and the
    /// matrix its 95% confidence interval.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,
    /// With --repeat: the share of runs (0 to 1) that must pass for the case to pass.
    #[arg(long, default_value_t = 1.0, value_name = "RATE")]
    pub pass_rate: f64,
    /// Runs at once. Default: the number of CPUs, or 16 with --model (each
    /// model's catalog `concurrency` still bounds its requests).
    #[arg(long, short = 'j')]
    pub jobs: Option<usize>,
    /// Write the results as one self-contained HTML page (a grid of cases
    /// by models and prompt versions), each run's trace page in FILE's
    /// `NAME.traces/` folder beside it.
    #[arg(long, value_name = "FILE", conflicts_with = "update")]
    pub html: Option<PathBuf>,
    /// Open the --html page in the browser (xdg-open; open on macOS).
    #[arg(long, requires = "html")]
    pub open: bool,
    /// Answer a model round (and a judge call) whose request exactly matches
    /// one an earlier run logged, without contacting the server; the runs
    /// are logged. Cached cells are marked, their tokens and cost reported as saved.
    #[arg(long, conflicts_with = "update")]
    pub cache: bool,
    /// Run again whenever a test file, a tested prompt, the host file or a
    /// test file added under a searched folder changes, until Ctrl-C.
    #[arg(long, conflicts_with = "update")]
    pub watch: bool,
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The new prompt's name (a path: `tools/triage` writes tools/triage.md, ...).
    pub name: PathBuf,
    /// Overwrite files that already exist.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: CompletionShell,
}

/// The shells `completions` writes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

/// `--color`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ColorChoice {
    #[default]
    Auto,
    Always,
    Never,
}

const MAIN_EXAMPLES: &str = "Examples:
  promptforge run examples/hello.md reader
  promptforge run examples/notes.md 'The tide rises twice a day.' --host examples/notes.host.toml
  promptforge check examples
  promptforge info examples/greet.md
  promptforge test examples
  promptforge init triage

Docs: docs/ (mdBook); `promptforge <COMMAND> --help` for each command.";

const RUN_EXAMPLES: &str = "Examples:
  promptforge run examples/hello.md reader
  promptforge run examples/greet.md --arg name=Ada --arg times=3
  echo '{\"name\":\"Ada\"}' | promptforge run examples/greet.md -
  promptforge run examples/notes.md 'a note' --host examples/notes.host.toml --store notes --json
  promptforge run examples/hello.md --seed 7 --start 2026-01-02T03:04:05Z   # repeat a run exactly
  promptforge run examples/hello.md reader --watch   # run again on every save, until Ctrl-C";

const CHECK_EXAMPLES: &str = "Examples:
  promptforge check examples/hello.md
  promptforge check examples --json
  promptforge check examples/research.md --host examples/research.host.toml   # also: tools, roles, jump targets, output path
Exit status: 0 no errors (warnings allowed), 1 an error, 2 a usage error.";

const INFO_EXAMPLES: &str = "Examples:
  promptforge info examples/greet.md
  promptforge info examples/research.md --json";

const INIT_EXAMPLES: &str = "Examples:
  promptforge init triage        # triage.md, triage.host.toml, triage.test.yaml
  promptforge run triage.md 'a bug report' --host triage.host.toml";

const COMPLETIONS_EXAMPLES: &str = "Examples:
  promptforge completions bash > ~/.local/share/bash-completion/completions/promptforge
  promptforge completions zsh > ~/.zfunc/_promptforge
  promptforge completions fish > ~/.config/fish/completions/promptforge.fish";

#[derive(Debug, Args)]
pub struct McpArgs {
    /// Prompt files, and folders searched for prompt files (`*.md`). Default: `.`.
    #[arg(default_value = ".")]
    pub paths: Vec<PathBuf>,
    #[command(flatten)]
    pub host: HostArgs,
    /// Every call's store directory. Default: a fresh private directory per call.
    #[arg(long = "store")]
    pub store: Option<PathBuf>,
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio (e.g. 127.0.0.1:8808).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<std::net::SocketAddr>,
    /// The environment variable holding the bearer token HTTP clients must send.
    /// Default: `token_env` under [mcp_server] in the host file.
    #[arg(long, value_name = "NAME")]
    pub token_env: Option<String>,
    /// How many runs go at once.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent: u32,
    /// How many calls may wait for a run; beyond that a call gets an error result.
    #[arg(long, default_value_t = 16)]
    pub queue: u32,
    /// A call still running after SECONDS is cancelled and fails with a message saying so.
    #[arg(long, value_name = "SECONDS", default_value_t = pf_mcp_server::DEFAULT_CALL_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub call_timeout: u64,
    /// The largest request read, in bytes: a larger HTTP body is refused with 413
    /// before it is read, a longer stdio line with a JSON-RPC error.
    #[arg(long, value_name = "BYTES", default_value_t = pf_mcp_server::DEFAULT_MAX_BODY_BYTES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1024..))]
    pub max_body: usize,
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
        self.host.clone().or_else(pf_host::default_host_path)
    }
}

pub use pf_host::session::random_seed;

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
    /// The given seed, else a random one below 2^53, so JSON tools that read
    /// numbers as doubles keep it exact.
    pub fn seed_or_random(&self) -> u64 {
        self.seed.unwrap_or_else(random_seed)
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
    /// The run's store directory. Default: a fresh private directory (0700) under
    /// the data directory's `stores/`.
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

pub use pf_host::report::OutputFormat;

impl OutputArgs {
    pub fn format(&self) -> OutputFormat {
        if self.json {
            OutputFormat::Json
        } else {
            OutputFormat::Human
        }
    }
}
