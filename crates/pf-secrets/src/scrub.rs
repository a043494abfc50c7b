//! Finding the API key in text a server sent, also when the server re-encoded
//! it: JSON escapes (`\u0073`, `\/`), `\xNN`, percent-encoding, HTML numeric
//! entities (each up to three layers deep, mixed freely), a UTF-8 key read as
//! Latin-1, and base64 (standard or URL-safe, at any alignment inside a longer
//! blob). A streamed reply is scrubbed with a held-back tail, so a key split
//! across fragments is caught too.
//!
//! Decoding keeps, for every decoded byte, the span of original text it came
//! from; a match in a decoded view redacts that whole original span.

/// What stands in for the key.
pub const REDACTED: &str = "[redacted]";
/// Layers of escaping undone (`%5Cu0073` is two).
const DECODE_PASSES: usize = 3;
/// A base64 needle shorter than this would redact chance text; not searched.
const MIN_BASE64_NEEDLE: usize = 8;
/// Whole texts longer than this are scrubbed window by window.
const WHOLE_TEXT_LIMIT: usize = 1024 * 1024;
/// Original bytes one decoded key character may take in a streamed tail
/// (`%5Cu0073` is 8); deeper layers are still caught in the assembled reply.
const STREAM_EXPANSION: usize = 8;

/// The key and its re-encoded forms, ready to search for.
#[derive(Debug, Clone)]
pub(crate) struct KeyScrubber {
    needles: Vec<String>,
    /// Longest original span a streamed match may cover.
    hold: usize,
}

impl KeyScrubber {
    /// `None` when there is no key to look for.
    pub(crate) fn new(key: Option<&str>) -> Option<KeyScrubber> {
        let key = key.filter(|key| !key.is_empty())?;
        let mut needles = vec![key.to_string()];
        let latin1: String = key.bytes().map(char::from).collect();
        needles.push(latin1);
        for alphabet in [STANDARD, URL_SAFE] {
            for offset in 0..3 {
                let needle = base64_inner(key.as_bytes(), offset, alphabet);
                if needle.len() >= MIN_BASE64_NEEDLE {
                    needles.push(needle);
                }
            }
        }
        needles.sort();
        needles.dedup();
        let longest = needles.iter().map(|n| n.chars().count()).max().unwrap_or(0);
        Some(KeyScrubber {
            needles,
            hold: longest * STREAM_EXPANSION + 16,
        })
    }

    /// `text` with every found form of the key replaced by [`REDACTED`].
    #[cfg(test)]
    pub(crate) fn scrub(&self, text: &str) -> String {
        scrub_all(std::slice::from_ref(self), text)
    }

    /// Sorted, merged byte spans of `text` that hold a form of the key.
    fn find(&self, text: &str) -> Vec<(usize, usize)> {
        let mut spans = Vec::new();
        for needle in &self.needles {
            spans.extend(
                text.match_indices(needle.as_str())
                    .map(|(at, m)| (at, at + m.len())),
            );
        }
        if text.contains(['\\', '%', '&']) {
            let mut view = View::identity(text);
            for _ in 0..DECODE_PASSES {
                let Some(decoded) = view.decode() else { break };
                view = decoded;
                for needle in &self.needles {
                    for (at, m) in view.text.match_indices(needle.as_str()) {
                        if let Some(span) = view.original(at, at + m.len()) {
                            spans.push(span);
                        }
                    }
                }
            }
        }
        merge(spans)
    }
}

/// `text` with every found form of every key replaced by [`REDACTED`].
pub(crate) fn scrub_all(scrubbers: &[KeyScrubber], text: &str) -> String {
    if scrubbers.is_empty() {
        return text.to_string();
    }
    if text.len() <= WHOLE_TEXT_LIMIT {
        return redact(text, &find_all(scrubbers, text));
    }
    let mut stream = StreamScrub::new(scrubbers.to_vec());
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let mut at = rest.len().min(64 * 1024);
        while !rest.is_char_boundary(at) {
            at += 1;
        }
        let (piece, tail) = rest.split_at(at);
        out.push_str(&stream.push(piece));
        rest = tail;
    }
    out.push_str(&stream.finish());
    out
}

/// The spans of every key's forms, merged.
fn find_all(scrubbers: &[KeyScrubber], text: &str) -> Vec<(usize, usize)> {
    match scrubbers {
        [one] => one.find(text),
        many => merge(many.iter().flat_map(|s| s.find(text)).collect()),
    }
}

/// Text with per-byte spans into the original.
struct View {
    text: String,
    spans: Vec<(usize, usize)>,
}

impl View {
    fn identity(text: &str) -> View {
        View {
            text: text.to_string(),
            spans: (0..text.len()).map(|i| (i, i + 1)).collect(),
        }
    }

    fn original(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let first = self.spans.get(start)?;
        let last = self.spans.get(end.checked_sub(1)?)?;
        Some((first.0, last.1))
    }

    /// One layer of escapes undone; `None` when there was nothing to undo.
    fn decode(&self) -> Option<View> {
        let bytes = self.text.as_bytes();
        let mut text = String::with_capacity(self.text.len());
        let mut spans = Vec::with_capacity(self.spans.len());
        let mut changed = false;
        let mut i = 0;
        while i < bytes.len() {
            let (decoded, used) = match unescape_at(&self.text, i) {
                Some(found) => {
                    changed = true;
                    found
                }
                None => {
                    let c = self.text.get(i..).and_then(|s| s.chars().next())?;
                    (c, c.len_utf8())
                }
            };
            let span = (self.spans.get(i)?.0, self.spans.get(i + used - 1)?.1);
            text.push(decoded);
            spans.extend(std::iter::repeat_n(span, decoded.len_utf8()));
            i += used;
        }
        changed.then_some(View { text, spans })
    }
}

fn hex_value(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(text, 16).ok()
}

/// The escape starting at byte `i`, as the character it stands for and the bytes it takes.
fn unescape_at(text: &str, i: usize) -> Option<(char, usize)> {
    let rest = text.get(i..)?;
    let fixed_hex = |from: usize, len: usize| rest.get(from..from + len).and_then(hex_value);
    match rest.as_bytes().first()? {
        b'\\' => match rest.as_bytes().get(1)? {
            b'u' => {
                let unit = fixed_hex(2, 4)?;
                if (0xD800..0xDC00).contains(&unit) && rest.get(6..8) == Some("\\u") {
                    let low = fixed_hex(8, 4)?;
                    if (0xDC00..0xE000).contains(&low) {
                        let code = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00);
                        return char::from_u32(code).map(|c| (c, 12));
                    }
                }
                char::from_u32(unit).map(|c| (c, 6))
            }
            b'x' => fixed_hex(2, 2).and_then(char::from_u32).map(|c| (c, 4)),
            b'/' => Some(('/', 2)),
            b'\\' => Some(('\\', 2)),
            b'"' => Some(('"', 2)),
            b'\'' => Some(('\'', 2)),
            _ => None,
        },
        // A byte, read as Latin-1 (a UTF-8 key read so is one of the needles).
        b'%' => fixed_hex(1, 2).and_then(char::from_u32).map(|c| (c, 3)),
        b'&' => {
            let body = rest.get(2..)?;
            if rest.as_bytes().get(1) != Some(&b'#') {
                return None;
            }
            // Looked for in a short window only, so a text of many `&` stays linear.
            let end = body.bytes().take(9).position(|b| b == b';')?;
            let digits = body.get(..end)?;
            let code = match digits.strip_prefix(['x', 'X']) {
                Some(hex) => hex_value(hex)?,
                None if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
                    digits.parse().ok()?
                }
                None => return None,
            };
            char::from_u32(code).map(|c| (c, 2 + end + 1))
        }
        _ => None,
    }
}

fn merge(mut spans: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    spans.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
    for (start, end) in spans {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

fn redact(text: &str, spans: &[(usize, usize)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for &(start, end) in spans {
        out.push_str(text.get(at..start).unwrap_or_default());
        out.push_str(REDACTED);
        at = end;
    }
    out.push_str(text.get(at..).unwrap_or_default());
    out
}

/// Scrubs text that arrives piece by piece: a tail that could be the start of
/// a key is held back until more arrives or the stream ends.
#[derive(Debug)]
pub struct StreamScrub {
    scrubbers: Vec<KeyScrubber>,
    /// Longest original span any key's match may cover.
    hold: usize,
    pending: String,
}

impl StreamScrub {
    pub(crate) fn new(scrubbers: Vec<KeyScrubber>) -> StreamScrub {
        StreamScrub {
            hold: scrubbers.iter().map(|s| s.hold).max().unwrap_or(0),
            scrubbers,
            pending: String::new(),
        }
    }

    /// Takes in one piece; returns the scrubbed text now safe to pass on.
    pub fn push(&mut self, piece: &str) -> String {
        if self.scrubbers.is_empty() {
            return piece.to_string();
        }
        self.pending.push_str(piece);
        if self.pending.len() <= self.hold {
            return String::new();
        }
        let spans = find_all(&self.scrubbers, &self.pending);
        let mut cut = self.pending.len() - self.hold;
        while !self.pending.is_char_boundary(cut) {
            cut -= 1;
        }
        // A match reaching past the cut is held back whole. Any match that
        // starts before the cut has fully arrived, as no match is longer than
        // the held tail.
        if let Some(&(start, _)) = spans.iter().find(|(start, end)| *start < cut && cut < *end) {
            cut = start;
        }
        let done: Vec<(usize, usize)> = spans.into_iter().filter(|(_, end)| *end <= cut).collect();
        let out = redact(self.pending.get(..cut).unwrap_or_default(), &done);
        self.pending.drain(..cut);
        out
    }

    /// The held tail, scrubbed, at the end of the stream.
    pub fn finish(self) -> String {
        let spans = find_all(&self.scrubbers, &self.pending);
        redact(&self.pending, &spans)
    }
}

const STANDARD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL_SAFE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// The base64 characters that depend on `key` alone when it sits `offset`
/// bytes into the encoded data: the part every encoding of it contains.
fn base64_inner(key: &[u8], offset: usize, alphabet: &[u8; 64]) -> String {
    let mut data = vec![0u8; offset];
    data.extend_from_slice(key);
    data.extend_from_slice(&[0, 0]);
    let mut encoded = String::new();
    for group in data.chunks(3) {
        let b = [
            group.first().copied().unwrap_or(0),
            group.get(1).copied().unwrap_or(0),
            group.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for shift in [18, 12, 6, 0] {
            let index = usize::try_from((n >> shift) & 63).unwrap_or(0);
            encoded.push(char::from(alphabet.get(index).copied().unwrap_or(b'A')));
        }
    }
    // Character i covers bits [6i, 6i + 6); keep those inside the key's bits.
    let first = (8 * offset).div_ceil(6);
    let end = 8 * (offset + key.len()) / 6;
    encoded.get(first..end).unwrap_or_default().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-test/Secret+Key_0123456789";

    fn scrubber() -> KeyScrubber {
        KeyScrubber::new(Some(KEY)).expect("a key")
    }

    fn standard_base64(data: &[u8]) -> String {
        let mut out = String::new();
        for group in data.chunks(3) {
            let b = [
                group[0],
                group.get(1).copied().unwrap_or(0),
                group.get(2).copied().unwrap_or(0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            let chars = group.len() + 1;
            for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
                if i < chars {
                    out.push(char::from(STANDARD[((n >> shift) & 63) as usize]));
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    #[test]
    fn no_key_means_nothing_to_scrub() {
        assert!(KeyScrubber::new(None).is_none());
        assert!(KeyScrubber::new(Some("")).is_none());
    }

    #[test]
    fn every_encoding_of_the_key_is_redacted() {
        let s = scrubber();
        let json_all: String = KEY
            .chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect();
        let json_upper: String = KEY
            .chars()
            .map(|c| format!("\\u{:04X}", c as u32))
            .collect();
        let percent: String = KEY.bytes().map(|b| format!("%{b:02X}")).collect();
        let percent_lower: String = KEY.bytes().map(|b| format!("%{b:02x}")).collect();
        let entities: String = KEY.chars().map(|c| format!("&#{};", c as u32)).collect();
        let hex_entities: String = KEY.chars().map(|c| format!("&#x{:x};", c as u32)).collect();
        let python: String = KEY.bytes().map(|b| format!("\\x{b:02x}")).collect();
        let double: String = KEY.bytes().map(|b| format!("%5Cu{:04x}", b)).collect();
        let forms = [
            KEY.to_string(),
            KEY.replace('/', "\\/"),
            json_all,
            json_upper,
            percent,
            percent_lower,
            entities,
            hex_entities,
            python,
            double,
            // Mixed: some characters escaped, some not.
            format!("sk\\u002dtest%2FSecret+Key&#95;0123\\x34{}", &KEY[24..]),
        ];
        for form in forms {
            let text = format!("error: invalid key \"{form}\" given");
            assert_eq!(
                s.scrub(&text),
                "error: invalid key \"[redacted]\" given",
                "{form}"
            );
        }
    }

    #[test]
    fn base64_of_the_key_is_redacted_at_any_alignment() {
        let s = scrubber();
        for prefix in ["", "a", "ab", "abc", "Bearer:"] {
            let blob = standard_base64(format!("{prefix}{KEY}!trailer").as_bytes());
            let scrubbed = s.scrub(&format!("token={blob}"));
            assert!(scrubbed.contains(REDACTED), "{prefix:?}: {scrubbed}");
            // What is left cannot be decoded back into the key.
            assert!(!scrubbed.contains(&blob[4..blob.len() - 4]), "{scrubbed}");
        }
        let url_safe = standard_base64(KEY.as_bytes())
            .replace('+', "-")
            .replace('/', "_");
        assert!(s.scrub(&url_safe).contains(REDACTED));
        // Base64 inside JSON with escaped slashes.
        let escaped = standard_base64(format!("xx{KEY}").as_bytes()).replace('/', "\\/");
        assert!(s.scrub(&escaped).contains(REDACTED), "{escaped}");
    }

    #[test]
    fn a_non_ascii_key_read_as_latin1_is_redacted() {
        let key = "clé-secrète-42";
        let s = KeyScrubber::new(Some(key)).expect("a key");
        let mojibake: String = key.bytes().map(char::from).collect();
        assert_eq!(s.scrub(&format!("[{mojibake}]")), "[[redacted]]");
        let percent: String = key.bytes().map(|b| format!("%{b:02X}")).collect();
        assert_eq!(s.scrub(&format!("[{percent}]")), "[[redacted]]");
        let escaped: String = key
            .chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect();
        assert_eq!(s.scrub(&format!("[{escaped}]")), "[[redacted]]");
    }

    #[test]
    fn ordinary_text_and_odd_escapes_are_left_alone() {
        let s = scrubber();
        for text in [
            "plain text with sk-test but not the key",
            "broken escapes \\u12 \\x4 %G1 &#; &#x; &#99999999; \\",
            "emoji \\ud83d\\ude00 and a lone \\ud83d surrogate",
            "50% of 100%",
        ] {
            assert_eq!(s.scrub(text), text);
        }
    }

    #[test]
    fn a_key_split_across_stream_pieces_never_gets_out() {
        let s = scrubber();
        let encoded: String = KEY
            .chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect();
        let b64 = standard_base64(format!("q{KEY}").as_bytes());
        for form in [KEY.to_string(), encoded, b64] {
            let text = format!(
                "{}here it is: {form} and more{}",
                "x".repeat(700),
                "y".repeat(700)
            );
            for size in [1, 2, 3, 7, 64, 1000] {
                let mut stream = StreamScrub::new(vec![s.clone()]);
                let mut out = String::new();
                let chars: Vec<char> = text.chars().collect();
                for piece in chars.chunks(size) {
                    out.push_str(&stream.push(&piece.iter().collect::<String>()));
                }
                out.push_str(&stream.finish());
                assert_eq!(out, s.scrub(&text), "size {size}");
                assert!(out.contains(REDACTED));
                assert!(!out.contains(KEY));
            }
        }
    }

    #[test]
    fn long_texts_are_scrubbed_window_by_window() {
        let s = scrubber();
        let filler = "é".repeat(WHOLE_TEXT_LIMIT);
        let text = format!("{filler}{KEY}{filler}{}", KEY.replace('/', "\\/"));
        let scrubbed = s.scrub(&text);
        assert_eq!(scrubbed, format!("{filler}[redacted]{filler}[redacted]"));
    }
}
