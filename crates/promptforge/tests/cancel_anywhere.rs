//! One Ctrl-C ends the run cancelled wherever Lua is: inside C library calls
//! that run no VM instruction for a long time (a backtracking pattern, a huge
//! `table.move`), inside an `xpcall` message handler, in a loop that keeps
//! catching the interrupt, and while a required MCP server never answers
//! `initialize`. Drives the real binary: the prompt writes a marker file into
//! its store just before the long call, the test sends the signal once the
//! marker is there, then expects the cancelled report and exit code 130.
//! The only time bound is a generous guard against hanging the suite.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Never a timed assertion: only how long a test waits before it gives up.
const HANG_GUARD: Duration = Duration::from_secs(20);

fn bin(home: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_promptforge"));
    command
        .env_remove("PROMPTFORGE_HOST")
        .env("PROMPTFORGE_HOME", home);
    command
}

struct Run {
    dir: tempfile::TempDir,
    child: Child,
}

/// Starts `body` (one Lua block, which first writes `marker.txt` to the store).
fn start(body: &str, frontmatter: &str, host: Option<&Path>) -> Run {
    start_sections(body, "", frontmatter, host)
}

/// Like [`start`], with `subsections` (Markdown) after the block of `## Main`.
fn start_sections(body: &str, subsections: &str, frontmatter: &str, host: Option<&Path>) -> Run {
    let dir = tempfile::tempdir().expect("tempdir");
    let prompt = dir.path().join("prompt.md");
    std::fs::write(
        &prompt,
        format!("---\nname: cancel-anywhere\ndescription: d\npromptforge: 0\n{frontmatter}---\n\n# Cancel\n\n## Main\n\n```lua\n{body}\n```\n{subsections}"),
    )
    .expect("prompt");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("home");
    let mut command = bin(&home);
    command
        .arg("run")
        .arg(&prompt)
        .args(["--json", "--no-log", "--store"])
        .arg(dir.path().join("store"));
    if let Some(host) = host {
        command.arg("--host").arg(host);
    }
    let child = command.stdout(Stdio::piped()).spawn().expect("spawn");
    Run { dir, child }
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + HANG_GUARD;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// Waits for the run to end (killing it past the guard) and returns its reports.
fn finish(mut run: Run) -> (Option<i32>, Vec<Value>) {
    let deadline = Instant::now() + HANG_GUARD;
    while run.child.try_wait().expect("poll").is_none() {
        if Instant::now() > deadline {
            let _ = run.child.kill();
            let _ = run.child.wait();
            panic!("the run did not end after the signal");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = run.child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let reports = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    drop(run.dir);
    (out.status.code(), reports)
}

/// The prompt reaches `long_call` (after writing the marker); one signal cancels it.
fn cancels(long_call: &str, signal_name: &str) {
    cancels_after("", long_call, signal_name);
}

/// Like [`cancels`], with `setup` run before the marker is written.
fn cancels_after(setup: &str, long_call: &str, signal_name: &str) {
    let body = format!("{setup}\nstore.write('marker.txt', 'in')\n{long_call}\nreturn 'finished'");
    cancels_run(start(&body, "", None), long_call, signal_name);
}

/// `run` writes `marker.txt` to its store, somewhere, before its long call.
fn cancels_run(run: Run, long_call: &str, signal_name: &str) {
    wait_for(&run.dir.path().join("store/marker.txt"));
    // Give the block time to enter the long call itself.
    std::thread::sleep(Duration::from_millis(200));
    let signalled = Instant::now();
    signal(&run.child, signal_name);
    let (code, reports) = finish(run);
    // Reported, never asserted (the machine may be busy): how long the run
    // took to end after the signal.
    eprintln!(
        "{signal_name} ended the run {} ms after the signal: {long_call}",
        signalled.elapsed().as_millis()
    );
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(
        reports[0]["outcome"], "cancelled",
        "{long_call}: {}",
        reports[0]
    );
    assert_eq!(code, Some(130), "{long_call}");
}

#[test]
fn a_backtracking_find_is_cancelled() {
    cancels(r#"string.rep("a", 30000):find(".-.-.-.-b")"#, "INT");
}

#[test]
fn a_backtracking_match_gmatch_and_gsub_are_cancelled() {
    cancels(
        r#"local s = string.rep("a", 30000) s:match("(.-)(.-)(.-)(.-)b")"#,
        "INT",
    );
    cancels(
        r#"for w in string.rep("a", 30000):gmatch(".-.-.-.-b") do end"#,
        "TERM",
    );
    cancels(
        r#"string.gsub(string.rep("a", 30000), ".-.-.-.-b", "x")"#,
        "HUP",
    );
    cancels(
        r#"string.gsub(string.rep("a", 30000), ".-.-.-.-b", function() return "x" end)"#,
        "INT",
    );
}

/// The matcher counts the bytes a long literal run compares, not only the
/// match steps it enters (one step compared a megabyte between two polls).
#[test]
fn a_long_literal_run_in_a_pattern_is_cancelled() {
    let setup = "local s = string.rep('a', 2e6)\nlocal lit = string.rep('a', 1e6)";
    cancels_after(setup, "s:match(lit .. 'b')", "INT");
    cancels_after(setup, "s:find(lit .. 'b?c')", "TERM");
    cancels_after(setup, "for w in s:gmatch(lit .. 'b') do end", "INT");
    cancels_after(setup, "s:gsub(lit .. 'c', 'x')", "TERM");
    cancels_after(
        setup,
        "s:gsub('(' .. lit .. ')b', function(w) return w end)",
        "INT",
    );
    // A long set compared per subject byte, and a back-reference compared as a block.
    cancels_after(
        "local s = string.rep('a', 2e5)\nlocal set = '[' .. string.rep('b', 1e5) .. 'a]'",
        "s:match(set .. '*' .. set .. '*c')",
        "INT",
    );
    cancels_after(
        "local s = string.rep('a', 4e5)",
        "s:match('(a*)%1%1b')",
        "TERM",
    );
}

/// An anchored pattern with optional items has 2^k branches, each comparing
/// the rest: the cost estimate holds it to the budget, so it never goes to C.
#[test]
fn an_anchored_pattern_with_optional_items_is_cancelled() {
    let setup = "local s = string.rep('a', 100020)\nlocal p = '^' .. string.rep('a?', 20) .. string.rep('a', 100000) .. 'b'";
    cancels_after(setup, "s:match(p)", "INT");
    cancels_after(setup, "s:find(p)", "TERM");
    cancels_after(setup, "s:gsub(p, 'x')", "INT");
    cancels_after(
        "local s = string.rep('a', 100020)\nlocal p = '^' .. string.rep('(a?)', 20) .. string.rep('a', 100000) .. '$'",
        "s:match(p .. 'b')",
        "TERM",
    );
}

/// `table.insert`/`table.remove` shift up to the length `__len` gives: over
/// such a table they shift in Lua, where the hook fires.
#[test]
fn an_insert_or_remove_over_a_huge_len_is_cancelled() {
    let huge = "local t = setmetatable({}, { __len = function() return math.maxinteger - 1 end })";
    cancels_after(huge, "table.insert(t, 1, 'x')", "INT");
    cancels_after(huge, "table.remove(t, 1)", "TERM");
    cancels_after(huge, "local remove = table.remove\nremove(t, 2)", "INT");
    cancels_after(
        "local t = setmetatable({}, { __len = function() return 2^62 end, __newindex = rawset })",
        "table.insert(t, 5, 'x')",
        "TERM",
    );
}

/// What C would loop on for ever in `string.rep` (an empty piece and
/// separator, a huge count) returns at once, and a count past the VM's
/// memory fails with the memory error at once, not after copying.
#[test]
fn string_rep_with_a_huge_count_returns_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prompt = dir.path().join("prompt.md");
    std::fs::write(
        &prompt,
        "---\nname: rep\ndescription: d\npromptforge: 0\n---\n\n# Rep\n\n## Main\n\n```lua\nlocal n = math.maxinteger\nlocal lengths = { #string.rep('', n), #string.rep('', n, ''), #(''):rep(2^53), #string.rep('', 1e15, '') }\nfor _, call in ipairs({ function() return string.rep('a', n) end, function() return string.rep('ab', 2^40) end, function() return string.rep('', n, 'x') end, function() return ('xy'):rep(1e12, '') end }) do\n  local ok, e = pcall(call)\n  lengths[#lengths + 1] = ok and 'ok' or (type(e) == 'table' and e.message or tostring(e))\nend\nreturn table.concat(lengths, ',')\n```\n",
    )
    .expect("prompt");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("home");
    let mut child = bin(&home)
        .arg("run")
        .arg(&prompt)
        .args(["--no-log", "--store"])
        .arg(dir.path().join("store"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + HANG_GUARD;
    while child.try_wait().expect("poll").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("string.rep with a huge count did not return");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fields: Vec<&str> = stdout.trim_end().split(',').collect();
    assert_eq!(fields[..4], ["0", "0", "0", "0"], "{stdout}");
    for refused in &fields[4..] {
        assert!(
            refused.contains("not enough memory") || refused.contains("resulting string too large"),
            "{stdout}"
        );
    }
    assert_eq!(fields.len(), 8, "{stdout}");
}

#[test]
fn a_backtracking_match_inside_pcall_is_cancelled() {
    cancels(
        r#"while true do pcall(string.find, string.rep("a", 30000), ".-.-.-.-b") end"#,
        "INT",
    );
}

#[test]
fn a_huge_table_move_is_cancelled() {
    cancels("table.move({}, 1, 1e15, 2)", "INT");
    cancels("local t = {1, 2, 3} table.move(t, 1, 1e15, 2, {})", "INT");
}

#[test]
fn a_long_sort_without_a_comparator_is_cancelled() {
    let fill = |value: &str| format!("local t = {{}} for i = 1, 3e6 do t[i] = {value} end");
    cancels_after(&fill("(i * 7919) % 1000003"), "table.sort(t)", "INT");
    cancels_after(&fill("(i * 7919) % 1000003 + 0.5"), "table.sort(t)", "TERM");
}

#[test]
fn sorts_and_concats_that_call_back_are_cancelled() {
    cancels(
        "table.sort({3, 2, 1, 5, 4}, function(a, b) while true do end end)",
        "INT",
    );
    cancels(
        "table.concat({ setmetatable({}, { __tostring = function() while true do end end }) })",
        "INT",
    );
}

#[test]
fn an_xpcall_message_handler_cannot_hold_a_cancel() {
    // The handler loops for a plain error...
    cancels(
        "xpcall(function() error('x') end, function(e) while true do end end)",
        "INT",
    );
    // ...and is entered again, with hooks off, by the error the cancel raises.
    cancels(
        "xpcall(function() while true do end end, function(e) while true do end end)",
        "INT",
    );
    // A handler that swallows the interrupt and loops back in.
    cancels(
        "while true do xpcall(function() while true do end end, function(e) return e end) end",
        "INT",
    );
}

fn mcp_host(dir: &Path, init: &str) -> (PathBuf, PathBuf) {
    let pid_file = dir.join("server.pid");
    let spec = json!({ "pid_file": pid_file, "ignore_eof": true, "ignore_term": true, "init": init, "tools": [
        {"name": "echo", "description": "Answers", "result": {"texts": ["echoed"]}}
    ]});
    let spec_file = dir.join("spec.json");
    std::fs::write(&spec_file, spec.to_string()).expect("spec");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pf-plugins/tests/mcp_server.py");
    let command: Vec<String> = [
        "python3".to_string(),
        script.display().to_string(),
        spec_file.display().to_string(),
    ]
    .iter()
    .map(|c| Value::String(c.clone()).to_string())
    .collect();
    let host = dir.join("host.toml");
    std::fs::write(
        &host,
        format!(
            "[plugins.\"acme/slow\"]\ncommand = [{}]\ntrusted = true\n",
            command.join(", ")
        ),
    )
    .expect("host");
    (host, pid_file)
}

/// True once no live (non-zombie) process has this pid.
fn gone(pid: &str) -> bool {
    let deadline = Instant::now() + HANG_GUARD;
    loop {
        let alive = std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|t| {
            !t.lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'))
        });
        if !alive {
            return true;
        }
        if Instant::now() > deadline {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A required MCP server that never answers `initialize`: one signal (or two)
/// ends the run cancelled, not `RequirementsUnmet`, and the server is gone.
fn cancel_during_initialize(signals: &[&str]) {
    let side = tempfile::tempdir().expect("tempdir");
    let (host, pid_file) = mcp_host(side.path(), "silent");
    let run = start(
        "return tools.call('echo', {})",
        "plugins:\n  - acme/slow\ntools:\n  echo: acme/slow/echo\n",
        Some(&host),
    );
    wait_for(&pid_file);
    std::thread::sleep(Duration::from_millis(200));
    for name in signals {
        signal(&run.child, name);
    }
    let (code, reports) = finish(run);
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(reports[0]["outcome"], "cancelled", "{}", reports[0]);
    assert_eq!(code, Some(130));
    let pid = std::fs::read_to_string(&pid_file).expect("pid");
    assert!(gone(pid.trim()), "the MCP server {pid} outlived the run");
}

#[test]
fn a_server_that_never_initializes_is_cancelled_not_unmet() {
    cancel_during_initialize(&["INT"]);
}

#[test]
fn a_second_signal_during_initialize_still_stops_the_server() {
    cancel_during_initialize(&["INT", "INT"]);
}

/// When the count hook raises the interrupt, mlua's error path truncates the
/// running frame's stack (`lua_settop`) inside the hook, which runs that
/// frame's to-be-closed `__close` handlers with hooks off: the hook disarms
/// every `__close` a prompt can reach before it raises.
#[test]
fn a_close_handler_in_the_interrupted_frame_is_cancelled() {
    cancels(
        "local x <close> = setmetatable({}, { __close = function() while true do end end })\nwhile true do end",
        "INT",
    );
}

#[test]
fn a_close_handler_reached_by_an_error_is_cancelled() {
    cancels(
        "local x <close> = setmetatable({}, { __close = function() while true do end end })\nerror('boom')",
        "INT",
    );
    cancels(
        "local function inner() while true do end end\nlocal x <close> = setmetatable({}, { __close = function() while true do end end })\ninner()",
        "INT",
    );
}

/// A `__close` that never returns (`while true do end`), as Lua source.
const LOOPS: &str = "function() while true do end end";

#[test]
fn a_close_handler_set_or_swapped_after_setmetatable_is_cancelled() {
    // Added to the metatable after setmetatable, before the declaration.
    cancels(
        &format!("local mt = {{}}\nlocal t = setmetatable({{}}, mt)\nmt.__close = {LOOPS}\nlocal x <close> = t\nwhile true do end"),
        "INT",
    );
    // A harmless handler at the declaration, swapped for a looping one afterwards.
    cancels(
        &format!("local mt = {{ __close = function() end }}\nlocal x <close> = setmetatable({{}}, mt)\nmt.__close = {LOOPS}\nwhile true do end"),
        "INT",
    );
    // A protected metatable: getmetatable shows a decoy, the real one holds the handler.
    cancels(
        &format!("local x <close> = setmetatable({{}}, {{ __close = {LOOPS}, __metatable = {{}} }})\nwhile true do end"),
        "INT",
    );
}

#[test]
fn a_close_handler_on_a_shared_or_global_metatable_is_cancelled() {
    // The string metatable, which every string shares.
    cancels(
        &format!("getmetatable('').__close = {LOOPS}\nlocal s <close> = 'text'\nwhile true do end"),
        "INT",
    );
    // _G's metatable (the engine keeps its own copy, with the guards).
    cancels(
        &format!(
            "setmetatable(_G, {{ __close = {LOOPS} }})\nlocal g <close> = _G\nwhile true do end"
        ),
        "INT",
    );
}

#[test]
fn several_and_nested_close_handlers_are_cancelled() {
    // Several in the interrupted frame; one that errors between looping ones.
    cancels(
        &format!("local a <close> = setmetatable({{}}, {{ __close = {LOOPS} }})\nlocal b <close> = setmetatable({{}}, {{ __close = function() error('b') end }})\nlocal c <close> = setmetatable({{}}, {{ __close = {LOOPS} }})\nwhile true do end"),
        "INT",
    );
    // In the interrupted frame and in every frame under it.
    cancels(
        &format!("local function level(n)\n  local x <close> = setmetatable({{}}, {{ __close = {LOOPS} }})\n  if n == 0 then while true do end end\n  level(n - 1)\nend\nlevel(3)"),
        "INT",
    );
    // A handler that declares a looping to-be-closed variable of its own.
    cancels(
        &format!("local x <close> = setmetatable({{}}, {{ __close = function()\n  local y <close> = setmetatable({{}}, {{ __close = {LOOPS} }})\n  while true do end\nend }})\nerror('boom')"),
        "INT",
    );
}

#[test]
fn a_close_handler_under_pcall_or_a_c_call_is_cancelled() {
    cancels(
        &format!("while true do\n  pcall(function()\n    local x <close> = setmetatable({{}}, {{ __close = {LOOPS} }})\n    while true do end\n  end)\nend"),
        "INT",
    );
    cancels(
        &format!("xpcall(function()\n  local x <close> = setmetatable({{}}, {{ __close = {LOOPS} }})\n  while true do end\nend, function(e) return e end)"),
        "INT",
    );
    // A comparator table.sort (C) calls: no yield, no continuation across it.
    cancels(
        &format!("table.sort({{3, 2, 1}}, function(a, b)\n  local x <close> = setmetatable({{}}, {{ __close = {LOOPS} }})\n  while true do end\nend)"),
        "INT",
    );
    // A __tostring that tostring (C) calls.
    cancels(
        &format!("tostring(setmetatable({{}}, {{ __tostring = function()\n  local x <close> = setmetatable({{}}, {{ __close = {LOOPS} }})\n  while true do end\nend }}))"),
        "TERM",
    );
}

/// The long call is in `### Work`, which writes the marker itself.
fn cancels_in_subsection(main: &str, signal_name: &str) {
    let work = format!("\n### Work\n\n```lua\nlocal x <close> = setmetatable({{}}, {{ __close = {LOOPS} }})\nstore.write('marker.txt', 'in')\nwhile true do end\n```\n");
    let run = start_sections(main, &work, "", None);
    cancels_run(run, main, signal_name);
}

#[test]
fn a_close_handler_in_a_task_or_a_fanout_arm_is_cancelled() {
    cancels_in_subsection(
        "local t = tasks.spawn('### Work')\ntasks.when_all({ t })\nreturn 'finished'",
        "INT",
    );
    cancels_in_subsection("fanout('### Work', { 1 })\nreturn 'finished'", "INT");
}

/// A scripted model that asks for `spin` `calls` times, then answers.
fn spin_host(dir: &Path, calls: usize) -> PathBuf {
    let mut replies: Vec<Value> = (0..calls)
        .map(|_| json!({"tool_calls": [{"name": "spin", "arguments": {}}]}))
        .collect();
    replies.push(json!("done"));
    let file = dir.join("replies.json");
    std::fs::write(&file, Value::Array(replies).to_string()).expect("replies");
    let host = dir.join("host.toml");
    std::fs::write(
        &host,
        format!(
            "[model]\nprovider = \"script\"\nreplies = {}\n",
            Value::String(file.display().to_string())
        ),
    )
    .expect("host");
    host
}

/// `models.loop` reads its list without the cancel poll; the poll is back for
/// the prompt code after it: a tool handler in a later round, and the block
/// once the loop returned.
#[test]
fn prompt_code_after_a_tool_loop_round_is_cancelled() {
    let hosts = tempfile::tempdir().expect("tempdir");
    let frontmatter = "models:\n  writer: {}\n";
    let in_handler = "models.use('writer')\nlocal n = 0\ntools.add_local('spin', 'Spin', {}, function()\n  n = n + 1\n  if n == 3 then store.write('marker.txt', 'in') while true do end end\n  return 'ok'\nend)\nmodels.loop(messages.new():user('spin'))\nreturn 'finished'";
    let host = spin_host(hosts.path(), 5);
    cancels_run(
        start(in_handler, frontmatter, Some(&host)),
        "a spinning tool handler",
        "INT",
    );
    let after = "models.use('writer')\ntools.add_local('spin', 'Spin', {}, function() return 'ok' end)\nmodels.loop(messages.new():user('spin'))\nstore.write('marker.txt', 'in')\nwhile true do end";
    let host = spin_host(hosts.path(), 3);
    cancels_run(
        start(after, frontmatter, Some(&host)),
        "a loop after models.loop",
        "TERM",
    );
}
