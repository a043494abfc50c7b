//! The one HTTP provider, generic over its wire format: the key, the request,
//! status handling, the whole-body fallback of a stream and the stream loop are
//! written once here; a [`WireFormat`] only says what the bytes look like.

use std::fmt::Debug;

use async_trait::async_trait;
use pf_harness::{
    CancellationToken, ChatRequest, ChatResponse, ModelInfo, ModelProvider, OnText, ProviderError,
    WorkId,
};
use reqwest::header::{HeaderMap, HeaderName};
use reqwest::StatusCode;
use serde_json::{Map, Value as Json};

use crate::http::{
    log_safe, malformed, read_api_key, scrub_key, secret_header, status_failure, stream_malformed,
    EventStream, HttpClient, HttpProviderConfig, HttpReply, Streamed,
};
use crate::wire;

/// The detail for an error the server reported inside a stream that began well:
/// the reply never completed, and the server's own text stays in the log.
const MID_STREAM_ERROR: &str = "the event stream reported a backend error";

/// What one stream event meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamStep {
    /// More events follow.
    More,
    /// The reply is complete; later events are not read.
    End,
    /// The server reported an error inside the stream (its own words, and code if any).
    ServerError {
        message: String,
        code: Option<String>,
    },
}

/// How one model API encodes requests and replies. Parsing returns details in
/// this crate's own words (`Err(String)`, never quoting the reply); the provider
/// turns them into `malformed response: …` and logs them with the URL.
pub trait WireFormat: Default + Debug + Send + Sync + 'static {
    /// The endpoint, joined to the configured base URL.
    const PATH: &'static str;
    /// A streamed reply under assembly.
    type Stream: Default + Send;

    /// Headers every request carries, besides the key.
    fn fixed_headers(&self) -> HeaderMap {
        HeaderMap::new()
    }
    /// The header that carries `key`, and its value.
    fn key_header(&self, key: &str) -> (HeaderName, String);
    /// The JSON body for `request`. Fails when the request has no form in this API.
    fn request_body(
        &self,
        info: &ModelInfo,
        model: &str,
        request: &ChatRequest,
    ) -> Result<Map<String, Json>, ProviderError>;
    /// Turn a request body into one that asks for an event stream.
    fn ask_for_stream(&self, body: &mut Map<String, Json>) {
        body.insert("stream".into(), Json::Bool(true));
    }
    /// Whether an error reply's message (and code) says the prompt did not fit.
    fn is_context_overflow(&self, message: &str, _code: Option<&str>) -> bool {
        wire::mentions_context_overflow(message)
    }
    /// A complete success body.
    fn parse_reply(&self, body: &[u8]) -> Result<ChatResponse, String>;
    /// Take in one event's `data`, passing new answer text to `on_text`.
    fn stream_event(
        &self,
        reply: &mut Self::Stream,
        data: &str,
        on_text: &mut OnText<'_>,
    ) -> Result<StreamStep, String>;
    /// Whether a stream that ended without [`StreamStep::End`] still holds a whole reply.
    fn complete_without_end(&self, _reply: &Self::Stream) -> bool {
        false
    }
    /// The assembled reply.
    fn finish_stream(&self, reply: Self::Stream) -> ChatResponse;
}

/// A model behind an HTTP API spoken in the wire format `W`.
#[derive(Debug)]
pub struct HttpProvider<W> {
    info: ModelInfo,
    config: HttpProviderConfig,
    http: HttpClient,
    wire: W,
}

impl<W: WireFormat> HttpProvider<W> {
    pub fn new(info: ModelInfo, config: HttpProviderConfig) -> Result<Self, String> {
        let http = HttpClient::new(config.http.clone())?;
        Ok(HttpProvider {
            info,
            config,
            http,
            wire: W::default(),
        })
    }

    fn headers(&self, key: Option<&str>) -> Result<HeaderMap, ProviderError> {
        let mut headers = self.wire.fixed_headers();
        if let (Some(key), Some(variable)) = (key, self.config.api_key_env.as_deref()) {
            let (name, value) = self.wire.key_header(key);
            headers.insert(name, secret_header(&value, variable)?);
        }
        Ok(headers)
    }

    fn request_body(&self, request: &ChatRequest) -> Result<Map<String, Json>, ProviderError> {
        self.wire
            .request_body(&self.info, &self.config.model, request)
    }

    async fn send(
        &self,
        request: &ChatRequest,
        key: Option<&str>,
        cancel: &CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        let url = self.config.endpoint(W::PATH);
        let body = Json::Object(self.request_body(request)?);
        let reply = self
            .http
            .post_json(&url, self.headers(key)?, &body, cancel)
            .await?;
        self.whole_reply(&url, &reply, key)
    }

    async fn send_streaming(
        &self,
        request: &ChatRequest,
        key: Option<&str>,
        cancel: &CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        let url = self.config.endpoint(W::PATH);
        let mut body = self.request_body(request)?;
        self.wire.ask_for_stream(&mut body);
        let body = Json::Object(body);
        let mut stream = match self
            .http
            .post_stream(&url, self.headers(key)?, &body, cancel)
            .await?
        {
            Streamed::Events(stream) => stream,
            // A server that does not stream answers with one body: its text is one fragment.
            Streamed::Whole(reply) => {
                let response = self.whole_reply(&url, &reply, key)?;
                if let Some(text) = response.content.as_deref().filter(|t| !t.is_empty()) {
                    on_text(text);
                }
                return Ok(response);
            }
        };
        let reply = self
            .read_stream(&url, key, &mut stream, cancel, on_text)
            .await?;
        Ok(self.wire.finish_stream(reply))
    }

    /// Read events until the wire format says the reply is complete; a stream
    /// that ends first is cut short unless the format finds the reply whole.
    async fn read_stream(
        &self,
        url: &str,
        key: Option<&str>,
        stream: &mut EventStream,
        cancel: &CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<W::Stream, ProviderError> {
        let mut reply = W::Stream::default();
        while let Some(event) = stream.next_event(cancel).await? {
            let step = self
                .wire
                .stream_event(&mut reply, &event.data, on_text)
                .map_err(|detail| stream_malformed(url, &detail))?;
            match step {
                StreamStep::More => {}
                StreamStep::End => return Ok(reply),
                StreamStep::ServerError { message, code } => {
                    return Err(self.stream_error(url, key, message, code.as_deref()))
                }
            }
        }
        if self.wire.complete_without_end(&reply) {
            Ok(reply)
        } else {
            Err(stream.cut_short())
        }
    }

    fn whole_reply(
        &self,
        url: &str,
        reply: &HttpReply,
        key: Option<&str>,
    ) -> Result<ChatResponse, ProviderError> {
        if !reply.status.is_success() {
            return Err(self.status_error(url, reply, key));
        }
        self.wire.parse_reply(&reply.body).map_err(|detail| {
            tracing::warn!(%url, "model reply is malformed: {detail}");
            malformed(&detail)
        })
    }

    /// A non-success status as an error; a 400 that says the prompt is too long is a context overflow.
    /// The server's error text goes to the log only, never into the message.
    fn status_error(&self, url: &str, reply: &HttpReply, key: Option<&str>) -> ProviderError {
        let (message, code) = wire::error_details(&reply.body);
        if reply.status == StatusCode::BAD_REQUEST
            && self.wire.is_context_overflow(&message, code.as_deref())
        {
            return ProviderError::ContextOverflow(message);
        }
        tracing::warn!(
            %url,
            status = %reply.status,
            attempts = reply.attempts,
            server_message = %log_safe(&message, key),
            "model request failed with a non-success status"
        );
        status_failure(reply.status)
    }

    /// An error reported inside a stream: a context overflow keeps the server's
    /// words (as with a status); anything else fails with our own.
    fn stream_error(
        &self,
        url: &str,
        key: Option<&str>,
        message: String,
        code: Option<&str>,
    ) -> ProviderError {
        if self.wire.is_context_overflow(&message, code) {
            return ProviderError::ContextOverflow(message);
        }
        tracing::warn!(
            %url,
            server_message = %log_safe(&message, key),
            "model reply stream carried an error"
        );
        malformed(MID_STREAM_ERROR)
    }
}

#[async_trait]
impl<W: WireFormat> ModelProvider for HttpProvider<W> {
    fn info(&self) -> ModelInfo {
        self.info.clone()
    }

    async fn complete(
        &self,
        request: ChatRequest,
        _work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<ChatResponse, ProviderError> {
        if cancel.is_cancelled() {
            return Err(ProviderError::Cancelled);
        }
        let key = read_api_key(self.config.api_key_env.as_deref())?;
        let outcome = self.send(&request, key.as_deref(), &cancel).await;
        outcome.map_err(|error| scrub_key(error, key.as_deref()))
    }

    async fn complete_streaming(
        &self,
        request: ChatRequest,
        _work: &WorkId,
        cancel: CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<ChatResponse, ProviderError> {
        if cancel.is_cancelled() {
            return Err(ProviderError::Cancelled);
        }
        let key = read_api_key(self.config.api_key_env.as_deref())?;
        let outcome = self
            .send_streaming(&request, key.as_deref(), &cancel, on_text)
            .await;
        outcome.map_err(|error| scrub_key(error, key.as_deref()))
    }
}
