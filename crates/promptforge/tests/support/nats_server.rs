//! Where Debian's `nats-server` is (tests/tools/setup.sh nats installs it),
//! for the tests that start one (queue.rs, help_examples.rs).

use std::path::PathBuf;
use std::process::Command;

/// The `nats-server` binary, or `None` when it is not installed.
pub fn nats_server_bin() -> Option<PathBuf> {
    ["/usr/sbin/nats-server", "/usr/bin/nats-server"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .or_else(|| {
            let out = Command::new("sh")
                .args(["-c", "command -v nats-server"])
                .output()
                .ok()?;
            let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (!path.is_empty()).then(|| PathBuf::from(path))
        })
}
