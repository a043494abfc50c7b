//! The host file (TOML): the only place that knows its shape.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pf_harness::{Harness, HostServices, ModelProvider};
use pf_models::ModelConfig;
use pf_plugins::{
    FixedAnswersBroker, McpConfig, McpPlugin, SearchBackend, StdinInputBroker, WebConfig, WebPlugin,
};
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostFile {
    pub model: Option<ModelConfig>,
    pub web: Option<WebSection>,
    pub plugins: Option<BTreeMap<String, PluginSection>>,
    pub input: Option<InputSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebSection {
    pub search: Option<SearchBackend>,
    pub search_url: Option<String>,
    pub search_api_key_env: Option<String>,
    pub allow_loopback: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSection {
    pub command: Option<Vec<String>>,
    pub url: Option<String>,
    pub trusted: Option<bool>,
    pub conflicts: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputSection {
    pub answers: Option<Vec<String>>,
}

/// What the Host sets up from its host file.
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

/// Read and parse a host file; errors name the file and the problem.
pub fn load(path: Option<&Path>) -> Result<HostFile, String> {
    let Some(path) = path else {
        return Ok(HostFile::default());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read host file {}: {e}", path.display()))?;
    toml::from_str::<HostFile>(&text)
        .map_err(|e| format!("host file {}: {}", path.display(), e.to_string().trim_end()))
}

/// Register the Plugins and services the host file describes, and build the model provider.
pub fn build(file: &HostFile, base_dir: &Path) -> Result<Host, String> {
    let mut harness = Harness::new();
    let web = file.web.as_ref();
    harness.register(Arc::new(WebPlugin::new(WebConfig {
        search: web.and_then(|w| w.search).unwrap_or_default(),
        search_url: web.and_then(|w| w.search_url.clone()),
        search_api_key_env: web.and_then(|w| w.search_api_key_env.clone()),
        allow_loopback: web.and_then(|w| w.allow_loopback).unwrap_or(false),
    })));
    if let Some(plugins) = &file.plugins {
        for (id, p) in plugins {
            if p.command.is_none() && p.url.is_none() {
                return Err(format!("host file: [plugins.\"{id}\"] needs `command` (stdio) or `url` (streamable HTTP)"));
            }
            if p.command.is_some() && p.url.is_some() {
                return Err(format!(
                    "host file: [plugins.\"{id}\"] takes `command` or `url`, not both"
                ));
            }
            if let Some(cmd) = &p.command {
                if cmd.is_empty() {
                    return Err(format!(
                        "host file: [plugins.\"{id}\"] `command` must name a program"
                    ));
                }
            }
            harness.register(Arc::new(McpPlugin::new(
                id.clone(),
                McpConfig {
                    command: p.command.clone(),
                    url: p.url.clone(),
                    trusted: p.trusted.unwrap_or(false),
                    conflicts: p.conflicts.clone().unwrap_or_default(),
                    ..McpConfig::default()
                },
            )));
        }
    }
    let broker: Arc<dyn pf_harness::InputBroker> =
        match file.input.as_ref().and_then(|i| i.answers.clone()) {
            Some(answers) => Arc::new(FixedAnswersBroker::new(answers)),
            None => Arc::new(StdinInputBroker::new()),
        };
    harness.services = HostServices {
        input_broker: Some(broker),
    };
    let model = match &file.model {
        Some(cfg) => {
            Some(pf_models::build_provider(cfg, base_dir).map_err(|e| format!("host file: {e}"))?)
        }
        None => None,
    };
    Ok(Host { harness, model })
}
