//! A response cache for evaluations (`promptforge test --cache`): a model
//! round whose request (catalog model, messages, tools, options) is exactly
//! one an earlier run logged with a good answer is answered from the log
//! without contacting the server.
//!
//! It is a decorator at the model-provider seam ([`CachingModel`]), beside
//! the replay's: the Engine never knows. It sits inside metering and
//! recording, so a cached round still counts its tokens and is logged in
//! the new run like any other (the run stays replayable), and its tokens are
//! also tallied as saved ([`CacheTally`]). The key holds the catalog id, so
//! an answer never crosses models; it holds the whole request, so a prompt
//! edit that changes what is sent is never answered from an older version.
//!
//! [`ask_once`] makes a request outside any prompt (a test's `judge:`), logged
//! as a run of its own and answered from the cache the same way.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use pf_harness::{
    CancellationToken, ChatRequest, ChatResponse, ModelInfo, ModelProvider, OnText, ProviderError,
    WorkId,
};
use pf_runlog::{ExchangeRecord, RunFilter, RunLog, RunStart, TokenUsage};
use serde_json::Value as Json;

use crate::logged_json::request_json;
use crate::record::{provider_error_text, response_json};

/// Logged answers by (catalog id, the request's canonical JSON text).
#[derive(Debug, Default)]
pub struct ResponseCache {
    answers: HashMap<(String, String), Json>,
}

impl ResponseCache {
    /// Every good answer (no error, a response) in the logged runs of the
    /// prompts whose logged path contains one of `prompt_paths`. The newest
    /// answer to a request wins. This is the cache's one read of the log.
    pub fn from_log(log: &RunLog, prompt_paths: &[String]) -> Result<ResponseCache, String> {
        let mut cache = ResponseCache::default();
        let mut seen = std::collections::BTreeSet::new();
        for path in prompt_paths {
            let runs = log
                .list_runs(&RunFilter {
                    prompt: Some(path.clone()),
                    ..RunFilter::default()
                })
                .map_err(|e| e.to_string())?;
            // Newest first: insert oldest first so the newest answer stays.
            for run in runs.into_iter().rev() {
                if !seen.insert(run.id.0) {
                    continue;
                }
                for x in log.exchanges(run.id).map_err(|e| e.to_string())? {
                    if let (None, Some(response)) = (&x.error, x.response) {
                        cache
                            .answers
                            .insert((x.model, canonical(&x.request)), response);
                    }
                }
            }
        }
        Ok(cache)
    }

    /// How many distinct requests it can answer.
    pub fn len(&self) -> usize {
        self.answers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }

    /// The logged answer to `request` sent to catalog model `model`.
    pub fn answer(&self, model: &str, request: &ChatRequest) -> Option<ChatResponse> {
        let key = (model.to_string(), canonical(&request_json(request)));
        self.answers.get(&key).map(crate::replay::response_of)
    }
}

/// JSON text with every object's keys in sorted order, so two equal values
/// give one text however their keys were ordered when logged.
fn canonical(value: &Json) -> String {
    fn write(value: &Json, out: &mut String) {
        match value {
            Json::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (at, key) in keys.into_iter().enumerate() {
                    if at > 0 {
                        out.push(',');
                    }
                    out.push_str(&Json::String(key.clone()).to_string());
                    out.push(':');
                    write(&map[key], out);
                }
                out.push('}');
            }
            Json::Array(items) => {
                out.push('[');
                for (at, item) in items.iter().enumerate() {
                    if at > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// What one run's cached rounds would have cost: the rounds answered from
/// the cache and the tokens their logged answers reported.
#[derive(Debug, Default)]
pub struct CacheTally {
    rounds: AtomicU64,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
}

impl CacheTally {
    fn add(&self, response: &ChatResponse) {
        self.rounds.fetch_add(1, Ordering::Relaxed);
        if let Some(usage) = &response.usage {
            self.input_tokens
                .fetch_add(usage.input_tokens, Ordering::Relaxed);
            self.output_tokens
                .fetch_add(usage.output_tokens, Ordering::Relaxed);
        }
    }

    /// Rounds answered from the cache.
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }

    /// `(input, output)` tokens of the cached answers.
    pub fn tokens(&self) -> (u64, u64) {
        (
            self.input_tokens.load(Ordering::Relaxed),
            self.output_tokens.load(Ordering::Relaxed),
        )
    }
}

/// The cache one run uses, and its own tally.
#[derive(Debug, Clone)]
pub struct CacheUse {
    pub cache: Arc<ResponseCache>,
    pub tally: Arc<CacheTally>,
}

impl CacheUse {
    /// A fresh tally over `cache`.
    pub fn new(cache: Arc<ResponseCache>) -> CacheUse {
        CacheUse {
            cache,
            tally: Arc::new(CacheTally::default()),
        }
    }
}

/// The model provider, answering a round the cache holds.
pub struct CachingModel {
    inner: Arc<dyn ModelProvider>,
    cache: CacheUse,
    model: String,
    /// The model's record file (`record`): a cached request is appended as
    /// the provider would have, so what a run asked reads the same.
    record: Option<pf_models::RecordFile>,
}

impl CachingModel {
    pub fn new(
        inner: Arc<dyn ModelProvider>,
        cache: CacheUse,
        record: Option<&std::path::Path>,
    ) -> CachingModel {
        let model = inner.info().id;
        CachingModel {
            inner,
            cache,
            model,
            record: record.map(pf_models::RecordFile::new),
        }
    }

    fn cached(&self, request: &ChatRequest) -> Result<Option<ChatResponse>, ProviderError> {
        let Some(response) = self.cache.cache.answer(&self.model, request) else {
            return Ok(None);
        };
        if let Some(record) = &self.record {
            record.append(&self.model, request)?;
        }
        self.cache.tally.add(&response);
        Ok(Some(response))
    }
}

#[async_trait]
impl ModelProvider for CachingModel {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }

    async fn complete(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        match self.cached(&request)? {
            Some(response) => Ok(response),
            None => self.inner.complete(request, work, cancel).await,
        }
    }

    async fn complete_streaming(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        match self.cached(&request)? {
            Some(response) => {
                if let Some(text) = response.content.as_deref().filter(|t| !t.is_empty()) {
                    on_text(text);
                }
                Ok(response)
            }
            None => {
                self.inner
                    .complete_streaming(request, work, cancel, on_text)
                    .await
            }
        }
    }
}

/// One request made outside any prompt, and how it is logged.
pub struct OneRequest<'a> {
    /// What the log shows as the run's prompt path (`judge:MODEL`).
    pub label: String,
    /// What the log shows as the run's prompt text (the protocol).
    pub text: String,
    pub request: ChatRequest,
    /// Log it as a run of its own, into this log.
    pub log: Option<&'a crate::data::RunLogTarget>,
    pub cache: Option<&'a CacheUse>,
}

/// Send `one.request` to `spec`'s model (the host file's keys scrubbed from
/// the answer, as in a run), answered from the cache when it holds the
/// request; logged as a run of one exchange when asked.
pub async fn ask_once(
    spec: &pf_models::ProviderSpec,
    secrets: &Arc<pf_secrets::Secrets>,
    one: OneRequest<'_>,
) -> Result<ChatResponse, String> {
    let started_ms = now_ms();
    let began = Instant::now();
    let provider = crate::scrub::ScrubbingModel::wrap(
        pf_models::build_provider(spec).map_err(|e| format!("model {}: {e}", spec.id))?,
        secrets,
    );
    let provider: Arc<dyn ModelProvider> = match one.cache {
        Some(cache) => Arc::new(CachingModel::new(provider, cache.clone(), None)),
        None => provider,
    };
    let work = WorkId::new("0", 1);
    let request_logged = request_json(&one.request);
    let result = provider
        .complete(one.request, &work, CancellationToken::new())
        .await;
    if let Some(target) = one.log {
        let sink = crate::data::begin_run_log(
            target,
            RunStart {
                execution: pf_engine::seeded_names(rand::random()).0,
                prompt_path: one.label,
                prompt_text: one.text,
                args: Json::String(String::new()),
                seed: 0,
                start_rfc3339: pf_engine::format_when(started_ms),
                start_ms: started_ms,
                host_file: None,
                model: Some(spec.id.clone()),
                store_dir: None,
                replay_of: None,
                resumed_from: None,
                batch: None,
                input_index: None,
            },
        );
        if let Some(sink) = sink {
            let usage = result
                .as_ref()
                .ok()
                .and_then(|r| r.usage.as_ref())
                .map(|u| TokenUsage {
                    input: u.input_tokens,
                    output: u.output_tokens,
                    total: u.input_tokens.saturating_add(u.output_tokens),
                });
            let duration_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
            sink.exchange(ExchangeRecord {
                task: work.task.clone(),
                seq: work.seq,
                section: String::new(),
                model: spec.id.clone(),
                attempt: 1,
                request: request_logged,
                response: result.as_ref().ok().map(response_json),
                error: result.as_ref().err().map(provider_error_text),
                status: None,
                started_ms,
                duration_ms,
                usage,
            });
            let outcome = match &result {
                Ok(r) => pf_runlog::Outcome::Completed {
                    result: r.content.clone().unwrap_or_default(),
                },
                Err(e) => pf_runlog::Outcome::Failed {
                    kind: "Model".to_string(),
                    message: e.to_string(),
                },
            };
            sink.finish(outcome, duration_ms);
            sink.settle();
        }
    }
    result.map_err(|e| format!("model {} failed: {e}", spec.id))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_text_ignores_key_order_but_not_values() {
        let a = json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 0.0});
        let b: Json = serde_json::from_str(
            r#"{"temperature":0.0,"messages":[{"content":"hi","role":"user"}]}"#,
        )
        .unwrap();
        assert_eq!(canonical(&a), canonical(&b));
        let c = json!({"messages": [{"role": "user", "content": "hi!"}], "temperature": 0.0});
        assert_ne!(canonical(&a), canonical(&c));
    }
}
