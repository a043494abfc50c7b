#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The CLI around the language, through the real binary: `check` over files
//! and folders (every problem, warnings, `--json`, rich snippets, `--host`
//! checks), `info`, `run --arg`/`-`/`--quiet`, error locations, usage errors
//! under `--json`, completions, the man page, `init`, logs, and the CLI
//! reference page kept equal to the clap definitions.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_promptforge"));
    c.env_remove("PROMPTFORGE_HOST")
        .env_remove("PROMPTFORGE_LOG")
        .env("NO_COLOR", "1");
    c
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).expect("mkdir");
    }
    std::fs::write(&p, text).expect("write a test file");
    p
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const OK_PROMPT: &str = "---\nname: ok\ndescription: returns ok\npromptforge: 0\n---\n\n# Ok\n\n## Only\n\n```lua\nreturn 'ok ' .. args\n```\n";

/// Two frontmatter problems and a Lua compile error: all three reported.
const THREE_PROBLEMS: &str = "---\nname: x\ndescripton: y\npromptforge: 0\nbogus: 1\n---\n\n# T\n\n## A\n\n```lua\nlocal = 1\n```\n";

const TYPED: &str = "---\nname: greet\ndescription: greets\npromptforge: 0\nargs:\n  name:\n    type: string\n    description: who\n  times:\n    type: integer\n    optional: true\n    default: 1\n  loud:\n    type: boolean\n    optional: true\n---\n\n# Greet\n\n## Only\n\n```lua\nreturn string.rep(argv.name, argv.times or 1) .. tostring(argv.loud)\n```\n";

#[test]
fn check_reports_every_problem_with_absolute_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = write(dir.path(), "bad.md", THREE_PROBLEMS);
    let out = bin().arg("check").arg(&bad).output().expect("check");
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    let name = bad.display().to_string();
    assert!(
        lines[0].starts_with(&format!("{name}:3:1: Frontmatter: ")),
        "{stdout}"
    );
    assert!(lines[2].starts_with(&format!("{name}:13:")), "{stdout}");
    assert!(lines[2].contains(": Lua: "), "{stdout}");
}

#[test]
fn check_walks_folders_for_prompts_and_skips_other_markdown() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "a/good.md", OK_PROMPT);
    write(dir.path(), "a/b/bad.md", THREE_PROBLEMS);
    write(dir.path(), "a/README.md", "# Not a prompt\n");
    write(dir.path(), "a/.hidden/bad.md", THREE_PROBLEMS);
    let out = bin()
        .arg("check")
        .arg(dir.path().join("a"))
        .arg("--json")
        .output()
        .expect("check");
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let files: Vec<&str> = v["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f["file"].as_str())
        .collect();
    assert_eq!(files.len(), 2, "{v}");
    assert!(
        files[0].ends_with("b/bad.md") && files[1].ends_with("good.md"),
        "{v}"
    );
    assert_eq!(v["errors"], 3);
    let first = &v["files"][0]["diagnostics"][0];
    for key in ["severity", "kind", "message", "file", "line", "column"] {
        assert!(first.get(key).is_some(), "{key} missing in {first}");
    }
    assert_eq!(first["severity"], "error");
    assert!(v["files"][1]["diagnostics"]
        .as_array()
        .is_some_and(Vec::is_empty));
}

#[test]
fn check_applies_the_version_rule() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "p.md",
        "---\nname: x\ndescription: y\n---\n\n# T\n",
    );
    let out = bin().arg("check").arg(&p).output().expect("check");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("Structure: not a promptforge prompt: no promptforge version")
    );
}

#[test]
fn check_finds_missing_heading_targets_roles_and_bad_output_paths() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "p.md",
        "---\nname: j\ndescription: d\npromptforge: 0\nmodels:\n  writer: {}\noutput:\n  path: ../x.md\n  description: o\n---\n\n# J\n\n## A\n\n```lua\njump('## Bee')\nmodels.use('writr')\nlocal m = models.get('other')\n```\n\n## B\n\ntext\n",
    );
    let out = bin().arg("check").arg(&p).output().expect("check");
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    let name = p.display().to_string();
    assert!(
        stdout.contains(&format!("{name}:8:9: Store: `output:` invalid path")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "{name}:17:6: Lua: jump('## Bee'): section heading `## Bee` not found"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{name}:18:12: Binding: models.use('writr')")),
        "{stdout}"
    );
    // models.get may name a catalog model: only a warning.
    assert!(
        stdout.contains(&format!(
            "{name}:19:22: warning: Binding: models.get('other')"
        )),
        "{stdout}"
    );

    let rich = bin()
        .args(["check", "--format", "rich"])
        .arg(&p)
        .output()
        .expect("check");
    let shown = text(&rich.stdout);
    assert!(shown.contains("error[Lua]: jump('## Bee')"), "{shown}");
    assert!(shown.contains("= help: did you mean `## B`?"), "{shown}");
    assert!(shown.contains("= help: did you mean `writer`?"), "{shown}");
    assert!(text(&rich.stderr).contains("3 errors, 1 warning in 1 file"));
}

#[test]
fn warnings_alone_do_not_fail_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "p.md",
        "---\nname: j\ndescription: d\npromptforge: 0\n---\n\n# J\n\n## A\n\n```lua\nreturn models.get('big') and 'x'\n```\n",
    );
    let out = bin().arg("check").arg(&p).output().expect("check");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("warning: Binding"));
}

#[test]
fn check_with_a_host_lists_real_tools_and_suggests_the_nearest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "p.md",
        "---\nname: t\ndescription: d\npromptforge: 0\nplugins:\n  - promptforge/web\n  - acme/missing\ntools:\n  fetch: promptforge/web/fetc\n---\n\n# T\n\n## A\n\n```lua\nreturn 'x'\n```\n",
    );
    let host = write(dir.path(), "host.toml", "[web]\nallow_loopback = true\n");
    // Without --host only the syntax is checked: clean.
    let plain = bin().arg("check").arg(&p).output().expect("check");
    assert_eq!(plain.status.code(), Some(0), "{}", text(&plain.stdout));
    let out = bin()
        .arg("check")
        .arg(&p)
        .arg("--host")
        .arg(&host)
        .args(["--json"])
        .output()
        .expect("check");
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let diagnostics = v["files"][0]["diagnostics"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let missing = diagnostics
        .iter()
        .find(|d| d["kind"] == "RequirementsUnmet")
        .expect("the missing Plugin");
    assert_eq!(
        missing["message"],
        "required Plugin acme/missing is not offered by the host"
    );
    assert_eq!(missing["line"], 7);
    let slot = diagnostics
        .iter()
        .find(|d| d["kind"] == "Binding")
        .expect("the tool slot");
    assert_eq!(slot["help"], "did you mean `promptforge/web/fetch`?");
    assert_eq!(slot["line"], 9);
    assert!(
        slot["note"]
            .as_str()
            .is_some_and(|n| n.contains("promptforge/web/search")),
        "{slot}"
    );
}

#[test]
fn info_shows_what_a_prompt_declares() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "greet.md", TYPED);
    let out = bin().arg("info").arg(&p).output().expect("info");
    assert_eq!(out.status.code(), Some(0));
    let shown = text(&out.stdout);
    assert!(shown.starts_with("greet ("), "{shown}");
    assert!(
        shown.contains("times  integer, optional, default 1"),
        "{shown}"
    );
    assert!(shown.contains("## Only  line 20"), "{shown}");
    let out = bin()
        .arg("info")
        .arg(&p)
        .arg("--json")
        .output()
        .expect("info");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["name"], "greet");
    assert_eq!(v["args"][1]["name"], "times");
    assert_eq!(v["args"][1]["type"], "integer");
    assert_eq!(v["args"][1]["optional"], true);
    assert_eq!(v["args"][1]["default"], 1);
    assert_eq!(v["args"][0]["description"], "who");
    assert_eq!(v["sections"][0]["heading"], "## Only");
}

#[test]
fn info_shows_roles_plugins_tool_slots_and_the_section_tree() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let info = |name: &str, json: bool| {
        let mut c = bin();
        c.arg("info").arg(examples.join(name));
        if json {
            c.arg("--json");
        }
        let out = c.output().expect("info");
        assert_eq!(out.status.code(), Some(0));
        text(&out.stdout)
    };
    let shown = info("research.md", false);
    for part in [
        "roles:\n  researcher  — plans searches, reads pages, writes the answer\n",
        "plugins:\n  promptforge/web\n",
        "tools:\n  search -> promptforge/web/search\n  fetch -> promptforge/web/fetch\n",
        "(none declared: ARGS is free text, `args` and `argv.prose` in Lua)",
    ] {
        assert!(shown.contains(part), "{part:?} in {shown}");
    }
    let shown = info("pipeline.md", false);
    assert!(
        shown.contains("sections:\n  # Pipeline\n    ## Draft  line 18\n    ## Review  line 26\n      ### Critique  line 37\n"),
        "{shown}"
    );
    let v: Value = serde_json::from_str(&info("research.md", true)).expect("json");
    assert_eq!(v["roles"][0]["label"], "researcher");
    assert_eq!(v["plugins"][0]["id"], "promptforge/web");
    assert_eq!(v["tools"][1]["alias"], "fetch");
    assert_eq!(v["tools"][1]["path"], "promptforge/web/fetch");
    let v: Value = serde_json::from_str(&info("pipeline.md", true)).expect("json");
    assert_eq!(v["sections"][1]["children"][0]["heading"], "### Critique");
    assert_eq!(v["sections"][1]["children"][0]["line"], 37);
}

#[test]
fn run_builds_typed_arguments_from_arg_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "greet.md", TYPED);
    let run = |extra: &[&str]| bin().arg("run").arg(&p).args(extra).output().expect("run");
    let out = run(&["--arg", "name=Ab", "--arg", "times=2", "--arg", "loud=true"]);
    assert_eq!(text(&out.stdout), "AbAbtrue\n", "{}", text(&out.stderr));
    let out = run(&["--arg", "nam=x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("declared: name (string), times (integer), loud (boolean)"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["--arg", "times=two", "--arg", "name=x"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["{\"name\":\"x\"}", "--arg", "name=y"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot be combined with ARGS"));
    let out = run(&["--arg", "name=y", "--json"]);
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).expect("json")["result"],
        "ynil"
    );
}

#[test]
fn arg_flags_type_numbers_and_booleans_and_the_guide_has_four_types() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "num.md",
        "---\nname: num\ndescription: d\npromptforge: 0\nargs:\n  n:\n    type: number\n  b:\n    type: boolean\n    optional: true\n---\n\n# Num\n\n## Only\n\n```lua\nreturn tostring(argv.n) .. ' ' .. math.type(argv.n) .. ' ' .. tostring(argv.b)\n```\n",
    );
    let run = |extra: &[&str]| {
        bin()
            .arg("run")
            .arg(&p)
            .args(extra)
            .env("PROMPTFORGE_HOME", dir.path().join("home"))
            .output()
            .expect("run")
    };
    // A number reads as the same JSON would: `3` stays an integer.
    assert_eq!(text(&run(&["--arg", "n=3"]).stdout), "3 integer nil\n");
    assert_eq!(
        text(&run(&["--arg", "n=2.5", "--arg", "b=false"]).stdout),
        "2.5 float false\n"
    );
    for (pair, message) in [
        ("n=x", "error: --arg n=x: `n` is a number\n"),
        ("n=inf", "error: --arg n=inf: `n` is a number\n"),
        (
            "b=yes",
            "error: --arg b=yes: `b` is a boolean (true or false)\n",
        ),
        ("n", "error: --arg \"n\": expected NAME=VALUE\n"),
    ] {
        let out = run(&["--arg", pair]);
        assert_eq!(out.status.code(), Some(2), "{pair}");
        assert_eq!(text(&out.stderr), message, "{pair}");
    }
    let out = run(&["--arg", "n=1", "--arg", "n=2"]);
    assert_eq!(text(&out.stderr), "error: --arg n given twice\n");
    // The guide's four types are all there are: another word is its Frontmatter error.
    let bad = write(
        dir.path(),
        "arr.md",
        "---\nname: a\ndescription: d\npromptforge: 0\nargs:\n  items:\n    type: array\n---\n\n# A\n",
    );
    let message = "invalid frontmatter: unknown variant `array`, expected one of `string`, `boolean`, `integer`, `number`";
    let out = bin().arg("check").arg(&bad).output().expect("check");
    assert_eq!(
        text(&out.stdout),
        format!("{}:7:11: Frontmatter: {message}\n", bad.display())
    );
    let out = bin()
        .arg("run")
        .arg(&bad)
        .arg("--json")
        .env("PROMPTFORGE_HOME", dir.path().join("home"))
        .output()
        .expect("run");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["message"], message);
    assert_eq!(v["error"]["line"], 7);
}

#[test]
fn args_dash_reads_stdin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "p.md", OK_PROMPT);
    let mut child = bin()
        .arg("run")
        .arg(&p)
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"from stdin\n")
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert_eq!(text(&out.stdout), "ok from stdin\n");
}

#[test]
fn quiet_drops_warnings_but_not_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "p.md",
        "---\nname: q\ndescription: d\npromptforge: 0\ninput:\n  path: in.txt\n  description: i\n---\n\n# Q\n\n## A\n\n```lua\nreturn 'done'\n```\n",
    );
    let loud = bin().arg("run").arg(&p).output().expect("run");
    assert!(
        text(&loud.stderr).contains("warning:"),
        "{}",
        text(&loud.stderr)
    );
    let quiet = bin()
        .arg("run")
        .arg(&p)
        .arg("--quiet")
        .output()
        .expect("run");
    assert_eq!(text(&quiet.stdout), "done\n");
    assert_eq!(text(&quiet.stderr), "");
}

#[test]
fn run_and_check_name_the_same_line_for_a_lua_compile_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "p.md",
        "---\nname: f\ndescription: d\npromptforge: 0\n---\n\n# F\n\n## Two\n\n```lua\nlocal t = = nil\n```\n",
    );
    let name = p.display().to_string();
    let check = bin().arg("check").arg(&p).output().expect("check");
    assert!(
        text(&check.stdout).starts_with(&format!("{name}:12:11: Lua: ")),
        "{}",
        text(&check.stdout)
    );
    let run = bin().arg("run").arg(&p).output().expect("run");
    let err = text(&run.stderr);
    assert!(
        err.starts_with("error[Lua]: lua compilation error at section `Two` prologue (line 12)"),
        "{err}"
    );
    assert!(err.contains(&format!("--> {name}:12:11")), "{err}");
    assert!(err.contains("12 | local t = = nil"), "{err}");
    let json = bin()
        .arg("run")
        .arg(&p)
        .arg("--json")
        .output()
        .expect("run");
    let v: Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(v["error"]["line"], 12);
    assert_eq!(v["error"]["phase"], "parse");
}

#[test]
fn a_lua_runtime_error_names_its_prompt_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "p.md",
        "---\nname: f\ndescription: d\npromptforge: 0\n---\n\n# F\n\n## Only\n\n```lua\nlocal x = 1\nerror('boom')\n```\n",
    );
    let out = bin().arg("run").arg(&p).output().expect("run");
    let err = text(&out.stderr);
    let message = "section `Only` prologue:13: [string \"section `Only` prologue\"]:13: boom";
    assert_eq!(
        err,
        format!("error[Lua]: {message}\n  --> {}:13\n", p.display())
    );
    let out = bin()
        .arg("run")
        .arg(&p)
        .arg("--json")
        .output()
        .expect("run");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["error"]["message"], message);
    assert_eq!(v["error"]["line"], 13);
}

#[test]
fn a_failed_block_logs_its_lua_traceback_at_debug_level() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(
        dir.path(),
        "f.md",
        "---\nname: f\ndescription: d\npromptforge: 0\n---\n\n# F\n\n```lua shared\nfunction helper(x)\n  error('bad ' .. x)\nend\n```\n\n## Main\n\n```lua\nlocal function inner()\n  helper('thing')\nend\ninner()\n```\n",
    );
    let run = |log: Option<&str>| {
        let mut c = bin();
        c.arg("run")
            .arg(&p)
            .env("PROMPTFORGE_HOME", dir.path().join("home"));
        if let Some(level) = log {
            c.env("PROMPTFORGE_LOG", level);
        }
        c.output().expect("run")
    };
    let out = run(Some("debug"));
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    let file = p.display().to_string();
    assert!(
        err.contains(&format!(
            "Lua traceback of the failed block section `Main` prologue ({file}, task 0):\nstack traceback:\n\t{file}:11: in global 'helper' (prompt shared library)\n\t{file}:19: in local 'inner' (section `Main` prologue)\n\t{file}:21: in main chunk (section `Main` prologue)\n"
        )),
        "{err}"
    );
    // The engine's own frames (prelude, C functions) stay out; no ANSI when piped.
    assert!(!err.contains("[C]") && !err.contains('\x1b'), "{err}");
    assert!(!text(&run(None).stderr).contains("traceback"));
    assert!(!text(&run(Some("info")).stderr).contains("traceback"));
}

#[test]
fn usage_errors_under_json_print_a_json_object() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "p.md", OK_PROMPT);
    for args in [
        vec![
            "run".to_string(),
            p.display().to_string(),
            "--json".into(),
            "--bogus".into(),
        ],
        vec!["run".to_string(), "/nonexistent.md".into(), "--json".into()],
    ] {
        let out = bin().args(&args).output().expect("run");
        assert_eq!(out.status.code(), Some(2));
        let v: Value = serde_json::from_slice(&out.stdout).expect("a JSON usage error");
        assert_eq!(v["outcome"], "failed");
        assert_eq!(v["error"]["kind"], "Usage");
        assert!(v["error"]["message"].is_string());
    }
}

#[test]
fn random_seeds_stay_exact_as_json_numbers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "p.md", OK_PROMPT);
    for _ in 0..5 {
        let out = bin()
            .arg("run")
            .arg(&p)
            .arg("--json")
            .output()
            .expect("run");
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        let seed = v["seed"].as_u64().expect("seed");
        assert!(seed < (1u64 << 53), "{seed}");
    }
}

#[test]
fn completions_and_the_man_page_come_from_the_clap_definitions() {
    for shell in ["bash", "zsh", "fish"] {
        let out = bin()
            .args(["completions", shell])
            .output()
            .expect("completions");
        assert_eq!(out.status.code(), Some(0));
        let script = text(&out.stdout);
        assert!(
            script.contains("promptforge") && script.contains("check"),
            "{shell}"
        );
    }
    let out = bin()
        .args(["completions", "tcsh"])
        .output()
        .expect("completions");
    assert_eq!(out.status.code(), Some(2));
    let man = bin().arg("man").output().expect("man");
    let page = text(&man.stdout);
    assert!(
        page.starts_with(".ie \\n(.g .ds Aq"),
        "{}",
        &page[..page.len().min(80)]
    );
    assert!(
        page.contains(".TH promptforge 1") && page.contains("\\-\\-arg"),
        "man page"
    );
}

#[test]
fn help_shows_examples() {
    let out = bin().args(["run", "--help"]).output().expect("help");
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("Examples:\n  promptforge run hello.md reader"));
}

#[test]
fn init_scaffolds_a_prompt_that_checks_and_runs_offline() {
    let dir = tempfile::tempdir().expect("tempdir");
    let name = dir.path().join("triage");
    let out = bin().arg("init").arg(&name).output().expect("init");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for file in [
        "triage.md",
        "triage.host.toml",
        "triage.replies.json",
        "triage.test.yaml",
    ] {
        assert!(dir.path().join(file).is_file(), "{file}");
    }
    let check = bin().arg("check").arg(dir.path()).output().expect("check");
    assert_eq!(check.status.code(), Some(0), "{}", text(&check.stdout));
    let run = bin()
        .arg("run")
        .arg(dir.path().join("triage.md"))
        .arg("a bug")
        .arg("--host")
        .arg(dir.path().join("triage.host.toml"))
        .output()
        .expect("run");
    assert_eq!(
        text(&run.stdout),
        "Here is a short answer to your request.\n",
        "{}",
        text(&run.stderr)
    );
    // The scaffolded test file passes under `promptforge test`.
    let test = bin().arg("test").arg(dir.path()).output().expect("test");
    assert_eq!(test.status.code(), Some(0), "{}", text(&test.stdout));
    assert!(
        text(&test.stdout).ends_with("1 passed, 0 failed\n"),
        "{}",
        text(&test.stdout)
    );
    // A second init refuses to overwrite.
    let again = bin().arg("init").arg(&name).output().expect("init");
    assert_eq!(again.status.code(), Some(2));
}

#[test]
fn info_logs_say_what_the_host_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = write(dir.path(), "p.md", OK_PROMPT);
    write(dir.path(), "r.json", "[]");
    let host = write(
        dir.path(),
        "host.toml",
        "[model]\nprovider = \"script\"\nreplies = \"r.json\"\n",
    );
    let out = bin()
        .arg("run")
        .arg(&p)
        .arg("--host")
        .arg(&host)
        .env("PROMPTFORGE_LOG", "info")
        .output()
        .expect("run");
    let err = text(&out.stderr);
    assert!(
        err.contains("model: scripted-model (provider script"),
        "{err}"
    );
    assert!(err.contains("store directory: "), "{err}");
    assert!(err.contains("Plugins offered: promptforge/web"), "{err}");
}

#[test]
fn dependency_logs_stay_out_below_trace() {
    use pf_cases::case::{Page, WebFixture};
    let dir = tempfile::tempdir().expect("tempdir");
    let mut fixture = WebFixture::default();
    fixture.pages.insert(
        "/page.txt".to_string(),
        Page {
            status: 200,
            content_type: Some("text/plain".to_string()),
            headers: Default::default(),
            body: serde_json::json!("a page"),
        },
    );
    let server = pf_cases::WebServer::start(fixture).expect("web fixture");
    let p = write(
        dir.path(),
        "fetch.md",
        &format!("---\nname: f\ndescription: d\npromptforge: 0\nplugins:\n  - promptforge/web\ntools:\n  fetch: promptforge/web/fetch\n---\n\n# F\n\n## Only\n\n```lua\nreturn tools.call('fetch', {{ url = '{}/page.txt' }})\n```\n", server.base()),
    );
    let host = write(dir.path(), "host.toml", "[web]\nallow_loopback = true\n");
    let run = |level: &str| {
        let out = bin()
            .arg("run")
            .arg(&p)
            .arg("--host")
            .arg(&host)
            .env("PROMPTFORGE_HOME", dir.path().join("home"))
            .env("PROMPTFORGE_LOG", level)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stderr)
    };
    let debug = run("debug");
    // Our own debug lines are there; the HTTP client's are not.
    assert!(debug.contains("{\"tool_call\":"), "{debug}");
    assert!(!debug.contains("connecting to"), "{debug}");
    assert!(run("trace").contains("connecting to"));
}

#[test]
fn the_cli_reference_page_matches_the_clap_definitions() {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/reference/cli.md");
    let generated = bin().arg("reference").output().expect("reference");
    let generated = text(&generated.stdout);
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(&page, &generated).expect("write the reference page");
    }
    let checked_in = std::fs::read_to_string(&page).unwrap_or_default();
    assert!(
        checked_in == generated,
        "docs/src/reference/cli.md is stale: run `promptforge reference > docs/src/reference/cli.md` \
         (or UPDATE_EXPECT=1 cargo test -p promptforge --test cli_ux)"
    );
}

#[test]
fn the_guide_lists_every_chapter_and_the_readme_links_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let src = root.join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).expect("SUMMARY.md");
    let mut pages = Vec::new();
    for dir in [
        src.clone(),
        src.join("language"),
        src.join("host"),
        src.join("reference"),
    ] {
        for entry in std::fs::read_dir(&dir).expect("docs folder") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "md") && !path.ends_with("SUMMARY.md") {
                pages.push(path);
            }
        }
    }
    for page in &pages {
        let relative = page
            .strip_prefix(&src)
            .expect("under src")
            .display()
            .to_string();
        assert!(
            summary.contains(&format!("]({relative})")),
            "{relative} is not in SUMMARY.md"
        );
        // Every `{{#include}}` names a file that exists.
        let body = std::fs::read_to_string(page).expect("page");
        for line in body.lines().filter(|l| l.starts_with("{{#include ")) {
            let target = line
                .trim_start_matches("{{#include ")
                .trim_end_matches("}}")
                .trim();
            let included = page.parent().expect("folder").join(target);
            assert!(
                included.is_file(),
                "{relative}: {} is missing",
                included.display()
            );
        }
    }
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    assert!(
        readme.contains("mdBook in `docs/`"),
        "the README links the guide"
    );
}
