//! The Host's errors: [`HostError`], what a command reports when it cannot do
//! its job (rendered once, by the binary's `main`), and [`ErrorKind`], the
//! closed set of error kinds a report, a batch line or a run log names.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The process exit status of a failed run, or of `check` finding a problem.
pub const EXIT_FAILED: u8 = 1;
/// The exit status when the command line, the host file or the environment
/// was unusable.
pub const EXIT_USAGE: u8 = 2;

/// Why a command could not do its job. Every variant but [`HostError::Output`]
/// is a usage error: the command line, a file it names, the host file or the
/// environment is unusable (exit 2; under `--json` a `Usage` object on stdout).
/// Each message is complete as it stands: it names the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A flag or an argument the command line gave.
    #[error("{0}")]
    Usage(String),
    /// The host file: unreadable, or a key it sets.
    #[error("{0}")]
    HostFile(String),
    /// A prompt file, a test file or an input file: unreadable or unusable.
    #[error("{0}")]
    Input(String),
    /// Several input files, each unusable: one problem a line, each shown
    /// as an `error:` line of its own.
    #[error("{}", .0.join("\nerror: "))]
    Inputs(Vec<String>),
    /// The run log, or a run it should hold.
    #[error("{0}")]
    RunLog(String),
    /// The command's own output could not be written (exit 1, no JSON object).
    #[error("cannot write the output: {0}")]
    Output(#[source] std::io::Error),
    /// Something the command reads or keeps (the run log's database, a
    /// page it writes) failed under it: exit 1, no JSON object.
    #[error("{0}")]
    Failed(String),
}

impl HostError {
    /// The process exit status this error ends the command with.
    pub fn exit_status(&self) -> u8 {
        match self {
            HostError::Output(_) | HostError::Failed(_) => EXIT_FAILED,
            HostError::Usage(_)
            | HostError::HostFile(_)
            | HostError::Input(_)
            | HostError::Inputs(_)
            | HostError::RunLog(_) => EXIT_USAGE,
        }
    }

    /// The kind a report names it by; `None` for an error that prints no
    /// report object (a command's own output that could not be written).
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            HostError::Output(_) | HostError::Failed(_) => None,
            HostError::Usage(_)
            | HostError::HostFile(_)
            | HostError::Input(_)
            | HostError::Inputs(_)
            | HostError::RunLog(_) => Some(ErrorKind::Usage),
        }
    }

    /// The `--json` object a usage error prints on stdout:
    /// `{"outcome":"failed","error":{"kind":"Usage","message":…}}`.
    pub fn json_object(&self) -> Option<String> {
        let kind = self.kind()?;
        Some(
            serde_json::json!({
                "outcome": "failed",
                "error": {"kind": kind, "message": self.to_string()},
            })
            .to_string(),
        )
    }
}

/// Every error kind a report, a batch's output line, an MCP answer or the run
/// log names: the run error kinds (guide ch. 17), the parse error kinds, and
/// the Host's own. Serialised as its name, so every JSON form reads as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A run error ([`pf_engine::RunErrorKind`]).
    Run(pf_engine::RunErrorKind),
    /// The prompt did not parse ([`pf_syntax::ParseErrorKind`]); `Lua` is
    /// the run kind's name too, and reads back as the run kind.
    Parse(pf_syntax::ParseErrorKind),
    /// The command line, the host file or the environment was unusable.
    Usage,
    /// The Host could not serve the run (an MCP-served run with no model).
    Host,
    /// A strict replay met a request its log does not hold.
    Replay,
}

/// The parse error kinds, in one table read both ways.
const PARSE_KINDS: [pf_syntax::ParseErrorKind; 5] = [
    pf_syntax::ParseErrorKind::Frontmatter,
    pf_syntax::ParseErrorKind::Structure,
    pf_syntax::ParseErrorKind::Fence,
    pf_syntax::ParseErrorKind::List,
    pf_syntax::ParseErrorKind::Lua,
];

impl ErrorKind {
    /// The kind's name, as every report and message shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Run(kind) => kind.as_str(),
            ErrorKind::Parse(kind) => kind.as_str(),
            ErrorKind::Usage => "Usage",
            ErrorKind::Host => "Host",
            ErrorKind::Replay => "Replay",
        }
    }

    /// The kind a name names: a run kind first (so `Lua` is the run's).
    pub fn from_name(name: &str) -> Option<ErrorKind> {
        if let Some(kind) = pf_engine::RunErrorKind::from_name(name) {
            return Some(ErrorKind::Run(kind));
        }
        if let Some(kind) = PARSE_KINDS.into_iter().find(|k| k.as_str() == name) {
            return Some(ErrorKind::Parse(kind));
        }
        [ErrorKind::Usage, ErrorKind::Host, ErrorKind::Replay]
            .into_iter()
            .find(|k| k.as_str() == name)
    }
}

impl From<pf_engine::RunErrorKind> for ErrorKind {
    fn from(kind: pf_engine::RunErrorKind) -> ErrorKind {
        ErrorKind::Run(kind)
    }
}

impl From<pf_syntax::ParseErrorKind> for ErrorKind {
    fn from(kind: pf_syntax::ParseErrorKind) -> ErrorKind {
        ErrorKind::Parse(kind)
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for ErrorKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for ErrorKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ErrorKind, D::Error> {
        let name = String::deserialize(deserializer)?;
        ErrorKind::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown error kind \"{name}\"")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_serialises_to_its_name_and_reads_back() {
        let run = [
            "Binding",
            "Completion",
            "ContextExhausted",
            "Determinism",
            "Input",
            "Internal",
            "Lua",
            "Parse",
            "Quota",
            "RequirementsUnmet",
            "Store",
            "Tool",
            "Version",
        ];
        let others = [
            "Frontmatter",
            "Structure",
            "Fence",
            "List",
            "Usage",
            "Host",
            "Replay",
        ];
        for name in run.into_iter().chain(others) {
            let kind = ErrorKind::from_name(name).expect(name);
            assert_eq!(kind.as_str(), name);
            let json = serde_json::to_string(&kind).expect("serialise");
            assert_eq!(json, format!("\"{name}\""));
            let back: ErrorKind = serde_json::from_str(&json).expect("read back");
            assert_eq!(back, kind);
        }
        assert_eq!(
            ErrorKind::from(pf_syntax::ParseErrorKind::Lua).as_str(),
            "Lua"
        );
        assert!(serde_json::from_str::<ErrorKind>("\"Nope\"").is_err());
    }

    #[test]
    fn usage_errors_print_the_usage_object_and_exit_2() {
        let e = HostError::HostFile("host file: bad \"key\"".into());
        assert_eq!(e.exit_status(), EXIT_USAGE);
        assert_eq!(
            e.json_object().expect("an object"),
            r#"{"outcome":"failed","error":{"kind":"Usage","message":"host file: bad \"key\""}}"#
        );
        let out = HostError::Output(std::io::Error::other("disk full"));
        assert_eq!(out.exit_status(), EXIT_FAILED);
        assert_eq!(out.json_object(), None);
        assert_eq!(out.to_string(), "cannot write the output: disk full");
    }
}
