//! The run's store, backed by a directory.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::{messages, StoreError, StoreErrorKind};
use crate::fault::{self, FaultPoint};
use crate::glob::GlobPattern;
use crate::lines::{self, LineRangeRejection};
use crate::path::{
    check_path, physical_names, validate_path, PhysicalName, CONTINUATION_MARK, MAX_PATH_BYTES,
};

/// Prefix of the temporary files atomic writes go through. With the
/// continuation mark at the end, no valid store name can ever look like one.
const TEMP_PREFIX: &str = ".pf-tmp-";

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The run's store: a directory whose files are addressed by logical store paths.
///
/// Every method validates its path first and touches nothing when the path is
/// refused. Calls are synchronous; the Engine runs them on a blocking thread.
/// Clones share the directory and the lock that serializes changes, so an
/// `append` or `str_replace` never loses a concurrent change made through
/// another clone.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    mutation: Arc<Mutex<()>>,
}

/// What a logical path currently is in the store directory.
enum Probe {
    /// Absent; `under_file` when a parent component is a file.
    Missing {
        under_file: bool,
    },
    File(PathBuf),
    Dir(PathBuf),
    /// A FIFO, socket or device: never something the store made.
    Other,
}

impl Store {
    /// Opens the store at `root`, creating the directory when absent.
    ///
    /// A failure here happens outside any `store.*` call: the run fails with
    /// kind `Store` and the message `store operation failed`.
    pub fn open(root: impl AsRef<Path>) -> Result<Store, StoreError> {
        let root = root.as_ref();
        let open_failure = |detail: &dyn std::fmt::Display| {
            tracing::debug!(root = %root.display(), %detail, "cannot open the store");
            StoreError {
                message: messages::STORE_OPERATION_FAILED.to_owned(),
                kind: StoreErrorKind::Backend,
            }
        };
        fs::create_dir_all(root).map_err(|e| open_failure(&e))?;
        // The host chose the root, so symlinks above it are trusted and resolved
        // once here; only components inside the store are refused.
        let root = fs::canonicalize(root).map_err(|e| open_failure(&e))?;
        let metadata = fs::metadata(&root).map_err(|e| open_failure(&e))?;
        if !metadata.is_dir() {
            return Err(open_failure(&"the store root is not a directory"));
        }
        Ok(Store {
            root,
            mutation: Arc::default(),
        })
    }

    /// The store directory (canonical).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `store.read(path)`: the whole file, verbatim.
    pub fn read(&self, path: &str) -> Result<String, StoreError> {
        validate_path(path)?;
        self.load_text(path, "read")
    }

    /// `store.read(path, start, end)`: lines `start..=end` (1-based, `end`
    /// optional), joined with `\n`, no trailing newline.
    pub fn read_range(
        &self,
        path: &str,
        start: i64,
        end: Option<i64>,
    ) -> Result<String, StoreError> {
        self.read_lines(path, Some(start), end)
    }

    /// `store.read(path, start?, end?)` with both bounds optional, exactly as
    /// Lua passes them: no bounds reads the whole file verbatim, and an `end`
    /// without a `start` fails before the file is read.
    pub fn read_lines(
        &self,
        path: &str,
        start: Option<i64>,
        end: Option<i64>,
    ) -> Result<String, StoreError> {
        validate_path(path)?;
        match (start, end) {
            (None, None) => self.load_text(path, "read"),
            (None, Some(_)) => Err(range_error(path, LineRangeRejection::StartRequired)),
            (Some(start), end) => {
                let text = self.load_text(path, "read")?;
                let slice = lines::select(&text, start, end).map_err(|r| range_error(path, r))?;
                Ok(lines::join_plain(&slice))
            }
        }
    }

    /// `store.read_numbered(path, start?, end?)`: `N| text` lines with the
    /// file's own line numbers, right-aligned to the widest number shown.
    pub fn read_numbered(
        &self,
        path: &str,
        start: Option<i64>,
        end: Option<i64>,
    ) -> Result<String, StoreError> {
        validate_path(path)?;
        match (start, end) {
            (None, None) => {
                let text = self.load_text(path, "read_numbered")?;
                Ok(lines::join_numbered(&lines::all(&text)))
            }
            (None, Some(_)) => Err(range_error(path, LineRangeRejection::StartRequired)),
            (Some(start), end) => {
                let text = self.load_text(path, "read_numbered")?;
                let slice = lines::select(&text, start, end).map_err(|r| range_error(path, r))?;
                Ok(lines::join_numbered(&slice))
            }
        }
    }

    /// `store.write(path, contents)`: creates or replaces the file atomically,
    /// creating missing parent directories.
    pub fn write(&self, path: &str, contents: &str) -> Result<(), StoreError> {
        self.write_bytes(path, contents.as_bytes(), "write")
    }

    /// `store.append(path, contents)`: adds to the end, creating the file.
    ///
    /// Done as read + atomic replace rather than `O_APPEND`, so a crash or a
    /// cancel mid-append leaves the old text or the new text, never a torn tail.
    pub fn append(&self, path: &str, contents: &str) -> Result<(), StoreError> {
        validate_path(path)?;
        let _guard = self.lock();
        let names = physical_names(path);
        let mut combined = match self.probe(&names, "append")? {
            Probe::File(full) => {
                read_regular_file(&full).map_err(|e| StoreError::backend("append", &e))?
            }
            Probe::Missing { under_file: false } => Vec::new(),
            Probe::Missing { under_file: true } | Probe::Dir(_) | Probe::Other => {
                return Err(StoreError::backend("append", &"the path is not a file"))
            }
        };
        combined.extend_from_slice(contents.as_bytes());
        self.replace(&names, &combined, "append")
    }

    /// `store.str_replace(path, old, new)`: replaces the one occurrence of `old`.
    ///
    /// Checks in order: path, empty anchor, missing file, no match, several
    /// matches (non-overlapping). Any failure leaves the file unchanged.
    pub fn str_replace(&self, path: &str, old: &str, new: &str) -> Result<(), StoreError> {
        validate_path(path)?;
        if old.is_empty() {
            return Err(StoreError::user(messages::empty_anchor(path)));
        }
        let _guard = self.lock();
        let text = self.load_text(path, "str_replace")?;
        match text.matches(old).count() {
            0 => Err(StoreError::user(messages::anchor_not_found(path))),
            1 => {
                let replaced = text.replacen(old, new, 1);
                self.replace(&physical_names(path), replaced.as_bytes(), "str_replace")
            }
            count => Err(StoreError::user(messages::ambiguous_anchor(path, count))),
        }
    }

    /// `store.delete(path)`: removes a file or an empty directory; a missing
    /// path succeeds. A directory that still holds files is a backend failure
    /// and stays as it was.
    pub fn delete(&self, path: &str) -> Result<(), StoreError> {
        validate_path(path)?;
        let _guard = self.lock();
        let names = physical_names(path);
        match self.probe(&names, "delete")? {
            Probe::Missing { .. } => return Ok(()),
            Probe::File(full) => {
                fs::remove_file(&full).map_err(|e| StoreError::backend("delete", &e))?;
            }
            Probe::Dir(full) => {
                remove_leftover_temps(&full);
                fs::remove_dir(&full).map_err(|e| StoreError::backend("delete", &e))?;
            }
            Probe::Other => return Err(StoreError::backend("delete", &"not a file or directory")),
        }
        self.prune_continuations(&names);
        Ok(())
    }

    /// `store.exists(path)`: true for a file or a directory.
    pub fn exists(&self, path: &str) -> Result<bool, StoreError> {
        validate_path(path)?;
        match self.probe(&physical_names(path), "exists")? {
            Probe::Missing { .. } => Ok(false),
            Probe::File(_) | Probe::Dir(_) | Probe::Other => Ok(true),
        }
    }

    /// `store.glob(pattern)`: the matching files (never directories), sorted.
    pub fn glob(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        let pattern = GlobPattern::new(pattern)?;
        let prefix = pattern.literal_prefix().join("/");
        let mut walk = Walk {
            pattern: &pattern,
            max_depth: pattern.max_depth(),
            found: Vec::new(),
        };
        if prefix.is_empty() {
            walk.visit(&self.root, "", "", &mut Vec::new(), 0)?;
        } else {
            if check_path(&prefix).is_err() {
                // No stored file lies under a directory no valid path can name.
                return Ok(Vec::new());
            }
            let names = physical_names(&prefix);
            if let Probe::Dir(full) = self.probe(&names, "glob")? {
                let mut physical: Vec<String> = names.into_iter().map(|n| n.name).collect();
                let depth = prefix.split('/').count();
                walk.visit(&full, &prefix, "", &mut physical, depth)?;
            }
        }
        let mut found = walk.found;
        found.sort_unstable();
        found.dedup();
        Ok(found)
    }

    /// Places a host file into the store, for a frontmatter `input:` declaration.
    /// The host file is read as bytes (it may be a symlink on the host side; the
    /// host chose it). A host read failure is kind `Host` with the message
    /// `cannot read input file {host_path}: {detail}`.
    pub fn copy_in(&self, from_file: &Path, store_path: &str) -> Result<(), StoreError> {
        validate_path(store_path)?;
        let bytes = fs::read(from_file).map_err(|e| {
            StoreError::host(messages::input_file_unreadable(
                &from_file.display().to_string(),
                &e.to_string(),
            ))
        })?;
        self.write_bytes(store_path, &bytes, "copy_in")
    }

    /// Collects a store file's bytes, for a frontmatter `output:` declaration.
    /// A file the run never wrote is kind `Host` with the message
    /// `output file not found: {path}`.
    pub fn read_out(&self, store_path: &str) -> Result<Vec<u8>, StoreError> {
        validate_path(store_path)?;
        self.load(store_path, "read_out")?
            .ok_or_else(|| StoreError::host(messages::output_file_missing(store_path)))
    }

    // -- internals ---------------------------------------------------------

    fn lock(&self) -> MutexGuard<'_, ()> {
        // The guarded data is `()`, so a panic elsewhere leaves nothing torn.
        self.mutation.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Walks the components from the root without following any symlink: a
    /// symlink anywhere on the way is refused as a backend failure.
    fn probe(&self, names: &[PhysicalName], operation: &str) -> Result<Probe, StoreError> {
        let mut current = self.root.clone();
        let last = names.len().saturating_sub(1);
        for (index, name) in names.iter().enumerate() {
            current.push(&name.name);
            let metadata = match fs::symlink_metadata(&current) {
                Ok(metadata) => metadata,
                Err(error) if error.kind() == io::ErrorKind::NotFound => {
                    return Ok(Probe::Missing { under_file: false })
                }
                Err(error) => return Err(StoreError::backend(operation, &error)),
            };
            let file_type = metadata.file_type();
            if file_type.is_symlink() {
                return Err(StoreError::backend(
                    operation,
                    &format!("refusing to follow the symlink {}", current.display()),
                ));
            }
            if index < last {
                if file_type.is_dir() {
                    continue;
                }
                if file_type.is_file() {
                    return Ok(Probe::Missing { under_file: true });
                }
                return Ok(Probe::Other);
            }
            return Ok(if file_type.is_dir() {
                Probe::Dir(current)
            } else if file_type.is_file() {
                Probe::File(current)
            } else {
                Probe::Other
            });
        }
        Ok(Probe::Dir(current))
    }

    /// The file's bytes, `None` when it does not exist.
    fn load(&self, path: &str, operation: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self.probe(&physical_names(path), operation)? {
            Probe::Missing { .. } => Ok(None),
            Probe::File(full) => read_regular_file(&full)
                .map(Some)
                .map_err(|e| StoreError::backend(operation, &e)),
            // A directory used as a file is a backend failure, not "not found".
            Probe::Dir(_) | Probe::Other => {
                Err(StoreError::backend(operation, &"the path is not a file"))
            }
        }
    }

    /// The file's text; a missing file is `file not found`, non-UTF-8 content
    /// a backend failure (the store holds text).
    fn load_text(&self, path: &str, operation: &str) -> Result<String, StoreError> {
        let bytes = self
            .load(path, operation)?
            .ok_or_else(|| StoreError::user(messages::file_not_found(path)))?;
        String::from_utf8(bytes).map_err(|e| StoreError::backend(operation, &e))
    }

    fn write_bytes(&self, path: &str, contents: &[u8], operation: &str) -> Result<(), StoreError> {
        validate_path(path)?;
        let _guard = self.lock();
        let names = physical_names(path);
        match self.probe(&names, operation)? {
            Probe::File(_) | Probe::Missing { under_file: false } => {
                self.replace(&names, contents, operation)
            }
            Probe::Missing { under_file: true } | Probe::Dir(_) | Probe::Other => {
                Err(StoreError::backend(operation, &"the path is not a file"))
            }
        }
    }

    /// Creates the parents, then atomically puts `contents` at the path.
    fn replace(
        &self,
        names: &[PhysicalName],
        contents: &[u8],
        operation: &str,
    ) -> Result<(), StoreError> {
        let Some((file_name, parents)) = names.split_last() else {
            return Err(StoreError::backend(operation, &"empty path"));
        };
        let directory = self.ensure_directories(parents, operation)?;
        atomic_replace(&directory, &file_name.name, contents)
            .map_err(|e| StoreError::backend(operation, &e))
    }

    /// Makes every component a real directory (never a symlink), creating the
    /// missing ones, and returns the innermost.
    fn ensure_directories(
        &self,
        names: &[PhysicalName],
        operation: &str,
    ) -> Result<PathBuf, StoreError> {
        let mut current = self.root.clone();
        for name in names {
            current.push(&name.name);
            match fs::symlink_metadata(&current) {
                Ok(metadata) if metadata.file_type().is_dir() => continue,
                Ok(_) => {
                    return Err(StoreError::backend(
                        operation,
                        &"a parent is not a directory",
                    ))
                }
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(StoreError::backend(operation, &error)),
            }
            if let Err(error) = fs::create_dir(&current) {
                // Someone may have made it meanwhile; accept only a real directory.
                let is_directory = fs::symlink_metadata(&current)
                    .map(|metadata| metadata.file_type().is_dir())
                    .unwrap_or(false);
                if error.kind() != io::ErrorKind::AlreadyExists || !is_directory {
                    return Err(StoreError::backend(operation, &error));
                }
            }
        }
        Ok(current)
    }

    /// After a delete, removes the continuation directories that only held
    /// the deleted entry of an over-long final segment.
    fn prune_continuations(&self, names: &[PhysicalName]) {
        let Some((_, parents)) = names.split_last() else {
            return;
        };
        let trailing = parents.iter().rev().take_while(|n| n.continuation).count();
        let keep = parents.len() - trailing;
        for depth in (keep..parents.len()).rev() {
            let mut directory = self.root.clone();
            for name in parents.iter().take(depth + 1) {
                directory.push(&name.name);
            }
            if fs::remove_dir(&directory).is_err() {
                break;
            }
        }
    }
}

fn range_error(path: &str, rejection: LineRangeRejection) -> StoreError {
    StoreError::user(messages::invalid_line_range(path, rejection.reason()))
}

/// Open flags that refuse a symlink as the final component and never block
/// on a FIFO planted in the store.
fn no_follow(options: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    options
}

fn read_regular_file(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = no_follow(OpenOptions::new().read(true)).open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Writes `contents` to a fresh temporary file in `directory`, syncs it, and
/// renames it over `file_name`: readers and crashes see the old file or the
/// new one, never a mix. On failure the temporary file is removed.
fn atomic_replace(directory: &Path, file_name: &str, contents: &[u8]) -> io::Result<()> {
    let temp_name = format!(
        "{TEMP_PREFIX}{}-{}{CONTINUATION_MARK}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let temp_path = directory.join(temp_name);
    let result = write_synced(&temp_path, contents).and_then(|()| {
        fault::hit(FaultPoint::BeforeRename)?;
        fs::rename(&temp_path, directory.join(file_name))
    });
    if result.is_err() {
        // Best effort: the temporary name is invisible to every store call anyway.
        let _ = fs::remove_file(&temp_path);
        return result;
    }
    // Persist the rename itself; some filesystems cannot sync a directory,
    // and the data is already safe in the renamed file, so this is best effort.
    if let Ok(handle) = File::open(directory) {
        let _ = handle.sync_all();
    }
    Ok(())
}

fn write_synced(temp_path: &Path, contents: &[u8]) -> io::Result<()> {
    let mut file = no_follow(OpenOptions::new().write(true).create_new(true)).open(temp_path)?;
    let (head, tail) = contents.split_at(contents.len() / 2);
    file.write_all(head)?;
    fault::hit(FaultPoint::MidWrite)?;
    file.write_all(tail)?;
    file.sync_all()
}

/// Removes temporary files a killed writer left behind in `directory`, so an
/// otherwise empty directory can be deleted. Called with the store lock held.
fn remove_leftover_temps(directory: &Path) {
    let Ok(entries) = fs::read_dir(directory) else {
        return;
    };
    for entry in entries.flatten() {
        let is_file = entry.file_type().map(|t| t.is_file()).unwrap_or(false);
        let name = entry.file_name();
        let is_temp = name
            .to_str()
            .is_some_and(|n| n.starts_with(TEMP_PREFIX) && n.ends_with(CONTINUATION_MARK));
        if is_file && is_temp {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// A directory walk for `glob`.
struct Walk<'a> {
    pattern: &'a GlobPattern,
    max_depth: Option<usize>,
    found: Vec<String>,
}

impl Walk<'_> {
    /// Visits `directory`, whose logical path is `logical_dir` (`depth`
    /// segments). `partial` is the part of an over-long segment gathered from
    /// continuation directories so far; `physical` the names walked from the root.
    fn visit(
        &mut self,
        directory: &Path,
        logical_dir: &str,
        partial: &str,
        physical: &mut Vec<String>,
        depth: usize,
    ) -> Result<(), StoreError> {
        let entries = fs::read_dir(directory).map_err(|e| StoreError::backend("glob", &e))?;
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::backend("glob", &e))?;
            let file_type = entry
                .file_type()
                .map_err(|e| StoreError::backend("glob", &e))?;
            if file_type.is_symlink() {
                continue;
            }
            let os_name = entry.file_name();
            let Some(name) = os_name.to_str() else {
                continue; // Not UTF-8: no store path can name it.
            };
            if let Some(chunk) = name.strip_suffix(CONTINUATION_MARK) {
                // A continuation directory, or a temporary file: never a file of its own.
                if file_type.is_dir()
                    && logical_dir.len() + 1 + partial.len() + chunk.len() <= MAX_PATH_BYTES
                {
                    physical.push(name.to_owned());
                    let gathered = format!("{partial}{chunk}");
                    let result = self.visit(&entry.path(), logical_dir, &gathered, physical, depth);
                    physical.pop();
                    result?;
                }
                continue;
            }
            let segment = format!("{partial}{name}");
            let logical = if logical_dir.is_empty() {
                segment
            } else {
                format!("{logical_dir}/{segment}")
            };
            if logical.len() > MAX_PATH_BYTES {
                continue;
            }
            if file_type.is_dir() {
                let deeper_can_match = self.max_depth.is_none_or(|max| depth + 2 <= max);
                if deeper_can_match {
                    physical.push(name.to_owned());
                    let result = self.visit(&entry.path(), &logical, "", physical, depth + 1);
                    physical.pop();
                    result?;
                }
            } else if file_type.is_file() && self.is_listable(&logical, physical, name) {
                self.found.push(logical);
            }
        }
        Ok(())
    }

    /// A file is listed only under the one spelling every other store call
    /// would map back to the same entry, and when the pattern matches.
    fn is_listable(&self, logical: &str, physical: &[String], name: &str) -> bool {
        if check_path(logical).is_err() || !self.pattern.matches(logical) {
            return false;
        }
        let expected = physical_names(logical);
        expected.len() == physical.len() + 1
            && expected.iter().map(|n| n.name.as_str()).eq(physical
                .iter()
                .map(String::as_str)
                .chain(std::iter::once(name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let store = Store::open(dir.path()).unwrap_or_else(|e| panic!("open: {e}"));
        (dir, store)
    }

    fn entries(directory: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(directory)
            .unwrap_or_else(|e| panic!("read_dir: {e}"))
            .filter_map(|entry| entry.ok())
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    fn backend_failure() -> StoreError {
        StoreError {
            message: "store backend failure".to_owned(),
            kind: StoreErrorKind::Backend,
        }
    }

    #[test]
    fn failure_before_rename_keeps_the_old_text_and_no_temp_file() {
        let (_dir, store) = fresh();
        assert_eq!(store.write("notes/a.txt", "old"), Ok(()));
        fault::arm(FaultPoint::BeforeRename);
        assert_eq!(
            store.write("notes/a.txt", "new text"),
            Err(backend_failure())
        );
        assert_eq!(store.read("notes/a.txt").as_deref(), Ok("old"));
        assert_eq!(entries(&store.root().join("notes")), vec!["a.txt"]);
    }

    #[test]
    fn failure_mid_write_keeps_the_old_text_for_every_change() {
        let (_dir, store) = fresh();
        assert_eq!(store.write("f.txt", "the quick brown fox"), Ok(()));

        fault::arm(FaultPoint::MidWrite);
        assert_eq!(store.write("f.txt", "replacement"), Err(backend_failure()));
        fault::arm(FaultPoint::MidWrite);
        assert_eq!(store.append("f.txt", " jumps"), Err(backend_failure()));
        fault::arm(FaultPoint::BeforeRename);
        assert_eq!(store.append("f.txt", " jumps"), Err(backend_failure()));
        fault::arm(FaultPoint::MidWrite);
        assert_eq!(
            store.str_replace("f.txt", "quick", "slow"),
            Err(backend_failure())
        );
        fault::arm(FaultPoint::BeforeRename);
        assert_eq!(
            store.str_replace("f.txt", "quick", "slow"),
            Err(backend_failure())
        );

        assert_eq!(store.read("f.txt").as_deref(), Ok("the quick brown fox"));
        assert_eq!(entries(store.root()), vec!["f.txt"]);
        // And the store still works afterwards.
        assert_eq!(store.append("f.txt", "!"), Ok(()));
        assert_eq!(store.read("f.txt").as_deref(), Ok("the quick brown fox!"));
    }

    #[test]
    fn failed_first_write_leaves_no_file() {
        let (_dir, store) = fresh();
        fault::arm(FaultPoint::BeforeRename);
        assert_eq!(store.write("new.txt", "x"), Err(backend_failure()));
        assert_eq!(store.exists("new.txt"), Ok(false));
        assert!(entries(store.root()).is_empty());
    }

    #[test]
    fn leftover_temp_files_are_invisible_and_do_not_block_directory_delete() {
        let (_dir, store) = fresh();
        assert_eq!(store.write("d/a.txt", "x"), Ok(()));
        // What a writer killed before its rename leaves behind.
        let leftover = store.root().join("d").join(".pf-tmp-1-1.");
        fs::write(&leftover, "partial").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(store.glob("**"), Ok(vec!["d/a.txt".to_owned()]));
        assert_eq!(store.delete("d/a.txt"), Ok(()));
        assert_eq!(store.delete("d"), Ok(()));
        assert_eq!(store.exists("d"), Ok(false));
    }
}
