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
}

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
    /// The run's store directory. Default: a fresh private directory (0700) under
    /// the data directory's `stores/`.
    #[arg(long = "store")]
    pub store: Option<PathBuf>,
}

/// How results are printed.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Print the run report as one JSON object.
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
