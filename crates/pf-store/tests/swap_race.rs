//! A concurrent process swapping a checked directory for a symlink, in a loop,
//! while the store writes and reads through it: nothing ever lands outside the
//! root and nothing outside is ever read (the store walks by open handles).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use pf_store::Store;

const SWAP_DIR_ENV: &str = "PF_STORE_SWAP_DIR";
const SECRET: &str = "outside secret";

/// The swapper, run as its own process by the race test (ignored when run
/// alone): `d` becomes a symlink to `outside`, then the real directory again,
/// as fast as it can, until killed.
#[test]
#[ignore = "run as a child process by the race test"]
fn swapper_process() {
    let Some(base) = std::env::var_os(SWAP_DIR_ENV).map(PathBuf::from) else {
        return;
    };
    let checked = base.join("store/d");
    let aside = base.join("store/d-aside");
    let outside = base.join("outside");
    loop {
        if std::fs::rename(&checked, &aside).is_ok() {
            let _ = std::os::unix::fs::symlink(&outside, &checked);
            std::thread::yield_now();
            let _ = std::fs::remove_file(&checked);
            let _ = std::fs::rename(&aside, &checked);
        }
        // Also swap a nested level: d/e for a symlink to outside.
        let nested = checked.join("e");
        let nested_aside = checked.join("e-aside");
        if std::fs::rename(&nested, &nested_aside).is_ok() {
            let _ = std::os::unix::fs::symlink(&outside, &nested);
            std::thread::yield_now();
            let _ = std::fs::remove_file(&nested);
            let _ = std::fs::rename(&nested_aside, &nested);
        }
    }
}

fn start_swapper(base: &Path) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "swapper_process", "--ignored", "--nocapture"])
        .env(SWAP_DIR_ENV, base)
        .spawn()
        .expect("start the swapper process")
}

fn outside_listing(outside: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(outside)
        .expect("read outside")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_directory_swapped_for_a_symlink_never_leads_outside() {
    let base = tempfile::tempdir().expect("tempdir");
    let outside = base.path().join("outside");
    std::fs::create_dir(&outside).expect("outside");
    // The same names inside and outside: any escape reads or changes these.
    for name in ["secret.txt", "x.txt", "e"] {
        if name == "e" {
            std::fs::create_dir(outside.join(name)).expect("outside e");
            std::fs::write(outside.join("e/secret.txt"), SECRET).expect("secret");
        } else {
            std::fs::write(outside.join(name), SECRET).expect("secret");
        }
    }
    let before = outside_listing(&outside);
    let store = Store::open(base.path().join("store")).expect("open");
    store.write("d/secret.txt", "inside").expect("seed");
    store
        .write("d/e/secret.txt", "inside")
        .expect("seed nested");

    let mut swapper = start_swapper(base.path());
    let mut tries = 0u32;
    let mut escapes = Vec::new();
    let started = Instant::now();
    // Enough operations that the old check-then-open walk escaped many times
    // (the issue counted 49 in 30,000); bounded in time for a slow machine.
    while tries < 30_000 && started.elapsed() < Duration::from_secs(20) {
        tries += 1;
        let read = match tries % 6 {
            0 => store.read("d/secret.txt"),
            1 => store.read("d/e/secret.txt"),
            2 => store.write("d/x.txt", "written").map(|()| String::new()),
            3 => store
                .write("d/e/x.txt", "written nested")
                .map(|()| String::new()),
            4 => store.append("d/e/secret.txt", "").map(|()| String::new()),
            _ => store.glob("d/**").map(|found| found.join(",")),
        };
        if let Ok(text) = read {
            if text.contains(SECRET) {
                escapes.push(format!("try {tries}: read {text:?}"));
            }
        }
    }
    swapper.kill().expect("stop the swapper");
    let _ = swapper.wait();

    assert!(tries >= 1_000, "only {tries} tries ran");
    assert_eq!(outside_listing(&outside), before, "a file was made outside");
    for name in ["secret.txt", "x.txt", "e/secret.txt"] {
        assert_eq!(
            std::fs::read_to_string(outside.join(name)).expect("outside file"),
            SECRET,
            "{name} outside was changed"
        );
    }
    assert!(outside_listing(&outside.join("e")) == vec!["secret.txt"]);
    assert!(
        escapes.is_empty(),
        "{} escapes in {tries} tries: {escapes:?}",
        escapes.len()
    );
    eprintln!("{tries} tries, no escape");
}
