//! The one HTTP provider, generic over its wire format: the key, the request,
//! status handling, the whole-body fallback of a stream, the stream loop and
//! the opt-in retries are written once here; a [`WireFormat`] only says what
//! the bytes look like.

use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pf_harness::{
    Attempt, CancellationToken, ChatRequest, ChatResponse, History, ModelInfo, ModelProvider,
    OnText, ProviderError, StreamTiming, WireCapture, WorkId,
};
use reqwest::header::{HeaderMap, HeaderName};
use reqwest::StatusCode;
use serde_json::Value as Json;

use crate::http::{
    describe_duration, is_transient, log_safe, malformed, read_api_key, scrub_key, secret_header,
    status_failure, stream_malformed, Endpoint, EventStream, HttpClient, HttpProviderConfig,
    HttpReply, Streamed,
};
use crate::limits::{Admission, ModelGate};
use crate::record::RecordFile;
use crate::wire::{self, EncodedMessages, RequestBody};
use pf_secrets::{Secrets, StreamScrub};

/// A request body's bytes, as sent (and captured). A conversation's bodies
/// grow round by round, so the buffer starts at the last body's size, and
/// the messages the last body encoded are copied from `kept` (a body being
/// encoded elsewhere at the same moment encodes without it).
fn encode(
    body: &RequestBody<'_>,
    history: &History,
    last_len: &AtomicUsize,
    kept: &Mutex<EncodedMessages>,
) -> Result<Vec<u8>, ProviderError> {
    let capacity = last_len.load(Ordering::Relaxed).saturating_add(1024);
    let encoded = match kept.try_lock() {
        Ok(mut kept) => body.encode_keeping(capacity, history, &mut kept),
        Err(_) => body.encode_with_capacity(capacity),
    };
    let bytes = encoded.map_err(|error| {
        ProviderError::Failed(format!("cannot encode the model request: {error}"))
    })?;
    last_len.store(bytes.len(), Ordering::Relaxed);
    Ok(bytes)
}

/// A reply with every form of every key in `secrets` taken out of the
/// server's text, captured bodies included: it goes on into the
/// conversation, the run log, the recorded requests and `--capture`. The one
/// scrub of a reply, for the provider's own key here and for every key the
/// host file names at the Host's boundary.
pub fn scrub_reply(mut reply: ChatResponse, secrets: &Secrets) -> ChatResponse {
    if secrets.is_empty() {
        return reply;
    }
    let scrub = |text: &mut String| secrets.scrub_in_place(text);
    for text in [
        reply.content.as_mut(),
        reply.model.as_mut(),
        reply.finish_reason.as_mut(),
        reply.reasoning.as_mut(),
    ]
    .into_iter()
    .flatten()
    {
        scrub(text);
    }
    // A decoder's reason quotes the server's value.
    reply.degraded.iter_mut().for_each(scrub);
    for call in &mut reply.tool_calls {
        scrub(&mut call.id);
        scrub(&mut call.name);
        scrub(&mut call.arguments);
    }
    if let Some(capture) = reply.capture.as_mut() {
        // The request body is ours (no key: keys travel in headers), the
        // response body the server's, `usage`, `id` and all.
        scrub(&mut capture.request);
        scrub(&mut capture.response);
    }
    reply
}

/// Charge an admitted attempt what the server counted, and free its slot.
fn settle(admission: Option<Admission>, response: &ChatResponse) {
    if let (Some(admission), Some(usage)) = (admission.as_ref(), &response.usage) {
        admission.settle(usage.input_tokens.saturating_add(usage.output_tokens));
    }
}

/// When a streamed attempt's text fragments arrived, from the request on.
struct FragmentClock {
    sent: Instant,
    count: u32,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl FragmentClock {
    fn new() -> FragmentClock {
        FragmentClock {
            sent: Instant::now(),
            count: 0,
            first: None,
            last: None,
        }
    }

    fn tick(&mut self) {
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.count = self.count.saturating_add(1);
    }

    fn timing(&self) -> StreamTiming {
        let millis = |d: Duration| d.as_secs_f64() * 1000.0;
        StreamTiming {
            ttft_ms: self.first.map(|t| millis(t.duration_since(self.sent))),
            mean_itl_ms: match (self.first, self.last) {
                (Some(first), Some(last)) if self.count >= 2 => {
                    Some(millis(last.duration_since(first)) / f64::from(self.count - 1))
                }
                _ => None,
            },
        }
    }
}

/// One failed attempt, with the wait the server asked for before the next
/// and the status it answered with, if it answered.
struct AttemptFailure {
    error: ProviderError,
    retry_after: Option<Duration>,
    status: Option<u16>,
}

impl From<ProviderError> for AttemptFailure {
    fn from(error: ProviderError) -> Self {
        AttemptFailure {
            error,
            retry_after: None,
            status: None,
        }
    }
}

impl AttemptFailure {
    /// A failure of an attempt the server answered with `reply`'s status.
    fn answered(error: ProviderError, reply: &HttpReply) -> Self {
        AttemptFailure {
            error,
            retry_after: reply.retry_after,
            status: Some(reply.status.as_u16()),
        }
    }
}

/// A successful attempt's reply and the status it came with.
type Answered = (ChatResponse, u16);

/// Now, in milliseconds since the Unix epoch (an attempt's start).
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

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
    /// The endpoint under the API root, starting `/v1/`; joined to the
    /// configured base URL with any trailing `/v1` of its own taken off.
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
    fn request_body<'a>(
        &self,
        info: &ModelInfo,
        model: &str,
        request: &'a ChatRequest,
    ) -> Result<RequestBody<'a>, ProviderError>;
    /// Turn a request body into one that asks for an event stream.
    fn ask_for_stream(&self, body: &mut RequestBody<'_>) {
        body.insert("stream", Json::Bool(true));
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
    /// Where each attempt's request is appended, when the Host records.
    record: Option<Arc<RecordFile>>,
    /// The length of the last request body, the next one's starting buffer.
    last_body_len: AtomicUsize,
    /// The last body's messages, encoded: the next body of that conversation
    /// encodes only the messages it adds.
    kept_messages: Mutex<EncodedMessages>,
    /// `config`'s endpoint for `W::PATH`, joined once (the config never changes).
    url: Endpoint,
    /// The model's queue, shared by every run in the process: each attempt
    /// waits here for a slot, room in the minute's windows and any pause.
    gate: Option<Arc<ModelGate>>,
}

impl<W: WireFormat> HttpProvider<W> {
    pub fn new(info: ModelInfo, config: HttpProviderConfig) -> Result<Self, String> {
        let http = HttpClient::new(config.http.clone())?;
        let url = Endpoint::new(config.endpoint(W::PATH));
        Ok(HttpProvider {
            info,
            url,
            config,
            http,
            wire: W::default(),
            record: None,
            last_body_len: AtomicUsize::new(0),
            kept_messages: Mutex::default(),
            gate: None,
        })
    }

    /// Send every attempt through `gate` (the model's limits and pauses).
    pub fn with_gate(mut self, gate: Arc<ModelGate>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// The endpoint this provider posts to.
    pub fn endpoint(&self) -> &str {
        self.url.as_str()
    }

    /// Wait at the model's gate for one attempt whose body is `body_len`
    /// bytes (about four bytes a token, until the server says).
    async fn admit(
        &self,
        body_len: usize,
        cancel: &CancellationToken,
    ) -> Result<Option<Admission>, ProviderError> {
        match &self.gate {
            Some(gate) => Ok(Some(gate.admit((body_len / 4) as u64, cancel).await?)),
            None => Ok(None),
        }
    }

    /// Append every attempt's request to `record` (a retried call shows each one).
    pub fn with_record(mut self, record: Arc<RecordFile>) -> Self {
        self.record = Some(record);
        self
    }

    /// Run `attempt` once, and again after a transient failure while retries
    /// remain ([`crate::HttpSettings::max_retries`], default none), waiting the
    /// server's `Retry-After` or a backoff. Every attempt is recorded, logged
    /// and reported to the request's [`pf_harness::AttemptHook`] with its status.
    /// A streamed attempt that already showed text is never rerun.
    async fn with_retries<'a, F, Fut>(
        &'a self,
        request: &'a ChatRequest,
        key: Option<&'a str>,
        cancel: &'a CancellationToken,
        mut attempt: F,
    ) -> Result<ChatResponse, ProviderError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = (Result<Answered, AttemptFailure>, bool)>,
    {
        let settings = self.http.settings();
        let mut attempts: u32 = 0;
        loop {
            attempts += 1;
            if let Some(record) = &self.record {
                record.append(&self.config.model, request)?;
            }
            let started = (wall_ms(), Instant::now());
            let (outcome, showed_text) = attempt().await;
            let report = |status: Option<u16>, error: Option<&ProviderError>| {
                if let Some(hook) = &request.attempts {
                    hook.report(&Attempt {
                        number: attempts,
                        status,
                        error: error.cloned(),
                        started_ms: started.0,
                        duration: started.1.elapsed(),
                    });
                }
            };
            let failure = match outcome {
                Ok((response, status)) => {
                    report(Some(status), None);
                    return Ok(response);
                }
                Err(failure) => failure,
            };
            let error = scrub_key(failure.error, key);
            report(failure.status, Some(&error));
            // The server asked everyone to wait, not only this call.
            if let (Some(gate), Some(wanted)) = (&self.gate, failure.retry_after) {
                gate.pause(wanted.min(settings.max_retry_after));
            }
            if !is_transient(&error) || showed_text || attempts > settings.max_retries {
                if attempts > 1 {
                    tracing::warn!(model = %self.info.id, attempts, "model call failed after {attempts} attempts: {error}");
                }
                return Err(error);
            }
            let delay = match failure.retry_after {
                Some(wanted) => wanted.min(settings.max_retry_after),
                None => self.http.backoff(attempts),
            };
            tracing::warn!(
                model = %self.info.id,
                attempt = attempts,
                "model call failed ({error}); attempt {} of {} in {}",
                attempts + 1,
                settings.max_retries + 1,
                describe_duration(delay)
            );
            tokio::select! {
                _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    fn headers(&self, key: Option<&str>) -> Result<HeaderMap, ProviderError> {
        let mut headers = self.wire.fixed_headers();
        if let (Some(key), Some(variable)) = (key, self.config.api_key_env.as_deref()) {
            let (name, value) = self.wire.key_header(key);
            headers.insert(name, secret_header(&value, variable)?);
        }
        Ok(headers)
    }

    fn request_body<'a>(&self, request: &'a ChatRequest) -> Result<RequestBody<'a>, ProviderError> {
        self.wire
            .request_body(&self.info, &self.config.model, request)
    }

    async fn send(
        &self,
        request: &ChatRequest,
        key: Option<&str>,
        cancel: &CancellationToken,
    ) -> Result<Answered, AttemptFailure> {
        let url = self.url.as_str();
        let body = encode(
            &self.request_body(request)?,
            &request.messages,
            &self.last_body_len,
            &self.kept_messages,
        )?;
        let sent = request
            .capture
            .then(|| String::from_utf8_lossy(&body).into_owned());
        let admission = self.admit(body.len(), cancel).await?;
        let reply = self
            .http
            .post_json(&self.url, self.headers(key)?, body, cancel)
            .await?;
        let mut response = self
            .whole_reply(url, &reply, key)
            .map_err(|error| AttemptFailure::answered(error, &reply))?;
        settle(admission, &response);
        if let Some(sent) = sent {
            response.capture = Some(WireCapture {
                request: sent,
                response: String::from_utf8_lossy(&reply.body).into_owned(),
            });
        }
        Ok((response, reply.status.as_u16()))
    }

    async fn send_streaming(
        &self,
        request: &ChatRequest,
        key: Option<&str>,
        cancel: &CancellationToken,
        on_text: &mut OnText<'_>,
    ) -> Result<Answered, AttemptFailure> {
        let url = self.url.as_str();
        let mut body = self.request_body(request)?;
        self.wire.ask_for_stream(&mut body);
        let body = encode(
            &body,
            &request.messages,
            &self.last_body_len,
            &self.kept_messages,
        )?;
        let sent = request
            .capture
            .then(|| String::from_utf8_lossy(&body).into_owned());
        // Fragments are timed as they arrive, ahead of the key scrubber
        // (which may hold text back and join fragments).
        let mut clock = FragmentClock::new();
        let mut on_text = |text: &str| {
            clock.tick();
            on_text(text)
        };
        let on_text: &mut OnText<'_> = &mut on_text;
        let admission = self.admit(body.len(), cancel).await?;
        let mut stream = match self
            .http
            .post_stream(&self.url, self.headers(key)?, body, cancel)
            .await?
        {
            Streamed::Events(stream) => stream,
            // A server without streaming may refuse the `stream` field with a
            // client error: the same request goes again whole, once.
            Streamed::Whole(reply) if self.refuses_streaming(&reply) => {
                tracing::warn!(
                    %url,
                    status = %reply.status,
                    "the model server refused a streamed request; sending it again without streaming"
                );
                let (mut response, status) = self.send(request, key, cancel).await?;
                if let Some(text) = response.content.as_deref().filter(|t| !t.is_empty()) {
                    on_text(text);
                }
                response.stream_timing = Some(clock.timing());
                return Ok((response, status));
            }
            // A server that does not stream answers with one body: its text is one fragment.
            Streamed::Whole(reply) => {
                let mut response = self
                    .whole_reply(url, &reply, key)
                    .map_err(|error| AttemptFailure::answered(error, &reply))?;
                settle(admission, &response);
                if let Some(sent) = sent {
                    response.capture = Some(WireCapture {
                        request: sent,
                        response: String::from_utf8_lossy(&reply.body).into_owned(),
                    });
                }
                if let Some(text) = response.content.as_deref().filter(|t| !t.is_empty()) {
                    on_text(text);
                }
                response.stream_timing = Some(clock.timing());
                return Ok((response, reply.status.as_u16()));
            }
        };
        let status = stream.status();
        let mut received = sent.is_some().then(String::new);
        let reply = self
            .read_stream(url, key, &mut stream, cancel, on_text, received.as_mut())
            .await
            .map_err(|error| AttemptFailure {
                error,
                retry_after: None,
                status: Some(status),
            })?;
        let mut response = self.wire.finish_stream(reply);
        settle(admission, &response);
        response.stream_timing = Some(clock.timing());
        // A streamed reply's captured body is its events' data, one per line.
        response.capture = sent
            .zip(received)
            .map(|(request, response)| WireCapture { request, response });
        Ok((response, status))
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
        mut received: Option<&mut String>,
    ) -> Result<W::Stream, ProviderError> {
        let mut reply = W::Stream::default();
        while let Some(event) = stream.next_event(cancel).await? {
            if let Some(received) = received.as_deref_mut() {
                received.push_str(&event.data);
                received.push('\n');
            }
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

    /// Whether an error reply to a streamed request may mean the server does
    /// not stream: a client error that is not about the key, the rate or the
    /// context window.
    fn refuses_streaming(&self, reply: &HttpReply) -> bool {
        let refusal = matches!(
            reply.status,
            StatusCode::BAD_REQUEST
                | StatusCode::UNSUPPORTED_MEDIA_TYPE
                | StatusCode::UNPROCESSABLE_ENTITY
                | StatusCode::NOT_IMPLEMENTED
        );
        if !refusal {
            return false;
        }
        let (message, code) = wire::error_details(&reply.body);
        !self.wire.is_context_overflow(&message, code.as_deref())
    }

    /// A non-success status as an error; a 400 that says the prompt is too long is a context overflow.
    /// The message keeps the server's error message, scrubbed of the key (see `status_failure`).
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
            server_message = %log_safe(&message, key),
            "model request failed with a non-success status"
        );
        // A rate limit's text says which limit and for how long: quoted,
        // escaped, key-scrubbed and cut short. Any other status keeps the
        // server's error message on one line, key-scrubbed and cut short.
        if reply.status == StatusCode::TOO_MANY_REQUESTS && !message.trim().is_empty() {
            return crate::http::status_failure_saying(reply.status, &message, key);
        }
        status_failure(reply.status, &message, key)
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
        let key = key.as_deref();
        let scrubber = Secrets::new(key);
        self.with_retries(&request, key, &cancel, || async {
            (self.send(&request, key, &cancel).await, false)
        })
        .await
        .map(|reply| scrub_reply(reply, &scrubber))
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
        let key = key.as_deref();
        let scrubber = Secrets::new(key);
        // Fragments pass through a scrubber that holds back a tail that could be
        // the start of the key, so a key split across fragments is caught.
        let stream = std::sync::Mutex::new(Some(scrubber.stream()));
        // One `on_text` serves every attempt; the flag says whether text was shown.
        let on_text = tokio::sync::Mutex::new(on_text);
        let showed = std::sync::atomic::AtomicBool::new(false);
        let outcome = self
            .with_retries(&request, key, &cancel, || async {
                let mut on_text = on_text.lock().await;
                let mut forward = |text: &str| {
                    // Text that arrived counts as shown even while the scrubber
                    // holds it back: a retry would show it twice.
                    showed.store(true, std::sync::atomic::Ordering::Relaxed);
                    let safe = match stream.lock() {
                        Ok(mut guard) => match guard.as_mut() {
                            Some(scrub) => scrub.push(text),
                            None => text.to_string(),
                        },
                        Err(_) => String::new(),
                    };
                    if !safe.is_empty() {
                        (**on_text)(&safe)
                    }
                };
                let outcome = self
                    .send_streaming(&request, key, &cancel, &mut forward)
                    .await;
                (outcome, showed.load(std::sync::atomic::Ordering::Relaxed))
            })
            .await;
        let rest = match stream.lock() {
            Ok(mut guard) => guard.take().map(StreamScrub::finish).unwrap_or_default(),
            Err(_) => String::new(),
        };
        if !rest.is_empty() && !matches!(outcome, Err(ProviderError::Cancelled)) {
            let mut on_text = on_text.lock().await;
            (**on_text)(&rest);
        }
        outcome.map(|reply| scrub_reply(reply, &scrubber))
    }
}
