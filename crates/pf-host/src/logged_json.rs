//! Host work as the run log keeps it: the JSON the recorders write and the
//! replayers compare against (a leaf both use).

use pf_harness::{ChatRequest, ToolSpec};
use serde_json::{json, Value as Json};

/// The request as the log keeps it: the Harness request's own fields.
pub fn request_json(request: &ChatRequest) -> Json {
    let mut body = serde_json::Map::new();
    body.insert("messages".into(), json!(request.messages));
    if let Some(tools) = &request.tools {
        body.insert("tools".into(), json!(tools));
    }
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(m) = request.max_tokens {
        body.insert("max_tokens".into(), json!(m));
    }
    if let Some(t) = request.thinking {
        body.insert("thinking".into(), json!(t));
    }
    Json::Object(body)
}

/// A tool spec as the run log keeps it.
pub fn tool_spec_json(spec: &ToolSpec) -> Json {
    json!({
        "path": spec.path,
        "description": spec.description,
        "parameters": spec.parameters,
        "structured": spec.structured,
        "trusted": spec.trusted,
    })
}
