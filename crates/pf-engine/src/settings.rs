//! The engine's switches, read once per process: which fast paths run.
//!
//! Every fast path has a plain reference path beside it that gives the same
//! results, events and errors. `PROMPTFORGE_ENGINE_REFERENCE=1` turns them
//! all off; CI runs the language data suite, the engine's tests and the seed
//! conformance cases both ways. `PROMPTFORGE_ENGINE_PLAIN=name,name` turns
//! off only the named ones (how the bench measures what each buys; names as
//! [`FastPath::name`]).

use std::sync::OnceLock;

/// One fast path of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastPath {
    /// The host globals (and the guarded `string`/`table` fields) built on
    /// first touch (vm/mod.rs `lazy_globals`); plain: all built by the setup.
    LazyGlobals,
    /// The engine's Lua parts loaded on first use (vm/deferred.rs `Deferred`); plain:
    /// all loaded by the setup.
    DeferredParts,
    /// `models.loop` reads only the records its snapshots cannot prove
    /// unchanged, and scans and composes only what changed
    /// (models_check.rs `ListReader`); plain: the whole list every round.
    ListSnapshots,
    /// A local tool handler's run proven to write no table (quiet.rs), so
    /// the snapshots stay trusted after it; plain: a round with a local
    /// handler reads the list as after any prompt code.
    QuietProof,
    /// The engine's own Lua chunks and prompt blocks loaded from bytecode
    /// compiled once per thread (vm/caches.rs); plain: compiled from text each time.
    BytecodeCaches,
}

impl FastPath {
    /// Every fast path, in the order the bench reports them.
    pub const ALL: [FastPath; 5] = [
        FastPath::LazyGlobals,
        FastPath::DeferredParts,
        FastPath::ListSnapshots,
        FastPath::QuietProof,
        FastPath::BytecodeCaches,
    ];

    /// Its name in `PROMPTFORGE_ENGINE_PLAIN`.
    pub fn name(self) -> &'static str {
        match self {
            FastPath::LazyGlobals => "lazy_globals",
            FastPath::DeferredParts => "deferred_parts",
            FastPath::ListSnapshots => "list_snapshots",
            FastPath::QuietProof => "quiet_proof",
            FastPath::BytecodeCaches => "bytecode_caches",
        }
    }

    fn bit(self) -> u32 {
        1 << self as u32
    }
}

/// Which fast paths this process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    plain: u32,
}

impl Settings {
    /// Every fast path on.
    pub const FAST: Settings = Settings { plain: 0 };

    /// Every fast path off: the reference path.
    pub fn reference() -> Settings {
        Settings {
            plain: FastPath::ALL.iter().fold(0, |bits, p| bits | p.bit()),
        }
    }

    /// From the two variables' values (`reference`, `plain`); unknown names
    /// and values are returned for a warning.
    pub fn parse(reference: Option<&str>, plain: Option<&str>) -> (Settings, Vec<String>) {
        let mut unknown = Vec::new();
        let mut settings = match reference.map(str::trim) {
            None | Some("") | Some("0") => Settings::FAST,
            Some("1") => Settings::reference(),
            Some(other) => {
                unknown.push(format!(
                    "PROMPTFORGE_ENGINE_REFERENCE={other:?} (use 1 or 0); taken as 1"
                ));
                Settings::reference()
            }
        };
        for name in plain.unwrap_or_default().split(',').map(str::trim) {
            if name.is_empty() {
                continue;
            }
            match FastPath::ALL.iter().find(|p| p.name() == name) {
                Some(path) => settings.plain |= path.bit(),
                None => unknown.push(format!(
                    "PROMPTFORGE_ENGINE_PLAIN names no fast path {name:?} (known: {})",
                    FastPath::ALL.map(FastPath::name).join(", ")
                )),
            }
        }
        (settings, unknown)
    }

    /// Whether `path` runs.
    pub fn fast(self, path: FastPath) -> bool {
        self.plain & path.bit() == 0
    }

    /// Whether no fast path runs.
    pub fn is_reference(self) -> bool {
        self == Settings::reference()
    }
}

/// This process's settings, read from the environment on first use (the
/// first run) and fixed from then on.
pub fn settings() -> Settings {
    static SETTINGS: OnceLock<Settings> = OnceLock::new();
    *SETTINGS.get_or_init(|| {
        let reference = std::env::var("PROMPTFORGE_ENGINE_REFERENCE").ok();
        let plain = std::env::var("PROMPTFORGE_ENGINE_PLAIN").ok();
        let (settings, unknown) = Settings::parse(reference.as_deref(), plain.as_deref());
        for problem in unknown {
            tracing::warn!("{problem}");
        }
        settings
    })
}

/// Whether `path` runs in this process.
pub(crate) fn fast(path: FastPath) -> bool {
    settings().fast(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_switch_turns_every_fast_path_off() {
        let (s, unknown) = Settings::parse(Some("1"), None);
        assert!(unknown.is_empty());
        assert!(s.is_reference());
        assert!(FastPath::ALL.iter().all(|p| !s.fast(*p)));
        let (s, _) = Settings::parse(Some("0"), None);
        assert!(FastPath::ALL.iter().all(|p| s.fast(*p)));
    }

    #[test]
    fn plain_names_turn_off_one_each_and_unknown_ones_are_reported() {
        let (s, unknown) = Settings::parse(None, Some("bytecode_caches, nonsense"));
        assert!(!s.fast(FastPath::BytecodeCaches));
        assert!(s.fast(FastPath::LazyGlobals));
        assert_eq!(unknown.len(), 1);
        assert!(unknown[0].contains("nonsense"), "{unknown:?}");
    }
}
