//! Live output: a loop round's text as it streams, for a person at a terminal.

use pf_engine::LiveText;
use std::io::Write;

/// Shows live output: each `models.loop` round's text as it streams, under a
/// `[section, round N]` line whenever the round changes.
#[derive(Debug, Default)]
pub struct LivePrinter {
    /// The section and round whose text is showing.
    round: Option<(String, u32)>,
    at_line_start: bool,
}

impl LivePrinter {
    pub fn write(&mut self, out: &mut impl Write, text: LiveText<'_>) -> std::io::Result<()> {
        let round = (text.section.to_string(), text.turn);
        if self.round.as_ref() != Some(&round) {
            if self.round.is_some() && !self.at_line_start {
                writeln!(out)?;
            }
            writeln!(out, "[{}, round {}]", printable(text.section), text.turn)?;
            self.round = Some(round);
            self.at_line_start = true;
        }
        if !text.text.is_empty() {
            write!(out, "{}", printable(text.text))?;
            self.at_line_start = text.text.ends_with('\n');
        }
        out.flush()
    }

    /// End the live output on a line of its own, before the run's own output.
    pub fn finish(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if self.round.is_some() && !self.at_line_start {
            self.at_line_start = true;
            writeln!(out)?;
        }
        out.flush()
    }
}

pub use pf_trace::logview::printable;

#[cfg(test)]
mod tests {
    use super::*;

    fn show(printer: &mut LivePrinter, out: &mut Vec<u8>, section: &str, turn: u32, text: &str) {
        let fragment = LiveText {
            section,
            turn,
            text,
        };
        printer.write(out, fragment).expect("write to memory");
    }

    #[test]
    fn each_round_gets_its_own_heading_and_the_output_ends_its_line() {
        let mut printer = LivePrinter::default();
        let mut out = Vec::new();
        show(&mut printer, &mut out, "Draft", 1, "Hel");
        show(&mut printer, &mut out, "Draft", 1, "lo");
        show(&mut printer, &mut out, "Draft", 2, "Again\n");
        show(&mut printer, &mut out, "Review", 3, "ok");
        printer.finish(&mut out).expect("finish");
        assert_eq!(
            String::from_utf8_lossy(&out),
            "[Draft, round 1]\nHello\n[Draft, round 2]\nAgain\n[Review, round 3]\nok\n"
        );
    }

    #[test]
    fn nothing_shown_means_nothing_to_finish() {
        let mut out = Vec::new();
        LivePrinter::default().finish(&mut out).expect("finish");
        assert!(out.is_empty());
    }

    #[test]
    fn control_characters_in_model_text_are_neutralized() {
        assert_eq!(printable("a\x1b[2Jb\r\tc\n"), "a\u{FFFD}[2Jb\u{FFFD}\tc\n");
    }

    #[test]
    fn a_failing_terminal_stops_the_listener() {
        struct Gone;
        impl Write for Gone {
            fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
                Err(std::io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let fragment = LiveText {
            section: "S",
            turn: 1,
            text: "x",
        };
        assert!(LivePrinter::default().write(&mut Gone, fragment).is_err());
    }
}
