//! The Host's configuration and its assembly, in one place.
//!
//! [`HostConfig::load`] reads the host file ([`file`]: its TOML shape) and
//! checks it whole: defaults applied, paths resolved against the host file's
//! folder, cross-key rules (`command` xor `url`, `replies` only for scripts,
//! `[model]` xor `[models]`, `default_model` in the catalog) enforced, each
//! error quoting the keys. [`HostConfig::current_id`] picks the run's current
//! model (`--model`, `PROMPTFORGE_MODEL`, `default_model`, the only one), and
//! [`HostConfig::assemble`] then builds the [`Host`] every command runs
//! against: the model providers (each metered, [`usage`]), the Harness with its
//! Plugins, the Host services and the `ui()` snapshot.
//! Every piece of host work goes through the decorators [`HostWork`] asks for
//! ([`record`]: the run log's recorders). [`data`] finds the run log;
//! [`observe`] is the Host's one run observer.

pub mod cache;
pub mod data;
pub mod file;
pub mod logged_json;
pub mod observe;
pub mod prompt_files;
pub mod record;
pub mod replay;
pub mod report;
pub mod scrub;
pub mod sections;
pub mod session;
pub mod usage;

pub use prompt_files::{read_capped, MAX_INPUT_BYTES};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value as Json};

use pf_harness::{Harness, HostServices, InputBroker, ModelProvider, Plugin, ThinkingSupport};
use pf_models::{HttpEndpoint, ProviderKind, ProviderSpec};
use pf_plugins::{
    FixedAnswersBroker, McpConfig, McpPlugin, McpTransport, SearchBackend, StdinInputBroker,
    WebConfig, WebPlugin,
};

use file::{HostFile, ModelTable, PluginTable, Search, Thinking};
pub use record::HostWork;
use record::{RecordingBroker, RecordingModel, RecordingPlugin};
use replay::{ReplayBroker, ReplayModel, ReplayPlugin};

/// What the host file configures, checked and resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct HostConfig {
    /// The model catalog: `[models.ID]` in id order, or the one `[model]`.
    pub catalog: Vec<ProviderSpec>,
    /// `default_model`, checked to name a catalog id.
    pub default_model: Option<String>,
    /// `[ui]`'s own keys; `None` without a `[ui]` table (no snapshot).
    pub ui: Option<Map<String, Json>>,
    pub web: WebConfig,
    /// MCP servers offered as Plugins, by Plugin id (in id order).
    pub plugins: Vec<(String, McpConfig)>,
    /// Fixed operator answers; `None` asks on stdin.
    pub answers: Option<Vec<String>>,
    /// `[mcp_server] token_env`: the variable holding `promptforge mcp --http`'s bearer token.
    pub mcp_token_env: Option<String>,
    /// `[telemetry] otlp`: the OTLP/HTTP collector runs are exported to.
    pub otlp: Option<String>,
    /// `[limits]`: what each run may use.
    pub limits: pf_engine::RunLimits,
    /// `[runlog] url`: a shared PostgreSQL run log (checked: no password).
    pub runlog_url: Option<String>,
    /// `stream = true`: every `models.loop` round is streamed, also with no one
    /// watching, so the client measures `ttft_ms` and `mean_itl_ms` (guide ch. 16);
    /// `stream = false`: never streamed, not even for live output; unset:
    /// streamed only while a person watches live output.
    pub stream: Option<bool>,
    /// The catalog was rebuilt from a logged run for a strict replay: its
    /// models are answered from the log and never built as providers.
    pub answered_from_log: bool,
}

/// What a command runs against: the models, the Harness (Plugins and services)
/// and the `ui()` snapshot.
pub struct Host {
    pub harness: Harness,
    /// The current model; every role binds to it.
    pub model: Option<Arc<dyn ModelProvider>>,
    /// The catalog models `models.get(id)` reaches: only with a snapshot.
    pub catalog: Vec<Arc<dyn ModelProvider>>,
    pub ui: Option<Json>,
    /// Token usage summed over every round of every model.
    pub usage: Arc<usage::UsageTotals>,
    /// The limits each run observes.
    pub limits: pf_engine::RunLimits,
}

/// The variable that chooses the current model when `--model` is not given.
pub const MODEL_ENV: &str = "PROMPTFORGE_MODEL";

/// Where the host file comes from when `--host` is not given:
/// `$PROMPTFORGE_HOST`, else `$XDG_CONFIG_HOME/promptforge/host.toml`, else
/// `~/.config/promptforge/host.toml`, each only if present.
pub fn default_host_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PROMPTFORGE_HOST") {
        if !p.is_empty() {
            return Some(PathBuf::from(p));
        }
    }
    // The XDG spec ignores an empty or relative XDG_CONFIG_HOME.
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join("promptforge/host.toml"));
    let home =
        std::env::var_os("HOME").map(|home| Path::new(&home).join(".config/promptforge/host.toml"));
    xdg.into_iter().chain(home).find(|p| p.is_file())
}

/// The model the command line or the environment asks for: `--model`, else
/// `$PROMPTFORGE_MODEL` when set and non-empty.
pub fn chosen_model(flag: Option<&str>) -> Option<String> {
    flag.map(str::to_string).or_else(|| {
        std::env::var(MODEL_ENV)
            .ok()
            .filter(|id| !id.trim().is_empty())
    })
}

impl HostConfig {
    /// Read and check the host file at `path`; no file means the defaults
    /// (no model, the web Plugin with its defaults, answers from stdin).
    ///
    /// The keys the host file names are registered with the process's
    /// scrubbing layer ([`pf_secrets::register`]) as soon as it is read, so
    /// the debug log is scrubbed of them from then on.
    pub fn load(path: Option<&Path>) -> Result<HostConfig, String> {
        let Some(path) = path else {
            return HostConfig::from_file(&HostFile::default(), Path::new("."));
        };
        let base_dir = path.parent().unwrap_or(Path::new("."));
        let config = HostConfig::from_file(&file::read(path)?, base_dir)?;
        pf_secrets::register(&config.secrets());
        Ok(config)
    }

    /// The names of every environment variable the host file says holds a
    /// key: each model's `api_key_env`, `[web] search_api_key_env`, each MCP
    /// Plugin's `env`, `[mcp_server] token_env`.
    pub fn key_names(&self) -> Vec<String> {
        let models = self.catalog.iter().filter_map(|spec| match &spec.kind {
            ProviderKind::OpenAi(endpoint) | ProviderKind::Anthropic(endpoint) => {
                endpoint.api_key_env.clone()
            }
            ProviderKind::Script { .. } => None,
        });
        let plugins = self.plugins.iter().flat_map(|(_, c)| c.env.iter().cloned());
        models
            .chain(self.web.search_api_key_env.clone())
            .chain(plugins)
            .chain(self.mcp_token_env.clone())
            .chain(data::run_log_secret_names(self.runlog_url.as_deref()))
            .collect()
    }

    /// The values of [`HostConfig::key_names`] now set: what every piece of
    /// text from outside is scrubbed of.
    pub fn secrets(&self) -> pf_secrets::Secrets {
        pf_secrets::Secrets::from_env(self.key_names())
    }

    /// Check a parsed host file; relative paths resolve against `base_dir`.
    pub fn from_file(file: &HostFile, base_dir: &Path) -> Result<HostConfig, String> {
        let web = file.web.as_ref();
        let web = WebConfig {
            search: match web.and_then(|w| w.search) {
                None | Some(Search::Gateway) => SearchBackend::Gateway,
                Some(Search::Searxng) => SearchBackend::Searxng,
                Some(Search::Brave) => SearchBackend::Brave,
            },
            search_url: web.and_then(|w| w.search_url.clone()),
            search_api_key_env: web.and_then(|w| w.search_api_key_env.clone()),
            allow_loopback: web.and_then(|w| w.allow_loopback).unwrap_or(false),
        };
        let mut plugins = Vec::new();
        for (id, table) in file.plugins.iter().flatten() {
            plugins.push((id.clone(), mcp_config(id, table)?));
        }
        let catalog = match (&file.model, &file.models) {
            (Some(_), Some(_)) => {
                return Err(
                    "host file: [model] and [models.ID] tables cannot both be present: \
                     [model] is a one-model catalog; move it under [models.ID]"
                        .to_string(),
                )
            }
            (Some(table), None) => {
                vec![provider_spec(table, None, base_dir).map_err(|e| format!("host file: {e}"))?]
            }
            (None, Some(models)) => {
                let mut catalog = Vec::new();
                for (id, table) in models {
                    check_catalog_id(id)?;
                    catalog.push(
                        provider_spec(table, Some(id), base_dir)
                            .map_err(|e| format!("host file: {e}"))?,
                    );
                }
                catalog
            }
            (None, None) => Vec::new(),
        };
        if let Some(id) = &file.default_model {
            if !catalog.iter().any(|spec| spec.id == *id) {
                return Err(format!(
                    "host file: default_model \"{id}\" is not in the catalog; {}",
                    catalog_list(&catalog)
                ));
            }
        }
        let ui = match &file.ui {
            Some(table) => Some(ui_keys(table)?),
            None => None,
        };
        let otlp = file.telemetry.as_ref().and_then(|t| t.otlp.clone());
        if let Some(url) = &otlp {
            pf_trace::otlp::traces_url(url)
                .map_err(|e| format!("host file: [telemetry] otlp: {e}"))?;
        }
        let runlog_url = file.runlog.as_ref().and_then(|r| r.url.clone());
        if let Some(url) = &runlog_url {
            data::check_host_file_runlog_url(url)
                .map_err(|e| format!("host file: [runlog] url: {e}"))?;
        }
        let mut config = HostConfig {
            catalog,
            default_model: file.default_model.clone(),
            ui,
            web,
            plugins,
            answers: file.input.as_ref().and_then(|i| i.answers.clone()),
            mcp_token_env: file.mcp_server.as_ref().and_then(|m| m.token_env.clone()),
            otlp,
            limits: run_limits(file.limits.as_ref()),
            runlog_url,
            stream: file.stream,
            answered_from_log: false,
        };
        hide_keys(&mut config);
        Ok(config)
    }

    /// The host a strict replay runs against when no host file is named:
    /// nothing but the logged models, by id, answered from the log. Their
    /// context is unbounded here (the logged run already passed its
    /// precheck), their description empty.
    pub fn answered_from_log(model_ids: impl Iterator<Item = String>) -> HostConfig {
        let mut ids: Vec<String> = model_ids.collect();
        ids.sort();
        ids.dedup();
        let catalog = ids
            .into_iter()
            .map(|id| ProviderSpec {
                kind: pf_models::ProviderKind::Script {
                    replies: PathBuf::new(),
                },
                model: id.clone(),
                id,
                context: u64::from(u32::MAX),
                thinking: pf_harness::ThinkingSupport::Switchable,
                description: String::new(),
                record: None,
                retries: 0,
                spawn: None,
                // The log holds the rounds as the Engine saw them: the
                // format they travelled in no longer matters.
                tool_format: pf_models::ToolFormat::default(),
                // Never called: nothing to pace.
                limits: pf_models::ModelLimits::default(),
            })
            .collect();
        HostConfig {
            catalog,
            default_model: None,
            ui: None,
            web: WebConfig {
                search: SearchBackend::Gateway,
                search_url: None,
                search_api_key_env: None,
                allow_loopback: false,
            },
            plugins: Vec::new(),
            answers: None,
            mcp_token_env: None,
            otlp: None,
            limits: run_limits(None),
            runlog_url: None,
            stream: None,
            answered_from_log: true,
        }
    }

    /// The catalog entry with this id.
    pub fn spec(&self, id: &str) -> Option<&ProviderSpec> {
        self.catalog.iter().find(|spec| spec.id == id)
    }

    /// The run's current model id: `chosen` (from [`chosen_model`]) when it is
    /// in the catalog, else `default_model`, else the only model; `None` for an
    /// empty catalog. An unknown id, or a choice left open among several
    /// models, is an error listing the catalog ids.
    pub fn current_id(&self, chosen: Option<&str>) -> Result<Option<String>, String> {
        if let Some(id) = chosen {
            return match self.spec(id) {
                Some(spec) => Ok(Some(spec.id.clone())),
                None => Err(format!(
                    "unknown model \"{id}\"; {}",
                    catalog_list(&self.catalog)
                )),
            };
        }
        if let Some(id) = &self.default_model {
            return Ok(Some(id.clone()));
        }
        match self.catalog.as_slice() {
            [] => Ok(None),
            [only] => Ok(Some(only.id.clone())),
            several => Err(format!(
                "the host file's catalog has several models and no default_model: \
                 choose one with --model ID or {MODEL_ENV} ({})",
                ids(several)
            )),
        }
    }

    /// The `ui()` snapshot: `[ui]`'s own keys, `selected_model` (the current
    /// id, when there is one) and `models` (the catalog ids); `None` without `[ui]`.
    pub fn ui_snapshot(&self, current: Option<&str>) -> Option<Json> {
        let mut snapshot = self.ui.clone()?;
        if let Some(id) = current {
            snapshot.insert("selected_model".into(), Json::String(id.to_string()));
        }
        let models = self.catalog.iter().map(|s| Json::String(s.id.clone()));
        snapshot.insert("models".into(), Json::Array(models.collect()));
        Some(Json::Object(snapshot))
    }

    /// Build the Host with `current` (from [`HostConfig::current_id`]) as its
    /// current model: register the Plugins and services and start the model
    /// providers (the other catalog models only with a `ui()` snapshot, the one
    /// way a prompt reaches them). Call it inside the async runtime the run will use.
    pub fn assemble(&self, current: Option<&str>) -> Result<Host, String> {
        self.assemble_for(current, &HostWork::Direct)
    }

    /// [`assemble`](HostConfig::assemble), with every piece of host work
    /// (model rounds, tool calls, operator answers) going through the
    /// decorators `work` names. The one place they are installed, for every
    /// command that runs prompts.
    pub fn assemble_for(&self, current: Option<&str>, work: &HostWork) -> Result<Host, String> {
        self.assemble_cached(current, work, None)
    }

    /// [`assemble_for`](HostConfig::assemble_for), with model rounds answered
    /// from `cache` when it holds them (`test --cache`): the caching
    /// decorator sits right around each real provider, inside the replay,
    /// metering and recording.
    pub fn assemble_cached(
        &self,
        current: Option<&str>,
        work: &HostWork,
        cache: Option<&cache::CacheUse>,
    ) -> Result<Host, String> {
        let mut harness = Harness::new();
        // Innermost, around each real part: everything from outside is scrubbed
        // before any recorder, replayer or the Engine sees it.
        let secrets = Arc::new(self.secrets());
        let mut plugins: Vec<Arc<dyn Plugin>> = vec![scrub::ScrubbingPlugin::wrap(
            Arc::new(WebPlugin::new(self.web.clone())),
            &secrets,
        )];
        for (id, config) in &self.plugins {
            plugins.push(scrub::ScrubbingPlugin::wrap(
                Arc::new(McpPlugin::new(id.clone(), config.clone())),
                &secrets,
            ));
        }
        if let Some(replayer) = work.replayer() {
            // The logged catalog answers; the real Plugin only goes live. A
            // Plugin the host file no longer has still replays under its id.
            let mut replaying: Vec<Arc<dyn Plugin>> = Vec::new();
            for plugin in &plugins {
                let id = plugin.id().to_string();
                replaying.push(Arc::new(ReplayPlugin::new(
                    id,
                    Some(Arc::clone(plugin)),
                    Arc::clone(replayer),
                )));
            }
            for id in replayer.logged_plugin_ids() {
                if !plugins.iter().any(|p| p.id() == id) {
                    replaying.push(Arc::new(ReplayPlugin::new(id, None, Arc::clone(replayer))));
                }
            }
            plugins = replaying;
        }
        for plugin in plugins {
            harness.register(match work.recorder() {
                None => plugin,
                Some(r) => Arc::new(RecordingPlugin::new(plugin, Arc::clone(r))),
            });
        }
        let broker: Arc<dyn InputBroker> = match &self.answers {
            Some(answers) => Arc::new(FixedAnswersBroker::new(answers.clone())),
            None => Arc::new(StdinInputBroker::new()),
        };
        let broker: Arc<dyn InputBroker> = match work.replayer() {
            None => broker,
            Some(r) => Arc::new(ReplayBroker::new(broker, Arc::clone(r))),
        };
        let broker: Arc<dyn InputBroker> = match work.recorder() {
            None => broker,
            Some(r) => Arc::new(RecordingBroker::new(broker, Arc::clone(r))),
        };
        harness.services = HostServices {
            input_broker: Some(broker),
        };
        let totals = Arc::new(usage::UsageTotals::default());
        // provider, then the cache's, then the replay's answers, then metering (replayed usage
        // counts), then recording (the replayed run is logged too).
        let build = |spec: &ProviderSpec| -> Result<Arc<dyn ModelProvider>, String> {
            let provider: Arc<dyn ModelProvider> = if self.answered_from_log {
                Arc::new(replay::LoggedOnlyModel::new(pf_harness::ModelInfo {
                    id: spec.id.clone(),
                    context: spec.context,
                    thinking: spec.thinking,
                    description: spec.description.clone(),
                }))
            } else {
                scrub::ScrubbingModel::wrap(
                    pf_models::build_provider(spec)
                        .map_err(|e| format!("host file: model \"{}\": {e}", spec.id))?,
                    &secrets,
                )
            };
            // Only a server's answers are cached: a scripted model's replies
            // file is the test's own, answered afresh so an edit shows.
            let cached = cache.filter(|_| !matches!(spec.kind, ProviderKind::Script { .. }));
            let provider: Arc<dyn ModelProvider> = match cached {
                None => provider,
                Some(c) => Arc::new(cache::CachingModel::new(
                    provider,
                    c.clone(),
                    spec.record.as_deref(),
                )),
            };
            let provider: Arc<dyn ModelProvider> = match work.replayer() {
                None => provider,
                Some(r) => Arc::new(ReplayModel::new(provider, Arc::clone(r))),
            };
            let metered: Arc<dyn ModelProvider> =
                Arc::new(usage::Metered::new(provider, Arc::clone(&totals)));
            Ok(match work.recorder() {
                None => metered,
                Some(r) => Arc::new(RecordingModel::new(metered, Arc::clone(r))),
            })
        };
        let model = match current.and_then(|id| self.spec(id)) {
            Some(spec) => Some(build(spec)?),
            None => None,
        };
        let ui = self.ui_snapshot(current);
        let mut catalog = Vec::new();
        if ui.is_some() {
            for spec in &self.catalog {
                match &model {
                    Some(m) if Some(spec.id.as_str()) == current => catalog.push(Arc::clone(m)),
                    _ => catalog.push(build(spec)?),
                }
            }
        }
        Ok(Host {
            harness,
            model,
            catalog,
            ui,
            usage: totals,
            limits: self.limits,
        })
    }
}

/// `[limits]` over the Engine's defaults.
fn run_limits(table: Option<&file::LimitsTable>) -> pf_engine::RunLimits {
    let mut limits = pf_engine::RunLimits::default();
    if let Some(mib) = table.and_then(|t| t.run_memory_mib) {
        limits.memory_budget = mib.bytes();
    }
    limits
}

/// The catalog ids, comma-separated, in catalog order.
fn ids(catalog: &[ProviderSpec]) -> String {
    let ids: Vec<&str> = catalog.iter().map(|spec| spec.id.as_str()).collect();
    ids.join(", ")
}

/// The end of an unknown-id message: what the catalog holds.
fn catalog_list(catalog: &[ProviderSpec]) -> String {
    if catalog.is_empty() {
        "the host file has no models".to_string()
    } else {
        format!("the catalog has: {}", ids(catalog))
    }
}

/// A catalog id is a model id (guide ch. 10): non-empty, no control characters.
fn check_catalog_id(id: &str) -> Result<(), String> {
    if id.trim().is_empty() || id.chars().any(char::is_control) {
        return Err(format!(
            "host file: [models.{id:?}] is not a usable model id: it must be non-empty text without control characters"
        ));
    }
    Ok(())
}

/// `[ui]`'s keys as JSON; the two keys the Host fills itself are refused.
fn ui_keys(table: &toml::Table) -> Result<Map<String, Json>, String> {
    let mut keys = Map::new();
    for (key, value) in table {
        if key == "selected_model" || key == "models" {
            return Err(format!(
                "host file: [ui] `{key}` is set by the Host (the current model and the catalog ids)"
            ));
        }
        keys.insert(key.clone(), toml_to_json(value));
    }
    Ok(keys)
}

fn toml_to_json(value: &toml::Value) -> Json {
    match value {
        toml::Value::String(s) => Json::String(s.clone()),
        toml::Value::Integer(i) => Json::from(*i),
        toml::Value::Float(f) => serde_json::Number::from_f64(*f)
            .map(Json::Number)
            .unwrap_or(Json::Null),
        toml::Value::Boolean(b) => Json::Bool(*b),
        toml::Value::Datetime(d) => Json::String(d.to_string()),
        toml::Value::Array(items) => Json::Array(items.iter().map(toml_to_json).collect()),
        toml::Value::Table(table) => Json::Object(
            table
                .iter()
                .map(|(k, v)| (k.clone(), toml_to_json(v)))
                .collect(),
        ),
    }
}

/// `[plugins."id"]`: exactly one of `command` (a non-empty program line) and `url`.
fn mcp_config(id: &str, table: &PluginTable) -> Result<McpConfig, String> {
    let transport = match (&table.command, &table.url) {
        (None, None) => {
            return Err(format!(
                "host file: [plugins.\"{id}\"] needs `command` (stdio) or `url` (streamable HTTP)"
            ))
        }
        (Some(_), Some(_)) => {
            return Err(format!(
                "host file: [plugins.\"{id}\"] takes `command` or `url`, not both"
            ))
        }
        (Some(command), None) if command.is_empty() => {
            return Err(format!(
                "host file: [plugins.\"{id}\"] `command` must name a program"
            ))
        }
        (Some(command), None) => McpTransport::Stdio {
            command: command.clone(),
        },
        (None, Some(url)) => McpTransport::Http { url: url.clone() },
    };
    let timeout = match table.timeout {
        None => pf_plugins::DEFAULT_CALL_TIMEOUT,
        Some(seconds) => std::time::Duration::try_from_secs_f64(seconds)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                format!(
                    "host file: [plugins.\"{id}\"] `timeout` must be a positive number of seconds"
                )
            })?,
    };
    let env = table.env.clone().unwrap_or_default();
    if !env.is_empty() && matches!(transport, McpTransport::Http { .. }) {
        return Err(format!(
            "host file: [plugins.\"{id}\"] `env` passes variables to a server the Host starts; \
             it needs `command`, not `url`"
        ));
    }
    if let Some(bad) = env.iter().find(|name| !is_env_name(name)) {
        return Err(format!(
            "host file: [plugins.\"{id}\"] `env`: {bad:?} is not an environment variable name \
             (letters, digits and `_`, not starting with a digit)"
        ));
    }
    Ok(McpConfig {
        transport,
        trusted: table.trusted.unwrap_or(false),
        conflicts: table.conflicts.clone().unwrap_or_default(),
        timeout,
        env,
    })
}

/// A name `env = [...]` can pass: `[A-Za-z_][A-Za-z0-9_]*`.
fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `[model]` (`id` `None`) or `[models.ID]` with its defaults: a missing
/// `provider` means `"openai"`; `model` is required for the HTTP providers, and
/// a scripted model's name defaults to its catalog id, or for `[model]` to
/// [`pf_models::DEFAULT_SCRIPT_MODEL_ID`]. `[model]`'s catalog id is its `model`.
fn provider_spec(
    table: &ModelTable,
    id: Option<&str>,
    base_dir: &Path,
) -> Result<ProviderSpec, String> {
    let name = match id {
        Some(id) => format!("[models.{}]", toml_key(id)),
        None => "[model]".to_string(),
    };
    let provider = table.provider.as_deref().unwrap_or("openai");
    if matches!(provider, "openai" | "anthropic") && table.replies.is_some() {
        return Err(format!(
            "{name} `replies` applies only to provider \"script\", not \"{provider}\""
        ));
    }
    let needs_model = || {
        table.model.clone().ok_or_else(|| {
            format!("{name} provider \"{provider}\" needs `model`, the model name to request")
        })
    };
    let receive_timeout = match table.timeout {
        None => None,
        Some(seconds) => Some(
            std::time::Duration::try_from_secs_f64(seconds)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    format!("host file: {name} `timeout` must be a positive number of seconds")
                })?,
        ),
    };
    let endpoint = |default_base_url: &str, default_key_env: Option<&str>| HttpEndpoint {
        base_url: table
            .base_url
            .clone()
            .unwrap_or_else(|| default_base_url.to_string()),
        api_key_env: table
            .api_key_env
            .clone()
            .or(default_key_env.map(str::to_string)),
        receive_timeout,
    };
    let (kind, model) = match provider {
        "script" => {
            if table.base_url.is_some() || table.api_key_env.is_some() {
                return Err(format!(
                    "{name} provider \"script\" takes no `base_url` or `api_key_env`"
                ));
            }
            if table.timeout.is_some() {
                return Err(format!(
                    "{name} provider \"script\" takes no `timeout` (it never waits on a server)"
                ));
            }
            let replies = table.replies.as_ref().ok_or_else(|| {
                format!("{name} provider \"script\" needs `replies`, the scripted replies file")
            })?;
            let model = table
                .model
                .clone()
                .unwrap_or_else(|| id.unwrap_or(pf_models::DEFAULT_SCRIPT_MODEL_ID).to_string());
            let replies = resolve(base_dir, replies);
            (ProviderKind::Script { replies }, model)
        }
        "openai" => (
            ProviderKind::OpenAi(endpoint(pf_models::DEFAULT_OPENAI_BASE_URL, None)),
            needs_model()?,
        ),
        "anthropic" => (
            ProviderKind::Anthropic(endpoint(
                pf_models::DEFAULT_ANTHROPIC_BASE_URL,
                Some(pf_models::DEFAULT_ANTHROPIC_KEY_ENV),
            )),
            needs_model()?,
        ),
        other => {
            return Err(format!(
            "{name} provider \"{other}\" is not known: use \"openai\", \"anthropic\" or \"script\""
        ))
        }
    };
    let spawn = match &table.spawn {
        None => {
            if table.spawn_timeout.is_some() {
                return Err(format!("{name} `spawn_timeout` applies only with `spawn`"));
            }
            None
        }
        Some(command) => Some(spawn_spec(&name, provider, command, table, base_dir)?),
    };
    let kind = match (kind, &spawn) {
        // A spawned server's address is known once it starts: `{port}` stays.
        (ProviderKind::OpenAi(endpoint), Some(_)) if table.base_url.is_none() => {
            ProviderKind::OpenAi(HttpEndpoint {
                base_url: pf_models::DEFAULT_SPAWN_BASE_URL.to_string(),
                ..endpoint
            })
        }
        (kind, _) => kind,
    };
    Ok(ProviderSpec {
        spawn,
        tool_format: match table.tool_format {
            None | Some(file::ToolFormatKey::Native) => pf_models::ToolFormat::Native,
            Some(file::ToolFormatKey::Json) => pf_models::ToolFormat::Json,
        },
        kind,
        id: id.map(str::to_string).unwrap_or_else(|| model.clone()),
        model,
        context: table.context.unwrap_or(pf_models::DEFAULT_CONTEXT),
        thinking: match table.thinking {
            None | Some(Thinking::Never) => ThinkingSupport::Never,
            Some(Thinking::Always) => ThinkingSupport::Always,
            Some(Thinking::Switchable) => ThinkingSupport::Switchable,
        },
        description: table.description.clone().unwrap_or_default(),
        record: table.record.as_ref().map(|r| resolve(base_dir, r)),
        retries: table.retries.unwrap_or(0),
        limits: pf_models::ModelLimits {
            concurrency: table.concurrency.map(file::Limit::requests),
            requests_per_minute: table.requests_per_minute.map(file::Limit::requests),
            tokens_per_minute: table.tokens_per_minute.map(|n| n.0),
        },
    })
}

/// `spawn = [...]` checked: an OpenAI-compatible provider, a command, a
/// usable timeout; a command given as a path resolves against the host
/// file's folder, where the server also starts.
fn spawn_spec(
    name: &str,
    provider: &str,
    command: &[String],
    table: &ModelTable,
    base_dir: &Path,
) -> Result<pf_models::SpawnSpec, String> {
    if provider != "openai" {
        return Err(format!(
            "{name} `spawn` needs provider \"openai\" (the spawned server must speak the OpenAI API), not \"{provider}\""
        ));
    }
    let Some(program) = command.first().filter(|p| !p.trim().is_empty()) else {
        return Err(format!(
            "{name} `spawn` must name a command, as in spawn = [\"llama-server\", \"--port\", \"{{port}}\"]"
        ));
    };
    if let Some(url) = &table.base_url {
        if !url.contains(pf_models::PORT_PLACEHOLDER) {
            return Err(format!(
                "{name} `base_url` of a spawned model must hold {{port}} (the port its server gets), or be left out for {}",
                pf_models::DEFAULT_SPAWN_BASE_URL
            ));
        }
    }
    let timeout = match table.spawn_timeout {
        None => pf_models::DEFAULT_SPAWN_TIMEOUT,
        Some(seconds) if seconds.is_finite() && seconds > 0.0 && seconds <= 86_400.0 => {
            std::time::Duration::from_secs_f64(seconds)
        }
        Some(seconds) => {
            return Err(format!(
                "{name} `spawn_timeout` must be a number of seconds above 0 and at most 86400, got {seconds}"
            ))
        }
    };
    let mut words = command.to_vec();
    if program.contains('/') {
        words[0] = resolve(base_dir, Path::new(program))
            .to_string_lossy()
            .into_owned();
    }
    Ok(pf_models::SpawnSpec {
        command: words,
        dir: std::path::absolute(base_dir).unwrap_or_else(|_| base_dir.to_path_buf()),
        timeout,
        hidden_env: Vec::new(),
    })
}

/// Every key variable the host file names, hidden from each spawned server
/// but its own model's.
fn hide_keys(config: &mut HostConfig) {
    let mut keys: Vec<String> = config
        .catalog
        .iter()
        .filter_map(|spec| match &spec.kind {
            ProviderKind::OpenAi(e) | ProviderKind::Anthropic(e) => e.api_key_env.clone(),
            ProviderKind::Script { .. } => None,
        })
        .chain(config.web.search_api_key_env.clone())
        .chain(config.mcp_token_env.clone())
        .chain(data::run_log_secret_names(config.runlog_url.as_deref()))
        .collect();
    keys.sort();
    keys.dedup();
    for spec in &mut config.catalog {
        let own = match &spec.kind {
            ProviderKind::OpenAi(e) | ProviderKind::Anthropic(e) => e.api_key_env.clone(),
            ProviderKind::Script { .. } => None,
        };
        if let Some(spawn) = &mut spec.spawn {
            spawn.hidden_env = keys
                .iter()
                .filter(|k| Some(*k) != own.as_ref())
                .cloned()
                .collect();
        }
    }
}

/// A table key as TOML writes it: bare when it can be, else quoted.
fn toml_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if bare {
        key.to_string()
    } else {
        format!("{key:?}")
    }
}

/// `path` against the host file's folder, made absolute (against the working
/// directory) so the spec means the same file wherever it is used.
fn resolve(base_dir: &Path, path: &Path) -> PathBuf {
    let joined = base_dir.join(path);
    std::path::absolute(&joined).unwrap_or(joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml_text: &str) -> Result<HostConfig, String> {
        let file: HostFile = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        HostConfig::from_file(&file, Path::new("/base"))
    }

    fn model(toml_text: &str) -> Result<ProviderSpec, String> {
        config(&format!("[model]\n{toml_text}"))?
            .catalog
            .pop()
            .ok_or_else(|| "no model".to_string())
    }

    #[test]
    fn a_script_model_gets_its_defaults_and_absolute_paths() {
        let spec = model("provider = \"script\"\nreplies = \"r.json\"\nrecord = \"q.jsonl\"\n");
        assert_eq!(
            spec,
            Ok(ProviderSpec {
                kind: ProviderKind::Script {
                    replies: "/base/r.json".into()
                },
                id: "scripted-model".into(),
                model: "scripted-model".into(),
                context: 128_000,
                thinking: ThinkingSupport::Never,
                description: String::new(),
                record: Some("/base/q.jsonl".into()),
                retries: 0,
                spawn: None,
                tool_format: pf_models::ToolFormat::Native,
                limits: Default::default(),
            })
        );
    }

    #[test]
    fn http_models_get_their_endpoint_defaults() {
        let openai = model("model = \"m\"\ncontext = 32768\nthinking = \"Switchable\"\n")
            .expect("openai is the default provider");
        assert_eq!(
            openai.kind,
            ProviderKind::OpenAi(HttpEndpoint {
                base_url: "https://api.openai.com/v1".into(),
                api_key_env: None,
                receive_timeout: None,
            })
        );
        assert_eq!(
            (openai.context, openai.thinking),
            (32_768, ThinkingSupport::Switchable)
        );
        let anthropic = model("provider = \"anthropic\"\nmodel = \"c\"\n").expect("anthropic");
        assert_eq!(
            anthropic.kind,
            ProviderKind::Anthropic(HttpEndpoint {
                base_url: "https://api.anthropic.com".into(),
                api_key_env: Some("ANTHROPIC_API_KEY".into()),
                receive_timeout: None,
            })
        );
    }

    #[test]
    fn bad_model_tables_are_refused_with_a_reason() {
        let cases = [
            (
                "provider = \"gemini\"",
                "host file: [model] provider \"gemini\" is not known: use \"openai\", \"anthropic\" or \"script\"",
            ),
            (
                "provider = \"script\"",
                "host file: [model] provider \"script\" needs `replies`, the scripted replies file",
            ),
            (
                "provider = \"anthropic\"",
                "host file: [model] provider \"anthropic\" needs `model`, the model name to request",
            ),
            (
                "",
                "host file: [model] provider \"openai\" needs `model`, the model name to request",
            ),
            (
                "model = \"m\"\nreplies = \"r.json\"",
                "host file: [model] `replies` applies only to provider \"script\", not \"openai\"",
            ),
            (
                "provider = \"script\"\nbase_url = \"http://x\"\nreplies = \"r.json\"",
                "host file: [model] provider \"script\" takes no `base_url` or `api_key_env`",
            ),
        ];
        for (table, want) in cases {
            assert_eq!(model(table), Err(want.to_string()), "{table}");
        }
    }

    #[test]
    fn unknown_keys_and_values_are_quoted() {
        let unknown = config("[model]\nprovider = \"script\"\ntemperature = 1\n").err();
        assert!(
            unknown.as_deref().is_some_and(|e| e.contains(
                "unknown field `temperature`, expected one of `provider`, `base_url`, `model`, \
                 `api_key_env`, `context`, `thinking`, `description`, `replies`, `record`, \
                 `retries`, `timeout`, `spawn`, `spawn_timeout`, `tool_format`"
            )),
            "{unknown:?}"
        );
        let thinking = config("[model]\nthinking = \"Sometimes\"\n").err();
        assert!(
            thinking.as_deref().is_some_and(|e| e.contains(
                "unknown variant `Sometimes`, expected one of `Never`, `Always`, `Switchable`"
            )),
            "{thinking:?}"
        );
        let search = config("[web]\nsearch = \"bing\"\n").err();
        assert!(
            search.as_deref().is_some_and(|e| e
                .contains("unknown variant `bing`, expected one of `gateway`, `searxng`, `brave`")),
            "{search:?}"
        );
    }

    #[test]
    fn an_mcp_timeout_is_positive_seconds() {
        let table =
            |t: &str| format!("[plugins.\"acme/kit\"]\ncommand = [\"kit\"]\ntimeout = {t}\n");
        let fast = config(&table("2.5")).expect("fractional seconds");
        assert_eq!(
            fast.plugins[0].1.timeout,
            std::time::Duration::from_millis(2500)
        );
        for bad in ["0", "-1", "1e300"] {
            let error = config(&table(bad)).expect_err("refused");
            assert!(
                error.contains("`timeout` must be a positive number of seconds"),
                "{error}"
            );
        }
        assert!(config(&table("\"10\"")).is_err());
    }

    #[test]
    fn an_mcp_server_takes_command_xor_url() {
        let stdio =
            config("[plugins.\"acme/kit\"]\ncommand = [\"kit\", \"--stdio\"]\ntrusted = true\n")
                .expect("stdio");
        assert_eq!(
            stdio.plugins,
            vec![(
                "acme/kit".to_string(),
                McpConfig {
                    transport: McpTransport::Stdio {
                        command: vec!["kit".into(), "--stdio".into()]
                    },
                    trusted: true,
                    conflicts: Vec::new(),
                    timeout: std::time::Duration::from_secs(60),
                    env: Vec::new(),
                }
            )]
        );
        let http = config("[plugins.\"acme/kit\"]\nurl = \"http://h/mcp\"\n").expect("http");
        assert_eq!(
            http.plugins[0].1.transport,
            McpTransport::Http {
                url: "http://h/mcp".into()
            }
        );
        assert_eq!(
            config("[plugins.\"acme/kit\"]\ntrusted = true\n"),
            Err("host file: [plugins.\"acme/kit\"] needs `command` (stdio) or `url` (streamable HTTP)".into())
        );
        assert_eq!(
            config("[plugins.\"acme/kit\"]\ncommand = [\"k\"]\nurl = \"http://h\"\n"),
            Err("host file: [plugins.\"acme/kit\"] takes `command` or `url`, not both".into())
        );
        assert_eq!(
            config("[plugins.\"acme/kit\"]\ncommand = []\n"),
            Err("host file: [plugins.\"acme/kit\"] `command` must name a program".into())
        );
    }

    const CATALOG: &str = "default_model = \"small\"\n\
        [models.small]\nprovider = \"script\"\nreplies = \"s.json\"\ncontext = 32768\n\
        [models.big]\nprovider = \"anthropic\"\nmodel = \"claude-x\"\nretries = 2\n\
        [ui]\ntheme = \"dark\"\n";

    #[test]
    fn a_catalog_chooses_its_current_model() {
        let c = config(CATALOG).expect("catalog");
        let ids: Vec<&str> = c.catalog.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, vec!["big", "small"]);
        assert_eq!(
            c.spec("big").map(|s| (s.model.as_str(), s.retries)),
            Some(("claude-x", 2))
        );
        assert_eq!(c.spec("small").map(|s| s.model.as_str()), Some("small"));
        assert_eq!(c.current_id(None), Ok(Some("small".into())));
        assert_eq!(c.current_id(Some("big")), Ok(Some("big".into())));
        assert_eq!(
            c.current_id(Some("huge")),
            Err("unknown model \"huge\"; the catalog has: big, small".into())
        );
        assert_eq!(
            c.ui_snapshot(Some("big")),
            Some(
                serde_json::json!({"theme": "dark", "selected_model": "big", "models": ["big", "small"]})
            )
        );
        let open = config(&CATALOG.replace("default_model = \"small\"\n", "")).expect("no default");
        assert!(open
            .current_id(None)
            .is_err_and(|e| e.contains("several models")));
        let one = config("[model]\nprovider = \"script\"\nreplies = \"r.json\"\nmodel = \"m\"\n")
            .expect("one");
        assert_eq!(one.current_id(None), Ok(Some("m".into())));
    }

    #[test]
    fn catalog_mistakes_are_named() {
        let both = config("[model]\nmodel = \"m\"\n[models.a]\nmodel = \"a\"\n");
        assert!(both
            .is_err_and(|e| e.contains("[model] and [models.ID] tables cannot both be present")));
        let stray = config("default_model = \"x\"\n[models.a]\nmodel = \"a\"\n");
        assert_eq!(
            stray,
            Err("host file: default_model \"x\" is not in the catalog; the catalog has: a".into())
        );
        let named = config("[models.\"qwen/7b\"]\nprovider = \"script\"\n");
        assert_eq!(
            named,
            Err("host file: [models.\"qwen/7b\"] provider \"script\" needs `replies`, the scripted replies file".into())
        );
        let reserved = config("[ui]\nselected_model = \"x\"\n");
        assert!(reserved.is_err_and(|e| e.contains("[ui] `selected_model` is set by the Host")));
    }

    #[test]
    fn no_host_file_means_the_defaults() {
        let defaults = HostConfig::load(None).expect("defaults");
        assert!(defaults.catalog.is_empty());
        assert_eq!(defaults.current_id(None), Ok(None));
        assert_eq!(defaults.ui_snapshot(None), None);
        assert_eq!(defaults.web, WebConfig::default());
        assert!(defaults.plugins.is_empty());
        assert_eq!(defaults.answers, None);
    }
}
