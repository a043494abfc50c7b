//! First-party Plugins and Host services for promptforge:
//!
//! - [`WebPlugin`]: `promptforge/web` with the tools `fetch` and `search`;
//! - [`McpPlugin`]: an MCP server (stdio or streamable HTTP) offered as a Plugin;
//! - [`FixedAnswersBroker`] and [`StdinInputBroker`]: the `promptforge/input-broker` service.

mod input;
mod mcp;
mod web;

pub use input::{FixedAnswersBroker, StdinInputBroker};
pub use mcp::{
    kill_live_mcp_servers, McpConfig, McpPlugin, McpTransport, ACTIVATION_CANCELLED,
    DEFAULT_CALL_TIMEOUT, DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_START_TIMEOUT,
};
pub use web::{
    FetchLimits, HostResolver, SearchBackend, SystemResolver, WebConfig, WebPlugin, FETCH_TOOL,
    FETCH_USER_AGENT, SEARCH_TOOL, WEB_PLUGIN_ID,
};
