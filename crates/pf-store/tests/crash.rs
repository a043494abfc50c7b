//! A writer killed with SIGKILL mid-write leaves every file old or new.
//!
//! The test re-runs this test binary as a child (selected by an environment
//! variable) that rewrites and appends large files in a loop, kills it at a
//! random-ish moment, and checks what is on disk.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#![cfg(unix)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pf_store::Store;

const CHILD_ENV: &str = "PF_STORE_CRASH_CHILD_DIR";
const FILES: usize = 3;
const RECORD: &str = "record-0123456789abcdef\n";

fn version(fill: u8, len: usize) -> String {
    let mut text = String::from_utf8(vec![fill; len]).expect("ascii");
    text.push_str("\nEND");
    text
}

/// Every complete content a file may hold.
fn versions() -> Vec<String> {
    vec![
        version(b'o', 1 << 20),
        version(b'a', 2 << 20),
        version(b'b', 3 << 20),
    ]
}

fn file_name(index: usize) -> String {
    format!("big/file-{index}.txt")
}

/// The child: runs only when the parent sets the variable; otherwise passes.
#[test]
fn crash_child_writer() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let store = Store::open(Path::new(&dir)).expect("child open");
    let all = versions();
    let mut round = 0usize;
    loop {
        for index in 0..FILES {
            let next = all.get(1 + (round + index) % 2).expect("version");
            store.write(&file_name(index), next).expect("child write");
        }
        store.append("log.txt", RECORD).expect("child append");
        if round == 0 {
            store.write("started", "yes").expect("child marker");
        }
        round += 1;
    }
}

#[test]
fn sigkill_mid_write_leaves_old_or_new_content() {
    let all = versions();
    let executable = std::env::current_exe().expect("current exe");
    let mut killed_mid_write = 0;
    // At least five kills; then more, until one lands inside a write, because
    // where a kill lands depends on how busy the machine is.
    let delays = [5u64, 37, 90, 160, 260, 11, 53, 120, 2, 23];
    for attempt in 0..60 {
        if attempt >= 5 && killed_mid_write > 0 {
            break;
        }
        let delay_ms = delays[attempt % delays.len()];
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        for index in 0..FILES {
            store.write(&file_name(index), &all[0]).expect("seed");
        }

        let mut child = Command::new(&executable)
            .args([
                "--exact",
                "crash_child_writer",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !dir.path().join("started").exists() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("child writer never started");
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("child writer exited early: {status}");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().expect("SIGKILL"); // std sends SIGKILL on Unix
        let status = child.wait().expect("wait");
        assert!(
            !status.success(),
            "attempt {attempt}: child should have been killed"
        );

        for index in 0..FILES {
            let text = store
                .read(&file_name(index))
                .expect("file must still be readable");
            assert!(
                all.contains(&text),
                "attempt {attempt}: file {index} is torn ({} bytes)",
                text.len()
            );
        }
        // A temporary file left behind shows the kill landed inside a write.
        let leftovers = std::fs::read_dir(dir.path().join("big"))
            .expect("read_dir")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".pf-tmp-"))
            .count();
        if leftovers > 0 {
            killed_mid_write += 1;
        }
        let log = store.read("log.txt").expect("log");
        assert!(!log.is_empty());
        assert_eq!(
            log.len() % RECORD.len(),
            0,
            "attempt {attempt}: torn append"
        );
        assert!(log.split_inclusive('\n').all(|line| line == RECORD));
        // Leftover temporary files never show up as store files.
        let mut expected: Vec<String> = (0..FILES).map(file_name).collect();
        expected.push("log.txt".to_owned());
        expected.push("started".to_owned());
        expected.sort();
        assert_eq!(store.glob("**").expect("glob"), expected);
    }
    assert!(
        killed_mid_write > 0,
        "no kill landed inside a write; the test proved nothing"
    );
}
