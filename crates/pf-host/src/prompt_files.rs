//! The prompt file and the files around a run: reading a prompt (capped),
//! placing its declared input in the store, collecting its declared output,
//! and a fresh private store directory for a run without `--store`.

use std::path::{Path, PathBuf};

use pf_syntax::{ArgType, Prompt};

use crate::report::ReportOutput;

/// The most any input the CLI reads whole may hold (a prompt file, ARGS from
/// stdin, a host file), so `/dev/zero` or an endless pipe cannot grow without bound.
pub const MAX_INPUT_BYTES: u64 = 16 * 1024 * 1024;

/// All of `reader`, or `Ok(None)` when it holds more than [`MAX_INPUT_BYTES`].
pub fn read_capped(reader: impl std::io::Read) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    reader.take(MAX_INPUT_BYTES + 1).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= MAX_INPUT_BYTES).then_some(bytes))
}

/// The largest prompt file read, so `run /dev/zero` cannot grow without bound.
pub const MAX_PROMPT_BYTES: u64 = MAX_INPUT_BYTES;

/// The prompt file's bytes, or an error naming it.
pub fn read_prompt(file: &Path) -> Result<Vec<u8>, crate::error::HostError> {
    use std::io::Read;
    let cannot = |e: std::io::Error| {
        crate::error::HostError::Input(format!("cannot read {}: {e}", file.display()))
    };
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .map_err(cannot)?
        .take(MAX_PROMPT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_PROMPT_BYTES {
        return Err(crate::error::HostError::Input(format!(
            "cannot read {}: the prompt file is larger than {} MiB",
            file.display(),
            MAX_PROMPT_BYTES / (1024 * 1024)
        )));
    }
    Ok(bytes)
}
/// The data directory: `$PROMPTFORGE_HOME`, else `$XDG_DATA_HOME/promptforge`
/// (absolute only), else `~/.local/share/promptforge`.
pub fn data_dir() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name);
    pf_runlog::data_dir(
        var("PROMPTFORGE_HOME").as_deref(),
        var("XDG_DATA_HOME").as_deref(),
        var("HOME").as_deref(),
    )
}

/// A fresh, private store directory for a run without `--store`, made like
/// `mkdtemp`: under `<data dir>/stores`, an unpredictable name, mode 0700, and
/// never one that already exists (nothing there is reused or followed).
pub fn private_store_dir(execution: &str) -> Result<PathBuf, crate::error::HostError> {
    make_private_store_dir(execution).map_err(crate::error::HostError::Usage)
}

fn make_private_store_dir(execution: &str) -> Result<PathBuf, String> {
    use rand::Rng;
    let parent = data_dir()
        .ok_or("no data directory for the default store: set PROMPTFORGE_HOME or pass --store")?
        .join("stores");
    let private = |recursive: bool| {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(recursive);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder
    };
    private(true)
        .create(&parent)
        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    let builder = private(false);
    let mut last = None;
    for _ in 0..8 {
        let tag: u64 = rand::rng().random();
        let dir = parent.join(format!("{execution}-{tag:016x}"));
        match builder.create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
        }
    }
    Err(format!(
        "cannot create a store directory under {}: {}",
        parent.display(),
        last.map_or_else(String::new, |e| e.to_string())
    ))
}

/// A declared input file is read from the store. When the store lacks it, the
/// Host copies it in from beside the prompt file (the file the operator wrote
/// the prompt next to); otherwise a missing input is only a warning, because
/// the run never checks the declaration (guide ch. 02).
pub fn place_input(prompt: &Prompt, prompt_file: &Path, store_dir: &Path, quiet: bool) {
    if pf_engine::missing_input(prompt, store_dir).is_some() {
        if let Some(declared) = prompt.frontmatter.input.as_ref() {
            let beside = prompt_file
                .parent()
                .unwrap_or(Path::new("."))
                .join(&declared.path);
            let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            };
            if beside.is_file() && same(&beside, prompt_file) {
                // The prompt is never its own input: copying it would hand the
                // run its own text as if the operator had written the input.
                crate::report::warn(&format!(
                    "the declared input file {} is the prompt file itself; not copied \
                     (rename the input, or place it in the store directory)",
                    declared.path
                ));
            } else if beside.is_file() {
                if let Err(why) = pf_engine::place_input(prompt, store_dir, &beside) {
                    crate::report::warn(&why.to_string());
                }
            }
        }
    }
    if let Some(notice) = pf_engine::missing_input(prompt, store_dir).filter(|_| !quiet) {
        crate::report::warn(&format!(
            "{notice} (store directory {})",
            store_dir.display()
        ));
    }
}

/// After a completed run, the declared output file stays in the store directory:
/// the report names it (`"output"`), and a missing one is a warning, never a
/// failure, because the run never checks the declaration (guide ch. 02).
pub fn collect_output(prompt: &Prompt, store_dir: &Path, quiet: bool) -> Option<ReportOutput> {
    let collected = pf_engine::collect_output(prompt, store_dir)?;
    Some(match collected {
        Ok(output) => ReportOutput {
            path: output.path,
            file: output.file,
            error: None,
        },
        Err(message) => {
            if !quiet {
                crate::report::warn(&message);
            }
            let declared = prompt
                .frontmatter
                .output
                .as_ref()
                .map(|o| o.path.clone())
                .unwrap_or_default();
            ReportOutput {
                path: declared,
                file: None,
                error: Some(message),
            }
        }
    })
}

/// An `args:` type's name, as `info` and `--arg` messages show it.
pub fn arg_type_name(ty: ArgType) -> &'static str {
    match ty {
        ArgType::String => "string",
        ArgType::Boolean => "boolean",
        ArgType::Integer => "integer",
        ArgType::Number => "number",
    }
}
