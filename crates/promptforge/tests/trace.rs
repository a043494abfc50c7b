#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Seeing a run (issue 18) through the real binary: `show --html` pages for
//! runs with model rounds, tool calls, tasks, fanout, operator input, a
//! failure and a large history, loaded in a real headless Chromium; and
//! `run --otlp` received by a real collector (Arize Phoenix) and read back.
//!
//! Chromium and Phoenix come from `tests/tools/setup.sh` (test.sh runs it;
//! these tests run it too when a tool is missing, and fail loudly if it
//! cannot install). `PROMPTFORGE_PHOENIX` may name an installed `phoenix`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_promptforge"))
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write a test file");
    p
}

/// A run's world: its own data directory, prompt and host file.
struct World {
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        World {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn cmd(&self) -> Command {
        let mut c = bin();
        c.env("PROMPTFORGE_HOME", self.path().join("home"))
            .env_remove("PROMPTFORGE_HOST")
            .env_remove("OTEL_EXPORTER_OTLP_HEADERS")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
            .stdin(Stdio::null());
        c
    }

    /// Run `prompt` with scripted `replies` (and extra host-file text).
    fn run(&self, prompt: &str, replies: &str, host_extra: &str, args: &[&str]) -> Output {
        let p = write(self.path(), "prompt.md", prompt);
        write(self.path(), "replies.json", replies);
        let host = write(
            self.path(),
            "host.toml",
            &format!(
                "[model]\nprovider = \"script\"\nmodel = \"scripted-7b\"\nreplies = \"replies.json\"\n\
                 [web]\nallow_loopback = true\n[input]\nanswers = [\"<b>go</b> ahead\"]\n{host_extra}"
            ),
        );
        self.cmd()
            .arg("run")
            .arg(&p)
            .arg("--host")
            .arg(&host)
            .args(["--seed", "11"])
            .args(args)
            .output()
            .expect("run the binary")
    }

    fn page(&self) -> (PathBuf, String) {
        let page = self.path().join("page.html");
        let out = self
            .cmd()
            .args(["show", "last", "--html", "--output"])
            .arg(&page)
            .output()
            .expect("show --html");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let html = std::fs::read_to_string(&page).expect("the page was written");
        (page, html)
    }
}

/// A loopback web server answering every request with `body`.
fn serve(body: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            answer(stream, body);
        }
    });
    format!("http://{addr}")
}

fn answer(mut stream: TcpStream, body: &str) {
    let mut buf = [0u8; 4096];
    let _ = stream.read(&mut buf);
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

const HOSTILE: &str = "</pre></details><script>document.body.setAttribute('data-pwned','1')</script><img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">";

const BUSY_PROMPT: &str = r#"---
name: busy
description: Rounds, a tool, tasks, a fanout and the operator
promptforge: 0
plugins:
  - promptforge/web
tools:
  grab: promptforge/web/fetch
models:
  writer: {}
---

# Busy

```lua
models.default('writer')
```

## Gather

```lua
log('gathering')
tools.add(grab)
local m = messages.new():user('Read the page and report')
models.loop(m)
store.write('notes.md', 'n')
var.said = models.infer('Summarize')
var.answer = input.ask('Proceed?')
```

## Spread

```lua
log('spreading')
local t = tasks.spawn('### Side')
fanout('### Arm', { 'a', 'b', 'c' })
tasks.when_any({ t })
return var.said .. ' / ' .. var.answer
```

### Arm

```lua
store.write('arm_' .. item .. '.txt', item)
return item
```

### Side

```lua
store.write('side.txt', 's')
return 'side'
```
"#;

fn busy_replies(web: &str) -> String {
    serde_json::json!([
        {"tool_calls": [{"name": "grab", "arguments": {"url": format!("{web}/page.txt")}}],
         "usage": {"input_tokens": 21, "output_tokens": 4}},
        {"content": HOSTILE, "usage": {"input_tokens": 40, "output_tokens": 9}},
        {"content": "all fine", "usage": {"input_tokens": 12, "output_tokens": 2}}
    ])
    .to_string()
}

// ---------------------------------------------------------------------------
// The browser
// ---------------------------------------------------------------------------

fn tools_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("test-tools")
}

fn setup(tool: &str) {
    static ONCE: Mutex<()> = Mutex::new(());
    let _guard = ONCE.lock().unwrap_or_else(|p| p.into_inner());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/setup.sh");
    let status = Command::new("bash")
        .arg(&script)
        .arg(tool)
        .arg(tools_dir())
        .status()
        .expect("run tests/tools/setup.sh");
    assert!(
        status.success(),
        "tests/tools/setup.sh {tool} failed: the trace tests need it (see test.sh)"
    );
}

/// What a headless Chromium made of a page.
struct Browsed {
    png: PathBuf,
    log: String,
    dom: String,
}

/// Screenshot the page from its top, and dump its DOM as loaded with
/// `fragment` (headless screenshots of a page scrolled far down come out
/// blank, so the fragment is checked in the DOM only).
fn browse(page: &Path, fragment: &str) -> Browsed {
    setup("chromium");
    let dir = page.parent().expect("page folder");
    let url = format!("file://{}", page.display());
    let common = |profile: &str| {
        let mut c = Command::new("chromium");
        c.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", dir.join(profile).display()))
        .stdin(Stdio::null());
        c
    };
    let png = dir.join("shot.png");
    let shot = common("profile-shot")
        .args(["--enable-logging=stderr", "--v=0", "--window-size=1200,900"])
        .arg(format!("--screenshot={}", png.display()))
        .arg(&url)
        .output()
        .expect("run chromium");
    assert!(shot.status.success(), "chromium --screenshot failed");
    let dom = common("profile-dom")
        .args(["--enable-logging=stderr", "--v=0", "--dump-dom"])
        .arg(format!("{url}{fragment}"))
        .output()
        .expect("run chromium");
    assert!(dom.status.success(), "chromium --dump-dom failed");
    let mut log = String::from_utf8_lossy(&shot.stderr).into_owned();
    log.push_str(&String::from_utf8_lossy(&dom.stderr));
    Browsed {
        png,
        log,
        dom: String::from_utf8_lossy(&dom.stdout).into_owned(),
    }
}

/// The page loaded clean: our script ran, no script error or refused
/// resource, nothing hostile ran, and the screenshot shows a drawn page.
fn assert_page_works(b: &Browsed) {
    assert!(
        b.dom.contains("data-ready=\"1\""),
        "the page's script did not run"
    );
    for bad in ["Uncaught", "Refused to", "SyntaxError", "ReferenceError"] {
        assert!(!b.log.contains(bad), "console trouble ({bad}):\n{}", b.log);
    }
    assert!(
        !b.dom.contains("data-pwned=\"1\""),
        "logged text ran as script"
    );
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(&b.png).expect("screenshot written"),
    ));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut buf = vec![0; reader.output_buffer_size().expect("buffer size")];
    let info = reader.next_frame(&mut buf).expect("a frame");
    assert_eq!((info.width, info.height), (1200, 900));
    let step = info.color_type.samples();
    let pixels: Vec<&[u8]> = buf[..info.buffer_size()].chunks(step).collect();
    let background = pixels[0];
    let drawn = pixels.iter().filter(|p| p[..3] != background[..3]).count();
    let mut colors: Vec<[u8; 3]> = pixels.iter().map(|p| [p[0], p[1], p[2]]).collect();
    colors.sort_unstable();
    colors.dedup();
    assert!(
        drawn * 50 > pixels.len() && colors.len() > 16,
        "the screenshot is blank: {drawn} drawn pixels, {} colors",
        colors.len()
    );
}

/// The `<details>` start tag with this id, from a DOM dump.
fn tag_with_id<'a>(dom: &'a str, id: &str) -> &'a str {
    let needle = format!("id=\"{id}\"");
    let at = dom.find(&needle).unwrap_or_else(|| panic!("no {id}"));
    let start = dom[..at].rfind('<').unwrap_or(0);
    let end = at + dom[at..].find('>').unwrap_or(0);
    &dom[start..=end]
}

#[test]
fn a_busy_run_pages_rounds_tools_tasks_and_marks_untrusted_text() {
    let world = World::new();
    let web = serve("Page text with <b>markup</b> & a [INST] marker");
    let out = world.run(BUSY_PROMPT, &busy_replies(&web), "", &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (page, html) = world.page();
    // One self-contained document: nothing fetched, one script of its own.
    assert!(html.starts_with("<!DOCTYPE html>"));
    for external in ["<link", "src=\"http", "src=\"//", "@import", "url(http"] {
        assert!(!html.contains(external), "external resource: {external}");
    }
    assert_eq!(
        html.matches("<script").count(),
        1,
        "only the page's own script"
    );
    // The hostile reply is text, wherever it shows.
    assert!(!html.contains("<img src=x"));
    assert!(html.contains("&lt;script&gt;document.body.setAttribute"));
    // Rounds with their messages and replies, the tool call and its trust.
    assert!(html.contains("model round"), "rounds");
    assert!(html.contains("Messages sent"));
    assert!(html.contains("Read the page and report"));
    assert!(html.contains("21 in / 4 out tokens"));
    assert!(html.contains("tool call"), "the bound tool call");
    assert!(html.contains("promptforge/web/fetch"));
    assert!(html.contains("<span class=\"trust untrusted\">untrusted</span>"));
    assert!(
        html.contains(
            "<div class=\"envelope\"><div class=\"env-label\">untrusted · untrusted_input_"
        ),
        "the envelope drawn as such"
    );
    assert!(html.contains("Page text with &lt;b&gt;markup&lt;/b&gt;"));
    // Store, log, operator input.
    assert!(html.contains("<span class=\"tag\">store</span>"));
    assert!(html.contains("gathering"));
    assert!(html.contains("Proceed?"));
    assert!(html.contains("&lt;b&gt;go&lt;/b&gt; ahead"));
    // One lane per task: the main walk, the spawned task and three arms.
    let lanes = html.matches("class=\"lane-name\"").count();
    assert_eq!(lanes, 5, "lanes");
    for task in ["0.0", "0.1", "0.2", "0.3"] {
        assert!(
            html.contains(&format!("data-lane=\"{task}\"")),
            "lane {task}"
        );
    }
    assert!(html.contains("badge completed"));

    let browsed = browse(&page, "");
    assert_page_works(&browsed);
}

const FAILING_PROMPT: &str = r#"---
name: failing
description: Fails in its second section
promptforge: 0
---

# Failing

## Prepare

```lua
store.write('a.txt', 'a')
```

## Boom

```lua
log('about to fail')
fanout('### Arm', { 1, 2 })
error('the <b>widget</b> broke')
```

### Arm

```lua
return item
```
"#;

#[test]
fn a_failed_run_pages_the_failure_and_where_it_happened() {
    let world = World::new();
    let out = world.run(FAILING_PROMPT, "[]", "", &[]);
    assert_eq!(out.status.code(), Some(1));
    let (page, html) = world.page();
    assert!(html.contains("badge failed"));
    let failure = &html[html.find("id=\"failure\"").expect("a failure box")..];
    let failure = &failure[..failure.find("</section>").expect("its end")];
    assert!(failure.contains("Failed: Lua"), "{failure}");
    assert!(
        failure.contains("the &lt;b&gt;widget&lt;/b&gt; broke"),
        "{failure}"
    );
    assert!(failure.contains("<b>Boom</b>"), "where: {failure}");
    assert!(
        html.contains("class=\"block failing\""),
        "the failing entry is marked"
    );
    let browsed = browse(&page, "");
    assert_page_works(&browsed);
}

#[test]
fn a_large_history_pages_collapsed_with_a_filter_and_links_that_open() {
    let world = World::new();
    let prompt = r#"---
name: large
description: Many store operations in a few sections
promptforge: 0
---

# Large

## First

```lua
for i = 1, 600 do store.write('f' .. i .. '.txt', 'x') end
```

## Second

```lua
for i = 1, 600 do store.append('s.txt', 'y') end
log('done')
return 'ok'
```
"#;
    let out = world.run(prompt, "[]", "", &[]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (page, html) = world.page();
    let items = html.matches("<li class=\"item").count();
    assert!(items >= 1200, "{items} entries");
    assert!(html.contains("id=\"filter\""));
    // Above a few hundred entries the sections start collapsed.
    let entries: Vec<&str> = html
        .match_indices("<details class=\"block\" id=")
        .map(|(at, _)| &html[at..at + html[at..].find('>').unwrap_or(0)])
        .collect();
    assert!(entries.len() >= 2, "{entries:?}");
    assert!(
        entries.iter().all(|tag| !tag.contains(" open")),
        "{entries:?}"
    );
    // A link to an entry opens its section (the script ran on load).
    let item = html
        .find("id=\"i1100\"")
        .map(|_| "i1100")
        .expect("entry 1100");
    let browsed = browse(&page, &format!("#{item}"));
    assert_page_works(&browsed);
    let second = browsed
        .dom
        .rfind("<details class=\"block\"")
        .expect("the second section");
    let tag = &browsed.dom[second..second + browsed.dom[second..].find('>').unwrap_or(0)];
    assert!(
        tag.contains("open"),
        "the linked entry's section opened: {tag}"
    );
    let first = tag_with_id(&browsed.dom, "s0");
    assert!(
        !first.contains("open"),
        "other sections stay collapsed: {first}"
    );
}

#[test]
fn show_open_writes_the_page_and_survives_a_missing_opener() {
    let world = World::new();
    let out = world.run(FAILING_PROMPT, "[]", "", &[]);
    assert_eq!(out.status.code(), Some(1));
    // An opener that notes what it was asked to open.
    let fake = world.path().join("fakebin");
    std::fs::create_dir_all(&fake).expect("mkdir");
    let noted = world.path().join("opened.txt");
    let opener = write(
        &fake,
        "xdg-open",
        &format!("#!/bin/sh\necho \"$1\" > '{}'\n", noted.display()),
    );
    let mut perms = std::fs::metadata(&opener).expect("meta").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&opener, perms).expect("chmod");
    let out = world
        .cmd()
        .args(["show", "last", "--open"])
        .env("PATH", &fake)
        .output()
        .expect("show --open");
    assert_eq!(out.status.code(), Some(0));
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(printed.ends_with(".html"), "{printed}");
    assert!(
        printed.contains("/home/pages/"),
        "into the data directory: {printed}"
    );
    let html = std::fs::read_to_string(&printed).expect("the page");
    assert!(html.contains("badge failed"));
    assert_eq!(
        std::fs::read_to_string(&noted)
            .expect("the opener ran")
            .trim(),
        printed
    );
    // No opener at all: the page is still written, with a warning.
    let empty = world.path().join("emptybin");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let target = world.path().join("elsewhere.html");
    let out = world
        .cmd()
        .args(["show", "last", "--open", "-o"])
        .arg(&target)
        .env("PATH", &empty)
        .output()
        .expect("show --open");
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in a browser"));
    assert!(target.is_file());
    // --html and --json exclude each other (a usage error).
    let out = world
        .cmd()
        .args(["show", "last", "--html", "--json"])
        .output()
        .expect("show");
    assert_eq!(out.status.code(), Some(2));
}

/// Every event a busy run logged (rounds with capture, reasoning, tool calls,
/// a fanout, a spawned task, operator input, store operations) reads back
/// from the run log as its typed variant, and the typed event writes the
/// very bytes the log holds: `show --json`'s fields are the logged line's.
#[test]
fn every_logged_event_reads_back_typed_and_writes_its_logged_bytes() {
    let world = World::new();
    let web = serve("Page text");
    let out = world.run(BUSY_PROMPT, &busy_replies(&web), "", &["--capture"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = world
        .cmd()
        .args(["show", "last", "--json"])
        .output()
        .expect("show --json");
    let shown: Value = serde_json::from_slice(&shown.stdout).expect("show --json is JSON");
    let events = shown["events"].as_array().expect("events");
    let mut kinds = std::collections::BTreeSet::new();
    for line in events {
        let kind = line["kind"].as_str().expect("kind").to_string();
        // The line past its coordinates, in order.
        let fields: serde_json::Map<String, Value> = line
            .as_object()
            .expect("an event is an object")
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "kind" | "execution" | "section" | "provenance"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let logged = Value::Object(fields.clone());
        let typed = match pf_engine::LoggedEvent::parse(&kind, &logged) {
            pf_engine::LoggedEvent::Typed(event) => event,
            other => panic!("{kind} did not read back typed: {other:?}"),
        };
        assert_eq!(typed.kind().as_str(), kind);
        let bytes = (!fields.is_empty()).then(|| serde_json::to_string(&fields).expect("json"));
        assert_eq!(typed.fields_text(), bytes, "{kind}");
        kinds.insert(kind);
    }
    for kind in [
        "request",
        "response",
        "assistant_tool_calls",
        "tool_result",
        "assistant_reply",
        "lua",
        "user_input",
        "task_started",
        "task_succeeded",
        "store_write_succeeded",
    ] {
        assert!(kinds.contains(kind), "{kind} not logged: {kinds:?}");
    }
}

// ---------------------------------------------------------------------------
// OpenTelemetry
// ---------------------------------------------------------------------------

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A Phoenix server for one test, stopped when dropped.
struct Phoenix {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn phoenix_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("PROMPTFORGE_PHOENIX") {
        return PathBuf::from(path);
    }
    setup("phoenix");
    tools_dir().join("phoenix/bin/phoenix")
}

fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\naccept: application/json\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

fn start_phoenix() -> Phoenix {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let child = Command::new(phoenix_bin())
        .arg("serve")
        .env("PHOENIX_WORKING_DIR", dir.path())
        .env("PHOENIX_HOST", "127.0.0.1")
        .env("PHOENIX_PORT", port.to_string())
        .env("PHOENIX_GRPC_PORT", free_port().to_string())
        .env("PHOENIX_TELEMETRY_ENABLED", "false")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start phoenix");
    let phoenix = Phoenix {
        child,
        port,
        _dir: dir,
    };
    // Start-up takes tens of seconds; the cap only stops a hung server.
    let deadline = Instant::now() + Duration::from_secs(300);
    while http_get(port, "/healthz").is_none_or(|(s, _)| s != 200) {
        assert!(Instant::now() < deadline, "Phoenix did not come up");
        std::thread::sleep(Duration::from_millis(500));
    }
    phoenix
}

/// The spans Phoenix holds, once `count` have arrived (it ingests in the background).
fn phoenix_spans(phoenix: &Phoenix, count: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some((200, body)) =
            http_get(phoenix.port, "/v1/projects/default/spans/otlpv1?limit=1000")
        {
            let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            let spans = v["data"].as_array().cloned().unwrap_or_default();
            if spans.len() >= count {
                return spans;
            }
        }
        assert!(Instant::now() < deadline, "the spans never arrived");
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    let value = span["attributes"]
        .as_array()?
        .iter()
        .find(|kv| kv["key"] == key)?;
    Some(&value["value"])
}

fn attr_str<'a>(span: &'a Value, key: &str) -> &'a str {
    attr(span, key)
        .and_then(|v| v["string_value"].as_str())
        .unwrap_or("")
}

fn attr_int(span: &Value, key: &str) -> Option<i64> {
    let v = attr(span, key)?;
    let n = &v["int_value"];
    n.as_i64()
        .or_else(|| n.as_str().and_then(|s| s.parse().ok()))
}

#[test]
fn each_run_reaches_phoenix_as_a_trace_with_genai_spans() {
    let phoenix = start_phoenix();
    let world = World::new();
    let web = serve("Page text");
    let out = world.run(
        BUSY_PROMPT,
        &busy_replies(&web),
        &format!(
            "[telemetry]\notlp = \"http://127.0.0.1:{}\"\n",
            phoenix.port
        ),
        &[],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // run, 3 rounds, 1 tool call, sections and tasks: at least 10.
    let spans = phoenix_spans(&phoenix, 10);
    let by_id = |id: &str| spans.iter().find(|s| s["span_id"] == id);
    let named = |prefix: &str| -> Vec<&Value> {
        spans
            .iter()
            .filter(|s| s["name"].as_str().unwrap_or("").starts_with(prefix))
            .collect()
    };
    let roots = named("invoke_agent");
    assert_eq!(roots.len(), 1, "one run span");
    let root = roots[0];
    assert!(root["parent_span_id"].is_null() || root["parent_span_id"] == "");
    assert_eq!(root["name"], "invoke_agent busy");
    assert!(attr_str(root, "promptforge.execution").starts_with("run-"));
    assert_eq!(attr_str(root, "promptforge.outcome"), "completed");
    let trace_id = root["trace_id"].clone();
    assert!(spans.iter().all(|s| s["trace_id"] == trace_id), "one trace");

    let parent_of = |s: &Value| by_id(s["parent_span_id"].as_str().unwrap_or(""));
    let gather = named("section Gather");
    assert_eq!(gather.len(), 1);
    assert_eq!(
        parent_of(gather[0]).map(|p| &p["name"]),
        Some(&root["name"])
    );

    let chats = named("chat ");
    assert_eq!(chats.len(), 3, "three model rounds");
    for chat in &chats {
        assert_eq!(chat["name"], "chat scripted-7b");
        assert_eq!(attr_str(chat, "gen_ai.operation.name"), "chat");
        assert_eq!(attr_str(chat, "gen_ai.request.model"), "scripted-7b");
        assert_eq!(attr_str(chat, "gen_ai.response.model"), "scripted-7b");
        assert_eq!(attr_str(chat, "gen_ai.provider.name"), "promptforge.script");
        assert_eq!(
            parent_of(chat).map(|p| p["name"].as_str().unwrap_or("")),
            Some("section Gather")
        );
        let reasons = attr(chat, "gen_ai.response.finish_reasons").expect("finish reasons");
        assert!(reasons["array_value"]["values"].is_array(), "{reasons}");
    }
    let tokens: Vec<(Option<i64>, Option<i64>)> = chats
        .iter()
        .map(|c| {
            (
                attr_int(c, "gen_ai.usage.input_tokens"),
                attr_int(c, "gen_ai.usage.output_tokens"),
            )
        })
        .collect();
    // Every round carries its usage, the one that ended in a tool call too.
    assert!(tokens.contains(&(Some(21), Some(4))), "{tokens:?}");
    assert!(tokens.contains(&(Some(40), Some(9))), "{tokens:?}");
    assert!(tokens.contains(&(Some(12), Some(2))), "{tokens:?}");

    let tools = named("execute_tool");
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0]["name"], "execute_tool grab");
    assert_eq!(attr_str(tools[0], "gen_ai.tool.name"), "grab");
    assert_eq!(attr_str(tools[0], "gen_ai.tool.call.id"), "call_1");
    assert_eq!(
        parent_of(tools[0]).map(|p| p["name"].as_str().unwrap_or("")),
        Some("section Gather")
    );
    // The arms and the spawned task sit inside the section that started them.
    let arms = named("section Arm");
    assert_eq!(arms.len(), 3, "three arms");
    for arm in arms {
        let mut up = parent_of(arm);
        while let Some(p) = up.filter(|p| p["name"].as_str().unwrap_or("").starts_with("task ")) {
            up = parent_of(p);
        }
        assert_eq!(
            up.map(|p| p["name"].as_str().unwrap_or("")),
            Some("section Spread"),
            "an arm inside Spread"
        );
    }
}

const NESTED_PROMPT: &str = r#"---
name: nested
description: A local tool whose handler asks the model and calls another tool
promptforge: 0
models:
  writer: {}
---

# Nested

```lua
models.default('writer')
```

## Ask

```lua
tools.add_local('helper', 'Echo a text', { s = 'string' }, function(p)
  return 'echo ' .. p.s
end)
tools.add_local('outer', 'Ask the model, then echo its answer', { q = 'string' }, function(p)
  local said = models.infer('Answer ' .. p.q)
  store.write('said.txt', said)
  return tools.call('helper', { s = said })
end)
local m = messages.new():user('Use outer')
models.loop(m)
return m[#m].content
```
"#;

/// A span's start or end (`start`, `end`) in nanoseconds, as OTLP JSON writes it.
fn nanos(span: &Value, which: &str) -> u128 {
    match &span[format!("{which}_time_unix_nano")] {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().map_or(0, u128::from),
        other => panic!("no {which} time in {span} ({other})"),
    }
}

/// Phoenix's spans and token totals for a run whose local tool runs a
/// round and calls a tool from its handler: every `chat` span carries its
/// usage (the tool-call round's too), Phoenix's totals equal the run log's,
/// and the local tool's span lasts its handler's whole run and is the
/// parent of the round and the tool call the handler made.
#[test]
fn a_local_tools_span_nests_its_handlers_calls_and_every_round_counts_in_phoenix() {
    let phoenix = start_phoenix();
    let world = World::new();
    let replies = serde_json::json!([
        {"tool_calls": [{"name": "outer", "arguments": {"q": "six times seven"}}],
         "usage": {"input_tokens": 21, "output_tokens": 4}},
        {"content": "42", "usage": {"input_tokens": 7, "output_tokens": 2}},
        {"content": "done", "usage": {"input_tokens": 30, "output_tokens": 5}}
    ])
    .to_string();
    let out = world.run(
        NESTED_PROMPT,
        &replies,
        "",
        &["--otlp", &format!("http://127.0.0.1:{}", phoenix.port)],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
    // run, section, 3 rounds, 2 tool calls.
    let spans = phoenix_spans(&phoenix, 7);
    let by_id = |id: &str| spans.iter().find(|s| s["span_id"] == id);
    let parent_name = |s: &Value| {
        by_id(s["parent_span_id"].as_str().unwrap_or(""))
            .and_then(|p| p["name"].as_str())
            .unwrap_or("")
            .to_string()
    };
    let named = |name: &str| -> Vec<&Value> {
        spans
            .iter()
            .filter(|s| s["name"].as_str().unwrap_or("") == name)
            .collect()
    };
    let chats = named("chat scripted-7b");
    assert_eq!(chats.len(), 3, "three rounds");
    let mut totals = (0, 0);
    for chat in &chats {
        let input = attr_int(chat, "gen_ai.usage.input_tokens");
        let output = attr_int(chat, "gen_ai.usage.output_tokens");
        assert!(input.is_some() && output.is_some(), "{chat}");
        totals.0 += input.unwrap_or(0);
        totals.1 += output.unwrap_or(0);
    }
    assert_eq!(totals, (21 + 7 + 30, 4 + 2 + 5));
    // The run log's totals are the same.
    let shown = world
        .cmd()
        .args(["show", "last", "--json"])
        .output()
        .expect("show --json");
    let shown: Value = serde_json::from_slice(&shown.stdout).expect("show --json is JSON");
    assert_eq!(
        shown["tokens"]["input"].as_i64(),
        Some(totals.0),
        "{}",
        shown["tokens"]
    );
    assert_eq!(
        shown["tokens"]["output"].as_i64(),
        Some(totals.1),
        "{}",
        shown["tokens"]
    );

    let outer = named("execute_tool outer");
    assert_eq!(outer.len(), 1);
    let outer = outer[0];
    assert_eq!(parent_name(outer), "section Ask");
    let helper = named("execute_tool helper");
    assert_eq!(helper.len(), 1);
    let inside: Vec<&Value> = chats
        .iter()
        .copied()
        .filter(|c| c["parent_span_id"] == outer["span_id"])
        .collect();
    assert_eq!(inside.len(), 1, "the handler's round sits in the tool");
    assert_eq!(attr_int(inside[0], "gen_ai.usage.input_tokens"), Some(7));
    assert_eq!(helper[0]["parent_span_id"], outer["span_id"]);
    for child in [inside[0], helper[0]] {
        assert!(
            nanos(outer, "start") <= nanos(child, "start")
                && nanos(outer, "end") >= nanos(child, "end"),
            "the tool's span covers its handler's work: {outer} {child}"
        );
    }
    for chat in chats
        .iter()
        .filter(|c| c["parent_span_id"] != outer["span_id"])
    {
        assert_eq!(parent_name(chat), "section Ask");
    }
}

#[test]
fn a_collector_that_is_down_costs_one_warning_and_never_the_run() {
    let world = World::new();
    let port = free_port(); // nothing listens there
    let out = world.run(
        FAILING_PROMPT
            .replace("error('the <b>widget</b> broke')", "return 'fine'")
            .as_str(),
        "[]",
        "",
        &["--otlp", &format!("http://127.0.0.1:{port}")],
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "fine\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("warning:").count(), 1, "{stderr}");
    assert!(stderr.contains("OpenTelemetry export"), "{stderr}");
    // A URL that is not OTLP/HTTP is a usage error before anything runs.
    let out = world.run(OK_PROMPT, "[]", "", &["--otlp", "grpc://127.0.0.1:4317"]);
    assert_eq!(out.status.code(), Some(2));
    let out = world.run(OK_PROMPT, "[]", "[telemetry]\notlp = \"nope\"\n", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("[telemetry] otlp"));
}

const OK_PROMPT: &str = "---\nname: ok\ndescription: returns ok\npromptforge: 0\n---\n\n# Ok\n\n## Only\n\n```lua\nreturn 'ok'\n```\n";
