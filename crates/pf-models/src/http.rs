//! The HTTP transport both HTTP providers share: bounded retries with backoff,
//! a receive timeout per wait, a body size cap, cancellation, key handling.

use std::error::Error as _;
use std::time::Duration;

use pf_harness::{CancellationToken, ProviderError};
use rand::Rng;
use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
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
    /// Retries after the first attempt, on 429, 5xx and broken connections.
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
            max_retries: 3,
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
    /// `base_url` joined with `path` (which starts with `/`), without a doubled slash.
    pub(crate) fn endpoint(&self, path: &str) -> String {
        format!("{}{}", self.base_url.trim_end_matches('/'), path)
    }
}

/// The API key named by `api_key_env`, read now. Errors name the variable, never a value.
pub(crate) fn read_api_key(api_key_env: Option<&str>) -> Result<Option<String>, ProviderError> {
    let Some(variable) = api_key_env else {
        return Ok(None);
    };
    match std::env::var(variable) {
        Ok(key) if key.trim().is_empty() => Err(ProviderError::Failed(format!(
            "the API key variable {variable} is empty"
        ))),
        Ok(key) => Ok(Some(key.trim().to_string())),
        Err(std::env::VarError::NotPresent) => Err(ProviderError::Failed(format!(
            "the API key variable {variable} is not set"
        ))),
        Err(std::env::VarError::NotUnicode(_)) => Err(ProviderError::Failed(format!(
            "the API key variable {variable} does not hold valid UTF-8"
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

/// Replace every occurrence of the key in an error's text, in case a server echoed it.
pub(crate) fn scrub_key(error: ProviderError, key: Option<&str>) -> ProviderError {
    let Some(key) = key.filter(|key| !key.is_empty()) else {
        return error;
    };
    match error {
        ProviderError::Failed(message) => ProviderError::Failed(message.replace(key, "[redacted]")),
        ProviderError::ContextOverflow(message) => {
            ProviderError::ContextOverflow(message.replace(key, "[redacted]"))
        }
        ProviderError::Cancelled => ProviderError::Cancelled,
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

/// A complete HTTP response: whatever its status, the caller interprets it.
#[derive(Debug)]
pub(crate) struct HttpReply {
    pub status: StatusCode,
    pub body: Vec<u8>,
    /// How many attempts it took (1 without retries).
    pub attempts: u32,
}

impl HttpReply {
    /// ` (after N attempts)` when retries happened, else nothing.
    pub(crate) fn attempts_note(&self) -> String {
        if self.attempts > 1 {
            format!(" (after {} attempts)", self.attempts)
        } else {
            String::new()
        }
    }
}

/// The failure for a final non-success status: `HTTP {status}: {message}`, noting retries.
pub(crate) fn status_failure(url: &str, reply: &HttpReply, message: &str) -> ProviderError {
    let detail = if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    };
    ProviderError::Failed(format!(
        "model request to {url} failed: HTTP {}{detail}{}",
        reply.status,
        reply.attempts_note()
    ))
}

/// The outcome of one attempt.
enum Attempt {
    Done(HttpReply),
    /// Worth another try. `reply` is what to hand back if no tries are left.
    Retry {
        reason: String,
        retry_after: Option<Duration>,
        reply: Option<HttpReply>,
    },
    Fatal(ProviderError),
}

#[derive(Debug)]
pub(crate) struct HttpClient {
    client: reqwest::Client,
    settings: HttpSettings,
}

impl HttpClient {
    pub(crate) fn new(settings: HttpSettings) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(settings.receive_timeout)
            // A redirect could carry the key header to another host; model APIs never redirect a POST.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| format!("cannot set up the HTTP client: {error}"))?;
        Ok(HttpClient { client, settings })
    }

    /// POST `body` as JSON to `url`, retrying as [`HttpSettings`] says. Returns the
    /// final response whatever its status; transport failures, timeouts, an
    /// oversized body and cancellation are errors.
    pub(crate) async fn post_json(
        &self,
        url: &str,
        headers: HeaderMap,
        body: &serde_json::Value,
        cancel: &CancellationToken,
    ) -> Result<HttpReply, ProviderError> {
        let body = serde_json::to_vec(body).map_err(|error| {
            ProviderError::Failed(format!("cannot encode the request to {url}: {error}"))
        })?;
        let mut headers = headers;
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let mut attempts: u32 = 0;
        loop {
            attempts += 1;
            let outcome = self.attempt(url, &headers, body.clone(), cancel).await;
            let (reason, retry_after, reply) = match outcome {
                Attempt::Done(mut reply) => {
                    reply.attempts = attempts;
                    return Ok(reply);
                }
                Attempt::Fatal(error) => return Err(error),
                Attempt::Retry {
                    reason,
                    retry_after,
                    reply,
                } => (reason, retry_after, reply),
            };
            if attempts > self.settings.max_retries {
                return match reply {
                    Some(mut reply) => {
                        reply.attempts = attempts;
                        Ok(reply)
                    }
                    None => Err(ProviderError::Failed(format!(
                        "{reason} (after {attempts} attempt{})",
                        if attempts == 1 { "" } else { "s" }
                    ))),
                };
            }
            let delay = match retry_after {
                Some(wanted) => wanted.min(self.settings.max_retry_after),
                None => self.backoff(attempts),
            };
            tracing::warn!(
                "{reason}; retrying in {} (attempt {} of {})",
                describe_duration(delay),
                attempts + 1,
                self.settings.max_retries + 1
            );
            tokio::select! {
                _ = cancel.cancelled() => return Err(ProviderError::Cancelled),
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Exponential backoff with jitter before retry number `retry` (1-based).
    fn backoff(&self, retry: u32) -> Duration {
        let base = self
            .settings
            .initial_backoff
            .saturating_mul(2u32.saturating_pow(retry.saturating_sub(1)));
        let jitter_ceiling = u64::try_from(base.as_millis() / 2).unwrap_or(u64::MAX);
        let jitter = rand::rng().random_range(0..=jitter_ceiling);
        base.saturating_add(Duration::from_millis(jitter))
    }

    async fn attempt(
        &self,
        url: &str,
        headers: &HeaderMap,
        body: Vec<u8>,
        cancel: &CancellationToken,
    ) -> Attempt {
        let timeout = self.settings.receive_timeout;
        let request = self
            .client
            .post(url)
            .headers(headers.clone())
            .body(body)
            .send();
        let sent = tokio::select! {
            _ = cancel.cancelled() => return Attempt::Fatal(ProviderError::Cancelled),
            sent = tokio::time::timeout(timeout, request) => sent,
        };
        let mut response = match sent {
            Err(_) => {
                return Attempt::Fatal(ProviderError::Failed(format!(
                    "model request to {url} failed: no response within {}",
                    describe_duration(timeout)
                )))
            }
            Ok(Err(error)) => {
                let reason = format!("model request to {url} failed: {}", error_chain(&error));
                return if is_broken_connection(&error) {
                    Attempt::Retry {
                        reason,
                        retry_after: None,
                        reply: None,
                    }
                } else {
                    Attempt::Fatal(ProviderError::Failed(reason))
                };
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(Duration::from_secs);

        let cap = self.settings.max_body_bytes;
        let too_large = || {
            Attempt::Fatal(ProviderError::Failed(format!(
                "model request to {url} failed: the response body is larger than the {} cap",
                describe_size(cap)
            )))
        };
        if response
            .content_length()
            .is_some_and(|length| length > cap as u64)
        {
            return too_large();
        }
        let mut body = Vec::new();
        loop {
            let chunk = tokio::select! {
                _ = cancel.cancelled() => return Attempt::Fatal(ProviderError::Cancelled),
                chunk = tokio::time::timeout(timeout, response.chunk()) => chunk,
            };
            match chunk {
                Err(_) => {
                    return Attempt::Fatal(ProviderError::Failed(format!(
                        "model request to {url} failed: the response stalled for more than {} after {} bytes",
                        describe_duration(timeout),
                        body.len()
                    )))
                }
                Ok(Err(error)) => {
                    return Attempt::Retry {
                        reason: format!(
                            "model request to {url} failed: the connection broke while the response was arriving: {}",
                            error_causes(&error)
                        ),
                        retry_after: None,
                        reply: None,
                    }
                }
                Ok(Ok(None)) => break,
                Ok(Ok(Some(bytes))) => {
                    if body.len() + bytes.len() > cap {
                        return too_large();
                    }
                    body.extend_from_slice(&bytes);
                }
            }
        }
        let reply = HttpReply {
            status,
            body,
            attempts: 1,
        };
        if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            Attempt::Retry {
                reason: format!("model request to {url} failed: HTTP {status}"),
                retry_after,
                reply: Some(reply),
            }
        } else {
            Attempt::Done(reply)
        }
    }
}

fn describe_size(bytes: usize) -> String {
    const MIB: usize = 1024 * 1024;
    if bytes >= MIB && bytes % MIB == 0 {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
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

/// A connection that was reset or closed early: worth a retry, unlike a refused one.
fn is_broken_connection(error: &reqwest::Error) -> bool {
    if error.is_connect() {
        return false;
    }
    let mut source = error.source();
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
            ) {
                return true;
            }
        }
        // hyper reports a peer that hung up before answering only in words.
        if cause
            .to_string()
            .contains("connection closed before message completed")
        {
            return true;
        }
        source = cause.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes_read_naturally() {
        assert_eq!(describe_duration(Duration::from_secs(120)), "120 s");
        assert_eq!(describe_duration(Duration::from_millis(200)), "200 ms");
        assert_eq!(describe_size(MAX_BODY_BYTES), "16 MiB");
        assert_eq!(describe_size(1000), "1000 bytes");
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
    fn scrub_key_removes_the_key_from_messages() {
        let error = ProviderError::Failed("bad key sk-123 given".into());
        assert_eq!(
            scrub_key(error, Some("sk-123")),
            ProviderError::Failed("bad key [redacted] given".into())
        );
    }
}
