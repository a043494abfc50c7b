//! The providers a Host can name, in one table.
//!
//! A provider is one module (its wire format) and one row of [`PROVIDERS`]:
//! the word a host file names it by, its OpenTelemetry `gen_ai.provider.name`,
//! and, for an HTTP provider, the endpoint defaults. Everything that used to
//! match provider words (the host file, `models`, the run's log line, OTLP)
//! reads this table through [`ProviderName`].

use crate::{HttpEndpoint, ProviderKind};

/// Which provider answers a model: a closed set, one row each in [`PROVIDERS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProviderName {
    /// Chat Completions (OpenAI and compatible servers).
    OpenAi,
    /// The Anthropic Messages API.
    Anthropic,
    /// Replies from a JSON file.
    Script,
}

/// An HTTP provider's defaults, when the host file leaves them out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpDefaults {
    /// Where requests go without `base_url`.
    pub base_url: &'static str,
    /// The key variable read without `api_key_env` (`None`: no key sent).
    pub key_env: Option<&'static str>,
    /// Whether `spawn` may start this provider's server (it must speak the
    /// OpenAI API, whose address the spawned server gets).
    pub spawns: bool,
}

/// One provider: its name, its words and its defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProviderRow {
    pub name: ProviderName,
    /// `provider = "…"` in the host file, and `models`' `provider` column.
    pub word: &'static str,
    /// OpenTelemetry's `gen_ai.provider.name`.
    pub otlp_name: &'static str,
    /// `None` for a provider that never calls a server.
    pub http: Option<HttpDefaults>,
}

/// Every provider, in the order error messages list them; the first is the
/// default when a host file names none.
pub const PROVIDERS: &[ProviderRow] = &[
    ProviderRow {
        name: ProviderName::OpenAi,
        word: "openai",
        otlp_name: "openai",
        http: Some(HttpDefaults {
            base_url: crate::DEFAULT_OPENAI_BASE_URL,
            key_env: None,
            spawns: true,
        }),
    },
    ProviderRow {
        name: ProviderName::Anthropic,
        word: "anthropic",
        otlp_name: "anthropic",
        http: Some(HttpDefaults {
            base_url: crate::DEFAULT_ANTHROPIC_BASE_URL,
            key_env: Some(crate::DEFAULT_ANTHROPIC_KEY_ENV),
            spawns: false,
        }),
    },
    ProviderRow {
        name: ProviderName::Script,
        word: "script",
        otlp_name: "promptforge.script",
        http: None,
    },
];

impl ProviderName {
    /// The provider a host file means when it names none.
    pub const DEFAULT: ProviderName = ProviderName::OpenAi;

    /// The provider a host file's word names, if any.
    pub fn from_word(word: &str) -> Option<ProviderName> {
        PROVIDERS
            .iter()
            .find(|row| row.word == word)
            .map(|row| row.name)
    }

    /// This provider's row.
    pub fn row(self) -> &'static ProviderRow {
        // Every name has exactly one row (the `every_name_has_one_row` test);
        // the fallback only keeps this total.
        PROVIDERS
            .iter()
            .find(|row| row.name == self)
            .unwrap_or(&PROVIDERS[0])
    }

    /// The host file's word for this provider.
    pub fn word(self) -> &'static str {
        self.row().word
    }

    /// OpenTelemetry's `gen_ai.provider.name`.
    pub fn otlp_name(self) -> &'static str {
        self.row().otlp_name
    }

    /// The known words, quoted, as a message lists them: `"a", "b" or "c"`.
    pub fn known_words() -> String {
        let words: Vec<String> = PROVIDERS
            .iter()
            .map(|r| format!("\"{}\"", r.word))
            .collect();
        match words.split_last() {
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }
}

impl std::fmt::Display for ProviderName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.word())
    }
}

impl ProviderKind {
    /// Which provider this is.
    pub fn name(&self) -> ProviderName {
        match self {
            ProviderKind::OpenAi(_) => ProviderName::OpenAi,
            ProviderKind::Anthropic(_) => ProviderName::Anthropic,
            ProviderKind::Script { .. } => ProviderName::Script,
        }
    }

    /// The HTTP endpoint, for a provider that calls a server.
    pub fn endpoint(&self) -> Option<&HttpEndpoint> {
        match self {
            ProviderKind::OpenAi(endpoint) | ProviderKind::Anthropic(endpoint) => Some(endpoint),
            ProviderKind::Script { .. } => None,
        }
    }

    /// The NAME of the variable holding the API key, when one is sent.
    pub fn api_key_env(&self) -> Option<&str> {
        self.endpoint()?.api_key_env.as_deref()
    }

    /// An HTTP provider's kind for `name` at `endpoint`; `None` for a
    /// provider that calls no server.
    pub fn http(name: ProviderName, endpoint: HttpEndpoint) -> Option<ProviderKind> {
        match name {
            ProviderName::OpenAi => Some(ProviderKind::OpenAi(endpoint)),
            ProviderName::Anthropic => Some(ProviderKind::Anthropic(endpoint)),
            ProviderName::Script => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_has_one_row_and_words_read_back() {
        for name in [
            ProviderName::OpenAi,
            ProviderName::Anthropic,
            ProviderName::Script,
        ] {
            assert_eq!(PROVIDERS.iter().filter(|r| r.name == name).count(), 1);
            assert_eq!(ProviderName::from_word(name.word()), Some(name));
        }
        assert_eq!(ProviderName::from_word("gemini"), None);
        assert_eq!(
            ProviderName::known_words(),
            "\"openai\", \"anthropic\" or \"script\""
        );
        assert_eq!(PROVIDERS[0].name, ProviderName::DEFAULT);
    }

    #[test]
    fn http_kinds_carry_their_name() {
        let endpoint = HttpEndpoint {
            base_url: "http://x".into(),
            api_key_env: Some("K".into()),
            receive_timeout: None,
        };
        for row in PROVIDERS {
            match ProviderKind::http(row.name, endpoint.clone()) {
                Some(kind) => {
                    assert!(row.http.is_some());
                    assert_eq!(kind.name(), row.name);
                    assert_eq!(kind.api_key_env(), Some("K"));
                }
                None => assert!(row.http.is_none()),
            }
        }
    }
}
