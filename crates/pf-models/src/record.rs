//! Recording: each request sent, appended to a JSON Lines file. [`RecordFile`]
//! writes the lines; [`RecordingProvider`] records every call of a provider
//! that has no attempts of its own (a script), while an HTTP provider records
//! each attempt itself, so a retried call shows every request it sent.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use pf_harness::{
    CancellationToken, ChatRequest, ChatResponse, ModelInfo, ModelProvider, OnText, ProviderError,
    WorkId,
};

use crate::wire;

/// A record file: each request appended as one JSON line in chat-completions
/// shape, `{"model", "messages", "tools"?, "temperature"?, "max_tokens"?}`.
#[derive(Debug)]
pub struct RecordFile {
    path: PathBuf,
    /// Serializes appends from concurrent rounds of one run.
    write_lock: Mutex<()>,
}

impl RecordFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        RecordFile {
            path: path.into(),
            write_lock: Mutex::new(()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The record line for `request` to the model `model_id`, without the newline.
    pub fn record_line(model_id: &str, request: &ChatRequest) -> String {
        // Encoding a body cannot fail: every key is text, every value JSON.
        let body = wire::chat_completions_body(model_id, request);
        body.encode()
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    /// Append one request; written before it is sent, whatever then happens.
    pub fn append(&self, model_id: &str, request: &ChatRequest) -> Result<(), ProviderError> {
        let mut line = Self::record_line(model_id, request);
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

/// Wraps a provider; before each call, appends the request to a [`RecordFile`].
/// The line is written whether or not the call then succeeds (it was sent).
pub struct RecordingProvider {
    inner: Arc<dyn ModelProvider>,
    file: RecordFile,
    /// The `model` each line names: the provider's model name (its catalog
    /// id unless [`RecordingProvider::with_model_name`] says otherwise).
    model: String,
}

impl std::fmt::Debug for RecordingProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordingProvider")
            .field("model", &self.inner.info().id)
            .field("path", &self.file.path)
            .finish()
    }
}

impl RecordingProvider {
    pub fn new(inner: Arc<dyn ModelProvider>, path: impl Into<PathBuf>) -> Self {
        let model = inner.info().id;
        RecordingProvider {
            inner,
            file: RecordFile::new(path),
            model,
        }
    }

    /// Name `model` in each line: the provider's own model name, as an HTTP
    /// provider's lines name the model its body sends.
    pub fn with_model_name(mut self, model: impl Into<String>) -> Self {
        self.model = model.into();
        self
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The record line for `request`, without the newline.
    pub fn record_line(&self, request: &ChatRequest) -> String {
        RecordFile::record_line(&self.model, request)
    }

    fn append(&self, request: &ChatRequest) -> Result<(), ProviderError> {
        self.file.append(&self.model, request)
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
