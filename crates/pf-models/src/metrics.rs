//! The metadata parts of a completion response, each decoded on its own
//! (guide ch. 16, "Degraded metadata" and "Model call metrics"): `usage`,
//! llama.cpp's `timings` and vLLM's `metrics`. A malformed part is dropped and
//! reported once, in the guide's words with the decoder's reason; the other
//! parts are kept and the reply still arrives. A part left out (or `null`)
//! reports nothing.

use pf_harness::{LlamaTimings, Usage, VllmMetrics};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{Map, Value as Json};

/// The three metadata parts of one reply and the problems found with them.
#[derive(Debug, Default)]
pub(crate) struct Metadata {
    pub usage: Option<Usage>,
    pub llama: Option<LlamaTimings>,
    pub vllm: Option<VllmMetrics>,
    /// One message per malformed part, in the order found.
    pub degraded: Vec<String>,
}

/// A metadata part's key in the response, as the message names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Usage,
    Timings,
    Metrics,
}

impl Part {
    fn key(self) -> &'static str {
        match self {
            Part::Usage => "usage",
            Part::Timings => "timings",
            Part::Metrics => "metrics",
        }
    }
}

impl Metadata {
    /// Whether `part` was already found malformed (a stream reports it once
    /// and keeps it dropped).
    fn is_bad(&self, part: Part) -> bool {
        let prefix = format!("malformed `{}` ", part.key());
        self.degraded.iter().any(|m| m.starts_with(&prefix))
    }

    /// Decode `root[part]` as `T`: `None` when absent, null, or malformed
    /// (then reported, once per part).
    fn decode<T: DeserializeOwned>(&mut self, root: &Map<String, Json>, part: Part) -> Option<T> {
        let value = root.get(part.key()).filter(|v| !v.is_null())?;
        if self.is_bad(part) {
            return None;
        }
        match T::deserialize(value) {
            Ok(decoded) => Some(decoded),
            Err(error) => {
                self.degraded.push(format!(
                    "malformed `{}` in completion response ignored: {error}",
                    part.key()
                ));
                None
            }
        }
    }

    /// llama.cpp's `timings` and vLLM's `metrics`, the same in whole replies
    /// and stream chunks (the last chunk that has one wins). A part found
    /// malformed once stays dropped.
    pub fn read_backend_parts(&mut self, root: &Map<String, Json>) {
        if let Some(timings) = self.decode::<WireTimings>(root, Part::Timings) {
            self.llama = Some(timings.into());
        }
        if let Some(metrics) = self.decode::<WireVllmMetrics>(root, Part::Metrics) {
            self.vllm = Some(metrics.into());
        }
        if self.is_bad(Part::Timings) {
            self.llama = None;
        }
        if self.is_bad(Part::Metrics) {
            self.vllm = None;
        }
    }

    /// A chat-completions response (or stream chunk): OpenAI's `usage`
    /// (`prompt_tokens_details.cached_tokens`,
    /// `completion_tokens_details.reasoning_tokens`), then `timings`, `metrics`.
    pub fn read_chat_completions(&mut self, root: &Map<String, Json>) {
        if let Some(usage) = self.decode::<ChatUsage>(root, Part::Usage) {
            self.usage = Some(usage.into());
        }
        if self.is_bad(Part::Usage) {
            self.usage = None;
        }
        self.read_backend_parts(root);
    }

    /// A whole Anthropic Messages response: `usage` with both counts, then
    /// `timings`, `metrics` (a compatible server may send them).
    pub fn read_anthropic(&mut self, root: &Map<String, Json>) {
        if let Some(usage) = self.decode::<AnthropicUsage>(root, Part::Usage) {
            self.usage = Some(usage.into());
        }
        self.read_backend_parts(root);
    }

    /// One Anthropic stream event's `usage` (`message_start` has the input
    /// count, `message_delta` the running output count): every field
    /// optional, later values win.
    pub fn read_anthropic_stream_usage(
        &mut self,
        event: &Map<String, Json>,
        so_far: &mut AnthropicStreamUsage,
    ) {
        if let Some(usage) = self.decode::<AnthropicStreamUsage>(event, Part::Usage) {
            so_far.merge(usage);
        }
    }

    /// The usage an Anthropic stream added up to, unless it was malformed.
    pub fn finish_anthropic_stream(&mut self, so_far: AnthropicStreamUsage) {
        if !self.is_bad(Part::Usage) {
            self.usage = so_far.into_usage();
        }
    }
}

/// OpenAI's `usage`. The names in decoder messages are the wire's own.
#[derive(Debug, Deserialize)]
#[serde(expecting = "an object")]
struct ChatUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
    #[serde(default)]
    prompt_tokens_details: Option<PromptTokensDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Debug, Deserialize)]
#[serde(expecting = "an object")]
struct PromptTokensDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(expecting = "an object")]
struct CompletionTokensDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl From<ChatUsage> for Usage {
    fn from(u: ChatUsage) -> Usage {
        Usage {
            input_tokens: u.prompt_tokens,
            output_tokens: u.completion_tokens,
            cached_tokens: u.prompt_tokens_details.and_then(|d| d.cached_tokens),
            reasoning_tokens: u.completion_tokens_details.and_then(|d| d.reasoning_tokens),
        }
    }
}

/// Anthropic's `usage`: `input_tokens` counts only the uncached part, so the
/// prompt's tokens are it plus the cache reads and writes, and the cache reads
/// are the cached tokens. Anthropic reports no reasoning count.
#[derive(Debug, Deserialize)]
#[serde(expecting = "an object")]
struct AnthropicUsage {
    input_tokens: u64,
    output_tokens: u64,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

impl From<AnthropicUsage> for Usage {
    fn from(u: AnthropicUsage) -> Usage {
        AnthropicStreamUsage {
            input_tokens: Some(u.input_tokens),
            output_tokens: Some(u.output_tokens),
            cache_read_input_tokens: u.cache_read_input_tokens,
            cache_creation_input_tokens: u.cache_creation_input_tokens,
        }
        .into_usage()
        .unwrap_or_default()
    }
}

/// Anthropic's `usage` as stream events carry it, every count optional.
#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "an object")]
pub(crate) struct AnthropicStreamUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
}

impl AnthropicStreamUsage {
    fn merge(&mut self, later: AnthropicStreamUsage) {
        self.input_tokens = later.input_tokens.or(self.input_tokens);
        self.output_tokens = later.output_tokens.or(self.output_tokens);
        self.cache_read_input_tokens = later
            .cache_read_input_tokens
            .or(self.cache_read_input_tokens);
        self.cache_creation_input_tokens = later
            .cache_creation_input_tokens
            .or(self.cache_creation_input_tokens);
    }

    fn into_usage(self) -> Option<Usage> {
        if self.input_tokens.is_none() && self.output_tokens.is_none() {
            return None;
        }
        let uncached = self.input_tokens.unwrap_or(0);
        let input_tokens = uncached
            .saturating_add(self.cache_read_input_tokens.unwrap_or(0))
            .saturating_add(self.cache_creation_input_tokens.unwrap_or(0));
        Some(Usage {
            input_tokens,
            output_tokens: self.output_tokens.unwrap_or(0),
            cached_tokens: self.cache_read_input_tokens,
            reasoning_tokens: None,
        })
    }
}

/// llama.cpp's `timings`. The draft counts are sent only while speculative
/// decoding runs; without it none were proposed, so they read 0.
#[derive(Debug, Deserialize)]
#[serde(expecting = "an object")]
struct WireTimings {
    prompt_n: u64,
    prompt_ms: f64,
    prompt_per_second: f64,
    predicted_n: u64,
    predicted_ms: f64,
    predicted_per_second: f64,
    #[serde(default)]
    draft_n: u64,
    #[serde(default)]
    draft_n_accepted: u64,
}

impl From<WireTimings> for LlamaTimings {
    fn from(t: WireTimings) -> LlamaTimings {
        LlamaTimings {
            prompt_n: t.prompt_n,
            prompt_ms: t.prompt_ms,
            prompt_per_second: t.prompt_per_second,
            predicted_n: t.predicted_n,
            predicted_ms: t.predicted_ms,
            predicted_per_second: t.predicted_per_second,
            draft_n: t.draft_n,
            draft_n_accepted: t.draft_n_accepted,
        }
    }
}

/// vLLM's per-request `metrics`: each field a number, or left out (or null)
/// when vLLM did not measure it.
#[derive(Debug, Deserialize)]
#[serde(expecting = "an object")]
struct WireVllmMetrics {
    #[serde(default)]
    time_to_first_token_ms: Option<f64>,
    #[serde(default)]
    generation_time_ms: Option<f64>,
    #[serde(default)]
    queue_time_ms: Option<f64>,
    #[serde(default)]
    mean_itl_ms: Option<f64>,
    #[serde(default)]
    tokens_per_second: Option<f64>,
}

impl From<WireVllmMetrics> for VllmMetrics {
    fn from(m: WireVllmMetrics) -> VllmMetrics {
        VllmMetrics {
            time_to_first_token_ms: m.time_to_first_token_ms,
            generation_time_ms: m.generation_time_ms,
            queue_time_ms: m.queue_time_ms,
            mean_itl_ms: m.mean_itl_ms,
            tokens_per_second: m.tokens_per_second,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(body: Json) -> Metadata {
        let mut m = Metadata::default();
        if let Json::Object(root) = body {
            m.read_chat_completions(&root);
        }
        m
    }

    #[test]
    fn a_string_count_is_reported_in_the_decoders_words() {
        let m = read(json!({"usage": {"prompt_tokens": "lots", "completion_tokens": 1}}));
        assert_eq!(m.usage, None);
        assert_eq!(
            m.degraded,
            vec![
                "malformed `usage` in completion response ignored: invalid type: string \"lots\", expected u64"
            ]
        );
    }

    #[test]
    fn parts_are_checked_independently_and_absent_parts_report_nothing() {
        let m = read(json!({
            "usage": {"prompt_tokens": 3, "completion_tokens": 4},
            "timings": {"prompt_n": 1},
            "metrics": null,
        }));
        assert_eq!(m.usage.map(|u| u.input_tokens), Some(3));
        assert_eq!(m.llama, None);
        assert_eq!(m.vllm, None);
        assert_eq!(
            m.degraded,
            vec!["malformed `timings` in completion response ignored: missing field `prompt_ms`"]
        );
    }

    #[test]
    fn a_part_malformed_in_one_chunk_is_reported_once_and_stays_dropped() {
        let mut m = Metadata::default();
        for chunk in [
            json!({"timings": 5}),
            json!({"timings": {"prompt_n": 1, "prompt_ms": 1, "prompt_per_second": 1,
                "predicted_n": 1, "predicted_ms": 1, "predicted_per_second": 1}}),
        ] {
            if let Json::Object(root) = chunk {
                m.read_chat_completions(&root);
            }
        }
        assert_eq!(m.llama, None);
        assert_eq!(
            m.degraded,
            vec!["malformed `timings` in completion response ignored: invalid type: integer `5`, expected an object"]
        );
    }
}
