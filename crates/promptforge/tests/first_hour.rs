#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Issue 46, "the first hour": what a new user trips over, each point through
//! the real binary as a user runs it. Points about a terminal run on a real
//! pseudo-terminal (python3's `pty` module); model servers are real HTTP
//! servers on 127.0.0.1 started here.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_promptforge"));
    c.env_remove("PROMPTFORGE_HOST")
        .env_remove("PROMPTFORGE_LOG")
        .env_remove("PROMPTFORGE_MODEL")
        .env_remove("NO_COLOR");
    c
}

/// A user's world: a data directory and a HOME of its own, so no host file
/// or run log of the machine is seen.
struct World {
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("home")).expect("home");
        World { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path().join(name);
        std::fs::write(&p, text).expect("write a test file");
        p
    }

    fn cmd(&self) -> Command {
        let mut c = bin();
        c.current_dir(self.path())
            .env("PROMPTFORGE_HOME", self.path().join("data"))
            .env("HOME", self.path().join("home"))
            .env_remove("XDG_CONFIG_HOME")
            .env_remove("XDG_DATA_HOME")
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().expect("promptforge")
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.run(args);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{args:?}: no JSON ({e}): {}{}",
                text(&out.stdout),
                text(&out.stderr)
            )
        })
    }

    /// The command on a pseudo-terminal (stdin, stdout and stderr all the
    /// terminal): everything it wrote, and its exit status.
    fn on_pty(&self, args: &[&str], env: &[(&str, &str)]) -> (String, i32) {
        const SPAWN: &str = "import os, pty, sys\n\
            status = pty.spawn(sys.argv[1:])\n\
            sys.exit(os.waitstatus_to_exitcode(status))\n";
        let mut c = Command::new("python3");
        c.arg("-c")
            .arg(SPAWN)
            .arg(env!("CARGO_BIN_EXE_promptforge"))
            .args(args)
            .current_dir(self.path())
            .env_remove("PROMPTFORGE_HOST")
            .env_remove("PROMPTFORGE_LOG")
            .env_remove("PROMPTFORGE_MODEL")
            .env_remove("NO_COLOR")
            .env_remove("XDG_CONFIG_HOME")
            .env("PROMPTFORGE_HOME", self.path().join("data"))
            .env("HOME", self.path().join("home"))
            .env("TERM", "xterm-256color")
            .stdin(Stdio::null());
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().expect("python3 runs the pty");
        (text(&out.stdout), out.status.code().unwrap_or(-1))
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// A model server on 127.0.0.1: each request's body is kept, and `answer`
/// gives the status and JSON body for it (`None`: accept and never answer).
struct ModelServer {
    base: String,
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl ModelServer {
    fn start(answer: impl Fn(&Value) -> Option<(u16, Value)> + Send + 'static) -> ModelServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let base = format!("http://{}/v1", listener.local_addr().expect("addr"));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&bodies);
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = line.split_once(':') {
                        if k.trim().eq_ignore_ascii_case("content-length") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                }
                let mut body = vec![0u8; length];
                let _ = reader.read_exact(&mut body);
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                seen.lock().expect("lock").push(body.clone());
                match answer(&body) {
                    Some((status, reply)) => {
                        let reply = reply.to_string();
                        let head = format!(
                            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            reply.len()
                        );
                        let _ = stream.write_all(head.as_bytes());
                        let _ = stream.write_all(reply.as_bytes());
                    }
                    // Accepted, never answered: kept open until the server goes.
                    None => held.push(stream),
                }
            }
        });
        ModelServer { base, bodies }
    }

    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().expect("lock").clone()
    }
}

fn completion(content: &str) -> Value {
    json!({
        "id": "c1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}]
    })
}

/// A prompt whose one section asks a model through `models.loop`.
const LOOP_PROMPT: &str = "---\nname: asker\ndescription: asks a model\npromptforge: 0\nmodels:\n  writer:\n    description: answers\n---\n\n# Asker\n\n## Ask\n\n```lua\nmodels.use('writer')\nlocal msgs = messages.new():user('Say hi to ' .. args)\nmodels.loop(msgs)\nreturn msgs[#msgs].content\n```\n";

fn http_host(world: &World, base: &str, extra: &str) -> PathBuf {
    world.write(
        "host.toml",
        &format!("[model]\nprovider = \"openai\"\nbase_url = \"{base}\"\nmodel = \"m\"\n{extra}"),
    )
}

/// A port nothing listens on (bound, then let go).
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

// 1. `check` on a colour terminal keeps its colour; text a prompt chose is
// still escaped.
#[test]
fn check_on_a_terminal_is_coloured_and_untrusted_text_stays_escaped() {
    let world = World::new();
    world.write(
        "bad.md",
        "---\nname: bad\ndescription: d\npromptforge: 0\n---\n\n# Bad\n\n## A\n\n```lua\nlocal x = = 1\n```\n",
    );
    let (out, status) = world.on_pty(&["check", "bad.md"], &[]);
    assert_eq!(status, 1, "{out}");
    assert!(out.contains("\x1b[1m\x1b[91merror[Lua]\x1b[0m"), "{out:?}");
    assert!(!out.contains("\\u{1b}"), "colour escaped: {out:?}");

    // A control character in the prompt's own text: no colour, all escaped.
    world.write(
        "hostile.md",
        "---\nname: hostile\ndescription: d\npromptforge: 0\n---\n\n# H\n\n## A\n\n```lua\nlocal x = '\x1b[2J' = 1\n```\n",
    );
    let (out, status) = world.on_pty(&["check", "hostile.md"], &[]);
    assert_eq!(status, 1, "{out}");
    assert!(out.contains("\\u{1b}[2J"), "{out:?}");
    assert!(
        !out.contains('\x1b'),
        "a raw escape reached the terminal: {out:?}"
    );

    // --color never on the same terminal: plain text.
    let (out, _) = world.on_pty(&["--color", "never", "check", "bad.md"], &[]);
    assert!(
        out.contains("error[Lua]") && !out.contains('\x1b'),
        "{out:?}"
    );
}

// 2. `replay` and `run --resume` reproduce runs whose input came from
// `--arg` or stdin: the log keeps the argument string the run received.
#[test]
fn replay_reproduces_runs_given_arg_pairs_or_stdin() {
    let world = World::new();
    let greet = examples().join("greet.md").display().to_string();
    let out = world.run(&["run", &greet, "--arg", "name=Ada"]);
    assert_eq!(
        text(&out.stdout).trim(),
        "Hello, Ada!",
        "{}",
        text(&out.stderr)
    );
    let shown = world.json(&["show", "last", "--json"]);
    assert_eq!(shown["args"], r#"{"name":"Ada"}"#, "{shown}");
    let replayed = world.run(&["replay", "last"]);
    assert_eq!(
        replayed.status.code(),
        Some(0),
        "{}",
        text(&replayed.stderr)
    );
    assert_eq!(text(&replayed.stdout).trim(), "Hello, Ada!");

    let hello = examples().join("hello.md").display().to_string();
    let mut piped = world
        .cmd()
        .args(["run", &hello, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run");
    piped
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"some prose\n")
        .expect("write stdin");
    let out = piped.wait_with_output().expect("run");
    assert_eq!(text(&out.stdout).trim(), "Hello, some prose!");
    let shown = world.json(&["show", "last", "--json"]);
    assert_eq!(shown["args"], "some prose", "{shown}");
    // Stdin is empty now: the replay reads nothing from it.
    let replayed = world.run(&["replay", "last"]);
    assert_eq!(text(&replayed.stdout).trim(), "Hello, some prose!");
    let show_text = text(&world.run(&["show", "last"]).stdout);
    assert!(
        show_text.contains("args      \"some prose\""),
        "{show_text}"
    );
}

// 2 (resume) and 12 (ids): a resumed `--arg` run gets the same argument
// string; a replay has its own id linked to its original, and `runs` marks both.
#[test]
fn a_replay_has_its_own_id_and_runs_marks_replays_and_resumes() {
    let world = World::new();
    world.write(
        "fails.md",
        "---\nname: fails\ndescription: fails on demand\npromptforge: 0\nargs:\n  name:\n    type: string\n    description: who\n---\n\n# Fails\n\n## Only\n\n```lua\nif argv.name == 'boom' then error('boom') end\nreturn 'ok ' .. argv.name\n```\n",
    );
    let first = world.json(&["run", "fails.md", "--arg", "name=Ada", "--json"]);
    assert_eq!(first["outcome"], "completed", "{first}");
    let original = first["execution"].as_str().expect("execution").to_string();
    let replay = world.json(&["replay", &original, "--json"]);
    assert_eq!(replay["result"], "ok Ada", "{replay}");
    let replay_id = replay["execution"].as_str().expect("execution").to_string();
    assert_ne!(replay_id, original);

    // `show ID` names the original, not the newer replay; the replay by its own id.
    let shown = world.json(&["show", &original, "--json"]);
    assert_eq!(shown["execution"], original.as_str());
    assert_eq!(shown["replay_of"], Value::Null);
    let shown = world.json(&["show", &replay_id, "--json"]);
    assert_eq!(shown["replay_of"], original.as_str(), "{shown}");

    let failed = world.json(&["run", "fails.md", "--arg", "name=boom", "--json"]);
    assert_eq!(failed["outcome"], "failed");
    let resumed = world.json(&[
        "run",
        "fails.md",
        "--resume",
        failed["execution"].as_str().expect("id"),
        "--json",
    ]);
    // The resume ran with the logged argument string, so it failed the same way.
    assert_eq!(resumed["outcome"], "failed", "{resumed}");
    assert_eq!(
        world.json(&["show", "last", "--json"])["args"],
        r#"{"name":"boom"}"#
    );

    let listed = world.json(&["runs", "--json"]);
    let runs = listed.as_array().expect("runs");
    assert_eq!(runs.len(), 4, "{listed}");
    assert_eq!(runs[0]["resumed_from"], failed["execution"]);
    assert_eq!(runs[2]["replay_of"], original.as_str());
    let table = text(&world.run(&["runs"]).stdout);
    assert!(
        table.contains("(replay)") && table.contains("(resume)"),
        "{table}"
    );
}

// 3. The `init` scaffold's instruction reaches the model, and editing it
// changes the request.
#[test]
fn the_init_scaffold_sends_its_instruction_and_its_test_passes() {
    let world = World::new();
    let out = world.run(&["init", "demo"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let host = world.path().join("demo.host.toml");
    let mut host_text = std::fs::read_to_string(&host).expect("host");
    host_text.push_str("record = \"requests.jsonl\"\n");
    std::fs::write(&host, host_text).expect("host");

    let request = |world: &World| -> String {
        let _ = std::fs::remove_file(world.path().join("requests.jsonl"));
        let out = world.run(&[
            "run",
            "demo.md",
            "a first request",
            "--host",
            "demo.host.toml",
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let recorded =
            std::fs::read_to_string(world.path().join("requests.jsonl")).expect("recorded");
        let request: Value =
            serde_json::from_str(recorded.lines().next().expect("one request")).expect("json");
        request["messages"].to_string()
    };
    let sent = request(&world);
    assert!(
        sent.contains("Answer the request below in one short paragraph.")
            && sent.contains("Request: a first request"),
        "{sent}"
    );
    let prompt = world.path().join("demo.md");
    let edited = std::fs::read_to_string(&prompt)
        .expect("prompt")
        .replace("one short paragraph.", "three words.");
    std::fs::write(&prompt, edited).expect("edit");
    let sent = request(&world);
    assert!(
        sent.contains("Answer the request below in three words."),
        "{sent}"
    );

    let tested = world.run(&["test", "demo.test.yaml"]);
    assert_eq!(tested.status.code(), Some(0), "{}", text(&tested.stdout));
    // The scaffold's own test notices the mistake it once made: the
    // instruction in the H1 body, where the section's `prose` never sees it.
    let text_now = std::fs::read_to_string(&prompt).expect("prompt");
    let misplaced = text_now
        .replace(
            "## Answer\n\nAnswer the request below in three words.\n",
            "## Answer\n",
        )
        .replace(
            "# Demo\n",
            "# Demo\n\nAnswer the request below in three words.\n",
        );
    assert_ne!(misplaced, text_now);
    std::fs::write(&prompt, misplaced).expect("misplace");
    let tested = world.run(&["test", "demo.test.yaml"]);
    assert_eq!(tested.status.code(), Some(1), "{}", text(&tested.stdout));
    assert!(
        text(&tested.stdout).contains("offered[request 0].messages"),
        "{}",
        text(&tested.stdout)
    );

    // `init triage.md` suggests `init triage`.
    let out = world.run(&["init", "triage.md"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("promptforge init triage"),
        "{}",
        text(&out.stderr)
    );
    assert!(!world.path().join("triage.md").exists());
}

// 4. Streaming can be turned off, and a server that refuses streaming still
// answers on a terminal.
#[test]
fn streaming_is_off_on_request_and_a_refused_stream_goes_again_whole() {
    let world = World::new();
    let refusing = ModelServer::start(|body| {
        Some(if body["stream"] == true {
            (
                400,
                json!({"error": {"message": "stream is not supported"}}),
            )
        } else {
            (200, completion("hi Ada"))
        })
    });
    let host = http_host(&world, &refusing.base, "");
    world.write("asker.md", LOOP_PROMPT);
    let host_arg = host.display().to_string();
    let (out, status) = world.on_pty(&["run", "asker.md", "Ada", "--host", &host_arg], &[]);
    assert_eq!(status, 0, "{out}");
    assert!(out.contains("hi Ada"), "{out}");
    let streamed: Vec<bool> = refusing
        .bodies()
        .iter()
        .map(|b| b["stream"] == true)
        .collect();
    assert_eq!(streamed, [true, false], "asked streamed, then whole");

    // --no-stream: one plain request, on a terminal too.
    let plain = ModelServer::start(|_| Some((200, completion("hi Ada"))));
    let host = http_host(&world, &plain.base, "");
    let host_arg = host.display().to_string();
    let (out, status) = world.on_pty(
        &["run", "asker.md", "Ada", "--host", &host_arg, "--no-stream"],
        &[],
    );
    assert_eq!(status, 0, "{out}");
    assert!(
        plain.bodies().iter().all(|b| b.get("stream").is_none()),
        "{:?}",
        plain.bodies()
    );

    // `stream = false` in the host file does the same.
    let keyed = ModelServer::start(|_| Some((200, completion("hi Ada"))));
    let host = world.write(
        "host-nostream.toml",
        &format!(
            "stream = false\n[model]\nprovider = \"openai\"\nbase_url = \"{}\"\nmodel = \"m\"\n",
            keyed.base
        ),
    );
    let host_arg = host.display().to_string();
    let (out, status) = world.on_pty(&["run", "asker.md", "Ada", "--host", &host_arg], &[]);
    assert_eq!(status, 0, "{out}");
    assert_eq!(keyed.bodies().len(), 1);
    assert!(
        keyed.bodies()[0].get("stream").is_none(),
        "{:?}",
        keyed.bodies()
    );
}

// 5. A failure keeps its cause: the URL and reason of a refused connection,
// the server's message for a 500, in --json, --quiet, the log and `show`.
#[test]
fn failures_keep_their_cause_in_reports_and_the_log() {
    let world = World::new();
    world.write("asker.md", LOOP_PROMPT);
    let port = closed_port();
    let host = http_host(&world, &format!("http://127.0.0.1:{port}/v1"), "");
    let host_arg = host.display().to_string();
    let report = world.json(&["run", "asker.md", "Ada", "--host", &host_arg, "--json"]);
    let message = report["error"]["message"]
        .as_str()
        .expect("message")
        .to_string();
    assert!(message.starts_with("http transport failure: "), "{report}");
    assert!(
        message.contains(&format!("http://127.0.0.1:{port}/v1/chat/completions")),
        "{message}"
    );
    assert!(message.to_lowercase().contains("refused"), "{message}");
    let shown = world.json(&["show", "last", "--json"]);
    assert_eq!(shown["error"]["message"], message.as_str());
    let show_text = text(&world.run(&["show", "last"]).stdout);
    assert!(
        show_text.contains(&format!("127.0.0.1:{port}")),
        "{show_text}"
    );

    let broken = ModelServer::start(|_| {
        Some((
            500,
            json!({"error": {"message": "model \"m\" is not loaded"}}),
        ))
    });
    let host = http_host(&world, &broken.base, "");
    let host_arg = host.display().to_string();
    let out = world.run(&["run", "asker.md", "Ada", "--host", &host_arg, "--quiet"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("non-success backend status 500: model \"m\" is not loaded"),
        "{}",
        text(&out.stderr)
    );
    let shown = world.json(&["show", "last", "--json"]);
    assert_eq!(
        shown["error"]["message"],
        "non-success backend status 500: model \"m\" is not loaded"
    );
}

// 7. A declared input named like the prompt is not copied as its own input.
#[test]
fn an_input_file_named_like_the_prompt_is_not_copied_into_the_store() {
    let world = World::new();
    world.write(
        "journal.md",
        "---\nname: journal\ndescription: reads its input\npromptforge: 0\ninput:\n  path: journal.md\n  description: the journal\n---\n\n# Journal\n\n## Read\n\n```lua\nlocal ok, text = pcall(store.read, 'journal.md')\nreturn ok and 'read' or 'no input'\n```\n",
    );
    let store = world.path().join("store");
    let out = world.run(&["run", "journal.md", "--store", "store"]);
    assert_eq!(
        text(&out.stdout).trim(),
        "no input",
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("is the prompt file itself; not copied"),
        "{}",
        text(&out.stderr)
    );
    assert!(!store.join("journal.md").exists());
}

// 8. No host file: the failure says none was found and where it looked.
#[test]
fn a_model_prompt_without_a_host_file_says_where_one_was_looked_for() {
    let world = World::new();
    world.write("asker.md", LOOP_PROMPT);
    let out = world.run(&["run", "asker.md", "Ada"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("no host file was found"), "{stderr}");
    let looked = world.path().join("home/.config/promptforge/host.toml");
    assert!(stderr.contains(&looked.display().to_string()), "{stderr}");
    assert!(stderr.contains("$PROMPTFORGE_HOST"), "{stderr}");
}

// 9. A closed stdout ends `runs` and `show` quietly with 0.
#[test]
fn runs_and_show_into_a_closed_pipe_exit_zero() {
    let world = World::new();
    let hello = examples().join("hello.md").display().to_string();
    for _ in 0..3 {
        world.run(&["run", &hello, "x"]);
    }
    for args in [
        &["runs"][..],
        &["show", "last"][..],
        &["runs", "--json"][..],
    ] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        // Nobody reads: the first write meets a closed pipe.
        drop(reader);
        let out = world
            .cmd()
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .expect("run");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(out.stderr.is_empty(), "{args:?}: {}", text(&out.stderr));
    }
}

// 10. A number under a text matcher: taken as its text when whole, and a
// decimal refused at its own line with the fix.
#[test]
fn test_file_scalars_are_text_or_a_located_error() {
    let world = World::new();
    world.write(
        "price.md",
        "---\nname: price\ndescription: a price\npromptforge: 0\n---\n\n# Price\n\n## Only\n\n```lua\nreturn 'total 29.90, 3 items'\n```\n",
    );
    world.write(
        "price.test.yaml",
        "cases:\n  - name: whole numbers are text\n    expect:\n      result:\n        contains: [3, total]\n        not_contains: 42\n",
    );
    let out = world.run(&["test", "price.test.yaml"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    world.write(
        "price.test.yaml",
        "cases:\n  - name: a decimal\n    expect:\n      result:\n        contains: 29.90\n",
    );
    let out = world.run(&["test", "price.test.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(said.contains("price.test.yaml:5"), "{said}");
    assert!(said.contains("quote it"), "{said}");
    assert!(!said.contains("untagged enum"), "{said}");
}

// 11. A failed tool call shows on a terminal; the research example says
// what it needs and sends its instruction.
#[test]
fn a_failed_tool_call_is_visible_on_a_terminal() {
    let world = World::new();
    let research = examples().join("research.md").display().to_string();
    let host = examples().join("research.host.toml").display().to_string();
    let (out, _) = world.on_pty(
        &["run", &research, "why do tides happen", "--host", &host],
        &[],
    );
    // The mark in red, then the alias, then the reason the model was given.
    assert!(
        out.contains("\x1b[1;31m✗\x1b[0m search failed\r\n"),
        "{out:?}"
    );
    assert!(out.contains("    web_search: request failed"), "{out}");
    assert!(out.contains("✗\x1b[0m fetch failed"), "{out:?}");
    let host_text =
        std::fs::read_to_string(examples().join("research.host.toml")).expect("host file");
    assert!(host_text.contains("promptforge test examples/research.test.yaml"));
}

// 12. `--color never` reaches log lines; an empty filtered list says so;
// `check` on a folder without prompts says so; `check --help` names stdout.
#[test]
fn small_first_hour_messages() {
    let world = World::new();
    world.write("asker.md", LOOP_PROMPT);
    let host = http_host(
        &world,
        &format!("http://127.0.0.1:{}/v1", closed_port()),
        "",
    );
    let host_arg = host.display().to_string();
    let (out, _) = world.on_pty(
        &["run", "asker.md", "Ada", "--host", &host_arg],
        &[("PROMPTFORGE_LOG", "warn")],
    );
    assert!(out.contains("WARN"), "{out}");
    assert!(
        out.contains("\x1b[33m WARN"),
        "auto colour on a terminal: {out:?}"
    );
    // The log line is written above the spinner: its line holds nothing else.
    for (at, _) in out.match_indices("WARN") {
        let line_start = out[..at].rfind(['\r', '\n']).map_or(0, |i| i + 1);
        let before = &out[line_start..at];
        assert!(
            !before.contains("Ask") && !before.contains("preparing"),
            "a log line on the spinner's line: {before:?}"
        );
    }
    let (out, _) = world.on_pty(
        &[
            "--color", "never", "run", "asker.md", "Ada", "--host", &host_arg,
        ],
        &[("PROMPTFORGE_LOG", "warn")],
    );
    assert!(out.contains("WARN"), "{out}");
    // The spinner clears its line (`ESC[2K`); nothing else is an escape.
    assert!(
        !out.replace("\x1b[2K", "").contains('\x1b'),
        "--color never: {out:?}"
    );

    let out = world.run(&["runs", "--outcome", "cancelled"]);
    assert_eq!(
        text(&out.stderr).trim(),
        "no logged run matches --outcome cancelled"
    );

    std::fs::create_dir_all(world.path().join("notes")).expect("mkdir");
    world.write("notes/readme.md", "# Not a prompt\n");
    let out = world.run(&["check", "notes"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("no prompt files in notes"),
        "{}",
        text(&out.stderr)
    );

    let help = text(&world.run(&["check", "--help"]).stdout);
    assert!(help.contains("rich when stdout is a terminal"), "{help}");
}

// 13. A catalog timeout bounds a server that never answers; a missing key
// is found before the run, naming the model and the host file.
#[test]
fn a_catalog_timeout_ends_a_silent_server_and_a_missing_key_stops_before_the_run() {
    let world = World::new();
    world.write("asker.md", LOOP_PROMPT);
    let silent = ModelServer::start(|_| None);
    let host = http_host(&world, &silent.base, "timeout = 1\n");
    let host_arg = host.display().to_string();
    let report = world.json(&["run", "asker.md", "Ada", "--host", &host_arg, "--json"]);
    assert_eq!(
        report["error"]["message"]
            .as_str()
            .map(|m| m.starts_with("http transport failure: no response within 1 s")),
        Some(true),
        "{report}"
    );

    let host = http_host(&world, &silent.base, "timeout = 0\n");
    let out = world.run(&[
        "run",
        "asker.md",
        "Ada",
        "--host",
        &host.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("`timeout` must be a positive number of seconds"),
        "{}",
        text(&out.stderr)
    );

    let counted = ModelServer::start(|_| Some((200, completion("hi"))));
    let host = http_host(
        &world,
        &counted.base,
        "api_key_env = \"PF_FIRST_HOUR_UNSET_KEY\"\n",
    );
    let host_arg = host.display().to_string();
    let out = world
        .cmd()
        .args(["run", "asker.md", "Ada", "--host", &host_arg])
        .env_remove("PF_FIRST_HOUR_UNSET_KEY")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("model \"m\" reads its API key from $PF_FIRST_HOUR_UNSET_KEY"),
        "{stderr}"
    );
    assert!(stderr.contains(&host_arg), "{stderr}");
    assert!(counted.bodies().is_empty(), "no request was sent");
}

// 14. The README's commands work as written, with `promptforge` on PATH as
// its set-up puts it there (`cargo install` itself and `./test.sh` are not
// run here; an example run id like `3f2a` stands for one of the reader's).
#[test]
fn the_readme_commands_work_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    assert!(readme.contains("cargo install --path crates/promptforge"));
    assert!(readme.contains("apt-get") && readme.contains("850 MB") && readme.contains("mdbook"));
    let world = World::new();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_promptforge"))
        .parent()
        .expect("bin dir")
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let store = world.path().join("notes-store").display().to_string();
    let mut commands = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in readme.lines() {
        if line.trim_start().starts_with("```") {
            in_sh = !in_sh && line.trim() == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let code = line.split(" #").next().unwrap_or(line).trim_end();
        if let Some(head) = code.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(code);
        let command = std::mem::take(&mut pending).trim().to_string();
        let user_command = command.starts_with("promptforge ") || command.starts_with("cat ");
        if user_command && !command.contains("3f2a") {
            commands.push(command.replace("/tmp/notes-store", &store));
        }
    }
    assert!(commands.len() >= 5, "{commands:?}");
    for command in &commands {
        let out = Command::new("sh")
            .arg("-c")
            .arg(command)
            .current_dir(&root)
            .env("PATH", &path)
            .env("PROMPTFORGE_HOME", world.path().join("data"))
            .env("HOME", world.path().join("home"))
            .env_remove("PROMPTFORGE_HOST")
            .env_remove("XDG_CONFIG_HOME")
            .stdin(Stdio::null())
            .output()
            .expect("sh");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{command}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
}

// 12 (spinner): an operator question gets a line of its own: the spinner is
// cleared before it and not redrawn while the operator types.
#[test]
fn the_spinner_clears_for_an_operator_question() {
    let world = World::new();
    world.write(
        "ask.md",
        "---\nname: ask\ndescription: asks the operator\npromptforge: 0\n---\n\n# Ask\n\n## Question\n\n```lua\nlocal name = input.ask('Your name?')\nreturn 'hi ' .. tostring(name)\n```\n",
    );
    const SPAWN: &str = "import os, pty, sys, time\n\
        pid, fd = pty.fork()\n\
        if pid == 0:\n\
        \x20   os.execv(sys.argv[1], sys.argv[1:])\n\
        out = b''\n\
        answered = False\n\
        while True:\n\
        \x20   try:\n\
        \x20       chunk = os.read(fd, 4096)\n\
        \x20   except OSError:\n\
        \x20       break\n\
        \x20   if not chunk:\n\
        \x20       break\n\
        \x20   out += chunk\n\
        \x20   if not answered and b'> ' in out:\n\
        \x20       time.sleep(0.5)\n\
        \x20       os.write(fd, b'Ada\\n')\n\
        \x20       answered = True\n\
        sys.stdout.buffer.write(out)\n\
        sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n";
    let out = Command::new("python3")
        .arg("-c")
        .arg(SPAWN)
        .arg(env!("CARGO_BIN_EXE_promptforge"))
        .args(["run", "ask.md"])
        .current_dir(world.path())
        .env_remove("PROMPTFORGE_HOST")
        .env_remove("NO_COLOR")
        .env("PROMPTFORGE_HOME", world.path().join("data"))
        .env("HOME", world.path().join("home"))
        .env("TERM", "xterm-256color")
        .output()
        .expect("python3");
    let out = text(&out.stdout);
    let asked = out.find("Your name?").expect("the question was asked");
    let line_start = out[..asked].rfind(['\r', '\n']).map_or(0, |i| i + 1);
    let before = &out[line_start..asked];
    assert!(
        !before.contains("Question") && !before.contains("preparing"),
        "the question shares the spinner's line: {out:?}"
    );
    let answered = out[asked..].find("Ada").map(|i| asked + i).expect("echo");
    // Half a second of waiting for the answer: several spinner ticks, none drawn.
    assert!(
        !out[asked..answered].contains("Question"),
        "the spinner was redrawn over the question: {out:?}"
    );
    assert!(out.contains("hi Ada"), "{out:?}");
}

// 12 (`test --update`): an `events: {}` filled from a run lists what the
// prompt did, not the engine's routine boundaries.
#[test]
fn test_update_fills_events_without_routine_boundaries() {
    let world = World::new();
    world.write(
        "note.md",
        "---\nname: note\ndescription: writes a note\npromptforge: 0\n---\n\n# Note\n\n## Write\n\n```lua\nstore.write('note.md', 'tide')\nreturn 'saved'\n```\n",
    );
    world.write(
        "note.test.yaml",
        "cases:\n  - name: saves\n    expect:\n      result: saved\n      events: {}\n",
    );
    let out = world.run(&["test", "--update", "note.test.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let updated = std::fs::read_to_string(world.path().join("note.test.yaml")).expect("file");
    assert!(updated.contains("store_write_succeeded: 1"), "{updated}");
    assert!(updated.contains("run_succeeded: 1"), "{updated}");
    for routine in [
        "section_started",
        "lua_chunk_started",
        "parse_succeeded",
        "lua_teardown",
    ] {
        assert!(!updated.contains(routine), "{routine} in {updated}");
    }
    let out = world.run(&["test", "note.test.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

// 6. A Lua error in a local tool's handler names the handler's line, once,
// and says that it ends the loop.
#[test]
fn a_handler_error_names_the_handlers_line_once() {
    let world = World::new();
    world.write(
        "tooly.md",
        "---\nname: tooly\ndescription: a failing handler\npromptforge: 0\nmodels:\n  agent:\n    description: a\n---\n\n# Tooly\n\n## Ask\n\n```lua\nmodels.use('agent')\ntools.add_local('lookup', 'Look up', { number = 'string' }, function(a)\n  local t = nil\n  return t.field\nend)\nlocal msgs = messages.new():user('q')\nmodels.loop(msgs)\nreturn msgs[#msgs].content\n```\n",
    );
    world.write(
        "tooly.replies.json",
        r#"[{"tool_calls": [{"name": "lookup", "arguments": {"number": "7"}}]}, "done"]"#,
    );
    world.write(
        "tooly.host.toml",
        "[model]\nprovider = \"script\"\nreplies = \"tooly.replies.json\"\n",
    );
    let report = world.json(&["run", "tooly.md", "--host", "tooly.host.toml", "--json"]);
    let message = report["error"]["message"].as_str().expect("message");
    assert_eq!(report["error"]["kind"], "Lua", "{report}");
    assert_eq!(report["error"]["line"], 18, "{report}");
    assert!(
        message.contains("local tool `lookup` raised an error, which ends models.loop"),
        "{message}"
    );
    assert_eq!(message.matches("[string").count(), 1, "{message}");
    assert!(
        message.ends_with(":18: attempt to index a nil value (local 't')"),
        "{message}"
    );
    let out = world.run(&["run", "tooly.md", "--host", "tooly.host.toml"]);
    assert!(
        text(&out.stderr).contains("tooly.md:18"),
        "{}",
        text(&out.stderr)
    );
}
