//! The run-wide memory budget through the real binary: the `[limits]
//! run_memory_mib` host-file key (its effect, and a bad value named with its
//! file, line and key), and the memory error in the terminal and `--json`
//! reports. The language side (tasks, fanout arms, nested calls) is data under
//! `tests/data/limits/`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/mock_model.rs"]
mod mock_model;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// Three sections in turn, each keeping 20 MiB until it ends: fine under the
/// default budget, too much for an 8 MiB one.
const GROWING: &str = "---\nname: grow\ndescription: keeps 20 MiB\npromptforge: 0\n---\n\n# Grow\n\n## A\n\n```lua\nvar.a = #string.rep('a', 20 * 1024 * 1024)\n```\n\n## B\n\n```lua\nlocal big = string.rep('b', 20 * 1024 * 1024)\nreturn 'kept ' .. (var.a + #big)\n```\n";

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write a test file");
    p
}

fn run(dir: &Path, host: Option<&str>, json: bool) -> Output {
    let prompt = write(dir, "grow.md", GROWING);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_promptforge"));
    cmd.arg("run")
        .arg(&prompt)
        .arg("--store")
        .arg(dir.join("store"));
    cmd.env_remove("PROMPTFORGE_HOST")
        .env("PROMPTFORGE_HOME", dir.join("home"));
    if let Some(text) = host {
        cmd.arg("--host").arg(write(dir, "host.toml", text));
    }
    if json {
        cmd.arg("--json");
    }
    cmd.output().expect("run the binary")
}

#[test]
fn the_default_budget_leaves_an_ordinary_prompt_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run(dir.path(), None, false);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "kept 41943040\n");
    let out = run(dir.path(), Some("[limits]\nrun_memory_mib = 512\n"), false);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn a_small_budget_fails_the_run_with_the_memory_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = "[limits]\nrun_memory_mib = 8\n";
    let out = run(dir.path(), Some(host), false);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error[Lua]: not enough memory"), "{err}");
    assert!(out.stdout.is_empty(), "no result on a failed run");

    let out = run(dir.path(), Some(host), true);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    assert_eq!(report["outcome"], "failed");
    assert_eq!(report["error"]["kind"], "Lua");
    assert_eq!(report["error"]["message"], "not enough memory");
}

#[test]
fn a_bad_budget_is_named_with_its_file_line_and_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    for bad in ["0", "-1", "1.5", "\"512MiB\"", "2000000", "true", "[1]"] {
        let host = format!("# the run budget\n[limits]\nrun_memory_mib = {bad}\n");
        let out = run(dir.path(), Some(&host), false);
        assert_eq!(out.status.code(), Some(2), "{bad}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let file = dir.path().join("host.toml");
        assert!(err.contains(&file.display().to_string()), "{bad}: {err}");
        assert!(err.contains("line 3"), "{bad}: {err}");
        assert!(
            err.contains("`run_memory_mib` must be a whole number of MiB from 1 to 1048576"),
            "{bad}: {err}"
        );
        assert!(!err.contains("panicked"), "{bad}: {err}");
    }
}

#[test]
fn unknown_limits_keys_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run(dir.path(), Some("[limits]\nrun_memory = 64\n"), true);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    let message = report["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("run_memory"), "{message}");
    assert!(
        message.contains("run_memory_mib"),
        "the known key is listed: {message}"
    );
}

/// Runs `promptforge run` on `prompt` (with `host`, if any, and `args`),
/// polling the child's peak resident memory (`VmHWM`) while it runs; a run
/// that passes `KILL_PAST_KIB` is killed, so a broken bound cannot take the
/// machine down. Returns the output and the peak in KiB.
fn run_measured(dir: &Path, prompt: &str, host: Option<&str>, args: &[&str]) -> (Output, u64) {
    let (out, peak, _) = run_measured_with_disk(dir, prompt, host, args);
    (out, peak)
}

/// The bytes the child's unnamed (deleted) files hold now: the event spool.
fn deleted_file_bytes(pid: u32) -> u64 {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    fds.flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| target.to_string_lossy().ends_with("(deleted)"))
        })
        .filter_map(|fd| std::fs::metadata(fd.path()).ok())
        .map(|m| m.len())
        .sum()
}

/// [`run_measured`], also sampling the peak bytes of the child's unnamed
/// temporary files (the event spool): (output, peak RSS KiB, peak spool bytes).
fn run_measured_with_disk(
    dir: &Path,
    prompt: &str,
    host: Option<&str>,
    args: &[&str],
) -> (Output, u64, u64) {
    const KILL_PAST_KIB: u64 = 2 * 1024 * 1024;
    let prompt = write(dir, "prompt.md", prompt);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_promptforge"));
    cmd.arg("run")
        .arg(&prompt)
        .arg("--store")
        .arg(dir.join("store"))
        .args(args)
        .env_remove("PROMPTFORGE_HOST")
        .env("PROMPTFORGE_HOME", dir.join("home"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(text) = host {
        cmd.arg("--host").arg(write(dir, "host.toml", text));
    }
    let mut child = cmd.spawn().expect("run the binary");
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0u64;
    // The pipes are drained by threads, so a chatty run never blocks on them.
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut buf).map(|_| buf)
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        std::io::Read::read_to_end(&mut stderr, &mut buf).map(|_| buf)
    });
    let started = std::time::Instant::now();
    let mut peak_disk = 0u64;
    let mut polls = 0u64;
    let status = loop {
        polls += 1;
        // Listing the descriptors costs more than reading the status: every 20th poll.
        if polls.is_multiple_of(20) {
            peak_disk = peak_disk.max(deleted_file_bytes(child.id()));
        }
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            let hwm = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
            if let Some(kib) = hwm {
                peak = peak.max(kib);
            }
        }
        if peak > KILL_PAST_KIB || started.elapsed() > std::time::Duration::from_secs(600) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the run passed {peak} KiB of memory (or 600 s); killed");
        }
        if let Some(status) = child.try_wait().expect("poll") {
            break status;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let stdout = out_reader.join().expect("stdout thread").expect("stdout");
    let stderr = err_reader.join().expect("stderr thread").expect("stderr");
    (
        Output {
            status,
            stdout,
            stderr,
        },
        peak,
        peak_disk,
    )
}

const BUDGET_64: &str = "[limits]\nrun_memory_mib = 64\n";

/// A prompt whose `## Use` section's prose holds `count` placeholders
/// `{{ placeholder }}` after `setup` (a block of `## Make`), and whose block
/// runs `before` and then returns the prose's length.
fn prose_prompt(setup: &str, before: &str, placeholder: &str, count: usize) -> String {
    let prose = format!("{{{{ {placeholder} }}}} ").repeat(count);
    format!(
        "---\nname: prose\ndescription: big prose\npromptforge: 0\n---\n\n# Prose\n\n## Make\n\n```lua\n{setup}\n```\n\n## Use\n\n{prose}\n\n```lua\n{before}\nreturn #prose\n```\n"
    )
}

/// Prose substitution builds its text in the host: it must fit in what the
/// section's VM may still use. A thousand placeholders of a 4 MB value under
/// a 64 MiB budget fail with the memory error (they built a 4 GB string
/// first), whatever the value is: a `var` field, a nested one, a global.
#[test]
fn prose_substitution_is_built_within_the_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let four_mb = "string.rep('x', 4 * 1024 * 1024)";
    let cases = [
        (format!("var.big = {four_mb}"), String::new(), "var.big"),
        (
            format!("var.t = {{ inner = {{ s = {four_mb} }} }}"),
            String::new(),
            "var.t.inner.s",
        ),
        (String::new(), format!("big = {four_mb}"), "big"),
    ];
    let mut peaks = Vec::new();
    for (setup, before, placeholder) in &cases {
        let prompt = prose_prompt(setup, before, placeholder, 1000);
        let (out, peak) = run_measured(dir.path(), &prompt, Some(BUDGET_64), &["--json"]);
        assert_eq!(out.status.code(), Some(1), "{placeholder}: {out:?}");
        let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
        assert_eq!(report["outcome"], "failed", "{placeholder}");
        assert_eq!(report["error"]["kind"], "Lua", "{placeholder}: {report}");
        assert_eq!(
            report["error"]["message"], "not enough memory",
            "{placeholder}: {report}"
        );
        peaks.push((placeholder.to_string(), peak));
        // Far below the 4 GB the text would have been (7.9 GB peak before).
        assert!(peak < 512 * 1024, "{placeholder}: peak {peak} KiB");
    }
    eprintln!("peak resident memory (KiB) of the refused runs: {peaks:?}");
    // What fits is built: three placeholders of 4 MB under the same budget.
    let prompt = prose_prompt(&format!("var.big = {four_mb}"), "", "var.big", 3);
    let (out, _) = run_measured(dir.path(), &prompt, Some(BUDGET_64), &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        (3 * (4 * 1024 * 1024 + 1)).to_string()
    );
}

/// `var` lives in the host: what it holds is paid for by the VM of the entry
/// that holds it, so copies of one string stored under many keys fail with
/// the memory error instead of growing the host without bound.
#[test]
fn var_is_counted_against_the_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (what, body) in [
        ("keys", "local s = string.rep('v', 4 * 1024 * 1024)\nfor i = 1, 1000 do var['k' .. i] = s end\nreturn 'all kept'"),
        ("an array", "local s = string.rep('v', 4 * 1024 * 1024)\nvar.list = {}\nfor i = 1, 1000 do var.list[i] = s end\nreturn 'all kept'"),
        ("nested tables", "local s = string.rep('v', 1024 * 1024)\nfor i = 1, 1000 do var['k' .. i] = { a = s, b = { s, s } } end\nreturn 'all kept'"),
    ] {
        let prompt = format!("---\nname: var\ndescription: grows var\npromptforge: 0\n---\n\n# Var\n\n## Grow\n\n```lua\n{body}\n```\n");
        let (out, peak) = run_measured(dir.path(), &prompt, Some(BUDGET_64), &["--json"]);
        assert_eq!(out.status.code(), Some(1), "{what}: {out:?}");
        let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
        assert_eq!(report["error"]["message"], "not enough memory", "{what}: {report}");
        assert!(peak < 512 * 1024, "{what}: peak {peak} KiB");
        eprintln!("{what}: peak {peak} KiB");
    }
    // Caught, it is the ordinary memory error value, what was kept stays, and
    // what `var` lets go is the VM's to use again.
    let prompt = "---\nname: var\ndescription: grows var\npromptforge: 0\n---\n\n# Var\n\n## Grow\n\n```lua\nlocal s = string.rep('v', 1024 * 1024)\nlocal n = 0\nlocal ok, e = pcall(function() for i = 1, 1000 do var['k' .. i] = s n = i end end)\nfor i = 1, n - 1 do var['k' .. i] = nil end\nlocal kept = n > 10 and #var['k' .. n] == #s\nlocal again = string.rep('w', 16 * 1024 * 1024)\nreturn tostring(ok) .. ' ' .. e.kind .. ' ' .. e.message .. ' ' .. tostring(kept) .. ' ' .. #again\n```\n";
    let (out, _) = run_measured(dir.path(), prompt, Some(BUDGET_64), &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("false lua not enough memory true {}", 16 * 1024 * 1024)
    );
}

/// A prompt that logs `entries` section entries (`call`s) of 1024 `log`
/// lines each (after a child task logged 1024 numbered lines), then reads the
/// child's history back and tries to read its own.
fn history_prompt(entries: u32) -> String {
    format!(
        "---\nname: history\ndescription: logs a lot\npromptforge: 0\n---\n\n# History\n\n## Start\n\n```lua\nlocal t = tasks.spawn('### Child')\ntasks.when_all({{ t }})\nvar.child = t.task\n```\n\n### Child\n\n```lua\nfor i = 1, 1024 do log('child ' .. i) end\nreturn 'done'\n```\n\n## Spam\n\n```lua\nfor _ = 1, {entries} do call('### Burst') end\n```\n\n### Burst\n\n```lua\nlocal line = string.rep('l', 240)\nfor i = 1, 1024 do log(line) end\n```\n\n## Read\n\n```lua\nlocal seen = {{}}\nfor _, e in ipairs(tasks.events(var.child)) do\n  if e.kind == 'lua' then seen[#seen + 1] = e.message end\nend\nlocal ordered = #seen == 1024\nfor i = 1, #seen do ordered = ordered and seen[i] == 'child ' .. i end\nlocal ok, e = pcall(tasks.events, sys.taskid)\nreturn #seen .. ' ' .. tostring(ordered) .. ' ' .. (ok and ('all ' .. #e) or e.message)\n```\n"
    )
}

/// The run's event history is bounded in memory, with the run log or
/// without: past its window it moves to a temporary file, and `tasks.events`
/// reads back from there (a child task's history, after the main walk logged
/// a hundred thousand lines). A history too large for the reading VM fails
/// that read with the memory error; the host never holds a second copy.
#[test]
fn a_long_event_history_stays_out_of_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    for args in [&["--no-log"][..], &[][..]] {
        let host = Some("[limits]\nrun_memory_mib = 32\n");
        let (small, base_peak) = run_measured(dir.path(), &history_prompt(1), host, args);
        assert_eq!(small.status.code(), Some(0), "{small:?}");
        let text = String::from_utf8_lossy(&small.stdout);
        assert!(text.starts_with("1024 true all "), "{text}");
        let (out, peak) = run_measured(dir.path(), &history_prompt(150), host, args);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "1024 true not enough memory"
        );
        eprintln!("{args:?}: peak {peak} KiB after 150 entries, {base_peak} KiB after 1");
        // The big run's reading VM fills its 32 MiB before its read is
        // refused; beyond that, 150 entries of 1024 lines kept about 100 MB
        // more before (the history and the checkpoints): the window is 4 MiB.
        assert!(
            peak < base_peak + 64 * 1024,
            "{args:?}: peak {peak} KiB, one entry's {base_peak} KiB"
        );
    }
}

/// The store keeps files on disk, but a read, an append or a replace loads
/// the whole file into the host: appends grow a file past what any VM could
/// hold, and the operations that would load it are refused with the memory
/// error (and report their failed event), not loaded.
#[test]
fn store_files_too_big_for_the_vm_are_not_loaded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prompt = "---\nname: store\ndescription: grows a file\npromptforge: 0\n---\n\n# Store\n\n## Grow\n\n```lua\nlocal chunk = string.rep('s', 4 * 1024 * 1024)\nlocal n = 0\nlocal ok, e = pcall(function() for i = 1, 100 do store.append('big.txt', chunk) n = i end end)\nchunk = nil\nvar.grow = tostring(ok) .. ' ' .. e.message .. ' ' .. tostring(n > 3 and n < 100)\n```\n\n## Load\n\n```lua\nlocal hold = string.rep('h', 30 * 1024 * 1024)\nlocal out = { var.grow }\nfor _, call in ipairs({ function() return store.read('big.txt') end, function() return store.read_numbered('big.txt', 1, 1) end, function() return store.str_replace('big.txt', 'q', 'r') end, function() return store.append('big.txt', 'more') end }) do\n  local ok, e = pcall(call)\n  out[#out + 1] = ok and 'loaded' or e.message\nend\nlocal failed = 0\nfor _, ev in ipairs(tasks.events(sys.taskid)) do\n  if ev.kind:match('^store_.*_failed$') and ev.section == 'Load' then failed = failed + 1 end\nend\nreturn table.concat(out, ',') .. ',' .. failed .. ',' .. #hold\n```\n";
    let (out, peak) = run_measured(dir.path(), prompt, Some(BUDGET_64), &[]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let refused = "not enough memory";
    assert_eq!(
        text.trim(),
        format!(
            "false {refused} true,{refused},{refused},{refused},{refused},4,{}",
            30 * 1024 * 1024
        ),
    );
    eprintln!("store: peak {peak} KiB");
    assert!(peak < 512 * 1024, "peak {peak} KiB");
}

/// A prompt with a model role bound to the mock server, whose `## Go`
/// section runs `body`.
fn model_prompt(body: &str) -> String {
    format!(
        "---\nname: host-side\ndescription: host-side copies\npromptforge: 0\nmodels:\n  writer: {{}}\n---\n\n# Host side\n\n```lua\nmodels.default('writer')\n```\n\n## Go\n\n```lua\n{body}\n```\n"
    )
}

/// What the host builds from a prompt's tables is paid for by the VM that
/// asked, through one account (`memory::HostCharge`): a tool call's
/// arguments (converted to JSON, written to the run log), a `models.loop`
/// list (the host's records, their composition and wire messages, the
/// request in flight) and `string.rep`/`string.gsub` results as they are
/// built. Tables that name one 4 MB string a thousand times, or results
/// kept past the budget, fail with the memory error under a 64 MiB budget,
/// and the process stays small (4.3 GB and an abort at 6 GB before, for the
/// tool call and the loop).
#[test]
fn host_side_builders_are_within_the_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = mock_model::MockModel::start(mock_model::Behaviour::default());
    // A context window the 3 MiB conversation below fits in.
    let host = format!("{BUDGET_64}{}", server.host_file("context = 4000000"));
    let four_mb = "local s = string.rep('x', 4 * 1024 * 1024)";
    let refused = [
        ("a tool argument table naming one string a thousand times",
         format!("tools.add_local('t', 'd', {{}}, function() return 'ok' end)\n{four_mb}\nlocal args = {{}}\nfor i = 1, 1000 do args['k' .. i] = s end\nreturn tools.call('t', args)")),
        ("a nested tool argument table",
         format!("tools.add_local('t', 'd', {{}}, function() return 'ok' end)\n{four_mb}\nlocal inner = {{ s, s, s, s }}\nlocal args = {{ a = {{}} }}\nfor i = 1, 250 do args.a[i] = inner end\nreturn tools.call('t', args)")),
        ("a models.loop list of a thousand records",
         format!("{four_mb}\nlocal msgs = messages.new()\nfor i = 1, 1000 do msgs:user(s) end\nmodels.loop(msgs)\nreturn 'sent'")),
        ("a models.infer prompt the host copies into its request",
         "local s = string.rep('x', 24 * 1024 * 1024)\nreturn models.infer(s)".to_string()),
        ("a models.loop record of a thousand content parts",
         format!("{four_mb}\nlocal parts = {{}}\nfor i = 1, 1000 do parts[i] = {{ type = 'text', text = s }} end\nmodels.loop({{ {{ role = 'user', content = parts }} }})\nreturn 'sent'")),
        ("a models.loop tool call's arguments",
         format!("{four_mb}\nlocal args = {{}}\nfor i = 1, 1000 do args['k' .. i] = s end\nmodels.loop({{ {{ role = 'user', content = 'go' }}, {{ role = 'assistant', content = '', tool_calls = {{ {{ id = 'c1', name = 't', arguments = args }} }} }}, {{ role = 'tool', tool_call_id = 'c1', content = 'ok' }} }})\nreturn 'sent'")),
        ("string.rep results kept past the budget",
         "local keep = {}\nfor i = 1, 100 do keep[i] = string.rep('x', 24 * 1024 * 1024 + i) end\nreturn #keep".to_string()),
        ("a string.rep with a separator past the VM",
         "local s = string.rep('x', 4 * 1024 * 1024, string.rep('y', 39))\nreturn #s".to_string()),
        ("string.gsub results kept past the budget",
         "local s = string.rep('x', 8 * 1024 * 1024)\nlocal keep = {}\nfor i = 1, 100 do keep[i] = s:gsub('x', 'xy') end\nreturn #keep".to_string()),
        ("a string.gsub growing through %0",
         "local s = string.rep('x', 4 * 1024 * 1024)\nlocal r = s:gsub('x', '%0%0%0%0%0%0%0%0%0%0%0%0%0%0%0%0')\nreturn #r".to_string()),
    ];
    let mut peaks = Vec::new();
    for (what, body) in &refused {
        let (out, peak) = run_measured(dir.path(), &model_prompt(body), Some(&host), &["--json"]);
        assert_eq!(out.status.code(), Some(1), "{what}: {out:?}");
        let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
        assert_eq!(report["error"]["kind"], "Lua", "{what}: {report}");
        assert_eq!(
            report["error"]["message"], "not enough memory",
            "{what}: {report}"
        );
        assert!(peak < 384 * 1024, "{what}: peak {peak} KiB");
        peaks.push((*what, peak));
    }
    eprintln!("peak resident memory (KiB) of the refused runs: {peaks:#?}");
    // What fits is built, and caught it is the ordinary error value.
    let fits = [
        ("tools.add_local('t', 'd', {}, function(a) return #a.k1 + #a.k2 end)\nlocal s = string.rep('x', 4 * 1024 * 1024)\nreturn tools.call('t', { k1 = s, k2 = s })", (8 * 1024 * 1024).to_string()),
        // Merged into one user message of 3 MiB and two separators, echoed.
        ("local s = string.rep('x', 1024 * 1024)\nlocal msgs = messages.new()\nfor i = 1, 3 do msgs:user(s) end\nmodels.loop(msgs)\nreturn #msgs[#msgs].content", (5 + 3 * 1024 * 1024 + 4).to_string()),
        ("local ok, e = pcall(string.rep, 'x', 80 * 1024 * 1024)\nreturn tostring(ok) .. ' ' .. e.kind .. ' ' .. e.message .. ' ' .. #string.rep('x', 40 * 1024 * 1024)", format!("false lua not enough memory {}", 40 * 1024 * 1024)),
    ];
    for (body, want) in &fits {
        let (out, _) = run_measured(dir.path(), &model_prompt(body), Some(&host), &[]);
        assert_eq!(out.status.code(), Some(0), "{body}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.trim().starts_with(want.as_str()), "{body}: {text}");
    }
}

/// The declared `output:` file is collected within a bound: one past it
/// (here a 70 MiB file a Plugin or another writer left in the store) is
/// refused unread with a warning naming the file and the limit, the run
/// still completes, and the file stays where it is; a small one is named.
#[test]
fn the_output_file_is_collected_within_a_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prompt = "---\nname: out\ndescription: declares an output\npromptforge: 0\noutput:\n  path: report.md\n  description: The report\n---\n\n# Out\n\n```lua\nreturn 'done'\n```\n";
    let store = dir.path().join("store");
    std::fs::create_dir_all(&store).expect("store dir");
    let report = store.join("report.md");
    let file = std::fs::File::create(&report).expect("create");
    file.set_len(70 * 1024 * 1024)
        .expect("a sparse 70 MiB file");
    drop(file);
    let (out, peak) = run_measured(dir.path(), prompt, None, &["--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    let message = json["output"]["error"].as_str().unwrap_or_default();
    let want = format!(
        "output file report.md is {} bytes, over the {}-byte limit for a collected output (it stays in the store)",
        70 * 1024 * 1024,
        64 * 1024 * 1024
    );
    assert_eq!(message, want, "{json}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&want), "{err}");
    assert!(peak < 64 * 1024, "the file was not loaded: peak {peak} KiB");
    assert_eq!(
        std::fs::metadata(&report).map(|m| m.len()).ok(),
        Some(70 * 1024 * 1024)
    );
    std::fs::write(&report, "short").expect("rewrite");
    let (out, _) = run_measured(dir.path(), prompt, None, &["--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).expect("one JSON report");
    assert_eq!(json["output"]["path"], "report.md", "{json}");
    assert!(json["output"]["error"].is_null(), "{json}");
}

/// The event spool on disk is bounded too: 2,000 section entries of 1,024
/// `log` lines (about 550 MB of history) keep at most its 256 MiB limit
/// (and one 16 MiB segment) in the run's unnamed temporary files, with the
/// run log off; `tasks.events` reads the newest window: a task started
/// after the flood reads its whole history, while the first child's early
/// lines were let go (the run log has every event).
#[test]
fn the_event_spool_on_disk_is_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prompt = "---\nname: flood\ndescription: logs 2000 x 1024 lines\npromptforge: 0\n---\n\n# Flood\n\n## Start\n\n```lua\nlocal t = tasks.spawn('### Early')\ntasks.when_all({ t })\nvar.early = t.task\n```\n\n### Early\n\n```lua\nfor i = 1, 1024 do log('early ' .. i) end\n```\n\n## Spam\n\n```lua\nfor _ = 1, 2000 do call('### Burst') end\n```\n\n### Burst\n\n```lua\nlocal line = string.rep('l', 240)\nfor i = 1, 1024 do log(line) end\n```\n\n## Read\n\n```lua\nlocal t = tasks.spawn('### Late')\ntasks.when_all({ t })\nlocal late = {}\nfor _, e in ipairs(tasks.events(t)) do\n  if e.kind == 'lua' then late[#late + 1] = e.message end\nend\nlocal early = 0\nfor _, e in ipairs(tasks.events(var.early)) do\n  if e.kind == 'lua' then early = early + 1 end\nend\nreturn #late .. ' ' .. late[1] .. ' ' .. late[#late] .. ' ' .. early\n```\n\n### Late\n\n```lua\nfor i = 1, 10 do log('late ' .. i) end\n```\n";
    let started = std::time::Instant::now();
    let (out, peak, disk) = run_measured_with_disk(dir.path(), prompt, None, &["--no-log"]);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "10 late 1 late 10 0"
    );
    eprintln!("2000 x 1024 log lines: peak spool {disk} bytes, peak RSS {peak} KiB, {took:?}");
    assert!(disk > 64 << 20, "the spool was in use: {disk} bytes");
    assert!(disk <= (256 + 16 + 1) << 20, "peak spool {disk} bytes");
    assert!(peak < 256 * 1024, "peak {peak} KiB");
}
