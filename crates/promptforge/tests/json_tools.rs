//! `tool_format = "json"` through the real binary: a scripted model whose
//! replies are text (as a small local model writes them) drives a
//! `models.loop` with a local tool. The calls read from the text are the
//! round's tool calls from then on: events, the run log, replay and the trace
//! page see them as native ones; the model is shown the tools in its system
//! message and its earlier calls and the results as text.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

const PROMPT: &str = r#"---
name: notes
description: lets the model save notes
promptforge: 0
models:
  writer: {}
---

# Notes

## Take notes

```lua
models.use('writer')
local saved = {}
tools.add_local('save_note', 'Save one short note', { text = 'string' }, function(a)
  saved[#saved + 1] = a.text
  return 'saved ' .. a.text
end)
local msgs = messages.new():system('Be brief.'):user('Save the key points.')
local reply = models.loop(msgs)
return table.concat(saved, '; ')
```
"#;

struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new(replies: Value) -> Home {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("replies.json"), replies.to_string()).expect("replies");
        std::fs::write(
            dir.path().join("host.toml"),
            "[model]\nprovider = \"script\"\nmodel = \"small-local\"\nreplies = \"replies.json\"\nrecord = \"sent.jsonl\"\ntool_format = \"json\"\n",
        )
        .expect("host");
        std::fs::write(dir.path().join("notes.md"), PROMPT).expect("prompt");
        Home { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn pf(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_promptforge"));
        cmd.args(args);
        if matches!(args.first(), Some(&"run" | &"replay")) {
            cmd.arg("--host").arg(self.path("host.toml"));
        }
        cmd.env("PROMPTFORGE_HOME", self.path("home"))
            .env_remove("PROMPTFORGE_MODEL")
            .current_dir(self.dir.path())
            .output()
            .expect("promptforge")
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.pf(args);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
            panic!(
                "{args:?}: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    fn sent(&self) -> Vec<Value> {
        read_lines(&self.path("sent.jsonl"))
    }
}

fn read_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("line"))
        .collect()
}

fn call(text: &str) -> String {
    json!({"name": "save_note", "arguments": {"text": text}}).to_string()
}

#[test]
fn calls_written_as_text_become_tool_calls_everywhere_a_native_call_goes() {
    let home = Home::new(json!([
        format!(
            "I will save the first one.\n```json\n{}\n```",
            call("tides follow the moon")
        ),
        format!("[{}, {}]", call("two a day"), call("springs at full moon")),
        // Malformed JSON is text: the loop ends with it.
        "{\"name\": \"save_note\", \"arguments\": {\"text\": \"cut",
    ]));
    let report = home.json(&["run", "notes.md", "--json", "--seed", "3"]);
    assert_eq!(report["outcome"], "completed", "{report}");
    assert_eq!(
        report["result"],
        "tides follow the moon; two a day; springs at full moon"
    );

    // What the model was shown: no `tools`, the tools in the system message,
    // its earlier calls and their results as text.
    let sent = home.sent();
    assert_eq!(sent.len(), 3);
    assert!(sent.iter().all(|r| r.get("tools").is_none()), "{sent:?}");
    let system = sent[0]["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.starts_with("Be brief.\n\nYou can call tools."),
        "{system}"
    );
    assert!(system.contains("{\"name\": \"TOOL_NAME\", \"arguments\": {ARGUMENTS}}"));
    assert!(
        system.contains("- save_note: Save one short note"),
        "{system}"
    );
    let third = sent[2]["messages"].as_array().unwrap();
    let roles: Vec<&str> = third.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        [
            "system",
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "user"
        ]
    );
    assert_eq!(
        third[2]["content"],
        format!(
            "I will save the first one.\n{}",
            call("tides follow the moon")
                .replace("\"name\":", "\"name\": ")
                .replace(",\"arguments\":", ", \"arguments\": ")
        )
    );
    assert_eq!(
        third[3]["content"],
        "save_note returned:\nsaved tides follow the moon"
    );
    assert_eq!(
        third[6]["content"],
        "save_note returned:\nsaved springs at full moon"
    );

    // The run log: three rounds, the calls with the ids a scripted model gives.
    let shown = home.json(&["show", "last", "--json"]);
    let events = shown["events"].as_array().expect("events");
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "model_turn_completed")
            .count(),
        3,
        "{kinds:?}"
    );
    let text = shown.to_string();
    for id in ["call_1", "call_2", "call_3"] {
        assert!(text.contains(id), "{id} in the log");
    }
    assert!(text.contains("I will save the first one."));

    // Replay answers from the log: the same result.
    let replayed = home.json(&["replay", "last", "--json"]);
    assert_eq!(replayed["result"], report["result"], "{replayed}");
    assert_eq!(home.sent().len(), 3, "the replay asked no model");

    // The trace page shows the calls.
    let page = home.path("trace.html");
    let out = home.pf(&["show", "#1", "--html", "-o", page.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).expect("page");
    assert!(html.contains("save_note") && html.contains("springs at full moon"));
}

#[test]
fn a_reply_that_is_not_a_call_is_the_answer_and_no_tools_means_no_reading() {
    let home = Home::new(json!(
        ["Here is JSON that is not a call: {\"answer\": 42}",]
    ));
    let report = home.json(&["run", "notes.md", "--json"]);
    assert_eq!(report["outcome"], "completed", "{report}");
    assert_eq!(report["result"], "");
    // A round that offers no tools is sent and read as it is.
    let plain = Home::new(json!([call("x")]));
    std::fs::write(
        plain.path("plain.md"),
        "---\nname: p\ndescription: p\npromptforge: 0\nmodels:\n  writer: {}\n---\n\n# P\n\n## S\n\n```lua\nmodels.use('writer')\nreturn models.infer('hi')\n```\n",
    )
    .unwrap();
    let report = plain.json(&["run", "plain.md", "--json"]);
    assert_eq!(report["result"], call("x"));
    let sent = plain.sent();
    assert_eq!(
        sent[0]["messages"],
        json!([{"role": "user", "content": "hi"}])
    );
}
