//! `promptforge models`: the host file's model catalog, which model is
//! current, and whether each model's key variable is set (never the key).

use std::io::Write;
use std::process::ExitCode;

use pf_host::HostError;

use pf_harness::ThinkingSupport;
use pf_models::ProviderSpec;
use serde::Serialize;

use crate::cli::{ModelsArgs, OutputFormat};
use pf_host::HostConfig;

/// `models --json`: one object.
#[derive(Debug, Serialize)]
struct Catalog {
    /// The host file in use; `null` when there is none.
    host_file: Option<String>,
    current: Option<String>,
    models: Vec<Entry>,
}

#[derive(Debug, Serialize)]
struct Entry {
    id: String,
    provider: &'static str,
    /// The provider's model name.
    model: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    base_url: Option<String>,
    context: u64,
    thinking: &'static str,
    description: String,
    /// The NAME of the key variable, if the model uses one.
    key_env: Option<String>,
    /// Whether that variable is set and non-empty; `null` without a key variable.
    key_set: Option<bool>,
    retries: u32,
    /// The command that starts the model's own server, if the Host starts one.
    #[serde(skip_serializing_if = "Option::is_none")]
    spawn: Option<Vec<String>>,
    /// `"native"` or `"json"`.
    tool_format: &'static str,
    current: bool,
}

pub fn run(args: ModelsArgs) -> Result<ExitCode, HostError> {
    let path = args.host.path();
    let config = HostConfig::load(path.as_deref())?;
    let chosen = args.model.chosen();
    let current = match config.current_id(chosen.as_deref()) {
        Ok(id) => id,
        // An unknown --model or $PROMPTFORGE_MODEL is an error; a choice left
        // open among several models only means none is current.
        Err(e) if chosen.is_some() => return Err(e),
        Err(_) => None,
    };
    let catalog = Catalog {
        host_file: path.map(|p| p.display().to_string()),
        models: config
            .catalog
            .iter()
            .map(|spec| entry(spec, current.as_deref() == Some(spec.id.as_str())))
            .collect(),
        current,
    };
    match args.output.format() {
        OutputFormat::Json => match serde_json::to_string(&catalog) {
            // A closed stdout (`| head`) is not an error worth a panic.
            Ok(line) => {
                let _ = writeln!(std::io::stdout(), "{line}");
            }
            Err(e) => return Err(HostError::Usage(format!("cannot encode the catalog: {e}"))),
        },
        OutputFormat::Human => {
            let _ = write!(std::io::stdout(), "{}", text(&catalog));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn entry(spec: &ProviderSpec, current: bool) -> Entry {
    let provider = spec.kind.name().word();
    let endpoint = spec.kind.endpoint();
    let key_env = endpoint.and_then(|e| e.api_key_env.clone());
    let key_set = key_env
        .as_deref()
        .map(|name| std::env::var_os(name).is_some_and(|v| !v.to_string_lossy().trim().is_empty()));
    Entry {
        id: spec.id.clone(),
        provider,
        model: spec.model.clone(),
        base_url: endpoint.map(|e| e.base_url.clone()),
        context: spec.context,
        thinking: match spec.thinking {
            ThinkingSupport::Never => "Never",
            ThinkingSupport::Always => "Always",
            ThinkingSupport::Switchable => "Switchable",
        },
        description: spec.description.clone(),
        key_env,
        key_set,
        retries: spec.retries,
        spawn: spec.spawn.as_ref().map(|s| s.command.clone()),
        tool_format: match spec.tool_format {
            pf_models::ToolFormat::Native => "native",
            pf_models::ToolFormat::Json => "json",
        },
        current,
    }
}

/// The catalog as aligned columns, the current model marked `*`.
fn text(catalog: &Catalog) -> String {
    let mut out = match &catalog.host_file {
        Some(path) => format!("host file: {path}\n"),
        None => "host file: none\n".to_string(),
    };
    if catalog.models.is_empty() {
        out.push_str("no models: add [models.ID] tables (or [model]) to the host file\n");
        return out;
    }
    let mut rows = vec![[
        String::new(),
        "ID".to_string(),
        "PROVIDER".to_string(),
        "MODEL".to_string(),
        "CONTEXT".to_string(),
        "THINKING".to_string(),
        "KEY".to_string(),
    ]];
    for m in &catalog.models {
        let key = match (&m.key_env, m.key_set) {
            (Some(name), Some(true)) => format!("{name} (set)"),
            (Some(name), _) => format!("{name} (not set)"),
            (None, _) => "-".to_string(),
        };
        rows.push([
            if m.current { "*" } else { "" }.to_string(),
            m.id.clone(),
            m.provider.to_string(),
            m.model.clone(),
            m.context.to_string(),
            m.thinking.to_string(),
            key,
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    for m in &catalog.models {
        if let Some(command) = &m.spawn {
            out.push_str(&format!(
                "{}: started by promptforge on first use: {}\n",
                m.id,
                command.join(" ").escape_debug()
            ));
        }
        if m.tool_format == "json" {
            out.push_str(&format!(
                "{}: tool calls as JSON in the reply text (tool_format = \"json\")\n",
                m.id
            ));
        }
    }
    if catalog.current.is_none() {
        out.push_str("no current model: set default_model, or choose with --model ID\n");
    }
    out
}
