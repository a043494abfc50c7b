//! Property: every accepted path resolves inside the store root.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Component, Path};

use proptest::prelude::*;

use pf_store::{check_path, Store};

fn path_strategy() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("/".to_owned()),
        Just(".".to_owned()),
        Just("..".to_owned()),
        Just("\\".to_owned()),
        Just(" ".to_owned()),
        Just("\0".to_owned()),
        Just("\n".to_owned()),
        Just("con".to_owned()),
        Just("LPT1".to_owned()),
        Just("é".to_owned()),
        Just("~".to_owned()),
        Just(":".to_owned()),
        "[a-c]{1,3}",
        "\\PC{1,2}",
    ];
    let noisy = proptest::collection::vec(piece, 1..12).prop_map(|pieces| pieces.concat());
    // Mostly-valid paths, some with segments too long for one filesystem name.
    let segment = prop_oneof![
        4 => "[a-zA-Z0-9 ._é-]{1,12}",
        1 => "[a-zé]{200,400}",
        1 => Just("..".to_owned()),
    ];
    let structured =
        proptest::collection::vec(segment, 1..6).prop_map(|segments| segments.join("/"));
    prop_oneof![noisy, structured]
}

fn files_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let kind = entry.file_type().expect("file type");
        if kind.is_dir() {
            files_under(&entry.path(), out);
        } else {
            out.push(entry.path());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn accepted_paths_stay_inside_the_root(path in path_strategy()) {
        if check_path(&path).is_err() {
            return Ok(());
        }
        // Lexically: only plain names, never a root, `.` or `..`.
        prop_assert!(Path::new(&path).components().all(|c| matches!(c, Component::Normal(_))));
        prop_assert!(!path.bytes().any(|b| b == 0));

        // And for real: the write lands under the root, nowhere else.
        let base = tempfile::tempdir().expect("tempdir");
        let store = Store::open(base.path().join("store")).expect("open");
        store.write(&path, "marker").expect("accepted path must be writable");
        let mut all = Vec::new();
        files_under(base.path(), &mut all);
        prop_assert_eq!(all.len(), 1);
        prop_assert!(all[0].starts_with(store.root()));
        prop_assert_eq!(store.read(&path).expect("read back"), "marker");
        prop_assert_eq!(store.glob("**").expect("glob"), vec![path.clone()]);
        store.delete(&path).expect("delete");
        prop_assert_eq!(store.exists(&path).expect("exists"), false);
    }

    #[test]
    fn rejected_paths_touch_nothing(path in path_strategy()) {
        if check_path(&path).is_ok() {
            return Ok(());
        }
        let base = tempfile::tempdir().expect("tempdir");
        let store = Store::open(base.path().join("store")).expect("open");
        prop_assert!(store.write(&path, "x").is_err());
        prop_assert!(store.append(&path, "x").is_err());
        let mut all = Vec::new();
        files_under(base.path(), &mut all);
        prop_assert!(all.is_empty());
        prop_assert!(std::fs::read_dir(store.root()).expect("read_dir").next().is_none());
    }
}
