#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! MCP servers as Plugins, against the reference servers from npm
//! (`@modelcontextprotocol/server-everything` and `server-filesystem`,
//! installed by tests/tools/setup.sh node-mcp; test.sh runs it first):
//! concurrent start, structured tools and trust, an unreachable `url`
//! Plugin, and `check --host` suggesting the nearest tool path.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_promptforge");

fn node_bin(name: &str) -> PathBuf {
    static ONCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = ONCE.lock().unwrap_or_else(|p| p.into_inner());
    let tools = Path::new(env!("CARGO_TARGET_TMPDIR")).join("test-tools");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/setup.sh");
    let status = Command::new("bash")
        .arg(&script)
        .arg("node-mcp")
        .arg(&tools)
        .status()
        .expect("run tests/tools/setup.sh");
    assert!(
        status.success(),
        "tests/tools/setup.sh node-mcp failed: these tests need Node >= 18 and npm (see test.sh)"
    );
    tools.join("node-mcp/node_modules/.bin").join(name)
}

fn toml_string(text: &str) -> String {
    serde_json::Value::String(text.to_string()).to_string()
}

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new(host: &str, prompt: &str) -> Setup {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("host.toml"), host).expect("host file");
        std::fs::write(dir.path().join("p.md"), prompt).expect("prompt");
        Setup { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn promptforge(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .args(args)
            .arg("--host")
            .arg(self.path().join("host.toml"))
            .current_dir(self.path())
            .env("PROMPTFORGE_HOME", self.path().join("home"))
            .env_remove("PROMPTFORGE_LOG")
            .output()
            .expect("run promptforge")
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Three servers that each wait, before starting, until all three have been
/// launched (up to 25 s, within the 30 s start bound). Started one after
/// another, the first would wait for the others in vain and fail; started at
/// once, all three come up and the run uses each.
#[test]
fn a_runs_plugins_start_at_once_and_each_is_used() {
    let everything = node_bin("mcp-server-everything");
    let rendezvous = tempfile::tempdir().expect("tempdir");
    let mut host = String::new();
    for name in ["a", "b", "c"] {
        let script = format!(
            "touch {dir}/{name}; i=0; while [ \"$(ls {dir} | wc -l)\" -lt 3 ]; do \
             i=$((i+1)); [ $i -gt 250 ] && exit 1; sleep 0.1; done; exec {server}",
            dir = rendezvous.path().display(),
            server = everything.display(),
        );
        host.push_str(&format!(
            "[plugins.\"acme/{name}\"]\ncommand = [\"sh\", \"-c\", {}]\n\n",
            toml_string(&script)
        ));
    }
    let prompt = "---\nname: three\ndescription: three servers\npromptforge: 0\nplugins:\n  - acme/c\n  - acme/a\n  - acme/b\ntools:\n  sum_a: acme/a/get-sum\n  sum_b: acme/b/get-sum\n  echo_c: acme/c/echo\n---\n\n# Three\n\n## Use them\n\n```lua\nreturn tools.call('sum_a', {a = 1, b = 2}) .. '|' .. tools.call('sum_b', {a = 20, b = 3}) .. '|' .. tools.call('echo_c', {message = 'hi'})\n```\n";
    let setup = Setup::new(&host, prompt);
    let out = setup.promptforge(&["run", "p.md"]);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let parts: Vec<&str> = stdout.trim().split('|').collect();
    assert_eq!(parts.len(), 3, "{stdout}");
    assert!(parts[0].contains('3'), "{stdout}");
    assert!(parts[1].contains("23"), "{stdout}");
    assert!(parts[2].contains("hi"), "{stdout}");
}

/// server-filesystem declares an outputSchema on every tool. Trusted, its
/// result is a Lua table; untrusted, the seed's invalid-JSON error, and the
/// log says why and what to change.
#[test]
fn structured_tools_read_as_tables_only_from_a_trusted_plugin() {
    let filesystem = node_bin("mcp-server-filesystem");
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::write(root.path().join("a.txt"), "hello from a file").expect("file");
    let root_text = root.path().display().to_string();
    let host = format!(
        "[plugins.\"acme/fs\"]\ncommand = [{server}, {root}]\ntrusted = true\n\n\
         [plugins.\"acme/ufs\"]\ncommand = [{server}, {root}]\n",
        server = toml_string(&filesystem.display().to_string()),
        root = toml_string(&root_text),
    );
    let file = toml_string(&format!("{root_text}/a.txt"));
    let prompt = format!(
        "---\nname: fs\ndescription: read a file both ways\npromptforge: 0\nplugins:\n  - acme/fs\n  - acme/ufs\ntools:\n  read: acme/fs/read_text_file\n  uread: acme/ufs/read_text_file\n---\n\n# Files\n\n## Read\n\n```lua\nlocal got = tools.call('read', {{path = {file}}})\nlocal ok, err = pcall(tools.call, 'uread', {{path = {file}}})\nreturn got.content .. '|' .. tostring(ok) .. '|' .. tostring(err)\n```\n"
    );
    let setup = Setup::new(&host, &prompt);
    let out = setup.promptforge(&["run", "p.md"]);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout.trim(),
        "hello from a file|false|tool call failure: structured tool \"uread\" returned invalid JSON",
        "{stderr}"
    );
    assert!(
        stderr.contains("tool slot `uread` binds acme/ufs/read_text_file, a structured tool")
            && stderr.contains("structured output needs a trusted Plugin (`trusted = true` for acme/ufs in the host file)"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("tool slot `read` binds"),
        "a trusted Plugin's structured tool is not warned about: {stderr}"
    );
}

/// A `url` Plugin nothing listens at: one line naming the Plugin, the URL and
/// the reason; no Rust type names, no second error line.
#[test]
fn an_unreachable_url_plugin_fails_in_one_clear_line() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
        // Dropped here: nothing listens on the port any more.
    };
    let url = format!("http://127.0.0.1:{port}/mcp");
    let host = format!("[plugins.\"acme/far\"]\nurl = {}\n", toml_string(&url));
    let prompt = "---\nname: far\ndescription: far away\npromptforge: 0\nplugins:\n  - acme/far\ntools:\n  t: acme/far/tool\n---\n\n# Far\n\n## Go\n\n```lua\nreturn 1\n```\n";
    let setup = Setup::new(&host, prompt);
    let out = setup.promptforge(&["run", "p.md"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "MCP server acme/far: cannot connect to {url}: Connection refused"
        )),
        "{stderr}"
    );
    assert!(!stderr.contains("rmcp::"), "{stderr}");
    assert!(!stderr.contains("ERROR"), "{stderr}");
}

/// `check --host` against a real server: a slip in a tool path gets the
/// server's nearest path as the fix, on the one-line form too.
#[test]
fn check_suggests_the_servers_nearest_tool_path() {
    let everything = node_bin("mcp-server-everything");
    let host = format!(
        "[plugins.\"acme/every\"]\ncommand = [{}]\n",
        toml_string(&everything.display().to_string())
    );
    let prompt = "---\nname: sum\ndescription: sum\npromptforge: 0\nplugins:\n  - acme/every\ntools:\n  sum: acme/every/get_sum\n---\n\n# Sum\n\n## Go\n\n```lua\nreturn 1\n```\n";
    let setup = Setup::new(&host, prompt);
    let out = setup.promptforge(&["check", "p.md", "--format", "short"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains(
            "p.md:8:8: Binding: tool slot `sum`: Plugin acme/every has no tool acme/every/get_sum (did you mean `acme/every/get-sum`?)"
        ),
        "{stdout}"
    );
}
