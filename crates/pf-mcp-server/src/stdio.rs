//! The server's stdio transport: newline-delimited JSON-RPC on stdin/stdout.
//!
//! rmcp's own stdio transport skips a line that is not JSON without a word
//! and reads lines of any length. JSON-RPC answers such a line with a parse
//! error (-32700, id null); this transport does, and answers a line longer
//! than `--max-body` with an invalid-request error without keeping it. Either
//! way the session goes on with the next line.

use std::io;

use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::RoleServer;
use serde_json::{json, Value as Json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

/// JSON-RPC's parse error code.
const PARSE_ERROR: i64 = -32700;
/// JSON-RPC's invalid request code.
const INVALID_REQUEST: i64 = -32600;

/// One line for the writer task, and where to say whether it was written.
struct Outgoing {
    line: Vec<u8>,
    written: Option<oneshot::Sender<io::Result<()>>>,
}

/// Reads requests line by line (at most `max_line` bytes each) and writes
/// every answer through one writer task, so an error answered from inside
/// `receive` never interleaves with a message rmcp sends.
pub struct StdioServerTransport<R> {
    reader: BufReader<R>,
    line: Vec<u8>,
    /// The line being read went past `max_line`: the rest of it is skipped.
    too_long: bool,
    max_line: usize,
    out: Option<mpsc::UnboundedSender<Outgoing>>,
}

impl<R: AsyncRead + Send + Unpin + 'static> StdioServerTransport<R> {
    pub fn new<W: AsyncWrite + Send + Unpin + 'static>(
        reader: R,
        writer: W,
        max_line: usize,
    ) -> Self {
        let (out, pending) = mpsc::unbounded_channel();
        tokio::spawn(write_lines(writer, pending));
        StdioServerTransport {
            reader: BufReader::new(reader),
            line: Vec::new(),
            too_long: false,
            max_line,
            out: Some(out),
        }
    }

    /// Queues an error answer; it goes out in order with everything else.
    fn answer_error(&self, id: Json, code: i64, message: String) {
        let answer =
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
        if let (Some(out), Ok(line)) = (&self.out, serde_json::to_vec(&answer)) {
            let _ = out.send(Outgoing {
                line,
                written: None,
            });
        }
    }

    /// Reads until one whole line is held in `self.line`. Every await is on
    /// `fill_buf`, which loses nothing when the read is dropped midway (rmcp
    /// polls `receive` inside a `select!`), and the line so far lives in `self`.
    async fn next_line(&mut self) -> Option<()> {
        loop {
            let available = match self.reader.fill_buf().await {
                Ok(available) => available,
                Err(e) => {
                    tracing::error!("reading stdin: {e}");
                    return None;
                }
            };
            if available.is_empty() {
                // End of input: a last line without its newline still counts.
                return (!self.line.is_empty() && !self.too_long).then_some(());
            }
            let (chunk, used, ended) = match available.iter().position(|b| *b == b'\n') {
                Some(at) => (available.get(..at).unwrap_or_default(), at + 1, true),
                None => (available, available.len(), false),
            };
            if !self.too_long {
                if self.line.len() + chunk.len() > self.max_line {
                    self.too_long = true;
                    self.line = Vec::new();
                } else {
                    self.line.extend_from_slice(chunk);
                }
            }
            self.reader.consume(used);
            if !ended {
                continue;
            }
            if self.too_long {
                self.too_long = false;
                self.answer_error(
                    Json::Null,
                    INVALID_REQUEST,
                    format!(
                        "request larger than {} bytes (the server's --max-body); it was not read",
                        self.max_line
                    ),
                );
                continue;
            }
            return Some(());
        }
    }
}

/// Writes each queued line with its newline, in order, until the queue closes.
async fn write_lines<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut pending: mpsc::UnboundedReceiver<Outgoing>,
) {
    while let Some(Outgoing { mut line, written }) = pending.recv().await {
        line.push(b'\n');
        let result = match writer.write_all(&line).await {
            Ok(()) => writer.flush().await,
            Err(e) => Err(e),
        };
        if let Some(written) = written {
            let _ = written.send(result);
        }
    }
}

/// What a line that is not a message gets: a parse error when it is not JSON,
/// an invalid-request error (with its id, if it has a usable one) when it is
/// JSON of the wrong shape.
fn rejection(line: &[u8], error: &serde_json::Error) -> (Json, i64, String) {
    match error.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            (Json::Null, PARSE_ERROR, format!("Parse error: {error}"))
        }
        serde_json::error::Category::Data | serde_json::error::Category::Io => {
            let id = serde_json::from_slice::<Json>(line)
                .ok()
                .and_then(|value| value.get("id").cloned())
                .filter(|id| id.is_string() || id.is_i64() || id.is_u64())
                .unwrap_or(Json::Null);
            (id, INVALID_REQUEST, format!("Invalid request: {error}"))
        }
    }
}

impl<R: AsyncRead + Send + Unpin + 'static> Transport<RoleServer> for StdioServerTransport<R> {
    type Error = io::Error;

    fn name() -> std::borrow::Cow<'static, str> {
        "stdio".into()
    }

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let out = self.out.clone();
        let encoded = serde_json::to_vec(&item);
        async move {
            let line = encoded.map_err(io::Error::other)?;
            let out = out.ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "closed"))?;
            let (written, result) = oneshot::channel();
            out.send(Outgoing {
                line,
                written: Some(written),
            })
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "stdout is closed"))?;
            result.await.unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "stdout is closed",
                ))
            })
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            self.next_line().await?;
            let line = std::mem::take(&mut self.line);
            let text = line.strip_suffix(b"\r").unwrap_or(&line);
            let text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(text) {
                Ok(message) => return Some(message),
                Err(error) => {
                    let (id, code, message) = rejection(text, &error);
                    tracing::warn!(
                        "answered a line that is not an MCP message with {code}: {message}"
                    );
                    self.answer_error(id, code, message);
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        // The writer task ends once the queued lines are written.
        self.out = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn answers_to(input: &'static [u8], max_line: usize) -> (Vec<Json>, usize) {
        let (writer, mut read_back) = tokio::io::duplex(1 << 16);
        let mut transport = StdioServerTransport::new(input, writer, max_line);
        let mut messages = 0;
        while transport.receive().await.is_some() {
            messages += 1;
        }
        transport.close().await.ok();
        drop(transport);
        let mut written = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut read_back, &mut written)
            .await
            .ok();
        let answers = written
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap_or(Json::Null))
            .collect();
        (answers, messages)
    }

    #[tokio::test]
    async fn a_line_that_is_not_json_gets_a_parse_error_and_reading_goes_on() {
        let input = b"not json\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n";
        let (answers, messages) = answers_to(input, 1024).await;
        assert_eq!(messages, 1);
        assert_eq!(answers.len(), 1, "{answers:?}");
        assert_eq!(answers[0]["id"], Json::Null);
        assert_eq!(answers[0]["error"]["code"], json!(-32700));
    }

    #[tokio::test]
    async fn json_of_the_wrong_shape_is_an_invalid_request_with_its_id() {
        let input = b"{\"jsonrpc\":\"2.0\",\"id\":7,\"params\":3}\n\n[1,2]\n";
        let (answers, messages) = answers_to(input, 1024).await;
        assert_eq!(messages, 0);
        assert_eq!(answers.len(), 2, "{answers:?}");
        assert_eq!(answers[0]["id"], json!(7));
        assert_eq!(answers[0]["error"]["code"], json!(-32600));
        assert_eq!(answers[1]["id"], Json::Null);
    }

    #[tokio::test]
    async fn a_line_over_the_limit_is_refused_unread_and_the_next_one_is_read() {
        let mut input = vec![b'x'; 5000];
        input.extend_from_slice(b"\n{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"ping\"}\n");
        let input: &'static [u8] = Box::leak(input.into_boxed_slice());
        let (answers, messages) = answers_to(input, 1024).await;
        assert_eq!(messages, 1);
        assert_eq!(answers.len(), 1, "{answers:?}");
        assert_eq!(answers[0]["error"]["code"], json!(-32600));
        let message = answers[0]["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("--max-body"), "{message}");
    }
}
