//! Token usage per run: a decorator around each model provider that adds up
//! the usage every reply reports, so the run report can show the totals
//! without the Engine keeping count.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use pf_harness::{
    CancellationToken, ChatRequest, ChatResponse, ModelInfo, ModelProvider, OnText, ProviderError,
    WorkId,
};

/// The run's token counts so far, shared by every metered provider.
#[derive(Debug, Default)]
pub struct UsageTotals {
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    /// Whether any reply reported usage (a provider may report none).
    reported: AtomicBool,
}

impl UsageTotals {
    fn add(&self, response: &ChatResponse) {
        if let Some(usage) = &response.usage {
            self.input_tokens
                .fetch_add(usage.input_tokens, Ordering::Relaxed);
            self.output_tokens
                .fetch_add(usage.output_tokens, Ordering::Relaxed);
            self.reported.store(true, Ordering::Relaxed);
        }
    }

    /// `(input_tokens, output_tokens)`, or `None` when no reply reported usage.
    pub fn totals(&self) -> Option<(u64, u64)> {
        self.reported.load(Ordering::Relaxed).then(|| {
            (
                self.input_tokens.load(Ordering::Relaxed),
                self.output_tokens.load(Ordering::Relaxed),
            )
        })
    }
}

/// A provider whose replies' usage is added to [`UsageTotals`].
pub struct Metered {
    inner: Arc<dyn ModelProvider>,
    totals: Arc<UsageTotals>,
}

impl Metered {
    pub fn new(inner: Arc<dyn ModelProvider>, totals: Arc<UsageTotals>) -> Self {
        Metered { inner, totals }
    }

    fn count(
        &self,
        reply: Result<ChatResponse, ProviderError>,
    ) -> Result<ChatResponse, ProviderError> {
        if let Ok(response) = &reply {
            self.totals.add(response);
        }
        reply
    }
}

#[async_trait]
impl ModelProvider for Metered {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }

    async fn complete(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        let reply = self.inner.complete(request, work, cancel).await;
        self.count(reply)
    }

    async fn complete_streaming(
        &self,
        request: ChatRequest,
        work: &WorkId,
        cancel: CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        let reply = self
            .inner
            .complete_streaming(request, work, cancel, on_text)
            .await;
        self.count(reply)
    }
}
