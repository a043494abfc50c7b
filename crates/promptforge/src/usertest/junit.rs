//! JUnit XML for CI: one `<testsuite>` per test file, one `<testcase>` per
//! case (classname the file, time in seconds; in a matrix one per case and
//! column, named `CASE [COLUMN]`), a `<failure>` with the rendered
//! assertions for each failing case.

use super::CaseOutcome;

/// XML text with the five special characters escaped and control
/// characters (not allowed in XML 1.0) dropped.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' | '\r' => out.push(c),
            c if (c as u32) < 0x20 => {}
            c => out.push(c),
        }
    }
    out
}

/// The whole report, cases grouped by file in the order given.
pub fn render(outcomes: &[CaseOutcome]) -> String {
    let mut files: Vec<&str> = Vec::new();
    for o in outcomes {
        if !files.contains(&o.file.as_str()) {
            files.push(&o.file);
        }
    }
    let total_failed = outcomes.iter().filter(|o| !o.passed).count();
    let mut columns: Vec<&str> = outcomes
        .iter()
        .filter_map(|o| o.cell.as_ref().map(|c| c.column.as_str()))
        .collect();
    columns.sort_unstable();
    columns.dedup();
    let matrix = columns.len() > 1;
    let total_time: f64 = outcomes.iter().map(|o| o.duration_ms as f64 / 1000.0).sum();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    out.push_str(&format!(
        "<testsuites name=\"promptforge test\" tests=\"{}\" failures=\"{total_failed}\" errors=\"0\" time=\"{total_time:.3}\">\n",
        outcomes.len()
    ));
    for file in files {
        let cases: Vec<&CaseOutcome> = outcomes.iter().filter(|o| o.file == file).collect();
        let failed = cases.iter().filter(|o| !o.passed).count();
        let time: f64 = cases.iter().map(|o| o.duration_ms as f64 / 1000.0).sum();
        out.push_str(&format!(
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failed}\" errors=\"0\" skipped=\"0\" time=\"{time:.3}\">\n",
            esc(file),
            cases.len()
        ));
        for c in cases {
            // In a matrix each case runs once per column: the column names the testcase too.
            let name = match c
                .cell
                .as_ref()
                .filter(|cell| !cell.column.is_empty() && matrix)
            {
                Some(cell) => format!("{} [{}]", c.name, cell.column),
                None => c.name.clone(),
            };
            out.push_str(&format!(
                "    <testcase name=\"{}\" classname=\"{}\" time=\"{:.3}\"",
                esc(&name),
                esc(file),
                c.duration_ms as f64 / 1000.0
            ));
            if c.passed {
                out.push_str("/>\n");
            } else {
                let first = c
                    .failures
                    .first()
                    .map(|f| f.message.clone())
                    .or_else(|| c.error.clone())
                    .unwrap_or_else(|| "failed".into());
                out.push_str(&format!(
                    ">\n      <failure message=\"{}\" type=\"assertion\">{}</failure>\n    </testcase>\n",
                    esc(&first),
                    esc(&c.details())
                ));
            }
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
}
