//! The fixtures a case runs against, typed (`promptforge test`'s YAML and
//! the language tests' `case.json` share them): a scripted or served model,
//! the web server's pages, fixture MCP servers, the outcome a case expects,
//! and the scratch folder a run works in.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::Deserialize;
use serde_json::Value as Json;

/// `model`: a scripted model and its catalog entry, or, with `responses`, a
/// real provider talking to a local server that answers its requests with
/// the given raw bodies in order (JSON, or `text/event-stream` for streamed rounds).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFixture {
    /// The replies file's content (see `pf_models::ScriptProvider`).
    #[serde(default = "empty_array")]
    pub replies: Json,
    /// Raw answers, one per model request, served from 127.0.0.1 to the
    /// provider `provider` names; `replies` is then unused.
    pub responses: Option<Vec<Page>>,
    /// The wire format `responses` are in: `openai` (the default) or `anthropic`.
    pub provider: Option<ServedProvider>,
    /// The host file's `stream = true`: every `models.loop` round streams.
    #[serde(default)]
    pub stream: bool,
    /// Run with `--capture`: each round reports its raw `request`/`response` bodies.
    #[serde(default)]
    pub capture: bool,
    #[serde(default = "default_model_id")]
    pub id: String,
    #[serde(default = "default_context")]
    pub context: u64,
    #[serde(default = "default_thinking")]
    pub thinking: String,
    pub description: Option<String>,
}

/// A provider that `model.responses` can stand behind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServedProvider {
    #[default]
    Openai,
    Anthropic,
}

fn empty_array() -> Json {
    Json::Array(Vec::new())
}

fn default_model_id() -> String {
    pf_models::DEFAULT_SCRIPT_MODEL_ID.to_string()
}

fn default_context() -> u64 {
    pf_models::DEFAULT_CONTEXT
}

fn default_thinking() -> String {
    "Switchable".to_string()
}

/// `web`: pages by path, and the search backend's answer.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebFixture {
    #[serde(default)]
    pub pages: BTreeMap<String, Page>,
    /// Answers `/search` (and any POST).
    pub search: Option<Page>,
}

/// One HTTP answer of the web fixture.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Page {
    #[serde(default = "default_status")]
    pub status: u16,
    pub content_type: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A string is sent as is; any other JSON value as its JSON text.
    #[serde(default)]
    pub body: Json,
}

fn default_status() -> u16 {
    200
}

/// `mcp."ns/name"`: a fixture MCP server (`mcp_fixture.py`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpFixture {
    #[serde(default)]
    pub trusted: bool,
    #[serde(default)]
    pub conflicts: Vec<String>,
    #[serde(default)]
    pub fail_start: bool,
    /// The fixture's tool list, passed through as is.
    #[serde(default)]
    pub tools: Vec<Json>,
}

/// How a run ended, as the report's `"outcome"` names it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpectedOutcome {
    #[default]
    Completed,
    Failed,
    Cancelled,
}

impl ExpectedOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ExpectedOutcome::Completed => "completed",
            ExpectedOutcome::Failed => "failed",
            ExpectedOutcome::Cancelled => "cancelled",
        }
    }
}

/// A scratch directory removed when dropped.
pub struct WorkDir(pub PathBuf);

impl WorkDir {
    pub fn new() -> Result<WorkDir, String> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let path =
            std::env::temp_dir().join(format!("promptforge-case-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(WorkDir(path))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The cases' scratch folders of one `promptforge test`, all inside the
/// command's own scratch folder, so they go with it. A case's folder left
/// clean (an empty `store/`, loose files removed) is handed to a later case
/// instead of making and removing two folders a case, which on ext4 was
/// most of a one-round case's cost.
#[derive(Debug)]
pub struct ScratchPool {
    parent: PathBuf,
    next: AtomicU64,
    spare: Mutex<Vec<PathBuf>>,
}

/// Spare folders kept at most (one per case in flight is enough).
const SPARE_LIMIT: usize = 256;

impl ScratchPool {
    pub fn new(parent: PathBuf) -> Arc<ScratchPool> {
        Arc::new(ScratchPool {
            parent,
            next: AtomicU64::new(0),
            spare: Mutex::new(Vec::new()),
        })
    }

    /// A folder for one case: a clean spare, or a new one.
    pub fn take(self: &Arc<Self>) -> Result<CaseDir, String> {
        let spare = self
            .spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let path = match spare {
            Some(path) => path,
            None => {
                let n = self.next.fetch_add(1, Ordering::SeqCst);
                let path = self.parent.join(format!("case-{n}"));
                std::fs::create_dir_all(&path)
                    .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
                path
            }
        };
        Ok(CaseDir(path, Arc::clone(self)))
    }
}

/// One case's scratch folder (its store in `store/`): back to the pool when
/// left clean, else removed.
#[derive(Debug)]
pub struct CaseDir(pub PathBuf, Arc<ScratchPool>);

impl Drop for CaseDir {
    fn drop(&mut self) {
        if left_clean(&self.0) {
            let mut spare = self.1.spare.lock().unwrap_or_else(PoisonError::into_inner);
            if spare.len() < SPARE_LIMIT {
                spare.push(std::mem::take(&mut self.0));
                return;
            }
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether `dir` holds nothing a later case could see: loose files are
/// removed; any folder but an empty `store` (or a store file) makes it unclean.
fn left_clean(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    for entry in entries {
        let Ok(entry) = entry else { return false };
        let Ok(kind) = entry.file_type() else {
            return false;
        };
        if kind.is_dir() {
            let empty_store = entry.file_name() == "store"
                && std::fs::read_dir(entry.path()).is_ok_and(|mut e| e.next().is_none());
            if !empty_store {
                return false;
            }
        } else if std::fs::remove_file(entry.path()).is_err() {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_clean_case_folder_is_reused_and_a_used_store_never_is() {
        let parent = tempfile::tempdir().unwrap();
        let pool = ScratchPool::new(parent.path().to_path_buf());
        let first = pool.take().unwrap();
        let path = first.0.clone();
        std::fs::create_dir_all(path.join("store")).unwrap();
        std::fs::write(path.join("replies.json"), "[]").unwrap();
        drop(first);
        // Loose files go; the empty store stays; the folder is handed out again.
        let again = pool.take().unwrap();
        assert_eq!(again.0, path);
        assert!(!path.join("replies.json").exists());
        assert!(path.join("store").is_dir());
        // A store a case wrote into is removed with its folder, never reused.
        std::fs::write(path.join("store/notes.md"), "left behind").unwrap();
        drop(again);
        assert!(!path.exists());
        let fresh = pool.take().unwrap();
        assert_ne!(fresh.0, path);
        assert!(std::fs::read_dir(&fresh.0).unwrap().next().is_none());
        // Any other folder makes it unclean too.
        std::fs::create_dir_all(fresh.0.join("store/sub")).unwrap();
        let fresh_path = fresh.0.clone();
        drop(fresh);
        assert!(!fresh_path.exists());
    }
}
