//! The run's store, backed by a directory it holds open.
//!
//! Every operation works relative to an open handle of the store root and
//! walks one name at a time (`openat` with `O_NOFOLLOW | O_DIRECTORY`), each
//! step relative to the handle of the directory before it; nothing is ever
//! resolved again by a full path. A symlink anywhere (even one a concurrent
//! process swaps in for a checked directory between two steps) ends the walk
//! with `ELOOP`/`ENOTDIR` instead of leading outside the root. Names are single
//! path components (no `/`, `.` or `..`: [`check_path`] refuses them before
//! any I/O), so a step can only ever reach an entry of the directory it holds.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

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
/// Clones share the directory handle and the lock that serializes changes, so
/// an `append` or `str_replace` never loses a concurrent change made through
/// another clone.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    /// The root, opened once; every operation starts from this handle.
    root_dir: Arc<OwnedFd>,
    mutation: Arc<Mutex<()>>,
}

/// What a logical path currently is in the store directory. Found entries
/// come with the open handle of their directory and their name in it.
enum Probe {
    /// Absent; `under_file` when a parent component is a file.
    Missing {
        under_file: bool,
    },
    File(Entry),
    Dir(Entry),
    /// A FIFO, socket or device: never something the store made.
    Other,
}

/// An entry as its directory's open handle and its name there.
struct Entry {
    parent: Handle,
    name: String,
}

/// A directory handle: the shared root or one opened on the way down.
enum Handle {
    Root(Arc<OwnedFd>),
    Opened(OwnedFd),
}

impl AsFd for Handle {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Handle::Root(fd) => fd.as_fd(),
            Handle::Opened(fd) => fd.as_fd(),
        }
    }
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
        std::fs::create_dir_all(root).map_err(|e| open_failure(&e))?;
        // The host chose the root, so symlinks above it are trusted and resolved
        // once here; only components inside the store are refused.
        let root = std::fs::canonicalize(root).map_err(|e| open_failure(&e))?;
        let root_dir = rustix::fs::open(
            &root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| open_failure(&io::Error::from(e)))?;
        Ok(Store {
            root,
            root_dir: Arc::new(root_dir),
            mutation: Arc::default(),
        })
    }

    /// The store directory (canonical), as it was named when opened.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `store.read(path)`: the whole file, verbatim.
    pub fn read(&self, path: &str) -> Result<String, StoreError> {
        validate_path(path)?;
        self.load_text(path, "read")
    }

    /// The size in bytes of the regular file at `path`, `None` when there is
    /// none (or the path is not one a store operation accepts): what an
    /// operation that loads the whole file (a read, an append, a replace)
    /// holds in memory, so a caller can refuse one it could not hold.
    pub fn file_size(&self, path: &str) -> Result<Option<u64>, StoreError> {
        if validate_path(path).is_err() {
            return Ok(None);
        }
        match self.probe(&physical_names(path), "read")? {
            Probe::File(entry) => {
                let file = open_file_at(&entry.parent, &entry.name, OFlags::RDONLY, Mode::empty())
                    .map_err(|e| StoreError::backend("read", &e))?;
                let metadata = file
                    .metadata()
                    .map_err(|e| StoreError::backend("read", &e))?;
                Ok(metadata.is_file().then_some(metadata.len()))
            }
            _ => Ok(None),
        }
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
            Probe::File(entry) => {
                read_regular_file(&entry).map_err(|e| StoreError::backend("append", &e))?
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
            Probe::File(entry) => {
                rustix::fs::unlinkat(&entry.parent, entry.name.as_str(), AtFlags::empty())
                    .map_err(|e| StoreError::backend("delete", &io::Error::from(e)))?;
            }
            Probe::Dir(entry) => {
                if let Ok(directory) = open_directory(&entry.parent, &entry.name) {
                    remove_leftover_temps(&directory);
                }
                rustix::fs::unlinkat(&entry.parent, entry.name.as_str(), AtFlags::REMOVEDIR)
                    .map_err(|e| StoreError::backend("delete", &io::Error::from(e)))?;
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
            walk.visit(self.root_dir.as_fd(), "", "", &mut Vec::new(), 0)?;
        } else {
            if check_path(&prefix).is_err() {
                // No stored file lies under a directory no valid path can name.
                return Ok(Vec::new());
            }
            let names = physical_names(&prefix);
            if let Probe::Dir(entry) = self.probe(&names, "glob")? {
                let directory = open_directory(&entry.parent, &entry.name)
                    .map_err(|e| StoreError::backend("glob", &e))?;
                let mut physical: Vec<String> = names.into_iter().map(|n| n.name).collect();
                let depth = prefix.split('/').count();
                walk.visit(directory.as_fd(), &prefix, "", &mut physical, depth)?;
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
        let bytes = std::fs::read(from_file).map_err(|e| {
            StoreError::host(messages::input_file_unreadable(
                &from_file.display().to_string(),
                &e.to_string(),
            ))
        })?;
        self.write_bytes(store_path, &bytes, "copy_in")
    }

    /// Collects a store file's bytes, for a frontmatter `output:` declaration.
    /// A file the run never wrote is kind `Host` with the message
    /// `output file not found: {path}`; one over `max_bytes` (a run's appends
    /// can grow a file without end) is kind `Host` too, naming the file and
    /// the limit, and is never loaded.
    pub fn read_out(&self, store_path: &str, max_bytes: u64) -> Result<Vec<u8>, StoreError> {
        validate_path(store_path)?;
        let operation = "read_out";
        let entry = match self.probe(&physical_names(store_path), operation)? {
            Probe::Missing { .. } => {
                return Err(StoreError::host(messages::output_file_missing(store_path)))
            }
            Probe::File(entry) => entry,
            Probe::Dir(_) | Probe::Other => {
                return Err(StoreError::backend(operation, &"the path is not a file"))
            }
        };
        let mut file = open_file_at(&entry.parent, &entry.name, OFlags::RDONLY, Mode::empty())
            .map_err(|e| StoreError::backend(operation, &e))?;
        let metadata = file
            .metadata()
            .map_err(|e| StoreError::backend(operation, &e))?;
        if !metadata.is_file() {
            return Err(StoreError::backend(operation, &"not a regular file"));
        }
        let too_big = |size: u64| {
            StoreError::host(messages::output_file_too_large(store_path, size, max_bytes))
        };
        if metadata.len() > max_bytes {
            return Err(too_big(metadata.len()));
        }
        // The file may still grow while it is read (another writer): read no
        // more than the limit and one byte.
        let mut bytes = Vec::new();
        (&mut file)
            .take(max_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(|e| StoreError::backend(operation, &e))?;
        if bytes.len() as u64 > max_bytes {
            return Err(too_big(bytes.len() as u64));
        }
        Ok(bytes)
    }

    // -- internals ---------------------------------------------------------

    fn lock(&self) -> MutexGuard<'_, ()> {
        // The guarded data is `()`, so a panic elsewhere leaves nothing torn.
        self.mutation.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn root_handle(&self) -> Handle {
        Handle::Root(Arc::clone(&self.root_dir))
    }

    /// Walks the components from the root handle, one name at a time, each
    /// relative to the directory opened before it and never following a
    /// symlink: a symlink anywhere on the way, or one swapped in meanwhile,
    /// is refused as a backend failure.
    fn probe(&self, names: &[PhysicalName], operation: &str) -> Result<Probe, StoreError> {
        let Some((last, parents)) = names.split_last() else {
            return Ok(Probe::Dir(Entry {
                parent: self.root_handle(),
                name: ".".to_owned(),
            }));
        };
        let mut current = self.root_handle();
        for name in parents {
            match entry_type(&current, &name.name) {
                Ok(None) => return Ok(Probe::Missing { under_file: false }),
                Ok(Some(FileType::Directory)) => {}
                Ok(Some(FileType::RegularFile)) => return Ok(Probe::Missing { under_file: true }),
                Ok(Some(FileType::Symlink)) => return Err(refused_symlink(operation, &name.name)),
                Ok(Some(_)) => return Ok(Probe::Other),
                Err(error) => return Err(StoreError::backend(operation, &error)),
            }
            current = Handle::Opened(
                open_directory(&current, &name.name)
                    .map_err(|e| StoreError::backend(operation, &e))?,
            );
        }
        let kind =
            entry_type(&current, &last.name).map_err(|e| StoreError::backend(operation, &e))?;
        let entry = Entry {
            parent: current,
            name: last.name.clone(),
        };
        Ok(match kind {
            None => Probe::Missing { under_file: false },
            Some(FileType::Symlink) => return Err(refused_symlink(operation, &last.name)),
            Some(FileType::Directory) => Probe::Dir(entry),
            Some(FileType::RegularFile) => Probe::File(entry),
            Some(_) => Probe::Other,
        })
    }

    /// The file's bytes, `None` when it does not exist.
    fn load(&self, path: &str, operation: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self.probe(&physical_names(path), operation)? {
            Probe::Missing { .. } => Ok(None),
            Probe::File(entry) => read_regular_file(&entry)
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
    /// missing ones, and returns the innermost, open.
    fn ensure_directories(
        &self,
        names: &[PhysicalName],
        operation: &str,
    ) -> Result<Handle, StoreError> {
        let mut current = self.root_handle();
        for name in names {
            match entry_type(&current, &name.name) {
                Ok(Some(FileType::Directory)) => {}
                Ok(Some(_)) => {
                    return Err(StoreError::backend(
                        operation,
                        &"a parent is not a directory",
                    ))
                }
                Ok(None) => {
                    if let Err(error) =
                        rustix::fs::mkdirat(&current, name.name.as_str(), Mode::from(0o777))
                    {
                        // Someone may have made it meanwhile; the open below
                        // accepts only a real directory.
                        if error != rustix::io::Errno::EXIST {
                            return Err(StoreError::backend(operation, &io::Error::from(error)));
                        }
                    }
                }
                Err(error) => return Err(StoreError::backend(operation, &error)),
            }
            current = Handle::Opened(
                open_directory(&current, &name.name)
                    .map_err(|e| StoreError::backend(operation, &e))?,
            );
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
        // The open handles down to the deepest continuation's parent.
        let mut handles = vec![self.root_handle()];
        for name in parents.iter().take(parents.len().saturating_sub(1)) {
            let Some(current) = handles.last() else {
                return;
            };
            match open_directory(current, &name.name) {
                Ok(next) => handles.push(Handle::Opened(next)),
                Err(_) => return,
            }
        }
        for depth in (keep..parents.len()).rev() {
            let (Some(parent), Some(name)) = (handles.get(depth), parents.get(depth)) else {
                break;
            };
            if rustix::fs::unlinkat(parent, name.name.as_str(), AtFlags::REMOVEDIR).is_err() {
                break;
            }
        }
    }
}

fn range_error(path: &str, rejection: LineRangeRejection) -> StoreError {
    StoreError::user(messages::invalid_line_range(path, rejection.reason()))
}

fn refused_symlink(operation: &str, name: &str) -> StoreError {
    StoreError::backend(
        operation,
        &format!("refusing to follow the symlink {name:?}"),
    )
}

/// The type of `name` in `directory`, the entry itself (never a symlink's
/// target); `None` when absent.
fn entry_type(directory: &impl AsFd, name: &str) -> io::Result<Option<FileType>> {
    match rustix::fs::statat(directory, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(FileType::from_raw_mode(stat.st_mode))),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// Opens the directory `name` inside `parent`: one name, no symlink followed
/// (`O_NOFOLLOW` fails with `ELOOP` on one, `O_DIRECTORY` with `ENOTDIR` on a
/// file), whatever was checked before.
fn open_directory(parent: &impl AsFd, name: &str) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens a file by one name inside `parent`: no symlink followed, and never
/// blocking on a FIFO planted in the store.
fn open_file_at(parent: &impl AsFd, name: &str, flags: OFlags, mode: Mode) -> io::Result<File> {
    let fd = rustix::fs::openat(
        parent,
        name,
        flags | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        mode,
    )?;
    Ok(File::from(fd))
}

fn read_regular_file(entry: &Entry) -> io::Result<Vec<u8>> {
    let mut file = open_file_at(&entry.parent, &entry.name, OFlags::RDONLY, Mode::empty())?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Writes `contents` to a fresh temporary file in `directory`, syncs it, and
/// renames it over `file_name`, both names relative to the directory's open
/// handle: readers and crashes see the old file or the new one, never a mix.
/// On failure the temporary file is removed.
fn atomic_replace(directory: &Handle, file_name: &str, contents: &[u8]) -> io::Result<()> {
    let temp_name = format!(
        "{TEMP_PREFIX}{}-{}{CONTINUATION_MARK}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let result = write_synced(directory, &temp_name, contents).and_then(|()| {
        fault::hit(FaultPoint::BeforeRename)?;
        Ok(rustix::fs::renameat(
            directory,
            temp_name.as_str(),
            directory,
            file_name,
        )?)
    });
    if result.is_err() {
        // Best effort: the temporary name is invisible to every store call anyway.
        let _ = rustix::fs::unlinkat(directory, temp_name.as_str(), AtFlags::empty());
        return result;
    }
    // Persist the rename itself; some filesystems cannot sync a directory,
    // and the data is already safe in the renamed file, so this is best effort.
    let _ = rustix::fs::fsync(directory);
    Ok(())
}

fn write_synced(directory: &Handle, temp_name: &str, contents: &[u8]) -> io::Result<()> {
    let mut file = open_file_at(
        directory,
        temp_name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
        Mode::from(0o666),
    )?;
    let (head, tail) = contents.split_at(contents.len() / 2);
    file.write_all(head)?;
    fault::hit(FaultPoint::MidWrite)?;
    file.write_all(tail)?;
    file.sync_all()
}

/// The entries of an open directory: name and type (never following a
/// symlink), skipping `.` and `..`.
fn list_directory(directory: BorrowedFd<'_>) -> io::Result<Vec<(std::ffi::OsString, FileType)>> {
    use std::os::unix::ffi::OsStrExt;
    let mut entries = Vec::new();
    for entry in rustix::fs::Dir::read_from(directory)? {
        let entry = entry?;
        let bytes = entry.file_name().to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        let name = std::ffi::OsStr::from_bytes(bytes).to_owned();
        let mut kind = entry.file_type();
        if kind == FileType::Unknown {
            // Some filesystems do not say in the listing; ask the entry itself.
            kind = match rustix::fs::statat(directory, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
            {
                Ok(stat) => FileType::from_raw_mode(stat.st_mode),
                Err(_) => continue,
            };
        }
        entries.push((name, kind));
    }
    Ok(entries)
}

/// Removes temporary files a killed writer left behind in `directory`, so an
/// otherwise empty directory can be deleted. Called with the store lock held.
fn remove_leftover_temps(directory: &OwnedFd) {
    let Ok(entries) = list_directory(directory.as_fd()) else {
        return;
    };
    for (name, kind) in entries {
        let is_temp = name
            .to_str()
            .is_some_and(|n| n.starts_with(TEMP_PREFIX) && n.ends_with(CONTINUATION_MARK));
        if kind == FileType::RegularFile && is_temp {
            let _ = rustix::fs::unlinkat(directory, name.as_os_str(), AtFlags::empty());
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
    /// Visits the open `directory`, whose logical path is `logical_dir`
    /// (`depth` segments). `partial` is the part of an over-long segment
    /// gathered from continuation directories so far; `physical` the names
    /// walked from the root.
    fn visit(
        &mut self,
        directory: BorrowedFd<'_>,
        logical_dir: &str,
        partial: &str,
        physical: &mut Vec<String>,
        depth: usize,
    ) -> Result<(), StoreError> {
        let entries = list_directory(directory).map_err(|e| StoreError::backend("glob", &e))?;
        for (os_name, file_type) in entries {
            if file_type == FileType::Symlink {
                continue;
            }
            let Some(name) = os_name.to_str() else {
                continue; // Not UTF-8: no store path can name it.
            };
            let is_dir = file_type == FileType::Directory;
            if let Some(chunk) = name.strip_suffix(CONTINUATION_MARK) {
                // A continuation directory, or a temporary file: never a file of its own.
                if is_dir && logical_dir.len() + 1 + partial.len() + chunk.len() <= MAX_PATH_BYTES {
                    let inner = open_directory(&directory, name)
                        .map_err(|e| StoreError::backend("glob", &e))?;
                    physical.push(name.to_owned());
                    let gathered = format!("{partial}{chunk}");
                    let result = self.visit(inner.as_fd(), logical_dir, &gathered, physical, depth);
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
            if is_dir {
                let deeper_can_match = self.max_depth.is_none_or(|max| depth + 2 <= max);
                if deeper_can_match {
                    let inner = open_directory(&directory, name)
                        .map_err(|e| StoreError::backend("glob", &e))?;
                    physical.push(name.to_owned());
                    let result = self.visit(inner.as_fd(), &logical, "", physical, depth + 1);
                    physical.pop();
                    result?;
                }
            } else if file_type == FileType::RegularFile
                && self.is_listable(&logical, physical, name)
            {
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
        let mut names: Vec<String> = std::fs::read_dir(directory)
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
        std::fs::write(&leftover, "partial").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(store.glob("**"), Ok(vec!["d/a.txt".to_owned()]));
        assert_eq!(store.delete("d/a.txt"), Ok(()));
        assert_eq!(store.delete("d"), Ok(()));
        assert_eq!(store.exists("d"), Ok(false));
    }
}
