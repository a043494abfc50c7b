//! The parser never panics and stays cheap on hostile input: mutated prompts,
//! random bytes, deep YAML, alias bombs, huge files, fences that never close.
//! (No timing asserts: a runaway case shows up as a hung test.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use pf_syntax::{diagnose, parse, render_diagnostic, ParseErrorKind, NOT_A_PROMPT};
use proptest::prelude::*;
use std::path::Path;

fn data_prompts() -> Vec<Vec<u8>> {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let mut files: Vec<_> = std::fs::read_dir(folder)
        .expect("tests/data exists")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.sort();
    files
        .into_iter()
        .filter_map(|p| std::fs::read(p).ok())
        .collect()
}

#[derive(Debug, Clone)]
enum Mutation {
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Duplicate(usize, usize),
    Flip(usize, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let snippets = prop::sample::select(vec![
        b"\n```lua\n".to_vec(),
        b"\n```\n".to_vec(),
        b"\n```lua shared\n".to_vec(),
        b"\n---\n".to_vec(),
        b"\n# ".to_vec(),
        b"\n## ".to_vec(),
        b"\n#### ".to_vec(),
        b"\n- ".to_vec(),
        b": &a [*a]".to_vec(),
        b"{[".to_vec(),
        b"\r\n".to_vec(),
        b"\xff\xfe".to_vec(),
        b"\xEF\xBB\xBF".to_vec(),
        b"\t".to_vec(),
        b"<!--".to_vec(),
        b"\n====\n".to_vec(),
    ]);
    prop_oneof![
        (any::<usize>(), snippets).prop_map(|(at, bytes)| Mutation::Insert(at, bytes)),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(at, bytes)| Mutation::Insert(at, bytes)),
        (any::<usize>(), 1usize..64).prop_map(|(at, len)| Mutation::Delete(at, len)),
        (any::<usize>(), 1usize..64).prop_map(|(at, len)| Mutation::Duplicate(at, len)),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Flip(at, byte)),
    ]
}

fn apply(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for mutation in mutations {
        let len = bytes.len();
        let position = |at: usize| if len == 0 { 0 } else { at % (len + 1) };
        match mutation {
            Mutation::Insert(at, new) => {
                let at = position(*at);
                bytes.splice(at..at, new.iter().copied());
            }
            Mutation::Delete(at, count) => {
                let at = position(*at);
                let end = (at + count).min(len);
                bytes.drain(at..end);
            }
            Mutation::Duplicate(at, count) => {
                let at = position(*at);
                let end = (at + count).min(len);
                let copy = bytes[at..end].to_vec();
                bytes.splice(at..at, copy);
            }
            Mutation::Flip(at, byte) => {
                if len > 0 {
                    bytes[at % len] = *byte;
                }
            }
        }
    }
    bytes
}

/// Parsing is a pure function: same input, same outcome.
fn parse_twice(bytes: &[u8]) {
    let first = parse(bytes).map(|p| format!("{p:?}"));
    let second = parse(bytes).map(|p| format!("{p:?}"));
    assert_eq!(first, second);
}

/// `diagnose` agrees with `parse`: its first error is `parse`'s error (kind,
/// message, line, column); a file that parses has only the version rule's
/// diagnostics. Every diagnostic renders (with and without colour).
fn diagnose_agrees(bytes: &[u8]) {
    let diagnostics = diagnose(bytes);
    match parse(bytes) {
        Err(error) => {
            let first = diagnostics.first_error().and_then(|d| d.to_parse_error());
            assert_eq!(first, Some(error), "{diagnostics:#?}");
        }
        Ok(_) => {
            for d in &diagnostics {
                let version_rule =
                    d.kind == pf_syntax::DiagnosticKind::Version || d.message == NOT_A_PROMPT;
                assert!(
                    version_rule,
                    "a prompt that parses has only version diagnostics: {d:?}"
                );
            }
        }
    }
    for d in &diagnostics {
        let plain = render_diagnostic("p.md", bytes, d, false);
        assert!(plain.contains(&d.message));
        let _ = render_diagnostic("p.md", bytes, d, true);
        assert!(d.one_line("p.md").starts_with("p.md:"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(350))]

    #[test]
    fn mutated_prompts_never_panic(
        index in any::<prop::sample::Index>(),
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        let prompts = data_prompts();
        let original = index.get(&prompts).clone();
        let mutated = apply(original, &mutations);
        parse_twice(&mutated);
        diagnose_agrees(&mutated);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        diagnose_agrees(&bytes);
        let mut framed = b"---\nname: a\ndescription: d\n".to_vec();
        framed.extend_from_slice(&bytes);
        diagnose_agrees(&framed);
        let mut body = b"---\nname: a\ndescription: d\n---\n# T\n".to_vec();
        body.extend_from_slice(&bytes);
        diagnose_agrees(&body);
    }

    #[test]
    fn random_text_lines_never_panic(
        lines in prop::collection::vec("[-#*`>=~ a-z0-9.)\\t\\r]{0,12}", 0..40)
    ) {
        let body = format!("---\nname: a\ndescription: d\n---\n# T\n{}", lines.join("\n"));
        diagnose_agrees(body.as_bytes());
    }

    #[test]
    fn random_frontmatter_lines_agree(
        lines in prop::collection::vec(
            "(name|description|descripton|promptforge|args|tools|models|plugins|max_tool_iterations|input|x)?: ?[ -~]{0,10}|  [a-z.]{0,6}: ?[ -~]{0,10}|  - [ -~]{0,10}",
            0..12,
        )
    ) {
        let source = format!("---\n{}\n---\n# T\n## A\n```lua\nreturn 1\n```\n", lines.join("\n"));
        diagnose_agrees(source.as_bytes());
    }
}

#[test]
fn diagnose_agrees_on_every_data_case() {
    let prompts = data_prompts();
    assert!(prompts.len() > 50);
    for prompt in &prompts {
        diagnose_agrees(prompt);
    }
}

#[test]
fn diagnose_agrees_on_hostile_inputs() {
    let deep = format!(
        "---\nname: a\ndescription: d\nx: {}1{}\n---\n# T\n",
        "[".repeat(200_000),
        "]".repeat(200_000)
    );
    let unclosed = format!(
        "---\nname: a\ndescription: d\n---\n# T\n## Main\n```lua\n{}",
        "x = 1\n".repeat(200_000)
    );
    let deep_lua = format!(
        "---\nname: big\ndescription: d\n---\n# T\n```lua\nreturn {}1{}\n```\n",
        "(".repeat(100_000),
        ")".repeat(100_000)
    );
    let mut many = String::from("---\nname: a\ndescription: d\n---\n# T\n");
    for i in 0..2_000 {
        many.push_str(&format!("## S\n-\n```lua\nx{i} = = 1\n```\n"));
    }
    for source in [
        deep,
        unclosed,
        deep_lua,
        many,
        String::new(),
        "---".into(),
        "---\n---".into(),
    ] {
        diagnose_agrees(source.as_bytes());
    }
}

fn frontmatter_error(source: &str) -> String {
    match parse(source.as_bytes()) {
        Err(e) if e.kind == ParseErrorKind::Frontmatter => e.message,
        other => panic!("expected a Frontmatter error, got {other:?}"),
    }
}

#[test]
fn deep_yaml_nesting_is_refused() {
    for (open, close) in [("[", "]"), ("{a: ", "}")] {
        let depth = 200_000;
        let source = format!(
            "---\nname: a\ndescription: d\nx: {}1{}\n---\n# T\n",
            open.repeat(depth),
            close.repeat(depth)
        );
        // Either our cap or the YAML scanner's own recursion limit refuses it.
        let message = frontmatter_error(&source);
        assert!(
            message == "invalid frontmatter: the frontmatter nests deeper than 64 levels"
                || message == "invalid frontmatter: recursion limit exceeded",
            "{message}"
        );
    }
    let mut block = String::from("---\nname: a\ndescription: d\nx:\n");
    for level in 0..200 {
        block.push_str(&" ".repeat(level + 1));
        block.push_str("- \n");
    }
    block.push_str("---\n# T\n");
    let message = frontmatter_error(&block);
    assert_eq!(
        message,
        "invalid frontmatter: the frontmatter nests deeper than 64 levels"
    );
}

#[test]
fn alias_bombs_are_cheap() {
    let mut yaml = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    let mut previous = 'a';
    for name in "bcdefghijklm".chars() {
        let refs = vec![format!("*{previous}"); 10].join(", ");
        yaml.push_str(&format!("{name}: &{name} [{refs}]\n"));
        previous = name;
    }
    let source = format!(
        "---\nname: a\ndescription: d\nplugins:\n  - ref: acme/kit\n    config:\n{}---\n# T\n",
        yaml.lines()
            .map(|l| format!("      {l}\n"))
            .collect::<String>()
    );
    let message = frontmatter_error(&source);
    assert!(message.contains("once aliases are expanded"), "{message}");
}

#[test]
fn five_megabyte_prompt_parses() {
    let mut source =
        String::from("---\nname: big\ndescription: d\npromptforge: 0\n---\n\n# Big\n\n");
    let mut index = 0;
    while source.len() < 5 * 1024 * 1024 {
        source.push_str(&format!(
            "## Section {index}\n\nSome prose about item {index}, with {{{{ var.x }}}} in it.\n\n```lua\nlocal n = {index}\nreturn tostring(n)\n```\n\n"
        ));
        index += 1;
    }
    let prompt = parse(source.as_bytes()).expect("big prompt parses");
    assert_eq!(prompt.sections.len(), index);
}

#[test]
fn five_megabyte_of_blank_lines_and_one_line() {
    let blank = format!(
        "---\nname: big\ndescription: d\n---\n# T\n## A\n{}",
        "\n".repeat(5 * 1024 * 1024)
    );
    assert!(parse(blank.as_bytes()).is_ok());
    let long_line = format!(
        "---\nname: big\ndescription: d\n---\n# T\n## A\n{}\n",
        "*[a".repeat(1024 * 1024)
    );
    let _ = parse(long_line.as_bytes());
    for pattern in ["`x", "[", "*a", "_a*", "<a "] {
        let long_heading = format!(
            "---\nname: big\ndescription: d\n---\n# {}\n## {}\n",
            pattern.repeat(200_000),
            pattern.repeat(200_000)
        );
        let _ = parse(long_heading.as_bytes());
    }
    let deep_lua = format!(
        "---\nname: big\ndescription: d\n---\n# T\n```lua\nreturn {}1{}\n```\n",
        "(".repeat(100_000),
        ")".repeat(100_000)
    );
    let error = parse(deep_lua.as_bytes()).expect_err("too deep for Lua");
    assert_eq!(error.kind, ParseErrorKind::Lua);
}

#[test]
fn fence_that_never_closes() {
    let source = format!(
        "---\nname: a\ndescription: d\n---\n# T\n## Main\n```lua\n{}",
        "x = 1\n".repeat(200_000)
    );
    let error = parse(source.as_bytes()).expect_err("unclosed");
    assert_eq!(error.kind, ParseErrorKind::Fence);
    assert_eq!(
        error.message,
        "section `Main` prologue `lua` fence is not closed"
    );
    assert_eq!((error.line, error.column), (Some(7), Some(1)));
}

#[test]
fn many_sections_and_tool_slots() {
    let mut source = String::from("---\nname: a\ndescription: d\ntools:\n");
    for i in 0..20_000 {
        source.push_str(&format!("  t{i}: acme/kit/t{i}\n"));
    }
    source.push_str("  t0: acme/kit/again\n---\n# T\n");
    let message = frontmatter_error(&source);
    assert_eq!(
        message,
        "invalid frontmatter: duplicate tool alias `t0`: contract map keys must be unique"
    );
    let mut body = String::from("---\nname: a\ndescription: d\n---\n# T\n");
    for i in 0..20_000 {
        body.push_str(&format!("## S{i}\n### C\n"));
    }
    body.push_str("## S0\n");
    let error = parse(body.as_bytes()).expect_err("duplicate");
    assert_eq!(error.kind, ParseErrorKind::Structure);
}
