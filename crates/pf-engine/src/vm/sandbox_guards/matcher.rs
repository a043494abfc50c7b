//! Lua 5.5's pattern matcher (lstrlib.c), step for step, with a poll of the
//! run's cancel every few thousand steps. The C matcher never runs a VM
//! instruction, so the count hook cannot stop a pattern that backtracks for
//! hours; this one returns [`MatchError::Interrupted`] instead.
//!
//! Every unit of work counts, not only entering a match step: each subject
//! byte a pattern item consumes (a long literal run is compared byte by byte
//! inside one step), and work whose cost grows with the pattern or the
//! subject (a long `[set]` scanned per byte, a back-reference compared as a
//! block) counts in proportion to its length ([`Matcher::tick_by`]).

/// Lua's `MAXCCALLS` for `match`: the recursion depth before "pattern too complex".
const MAX_DEPTH: usize = 200;
/// Lua's `LUA_MAXCAPTURES`.
const MAX_CAPTURES: usize = 32;
const CAP_UNFINISHED: isize = -1;
const CAP_POSITION: isize = -2;
/// Steps between two polls of the cancel flag.
const POLL_EVERY: u32 = 1 << 12;
/// Bytes of a block comparison or a set scan that count as one step.
const BYTES_PER_STEP: usize = 64;
const L_ESC: u8 = b'%';
const SPECIALS: &[u8] = b"^$*+?.([%-";

#[derive(Debug, PartialEq)]
pub(crate) enum MatchError {
    /// Lua's own message, without the position prefix.
    Message(String),
    /// The run was cancelled (or ended) while matching.
    Interrupted,
}

type Step<T> = Result<T, MatchError>;

fn fail<T>(message: impl Into<String>) -> Step<T> {
    Err(MatchError::Message(message.into()))
}

/// One capture as Lua pushes it: a substring (byte range) or a position (1-based).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Capture {
    Text(usize, usize),
    Position(usize),
}

/// True when the pattern has none of Lua's special characters (find then does a plain search).
pub(crate) fn no_specials(pattern: &[u8]) -> bool {
    !pattern.iter().any(|b| SPECIALS.contains(b))
}

pub(crate) struct Matcher<'a> {
    src: &'a [u8],
    pat: &'a [u8],
    depth: usize,
    level: usize,
    capture: [(usize, isize); MAX_CAPTURES],
    /// Steps left before the next poll of the cancel.
    until_poll: u32,
    interrupted: &'a dyn Fn() -> bool,
}

impl<'a> Matcher<'a> {
    /// `pat` is the pattern without its `^` anchor.
    pub(crate) fn new(src: &'a [u8], pat: &'a [u8], interrupted: &'a dyn Fn() -> bool) -> Self {
        Matcher {
            src,
            pat,
            depth: MAX_DEPTH,
            level: 0,
            capture: [(0, 0); MAX_CAPTURES],
            until_poll: POLL_EVERY,
            interrupted,
        }
    }

    /// Count one step; every `POLL_EVERY` steps, ask whether the run was cancelled.
    #[inline]
    pub(crate) fn tick(&mut self) -> Step<()> {
        self.tick_by(1)
    }

    /// Count `steps` steps at once (work whose cost grows with a length).
    #[inline]
    fn tick_by(&mut self, steps: u32) -> Step<()> {
        if steps < self.until_poll {
            self.until_poll -= steps;
            return Ok(());
        }
        self.until_poll = POLL_EVERY;
        if (self.interrupted)() {
            return Err(MatchError::Interrupted);
        }
        Ok(())
    }

    /// The steps `bytes` bytes of block work count as.
    fn bytes_cost(bytes: usize) -> u32 {
        u32::try_from(bytes / BYTES_PER_STEP).unwrap_or(u32::MAX)
    }

    /// [`Self::single_match`], counted: one step, plus the set's length for a `[set]`.
    #[inline]
    fn single_match_counted(&mut self, s: usize, p: usize, ep: usize) -> Step<bool> {
        let cost = if self.p(p) == b'[' {
            1 + Self::bytes_cost(ep - p)
        } else {
            1
        };
        self.tick_by(cost)?;
        Ok(self.single_match(s, p, ep))
    }

    /// The pattern byte at `i`, `0` past the end (C reads the terminating NUL there).
    #[inline]
    pub(crate) fn p(&self, i: usize) -> u8 {
        self.pat.get(i).copied().unwrap_or(0)
    }

    /// The subject byte at `i`, `0` past the end.
    #[inline]
    fn s(&self, i: usize) -> u8 {
        self.src.get(i).copied().unwrap_or(0)
    }

    /// Try a match starting exactly at `s`: the end of the match, if any.
    pub(crate) fn match_at(&mut self, s: usize) -> Step<Option<usize>> {
        self.level = 0;
        self.do_match(s, 0)
    }

    pub(crate) fn classend(&self, mut p: usize) -> Step<usize> {
        let c = self.p(p);
        p += 1;
        match c {
            L_ESC => {
                if p >= self.pat.len() {
                    return fail("malformed pattern (ends with '%')");
                }
                Ok(p + 1)
            }
            b'[' => {
                if self.p(p) == b'^' {
                    p += 1;
                }
                loop {
                    if p >= self.pat.len() {
                        return fail("malformed pattern (missing ']')");
                    }
                    let c = self.pat[p];
                    p += 1;
                    if c == L_ESC && p < self.pat.len() {
                        p += 1;
                    }
                    if self.p(p) == b']' {
                        break;
                    }
                }
                Ok(p + 1)
            }
            _ => Ok(p),
        }
    }

    fn bracket_class(&self, c: u8, mut p: usize, ec: usize) -> bool {
        let mut sig = true;
        if self.p(p + 1) == b'^' {
            sig = false;
            p += 1;
        }
        loop {
            p += 1;
            if p >= ec {
                break;
            }
            if self.pat[p] == L_ESC {
                p += 1;
                if match_class(c, self.p(p)) {
                    return sig;
                }
            } else if self.p(p + 1) == b'-' && p + 2 < ec {
                p += 2;
                if self.pat[p - 2] <= c && c <= self.pat[p] {
                    return sig;
                }
            } else if self.pat[p] == c {
                return sig;
            }
        }
        !sig
    }

    fn single_match(&self, s: usize, p: usize, ep: usize) -> bool {
        if s >= self.src.len() {
            return false;
        }
        let c = self.src[s];
        match self.p(p) {
            b'.' => true,
            L_ESC => match_class(c, self.p(p + 1)),
            b'[' => self.bracket_class(c, p, ep - 1),
            other => other == c,
        }
    }

    fn match_balance(&mut self, mut s: usize, p: usize) -> Step<Option<usize>> {
        if p + 1 >= self.pat.len() {
            return fail("malformed pattern (missing arguments to '%b')");
        }
        if self.s(s) != self.pat[p] {
            return Ok(None);
        }
        let (open, close) = (self.pat[p], self.pat[p + 1]);
        let mut depth = 1usize;
        loop {
            s += 1;
            if s >= self.src.len() {
                return Ok(None);
            }
            self.tick()?;
            let c = self.src[s];
            if c == close {
                depth -= 1;
                if depth == 0 {
                    return Ok(Some(s + 1));
                }
            } else if c == open {
                depth += 1;
            }
        }
    }

    fn max_expand(&mut self, s: usize, p: usize, ep: usize) -> Step<Option<usize>> {
        let mut i = 0usize;
        while self.single_match_counted(s + i, p, ep)? {
            i += 1;
        }
        loop {
            if let Some(res) = self.do_match(s + i, ep + 1)? {
                return Ok(Some(res));
            }
            if i == 0 {
                return Ok(None);
            }
            i -= 1;
        }
    }

    fn min_expand(&mut self, mut s: usize, p: usize, ep: usize) -> Step<Option<usize>> {
        loop {
            if let Some(res) = self.do_match(s, ep + 1)? {
                return Ok(Some(res));
            }
            if self.single_match_counted(s, p, ep)? {
                s += 1;
            } else {
                return Ok(None);
            }
        }
    }

    fn start_capture(&mut self, s: usize, p: usize, what: isize) -> Step<Option<usize>> {
        if self.level >= MAX_CAPTURES {
            return fail("too many captures");
        }
        self.capture[self.level] = (s, what);
        self.level += 1;
        let res = self.do_match(s, p)?;
        if res.is_none() {
            self.level -= 1;
        }
        Ok(res)
    }

    fn end_capture(&mut self, s: usize, p: usize) -> Step<Option<usize>> {
        let Some(l) = (0..self.level)
            .rev()
            .find(|&l| self.capture[l].1 == CAP_UNFINISHED)
        else {
            return fail("invalid pattern capture");
        };
        self.capture[l].1 = (s - self.capture[l].0) as isize;
        let res = self.do_match(s, p)?;
        if res.is_none() {
            self.capture[l].1 = CAP_UNFINISHED;
        }
        Ok(res)
    }

    fn check_capture(&self, c: u8) -> Step<usize> {
        let l = i32::from(c) - i32::from(b'1');
        if l < 0 || l as usize >= self.level || self.capture[l as usize].1 == CAP_UNFINISHED {
            return fail(format!("invalid capture index %{}", l + 1));
        }
        Ok(l as usize)
    }

    fn match_capture(&mut self, s: usize, c: u8) -> Step<Option<usize>> {
        let l = self.check_capture(c)?;
        let (init, len) = self.capture[l];
        let Ok(len) = usize::try_from(len) else {
            return Ok(None);
        };
        self.tick_by(Self::bytes_cost(len))?;
        if self.src.len() - s >= len && self.src[init..init + len] == self.src[s..s + len] {
            Ok(Some(s + len))
        } else {
            Ok(None)
        }
    }

    fn do_match(&mut self, mut s: usize, mut p: usize) -> Step<Option<usize>> {
        if self.depth == 0 {
            return fail("pattern too complex");
        }
        self.depth -= 1;
        self.tick()?;
        let result = loop {
            if p >= self.pat.len() {
                break Some(s);
            }
            match self.pat[p] {
                b'(' => {
                    break if self.p(p + 1) == b')' {
                        self.start_capture(s, p + 2, CAP_POSITION)?
                    } else {
                        self.start_capture(s, p + 1, CAP_UNFINISHED)?
                    };
                }
                b')' => break self.end_capture(s, p + 1)?,
                b'$' if p + 1 == self.pat.len() => break (s == self.src.len()).then_some(s),
                L_ESC if self.p(p + 1) == b'b' => match self.match_balance(s, p + 2)? {
                    Some(next) => {
                        s = next;
                        p += 4;
                    }
                    None => break None,
                },
                L_ESC if self.p(p + 1) == b'f' => {
                    p += 2;
                    if self.p(p) != b'[' {
                        return fail("missing '[' after '%f' in pattern");
                    }
                    let ep = self.classend(p)?;
                    self.tick_by(1 + Self::bytes_cost(ep - p))?;
                    let previous = if s == 0 { 0 } else { self.src[s - 1] };
                    if !self.bracket_class(previous, p, ep - 1)
                        && self.bracket_class(self.s(s), p, ep - 1)
                    {
                        p = ep;
                    } else {
                        break None;
                    }
                }
                L_ESC if self.p(p + 1).is_ascii_digit() => {
                    match self.match_capture(s, self.p(p + 1))? {
                        Some(next) => {
                            s = next;
                            p += 2;
                        }
                        None => break None,
                    }
                }
                _ => {
                    let ep = self.classend(p)?;
                    let suffix = self.p(ep);
                    // Counted per item, not per step: a literal run of any
                    // length is compared inside one step.
                    if !self.single_match_counted(s, p, ep)? {
                        if matches!(suffix, b'*' | b'?' | b'-') {
                            p = ep + 1;
                            continue;
                        }
                        break None;
                    }
                    match suffix {
                        b'?' => {
                            if let Some(res) = self.do_match(s + 1, ep + 1)? {
                                break Some(res);
                            }
                            p = ep + 1;
                        }
                        b'+' => break self.max_expand(s + 1, p, ep)?,
                        b'*' => break self.max_expand(s, p, ep)?,
                        b'-' => break self.min_expand(s, p, ep)?,
                        _ => {
                            s += 1;
                            p = ep;
                        }
                    }
                }
            }
        };
        self.depth += 1;
        Ok(result)
    }

    /// Capture `i` of a match over `s..e` (the whole match when there are none).
    pub(crate) fn capture(&self, i: usize, s: usize, e: usize) -> Step<Capture> {
        if i >= self.level {
            if i != 0 {
                return fail(format!("invalid capture index %{}", i + 1));
            }
            return Ok(Capture::Text(s, e));
        }
        let (init, len) = self.capture[i];
        match len {
            CAP_UNFINISHED => fail("unfinished capture"),
            CAP_POSITION => Ok(Capture::Position(init + 1)),
            len => Ok(Capture::Text(init, init + len as usize)),
        }
    }

    /// The values a match pushes: its captures, or the whole match when it has
    /// none and `whole` is given (find passes `None`: no captures, no values).
    pub(crate) fn captures(&self, whole: Option<(usize, usize)>) -> Step<Vec<Capture>> {
        let (s, e) = whole.unwrap_or((0, 0));
        let count = if self.level == 0 && whole.is_some() {
            1
        } else {
            self.level
        };
        (0..count).map(|i| self.capture(i, s, e)).collect()
    }
}

/// How much matching the C library may do in one call and still be stopped in
/// time by a cancel: a bound on its steps (each a few nanoseconds). The bound
/// below overestimates real backtracking (`.-.-.-.-b` does about n^5/120 of
/// its n^5), so a call admitted to C ends well within 100 ms.
pub(crate) const C_STEP_BUDGET: f64 = (1u64 << 25) as f64;

/// The longest subject the C library may match `pattern` against directly: its
/// worst case stays within [`C_STEP_BUDGET`], and the pattern cannot raise any
/// error (a C error would be placed at the guard, not the prompt's line).
/// `-1` when the pattern must always take the polling matcher.
///
/// The bound: per start position at most `(len + 1) · 2^optionals · (n + 1)^repeats`
/// steps (`repeats` counts `*`, `+`, `-`, `%b` and back-references), times `n + 1`
/// start positions unless the pattern is anchored.
pub(crate) fn c_subject_limit(pattern: &[u8]) -> i64 {
    let (pat, anchored) = match pattern.first() {
        Some(b'^') => (&pattern[1..], true),
        _ => (pattern, false),
    };
    let never = || false;
    let m = Matcher::new(b"", pat, &never);
    let (mut repeats, mut optionals, mut nesting) = (0u32, 0u32, 0u32);
    let mut level = 0usize;
    let mut open: Vec<usize> = Vec::new();
    let mut closed = [false; MAX_CAPTURES];
    let mut i = 0;
    while i < pat.len() {
        match pat[i] {
            b'(' => {
                if level >= MAX_CAPTURES {
                    return -1;
                }
                if m.p(i + 1) == b')' {
                    closed[level] = true;
                    i += 2;
                } else {
                    open.push(level);
                    i += 1;
                }
                level += 1;
                nesting += 1;
            }
            b')' => {
                let Some(l) = open.pop() else { return -1 };
                closed[l] = true;
                nesting += 1;
                i += 1;
            }
            b'$' if i + 1 == pat.len() => i += 1,
            L_ESC if m.p(i + 1) == b'b' => {
                if i + 4 > pat.len() {
                    return -1;
                }
                repeats += 1;
                i += 4;
            }
            L_ESC if m.p(i + 1) == b'f' => {
                if m.p(i + 2) != b'[' {
                    return -1;
                }
                match m.classend(i + 2) {
                    Ok(ep) => i = ep,
                    Err(_) => return -1,
                }
            }
            L_ESC if m.p(i + 1).is_ascii_digit() => {
                let d = usize::from(m.p(i + 1));
                if d == usize::from(b'0')
                    || d - usize::from(b'1') >= level
                    || !closed[d - usize::from(b'1')]
                {
                    return -1;
                }
                repeats += 1;
                i += 2;
            }
            _ => {
                let Ok(ep) = m.classend(i) else { return -1 };
                match m.p(ep) {
                    b'*' | b'+' | b'-' => {
                        repeats += 1;
                        nesting += 1;
                        i = ep + 1;
                    }
                    b'?' => {
                        optionals += 1;
                        nesting += 1;
                        i = ep + 1;
                    }
                    _ => i = ep,
                }
            }
        }
    }
    // An unfinished capture raises when pushed; deep nesting may be "too complex".
    if !open.is_empty() || nesting > 150 || optionals > 20 {
        return -1;
    }
    let exponent = repeats + u32::from(!anchored);
    let per_step = (pat.len() as f64 + 1.0) * f64::from(1u32 << optionals);
    let room = C_STEP_BUDGET / per_step;
    if exponent == 0 {
        // An anchored pattern without repeats does the same work on any
        // subject: its own length times the optional items' branches, which
        // may still be far past the budget (`^a?a?...a?b`).
        return if room >= 1.0 { i64::MAX } else { -1 };
    }
    if room < 1.0 {
        return -1;
    }
    let n = room.powf(1.0 / f64::from(exponent)).floor() - 1.0;
    if n < 0.0 {
        -1
    } else {
        n as i64
    }
}

/// C's `match_class` under the "C" locale.
fn match_class(c: u8, class: u8) -> bool {
    let res = match class.to_ascii_lowercase() {
        b'a' => c.is_ascii_alphabetic(),
        b'c' => c.is_ascii_control(),
        b'd' => c.is_ascii_digit(),
        b'g' => c.is_ascii_graphic(),
        b'l' => c.is_ascii_lowercase(),
        b'p' => c.is_ascii_punctuation(),
        b's' => matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r'),
        b'u' => c.is_ascii_uppercase(),
        b'w' => c.is_ascii_alphanumeric(),
        b'x' => c.is_ascii_hexdigit(),
        b'z' => c == 0,
        _ => return class == c,
    };
    if class.is_ascii_lowercase() {
        res
    } else {
        !res
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(s: &str, p: &str) -> Step<Option<(usize, usize)>> {
        let never = || false;
        let m = &mut Matcher::new(s.as_bytes(), p.as_bytes(), &never);
        for start in 0..=s.len() {
            if let Some(e) = m.match_at(start)? {
                return Ok(Some((start, e)));
            }
        }
        Ok(None)
    }

    #[test]
    fn matches_like_lua() {
        assert_eq!(find("hello world", "o w"), Ok(Some((4, 7))));
        assert_eq!(find("hello", "l+"), Ok(Some((2, 4))));
        assert_eq!(find("THE (quick) fox", "%((%a+)%)"), Ok(Some((4, 11))));
        assert_eq!(find("abc", "%f[%w]%w+"), Ok(Some((0, 3))));
        assert_eq!(find("x", "[%a"), fail("malformed pattern (missing ']')"));
        assert_eq!(find("x", "x%"), fail("malformed pattern (ends with '%')"));
    }

    #[test]
    fn only_short_subjects_and_tame_patterns_go_to_c() {
        assert!(c_subject_limit(b".-.-.-.-b") < 100);
        assert!(c_subject_limit(b"%w+") > 1000);
        assert_eq!(c_subject_limit(b"^abc"), i64::MAX);
        // Anchored, no repeats, but 2^20 branches of optional items: never C.
        let optionals = format!("^{}b", "a?".repeat(20));
        assert_eq!(c_subject_limit(optionals.as_bytes()), -1);
        assert_eq!(c_subject_limit(b"^a?a?b"), i64::MAX);
        for wild in [
            &b"x%"[..],
            b"[a",
            b"(a",
            b"a)",
            b"%1",
            b"(a)%2",
            b"%b(",
            b"%fx",
            b"(%w+",
        ] {
            assert_eq!(
                c_subject_limit(wild),
                -1,
                "{}",
                String::from_utf8_lossy(wild)
            );
        }
        assert!(c_subject_limit(b"(a)%1") > 0 && c_subject_limit(b"%b()") > 0);
    }

    /// One match step that compares a long literal run (or a long set, or a
    /// back-reference) polls inside it, not only when the step begins.
    #[test]
    fn long_literals_sets_and_back_references_poll_within_a_step() {
        let polls = std::cell::Cell::new(0u32);
        let count = || {
            polls.set(polls.get() + 1);
            false
        };
        let subject = "a".repeat(1 << 20);
        let literal = "a".repeat(1 << 20);
        let m = &mut Matcher::new(subject.as_bytes(), literal.as_bytes(), &count);
        assert_eq!(m.match_at(0), Ok(Some(1 << 20)));
        assert!(polls.get() >= 200, "a literal run: {} polls", polls.get());

        polls.set(0);
        let set = format!("[{}a]*$", "b".repeat(1 << 16));
        let m = &mut Matcher::new(&subject.as_bytes()[..1 << 12], set.as_bytes(), &count);
        assert_eq!(m.match_at(0), Ok(Some(1 << 12)));
        assert!(polls.get() >= 200, "a long set: {} polls", polls.get());

        polls.set(0);
        let m = &mut Matcher::new(subject.as_bytes(), b"(.*)%1", &count);
        assert_eq!(m.match_at(0), Ok(Some(1 << 20)));
        assert!(polls.get() >= 1, "a back-reference: {} polls", polls.get());
    }

    #[test]
    fn a_backtracking_pattern_stops_when_interrupted() {
        let s = "a".repeat(30_000);
        let always = || true;
        let m = &mut Matcher::new(s.as_bytes(), b".-.-.-.-b", &always);
        assert_eq!(m.match_at(0), Err(MatchError::Interrupted));
    }
}
