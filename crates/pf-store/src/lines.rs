//! Line ranges and numbered reads (guide ch. 09 "Line ranges and numbered reads").

/// Why a line range was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LineRangeRejection {
    /// `start` is below 1 (a negative bound counts as 0).
    StartBelowOne,
    /// `end` is before `start` once clamped, including an `end` of zero or below.
    EndBeforeStart,
    /// `end` was given with a nil `start`.
    StartRequired,
}

impl LineRangeRejection {
    /// The reason text that follows `invalid line range for {path}: `.
    pub fn reason(self) -> &'static str {
        match self {
            LineRangeRejection::StartBelowOne => "start must be at least 1",
            LineRangeRejection::EndBeforeStart => "end must not be before start",
            LineRangeRejection::StartRequired => "start is required when end is given",
        }
    }
}

/// Converts a Lua float bound to an integer bound: a whole value anywhere in
/// the 64-bit signed range is accepted (`2.0` is `2`); anything else is not.
pub fn bound_from_float(value: f64) -> Option<i64> {
    // -2^63 is exactly representable; 2^63 is the first float past i64::MAX.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if value.fract() == 0.0 && (-LIMIT..LIMIT).contains(&value) {
        // The range check above makes the cast exact.
        Some(value as i64)
    } else {
        None
    }
}

/// The selected lines and the absolute number of the first one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LineSlice<'a> {
    pub(crate) first_number: usize,
    pub(crate) lines: Vec<&'a str>,
}

/// Lines split at `\n` or `\r\n`; a final newline adds no empty last line.
fn split_lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

/// Applies the bound rules in the guide's fixed order:
/// 1. `start` must be at least 1;
/// 2. a `start` past the last line selects nothing, `end` unseen;
/// 3. an omitted `end` means the last line;
/// 4. an `end` past the last line clamps to it;
/// 5. only then must `end` not be before `start`.
pub(crate) fn select(
    text: &str,
    start: i64,
    end: Option<i64>,
) -> Result<LineSlice<'_>, LineRangeRejection> {
    if start < 1 {
        return Err(LineRangeRejection::StartBelowOne);
    }
    let lines = split_lines(text);
    let count = i64::try_from(lines.len()).unwrap_or(i64::MAX);
    if start > count {
        return Ok(LineSlice {
            first_number: 0,
            lines: Vec::new(),
        });
    }
    let last = end.map_or(count, |end| end.min(count));
    if last < start {
        return Err(LineRangeRejection::EndBeforeStart);
    }
    // 1 <= start <= last <= count, so both fit in usize and the range is in bounds.
    let first = usize::try_from(start - 1).unwrap_or(0);
    let through = usize::try_from(last).unwrap_or(0);
    Ok(LineSlice {
        first_number: first + 1,
        lines: lines
            .get(first..through)
            .map(<[_]>::to_vec)
            .unwrap_or_default(),
    })
}

/// Every line of the file, numbered from 1.
pub(crate) fn all(text: &str) -> LineSlice<'_> {
    LineSlice {
        first_number: 1,
        lines: split_lines(text),
    }
}

/// Joins the selected lines with `\n`, no trailing newline.
pub(crate) fn join_plain(slice: &LineSlice<'_>) -> String {
    slice.lines.join("\n")
}

/// `N| text` lines, numbers right-aligned to the widest number shown.
pub(crate) fn join_numbered(slice: &LineSlice<'_>) -> String {
    let last_number = slice.first_number + slice.lines.len().saturating_sub(1);
    let width = last_number.to_string().len();
    let mut out = String::new();
    for (offset, line) in slice.lines.iter().enumerate() {
        if offset > 0 {
            out.push('\n');
        }
        let number = slice.first_number + offset;
        out.push_str(&format!("{number:>width$}| {line}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(text: &str, start: i64, end: Option<i64>) -> Result<String, LineRangeRejection> {
        select(text, start, end).map(|slice| join_plain(&slice))
    }

    fn numbered(text: &str, start: i64, end: Option<i64>) -> Result<String, LineRangeRejection> {
        select(text, start, end).map(|slice| join_numbered(&slice))
    }

    #[test]
    fn guide_table_on_three_lines() {
        let p = "one\ntwo\nthree\n";
        assert_eq!(plain(p, 2, None), Ok("two\nthree".to_owned()));
        assert_eq!(plain(p, 2, Some(2)), Ok("two".to_owned()));
        assert_eq!(plain(p, 1, Some(2)), Ok("one\ntwo".to_owned()));
        assert_eq!(plain(p, 2, Some(99)), Ok("two\nthree".to_owned()));
        assert_eq!(plain(p, 3, Some(99)), Ok("three".to_owned()));
        assert_eq!(plain(p, 99, None), Ok(String::new()));
        assert_eq!(plain(p, 5, Some(2)), Ok(String::new()));
        assert_eq!(numbered(p, 2, Some(99)), Ok("2| two\n3| three".to_owned()));
        assert_eq!(numbered(p, 99, None), Ok(String::new()));
    }

    #[test]
    fn bound_errors_in_order() {
        let p = "one\ntwo\nthree\n";
        assert_eq!(plain(p, 0, None), Err(LineRangeRejection::StartBelowOne));
        assert_eq!(
            plain(p, -5, Some(-9)),
            Err(LineRangeRejection::StartBelowOne)
        );
        assert_eq!(
            plain(p, 2, Some(1)),
            Err(LineRangeRejection::EndBeforeStart)
        );
        assert_eq!(
            plain(p, 1, Some(0)),
            Err(LineRangeRejection::EndBeforeStart)
        );
        assert_eq!(
            plain(p, 1, Some(i64::MIN)),
            Err(LineRangeRejection::EndBeforeStart)
        );
        assert_eq!(plain(p, i64::MAX, Some(i64::MIN)), Ok(String::new()));
        assert_eq!(plain(p, 3, Some(i64::MAX)), Ok("three".to_owned()));
        assert_eq!(plain("", 0, None), Err(LineRangeRejection::StartBelowOne));
        assert_eq!(plain("", 1, Some(1)), Ok(String::new()));
    }

    #[test]
    fn crlf_and_final_newline() {
        assert_eq!(plain("a\r\nb\r\n", 1, None), Ok("a\nb".to_owned()));
        assert_eq!(join_numbered(&all("first\nsecond")), "1| first\n2| second");
        assert_eq!(
            join_numbered(&all("first\nsecond\n")),
            "1| first\n2| second"
        );
        assert_eq!(join_numbered(&all("")), "");
        assert_eq!(join_numbered(&all("\n")), "1| ");
    }

    #[test]
    fn number_width_follows_the_largest_number_shown() {
        let hundred: String = (1..=100).map(|n| format!("line{n}\n")).collect();
        assert_eq!(
            numbered(&hundred, 99, Some(100)),
            Ok(" 99| line99\n100| line100".to_owned())
        );
        let ten: String = (1..=10).map(|n| format!("line{n}\n")).collect();
        let whole = join_numbered(&all(&ten));
        assert!(whole.starts_with(" 1| line1\n 2| line2"), "{whole}");
        assert!(whole.ends_with("\n10| line10"), "{whole}");
        let eighty_five: String = (1..=85).map(|n| format!("line{n}\n")).collect();
        assert_eq!(
            numbered(&eighty_five, 84, Some(85)),
            Ok("84| line84\n85| line85".to_owned())
        );
    }

    #[test]
    fn float_bounds() {
        assert_eq!(bound_from_float(2.0), Some(2));
        assert_eq!(bound_from_float(-3.0), Some(-3));
        assert_eq!(bound_from_float(2.5), None);
        assert_eq!(bound_from_float(f64::NAN), None);
        assert_eq!(bound_from_float(f64::INFINITY), None);
        assert_eq!(
            bound_from_float(-9_223_372_036_854_775_808.0),
            Some(i64::MIN)
        );
        assert_eq!(bound_from_float(9_223_372_036_854_775_808.0), None);
    }
}
