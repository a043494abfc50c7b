//! The HTTP transport both HTTP providers share: one attempt per call (the
//! provider decides whether to try again, see [`is_transient`]), a receive
//! timeout per wait, a body size cap, cancellation, key handling, and event
//! streams read as they arrive.

use std::error::Error as _;
use std::time::Duration;

use pf_harness::{CancellationToken, ProviderError};
use rand::Rng;

use crate::sse;
use pf_secrets::Secrets;
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE, RETRY_AFTER};
use reqwest::StatusCode;

/// How long to wait for the response headers and for each next body chunk.
pub const RECEIVE_TIMEOUT: Duration = Duration::from_secs(120);
/// The largest response body accepted.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// Transport behaviour of an HTTP provider.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpSettings {
    /// The wait allowed for the response headers, and again for each next body chunk.
    pub receive_timeout: Duration,
    /// Retries after the first attempt, only for transient failures and 429
    /// ([`is_transient`]). Default 0: nothing reruns a failed call (guide ch. 17).
    pub max_retries: u32,
    /// The first backoff delay; it doubles on each retry, plus up to half again of jitter.
    pub initial_backoff: Duration,
    /// The longest `Retry-After` honoured; longer values are cut to this.
    pub max_retry_after: Duration,
    /// Response bodies larger than this fail the call.
    pub max_body_bytes: usize,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            receive_timeout: RECEIVE_TIMEOUT,
            max_retries: 0,
            initial_backoff: Duration::from_millis(500),
            max_retry_after: Duration::from_secs(60),
            max_body_bytes: MAX_BODY_BYTES,
        }
    }
}

/// Where and how an HTTP provider reaches its model.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpProviderConfig {
    /// For OpenAI-compatible servers this includes the version path (`…/v1`);
    /// for Anthropic it is the host root (`https://api.anthropic.com`).
    pub base_url: String,
    /// The model name sent in each request.
    pub model: String,
    /// The NAME of the environment variable holding the API key; `None` sends no key.
    pub api_key_env: Option<String>,
    pub http: HttpSettings,
}

impl HttpProviderConfig {
    /// `base_url` joined with `path` (which starts with `/v1/`): a base URL
    /// with or without a trailing `/v1` (and slashes) reaches the same endpoint.
    pub(crate) fn endpoint(&self, path: &str) -> String {
        let root = self.base_url.trim_end_matches('/');
        let root = root.strip_suffix("/v1").unwrap_or(root);
        format!("{}{}", root.trim_end_matches('/'), path)
    }
}

/// The fixed message of a transport failure (guide ch. 17).
const TRANSPORT_FAILURE: &str = "http transport failure";
/// The prefix of every malformed-reply message.
const MALFORMED: &str = "malformed response: ";
/// The prefix of a final non-success status.
const BACKEND_STATUS: &str = "non-success backend status ";
/// The prefix of an error reply whose body broke off.
const UNREADABLE_BODY: &str = "unreadable backend error body";

/// Whether a failed call may succeed when sent again: the transient failures of
/// guide ch. 17 (transport failures and receive timeouts, malformed or oversized
/// replies, unreadable error bodies, statuses of 500 or higher) and 429. The
/// messages are this module's own fixed texts, so reading them back is exact.
pub fn is_transient(error: &ProviderError) -> bool {
    let ProviderError::Failed(message) = error else {
        return false;
    };
    if message.starts_with(TRANSPORT_FAILURE)
        || message.starts_with(MALFORMED)
        || message.starts_with(UNREADABLE_BODY)
    {
        return true;
    }
    // The status is the digits after the prefix; a 429 may go on with the server's text.
    message
        .strip_prefix(BACKEND_STATUS)
        .and_then(|rest| {
            let digits = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            rest[..digits].parse::<u16>().ok()
        })
        .is_some_and(|status| status >= 500 || status == 429)
}

/// The API key named by `api_key_env`, read now. Errors name the variable, never a value;
/// an empty (or blank) key counts as unset.
pub(crate) fn read_api_key(api_key_env: Option<&str>) -> Result<Option<String>, ProviderError> {
    let Some(variable) = api_key_env else {
        return Ok(None);
    };
    match std::env::var(variable) {
        Ok(key) if !key.trim().is_empty() => Ok(Some(key.trim().to_string())),
        Ok(_) | Err(std::env::VarError::NotPresent) => Err(ProviderError::Failed(format!(
            "missing environment variable: {variable}"
        ))),
        Err(std::env::VarError::NotUnicode(_)) => Err(ProviderError::Failed(format!(
            "environment variable is set but not valid Unicode: {variable}"
        ))),
    }
}

/// A header value carrying a secret: marked sensitive so it never shows in `Debug`.
pub(crate) fn secret_header(value: &str, variable: &str) -> Result<HeaderValue, ProviderError> {
    let mut header = HeaderValue::from_str(value).map_err(|_| {
        ProviderError::Failed(format!(
            "the API key in {variable} holds characters an HTTP header cannot carry"
        ))
    })?;
    header.set_sensitive(true);
    Ok(header)
}

/// Replace every form of the key in an error's text, in case a server echoed it.
pub(crate) fn scrub_key(error: ProviderError, key: Option<&str>) -> ProviderError {
    let scrubber = Secrets::new(key);
    if scrubber.is_empty() {
        return error;
    }
    match error {
        ProviderError::Failed(message) => ProviderError::Failed(scrubber.scrub(&message)),
        ProviderError::ContextOverflow(message) => {
            ProviderError::ContextOverflow(scrubber.scrub(&message))
        }
        ProviderError::Cancelled => ProviderError::Cancelled,
    }
}

/// Text a server sent, made fit for a log line: every form of the key
/// replaced, and quoted with escapes so a hostile payload cannot forge log lines.
pub(crate) fn log_safe(text: &str, key: Option<&str>) -> String {
    let scrubbed = Secrets::new(key).scrub(text);
    format!("{scrubbed:?}")
}

/// The failure for a refused or broken connection and for a receive timeout:
/// the guide's fixed text, then what happened (our words and the OS's, never
/// reply text) and where, so a stored failure keeps its cause.
pub(crate) fn transport_failure(url: &str, cause: &str) -> ProviderError {
    ProviderError::Failed(format!("{TRANSPORT_FAILURE}: {cause} ({url})"))
}

/// The most of a server's error message a failure keeps.
const SERVER_MESSAGE_CHARS: usize = 300;

/// The failure for a reply that is too large or does not decode. `detail` is
/// written by this crate and never quotes the reply.
pub(crate) fn malformed(detail: &str) -> ProviderError {
    ProviderError::Failed(format!("{MALFORMED}{detail}"))
}

/// A malformed stream event: the detail (our own words) is logged with the URL.
pub(crate) fn stream_malformed(url: &str, detail: &str) -> ProviderError {
    tracing::warn!(%url, "model reply stream is malformed: {detail}");
    malformed(detail)
}

/// The failure for a final non-success status: the number, then the error
/// message the server gave (its JSON `error.message`, else its text), with
/// every form of the key replaced, on one line and cut short, so the stored
/// error says what the server said.
pub(crate) fn status_failure(
    status: StatusCode,
    server_message: &str,
    key: Option<&str>,
) -> ProviderError {
    let scrubbed = Secrets::new(key).scrub(server_message);
    let one_line: String = scrubbed
        .split(|c: char| c.is_control() || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    if one_line.is_empty() {
        return ProviderError::Failed(format!("{BACKEND_STATUS}{}", status.as_u16()));
    }
    let mut said: String = one_line.chars().take(SERVER_MESSAGE_CHARS).collect();
    if one_line.chars().count() > SERVER_MESSAGE_CHARS {
        said.push('…');
    }
    ProviderError::Failed(format!("{BACKEND_STATUS}{}: {said}", status.as_u16()))
}

/// Longest server text a status failure keeps, in characters.
const SERVER_TEXT_KEPT: usize = 200;

/// The failure for a final status with the server's own words after it
/// (`non-success backend status 429: "…"`), made safe as in the log: the key
/// scrubbed, control characters escaped inside quotes, cut short.
pub(crate) fn status_failure_saying(
    status: StatusCode,
    server_text: &str,
    key: Option<&str>,
) -> ProviderError {
    let short: String = server_text.chars().take(SERVER_TEXT_KEPT).collect();
    let cut = if short.len() < server_text.len() {
        "…"
    } else {
        ""
    };
    ProviderError::Failed(format!(
        "{BACKEND_STATUS}{}: {}{cut}",
        status.as_u16(),
        log_safe(&short, key)
    ))
}

/// The failure for an error reply whose body broke off while arriving.
fn unreadable_error_body(status: StatusCode) -> ProviderError {
    ProviderError::Failed(format!("{UNREADABLE_BODY} (status {})", status.as_u16()))
}

/// A JSON decoding failure as a detail that never quotes the input: serde_json's
/// syntax diagnostics are fixed texts with a position, anything else is reduced to the position.
pub(crate) fn json_error_detail(error: &serde_json::Error) -> String {
    match error.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => error.to_string(),
        _ => format!("invalid at line {} column {}", error.line(), error.column()),
    }
}

/// `120 s`, `200 ms`: durations as people read them in messages.
pub(crate) fn describe_duration(duration: Duration) -> String {
    if duration.subsec_millis() == 0 {
        format!("{} s", duration.as_secs())
    } else {
        format!("{} ms", duration.as_millis())
    }
}

/// Where a provider posts: the URL as configured (for messages and logs) and
/// as parsed once, so a request does not parse it again. A URL that does not
/// parse is handed to reqwest as text each time and fails as it always did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Endpoint {
    text: String,
    parsed: Option<reqwest::Url>,
}

impl Endpoint {
    pub(crate) fn new(text: String) -> Endpoint {
        let parsed = reqwest::Url::parse(&text).ok();
        Endpoint { text, parsed }
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }

    fn post(&self, client: &reqwest::Client) -> reqwest::RequestBuilder {
        match &self.parsed {
            Some(url) => client.post(url.clone()),
            None => client.post(self.text.as_str()),
        }
    }
}

/// A complete HTTP response: whatever its status, the caller interprets it.
#[derive(Debug)]
pub(crate) struct HttpReply {
    pub status: StatusCode,
    pub body: Vec<u8>,
    /// The `Retry-After` the server asked for (in seconds), if any.
    pub retry_after: Option<Duration>,
}

#[derive(Debug)]
pub(crate) struct HttpClient {
    client: reqwest::Client,
    settings: HttpSettings,
}

impl HttpClient {
    /// A client for `settings`. Providers built within one runtime share one
    /// `reqwest::Client` per connect timeout, so the runs of a batch (each of
    /// which assembles its Host) reuse its TLS setup and its pooled
    /// connections. Only within one runtime: a pooled connection belongs to
    /// the runtime that opened it, and is gone with it.
    pub(crate) fn new(settings: HttpSettings) -> Result<Self, String> {
        type Shared = Vec<(tokio::runtime::Id, Duration, reqwest::Client)>;
        thread_local! {
            static CLIENTS: std::cell::RefCell<Shared> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let timeout = settings.receive_timeout;
        let runtime = tokio::runtime::Handle::try_current().ok().map(|h| h.id());
        let shared = runtime.and_then(|runtime| {
            CLIENTS.with(|clients| {
                let mut clients = clients.borrow_mut();
                // Clients of runtimes this thread no longer drives go.
                clients.retain(|(r, _, _)| *r == runtime);
                clients
                    .iter()
                    .find(|(_, t, _)| *t == timeout)
                    .map(|(_, _, client)| client.clone())
            })
        });
        let client = match shared {
            Some(client) => client,
            None => {
                let client = reqwest::Client::builder()
                    .connect_timeout(timeout)
                    // A redirect could carry the key header to another host; model APIs never redirect a POST.
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .map_err(|error| format!("cannot set up the HTTP client: {error}"))?;
                if let Some(runtime) = runtime {
                    CLIENTS.with(|clients| {
                        clients
                            .borrow_mut()
                            .push((runtime, timeout, client.clone()))
                    });
                }
                client
            }
        };
        Ok(HttpClient { client, settings })
    }

    /// POST `body` (encoded JSON) to `url`, retrying as [`HttpSettings`] says. Returns the
    /// final response whatever its status; transport failures, timeouts, an
    /// oversized body and cancellation are errors.
    pub(crate) async fn post_json(
        &self,
        endpoint: &Endpoint,
        headers: HeaderMap,
        body: Vec<u8>,
        cancel: &CancellationToken,
    ) -> Result<HttpReply, ProviderError> {
        let url = endpoint.as_str();
        match self.post(endpoint, headers, body, cancel, false).await? {
            Streamed::Whole(reply) => Ok(reply),
            // Not asked for, so never handed out; read it whole all the same.
            Streamed::Events(_) => {
                tracing::warn!(%url, "the model server sent an event stream that was not asked for");
                Err(malformed("an event stream that was not asked for"))
            }
        }
    }

    /// POST `body` (encoded JSON) to `url`, asking for an event stream. A success status
    /// with a `text/event-stream` body is handed back as it arrives; any other
    /// answer (an error status, or a server that ignores `stream` and sends one
    /// JSON body) is read whole. Retries happen only before a stream is handed
    /// back: text already shown cannot be taken back.
    pub(crate) async fn post_stream(
        &self,
        endpoint: &Endpoint,
        headers: HeaderMap,
        body: Vec<u8>,
        cancel: &CancellationToken,
    ) -> Result<Streamed, ProviderError> {
        let mut headers = headers;
        headers.insert(ACCEPT, HeaderValue::from_static("text/event-stream"));
        self.post(endpoint, headers, body, cancel, true).await
    }

    async fn post(
        &self,
        endpoint: &Endpoint,
        headers: HeaderMap,
        body: Vec<u8>,
        cancel: &CancellationToken,
        stream: bool,
    ) -> Result<Streamed, ProviderError> {
        let mut headers = headers;
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let url = endpoint.as_str();
        let response = self.send_once(endpoint, headers, body, cancel).await?;
        if stream && is_event_stream(&response) {
            return Ok(Streamed::Events(Box::new(EventStream {
                url: url.to_string(),
                response,
                timeout: self.settings.receive_timeout,
                cap: self.settings.max_body_bytes,
                received: 0,
                ended: false,
                parser: sse::Parser::default(),
            })));
        }
        Ok(Streamed::Whole(
            self.read_whole(url, response, cancel).await?,
        ))
    }

    /// The transport settings (the provider reads the retry policy from them).
    pub(crate) fn settings(&self) -> &HttpSettings {
        &self.settings
    }

    /// Exponential backoff with jitter before retry number `retry` (1-based).
    pub(crate) fn backoff(&self, retry: u32) -> Duration {
        let base = self
            .settings
            .initial_backoff
            .saturating_mul(2u32.saturating_pow(retry.saturating_sub(1)));
        let jitter_ceiling = u64::try_from(base.as_millis() / 2).unwrap_or(u64::MAX);
        let jitter = rand::rng().random_range(0..=jitter_ceiling);
        base.saturating_add(Duration::from_millis(jitter))
    }

    /// Send the request and wait for the response head.
    async fn send_once(
        &self,
        endpoint: &Endpoint,
        headers: HeaderMap,
        body: Vec<u8>,
        cancel: &CancellationToken,
    ) -> Result<reqwest::Response, ProviderError> {
        let timeout = self.settings.receive_timeout;
        let url = endpoint.as_str();
        let request = endpoint
            .post(&self.client)
            .headers(headers)
            .body(body)
            .send();
        let sent = tokio::select! {
            _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
            sent = tokio::time::timeout(timeout, request) => sent,
        };
        match sent {
            Err(_) => {
                let cause = format!("no response within {}", describe_duration(timeout));
                tracing::warn!(%url, "model request failed: {cause}");
                Err(transport_failure(url, &cause))
            }
            Ok(Err(error)) => {
                let cause = error_chain(&error);
                tracing::warn!(%url, "model request failed: {cause}");
                Err(transport_failure(url, &cause))
            }
            Ok(Ok(response)) => Ok(response),
        }
    }

    /// Read the whole body of a response, within the receive timeout per chunk and the size cap.
    async fn read_whole(
        &self,
        url: &str,
        mut response: reqwest::Response,
        cancel: &CancellationToken,
    ) -> Result<HttpReply, ProviderError> {
        let timeout = self.settings.receive_timeout;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);

        let cap = self.settings.max_body_bytes;
        if let Some(length) = response
            .content_length()
            .filter(|length| *length > cap as u64)
        {
            tracing::warn!(%url, %status, length, cap, "model reply refused: over the response cap");
            return Err(if status.is_success() {
                stream_too_large(cap)
            } else {
                malformed(&format!(
                    "response body of {length} bytes exceeds the {cap}-byte limit"
                ))
            });
        }
        let mut body = Vec::new();
        loop {
            let chunk = tokio::select! {
                _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
                chunk = tokio::time::timeout(timeout, response.chunk()) => chunk,
            };
            match chunk {
                Err(_) => return Err(stalled(url, timeout, body.len())),
                Ok(Err(error)) => {
                    let cause = log_broken(url, &error);
                    return Err(if status.is_success() {
                        transport_failure(url, &cause)
                    } else {
                        unreadable_error_body(status)
                    });
                }
                Ok(Ok(None)) => break,
                Ok(Ok(Some(bytes))) => {
                    if body.len() + bytes.len() > cap {
                        tracing::warn!(%url, %status, cap, "model reply refused: over the response cap");
                        return Err(if status.is_success() {
                            stream_too_large(cap)
                        } else {
                            malformed(&format!("response body exceeds the {cap}-byte limit"))
                        });
                    }
                    body.extend_from_slice(&bytes);
                }
            }
        }
        Ok(HttpReply {
            status,
            body,
            retry_after,
        })
    }
}

/// What a request that asked for an event stream got back.
pub(crate) enum Streamed {
    /// A success status whose event stream is still arriving (boxed: it is large).
    Events(Box<EventStream>),
    /// A complete reply: an error status, or one JSON body from a server that does not stream.
    Whole(HttpReply),
}

/// A response body read as server-sent events, with the same receive timeout
/// per chunk and the same size cap (over the whole stream) as a whole body.
pub(crate) struct EventStream {
    url: String,
    response: reqwest::Response,
    timeout: Duration,
    cap: usize,
    received: usize,
    ended: bool,
    parser: sse::Parser,
}

impl EventStream {
    /// The status the stream's response came with.
    pub(crate) fn status(&self) -> u16 {
        self.response.status().as_u16()
    }

    /// The next event; `None` once the stream has ended.
    pub(crate) async fn next_event(
        &mut self,
        cancel: &CancellationToken,
    ) -> Result<Option<sse::Event>, ProviderError> {
        loop {
            if let Some(event) = self.parser.next_event() {
                return Ok(Some(event));
            }
            if self.ended {
                return Ok(None);
            }
            let chunk = tokio::select! {
                _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
                chunk = tokio::time::timeout(self.timeout, self.response.chunk()) => chunk,
            };
            match chunk {
                Err(_) => return Err(stalled(&self.url, self.timeout, self.received)),
                Ok(Err(error)) => {
                    let cause = log_broken(&self.url, &error);
                    return Err(transport_failure(&self.url, &cause));
                }
                Ok(Ok(None)) => self.ended = true,
                Ok(Ok(Some(bytes))) => {
                    if self.received + bytes.len() > self.cap {
                        tracing::warn!(url = %self.url, cap = self.cap, "model reply stream refused: over the response cap");
                        return Err(stream_too_large(self.cap));
                    }
                    self.received += bytes.len();
                    self.parser.feed(&bytes).map_err(|detail| {
                        tracing::warn!(url = %self.url, "model reply stream is malformed: {detail}");
                        malformed(&detail)
                    })?;
                }
            }
        }
    }

    /// The failure for a stream that ended before its reply was complete.
    pub(crate) fn cut_short(&self) -> ProviderError {
        tracing::warn!(
            url = %self.url,
            received = self.received,
            "model reply stream ended before the reply was complete"
        );
        transport_failure(
            &self.url,
            &format!(
                "the reply stream ended before the reply was complete, after {} bytes",
                self.received
            ),
        )
    }
}

fn is_event_stream(response: &reqwest::Response) -> bool {
    response.status().is_success()
        && response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| {
                value
                    .trim_start()
                    .to_ascii_lowercase()
                    .starts_with("text/event-stream")
            })
}

fn stream_too_large(cap: usize) -> ProviderError {
    malformed(&format!("response stream exceeds the {cap}-byte limit"))
}

fn stalled(url: &str, timeout: Duration, received: usize) -> ProviderError {
    let cause = format!(
        "the reply stalled: nothing arrived for {} (after {received} bytes)",
        describe_duration(timeout)
    );
    tracing::warn!(%url, received, "model {cause}");
    transport_failure(url, &cause)
}

/// Log a connection that broke mid-reply; the cause, for the failure.
fn log_broken(url: &str, error: &reqwest::Error) -> String {
    let cause = format!(
        "the connection broke while the reply was arriving: {}",
        error_causes(error)
    );
    tracing::warn!(%url, "model reply {cause}");
    cause
}

/// What went wrong and why, `: `-separated, without the URL reqwest repeats.
fn error_chain(error: &reqwest::Error) -> String {
    let what = if error.is_connect() {
        "cannot connect"
    } else {
        "error sending the request"
    };
    let why = error_causes(error);
    if why.is_empty() {
        what.to_string()
    } else {
        format!("{what}: {why}")
    }
}

/// The error's causes, `: `-separated, leaving out hyper's "client error (Kind)" wrappers.
fn error_causes(error: &reqwest::Error) -> String {
    let mut causes: Vec<String> = Vec::new();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !text.starts_with("client error (") && !causes.contains(&text) {
            causes.push(text);
        }
        source = cause.source();
    }
    causes.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_naturally() {
        assert_eq!(describe_duration(Duration::from_secs(120)), "120 s");
        assert_eq!(describe_duration(Duration::from_millis(200)), "200 ms");
    }

    #[test]
    fn backoff_doubles_with_bounded_jitter() {
        let client = HttpClient::new(HttpSettings {
            initial_backoff: Duration::from_millis(100),
            ..HttpSettings::default()
        })
        .unwrap();
        for (retry, base) in [(1, 100), (2, 200), (3, 400)] {
            let delay = client.backoff(retry).as_millis();
            assert!(
                (base..=base + base / 2).contains(&delay),
                "retry {retry}: {delay} ms"
            );
        }
    }

    #[test]
    fn log_safe_text_hides_the_key_and_cannot_break_a_line() {
        assert_eq!(
            log_safe("bad key sk-9\nINFO forged", Some("sk-9")),
            "\"bad key [redacted]\\nINFO forged\""
        );
        assert_eq!(log_safe("plain", None), "\"plain\"");
    }

    #[test]
    fn failure_messages_are_the_guides() {
        assert_eq!(
            status_failure(StatusCode::SERVICE_UNAVAILABLE, "", None),
            ProviderError::Failed("non-success backend status 503".into())
        );
        assert_eq!(
            status_failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                "model sk-9 not loaded:\n\x1b[2Jtry later",
                Some("sk-9")
            ),
            ProviderError::Failed(
                "non-success backend status 500: model [redacted] not loaded: [2Jtry later".into()
            )
        );
        let long = "x".repeat(400);
        let ProviderError::Failed(cut) = status_failure(StatusCode::BAD_GATEWAY, &long, None)
        else {
            panic!("a failure")
        };
        assert!(cut.ends_with('…') && cut.chars().count() < 340, "{cut}");
        assert_eq!(
            unreadable_error_body(StatusCode::BAD_GATEWAY),
            ProviderError::Failed("unreadable backend error body (status 502)".into())
        );
        assert_eq!(
            stream_too_large(MAX_BODY_BYTES),
            ProviderError::Failed(
                "malformed response: response stream exceeds the 16777216-byte limit".into()
            )
        );
        assert_eq!(
            transport_failure("http://h:1/v1/x", "cannot connect: refused"),
            ProviderError::Failed(
                "http transport failure: cannot connect: refused (http://h:1/v1/x)".into()
            )
        );
    }

    #[test]
    fn json_error_details_never_quote_the_input() {
        let syntax = serde_json::from_str::<serde_json::Value>("{\"secret").unwrap_err();
        assert_eq!(
            json_error_detail(&syntax),
            "EOF while parsing a string at line 1 column 8"
        );
        let data = serde_json::from_str::<u8>("\"secret\"").unwrap_err();
        assert_eq!(json_error_detail(&data), "invalid at line 1 column 8");
    }

    #[test]
    fn transient_failures_are_the_guides_plus_429() {
        let transient = [
            transport_failure("http://h", "cannot connect"),
            malformed("not JSON"),
            stream_too_large(10),
            unreadable_error_body(StatusCode::BAD_REQUEST),
            status_failure(StatusCode::INTERNAL_SERVER_ERROR, "", None),
            status_failure(StatusCode::SERVICE_UNAVAILABLE, "overloaded", None),
            status_failure(StatusCode::TOO_MANY_REQUESTS, "slow down", None),
            status_failure_saying(StatusCode::TOO_MANY_REQUESTS, "slow: 3 of 3 used", None),
        ];
        assert!(transient.iter().all(is_transient));
        let lasting = [
            status_failure(StatusCode::BAD_REQUEST, "", None),
            status_failure(StatusCode::UNAUTHORIZED, "bad key 500", None),
            status_failure_saying(StatusCode::BAD_REQUEST, "500: no", None),
            ProviderError::Failed("missing environment variable: K".into()),
            ProviderError::ContextOverflow("too long".into()),
            ProviderError::Cancelled,
        ];
        assert!(!lasting.iter().any(is_transient));
    }

    #[test]
    fn base_urls_with_or_without_v1_reach_one_endpoint() {
        let at = |base_url: &str| {
            HttpProviderConfig {
                base_url: base_url.into(),
                model: "m".into(),
                api_key_env: None,
                http: HttpSettings::default(),
            }
            .endpoint("/v1/messages")
        };
        for base in [
            "http://h:1",
            "http://h:1/",
            "http://h:1/v1",
            "http://h:1/v1/",
        ] {
            assert_eq!(at(base), "http://h:1/v1/messages", "{base}");
        }
        assert_eq!(at("http://h/api/v1"), "http://h/api/v1/messages");
    }

    #[test]
    fn scrub_key_removes_the_key_from_messages() {
        let error = ProviderError::Failed("bad key sk-123 given".into());
        assert_eq!(
            scrub_key(error, Some("sk-123")),
            ProviderError::Failed("bad key [redacted] given".into())
        );
    }
}
