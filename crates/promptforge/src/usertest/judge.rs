//! `judge: {model, rubric}`: ask a catalog model whether a run's result meets
//! a rubric, as promptfoo's llm-rubric does.
//!
//! The protocol (docs/testing.md repeats it): one request, temperature 0, no
//! tools; a system message fixing the answer format and a user message with
//! the rubric and the output between `<output>` tags. The verdict is the
//! reply's first word, case-insensitive, stripped of markdown and
//! punctuation: `PASS` or `YES` passes, `FAIL` or `NO` fails, anything else
//! fails as an unclear answer. The rest of the reply is the reason shown.

use pf_harness::{ChatMessage, ChatRequest};
use serde_json::Value as Json;

use super::catalog::CatalogModel;

pub const SYSTEM: &str = "You grade the output of a program against a rubric. \
Answer with one word on the first line, PASS if the output meets the rubric or FAIL if it \
does not, then one short sentence saying why.";

/// The user message for `rubric` and `output`.
pub fn question(rubric: &str, output: &str) -> String {
    format!(
        "Rubric:\n{rubric}\n\n<output>\n{output}\n</output>\n\nDoes the output meet the rubric? \
         Answer PASS or FAIL."
    )
}

/// What the judge said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail(String),
    Unclear(String),
}

/// Read a judge's reply by the protocol above.
pub fn verdict(reply: &str) -> Verdict {
    let first = reply
        .split_whitespace()
        .next()
        .unwrap_or("")
        .trim_matches(|c: char| !c.is_alphanumeric())
        .to_ascii_uppercase();
    match first.as_str() {
        "PASS" | "YES" => Verdict::Pass,
        "FAIL" | "NO" => Verdict::Fail(reason(reply)),
        _ => Verdict::Unclear(reply.trim().to_string()),
    }
}

/// The reply after its verdict word, on one line.
fn reason(reply: &str) -> String {
    let rest = reply.trim_start();
    let rest = rest.find(char::is_whitespace).map_or("", |at| &rest[at..]);
    let rest =
        rest.trim_start_matches(|c: char| c.is_whitespace() || matches!(c, ':' | '-' | '.' | '*'));
    rest.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// How a judge call is made: logged as a run of its own, answered from the
/// cache when it holds the same question.
#[derive(Clone, Copy)]
pub struct Asking<'a> {
    /// Log the call as a run of its own, into this log.
    pub log: Option<&'a pf_host::data::RunLogTarget>,
    pub cache: Option<&'a pf_host::cache::CacheUse>,
}

/// What the judge said, and the tokens its answer reported.
pub struct Judged {
    pub verdict: Verdict,
    pub usage: Option<(u64, u64)>,
}

/// Ask `model` the rubric question about `output`.
pub async fn ask(
    model: &CatalogModel,
    rubric: &str,
    output: &str,
    asking: Asking<'_>,
) -> Result<Judged, String> {
    let request = ChatRequest {
        messages: vec![
            ChatMessage {
                role: "system".into(),
                content: Json::String(SYSTEM.into()),
                tool_calls: Vec::new(),
                tool_call_id: None,
            },
            ChatMessage {
                role: "user".into(),
                content: Json::String(question(rubric, output)),
                tool_calls: Vec::new(),
                tool_call_id: None,
            },
        ]
        .into(),
        tools: None,
        temperature: Some(0.0),
        max_tokens: None,
        thinking: None,
        ..ChatRequest::default()
    };
    let reply = pf_host::cache::ask_once(
        &model.spec,
        &model.secrets,
        pf_host::cache::OneRequest {
            label: format!("{JUDGE_LABEL}{}", model.id),
            text: SYSTEM.to_string(),
            request,
            log: asking.log,
            cache: asking.cache,
        },
    )
    .await
    .map_err(|e| format!("the judge {e}"))?;
    Ok(Judged {
        verdict: verdict(reply.content.as_deref().unwrap_or("")),
        usage: reply.usage.map(|u| (u.input_tokens, u.output_tokens)),
    })
}

/// What the run log shows as a judge call's prompt path, before the model id.
pub const JUDGE_LABEL: &str = "judge:";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_word_decides() {
        assert_eq!(verdict("PASS\nIt greets."), Verdict::Pass);
        assert_eq!(verdict("**Pass** - fine"), Verdict::Pass);
        assert_eq!(verdict("yes."), Verdict::Pass);
        assert_eq!(
            verdict("FAIL - rude\nand short"),
            Verdict::Fail("rude and short".to_string())
        );
        assert_eq!(verdict("No"), Verdict::Fail(String::new()));
        assert_eq!(
            verdict("Maybe, it depends"),
            Verdict::Unclear("Maybe, it depends".to_string())
        );
        assert_eq!(verdict(""), Verdict::Unclear(String::new()));
    }
}
