//! The one scrubbing layer. Keys come from environment variables the host
//! file names (a model's `api_key_env`, `[web] search_api_key_env`, an MCP
//! Plugin's `env`, `[mcp_server] token_env`); every piece of text from outside
//! (model replies and their captured bodies, tool results and errors, search
//! results, a server's stderr) passes through [`Secrets::scrub`] before it
//! reaches Lua, the run log, a report, a trace or a log line.
//!
//! [`scrub`] finds a key also when a server re-encoded it: JSON escapes,
//! `\xNN`, percent-encoding, HTML numeric entities (up to three layers, mixed),
//! a UTF-8 key read as Latin-1, and base64 at any alignment. A streamed text
//! goes through [`StreamScrub`], which holds back a tail that could be the
//! start of a key.
//!
//! The process keeps one set, [`register`]ed by the Host once it has read its
//! host file, for the places that see text without a Host at hand (the debug
//! log writer): [`global`].

mod scrub;

use std::sync::{Arc, RwLock};

pub use scrub::{StreamScrub, REDACTED};

/// The keys to take out of text, and their re-encoded forms.
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    scrubbers: Vec<scrub::KeyScrubber>,
}

impl Secrets {
    /// The set for these key values (empty ones are ignored).
    pub fn new<I, S>(keys: I) -> Secrets
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut values: Vec<String> = keys
            .into_iter()
            .map(|k| k.as_ref().to_string())
            .filter(|k| !k.is_empty())
            .collect();
        values.sort();
        values.dedup();
        Secrets {
            scrubbers: values
                .iter()
                .filter_map(|k| scrub::KeyScrubber::new(Some(k)))
                .collect(),
        }
    }

    /// The values of these environment variables, those that are set.
    pub fn from_env<I, S>(names: I) -> Secrets
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Secrets::new(
            names
                .into_iter()
                .filter_map(|name| std::env::var(name.as_ref()).ok()),
        )
    }

    /// No key to look for.
    pub fn is_empty(&self) -> bool {
        self.scrubbers.is_empty()
    }

    /// `text` with every found form of every key replaced by [`REDACTED`].
    pub fn scrub(&self, text: &str) -> String {
        scrub::scrub_all(&self.scrubbers, text)
    }

    /// [`Secrets::scrub`] in place, only allocating when there is a key.
    pub fn scrub_in_place(&self, text: &mut String) {
        if !self.is_empty() {
            *text = self.scrub(text);
        }
    }

    /// A scrubber for text arriving piece by piece.
    pub fn stream(&self) -> StreamScrub {
        StreamScrub::new(self.scrubbers.clone())
    }
}

static GLOBAL: RwLock<Option<Arc<Secrets>>> = RwLock::new(None);

/// Adds these keys to the process's set (the Host, once its host file is read).
pub fn register(secrets: &Secrets) {
    if secrets.is_empty() {
        return;
    }
    if let Ok(mut global) = GLOBAL.write() {
        let mut merged = global.as_deref().cloned().unwrap_or_default();
        merged.scrubbers.extend(secrets.scrubbers.iter().cloned());
        *global = Some(Arc::new(merged));
    }
}

/// The process's set: every key registered so far.
pub fn global() -> Arc<Secrets> {
    GLOBAL
        .read()
        .ok()
        .and_then(|g| g.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_the_set_is_scrubbed() {
        let secrets = Secrets::new(["first-key-123456", "", "second/key+7890"]);
        assert_eq!(
            secrets.scrub("a first-key-123456 b second\\/key+7890 c"),
            "a [redacted] b [redacted] c"
        );
        assert!(Secrets::new([""; 2]).is_empty());
    }

    #[test]
    fn a_stream_holds_back_every_key() {
        let secrets = Secrets::new(["first-key-123456", "second-key-7890"]);
        let text = format!(
            "{}first-key-123456 and second-key-7890{}",
            "x".repeat(300),
            "y".repeat(300)
        );
        for size in [1, 5, 64] {
            let mut stream = secrets.stream();
            let mut out = String::new();
            let chars: Vec<char> = text.chars().collect();
            for piece in chars.chunks(size) {
                out.push_str(&stream.push(&piece.iter().collect::<String>()));
            }
            out.push_str(&stream.finish());
            assert_eq!(out, secrets.scrub(&text), "size {size}");
        }
    }

    #[test]
    fn registered_keys_add_up() {
        register(&Secrets::new(["registered-one-123"]));
        register(&Secrets::new(["registered-two-456"]));
        assert_eq!(
            global().scrub("registered-one-123 registered-two-456"),
            "[redacted] [redacted]"
        );
    }
}
