//! The run log holds whole prompts, model replies and operator answers: its
//! database and directory are for their owner only.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Permission bits of group and others.
const SHARED_BITS: u32 = 0o077;

/// The database's companion files SQLite makes beside it (WAL mode).
const COMPANIONS: [&str; 2] = ["-wal", "-shm"];

/// Makes `dir` (and any missing parents) private to its owner: created 0700
/// when missing; when it exists and others may read it, tightened if this
/// user owns it. `Err` holds a one-line warning when it exists, others may
/// read it, and it is someone else's (left as it is).
pub fn secure_data_dir(dir: &Path) -> io::Result<Option<String>> {
    if !dir.is_dir() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        return Ok(None);
    }
    Ok(tighten(dir).err())
}

/// Creates the database file 0600 when missing (SQLite gives its `-wal` and
/// `-shm` files the database's permissions), and tightens an existing
/// database and its companions that others may read, when this user owns
/// them. Problems are left to SQLite's open, which names them as before (a
/// read-only or immutable database, a directory that cannot be written).
pub(crate) fn secure_database(path: &Path) {
    // Only a missing file is made here: an existing one is never opened for
    // writing by anything but SQLite.
    let _ = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    for file in std::iter::once(path.to_path_buf()).chain(companions(path)) {
        // Someone else's file stays as it is; SQLite then says whether it can use it.
        let _ = tighten(&file);
    }
}

fn companions(path: &Path) -> impl Iterator<Item = PathBuf> + '_ {
    COMPANIONS.iter().map(move |suffix| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    })
}

/// Removes group and other permission bits from `path` when it has any and
/// this user owns it; `Err` with a warning when it has some and is not ours.
fn tighten(path: &Path) -> Result<(), String> {
    let Ok(metadata) = fs::symlink_metadata(path) else {
        return Ok(());
    };
    let mode = metadata.mode() & 0o7777;
    if mode & SHARED_BITS == 0 {
        return Ok(());
    }
    let owner = metadata.uid();
    if owner == rustix::process::geteuid().as_raw() {
        let private = fs::Permissions::from_mode(mode & !SHARED_BITS);
        if fs::set_permissions(path, private).is_ok() {
            return Ok(());
        }
    }
    Err(format!(
        "{} can be read by other users (mode {:o}, owner uid {owner}) and holds every logged prompt and reply; make it private with `chmod go-rwx {}`",
        path.display(),
        mode,
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).map(|m| m.mode() & 0o777).unwrap_or(0)
    }

    #[test]
    fn a_new_directory_and_database_are_private() {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = root.path().join("a/b");
        assert_eq!(secure_data_dir(&dir).ok(), Some(None));
        assert_eq!(mode(&dir), 0o700);
        let db = dir.join("runs.db");
        secure_database(&db);
        assert_eq!(mode(&db), 0o600);
    }

    #[test]
    fn an_open_directory_and_database_of_ours_are_tightened() {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let dir = root.path().join("data");
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
        for (bits, file) in [
            (0o755, "runs.db"),
            (0o644, "runs.db-wal"),
            (0o666, "runs.db-shm"),
        ] {
            fs::write(dir.join(file), "").unwrap_or_else(|e| panic!("{e}"));
            fs::set_permissions(dir.join(file), fs::Permissions::from_mode(bits))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(secure_data_dir(&dir).ok(), Some(None));
        assert_eq!(mode(&dir), 0o700);
        secure_database(&dir.join("runs.db"));
        assert_eq!(mode(&dir.join("runs.db")), 0o700);
        assert_eq!(mode(&dir.join("runs.db-wal")), 0o600);
        assert_eq!(mode(&dir.join("runs.db-shm")), 0o600);
    }
}
