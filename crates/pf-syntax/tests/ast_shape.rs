//! Assertions on the parsed shape: blocks, roles, labels, list items, slots,
//! Plugin order, and the heading-reference helpers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use pf_syntax::*;

const HEADER: &str = "---\nname: shape\ndescription: d\npromptforge: 0\n---\n";

fn parse_ok(body: &str) -> Prompt {
    let source = format!("{HEADER}{body}");
    match parse(source.as_bytes()) {
        Ok(prompt) => prompt,
        Err(error) => panic!(
            "parse failed: {error} at {:?}:{:?}",
            error.line, error.column
        ),
    }
}

fn prose(block: &Block) -> &ProseBlock {
    match block {
        Block::Prose(prose) => prose,
        Block::Lua(lua) => panic!("expected prose, got lua {}", lua.label),
    }
}

fn lua(block: &Block) -> &LuaBlock {
    match block {
        Block::Lua(lua) => lua,
        Block::Prose(prose) => panic!("expected lua, got prose {:?}", prose.text),
    }
}

#[test]
fn prologue_prose_epilog() {
    // Line 6 is blank, 7 the title, 9 the section, 11 the first fence.
    let prompt = parse_ok(
        "\n# Three Blocks\n\n## Main\n\n```lua\n-- first\n```\n\nTell the reader.\n\n```lua\nreturn prose\n```\n",
    );
    assert_eq!(prompt.title, "Three Blocks");
    assert_eq!(prompt.title_line, 7);
    let main = &prompt.sections[0];
    assert_eq!((main.name.as_str(), main.level, main.line), ("Main", 2, 9));
    assert_eq!(main.blocks.len(), 3);
    let first = lua(&main.blocks[0]);
    assert_eq!(first.role, BlockRole::Prologue);
    assert_eq!(first.label, "section `Main` prologue");
    assert_eq!(first.first_line, 12);
    assert_eq!(first.source, "-- first");
    assert_eq!(prose(&main.blocks[1]).text, "Tell the reader.");
    assert_eq!(prose(&main.blocks[1]).line, 15);
    let last = lua(&main.blocks[2]);
    assert_eq!(last.role, BlockRole::Epilog);
    assert_eq!(last.label, "section `Main` epilog");
    assert_eq!(last.first_line, 18);
    assert!(main.list_items.is_none());
}

#[test]
fn two_fences_back_to_back_have_empty_prose_between() {
    let prompt =
        parse_ok("\n# T\n\n## Only\n\n```lua\n-- prologue\n```\n\n```lua\nreturn 'ok'\n```\n");
    let blocks = &prompt.sections[0].blocks;
    assert_eq!(blocks.len(), 3);
    assert_eq!(lua(&blocks[0]).role, BlockRole::Prologue);
    assert_eq!(prose(&blocks[1]).text, "");
    assert_eq!(prose(&blocks[1]).line, 14);
    assert_eq!(lua(&blocks[2]).role, BlockRole::Epilog);
}

#[test]
fn middle_fences_are_plain_and_trailing_prose_is_a_block() {
    let prompt = parse_ok(
        "\n# T\n\n## Tour\n\nBefore.\n\n```lua\na = 1\n```\n\nMiddle.\n\n```lua\nb = 2\n```\n\nAfter.\n",
    );
    let blocks = &prompt.sections[0].blocks;
    let shape: Vec<String> = blocks
        .iter()
        .map(|b| match b {
            Block::Prose(p) => format!("prose:{}", p.text),
            Block::Lua(l) => format!("lua:{:?}:{}", l.role, l.label),
        })
        .collect();
    assert_eq!(
        shape,
        [
            "prose:Before.",
            "lua:Plain:section `Tour` lua",
            "prose:Middle.",
            "lua:Epilog:section `Tour` epilog",
            "prose:After.",
        ]
    );
}

#[test]
fn single_fence_is_only_a_prologue() {
    let prompt = parse_ok("\n# T\n\n## One\n\n\n```lua\nreturn 1\n```\n\n");
    let blocks = &prompt.sections[0].blocks;
    assert_eq!(blocks.len(), 1);
    assert_eq!(lua(&blocks[0]).role, BlockRole::Prologue);
}

#[test]
fn thematic_break_resets_pending_prose() {
    let prompt = parse_ok(
        "\n# T\n\n## Draft\n\nWorking notes.\n\n---\n\nWrite the actual instructions here.\n\n```lua\nreturn prose\n```\n",
    );
    let blocks = &prompt.sections[0].blocks;
    assert_eq!(
        prose(&blocks[0]).text,
        "Write the actual instructions here."
    );
    assert_eq!(prose(&blocks[0]).line, 15);
    assert_eq!(lua(&blocks[1]).role, BlockRole::Epilog);
}

#[test]
fn prose_keeps_other_code_fences_whole() {
    let prompt = parse_ok(
        "\n# T\n\n## Main\n\nExplain:\n\n```text\n---\n# not a heading\n```\n\n```lua\nreturn prose\n```\n",
    );
    assert_eq!(prompt.sections.len(), 1);
    assert_eq!(
        prose(&prompt.sections[0].blocks[0]).text,
        "Explain:\n\n```text\n---\n# not a heading\n```"
    );
}

#[test]
fn h1_body_blocks_and_shared_library() {
    let prompt = parse_ok(
        "\n# Decorated\n\nDescription above.\n\n---\n\n```lua shared\nfunction decorate(v) return v end\n```\n\nBelow prose.\n\n```lua\nmodels = models\n```\n\n## Answer\n\n```lua\nreturn decorate('x')\n```\n",
    );
    let shared = prompt.shared.as_ref().expect("shared library");
    assert_eq!(shared.role, BlockRole::Shared);
    assert_eq!(shared.label, "prompt shared library");
    assert_eq!(shared.first_line, 14);
    assert_eq!(shared.source, "function decorate(v) return v end");
    assert_eq!(prompt.h1_blocks.len(), 2);
    assert_eq!(prose(&prompt.h1_blocks[0]).text, "Below prose.");
    let h1_lua = lua(&prompt.h1_blocks[1]);
    assert_eq!(h1_lua.role, BlockRole::H1);
    assert_eq!(h1_lua.label, "H1 `Decorated` lua");
    assert_eq!(prompt.sections.len(), 1);
}

#[test]
fn lone_h1_fence_is_not_the_shared_library() {
    let prompt = parse_ok("\n# T\n\n```lua\nx = 1\n```\n");
    assert!(prompt.shared.is_none());
    assert_eq!(prompt.h1_blocks.len(), 1);
    assert!(prompt.sections.is_empty());
}

#[test]
fn crlf_sources_are_normalized() {
    let source = "---\r\nname: a\r\ndescription: d\r\n---\r\n# T\r\n\r\n## S\r\n\r\n```lua\r\nlocal a = 1\r\nreturn a\r\n```\r\n";
    let prompt = parse(source.as_bytes()).expect("parses");
    let block = lua(&prompt.sections[0].blocks[0]);
    assert_eq!(block.source, "local a = 1\nreturn a");
    assert_eq!(block.first_line, 10);
}

#[test]
fn section_names_and_nesting() {
    let prompt = parse_ok(
        "\n# T\n\n## Run `fetch` **now** ##\n\n### Kid\n\n#### Grand\n\n### Kid2\n\n## Next\n",
    );
    let names: Vec<&str> = prompt.sections.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["Run fetch now", "Next"]);
    let first = &prompt.sections[0];
    let kids: Vec<(&str, u8)> = first
        .children
        .iter()
        .map(|s| (s.name.as_str(), s.level))
        .collect();
    assert_eq!(kids, [("Kid", 3), ("Kid2", 3)]);
    assert_eq!(first.children[0].children[0].name, "Grand");
    assert_eq!(first.children[0].children[0].level, 4);
}

#[test]
fn setext_underline_makes_a_section() {
    let prompt = parse_ok("\n# T\n\n## S\n\nSome prose\n---\n\nMore prose\n");
    let names: Vec<&str> = prompt.sections.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["S", "Some prose"]);
    assert_eq!(prompt.sections[1].line, 11);
    assert_eq!(prose(&prompt.sections[1].blocks[0]).text, "More prose");
    assert!(prompt.sections[0].blocks.is_empty());
}

#[test]
fn notes_before_the_title_are_ignored() {
    let prompt = parse_ok("\nNotes.\n\n## Not a section\n\n# Real\n\n## Answer\n");
    assert_eq!(prompt.title, "Real");
    let names: Vec<&str> = prompt.sections.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["Answer"]);
}

#[test]
fn list_sections() {
    let prompt = parse_ok(
        "\n# T\n\n## Topics\n\n- alpha\n\n* beta\n   \n  3. gamma\n4) delta\n-   spaced\n\n## Commentary\n\n- alpha\n\n---\n\n- beta\n\n## After dash\n\n- a\n---\n- b\n\n## Prose\n\nHere is context.\n- one incidental bullet\n\n## Empty\n\n   \n\n## With Lua\n\n- x\n\n```lua\nreturn prose\n```\n",
    );
    let items = |index: usize| prompt.sections[index].list_items.clone();
    assert_eq!(
        items(0),
        Some(vec![
            "alpha".to_string(),
            "beta".into(),
            "gamma".into(),
            "delta".into(),
            "  spaced".into()
        ])
    );
    assert!(prompt.sections[0].blocks.is_empty());
    assert_eq!(items(1), Some(vec!["beta".to_string()]));
    assert_eq!(items(2), Some(vec!["b".to_string()]));
    assert_eq!(items(3), None);
    assert_eq!(items(4), None);
    assert!(prompt.sections[4].blocks.is_empty());
    assert_eq!(items(5), None);
    assert_eq!(prose(&prompt.sections[5].blocks[0]).text, "- x");
}

#[test]
fn frontmatter_values() {
    let source = "---
name: research_person
description: Research a person from the open web and return a concise, factual summary.
promptforge: 3
max_tool_iterations: 50
input:
  path: paper.md
  description: The input paper
plugins:
  - promptforge/web
  - ref: io.github.corp/mcp
    optional: true
    config: {mode: fast, n: 2}
tools:
  search: promptforge/web/search
  fetch: promptforge/web/fetch
args:
  limit:
    type: integer
    optional: true
    default: 3
    description: At most this many
models:
  writer: {}
  analyst:
    keywords: [frontier, thinking]
    min_context: 200000
    description: Deep analysis
---

# T
";
    let prompt = parse(source.as_bytes()).expect("parses");
    let fm = &prompt.frontmatter;
    assert_eq!(fm.name, "research_person");
    assert_eq!(
        fm.description,
        "Research a person from the open web and return a concise, factual summary."
    );
    assert_eq!(fm.version, Some(VersionValue::Major(3)));
    assert_eq!(fm.max_tool_iterations, Some(50));
    let input = fm.input.as_ref().expect("input");
    assert_eq!(
        (input.path.as_str(), input.description.as_str()),
        ("paper.md", "The input paper")
    );
    assert!(fm.output.is_none());

    let plugins: Vec<(&str, bool, u32, u32)> = fm
        .plugins
        .iter()
        .map(|p| (p.id.as_str(), p.optional, p.line, p.column))
        .collect();
    assert_eq!(
        plugins,
        [
            ("promptforge/web", false, 10, 5),
            ("io.github.corp/mcp", true, 11, 5)
        ]
    );
    assert_eq!(fm.plugins[0].config, None);
    assert_eq!(
        fm.plugins[1].config,
        Some(serde_json::json!({"mode": "fast", "n": 2}))
    );

    let slots: Vec<(&str, &str, &str, &str)> = fm
        .tools
        .iter()
        .map(|s| {
            (
                s.alias.as_str(),
                s.path.as_str(),
                s.plugin_id(),
                s.short_name(),
            )
        })
        .collect();
    assert_eq!(
        slots,
        [
            (
                "search",
                "promptforge/web/search",
                "promptforge/web",
                "search"
            ),
            ("fetch", "promptforge/web/fetch", "promptforge/web", "fetch")
        ]
    );

    let args = fm.args.as_ref().expect("explicit args");
    assert_eq!(args.len(), 1);
    assert_eq!(args[0].name, "limit");
    assert_eq!(args[0].ty, ArgType::Integer);
    assert!(args[0].optional);
    assert_eq!(args[0].default, Some(serde_json::json!(3)));
    assert_eq!(args[0].description.as_deref(), Some("At most this many"));

    assert_eq!(fm.models.len(), 2);
    assert_eq!(fm.models[0].label, "writer");
    assert!(fm.models[0].keywords.is_empty());
    assert_eq!(fm.models[1].keywords, ["frontier", "thinking"]);
    assert_eq!(fm.models[1].min_context, Some(200000));
    assert_eq!(fm.models[1].description.as_deref(), Some("Deep analysis"));
}

#[test]
fn absent_keys_take_their_defaults() {
    let prompt = parse(b"---\nname: x\ndescription: d\n---\n# T\n").expect("parses");
    let fm = &prompt.frontmatter;
    assert_eq!(fm.version, None);
    assert!(fm.args.is_none());
    assert!(fm.plugins.is_empty() && fm.tools.is_empty() && fm.models.is_empty());
    let explicit = parse(b"---\nname: x\ndescription: d\nargs: {}\n---\n# T\n").expect("parses");
    assert_eq!(explicit.frontmatter.args.as_ref().map(Vec::len), Some(0));
}

#[test]
fn body_failures_carry_the_prompt_name() {
    let failure = parse_detailed(b"---\nname: dup\ndescription: d\n---\n# T\n## S\n## S\n")
        .expect_err("duplicate siblings");
    assert_eq!(failure.prompt_name.as_deref(), Some("dup"));
    assert_eq!(failure.error.kind, ParseErrorKind::Structure);
    let early = parse_detailed(b"# no frontmatter\n").expect_err("no frontmatter");
    assert_eq!(early.prompt_name, None);
}

#[test]
fn run_time_messages() {
    assert_eq!(
        NOT_A_PROMPT,
        "not a promptforge prompt: no promptforge version"
    );
    assert_eq!(
        unsupported_version_message(3),
        "unsupported promptforge version: 3 (this build supports major 0)"
    );
}

#[test]
fn version_rules() {
    let version = |header: &str| {
        let source = format!("---\n{header}name: v\ndescription: d\n---\n# V\nbody\n");
        check_version(&parse(source.as_bytes()).expect("parses"))
    };
    assert_eq!(version("promptforge: 0\n"), Ok(()));
    assert_eq!(version(""), Err(VersionProblem::NotAPrompt));
    assert_eq!(
        version("promptforge: 2\n"),
        Err(VersionProblem::Unsupported(2))
    );
    assert_eq!(VersionProblem::NotAPrompt.message(), NOT_A_PROMPT);
    assert_eq!(
        VersionProblem::Unsupported(2).message(),
        unsupported_version_message(2)
    );
}

#[test]
fn heading_reference_parsing() {
    let parsed = parse_heading_ref("  ###    Worker  ").expect("valid");
    assert_eq!(
        (parsed.level, parsed.name, parsed.text),
        (3, "Worker", "###    Worker")
    );
    assert_eq!(
        parse_heading_ref("Worker").unwrap_err(),
        "section heading must include ### markers, got bare name: Worker"
    );
    assert_eq!(
        parse_heading_ref("### ").unwrap_err(),
        "section heading has no name: ###"
    );
    assert_eq!(
        parse_heading_ref("###").unwrap_err(),
        "section heading has no name: ###"
    );
    assert_eq!(
        parse_heading_ref("###Worker").unwrap_err(),
        "section heading must have whitespace after the ### markers: ###Worker"
    );
}

#[test]
fn heading_resolution_uses_the_visible_set() {
    let prompt = parse_ok("\n# T\n\n## Main\n\n### Kid\n\n#### Grand\n\n## Sibling\n\n### Niece\n");
    let (path, found) = resolve_heading(&prompt, &[0], "## Sibling").expect("sibling");
    assert_eq!((path, found.name.as_str()), (vec![1], "Sibling"));
    let (path, found) = resolve_heading(&prompt, &[0], "### Kid").expect("child");
    assert_eq!((path, found.name.as_str()), (vec![0, 0], "Kid"));
    for unreachable in ["## Main", "#### Grand", "### Niece", "## Missing"] {
        let message = resolve_heading(&prompt, &[0], unreachable).unwrap_err();
        assert_eq!(
            message,
            format!("section heading `{unreachable}` not found; available sections: ## Sibling, ### Kid")
        );
    }
    // From the H1 body every top-level section is visible.
    let (path, _) = resolve_heading(&prompt, &[], " ##  Main ").expect("top level");
    assert_eq!(path, vec![0]);
    // A child sees its siblings and its own children only.
    let (path, found) =
        resolve_heading(&prompt, &[0, 0], "#### Grand").expect("grandchild from kid");
    assert_eq!((path, found.level), (vec![0, 0, 0], 4));
}
