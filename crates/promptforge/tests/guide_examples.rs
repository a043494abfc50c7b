#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Every prompt example in the user guide (docs/src) runs through the real
//! binary and gives what the text beside it says.
//!
//! A prompt example is a ````` ````markdown ````` fence whose text begins with
//! a `---` frontmatter line. Right after its closing fence comes an HTML
//! comment the rendered book hides, holding the example's test file in
//! `promptforge test`'s format (docs/testing.md):
//!
//! ```text
//! <!-- test
//! cases:
//!   - name: greets the reader
//!     args: reader
//!     expect: {result: "Hello, reader!"}
//! -->
//! ```
//!
//! Each example becomes `CHAPTER-LINE.md` with its `CHAPTER-LINE.test.yaml` in
//! one folder, and one `promptforge test FOLDER --json` runs them all, offline
//! (scripted replies, local web and MCP fixtures). A prompt example with no
//! test comment fails this test, so no example goes unchecked.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

struct Example {
    /// `docs/src/...:LINE`, for messages.
    place: String,
    /// File stem: the chapter's path with `-` for `/`, and the fence's line.
    stem: String,
    prompt: String,
    test: String,
}

fn docs_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src")
}

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read docs/src")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            markdown_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// The prompt examples of one chapter, with their test comments; a prompt
/// example without one is an error naming its line.
fn examples_in(path: &Path, rel: &str, errors: &mut Vec<String>) -> Vec<Example> {
    let text = std::fs::read_to_string(path).expect("read chapter");
    let lines: Vec<&str> = text.lines().collect();
    let mut examples = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        let ticks = trimmed.chars().take_while(|c| *c == '`').count();
        if ticks < 3 || trimmed[ticks..].trim() != "markdown" {
            i += 1;
            continue;
        }
        let fence = &trimmed[..ticks];
        let start = i + 1;
        let mut end = start;
        while end < lines.len() && lines[end].trim() != fence {
            end += 1;
        }
        let body = lines[start..end.min(lines.len())].join("\n") + "\n";
        let place = format!("docs/src/{rel}:{}", i + 1);
        i = end + 1;
        if !body.starts_with("---\n") {
            continue;
        }
        // The test comment follows the fence, blank lines allowed between.
        let mut j = i;
        while j < lines.len() && lines[j].trim().is_empty() {
            j += 1;
        }
        if j >= lines.len() || lines[j].trim() != "<!-- test" {
            errors.push(format!(
                "{place}: a prompt example needs a `<!-- test` comment after its fence"
            ));
            continue;
        }
        let mut k = j + 1;
        while k < lines.len() && lines[k].trim() != "-->" {
            k += 1;
        }
        let test = lines[j + 1..k.min(lines.len())].join("\n") + "\n";
        i = k + 1;
        let stem = format!(
            "{}-{}",
            rel.trim_end_matches(".md").replace('/', "-"),
            start
        );
        examples.push(Example {
            place,
            stem,
            prompt: body,
            test,
        });
    }
    examples
}

fn guide_examples() -> (Vec<Example>, Vec<String>) {
    let src = docs_src();
    let mut files = Vec::new();
    markdown_files(&src, &mut files);
    let mut errors = Vec::new();
    let mut examples = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(&src)
            .expect("under docs/src")
            .to_string_lossy()
            .replace('\\', "/");
        examples.extend(examples_in(&file, &rel, &mut errors));
    }
    (examples, errors)
}

#[test]
fn every_guide_prompt_example_gives_what_its_chapter_says() {
    let (examples, errors) = guide_examples();
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    assert!(
        examples.len() >= 40,
        "only {} prompt examples found in docs/src: the extraction lost some",
        examples.len()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    for example in &examples {
        std::fs::write(
            dir.path().join(format!("{}.md", example.stem)),
            &example.prompt,
        )
        .expect("write prompt");
        std::fs::write(
            dir.path().join(format!("{}.test.yaml", example.stem)),
            &example.test,
        )
        .expect("write test");
    }
    let home = tempfile::tempdir().expect("home");
    let filter = std::env::var("GUIDE_EXAMPLE").unwrap_or_default();
    let out = Command::new(env!("CARGO_BIN_EXE_promptforge"))
        .current_dir(dir.path())
        .args(["test", ".", "--json", "--filter", &filter])
        .env("PROMPTFORGE_HOME", home.path())
        .env_remove("PROMPTFORGE_HOST")
        .env_remove("PROMPTFORGE_LOG")
        .output()
        .expect("promptforge test");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}), exit {:?}: {}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let place_of = |file: &str| {
        examples
            .iter()
            .find(|e| file.contains(&format!("{}.test.yaml", e.stem)))
            .map_or(file.to_string(), |e| e.place.clone())
    };
    let mut failures = Vec::new();
    let mut tested = std::collections::BTreeSet::new();
    for case in report["cases"].as_array().expect("cases") {
        let file = case["file"].as_str().unwrap_or_default();
        tested.insert(place_of(file));
        if case["passed"] != true {
            failures.push(format!(
                "{} ({}): {}",
                place_of(file),
                case["name"].as_str().unwrap_or_default(),
                serde_json::to_string_pretty(&case["failures"]).unwrap_or_default()
                    + case["error"].as_str().unwrap_or_default()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    if filter.is_empty() {
        let untested: Vec<_> = examples
            .iter()
            .filter(|e| !tested.contains(&e.place))
            .map(|e| e.place.as_str())
            .collect();
        assert!(untested.is_empty(), "examples with no case: {untested:?}");
    }
    assert_eq!(out.status.code(), Some(0), "{report}");
}

/// mdBook's anchor for a heading: lower case, spaces to `-`, only letters,
/// digits, `-` and `_` kept.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn headings(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence: Option<String> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let ticks = trimmed.chars().take_while(|c| *c == '`').count();
        if ticks >= 3 {
            let marker = &trimmed[..ticks];
            match &fence {
                None => fence = Some(marker.to_string()),
                Some(open) if trimmed.trim() == open => fence = None,
                Some(_) => {}
            }
            continue;
        }
        if fence.is_none() && line.starts_with('#') {
            out.push(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn every_guide_link_names_a_chapter_and_heading_that_exist() {
    let src = docs_src();
    let mut files = Vec::new();
    markdown_files(&src, &mut files);
    let link = regex::Regex::new(r"\]\(([^)#\s]*\.md)?(#[^)\s]+)?\)").unwrap();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for caps in link.captures_iter(&text) {
            let (path, frag) = (caps.get(1), caps.get(2));
            if path.is_none() && frag.is_none() {
                continue;
            }
            let target = match path {
                Some(p) => file.parent().unwrap().join(p.as_str()),
                None => file.clone(),
            };
            checked += 1;
            let Ok(target_text) = std::fs::read_to_string(&target) else {
                broken.push(format!("{}: no file {}", file.display(), &caps[0]));
                continue;
            };
            if let Some(frag) = frag {
                let want = &frag.as_str()[1..];
                if !headings(&target_text).iter().any(|h| h == want) {
                    broken.push(format!("{}: no heading for {}", file.display(), &caps[0]));
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} links found");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}
