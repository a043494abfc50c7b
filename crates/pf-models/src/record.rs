//! The recording wrapper: appends each request sent to a JSON Lines file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use pf_harness::{
    CancellationToken, ChatRequest, ChatResponse, ModelInfo, ModelProvider, OnText, ProviderError,
    WorkId,
};
use serde_json::Value as Json;

use crate::wire;

/// Wraps a provider; before each call, appends the request as one JSON line in
/// chat-completions shape: `{"model", "messages", "tools"?, "temperature"?, "max_tokens"?}`.
/// The line is written whether or not the call then succeeds (it was sent).
pub struct RecordingProvider {
    inner: Arc<dyn ModelProvider>,
    path: PathBuf,
    /// Serializes appends from concurrent rounds of one run.
    write_lock: Mutex<()>,
}

impl std::fmt::Debug for RecordingProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingProvider")
            .field("model", &self.inner.info().id)
            .field("path", &self.path)
            .finish()
    }
}

impl RecordingProvider {
    pub fn new(inner: Arc<dyn ModelProvider>, path: impl Into<PathBuf>) -> Self {
        RecordingProvider {
            inner,
            path: path.into(),
            write_lock: Mutex::new(()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The record line for `request`, without the newline.
    pub fn record_line(&self, request: &ChatRequest) -> String {
        let body = wire::chat_completions_body(&self.inner.info().id, request);
        Json::Object(body).to_string()
    }

    fn append(&self, request: &ChatRequest) -> Result<(), ProviderError> {
        let mut line = self.record_line(request);
        line.push('\n');
        let _guard = self
            .write_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            // One write per line, so lines from concurrent writers never interleave.
            .and_then(|mut file| file.write_all(line.as_bytes()));
        written.map_err(|error| {
            ProviderError::Failed(format!(
                "cannot append the request to the record file {}: {error}",
                self.path.display()
            ))
        })
    }
}

#[async_trait]
impl ModelProvider for RecordingProvider {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }

    async fn complete(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        if cancel.is_cancelled() {
            return Err(ProviderError::Cancelled);
        }
        self.append(&request)?;
        self.inner.complete(request, work, cancel).await
    }

    async fn complete_streaming(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        if cancel.is_cancelled() {
            return Err(ProviderError::Cancelled);
        }
        self.append(&request)?;
        self.inner
            .complete_streaming(request, work, cancel, on_text)
            .await
    }
}
