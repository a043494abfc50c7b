//! The store's behaviour and exact messages, case by case from guide ch. 09.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use pf_store::{Store, StoreError, StoreErrorKind};

fn fresh() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open store");
    (dir, store)
}

fn user(message: &str) -> StoreError {
    StoreError {
        message: message.to_owned(),
        kind: StoreErrorKind::User,
    }
}

fn backend() -> StoreError {
    StoreError {
        message: "store backend failure".to_owned(),
        kind: StoreErrorKind::Backend,
    }
}

/// Every file and directory under the root, relative, sorted.
fn tree(store: &Store) -> Vec<String> {
    fn walk(base: &std::path::Path, dir: &std::path::Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
            let path = entry.path();
            let relative = path.strip_prefix(base).expect("under base");
            out.push(relative.to_string_lossy().into_owned());
            if entry.file_type().expect("file type").is_dir() {
                walk(base, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(store.root(), store.root(), &mut out);
    out.sort();
    out
}

// ---------------------------------------------------------------------------
// Path rules
// ---------------------------------------------------------------------------

#[test]
fn path_rules_with_exact_messages() {
    let too_long = "a".repeat(1025);
    let too_long_multibyte = "é".repeat(513); // 1026 bytes, 513 characters
    let cases: Vec<(&str, &str)> = vec![
        ("", r#"invalid path "": path is empty"#),
        (
            "/etc/passwd",
            r#"invalid path "/etc/passwd": path is absolute"#,
        ),
        ("/", r#"invalid path "/": path is absolute"#),
        (
            "a\tb",
            r#"invalid path "a\tb": path contains a control character"#,
        ),
        (
            "a\nb",
            r#"invalid path "a\nb": path contains a control character"#,
        ),
        (
            "a\rb",
            r#"invalid path "a\rb": path contains a control character"#,
        ),
        (
            "a\0b",
            r#"invalid path "a\0b": path contains a control character"#,
        ),
        (
            "a\u{7f}b",
            r#"invalid path "a\u{7f}b": path contains a control character"#,
        ),
        (
            "a\u{1b}b",
            r#"invalid path "a\u{1b}b": path contains a control character"#,
        ),
        ("a\\b", r#"invalid path "a\\b": path contains a backslash"#),
        (
            "..\\x",
            r#"invalid path "..\\x": path contains a backslash"#,
        ),
        ("a/", r#"invalid path "a/": path contains an empty segment"#),
        (
            "a//b",
            r#"invalid path "a//b": path contains an empty segment"#,
        ),
        (
            "..",
            r#"invalid path "..": path contains a traversal segment"#,
        ),
        (
            "../x",
            r#"invalid path "../x": path contains a traversal segment"#,
        ),
        (
            "a/../b",
            r#"invalid path "a/../b": path contains a traversal segment"#,
        ),
        (
            "./a",
            r#"invalid path "./a": path contains a traversal segment"#,
        ),
        (
            "a/.",
            r#"invalid path "a/.": path contains a traversal segment"#,
        ),
        (
            "a.",
            r#"invalid path "a.": path segment ends in an unsafe character"#,
        ),
        (
            "a ",
            r#"invalid path "a ": path segment ends in an unsafe character"#,
        ),
        (
            "dir./a",
            r#"invalid path "dir./a": path segment ends in an unsafe character"#,
        ),
        (
            "...",
            r#"invalid path "...": path segment ends in an unsafe character"#,
        ),
        (
            "CON",
            r#"invalid path "CON": path contains a reserved device name"#,
        ),
        (
            "con.txt",
            r#"invalid path "con.txt": path contains a reserved device name"#,
        ),
        (
            "a/Nul.tar.gz",
            r#"invalid path "a/Nul.tar.gz": path contains a reserved device name"#,
        ),
        (
            "prn",
            r#"invalid path "prn": path contains a reserved device name"#,
        ),
        (
            "aux/x",
            r#"invalid path "aux/x": path contains a reserved device name"#,
        ),
        (
            "com1",
            r#"invalid path "com1": path contains a reserved device name"#,
        ),
        (
            "COM9.log",
            r#"invalid path "COM9.log": path contains a reserved device name"#,
        ),
        (
            "lpt1",
            r#"invalid path "lpt1": path contains a reserved device name"#,
        ),
        (
            "LpT9.x",
            r#"invalid path "LpT9.x": path contains a reserved device name"#,
        ),
        // Order: whole-path checks first, then each segment left to right.
        ("/a\\b", r#"invalid path "/a\\b": path is absolute"#),
        (
            "a\t\\",
            r#"invalid path "a\t\\": path contains a control character"#,
        ),
        ("a\\/", r#"invalid path "a\\/": path contains a backslash"#),
        (
            "con/../x",
            r#"invalid path "con/../x": path contains a reserved device name"#,
        ),
        (
            "../con",
            r#"invalid path "../con": path contains a traversal segment"#,
        ),
        (
            "a./b//",
            r#"invalid path "a./b//": path segment ends in an unsafe character"#,
        ),
        (
            "a//..",
            r#"invalid path "a//..": path contains an empty segment"#,
        ),
        (
            "say \"hi\" ",
            r#"invalid path "say \"hi\" ": path segment ends in an unsafe character"#,
        ),
    ];
    for (path, message) in &cases {
        assert_eq!(
            pf_store::validate_path(path),
            Err(user(message)),
            "{path:?}"
        );
    }
    let long_message = format!("invalid path {too_long:?}: path is too long");
    assert_eq!(pf_store::validate_path(&too_long), Err(user(&long_message)));
    let long_message = format!("invalid path {too_long_multibyte:?}: path is too long");
    assert_eq!(
        pf_store::validate_path(&too_long_multibyte),
        Err(user(&long_message))
    );
    // Too long wins over everything else, even a leading `/`.
    let long_absolute = format!("/{}", "\\".repeat(1024));
    assert!(pf_store::validate_path(&long_absolute)
        .err()
        .is_some_and(|e| e.message.ends_with(": path is too long")));
}

#[test]
fn paths_that_pass() {
    let exactly_1024 = "a".repeat(1024);
    let multibyte_1024 = "é".repeat(512);
    let nested_1024 = format!("{}/b", "d".repeat(1022));
    let passing = [
        "a.txt",
        "src/a.rs",
        "secret/path.txt",
        "console.txt",
        "com10.txt",
        ".config",
        "notes/.hidden/x",
        "inner space.md",
        "café/résumé.md",
        "日本語/ファイル.txt",
        "a.b.c",
        "con_x",
        "xcon",
        "?*[]{}<>|:\"'",
        exactly_1024.as_str(),
        multibyte_1024.as_str(),
        nested_1024.as_str(),
    ];
    for path in passing {
        assert_eq!(pf_store::validate_path(path), Ok(()), "{path:?}");
    }
}

#[test]
fn every_call_rejects_a_bad_path_and_touches_nothing() {
    let (_dir, store) = fresh();
    store.write("keep.txt", "kept").expect("write");
    let before = tree(&store);
    let message = r#"invalid path "../escape.txt": path contains a traversal segment"#;
    let bad = "../escape.txt";
    assert_eq!(store.read(bad), Err(user(message)));
    assert_eq!(store.read_range(bad, 1, None), Err(user(message)));
    assert_eq!(store.read_lines(bad, None, Some(2)), Err(user(message)));
    assert_eq!(store.read_numbered(bad, None, None), Err(user(message)));
    assert_eq!(store.write(bad, "x"), Err(user(message)));
    assert_eq!(store.append(bad, "x"), Err(user(message)));
    assert_eq!(store.str_replace(bad, "", "x"), Err(user(message)));
    assert_eq!(store.delete(bad), Err(user(message)));
    assert_eq!(store.exists(bad), Err(user(message)));
    assert_eq!(store.read_out(bad, u64::MAX), Err(user(message)));
    let source = tempfile::NamedTempFile::new().expect("temp file");
    assert_eq!(store.copy_in(source.path(), bad), Err(user(message)));
    assert_eq!(tree(&store), before);
    assert!(!store
        .root()
        .parent()
        .expect("parent")
        .join("escape.txt")
        .exists());
}

#[test]
fn case_is_kept_and_compared_exactly() {
    let (_dir, store) = fresh();
    store.write("Notes.md", "upper").expect("write");
    store.write("notes.md", "lower").expect("write");
    assert_eq!(store.read("Notes.md").as_deref(), Ok("upper"));
    assert_eq!(store.read("notes.md").as_deref(), Ok("lower"));
    assert_eq!(
        store.glob("*.md"),
        Ok(vec!["Notes.md".to_owned(), "notes.md".to_owned()])
    );
    assert_eq!(store.exists("NOTES.md"), Ok(false));
}

#[test]
fn a_1024_byte_single_name_works() {
    let (_dir, store) = fresh();
    let name = "a".repeat(1024);
    store.write(&name, "long").expect("write");
    assert_eq!(store.read(&name).as_deref(), Ok("long"));
    assert_eq!(store.exists(&name), Ok(true));
    assert_eq!(store.glob("*"), Ok(vec![name.clone()]));
    assert_eq!(store.glob("a*"), Ok(vec![name.clone()]));
    store.append(&name, "er").expect("append");
    assert_eq!(store.read(&name).as_deref(), Ok("longer"));
    // A sibling sharing the first chunk stays separate.
    let sibling = format!("{}b", "a".repeat(600));
    store.write(&sibling, "sib").expect("write");
    assert_eq!(store.glob("*").map(|v| v.len()), Ok(2));
    store.delete(&name).expect("delete");
    assert_eq!(store.exists(&name), Ok(false));
    assert_eq!(store.glob("*"), Ok(vec![sibling.clone()]));
    store.delete(&sibling).expect("delete");
    assert!(tree(&store).is_empty(), "{:?}", tree(&store));
}

#[test]
fn long_multibyte_directory_names_work() {
    let (_dir, store) = fresh();
    let directory = "日".repeat(200); // 600 bytes
    let file = format!("{directory}/x.txt");
    store.write(&file, "deep").expect("write");
    assert_eq!(store.exists(&directory), Ok(true));
    assert_eq!(store.glob("**"), Ok(vec![file.clone()]));
    assert_eq!(
        store.glob(&format!("{directory}/*")),
        Ok(vec![file.clone()])
    );
    assert_eq!(store.glob("*/x.txt"), Ok(vec![file.clone()]));
    assert_eq!(store.glob("*"), Ok(vec![]));
    assert_eq!(store.delete(&directory), Err(backend()));
    store.delete(&file).expect("delete file");
    assert_eq!(store.exists(&directory), Ok(true));
    store.delete(&directory).expect("delete dir");
    assert_eq!(store.exists(&directory), Ok(false));
    assert!(tree(&store).is_empty(), "{:?}", tree(&store));
}

// ---------------------------------------------------------------------------
// Writing and reading
// ---------------------------------------------------------------------------

#[test]
fn write_read_append_examples() {
    let (_dir, store) = fresh();
    store.write("note.txt", "remember this").expect("write");
    assert_eq!(store.read("note.txt").as_deref(), Ok("remember this"));
    store.write("p", "old").expect("write");
    store.write("p", "new").expect("write");
    assert_eq!(store.read("p").as_deref(), Ok("new"));
    store.write("t", "first\nsecond\n").expect("write");
    assert_eq!(store.read("t").as_deref(), Ok("first\nsecond\n"));

    store.append("a1", "one\n").expect("append");
    store.append("a1", "two").expect("append");
    assert_eq!(store.read("a1").as_deref(), Ok("one\ntwo"));
    store.write("a2", "one").expect("write");
    store.append("a2", "two").expect("append");
    assert_eq!(store.read("a2").as_deref(), Ok("onetwo"));

    store
        .write("drafts/plan.md", "step one")
        .expect("nested write");
    assert_eq!(store.read("drafts/plan.md").as_deref(), Ok("step one"));
    store.append("x/y/z.txt", "deep").expect("nested append");
    assert_eq!(store.read("x/y/z.txt").as_deref(), Ok("deep"));
    store.write("empty", "").expect("write empty");
    assert_eq!(store.read("empty").as_deref(), Ok(""));
    assert_eq!(store.read_numbered("empty", None, None).as_deref(), Ok(""));
}

#[test]
fn missing_files() {
    let (_dir, store) = fresh();
    let missing = user("file not found: missing.md");
    assert_eq!(store.read("missing.md"), Err(missing.clone()));
    assert_eq!(
        store.read_numbered("missing.md", None, None),
        Err(missing.clone())
    );
    // With a start, the file is read before the bounds are checked.
    assert_eq!(
        store.read_range("missing.md", 0, Some(-3)),
        Err(missing.clone())
    );
    assert_eq!(
        store.read_numbered("missing.md", Some(-1), None),
        Err(missing.clone())
    );
    assert_eq!(store.str_replace("missing.md", "a", "b"), Err(missing));
    // A path under a file does not exist either.
    store.write("a.txt", "x").expect("write");
    assert_eq!(store.read("a.txt/b"), Err(user("file not found: a.txt/b")));
    assert_eq!(store.exists("a.txt/b"), Ok(false));
    assert_eq!(store.delete("a.txt/b"), Ok(()));
}

#[test]
fn line_ranges_and_numbered_reads() {
    let (_dir, store) = fresh();
    let p = "list.txt";
    store.write(p, "one\ntwo\nthree\n").expect("write");
    let plain = |start: i64, end: Option<i64>| store.read_range(p, start, end);
    assert_eq!(store.read(p).as_deref(), Ok("one\ntwo\nthree\n"));
    assert_eq!(plain(2, None).as_deref(), Ok("two\nthree"));
    assert_eq!(plain(2, Some(2)).as_deref(), Ok("two"));
    assert_eq!(plain(1, Some(2)).as_deref(), Ok("one\ntwo"));
    assert_eq!(plain(2, Some(99)).as_deref(), Ok("two\nthree"));
    assert_eq!(plain(3, Some(99)).as_deref(), Ok("three"));
    assert_eq!(plain(99, None).as_deref(), Ok(""));
    assert_eq!(plain(5, Some(2)).as_deref(), Ok(""));
    assert_eq!(
        store.read_lines(p, None, None).as_deref(),
        Ok("one\ntwo\nthree\n")
    );
    assert_eq!(
        store.read_lines(p, Some(2), Some(3)).as_deref(),
        Ok("two\nthree")
    );
    assert_eq!(
        store.read_numbered(p, Some(2), Some(3)).as_deref(),
        Ok("2| two\n3| three")
    );
    assert_eq!(
        store.read_numbered(p, None, None).as_deref(),
        Ok("1| one\n2| two\n3| three")
    );
    assert_eq!(store.read_numbered(p, Some(99), None).as_deref(), Ok(""));

    let range = |reason: &str| user(&format!("invalid line range for list.txt: {reason}"));
    assert_eq!(plain(0, None), Err(range("start must be at least 1")));
    assert_eq!(plain(-4, Some(2)), Err(range("start must be at least 1")));
    assert_eq!(
        plain(2, Some(1)),
        Err(range("end must not be before start"))
    );
    assert_eq!(
        plain(1, Some(0)),
        Err(range("end must not be before start"))
    );
    assert_eq!(
        store.read_numbered(p, Some(3), Some(-1)),
        Err(range("end must not be before start"))
    );
    assert_eq!(
        store.read_lines(p, None, Some(2)),
        Err(range("start is required when end is given"))
    );
    assert_eq!(
        store.read_numbered(p, None, Some(2)),
        Err(range("start is required when end is given"))
    );
    // An end with a nil start fails whether or not the file exists.
    assert_eq!(
        store.read_lines("nope.txt", None, Some(2)),
        Err(user(
            "invalid line range for nope.txt: start is required when end is given"
        ))
    );

    store.write("crlf.txt", "a\r\nb\r\n").expect("write");
    assert_eq!(store.read_range("crlf.txt", 1, None).as_deref(), Ok("a\nb"));
    store.write("empty.txt", "").expect("write");
    assert_eq!(store.read_range("empty.txt", 1, Some(5)).as_deref(), Ok(""));
    assert_eq!(
        store.read_numbered("empty.txt", Some(1), None).as_deref(),
        Ok("")
    );

    let hundred: String = (1..=100).map(|n| format!("line{n}\n")).collect();
    store.write("h.txt", &hundred).expect("write");
    assert_eq!(
        store.read_numbered("h.txt", Some(99), Some(100)).as_deref(),
        Ok(" 99| line99\n100| line100")
    );
}

#[test]
fn str_replace_rules_and_messages() {
    let (_dir, store) = fresh();
    store
        .write("fox.txt", "the quick brown fox")
        .expect("write");
    store
        .str_replace("fox.txt", "quick", "slow")
        .expect("replace");
    assert_eq!(store.read("fox.txt").as_deref(), Ok("the slow brown fox"));

    store.write("cv.txt", "café résumé café").expect("write");
    store
        .str_replace("cv.txt", "résumé", "CV")
        .expect("replace");
    assert_eq!(store.read("cv.txt").as_deref(), Ok("café CV café"));
    store
        .str_replace("cv.txt", " CV", "")
        .expect("empty new removes the anchor");
    assert_eq!(store.read("cv.txt").as_deref(), Ok("café café"));

    store.write("na.txt", "na na na").expect("write");
    store.write("empty.txt", "").expect("write");
    let cases: Vec<(&str, &str, StoreError)> = vec![
        (
            "na.txt",
            "",
            user("invalid anchor for na.txt: anchor must not be empty"),
        ),
        (
            "gone.txt",
            "",
            user("invalid anchor for gone.txt: anchor must not be empty"),
        ),
        ("gone.txt", "x", user("file not found: gone.txt")),
        ("na.txt", "xyz", user("anchor not found in na.txt")),
        ("empty.txt", "a", user("anchor not found in empty.txt")),
        (
            "na.txt",
            "na",
            user("anchor occurs 3 times in na.txt, expected exactly one"),
        ),
        (
            "na.txt",
            "a",
            user("anchor occurs 3 times in na.txt, expected exactly one"),
        ),
    ];
    for (path, old, expected) in &cases {
        assert_eq!(
            store.str_replace(path, old, "Z"),
            Err(expected.clone()),
            "{path} {old:?}"
        );
    }
    assert_eq!(store.read("na.txt").as_deref(), Ok("na na na"));
    assert_eq!(store.exists("gone.txt"), Ok(false));
    store.write("aaaa.txt", "aaaa").expect("write");
    assert_eq!(
        store.str_replace("aaaa.txt", "aa", "b"),
        Err(user(
            "anchor occurs 2 times in aaaa.txt, expected exactly one"
        ))
    );
    store.write("aaa.txt", "aaa").expect("write");
    // Non-overlapping count: "aa" in "aaa" occurs once.
    store.str_replace("aaa.txt", "aa", "b").expect("replace");
    assert_eq!(store.read("aaa.txt").as_deref(), Ok("ba"));
}

#[test]
fn delete_and_exists() {
    let (_dir, store) = fresh();
    store.write("notes/a.txt", "x").expect("write");
    assert_eq!(store.delete("notes"), Err(backend()));
    assert_eq!(store.read("notes/a.txt").as_deref(), Ok("x"));
    store.delete("notes/a.txt").expect("delete");
    store.delete("notes/a.txt").expect("delete twice");
    assert_eq!(
        store.read("notes/a.txt"),
        Err(user("file not found: notes/a.txt"))
    );
    assert_eq!(store.exists("notes/a.txt"), Ok(false));
    assert_eq!(store.exists("notes"), Ok(true));
    store.delete("notes").expect("delete empty dir");
    assert_eq!(store.exists("notes"), Ok(false));
    store.delete("never-existed").expect("delete missing");
}

#[test]
fn directory_used_as_a_file_is_a_backend_failure_and_changes_nothing() {
    let (_dir, store) = fresh();
    store.write("notes/a.txt", "x").expect("write");
    store.write("a.txt", "file").expect("write");
    let before = tree(&store);
    assert_eq!(store.read("notes"), Err(backend()));
    assert_eq!(store.read_range("notes", 1, None), Err(backend()));
    assert_eq!(store.read_numbered("notes", None, None), Err(backend()));
    assert_eq!(store.str_replace("notes", "a", "b"), Err(backend()));
    assert_eq!(store.write("notes", "x"), Err(backend()));
    assert_eq!(store.append("notes", "x"), Err(backend()));
    assert_eq!(store.write("a.txt/b.txt", "x"), Err(backend()));
    assert_eq!(store.append("a.txt/b.txt", "x"), Err(backend()));
    assert_eq!(store.write("a.txt/deeper/b.txt", "x"), Err(backend()));
    assert_eq!(store.read_out("notes", u64::MAX), Err(backend()));
    assert_eq!(tree(&store), before);
}

#[test]
fn non_utf8_text_is_a_backend_failure() {
    let (_dir, store) = fresh();
    std::fs::write(store.root().join("bin.dat"), [0xff, 0xfe, b'a', b'\n']).expect("seed");
    assert_eq!(store.read("bin.dat"), Err(backend()));
    assert_eq!(store.read_range("bin.dat", 1, None), Err(backend()));
    assert_eq!(store.read_numbered("bin.dat", None, None), Err(backend()));
    assert_eq!(store.str_replace("bin.dat", "a", "b"), Err(backend()));
    // Appending adds text without needing to decode; the bytes survive.
    store.append("bin.dat", "tail").expect("append");
    assert_eq!(
        store.read_out("bin.dat", u64::MAX),
        Ok(vec![0xff, 0xfe, b'a', b'\n', b't', b'a', b'i', b'l'])
    );
    assert_eq!(store.exists("bin.dat"), Ok(true));
    assert_eq!(store.glob("*.dat"), Ok(vec!["bin.dat".to_owned()]));
}

// ---------------------------------------------------------------------------
// Glob
// ---------------------------------------------------------------------------

#[test]
fn glob_examples() {
    let (_dir, store) = fresh();
    store.write("src/b.rs", "b").expect("write");
    store.write("src/a.rs", "a").expect("write");
    store.write("src/deep/c.rs", "c").expect("write");
    store.write("notes.md", "n").expect("write");
    let list = |pattern: &str| store.glob(pattern).expect("glob");
    assert_eq!(list("src/*.rs"), vec!["src/a.rs", "src/b.rs"]);
    assert_eq!(
        list("src/**/*.rs"),
        vec!["src/a.rs", "src/b.rs", "src/deep/c.rs"]
    );
    assert_eq!(list("*.md"), vec!["notes.md"]);
    assert_eq!(
        list("**"),
        vec!["notes.md", "src/a.rs", "src/b.rs", "src/deep/c.rs"]
    );
    assert_eq!(list("**/c.rs"), vec!["src/deep/c.rs"]);
    assert_eq!(list("src/deep/c.rs"), vec!["src/deep/c.rs"]);
    assert_eq!(list("notes.md"), vec!["notes.md"]);
    assert!(list("nothing/*").is_empty());
    assert!(list("notes.md/*").is_empty());
    assert!(list("../*").is_empty());
    assert!(list("/src/*").is_empty());
    assert!(list("src//a.rs").is_empty());
    // Files only: `*` does not list the `src` directory.
    assert_eq!(list("*"), vec!["notes.md"]);
}

#[test]
fn glob_small_cases() {
    let (_dir, store) = fresh();
    store.write("a/b.txt", "x").expect("write");
    assert!(store.glob("*.txt").expect("glob").is_empty());
    assert_eq!(store.glob("a/*.txt"), Ok(vec!["a/b.txt".to_owned()]));
    store.write("a/b.rs", "x").expect("write");
    store.write("z2.rs", "x").expect("write");
    assert_eq!(store.glob("a/**/b.rs"), Ok(vec!["a/b.rs".to_owned()]));
    assert_eq!(store.glob("**/z2.rs"), Ok(vec!["z2.rs".to_owned()]));
    store.write("notes/a.txt", "x").expect("write");
    assert_eq!(store.glob("notes/*"), Ok(vec!["notes/a.txt".to_owned()]));
    assert!(store
        .glob("**")
        .expect("glob")
        .contains(&"notes/a.txt".to_owned()));
    // Literal metacharacters of other glob dialects.
    store.write("[x]?.md", "x").expect("write");
    assert_eq!(store.glob("[x]?.md"), Ok(vec!["[x]?.md".to_owned()]));
    assert!(store.glob("x?.md").expect("glob").is_empty());
}

#[test]
fn glob_pattern_errors() {
    let (_dir, store) = fresh();
    let long = "a".repeat(1025);
    let cases: Vec<(&str, String)> = vec![
        (
            "",
            r#"invalid glob pattern "": pattern is empty"#.to_owned(),
        ),
        (
            long.as_str(),
            format!("invalid glob pattern {long:?}: pattern exceeds 1024 bytes"),
        ),
        (
            "a\n*",
            r#"invalid glob pattern "a\n*": pattern contains a control character"#.to_owned(),
        ),
        (
            "a\\*",
            r#"invalid glob pattern "a\\*": pattern does not support backslash escapes"#.to_owned(),
        ),
        (
            "src/***",
            r#"invalid glob pattern "src/***": three or more `*` in a row are not supported"#
                .to_owned(),
        ),
        (
            "src**/x",
            r#"invalid glob pattern "src**/x": `**` must fill a whole path segment"#.to_owned(),
        ),
    ];
    for (pattern, message) in &cases {
        assert_eq!(store.glob(pattern), Err(user(message)), "{pattern:?}");
    }
}

// ---------------------------------------------------------------------------
// Input and output files, opening
// ---------------------------------------------------------------------------

#[test]
fn copy_in_and_read_out() {
    let (_dir, store) = fresh();
    let host = tempfile::tempdir().expect("tempdir");
    let paper = host.path().join("paper.md");
    std::fs::write(&paper, "the paper body").expect("seed host file");
    store.copy_in(&paper, "paper.md").expect("copy in");
    let body = store.read("paper.md").expect("read");
    store
        .write("report.md", &format!("report on: {body}"))
        .expect("write");
    assert_eq!(
        store.read_out("report.md", u64::MAX),
        Ok(b"report on: the paper body".to_vec())
    );

    let missing_host = host.path().join("absent.md");
    let error = store
        .copy_in(&missing_host, "absent.md")
        .expect_err("must fail");
    assert_eq!(error.kind, StoreErrorKind::Host);
    let prefix = format!("cannot read input file {}: ", missing_host.display());
    assert!(error.message.starts_with(&prefix), "{}", error.message);
    assert_eq!(store.exists("absent.md"), Ok(false));

    assert_eq!(
        store.read_out("never.md", u64::MAX),
        Err(StoreError {
            message: "output file not found: never.md".to_owned(),
            kind: StoreErrorKind::Host,
        })
    );
}

/// An output file past the limit is refused unread, naming the file and the
/// limit; at the limit it is read.
#[test]
fn read_out_is_bounded() {
    let (_dir, store) = fresh();
    store.write("out/report.md", "0123456789").expect("write");
    assert_eq!(
        store.read_out("out/report.md", 10),
        Ok(b"0123456789".to_vec())
    );
    assert_eq!(
        store.read_out("out/report.md", 9),
        Err(StoreError {
            message: "output file out/report.md is 10 bytes, over the 9-byte limit for a collected output (it stays in the store)".to_owned(),
            kind: StoreErrorKind::Host,
        })
    );
    assert_eq!(
        store.read_out("out/report.md", 0).map(|b| b.len()).ok(),
        None
    );
}

#[test]
fn open_creates_the_directory_and_fails_cleanly() {
    let host = tempfile::tempdir().expect("tempdir");
    let nested = host.path().join("x/y/store");
    let store = Store::open(&nested).expect("open");
    assert!(nested.is_dir());
    store.write("a", "b").expect("write");
    assert_eq!(
        Store::open(&nested).and_then(|s| s.read("a")),
        Ok("b".to_owned())
    );

    let file = host.path().join("plain-file");
    std::fs::write(&file, "x").expect("seed");
    assert_eq!(
        Store::open(&file).err(),
        Some(StoreError {
            message: "store operation failed".to_owned(),
            kind: StoreErrorKind::Backend,
        })
    );
}

#[test]
fn clones_share_one_store() {
    let (_dir, store) = fresh();
    let other = store.clone();
    let threads: Vec<_> = (0..4)
        .map(|n| {
            let store = other.clone();
            std::thread::spawn(move || {
                for _ in 0..25 {
                    store.append("log.txt", &n.to_string()).expect("append");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("thread");
    }
    assert_eq!(store.read("log.txt").map(|text| text.len()), Ok(100));
}

#[test]
fn claim_messages_for_the_engine() {
    use pf_store::messages;
    assert_eq!(
        messages::determinism_violation("write", "findings.md", "ExecId(1)", "read", "ExecId(2)"),
        "store determinism violation: write on /_promptforge/store/findings.md by ExecId(1) conflicts with a read claim by ExecId(2)"
    );
    assert_eq!(
        messages::write_write_race("a.txt"),
        "write-write race on a.txt: another live identity holds a claim on it"
    );
    assert_eq!(
        messages::not_a_string("path", "integer"),
        "path must be a string, got integer"
    );
    assert_eq!(
        messages::not_an_integer("start", "number"),
        "start must be an integer, got number"
    );
    assert_eq!(pf_store::bound_from_float(2.0), Some(2));
}
