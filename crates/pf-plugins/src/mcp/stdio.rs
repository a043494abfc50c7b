//! Newline-delimited JSON-RPC over a child's stdin/stdout, with a line cap.
//!
//! rmcp's own child-process transport ends the connection on the first line
//! that does not parse and reads lines of any length; this one skips noise,
//! turns an unparsable answer into an error for its request, and closes the
//! connection (flagging why) when a line exceeds the cap.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rmcp::model::{ErrorData, JsonRpcError, JsonRpcMessage, JsonRpcVersion2_0, NumberOrString};
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

pub(crate) struct StdioTransport<R, W> {
    reader: BufReader<R>,
    writer: Arc<Mutex<Option<W>>>,
    max_line: usize,
    oversize: Arc<AtomicBool>,
    plugin_id: String,
    line: Vec<u8>,
}

impl<R, W> StdioTransport<R, W> {
    pub(crate) fn new(
        read: R,
        write: W,
        max_line: usize,
        oversize: Arc<AtomicBool>,
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
            plugin_id,
            line: Vec::new(),
        }
    }
}

/// An answer that rmcp cannot read still settles its request, as an error.
fn unreadable_answer(line: &[u8]) -> Option<RxJsonRpcMessage<RoleClient>> {
    let value: Json = serde_json::from_slice(line).ok()?;
    if value.get("result").is_none() && value.get("error").is_none() {
        return None;
    }
    let id = match value.get("id")? {
        Json::Number(n) => NumberOrString::Number(n.as_i64()?),
        Json::String(s) => NumberOrString::String(s.as_str().into()),
        _ => return None,
    };
    Some(JsonRpcMessage::Error(JsonRpcError {
        jsonrpc: JsonRpcVersion2_0,
        id,
        error: ErrorData::internal_error("the MCP server sent a malformed answer", None),
    }))
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
        loop {
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
            let line = self.line.as_slice();
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let parsed = match normalized_tool_list(line) {
                Some(value) => serde_json::from_value::<RxJsonRpcMessage<RoleClient>>(value),
                None => serde_json::from_slice::<RxJsonRpcMessage<RoleClient>>(line),
            };
            match parsed {
                Ok(message) => return Some(message),
                Err(_) => {
                    if let Some(answer) = unreadable_answer(line) {
                        tracing::warn!(plugin = %self.plugin_id, "MCP server sent a malformed answer: {}", excerpt(line));
                        return Some(answer);
                    }
                    tracing::warn!(plugin = %self.plugin_id, "ignoring a line that is not an MCP message: {}", excerpt(line));
                }
            }
        }
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

    #[test]
    fn unreadable_answers_become_errors_for_their_id() {
        let answer = unreadable_answer(br#"{"jsonrpc":"2.0","id":7,"result":{"content":5}}"#);
        match answer {
            Some(JsonRpcMessage::Error(error)) => {
                assert_eq!(error.id, NumberOrString::Number(7));
                assert_eq!(
                    error.error.message,
                    "the MCP server sent a malformed answer"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(unreadable_answer(b"garbage").is_none());
        assert!(unreadable_answer(br#"{"method":"x"}"#).is_none());
    }
}
