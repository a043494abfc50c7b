//! Server-sent events: splits a byte stream into events as the HTML standard's
//! event-stream format describes (lines end in LF, CRLF or CR; a blank line
//! ends an event; `data:` lines join with LF; `:` lines are comments).

use std::collections::VecDeque;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    /// The `event:` field, when the event set one.
    pub kind: Option<String>,
    /// The `data:` lines, joined with LF.
    pub data: String,
}

/// Feeds on chunks as they arrive and hands out complete events.
#[derive(Debug, Default)]
pub(crate) struct Parser {
    /// The bytes of the line still being received.
    line: Vec<u8>,
    /// The previous chunk ended in CR, so a LF opening the next one ends nothing.
    after_cr: bool,
    kind: Option<String>,
    data: String,
    has_data: bool,
    ready: VecDeque<Event>,
}

impl Parser {
    /// Take in the next chunk. Fails when a line is not UTF-8.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Result<(), String> {
        for &byte in chunk {
            let after_cr = std::mem::take(&mut self.after_cr);
            match byte {
                b'\n' if after_cr => {}
                b'\n' => self.end_line()?,
                b'\r' => {
                    self.end_line()?;
                    self.after_cr = true;
                }
                other => self.line.push(other),
            }
        }
        Ok(())
    }

    /// The next complete event, if one has arrived.
    pub(crate) fn next_event(&mut self) -> Option<Event> {
        self.ready.pop_front()
    }

    fn end_line(&mut self) -> Result<(), String> {
        let bytes = std::mem::take(&mut self.line);
        let line = String::from_utf8(bytes)
            .map_err(|_| "the event stream holds a line that is not UTF-8".to_string())?;
        if line.is_empty() {
            self.dispatch();
            return Ok(());
        }
        if line.starts_with(':') {
            return Ok(());
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_str(), ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.kind = Some(value.to_string()),
            // `id` and `retry` steer reconnection, which a model call never does.
            _ => {}
        }
        Ok(())
    }

    fn dispatch(&mut self) {
        let kind = self.kind.take();
        if !std::mem::take(&mut self.has_data) {
            return;
        }
        self.ready.push_back(Event {
            kind,
            data: std::mem::take(&mut self.data),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(chunks: &[&[u8]]) -> Vec<Event> {
        let mut parser = Parser::default();
        let mut out = Vec::new();
        for chunk in chunks {
            parser.feed(chunk).unwrap();
            while let Some(event) = parser.next_event() {
                out.push(event);
            }
        }
        out
    }

    fn data(text: &str) -> Event {
        Event {
            kind: None,
            data: text.to_string(),
        }
    }

    #[test]
    fn events_end_at_blank_lines_whatever_the_line_ending() {
        assert_eq!(
            events(&[b"data: a\n\ndata: b\r\n\r\ndata: c\r\rdata:d\n\n"]),
            vec![data("a"), data("b"), data("c"), data("d")]
        );
    }

    #[test]
    fn lines_and_crlf_pairs_may_split_across_chunks() {
        assert_eq!(
            events(&[b"da", b"ta: {\"x\"", b":1}\r", b"\n\r", b"\n"]),
            vec![data("{\"x\":1}")]
        );
    }

    #[test]
    fn data_lines_join_comments_are_skipped_and_kinds_kept() {
        assert_eq!(
            events(&[b": keep-alive\n\nevent: ping\ndata: one\ndata: two\nid: 7\n\n"]),
            vec![Event {
                kind: Some("ping".into()),
                data: "one\ntwo".into()
            }]
        );
    }

    #[test]
    fn an_event_without_its_blank_line_is_not_dispatched() {
        assert_eq!(events(&[b"data: cut"]), Vec::new());
    }

    #[test]
    fn a_line_that_is_not_utf8_is_an_error() {
        let mut parser = Parser::default();
        assert_eq!(
            parser.feed(b"data: \xff\n"),
            Err("the event stream holds a line that is not UTF-8".to_string())
        );
    }
}
