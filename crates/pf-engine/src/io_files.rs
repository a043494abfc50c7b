//! The frontmatter `input:` and `output:` files (guide ch. 02 "Input and output
//! files"), seen from the Host.
//!
//! The run itself never acts on either declaration: a prompt reads its input
//! with `store.read` and writes its output with `store.write`, and a prompt that
//! never writes its declared output still completes. The declarations tell the
//! Host which store file to put in place before the run and which one to collect
//! after it; these functions are that Host side, for any Host.

use std::path::{Path, PathBuf};

use pf_store::Store;
use pf_syntax::Prompt;

/// The declared output file, collected from the store after the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectedOutput {
    /// The declared store path, such as `report.md`.
    pub path: String,
    /// The file's contents.
    pub contents: Vec<u8>,
    /// Where the file lies in the store directory, when it sits at exactly the
    /// declared path (a name longer than a filesystem allows is stored split up).
    pub file: Option<PathBuf>,
}

/// Before the run: the notice for a declared input file the store does not
/// hold (`input file not found in the store: {path}`), or the store's message
/// when the declared path is not a valid store path. `None` when the prompt
/// declares no input, the file is in place, or the store cannot be opened (the
/// run then fails on its own, with kind `Store`).
pub fn missing_input(prompt: &Prompt, store_dir: &Path) -> Option<String> {
    let declared = prompt.frontmatter.input.as_ref()?;
    let store = Store::open(store_dir).ok()?;
    match store.exists(&declared.path) {
        Ok(true) => None,
        Ok(false) => Some(format!(
            "input file not found in the store: {}",
            declared.path
        )),
        Err(e) => Some(e.message),
    }
}

/// Before the run: places the Host's file `from` in the store at the declared
/// input path, replacing any file there. Returns the store path, or `None` when
/// the prompt declares no input. Fails with the store's message, such as
/// `cannot read input file {from}: {detail}`.
pub fn place_input(
    prompt: &Prompt,
    store_dir: &Path,
    from: &Path,
) -> Result<Option<String>, String> {
    let Some(declared) = prompt.frontmatter.input.as_ref() else {
        return Ok(None);
    };
    let store = Store::open(store_dir).map_err(|e| e.message)?;
    store.copy_in(from, &declared.path).map_err(|e| e.message)?;
    Ok(Some(declared.path.clone()))
}

/// The most a collected output file may hold: a run's appends can grow a
/// store file without end, and the Host never loads more than this of it.
pub const MAX_OUTPUT_BYTES: u64 = 64 * 1024 * 1024;

/// After the run: collects the declared output file. `None` when the prompt
/// declares no output; an error with `output file not found: {path}` when the
/// run never wrote it, one naming the file and [`MAX_OUTPUT_BYTES`] when it
/// is larger (it is not read), or the store's message when it cannot be read.
pub fn collect_output(
    prompt: &Prompt,
    store_dir: &Path,
) -> Option<Result<CollectedOutput, String>> {
    let declared = prompt.frontmatter.output.as_ref()?;
    let collected = Store::open(store_dir).and_then(|store| {
        let contents = store.read_out(&declared.path, MAX_OUTPUT_BYTES)?;
        let candidate = store.root().join(&declared.path);
        let is_file = std::fs::symlink_metadata(&candidate)
            .map(|m| m.is_file())
            .unwrap_or(false);
        Ok(CollectedOutput {
            path: declared.path.clone(),
            contents,
            file: is_file.then_some(candidate),
        })
    });
    Some(collected.map_err(|e| e.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(frontmatter: &str) -> Prompt {
        let source = format!(
            "---\nname: files\ndescription: d\npromptforge: 0\n{frontmatter}---\n\n# Files\n"
        );
        pf_syntax::parse(source.as_bytes()).unwrap_or_else(|e| panic!("parse: {}", e.message))
    }

    const BOTH: &str =
        "input:\n  path: in/paper.md\n  description: The paper\noutput:\n  path: report.md\n  description: The report\n";

    fn store_dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
    }

    #[test]
    fn nothing_declared_means_nothing_to_do() {
        let dir = store_dir();
        let plain = prompt("");
        assert_eq!(missing_input(&plain, dir.path()), None);
        assert_eq!(
            place_input(&plain, dir.path(), Path::new("/nonexistent")),
            Ok(None)
        );
        assert_eq!(collect_output(&plain, dir.path()), None);
    }

    #[test]
    fn a_missing_input_is_reported_until_it_is_placed() {
        let dir = store_dir();
        let host = store_dir();
        let from = host.path().join("paper.md");
        std::fs::write(&from, "the paper body").unwrap_or_else(|e| panic!("{e}"));
        let p = prompt(BOTH);
        assert_eq!(
            missing_input(&p, dir.path()).as_deref(),
            Some("input file not found in the store: in/paper.md")
        );
        assert_eq!(
            place_input(&p, dir.path(), &from),
            Ok(Some("in/paper.md".to_string()))
        );
        assert_eq!(missing_input(&p, dir.path()), None);
        let placed = std::fs::read_to_string(dir.path().join("in/paper.md"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(placed, "the paper body");
    }

    #[test]
    fn an_unreadable_host_file_is_named() {
        let dir = store_dir();
        let p = prompt(BOTH);
        let missing = dir.path().join("no-such-file");
        let err = place_input(&p, dir.path(), &missing)
            .err()
            .unwrap_or_default();
        assert!(
            err.starts_with(&format!("cannot read input file {}: ", missing.display())),
            "{err}"
        );
    }

    #[test]
    fn an_invalid_declared_path_gets_the_store_message() {
        let dir = store_dir();
        let p = prompt("input:\n  path: ../outside.md\n  description: d\n");
        assert_eq!(
            missing_input(&p, dir.path()).as_deref(),
            Some("invalid path \"../outside.md\": path contains a traversal segment")
        );
    }

    #[test]
    fn the_output_is_collected_or_reported_missing() {
        let dir = store_dir();
        let p = prompt(BOTH);
        assert_eq!(
            collect_output(&p, dir.path()),
            Some(Err("output file not found: report.md".to_string()))
        );
        let store = Store::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(store.write("report.md", "report on: it"), Ok(()));
        let collected = collect_output(&p, dir.path())
            .and_then(Result::ok)
            .unwrap_or_else(|| panic!("collected"));
        assert_eq!(collected.path, "report.md");
        assert_eq!(collected.contents, b"report on: it");
        assert_eq!(collected.file, Some(store.root().join("report.md")));
    }

    #[test]
    fn a_directory_at_the_output_path_is_not_an_output() {
        let dir = store_dir();
        let p = prompt(BOTH);
        let store = Store::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(store.write("report.md/inner.txt", "x"), Ok(()));
        assert_eq!(
            collect_output(&p, dir.path()),
            Some(Err("store backend failure".to_string()))
        );
    }
}
