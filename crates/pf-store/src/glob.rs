//! Glob patterns for `store.glob` (guide ch. 09 "Listing files with glob").
//!
//! `*` matches any run of characters within one segment, `**` as a whole
//! segment matches any number of segments (zero included), and every other
//! character matches itself: there is no escape syntax, no `?`, no classes.

use crate::error::{messages, StoreError};
use crate::path::is_control_byte;

/// The longest glob pattern, in UTF-8 bytes (separate from the path limit).
pub const MAX_PATTERN_BYTES: usize = 1024;

/// Why a pattern was refused, in the order the checks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PatternRejection {
    Empty,
    TooLong,
    ControlCharacter,
    Backslash,
    /// Three or more `*` in a row.
    StarRun,
    /// A `**` that does not fill a whole segment.
    PartialRecursive,
}

impl PatternRejection {
    /// The reason text that follows `invalid glob pattern "{pattern}": `.
    pub fn reason(self) -> &'static str {
        match self {
            PatternRejection::Empty => "pattern is empty",
            PatternRejection::TooLong => "pattern exceeds 1024 bytes",
            PatternRejection::ControlCharacter => "pattern contains a control character",
            PatternRejection::Backslash => "pattern does not support backslash escapes",
            PatternRejection::StarRun => "three or more `*` in a row are not supported",
            PatternRejection::PartialRecursive => "`**` must fill a whole path segment",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    /// `**`: any number of whole segments.
    AnyDepth,
    /// A segment whose only wildcard is `*`.
    Name(String),
}

/// A validated glob pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobPattern {
    segments: Vec<Segment>,
}

impl GlobPattern {
    /// Validates `pattern`; the error carries the exact `invalid glob pattern` message.
    pub fn new(pattern: &str) -> Result<GlobPattern, StoreError> {
        Self::parse(pattern).map_err(|rejection| {
            StoreError::user(messages::invalid_glob_pattern(pattern, rejection.reason()))
        })
    }

    /// Validates `pattern`, saying which rule it breaks first.
    pub fn parse(pattern: &str) -> Result<GlobPattern, PatternRejection> {
        if pattern.is_empty() {
            return Err(PatternRejection::Empty);
        }
        if pattern.len() > MAX_PATTERN_BYTES {
            return Err(PatternRejection::TooLong);
        }
        if pattern.bytes().any(is_control_byte) {
            return Err(PatternRejection::ControlCharacter);
        }
        if pattern.contains('\\') {
            return Err(PatternRejection::Backslash);
        }
        let mut segments = Vec::new();
        for segment in pattern.split('/') {
            if segment.contains("***") {
                return Err(PatternRejection::StarRun);
            }
            if segment == "**" {
                // Consecutive `**` segments mean the same as one.
                if segments.last() != Some(&Segment::AnyDepth) {
                    segments.push(Segment::AnyDepth);
                }
            } else if segment.contains("**") {
                return Err(PatternRejection::PartialRecursive);
            } else {
                segments.push(Segment::Name(segment.to_owned()));
            }
        }
        Ok(GlobPattern { segments })
    }

    /// The leading directory segments with no wildcard: the directory every
    /// match lies in. The last segment always names a file, so it never counts.
    pub(crate) fn literal_prefix(&self) -> Vec<&str> {
        let directories = self.segments.len().saturating_sub(1);
        self.segments
            .iter()
            .take(directories)
            .map_while(|segment| match segment {
                Segment::Name(name) if !name.contains('*') => Some(name.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The most segments a match can have, or `None` when `**` makes it unbounded.
    pub(crate) fn max_depth(&self) -> Option<usize> {
        if self.segments.contains(&Segment::AnyDepth) {
            None
        } else {
            Some(self.segments.len())
        }
    }

    /// Whether the logical store path `path` matches.
    ///
    /// Dynamic programming over (pattern segment, path segment), so the cost is
    /// bounded by the product of the two lengths whatever the pattern.
    pub fn matches(&self, path: &str) -> bool {
        let parts: Vec<&str> = path.split('/').collect();
        let width = parts.len() + 1;
        // matched[i * width + j]: pattern segments i.. match path segments j..
        let mut matched = vec![false; (self.segments.len() + 1) * width];
        if let Some(last) = matched.last_mut() {
            *last = true;
        }
        for (i, segment) in self.segments.iter().enumerate().rev() {
            for j in (0..width).rev() {
                let next_pattern = cell(&matched, (i + 1) * width + j);
                let value = match segment {
                    Segment::AnyDepth => {
                        next_pattern || (j < parts.len() && cell(&matched, i * width + j + 1))
                    }
                    Segment::Name(name) => parts.get(j).is_some_and(|part| {
                        cell(&matched, (i + 1) * width + j + 1) && wildcard_match(name, part)
                    }),
                };
                if let Some(slot) = matched.get_mut(i * width + j) {
                    *slot = value;
                }
            }
        }
        cell(&matched, 0)
    }
}

fn cell(table: &[bool], index: usize) -> bool {
    table.get(index).copied().unwrap_or(false)
}

/// Matches one segment against a pattern whose only wildcard is `*`.
///
/// Greedy with backtracking to the last star: O(len(pattern) * len(text)) at
/// worst. Byte-wise is exact for UTF-8, since literal bytes only line up with
/// whole characters.
fn wildcard_match(pattern: &str, text: &str) -> bool {
    let pattern = pattern.as_bytes();
    let text = text.as_bytes();
    let (mut p, mut t) = (0usize, 0usize);
    let mut last_star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some(b'*') => {
                last_star = Some((p, t));
                p += 1;
            }
            Some(&byte) if text.get(t) == Some(&byte) => {
                p += 1;
                t += 1;
            }
            _ => match last_star {
                Some((star_p, star_t)) => {
                    p = star_p + 1;
                    t = star_t + 1;
                    last_star = Some((star_p, star_t + 1));
                }
                None => return false,
            },
        }
    }
    pattern
        .get(p..)
        .is_some_and(|rest| rest.iter().all(|&b| b == b'*'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(text: &str) -> GlobPattern {
        match GlobPattern::parse(text) {
            Ok(pattern) => pattern,
            Err(rejection) => panic!("{text}: {rejection:?}"),
        }
    }

    #[test]
    fn matching_table() {
        let cases: &[(&str, &str, bool)] = &[
            ("src/*.rs", "src/a.rs", true),
            ("src/*.rs", "src/deep/c.rs", false),
            ("src/**/*.rs", "src/a.rs", true),
            ("src/**/*.rs", "src/deep/c.rs", true),
            ("src/**/*.rs", "src/x/y/z.rs", true),
            ("src/**/*.rs", "notes.md", false),
            ("*.md", "notes.md", true),
            ("*.md", "a/notes.md", false),
            ("**", "notes.md", true),
            ("**", "a/b/c", true),
            ("*.txt", "a/b.txt", false),
            ("a/*.txt", "a/b.txt", true),
            ("a/**/b.rs", "a/b.rs", true),
            ("**/z2.rs", "z2.rs", true),
            ("**/z2.rs", "q/r/z2.rs", true),
            ("a/**", "a/x", true),
            ("a/**", "b/x", false),
            ("arm-*.md", "arm-1.md", true),
            ("arm-*.md", "arm-.md", true),
            ("*", ".config", true),
            ("?.md", "a.md", false),
            ("?.md", "?.md", true),
            ("[ab].md", "[ab].md", true),
            ("[ab].md", "a.md", false),
            ("{a,b}", "{a,b}", true),
            ("*a*b*", "xxaybz", true),
            ("*a*b*", "xxbya", false),
            ("**/**", "a", true),
            ("café/*", "café/x", true),
            ("*é", "café", true),
            ("Notes.md", "notes.md", false),
        ];
        for &(glob, path, expected) in cases {
            assert_eq!(pattern(glob).matches(path), expected, "{glob} vs {path}");
        }
    }

    #[test]
    fn rejection_table() {
        let long = "a".repeat(1025);
        let cases: &[(&str, PatternRejection)] = &[
            ("", PatternRejection::Empty),
            (long.as_str(), PatternRejection::TooLong),
            ("a\tb", PatternRejection::ControlCharacter),
            ("a\u{7f}", PatternRejection::ControlCharacter),
            ("a\\*", PatternRejection::Backslash),
            ("***", PatternRejection::StarRun),
            ("a/****/b", PatternRejection::StarRun),
            ("a**", PatternRejection::PartialRecursive),
            ("**.rs", PatternRejection::PartialRecursive),
            ("a/b**c/d", PatternRejection::PartialRecursive),
        ];
        for (glob, expected) in cases {
            assert_eq!(GlobPattern::parse(glob), Err(*expected), "{glob:?}");
        }
        assert!(GlobPattern::parse(&"a".repeat(1024)).is_ok());
    }

    #[test]
    fn messages_quote_the_pattern() {
        let error = GlobPattern::new("a\\b").err();
        assert_eq!(
            error.map(|e| e.message),
            Some(
                "invalid glob pattern \"a\\\\b\": pattern does not support backslash escapes"
                    .to_owned()
            )
        );
        let error = GlobPattern::new("").err();
        assert_eq!(
            error.map(|e| e.message),
            Some("invalid glob pattern \"\": pattern is empty".to_owned())
        );
    }

    /// Runs `check` on its own thread and fails with "hung" if it has not
    /// ended after 60 s: a liveness guard, not a speed assertion. Backtracking
    /// gone exponential on these inputs would run for ages, not seconds.
    fn ends(check: impl FnOnce() + Send + 'static) {
        let (done, ended) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            check();
            let _ = done.send(());
        });
        match ended.recv_timeout(std::time::Duration::from_secs(60)) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("hung: the match never ended")
            }
            _ => {
                if let Err(failure) = worker.join() {
                    std::panic::resume_unwind(failure);
                }
            }
        }
    }

    #[test]
    fn adversarial_patterns_finish_promptly() {
        ends(|| {
            let glob = format!("{}b", "*a".repeat(300));
            let text = "a".repeat(1000);
            assert!(!pattern(&glob).matches(&text));
            let many = vec!["**"; 200].join("/") + "/x";
            let deep = vec!["d"; 500].join("/");
            assert!(!pattern(&many).matches(&deep));
        });
    }

    #[test]
    fn literal_prefix_and_depth() {
        assert_eq!(
            pattern("src/deep/*.rs").literal_prefix(),
            vec!["src", "deep"]
        );
        assert_eq!(pattern("src/**/x").literal_prefix(), vec!["src"]);
        assert_eq!(pattern("a/b.txt").literal_prefix(), vec!["a"]);
        assert!(pattern("notes.md").literal_prefix().is_empty());
        assert_eq!(pattern("src/*.rs").max_depth(), Some(2));
        assert_eq!(pattern("src/**").max_depth(), None);
    }
}
