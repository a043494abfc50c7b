//! Live output: a `models.loop` round's text shows on stderr while it streams,
//! but only for a person at a terminal; pipes, files and `--json` get the plain
//! contract output.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_promptforge"))
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write a test file");
    p
}

const LOOP_PROMPT: &str = "---\nname: talk\ndescription: one loop round and one infer round\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Talk\n\n## Ask\n\n```lua\nmodels.use('w')\nlocal quiet = models.infer('first')\nlocal msgs = messages.new():user('second')\nmodels.loop(msgs)\nreturn quiet .. ' / ' .. msgs[#msgs].content\n```\n";

/// A prompt, a host file with a scripted model, and the replies, in `dir`.
fn setup(dir: &Path) -> (PathBuf, PathBuf) {
    let prompt = write(dir, "p.md", LOOP_PROMPT);
    write(dir, "r.json", r#"["quiet reply", "streamed reply"]"#);
    let host = write(
        dir,
        "host.toml",
        "[model]\nprovider = \"script\"\nreplies = \"r.json\"\n",
    );
    (prompt, host)
}

#[test]
fn a_plain_run_into_pipes_shows_no_live_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (prompt, host) = setup(dir.path());
    let out = bin()
        .arg("run")
        .arg(&prompt)
        .arg("--host")
        .arg(&host)
        .env_remove("PROMPTFORGE_LOG")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "quiet reply / streamed reply\n"
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn the_json_report_keeps_its_shape() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (prompt, host) = setup(dir.path());
    let out = bin()
        .arg("run")
        .arg(&prompt)
        .args(["--json", "--seed", "5", "--host"])
        .arg(&host)
        .env_remove("PROMPTFORGE_LOG")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let mut keys: Vec<&str> = report
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    keys.sort_unstable();
    assert_eq!(
        keys,
        vec!["execution", "outcome", "result", "seed", "store"]
    );
    assert_eq!(report["result"], "quiet reply / streamed reply");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn events_are_logged_at_debug_level() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (prompt, host) = setup(dir.path());
    let out = bin()
        .arg("run")
        .arg(&prompt)
        .args(["--seed", "5", "--host"])
        .arg(&host)
        .env("PROMPTFORGE_LOG", "promptforge::events=debug")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    let kinds: Vec<&str> = err
        .lines()
        .filter_map(|line| line.split_once("{\"kind\":\""))
        .filter_map(|(_, rest)| rest.split('"').next())
        .collect();
    assert_eq!(
        kinds,
        vec![
            "parse_started",
            "lua_compilation_started",
            "lua_compilation_succeeded",
            "parse_succeeded",
            "run_started",
            "section_started",
            "lua_shared_load_started",
            "lua_shared_load_succeeded",
            "lua_chunk_started",
            "model_turn_completed",
            "assistant_reply",
            "tool_scope_validation_started",
            "tool_scope_validation_succeeded",
            "model_turn_completed",
            "assistant_reply",
            "lua_chunk_succeeded",
            "lua_teardown_started",
            "lua_teardown_succeeded",
            "section_finished",
            "run_succeeded",
        ]
    );
    assert!(err.contains("\"section\":\"Ask\",\"provenance\":{\"task\":\"0\",\"seq\":1}"));
    // No event carries the prompt's own text.
    assert!(!err.contains("second"), "{err}");
}

/// Run `command` under a pseudo-terminal with `script`, returning what the
/// terminal showed; `None` when `script` is not installed.
fn on_a_terminal(command: &str) -> Option<String> {
    let out = Command::new("script")
        .args(["-qec", command, "/dev/null"])
        .env_remove("PROMPTFORGE_LOG")
        .output()
        .ok()?;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    Some(screen(&String::from_utf8_lossy(&out.stdout)))
}

/// What a terminal would finally show for `raw`: a lone carriage return or
/// an erase-line sequence clears the current line (the progress spinner
/// redraws itself that way), other escape sequences draw nothing.
fn screen(raw: &str) -> String {
    let raw = raw.replace("\r\n", "\n");
    let mut lines: Vec<String> = vec![String::new()];
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        let current = lines.last_mut().expect("one line at least");
        match c {
            '\n' => lines.push(String::new()),
            '\r' => current.clear(),
            '\u{1b}' => {
                let mut sequence = String::new();
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for c in chars.by_ref() {
                        sequence.push(c);
                        if c.is_ascii_alphabetic() {
                            break;
                        }
                    }
                }
                if sequence == "2K" {
                    current.clear();
                }
            }
            c => current.push(c),
        }
    }
    lines.join("\n")
}

#[test]
fn a_terminal_sees_loop_rounds_as_they_stream() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (prompt, host) = setup(dir.path());
    let result = dir.path().join("result.txt");
    let command = format!(
        "{} run {} --host {} > {}",
        env!("CARGO_BIN_EXE_promptforge"),
        prompt.display(),
        host.display(),
        result.display()
    );
    let Some(screen) = on_a_terminal(&command) else {
        eprintln!("skipped: `script` (util-linux) is not installed");
        return;
    };
    // Only the loop round streams; `models.infer` never does.
    assert_eq!(screen, "[Ask, round 2]\nstreamed reply\n");
    assert_eq!(
        std::fs::read_to_string(&result).expect("result"),
        "quiet reply / streamed reply\n"
    );

    // `--json` shows no live output even on a terminal.
    let command = format!(
        "{} run {} --json --host {} > {}",
        env!("CARGO_BIN_EXE_promptforge"),
        prompt.display(),
        host.display(),
        result.display()
    );
    if let Some(screen) = on_a_terminal(&command) {
        assert_eq!(screen, "");
    }
}

#[test]
fn a_reply_the_terminal_already_showed_is_not_printed_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prompt = write(
        dir.path(),
        "once.md",
        "---\nname: once\ndescription: the result is the streamed reply\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Once\n\n## Ask\n\n```lua\nmodels.use('w')\nlocal msgs = messages.new():user('hi')\nmodels.loop(msgs)\nreturn msgs[#msgs].content\n```\n",
    );
    write(dir.path(), "r.json", r#"["the one reply"]"#);
    let host = write(
        dir.path(),
        "host.toml",
        "[model]\nprovider = \"script\"\nreplies = \"r.json\"\n",
    );
    let home = dir.path().join("home");
    // stdout and stderr both on the terminal: the streamed reply shows once.
    let command = format!(
        "PROMPTFORGE_HOME={} {} run {} --host {}",
        home.display(),
        env!("CARGO_BIN_EXE_promptforge"),
        prompt.display(),
        host.display()
    );
    let Some(screen) = on_a_terminal(&command) else {
        eprintln!("skipped: `script` (util-linux) is not installed");
        return;
    };
    assert_eq!(screen, "[Ask, round 1]\nthe one reply\n");
    // Into a pipe the result is printed, and nothing live is.
    let out = bin()
        .arg("run")
        .arg(&prompt)
        .arg("--host")
        .arg(&host)
        .env("PROMPTFORGE_HOME", &home)
        .env_remove("PROMPTFORGE_LOG")
        .output()
        .expect("run");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "the one reply\n");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn colour_only_on_a_terminal_unless_asked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prompt = write(
        dir.path(),
        "fail.md",
        "---\nname: fail\ndescription: fails\npromptforge: 0\n---\n\n# Fail\n\n## Only\n\n```lua\nerror('boom')\n```\n",
    );
    let home = dir.path().join("home");
    let run = |extra: &[&str], no_color: bool| {
        let mut c = bin();
        c.arg("run")
            .arg(&prompt)
            .args(extra)
            .env("PROMPTFORGE_HOME", &home)
            .env_remove("PROMPTFORGE_LOG");
        if no_color {
            c.env("NO_COLOR", "1");
        } else {
            c.env_remove("NO_COLOR");
        }
        String::from_utf8_lossy(&c.output().expect("run").stderr).into_owned()
    };
    let piped = run(&[], false);
    assert!(
        piped.starts_with("error[Lua]: ") && !piped.contains('\u{1b}'),
        "{piped:?}"
    );
    assert!(run(&["--color", "always"], false).starts_with("\u{1b}[1;31merror[Lua]"));
    assert!(!run(&["--color", "never"], false).contains('\u{1b}'));
    let on_terminal = |env: &str, extra: &str| {
        let out = Command::new("script")
            .args([
                "-qec",
                &format!(
                    "{env} PROMPTFORGE_HOME={} {} run {} {extra}",
                    home.display(),
                    env!("CARGO_BIN_EXE_promptforge"),
                    prompt.display()
                ),
                "/dev/null",
            ])
            .env_remove("PROMPTFORGE_LOG")
            .env_remove("NO_COLOR")
            .output()
            .ok()?;
        Some(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let Some(coloured) = on_terminal("", "") else {
        eprintln!("skipped: `script` (util-linux) is not installed");
        return;
    };
    assert!(coloured.contains("\u{1b}[1;31merror[Lua]"), "{coloured:?}");
    // The spinner still erases its line (`ESC[2K`); no colour sequence is left.
    let coloured_text = |s: &str| s.contains("\u{1b}[1;") || s.contains("\u{1b}[0m");
    let plain = on_terminal("NO_COLOR=1", "").expect("script");
    assert!(!coloured_text(&plain), "{plain:?}");
    assert!(
        plain.contains("error[Lua]: section `Only` prologue:12: "),
        "{plain:?}"
    );
    let never = on_terminal("", "--color never").expect("script");
    assert!(!coloured_text(&never), "{never:?}");
}

#[test]
fn each_tool_call_gets_a_progress_line_on_a_terminal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prompt = write(
        dir.path(),
        "tools.md",
        "---\nname: tools\ndescription: a script and the model call a local tool\npromptforge: 0\nmodels:\n  w: {}\n---\n\n# Tools\n\n## Count\n\n```lua\nmodels.use('w')\ntools.add_local('add', 'Add', { n = 'integer' }, function(a) return tostring(a.n) end)\ntools.call('add', { n = 1 })\nlocal msgs = messages.new():user('more')\nmodels.loop(msgs)\nreturn 'done'\n```\n",
    );
    write(
        dir.path(),
        "r.json",
        r#"[{"tool_calls": [{"name": "add", "arguments": {"n": 2}}]}, "added"]"#,
    );
    let host = write(
        dir.path(),
        "host.toml",
        "[model]\nprovider = \"script\"\nreplies = \"r.json\"\n",
    );
    let result = dir.path().join("result.txt");
    let command = format!(
        "PROMPTFORGE_HOME={} {} run {} --host {} > {}",
        dir.path().join("home").display(),
        env!("CARGO_BIN_EXE_promptforge"),
        prompt.display(),
        host.display(),
        result.display()
    );
    let Some(screen) = on_a_terminal(&command) else {
        eprintln!("skipped: `script` (util-linux) is not installed");
        return;
    };
    assert_eq!(
        screen,
        "  → add {\"n\":1}\n  → add {\"n\":2}\n[Count, round 2]\nadded\n"
    );
    assert_eq!(std::fs::read_to_string(&result).expect("result"), "done\n");
}
