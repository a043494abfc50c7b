//! The Host's configuration and its assembly, in one place.
//!
//! [`HostConfig::load`] reads the host file ([`file`]: its TOML shape) and
//! checks it whole: defaults applied, paths resolved against the host file's
//! folder, cross-key rules (`command` xor `url`, `replies` only for scripts)
//! enforced, each error quoting the keys. [`HostConfig::assemble`] then builds
//! the [`Host`] every command runs against: the model provider, the Harness
//! with its Plugins, and the Host services, wrapped in the decorators
//! [`HostWork`] asks for ([`record`]: the run log's recorders).
//! [`data`] finds the run log; [`observe`] is the Host's one run observer.

pub mod data;
pub mod file;
pub mod observe;
pub mod record;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pf_harness::{Harness, HostServices, InputBroker, ModelProvider, Plugin, ThinkingSupport};
use pf_models::{HttpEndpoint, ProviderKind, ProviderSpec};
use pf_plugins::{
    FixedAnswersBroker, McpConfig, McpPlugin, McpTransport, SearchBackend, StdinInputBroker,
    WebConfig, WebPlugin,
};

use file::{HostFile, ModelTable, PluginTable, Search, Thinking};
pub use record::HostWork;
use record::{RecordingBroker, RecordingModel, RecordingPlugin};

/// What the host file configures, checked and resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct HostConfig {
    /// The current model; `None` when the host file has no `[model]`.
    pub model: Option<ProviderSpec>,
    pub web: WebConfig,
    /// MCP servers offered as Plugins, by Plugin id (in id order).
    pub plugins: Vec<(String, McpConfig)>,
    /// Fixed operator answers; `None` asks on stdin.
    pub answers: Option<Vec<String>>,
    /// `[telemetry] otlp`: the OTLP/HTTP collector runs are exported to.
    pub otlp: Option<String>,
}

/// What a command runs against: the model and the Harness (Plugins and services).
pub struct Host {
    pub harness: Harness,
    pub model: Option<Arc<dyn ModelProvider>>,
}

/// Where the host file comes from when `--host` is not given.
pub fn default_host_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PROMPTFORGE_HOST") {
        if !p.is_empty() {
            return Some(PathBuf::from(p));
        }
    }
    let home = std::env::var_os("HOME")?;
    let p = Path::new(&home).join(".config/promptforge/host.toml");
    p.is_file().then_some(p)
}

impl HostConfig {
    /// Read and check the host file at `path`; no file means the defaults
    /// (no model, the web Plugin with its defaults, answers from stdin).
    pub fn load(path: Option<&Path>) -> Result<HostConfig, String> {
        let Some(path) = path else {
            return HostConfig::from_file(&HostFile::default(), Path::new("."));
        };
        let base_dir = path.parent().unwrap_or(Path::new("."));
        HostConfig::from_file(&file::read(path)?, base_dir)
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
        let model = match &file.model {
            Some(table) => {
                Some(provider_spec(table, base_dir).map_err(|e| format!("host file: {e}"))?)
            }
            None => None,
        };
        let otlp = file.telemetry.as_ref().and_then(|t| t.otlp.clone());
        if let Some(url) = &otlp {
            crate::trace::otlp::traces_url(url)
                .map_err(|e| format!("host file: [telemetry] otlp: {e}"))?;
        }
        Ok(HostConfig {
            model,
            web,
            plugins,
            answers: file.input.as_ref().and_then(|i| i.answers.clone()),
            otlp,
        })
    }

    /// Build the Host: register the Plugins and services and start the model
    /// provider. Call it inside the async runtime the run will use.
    pub fn assemble(&self) -> Result<Host, String> {
        self.assemble_for(&HostWork::Direct)
    }

    /// [`assemble`](HostConfig::assemble), with every piece of host work
    /// (model rounds, tool calls, operator answers) going through the
    /// decorators `work` names. The one place they are installed, for every
    /// command that runs prompts.
    pub fn assemble_for(&self, work: &HostWork) -> Result<Host, String> {
        let mut harness = Harness::new();
        let mut plugins: Vec<Arc<dyn Plugin>> = vec![Arc::new(WebPlugin::new(self.web.clone()))];
        for (id, config) in &self.plugins {
            plugins.push(Arc::new(McpPlugin::new(id.clone(), config.clone())));
        }
        for plugin in plugins {
            harness.register(match work {
                HostWork::Direct => plugin,
                HostWork::Recorded(r) => Arc::new(RecordingPlugin::new(plugin, Arc::clone(r))),
            });
        }
        let broker: Arc<dyn InputBroker> = match &self.answers {
            Some(answers) => Arc::new(FixedAnswersBroker::new(answers.clone())),
            None => Arc::new(StdinInputBroker::new()),
        };
        let broker: Arc<dyn InputBroker> = match work {
            HostWork::Direct => broker,
            HostWork::Recorded(r) => Arc::new(RecordingBroker::new(broker, Arc::clone(r))),
        };
        harness.services = HostServices {
            input_broker: Some(broker),
        };
        let model = match &self.model {
            Some(spec) => {
                Some(pf_models::build_provider(spec).map_err(|e| format!("host file: {e}"))?)
            }
            None => None,
        };
        let model = match (model, work) {
            (Some(model), HostWork::Recorded(r)) => {
                Some(Arc::new(RecordingModel::new(model, Arc::clone(r))) as Arc<dyn ModelProvider>)
            }
            (model, _) => model,
        };
        Ok(Host { harness, model })
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
    Ok(McpConfig {
        transport,
        trusted: table.trusted.unwrap_or(false),
        conflicts: table.conflicts.clone().unwrap_or_default(),
    })
}

/// `[model]` with its defaults: a missing `provider` means `"openai"`; `model`
/// is required for the HTTP providers, and a scripted model's id defaults to
/// [`pf_models::DEFAULT_SCRIPT_MODEL_ID`].
fn provider_spec(table: &ModelTable, base_dir: &Path) -> Result<ProviderSpec, String> {
    let provider = table.provider.as_deref().unwrap_or("openai");
    if matches!(provider, "openai" | "anthropic") && table.replies.is_some() {
        return Err(format!(
            "[model] `replies` applies only to provider \"script\", not \"{provider}\""
        ));
    }
    let needs_model = || {
        table.model.clone().ok_or_else(|| {
            format!("[model] provider \"{provider}\" needs `model`, the model name to request")
        })
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
    };
    let (kind, model) = match provider {
        "script" => {
            if table.base_url.is_some() || table.api_key_env.is_some() {
                return Err(
                    "[model] provider \"script\" takes no `base_url` or `api_key_env`".to_string(),
                );
            }
            let replies = table
                .replies
                .as_ref()
                .ok_or("[model] provider \"script\" needs `replies`, the scripted replies file")?;
            let model = table
                .model
                .clone()
                .unwrap_or_else(|| pf_models::DEFAULT_SCRIPT_MODEL_ID.to_string());
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
                "[model] provider \"{other}\" is not known: use \"openai\", \"anthropic\" or \"script\""
            ))
        }
    };
    Ok(ProviderSpec {
        kind,
        model,
        context: table.context.unwrap_or(pf_models::DEFAULT_CONTEXT),
        thinking: match table.thinking {
            None | Some(Thinking::Never) => ThinkingSupport::Never,
            Some(Thinking::Always) => ThinkingSupport::Always,
            Some(Thinking::Switchable) => ThinkingSupport::Switchable,
        },
        description: table.description.clone().unwrap_or_default(),
        record: table.record.as_ref().map(|r| resolve(base_dir, r)),
    })
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
            .model
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
                model: "scripted-model".into(),
                context: 128_000,
                thinking: ThinkingSupport::Never,
                description: String::new(),
                record: Some("/base/q.jsonl".into()),
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
                 `api_key_env`, `context`, `thinking`, `description`, `replies`, `record`"
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

    #[test]
    fn no_host_file_means_the_defaults() {
        let defaults = HostConfig::load(None).expect("defaults");
        assert_eq!(defaults.model, None);
        assert_eq!(defaults.web, WebConfig::default());
        assert!(defaults.plugins.is_empty());
        assert_eq!(defaults.answers, None);
    }
}
