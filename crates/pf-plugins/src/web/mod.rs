//! The first-party `promptforge/web` Plugin: `fetch` and `search`.

mod extract;
mod fetch;
mod policy;
mod search;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pf_harness::{
    ActivationContext, ActivePlugin, CancellationToken, Plugin, ToolFailure, ToolSpec, WorkId,
};
use serde_json::{json, Value as Json};

pub use fetch::USER_AGENT as FETCH_USER_AGENT;

/// The Plugin id.
pub const WEB_PLUGIN_ID: &str = "promptforge/web";
/// The fetch tool's path.
pub const FETCH_TOOL: &str = "promptforge/web/fetch";
/// The search tool's path.
pub const SEARCH_TOOL: &str = "promptforge/web/search";

const FETCH_DESCRIPTION: &str = "Fetch a web page and return its main content as markdown.";
const SEARCH_DESCRIPTION: &str =
    "Search the web and return a list of results (title, url, description).";

/// Which service answers `search`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SearchBackend {
    /// POSTs the validated arguments as JSON to `search_url`; expects `{"results":[...]}`.
    #[default]
    Gateway,
    /// A SearXNG instance: GET `{search_url}?q=..&format=json`.
    Searxng,
    /// Brave Search's web API, keyed by `X-Subscription-Token`.
    Brave,
}

impl SearchBackend {
    /// The backend named `gateway`, `searxng` or `brave`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "gateway" => Some(SearchBackend::Gateway),
            "searxng" => Some(SearchBackend::Searxng),
            "brave" => Some(SearchBackend::Brave),
            _ => None,
        }
    }
}

/// How the Host configured the web Plugin.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebConfig {
    pub search: SearchBackend,
    /// The backend's address (required for `gateway` and `searxng`).
    pub search_url: Option<String>,
    /// The NAME of the environment variable holding the search key, never the key.
    pub search_api_key_env: Option<String>,
    /// Tests only: lets fetch reach 127.0.0.0/8 and ::1 (over http too, on any port).
    pub allow_loopback: bool,
}

/// The fetch policy's numbers; the defaults are the built-in policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchLimits {
    /// Most characters one fetch returns (and the schema's `max_chars` maximum).
    pub max_chars: usize,
    /// Body byte cap.
    pub body_cap: usize,
    pub max_redirects: usize,
    pub connect_timeout: Duration,
    /// Limit on one request, body included.
    pub request_timeout: Duration,
    /// Limit on one search call.
    pub search_timeout: Duration,
}

impl Default for FetchLimits {
    fn default() -> Self {
        FetchLimits {
            max_chars: 40_000,
            body_cap: 8 * 1024 * 1024,
            max_redirects: 5,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(20),
            search_timeout: Duration::from_secs(30),
        }
    }
}

/// Name lookup for fetch; every answer is vetted before use.
#[async_trait]
pub trait HostResolver: Send + Sync {
    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<IpAddr>>;
}

/// The operating system's resolver.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

#[async_trait]
impl HostResolver for SystemResolver {
    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<IpAddr>> {
        let addresses = tokio::net::lookup_host((host, port)).await?;
        Ok(addresses.map(|a| a.ip()).collect())
    }
}

/// The `promptforge/web` Plugin.
pub struct WebPlugin {
    config: WebConfig,
    limits: FetchLimits,
    resolver: Arc<dyn HostResolver>,
}

impl WebPlugin {
    pub fn new(config: WebConfig) -> Self {
        WebPlugin {
            config,
            limits: FetchLimits::default(),
            resolver: Arc::new(SystemResolver),
        }
    }

    /// Replaces the built-in policy numbers.
    pub fn with_limits(mut self, limits: FetchLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Replaces the system resolver (tests, or a host with its own DNS).
    pub fn with_resolver(mut self, resolver: Arc<dyn HostResolver>) -> Self {
        self.resolver = resolver;
        self
    }
}

#[async_trait]
impl Plugin for WebPlugin {
    fn id(&self) -> &str {
        WEB_PLUGIN_ID
    }

    async fn activate(&self, _ctx: ActivationContext) -> Result<Arc<dyn ActivePlugin>, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(self.limits.connect_timeout)
            .build()
            .map_err(|e| format!("cannot build the search client: {e}"))?;
        Ok(Arc::new(ActiveWeb {
            fetcher: fetch::Fetcher {
                limits: self.limits.clone(),
                allow_loopback: self.config.allow_loopback,
                resolver: self.resolver.clone(),
            },
            searcher: search::Searcher {
                backend: self.config.search,
                url: self.config.search_url.clone(),
                key_env: self.config.search_api_key_env.clone(),
                timeout: self.limits.search_timeout,
                client,
            },
        }))
    }
}

struct ActiveWeb {
    fetcher: fetch::Fetcher,
    searcher: search::Searcher,
}

/// The fetch tool's argument schema.
fn fetch_schema(max_chars: usize) -> Json {
    json!({
        "type": "object",
        "properties": {
            "url": {"type": "string", "description": "The https URL of the page to fetch."},
            "max_chars": {
                "type": "integer",
                "minimum": 1,
                "maximum": max_chars,
                "description": "Return at most this many characters."
            },
            "raw": {
                "type": "boolean",
                "description": "Render the whole HTML page instead of extracting the main article."
            }
        },
        "required": ["url"],
        "additionalProperties": false
    })
}

/// The search tool's eight-field argument schema.
fn search_schema() -> Json {
    let domains = |what: &str| {
        json!({
            "type": "array",
            "items": {"type": "string"},
            "maxItems": 20,
            "description": what
        })
    };
    json!({
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 400, "description": "The search text."},
            "count": {"type": "integer", "minimum": 1, "maximum": 20, "description": "How many results to return."},
            "freshness": {"type": "string", "enum": ["pd", "pw", "pm", "py"], "description": "Only results from the past day, week, month or year."},
            "country": {"type": "string", "minLength": 1, "maxLength": 128, "description": "Country code to target."},
            "search_lang": {"type": "string", "minLength": 1, "maxLength": 128, "description": "Language code of the results."},
            "safesearch": {"type": "string", "enum": ["off", "moderate", "strict"], "description": "SafeSearch filtering level."},
            "include_domains": domains("Only return results from these hostnames."),
            "exclude_domains": domains("Never return results from these hostnames.")
        },
        "required": ["query"],
        "additionalProperties": false
    })
}

#[async_trait]
impl ActivePlugin for ActiveWeb {
    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            ToolSpec {
                path: FETCH_TOOL.into(),
                description: FETCH_DESCRIPTION.into(),
                parameters: fetch_schema(self.fetcher.limits.max_chars),
                structured: false,
                trusted: false,
            },
            ToolSpec {
                path: SEARCH_TOOL.into(),
                description: SEARCH_DESCRIPTION.into(),
                parameters: search_schema(),
                structured: false,
                trusted: false,
            },
        ]
    }

    async fn call(
        &self,
        path: &str,
        arguments: Json,
        _work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<String, ToolFailure> {
        let (work, cancelled): (_, &str) = match path {
            FETCH_TOOL => (
                futures::future::Either::Left(self.fetcher.fetch(&arguments)),
                "web_fetch: cancelled",
            ),
            SEARCH_TOOL => (
                futures::future::Either::Right(self.searcher.search(&arguments)),
                "web_search: cancelled",
            ),
            other => return Err(ToolFailure(format!("unknown tool {other}"))),
        };
        tokio::select! {
            outcome = work => outcome,
            _ = cancel.cancelled() => Err(ToolFailure(cancelled.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_go_by_their_lowercase_names() {
        assert_eq!(
            SearchBackend::from_name("brave"),
            Some(SearchBackend::Brave)
        );
        assert_eq!(SearchBackend::from_name("Brave"), None);
    }
}
