//! Symlinks planted in the store are never followed, whatever they point at.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg(unix)]

use std::os::unix::fs::symlink;
use std::path::Path;

use pf_store::{Store, StoreError, StoreErrorKind};

fn backend() -> StoreError {
    StoreError {
        message: "store backend failure".to_owned(),
        kind: StoreErrorKind::Backend,
    }
}

/// A store and, beside it, an "outside" directory holding a secret.
fn setup() -> (tempfile::TempDir, Store, std::path::PathBuf) {
    let base = tempfile::tempdir().expect("tempdir");
    let outside = base.path().join("outside");
    std::fs::create_dir(&outside).expect("outside dir");
    std::fs::write(outside.join("secret.txt"), "secret").expect("secret");
    let store = Store::open(base.path().join("store")).expect("open");
    (base, store, outside)
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn assert_outside_untouched(outside: &Path) {
    assert_eq!(listing(outside), vec!["secret.txt"]);
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).expect("read secret"),
        "secret"
    );
}

#[test]
fn directory_symlink_pointing_outside() {
    let (_base, store, outside) = setup();
    symlink(&outside, store.root().join("link")).expect("plant");
    assert_eq!(store.read("link/secret.txt"), Err(backend()));
    assert_eq!(store.read_range("link/secret.txt", 1, None), Err(backend()));
    assert_eq!(
        store.read_numbered("link/secret.txt", None, None),
        Err(backend())
    );
    assert_eq!(store.read_out("link/secret.txt", u64::MAX), Err(backend()));
    assert_eq!(store.write("link/new.txt", "x"), Err(backend()));
    assert_eq!(store.write("link/secret.txt", "x"), Err(backend()));
    assert_eq!(store.append("link/secret.txt", "x"), Err(backend()));
    assert_eq!(
        store.str_replace("link/secret.txt", "secret", "x"),
        Err(backend())
    );
    assert_eq!(store.delete("link/secret.txt"), Err(backend()));
    assert_eq!(store.exists("link/secret.txt"), Err(backend()));
    assert_eq!(store.exists("link"), Err(backend()));
    assert_eq!(store.write("link/deeper/new.txt", "x"), Err(backend()));
    assert_eq!(store.glob("**"), Ok(vec![]));
    assert_eq!(store.glob("link/*"), Err(backend()));
    assert_outside_untouched(&outside);
}

#[test]
fn file_symlink_pointing_outside() {
    let (_base, store, outside) = setup();
    symlink(outside.join("secret.txt"), store.root().join("f.txt")).expect("plant");
    assert_eq!(store.read("f.txt"), Err(backend()));
    assert_eq!(store.write("f.txt", "overwrite"), Err(backend()));
    assert_eq!(store.append("f.txt", "more"), Err(backend()));
    assert_eq!(store.str_replace("f.txt", "secret", "x"), Err(backend()));
    assert_eq!(store.delete("f.txt"), Err(backend()));
    assert_eq!(store.read_out("f.txt", u64::MAX), Err(backend()));
    let host_file = outside.join("secret.txt");
    assert_eq!(store.copy_in(&host_file, "f.txt"), Err(backend()));
    assert_eq!(store.glob("*"), Ok(vec![]));
    assert_outside_untouched(&outside);
    assert!(std::fs::symlink_metadata(store.root().join("f.txt"))
        .expect("still there")
        .file_type()
        .is_symlink());
}

#[test]
fn dangling_symlink_cannot_create_a_file_outside() {
    let (_base, store, outside) = setup();
    symlink(outside.join("created.txt"), store.root().join("new.txt")).expect("plant");
    assert_eq!(store.write("new.txt", "x"), Err(backend()));
    assert_eq!(store.append("new.txt", "x"), Err(backend()));
    assert_eq!(store.read("new.txt"), Err(backend()));
    assert_outside_untouched(&outside);
}

#[test]
fn nested_symlink_component_and_internal_symlinks() {
    let (_base, store, outside) = setup();
    store.write("a/real.txt", "real").expect("write");
    symlink(&outside, store.root().join("a").join("b")).expect("plant nested");
    assert_eq!(store.write("a/b/c/d.txt", "x"), Err(backend()));
    assert_eq!(store.read("a/b/secret.txt"), Err(backend()));
    // Even a symlink that stays inside the store is refused: one spelling per file.
    symlink(store.root().join("a"), store.root().join("alias")).expect("plant internal");
    assert_eq!(store.read("alias/real.txt"), Err(backend()));
    assert_eq!(store.glob("**"), Ok(vec!["a/real.txt".to_owned()]));
    // Deleting the real directory's file still works; the symlinks stay inert.
    store.delete("a/real.txt").expect("delete");
    assert_outside_untouched(&outside);
}

#[test]
fn a_fifo_in_the_store_does_not_hang_a_read() {
    let (_base, store, _outside) = setup();
    let fifo = store.root().join("pipe");
    let status = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !status.is_ok_and(|s| s.success()) {
        return; // No mkfifo on this system: nothing to check.
    }
    assert_eq!(store.read("pipe"), Err(backend()));
    assert_eq!(store.write("pipe", "x"), Err(backend()));
    assert_eq!(store.glob("*"), Ok(vec![]));
}

#[test]
fn a_symlinked_root_chosen_by_the_host_is_fine() {
    let base = tempfile::tempdir().expect("tempdir");
    let real = base.path().join("real");
    std::fs::create_dir(&real).expect("real");
    let alias = base.path().join("alias");
    symlink(&real, &alias).expect("alias");
    let store = Store::open(&alias).expect("open through the host's symlink");
    store.write("x.txt", "y").expect("write");
    assert_eq!(
        std::fs::read_to_string(real.join("x.txt")).expect("read"),
        "y"
    );
}
