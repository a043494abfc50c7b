//! Input brokers: where `input.ask` gets the operator's next message.

use std::collections::VecDeque;
use std::io::{BufRead, IsTerminal, Write};
use std::sync::Mutex;

use async_trait::async_trait;
use pf_harness::{CancellationToken, InputBroker, WorkId};

/// Answers from a fixed list, in order; afterwards no input is available.
#[derive(Debug, Default)]
pub struct FixedAnswersBroker {
    answers: Mutex<VecDeque<String>>,
}

impl FixedAnswersBroker {
    pub fn new(answers: impl IntoIterator<Item = String>) -> Self {
        FixedAnswersBroker {
            answers: Mutex::new(answers.into_iter().collect()),
        }
    }
}

#[async_trait]
impl InputBroker for FixedAnswersBroker {
    async fn ask(
        &self,
        _question: &str,
        _work: &WorkId,
        _cancel: CancellationToken,
    ) -> Result<Option<String>, String> {
        let mut answers = self
            .answers
            .lock()
            .map_err(|_| "the answer list is unavailable".to_string())?;
        Ok(answers.pop_front())
    }
}

/// Asks on the terminal: the question on stderr, one line from stdin. When
/// stdin is not a terminal, no input is available.
#[derive(Debug, Clone, Copy)]
pub struct StdinInputBroker {
    interactive: bool,
}

impl StdinInputBroker {
    /// Interactive exactly when stdin is a terminal.
    pub fn new() -> Self {
        StdinInputBroker {
            interactive: std::io::stdin().is_terminal(),
        }
    }

    /// Whether questions go to the terminal.
    pub fn is_interactive(&self) -> bool {
        self.interactive
    }
}

impl Default for StdinInputBroker {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl InputBroker for StdinInputBroker {
    async fn ask(
        &self,
        question: &str,
        _work: &WorkId,
        cancel: CancellationToken,
    ) -> Result<Option<String>, String> {
        if !self.interactive {
            return Ok(None);
        }
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let question = question.to_string();
        // A plain thread, not the runtime's blocking pool: a read that never
        // returns must not hold up runtime shutdown after a cancel.
        std::thread::Builder::new()
            .name("promptforge-input".into())
            .spawn(move || {
                let answer = ask_line(
                    &question,
                    &mut std::io::stdin().lock(),
                    &mut std::io::stderr().lock(),
                );
                let _ = sender.send(answer);
            })
            .map_err(|e| format!("cannot read from the terminal: {e}"))?;
        tokio::select! {
            answer = receiver => answer.map_err(|_| "the terminal reader stopped".to_string())?,
            _ = cancel.cancelled() => Err("cancelled while waiting for input".into()),
        }
    }
}

/// Writes the question, reads one line; end of input means no answer.
fn ask_line(
    question: &str,
    input: &mut impl BufRead,
    output: &mut impl Write,
) -> Result<Option<String>, String> {
    let prompt = if question.ends_with('\n') || question.is_empty() {
        question.to_string()
    } else {
        format!("{question}\n")
    };
    output
        .write_all(format!("{prompt}> ").as_bytes())
        .and_then(|_| output.flush())
        .map_err(|e| format!("cannot write the question: {e}"))?;
    let mut line = String::new();
    let read = input
        .read_line(&mut line)
        .map_err(|e| format!("cannot read the answer: {e}"))?;
    if read == 0 {
        return Ok(None);
    }
    let answer = line
        .strip_suffix('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .unwrap_or(&line);
    Ok(Some(answer.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fixed_answers_come_in_order_then_none() {
        let broker = FixedAnswersBroker::new(["yes".to_string(), "no".to_string()]);
        let cancel = CancellationToken::new();
        assert_eq!(
            broker
                .ask("q1", &pf_harness::WorkId::new("0", 0), cancel.clone())
                .await,
            Ok(Some("yes".into()))
        );
        assert_eq!(
            broker
                .ask("q2", &pf_harness::WorkId::new("0", 0), cancel.clone())
                .await,
            Ok(Some("no".into()))
        );
        assert_eq!(
            broker
                .ask("q3", &pf_harness::WorkId::new("0", 0), cancel.clone())
                .await,
            Ok(None)
        );
        assert_eq!(
            broker
                .ask("q4", &pf_harness::WorkId::new("0", 0), cancel)
                .await,
            Ok(None)
        );
    }

    #[test]
    fn terminal_question_goes_out_and_one_line_comes_back() {
        let mut input = std::io::Cursor::new(b"blue\r\nsecond line\n".to_vec());
        let mut output = Vec::new();
        assert_eq!(
            ask_line("Favourite colour?", &mut input, &mut output),
            Ok(Some("blue".into()))
        );
        assert_eq!(String::from_utf8_lossy(&output), "Favourite colour?\n> ");
        assert_eq!(
            ask_line("Next?", &mut input, &mut Vec::new()),
            Ok(Some("second line".into()))
        );
        assert_eq!(ask_line("More?", &mut input, &mut Vec::new()), Ok(None));
    }

    #[tokio::test]
    async fn non_terminal_stdin_has_no_input() {
        let broker = StdinInputBroker { interactive: false };
        assert_eq!(
            broker
                .ask(
                    "q",
                    &pf_harness::WorkId::new("0", 0),
                    CancellationToken::new()
                )
                .await,
            Ok(None)
        );
    }
}
