//! Newline-delimited JSON-RPC over a child's stdin/stdout, with a line cap.
//!
//! rmcp's own child-process transport ends the connection on the first line
//! that does not parse and reads lines of any length; this one skips noise
//! (remembering the last of it for the timeout text), turns an unparsable
//! answer into an error for its request, fails every request in flight when
//! the server answers an id it was never sent (its answers can no longer be
//! trusted to match), and closes the connection (flagging why) when a line
//! exceeds the cap.

use std::collections::{HashSet, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rmcp::model::{
    ClientNotification, ClientRequest, ErrorData, JsonRpcError, JsonRpcMessage, JsonRpcVersion2_0,
    NumberOrString, RequestId,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::RoleClient;
use serde_json::Value as Json;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;

/// How reading one line ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LineRead {
    Line,
    TooLong,
    End,
}

/// Reads one `\n`-terminated line into `line` (newline dropped), keeping at
/// most `max` bytes; a longer line is consumed to its end and reported.
pub(crate) async fn read_line_bounded<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    max: usize,
    line: &mut Vec<u8>,
) -> io::Result<LineRead> {
    line.clear();
    let mut too_long = false;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(if too_long {
                LineRead::TooLong
            } else if line.is_empty() {
                LineRead::End
            } else {
                LineRead::Line
            });
        }
        let (chunk, used, ended) = match available.iter().position(|b| *b == b'\n') {
            Some(at) => (available.get(..at).unwrap_or_default(), at + 1, true),
            None => (available, available.len(), false),
        };
        if !too_long {
            if line.len() + chunk.len() > max {
                too_long = true;
                line.clear();
            } else {
                line.extend_from_slice(chunk);
            }
        }
        reader.consume(used);
        if ended {
            return Ok(if too_long {
                LineRead::TooLong
            } else {
                LineRead::Line
            });
        }
    }
}

/// Shortens noise for a log line.
pub(crate) fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut shown: String = text.chars().take(200).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    shown
}

/// Lines that were not MCP messages since the last request sent or message read.
#[derive(Debug, Default)]
pub(crate) struct NoiseSeen {
    pub lines: u64,
    pub last: String,
}

pub(crate) type Noise = Arc<std::sync::Mutex<NoiseSeen>>;

/// Why the initialize handshake failed, when the server said so (rmcp's
/// handshake would otherwise wait on past an error answer).
pub(crate) type HandshakeFailure = Arc<std::sync::Mutex<Option<String>>>;

/// `; it sent 2 lines that are not MCP messages, the last: …`, or nothing.
pub(crate) fn noise_suffix(noise: &Noise) -> String {
    match noise.lock() {
        Ok(seen) if seen.lines == 1 => {
            format!("; it sent 1 line that is not an MCP message: {}", seen.last)
        }
        Ok(seen) if seen.lines > 1 => format!(
            "; it sent {} lines that are not MCP messages, the last: {}",
            seen.lines, seen.last
        ),
        _ => String::new(),
    }
}

/// Abandoned request ids remembered, so their late answers are not mistaken for wrong ids.
const ABANDONED_KEPT: usize = 1024;

pub(crate) struct StdioTransport<R, W> {
    reader: BufReader<R>,
    writer: Arc<Mutex<Option<W>>>,
    max_line: usize,
    oversize: Arc<AtomicBool>,
    noise: Noise,
    handshake_failure: HandshakeFailure,
    /// The initialize request, until it is answered.
    initialize_id: Option<RequestId>,
    plugin_id: String,
    line: Vec<u8>,
    /// Requests sent and not yet answered.
    in_flight: HashSet<RequestId>,
    /// Requests given up on (announced as cancelled); a late answer is dropped.
    abandoned: VecDeque<RequestId>,
    /// Messages made up for the client, delivered before reading on.
    pending: VecDeque<RxJsonRpcMessage<RoleClient>>,
}

impl<R, W> StdioTransport<R, W> {
    pub(crate) fn new(
        read: R,
        write: W,
        max_line: usize,
        oversize: Arc<AtomicBool>,
        noise: Noise,
        handshake_failure: HandshakeFailure,
        plugin_id: String,
    ) -> Self
    where
        R: tokio::io::AsyncRead,
    {
        StdioTransport {
            reader: BufReader::new(read),
            writer: Arc::new(Mutex::new(Some(write))),
            max_line,
            oversize,
            noise,
            handshake_failure,
            initialize_id: None,
            plugin_id,
            line: Vec::new(),
            in_flight: HashSet::new(),
            abandoned: VecDeque::new(),
            pending: VecDeque::new(),
        }
    }

    /// Notes what an outgoing message means for the requests in flight.
    fn track_sent(&mut self, item: &TxJsonRpcMessage<RoleClient>) {
        match item {
            JsonRpcMessage::Request(request) => {
                self.in_flight.insert(request.id.clone());
                if matches!(request.request, ClientRequest::InitializeRequest(_)) {
                    self.initialize_id = Some(request.id.clone());
                }
                self.note_message();
            }
            JsonRpcMessage::Notification(notification) => {
                if let ClientNotification::CancelledNotification(cancelled) =
                    &notification.notification
                {
                    let Some(id) = &cancelled.params.request_id else {
                        return;
                    };
                    if self.in_flight.remove(id) {
                        if self.abandoned.len() == ABANDONED_KEPT {
                            self.abandoned.pop_front();
                        }
                        self.abandoned.push_back(id.clone());
                    }
                }
            }
            _ => {}
        }
    }

    fn forget_abandoned(&mut self, id: &RequestId) -> bool {
        match self.abandoned.iter().position(|a| a == id) {
            Some(at) => {
                self.abandoned.remove(at);
                true
            }
            None => false,
        }
    }

    /// What to make of an answer for `id`: deliver it, drop it (a late answer to
    /// an abandoned request), or treat it as a protocol violation.
    fn judge_answer(&mut self, id: Option<&RequestId>) -> AnswerFate {
        match id {
            Some(id) if self.in_flight.remove(id) => AnswerFate::Deliver,
            Some(id) if self.forget_abandoned(id) => AnswerFate::Drop,
            _ => AnswerFate::Violation,
        }
    }

    /// Fails every request in flight with `message`; the server broke the protocol.
    fn fail_in_flight(&mut self, message: String) {
        tracing::warn!(plugin = %self.plugin_id, "{message}");
        for id in self.in_flight.drain() {
            self.pending.push_back(error_for(id, message.clone()));
        }
    }

    fn note_noise(&self, line: &[u8]) {
        if let Ok(mut seen) = self.noise.lock() {
            seen.lines += 1;
            seen.last = super::process::escape_line(line);
        }
    }

    fn note_message(&self) {
        if let Ok(mut seen) = self.noise.lock() {
            *seen = NoiseSeen::default();
        }
    }
}

impl<R, W> StdioTransport<R, W>
where
    R: tokio::io::AsyncRead + Send + Unpin + 'static,
{
    /// The next message for the client: a made-up one first, else the next line that is one.
    async fn next_message(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            if let Some(made_up) = self.pending.pop_front() {
                return Some(made_up);
            }
            match read_line_bounded(&mut self.reader, self.max_line, &mut self.line).await {
                Err(_) | Ok(LineRead::End) => return None,
                Ok(LineRead::TooLong) => {
                    self.oversize.store(true, Ordering::SeqCst);
                    tracing::warn!(
                        plugin = %self.plugin_id,
                        "MCP server sent a message over {} bytes; closing the connection",
                        self.max_line
                    );
                    return None;
                }
                Ok(LineRead::Line) => {}
            }
            let line = std::mem::take(&mut self.line);
            let outcome = self.take_line(&line);
            self.line = line;
            if let Some(message) = outcome {
                return Some(message);
            }
        }
    }

    /// One line from the server: a message for the client, or nothing (noise,
    /// a dropped late answer, or a violation whose errors wait in `pending`).
    fn take_line(&mut self, line: &[u8]) -> Option<RxJsonRpcMessage<RoleClient>> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        let parsed = match normalized_tool_list(line) {
            Some(value) => serde_json::from_value::<RxJsonRpcMessage<RoleClient>>(value),
            None => serde_json::from_slice::<RxJsonRpcMessage<RoleClient>>(line),
        };
        let id = self.plugin_id.clone();
        match parsed {
            Ok(message) => {
                self.note_message();
                let answered = match &message {
                    JsonRpcMessage::Response(response) => Some(response.id.clone()),
                    JsonRpcMessage::Error(error) => match &error.id {
                        Some(answered) => Some(answered.clone()),
                        None => {
                            // An error with a null id (a parse error, say) answers no
                            // request, so no answer can be trusted to match any more.
                            self.fail_in_flight(format!(
                                "MCP server {id} reported an error for no request: {}",
                                super::process::escape_line(error.error.message.as_bytes())
                            ));
                            return None;
                        }
                    },
                    _ => return Some(message),
                };
                match self.judge_answer(answered.as_ref()) {
                    AnswerFate::Deliver => Some(message),
                    AnswerFate::Drop => None,
                    AnswerFate::Violation => {
                        let shown = answered.map(|a| a.to_string()).unwrap_or_default();
                        self.fail_in_flight(format!(
                            "MCP server {id} answered request id {}, which it was never sent",
                            super::process::escape_line(shown.as_bytes())
                        ));
                        None
                    }
                }
            }
            Err(_) => match answer_shape(line) {
                Some((answered, value)) => {
                    self.note_message();
                    match self.judge_answer(answered.as_ref()) {
                        AnswerFate::Deliver => {
                            tracing::warn!(plugin = %id, "MCP server sent a malformed answer: {}", excerpt(line));
                            answered.map(|answered| {
                                error_for(answered, "the MCP server sent a malformed answer".into())
                            })
                        }
                        AnswerFate::Drop => None,
                        AnswerFate::Violation => {
                            let message = match value.get("error").and_then(|e| e.get("message")) {
                                Some(Json::String(reported)) if answered.is_none() => format!(
                                    "MCP server {id} reported an error for no request: {}",
                                    super::process::escape_line(reported.as_bytes())
                                ),
                                _ => format!(
                                    "MCP server {id} sent an answer with an id it was never sent: {}",
                                    super::process::escape_line(
                                        value.get("id").map(Json::to_string).unwrap_or_default().as_bytes()
                                    )
                                ),
                            };
                            self.fail_in_flight(message);
                            None
                        }
                    }
                }
                None => {
                    tracing::warn!(plugin = %id, "ignoring a line that is not an MCP message: {}", excerpt(line));
                    self.note_noise(line);
                    None
                }
            },
        }
    }
}

enum AnswerFate {
    Deliver,
    Drop,
    Violation,
}

fn error_for(id: RequestId, message: String) -> RxJsonRpcMessage<RoleClient> {
    JsonRpcMessage::Error(JsonRpcError {
        jsonrpc: JsonRpcVersion2_0,
        id: Some(id),
        error: ErrorData::internal_error(message, None),
    })
}

/// An answer-shaped line that rmcp cannot read: a JSON object with an `id`
/// and no `method`. Its id, when it is one a request could carry.
fn answer_shape(line: &[u8]) -> Option<(Option<RequestId>, Json)> {
    let value: Json = serde_json::from_slice(line).ok()?;
    let object = value.as_object()?;
    if object.contains_key("method") || !object.contains_key("id") {
        return None;
    }
    let id = match object.get("id") {
        Some(Json::Number(n)) => n.as_i64().map(NumberOrString::Number),
        Some(Json::String(s)) => Some(NumberOrString::String(s.as_str().into())),
        _ => None,
    };
    Some((id, value))
}

/// The key under which a tool schema that is not a JSON object travels
/// through rmcp's typed model (which only holds objects).
pub(crate) const WRAPPED_SCHEMA: &str = "x-promptforge-wrapped-schema";

/// A `tools/list` answer with every non-object `inputSchema`/`outputSchema`
/// wrapped as `{WRAPPED_SCHEMA: value}`, so one odd tool neither hides the
/// whole list nor loses its schema (the Engine judges the schema at binding).
fn normalized_tool_list(line: &[u8]) -> Option<Json> {
    let marker = b"\"tools\"";
    if !line.windows(marker.len()).any(|window| window == marker) {
        return None;
    }
    let mut value: Json = serde_json::from_slice(line).ok()?;
    let tools = value.get_mut("result")?.get_mut("tools")?.as_array_mut()?;
    for tool in tools.iter_mut().filter_map(Json::as_object_mut) {
        let input = tool.remove("inputSchema").unwrap_or(Json::Null);
        let input = if input.is_object() {
            input
        } else {
            serde_json::json!({ WRAPPED_SCHEMA: input })
        };
        tool.insert("inputSchema".into(), input);
        if let Some(output) = tool.get_mut("outputSchema") {
            if !output.is_object() && !output.is_null() {
                *output = serde_json::json!({ WRAPPED_SCHEMA: output.take() });
            }
        }
    }
    Some(value)
}

impl<R, W> Transport<RoleClient> for StdioTransport<R, W>
where
    R: tokio::io::AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.track_sent(&item);
        let writer = self.writer.clone();
        let encoded = serde_json::to_vec(&item);
        async move {
            let mut line = encoded.map_err(io::Error::other)?;
            line.push(b'\n');
            let mut guard = writer.lock().await;
            let stdin = guard
                .as_mut()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "transport closed"))?;
            stdin.write_all(&line).await?;
            stdin.flush().await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let message = self.next_message().await?;
        let answered = match &message {
            JsonRpcMessage::Response(response) => Some(&response.id),
            JsonRpcMessage::Error(error) => error.id.as_ref(),
            _ => None,
        };
        if answered.is_some() && answered == self.initialize_id.as_ref() {
            self.initialize_id = None;
            if let JsonRpcMessage::Error(error) = &message {
                // Ending the stream ends the handshake; the reason is kept for its text.
                if let Ok(mut failure) = self.handshake_failure.lock() {
                    *failure = Some(error.error.message.to_string());
                }
                return None;
            }
        }
        Some(message)
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // Dropping stdin is how a stdio server learns the session is over.
        let stdin = self.writer.lock().await.take();
        if let Some(mut stdin) = stdin {
            let _ = stdin.shutdown().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bounded_lines_report_overflow_and_resume_after_it() {
        let data = b"short\n0123456789abc\nnext\nlast".to_vec();
        let mut reader = BufReader::with_capacity(4, data.as_slice());
        let mut line = Vec::new();
        assert_eq!(
            read_line_bounded(&mut reader, 10, &mut line).await.ok(),
            Some(LineRead::Line)
        );
        assert_eq!(line, b"short");
        assert_eq!(
            read_line_bounded(&mut reader, 10, &mut line).await.ok(),
            Some(LineRead::TooLong)
        );
        assert_eq!(
            read_line_bounded(&mut reader, 10, &mut line).await.ok(),
            Some(LineRead::Line)
        );
        assert_eq!(line, b"next");
        assert_eq!(
            read_line_bounded(&mut reader, 10, &mut line).await.ok(),
            Some(LineRead::Line)
        );
        assert_eq!(line, b"last");
        assert_eq!(
            read_line_bounded(&mut reader, 10, &mut line).await.ok(),
            Some(LineRead::End)
        );
    }

    #[test]
    fn odd_tool_schemas_are_wrapped_not_lost() {
        let line = br#"{"jsonrpc":"2.0","id":2,"result":{"tools":[
            {"name":"a","inputSchema":{"type":"object"}},
            {"name":"b","inputSchema":["not","an","object"],"outputSchema":true},
            {"name":"c"}]}}"#;
        let line: Vec<u8> = line.iter().copied().filter(|b| *b != b'\n').collect();
        let value = normalized_tool_list(&line).expect("a tool list");
        let tools = &value["result"]["tools"];
        assert_eq!(
            tools[0]["inputSchema"],
            serde_json::json!({"type": "object"})
        );
        assert_eq!(
            tools[1]["inputSchema"],
            serde_json::json!({ WRAPPED_SCHEMA: ["not", "an", "object"] })
        );
        assert_eq!(
            tools[1]["outputSchema"],
            serde_json::json!({ WRAPPED_SCHEMA: true })
        );
        assert_eq!(
            tools[2]["inputSchema"],
            serde_json::json!({ WRAPPED_SCHEMA: null })
        );
        assert!(normalized_tool_list(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#).is_none());
    }

    fn transport() -> StdioTransport<tokio::io::Empty, tokio::io::Sink> {
        StdioTransport::new(
            tokio::io::empty(),
            tokio::io::sink(),
            1024,
            Arc::new(AtomicBool::new(false)),
            Noise::default(),
            HandshakeFailure::default(),
            "acme/kit".into(),
        )
    }

    fn sent(transport: &mut StdioTransport<tokio::io::Empty, tokio::io::Sink>, message: Json) {
        let message: TxJsonRpcMessage<RoleClient> =
            serde_json::from_value(message).expect("a client message");
        transport.track_sent(&message);
    }

    fn error_text(message: Option<RxJsonRpcMessage<RoleClient>>) -> (NumberOrString, String) {
        match message {
            Some(JsonRpcMessage::Error(error)) => (
                error.id.expect("an error answer names its id"),
                error.error.message.to_string(),
            ),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn unreadable_answers_become_errors_for_their_id() {
        let mut t = transport();
        sent(
            &mut t,
            serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "ping"}),
        );
        let answer = t.take_line(br#"{"jsonrpc":"2.0","id":7,"result":{"content":5}}"#);
        // A ping answer of any shape parses; a missing result does not.
        assert!(answer.is_some());
        sent(
            &mut t,
            serde_json::json!({"jsonrpc": "2.0", "id": 8, "method": "ping"}),
        );
        let (id, message) = error_text(t.take_line(br#"{"jsonrpc":"1.0","id":8}"#));
        assert_eq!(id, NumberOrString::Number(8));
        assert_eq!(message, "the MCP server sent a malformed answer");
        assert!(t.take_line(b"garbage").is_none());
        assert!(t.take_line(br#"{"method":"x"}"#).is_none());
        assert_eq!(t.noise.lock().map(|n| n.lines).unwrap_or(0), 2);
        assert_eq!(
            noise_suffix(&t.noise),
            "; it sent 2 lines that are not MCP messages, the last: {\"method\":\"x\"}"
        );
    }

    #[test]
    fn an_answer_to_an_id_never_sent_fails_every_request_in_flight() {
        let mut t = transport();
        sent(
            &mut t,
            serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}),
        );
        sent(
            &mut t,
            serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "ping"}),
        );
        assert!(t
            .take_line(br#"{"jsonrpc":"2.0","id":99,"result":{}}"#)
            .is_none());
        let mut failed: Vec<(NumberOrString, String)> =
            t.pending.drain(..).map(|m| error_text(Some(m))).collect();
        failed.sort_by_key(|(id, _)| id.to_string());
        assert_eq!(failed.len(), 2);
        assert_eq!(failed[0].0, NumberOrString::Number(1));
        assert_eq!(
            failed[1].1,
            "MCP server acme/kit answered request id 99, which it was never sent"
        );
        // An error for no request (id null) is a violation too, with the server's words.
        sent(
            &mut t,
            serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}),
        );
        assert!(t
            .take_line(
                br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"parse\nerror"}}"#
            )
            .is_none());
        let (id, message) = error_text(t.pending.pop_front());
        assert_eq!(id, NumberOrString::Number(3));
        assert_eq!(
            message,
            "MCP server acme/kit reported an error for no request: parse\\nerror"
        );
    }

    #[test]
    fn a_late_answer_to_an_abandoned_request_is_dropped_quietly() {
        let mut t = transport();
        sent(
            &mut t,
            serde_json::json!({"jsonrpc": "2.0", "id": 5, "method": "ping"}),
        );
        sent(
            &mut t,
            serde_json::json!({"jsonrpc": "2.0", "id": 6, "method": "ping"}),
        );
        sent(
            &mut t,
            serde_json::json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}}),
        );
        assert!(t
            .take_line(br#"{"jsonrpc":"2.0","id":5,"result":{}}"#)
            .is_none());
        assert!(t.pending.is_empty());
        assert!(t
            .take_line(br#"{"jsonrpc":"2.0","id":6,"result":{}}"#)
            .is_some());
        // The same id twice is an answer to nothing.
        sent(
            &mut t,
            serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "ping"}),
        );
        assert!(t
            .take_line(br#"{"jsonrpc":"2.0","id":6,"result":{}}"#)
            .is_none());
        assert_eq!(t.pending.len(), 1);
    }
}
