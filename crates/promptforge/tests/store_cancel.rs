//! The store as the Host sees it, through the real binary: a SIGINT in the
//! middle of large writes leaves every file with its old or its new contents,
//! a store the Host seeds is what the prompt reads (the frontmatter `input:`
//! file, text that is not UTF-8), the declared `output:` file is named in the
//! report, and a store that cannot be opened fails the run as `Store`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn bin() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_promptforge"));
    command.env_remove("PROMPTFORGE_HOST");
    command
}

fn write_prompt(dir: &Path, frontmatter: &str, body: &str) -> PathBuf {
    let path = dir.join("prompt.md");
    let text = format!("---\nname: store-host\ndescription: d\npromptforge: 0\n{frontmatter}---\n\n# Store Host\n\n{body}");
    std::fs::write(&path, text).expect("write the prompt");
    path
}

fn run_json(prompt: &Path, store: &Path) -> (Output, Value) {
    let out = bin()
        .arg("run")
        .arg(prompt)
        .args(["--seed", "7", "--json", "--store"])
        .arg(store)
        .output()
        .expect("run the binary");
    let report = serde_json::from_slice(&out.stdout).expect("one JSON report on stdout");
    (out, report)
}

/// Waits for the child to exit, killing it when `limit` passes so a test never hangs.
fn wait_bounded(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return true,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
}

const LINES_PER_FILE: usize = 200_000;
const LINE_BYTES: usize = 9; // `%08d\n`

/// The round a big file was written in, when it holds exactly one round's contents.
fn whole_round(contents: &str) -> Option<u64> {
    let first = contents.get(..LINE_BYTES)?;
    let round: u64 = first.strip_suffix('\n')?.parse().ok()?;
    let whole = contents.len() == LINES_PER_FILE * LINE_BYTES
        && contents
            .as_bytes()
            .chunks(LINE_BYTES)
            .all(|l| l == first.as_bytes());
    whole.then_some(round)
}

#[test]
fn sigint_mid_write_leaves_every_file_old_or_new() {
    let dir = tempfile::tempdir().expect("tempdir");
    let body = format!(
        "## Churn\n\n```lua\nlocal round = 0\nwhile true do\n  round = round + 1\n  local line = string.format('%08d\\n', round)\n  store.write('big/f' .. (round % 3) .. '.txt', string.rep(line, {LINES_PER_FILE}))\n  store.append('log.txt', line)\nend\n```\n"
    );
    let prompt = write_prompt(dir.path(), "", &body);
    let store = dir.path().join("store");
    let mut child = bin()
        .arg("run")
        .arg(&prompt)
        .args(["--json", "--store"])
        .arg(&store)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the binary");

    // Interrupt once every big file has been written at least once and more writes follow.
    let log = store.join("log.txt");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&log)
        .map(|t| t.lines().count())
        .unwrap_or(0)
        < 4
    {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the prompt did not write its files within 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    assert!(
        wait_bounded(&mut child, Duration::from_secs(60)),
        "the run did not stop within 60 s of SIGINT"
    );
    let out = child.wait_with_output().expect("collect the output");
    assert_eq!(
        out.status.code(),
        Some(130),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    assert_eq!(report["outcome"], "cancelled");

    // The log is whole lines 1..=last: no append was torn or lost.
    let logged = std::fs::read_to_string(&log).expect("read the log");
    let rounds: Vec<u64> = logged
        .lines()
        .map(|l| l.parse().expect("a round number"))
        .collect();
    let expected: Vec<u64> = (1..=rounds.len() as u64).collect();
    assert_eq!(rounds, expected);
    assert!(logged.ends_with('\n'));
    let last = rounds.len() as u64;

    // Each big file holds exactly one round's contents: its latest round, or the
    // one written after the last append when the cancel came in between.
    for index in 0..3u64 {
        let contents = std::fs::read_to_string(store.join(format!("big/f{index}.txt")))
            .expect("read a big file");
        let round = whole_round(&contents)
            .unwrap_or_else(|| panic!("big/f{index}.txt is torn ({} bytes)", contents.len()));
        assert_eq!(round % 3, index);
        assert!(
            round + 3 > last && round <= last + 1,
            "big/f{index}.txt holds round {round}, the log ends at {last}"
        );
    }
    // The write in flight finished: no temporary file is left behind.
    let mut names: Vec<String> = std::fs::read_dir(store.join("big"))
        .expect("list the store")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["f0.txt", "f1.txt", "f2.txt"]);
}

const COPY_PAPER: &str = "input:\n  path: papers/paper.md\n  description: The input paper\noutput:\n  path: report.md\n  description: The output report\n";

#[test]
fn the_input_file_is_read_from_the_store_and_the_output_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    std::fs::create_dir_all(store.join("papers")).expect("mkdir");
    std::fs::write(store.join("papers/paper.md"), "the paper body").expect("seed the input");
    let prompt = write_prompt(
        dir.path(),
        COPY_PAPER,
        "## Copy\n\n```lua\nstore.write('report.md', 'report on: ' .. store.read('papers/paper.md'))\nreturn 'copied'\n```\n",
    );
    let (out, report) = run_json(&prompt, &store);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(report["outcome"], "completed");
    assert_eq!(report["result"], "copied");
    let file = std::fs::canonicalize(&store)
        .expect("canonical store")
        .join("report.md");
    assert_eq!(
        report["output"],
        serde_json::json!({"path": "report.md", "file": file})
    );
    assert_eq!(
        std::fs::read_to_string(&file).expect("read the output"),
        "report on: the paper body"
    );
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");

    // Without --json the result stays alone on stdout and the output file is named on stderr.
    let out = bin()
        .arg("run")
        .arg(&prompt)
        .arg("--store")
        .arg(&store)
        .output()
        .expect("run");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "copied\n");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("output file report.md: {}\n", file.display())
    );
}

#[test]
fn an_input_file_beside_the_prompt_is_copied_into_a_store_that_lacks_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("papers")).expect("mkdir");
    std::fs::write(dir.path().join("papers/paper.md"), "beside the prompt")
        .expect("input beside the prompt");
    let store = dir.path().join("store");
    let prompt = write_prompt(
        dir.path(),
        COPY_PAPER,
        "## Copy\n\n```lua\nstore.write('report.md', 'report on: ' .. store.read('papers/paper.md'))\nreturn 'copied'\n```\n",
    );
    let (out, report) = run_json(&prompt, &store);
    assert_eq!(report["result"], "copied", "{report}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    assert_eq!(
        std::fs::read_to_string(store.join("report.md")).expect("output"),
        "report on: beside the prompt"
    );
    // A file already in the store wins over the one beside the prompt.
    std::fs::write(store.join("papers/paper.md"), "seeded in the store").expect("seed");
    let (_, report) = run_json(&prompt, &store);
    assert_eq!(report["result"], "copied");
    assert_eq!(
        std::fs::read_to_string(store.join("report.md")).expect("output"),
        "report on: seeded in the store"
    );
}

#[test]
fn missing_input_and_output_files_are_warnings_not_failures() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    let prompt = write_prompt(
        dir.path(),
        COPY_PAPER,
        "## Guarded\n\n```lua\nif not store.exists('papers/paper.md') then return 'no paper' end\nreturn 'unreached'\n```\n",
    );
    let (out, report) = run_json(&prompt, &store);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(report["result"], "no paper");
    assert_eq!(
        report["output"],
        serde_json::json!({"path": "report.md", "error": "output file not found: report.md"})
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "warning: input file not found in the store: papers/paper.md (store directory {})\nwarning: output file not found: report.md\n",
            store.display()
        )
    );
}

#[test]
fn seeded_text_that_is_not_utf8_is_a_backend_failure() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).expect("mkdir");
    std::fs::write(store.join("latin1.txt"), b"caf\xe9").expect("seed");
    let prompt = write_prompt(
        dir.path(),
        "",
        "## Probe\n\n```lua\nlocal function caught(f, ...)\n  local ok, err = pcall(f, ...)\n  return ok and 'ok' or (err.kind .. ': ' .. err.message)\nend\nreturn table.concat({ caught(store.read, 'latin1.txt'), caught(store.read_numbered, 'latin1.txt'),\n  caught(store.read, 'latin1.txt', 1), caught(store.str_replace, 'latin1.txt', 'caf', 'x'),\n  tostring(store.exists('latin1.txt')), table.concat(store.glob('*'), ','), caught(store.append, 'latin1.txt', '!') }, '\\n')\n```\n",
    );
    let (_, report) = run_json(&prompt, &store);
    assert_eq!(
        report["result"],
        "lua: store backend failure\nlua: store backend failure\nlua: store backend failure\nlua: store backend failure\ntrue\nlatin1.txt\nok"
    );
    // The failed edit changed nothing; the append added its bytes to the old ones.
    assert_eq!(
        std::fs::read(store.join("latin1.txt")).expect("read"),
        b"caf\xe9!"
    );
}

#[test]
fn a_store_that_cannot_be_opened_fails_the_run_as_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let not_a_directory = dir.path().join("plain-file");
    std::fs::write(&not_a_directory, "x").expect("write");
    let prompt = write_prompt(
        dir.path(),
        "",
        "## Main\n\n```lua\nreturn 'unreached'\n```\n",
    );
    let (out, report) = run_json(&prompt, &not_a_directory);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        report["error"],
        serde_json::json!({"kind": "Store", "message": "store operation failed"})
    );
}
