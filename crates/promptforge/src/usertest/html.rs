//! `test --html FILE`: the comparison matrix as one self-contained page, by
//! the trace page's rules (inline CSS and one inline script admitted by a
//! nonce, nothing fetched, every string through [`esc`]): a grid of cases
//! by models and prompt versions, coloured by result, sortable by any
//! column, each cell's result, failure, tokens, cost and latency, the
//! column totals, and a link to each run's own trace page, written into
//! `NAME.traces/` beside the page.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use pf_trace::html::esc;

use super::matrix::{cell_text, money, ColumnTotals};
use super::CaseOutcome;

const STYLE: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d1d1f;background:#fafafa}
h1{font-size:1.3em;margin:0 0 .3em}
.meta{color:#555;margin:0 0 1em}
table{border-collapse:collapse;background:#fff}
th,td{border:1px solid #d0d0d5;padding:.45em .6em;vertical-align:top;text-align:left}
thead th{background:#eceef3;cursor:pointer;user-select:none;white-space:nowrap}
thead th[aria-sort=ascending]::after{content:' \\25B2'}
thead th[aria-sort=descending]::after{content:' \\25BC'}
tbody th{font-weight:500;max-width:22em}
td.pass{background:#e3f5e1}
td.fail{background:#fbe1df}
td.partial{background:#fdf1d3}
td.cached{outline:2px dashed #7a8ec2;outline-offset:-3px}
.verdict{font-weight:600}
.nums{color:#444;font-size:.9em;white-space:nowrap}
tfoot th,tfoot td{background:#f3f4f7;font-weight:600;white-space:nowrap}
pre{white-space:pre-wrap;word-break:break-word;max-width:40em;max-height:20em;overflow:auto;margin:.3em 0;font-size:.9em}
pre.failure{color:#8a1c12}
details summary{cursor:pointer;color:#333}
ul.runs{margin:.2em 0;padding-left:1.2em}
";

/// Sorting: a header click sorts the rows by that column (case names as
/// text, cells by pass rate), again for the other direction; `#sort=N` or
/// `#sort=-N` in the address sorts on load.
const SCRIPT: &str = r#"
(function(){
  var table=document.getElementById('grid');
  var body=table.tBodies[0];
  var heads=table.tHead.rows[0].cells;
  function key(row,col){
    var cell=row.cells[col];
    if(col===0){return cell.textContent;}
    return parseFloat(cell.getAttribute('data-rate'));
  }
  function sort(col,descending){
    var rows=Array.prototype.slice.call(body.rows);
    rows.sort(function(a,b){
      var x=key(a,col),y=key(b,col);
      var c=(x<y)?-1:(x>y)?1:0;
      if(c===0){c=parseInt(a.getAttribute('data-index'),10)-parseInt(b.getAttribute('data-index'),10);return c;}
      return descending?-c:c;
    });
    rows.forEach(function(r){body.appendChild(r);});
    for(var i=0;i<heads.length;i++){heads[i].removeAttribute('aria-sort');}
    heads[col].setAttribute('aria-sort',descending?'descending':'ascending');
    table.setAttribute('data-sorted',(descending?'-':'')+col);
  }
  Array.prototype.forEach.call(heads,function(h,col){
    h.addEventListener('click',function(){
      sort(col,h.getAttribute('aria-sort')==='ascending');
    });
  });
  var m=/^#sort=(-?)(\d+)$/.exec(location.hash);
  if(m){var col=parseInt(m[2],10);if(col<heads.length){sort(col,m[1]==='-');}}
  document.body.setAttribute('data-ready','1');
})();
"#;

/// Where a page's trace pages go: `NAME.traces/` beside it.
fn traces_dir(page: &Path) -> PathBuf {
    let stem = page
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "results".to_string());
    page.with_file_name(format!("{stem}.traces"))
}

/// A file name as a relative link: anything but unreserved characters
/// percent-encoded.
fn href_part(name: &str) -> String {
    let mut out = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Write the page to `path`, and each logged run's trace page beside it.
pub fn write(
    run_log: &pf_host::data::RunLogTarget,
    path: &Path,
    title: &str,
    labels: &[String],
    outcomes: &[CaseOutcome],
    totals: &[ColumnTotals],
) -> Result<(), String> {
    let dir = traces_dir(path);
    let dir_name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Each logged run's page, named by its place in the log.
    let mut links: Vec<Vec<(String, String)>> = vec![Vec::new(); outcomes.len()];
    let wanted = outcomes
        .iter()
        .any(|o| o.cell.as_ref().is_some_and(|c| !c.logged.is_empty()));
    if wanted {
        let log = pf_host::data::open_run_log(run_log)?
            .ok_or("the run log is missing: the runs' trace pages cannot be written")?;
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        for (at, o) in outcomes.iter().enumerate() {
            let Some(cell) = &o.cell else { continue };
            for (k, place) in cell.logged.iter().enumerate() {
                let run = pf_trace::load(&log, place)
                    .map_err(|e| format!("cannot read run {place} from the log: {e}"))?;
                let execution = cell.executions.get(k).cloned().unwrap_or_default();
                let name = format!("{}-{execution}.html", place.trim_start_matches('#'));
                let file = dir.join(&name);
                std::fs::write(&file, pf_trace::html::render(&run))
                    .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
                links[at].push((
                    format!("{}/{}", href_part(&dir_name), href_part(&name)),
                    format!("{execution} ({place})"),
                ));
            }
        }
    }
    let page = render(title, labels, outcomes, totals, &links);
    std::fs::write(path, page).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The page itself; `links[i]` are cell `i`'s trace pages (href, text).
pub fn render(
    title: &str,
    labels: &[String],
    outcomes: &[CaseOutcome],
    totals: &[ColumnTotals],
    links: &[Vec<(String, String)>],
) -> String {
    let nonce = format!("{:032x}", rand::random::<u128>());
    let columns = labels.len().max(1);
    let passed = outcomes.iter().filter(|o| o.passed).count();
    let mut out = String::with_capacity(16 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; \
         style-src 'unsafe-inline'; script-src 'nonce-{nonce}'; img-src data:\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>promptforge test: {}</title><style>{STYLE}</style></head><body>\
         <h1>promptforge test: {}</h1><p class=\"meta\">{passed} of {} cells passed</p>",
        esc(title),
        esc(title),
        outcomes.len()
    );
    out.push_str("<table id=\"grid\"><thead><tr><th scope=\"col\">case</th>");
    for label in labels {
        let shown = if label.is_empty() { "result" } else { label };
        let _ = write!(out, "<th scope=\"col\">{}</th>", esc(shown));
    }
    if labels.is_empty() {
        out.push_str("<th scope=\"col\">result</th>");
    }
    out.push_str("</tr></thead><tbody>");
    for (row, case) in outcomes.chunks(columns).enumerate() {
        let Some(first) = case.first() else { continue };
        let _ = write!(
            out,
            "<tr data-index=\"{row}\"><th scope=\"row\">{}: {}</th>",
            esc(&first.file),
            esc(&first.name)
        );
        for (c, o) in case.iter().enumerate() {
            let at = row * columns + c;
            cell(&mut out, o, links.get(at).map_or(&[][..], Vec::as_slice));
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody><tfoot>");
    let footer = |out: &mut String, name: &str, f: &dyn Fn(&ColumnTotals) -> String| {
        let _ = write!(out, "<tr><th scope=\"row\">{}</th>", esc(name));
        for t in totals {
            let _ = write!(out, "<td>{}</td>", esc(&f(t)));
        }
        out.push_str("</tr>");
    };
    footer(&mut out, "pass rate", &|t| {
        format!(
            "{:.0}% ({}/{} cells)",
            t.pass_rate * 100.0,
            t.passed,
            t.cells
        )
    });
    footer(&mut out, "tokens", &|t| {
        format!(
            "{} ({} in, {} out)",
            t.input_tokens + t.output_tokens,
            t.input_tokens,
            t.output_tokens
        )
    });
    footer(&mut out, "cost", &|t| t.cost.map_or("-".to_string(), money));
    if totals.iter().any(|t| t.cached_rounds > 0) {
        footer(&mut out, "saved by the cache", &|t| match t.saved_cost {
            Some(c) => format!("{} tokens, {}", t.saved_tokens, money(c)),
            None => format!("{} tokens", t.saved_tokens),
        });
    }
    footer(&mut out, "median latency", &|t| {
        format!("{:.2}s", t.median_latency_ms as f64 / 1000.0)
    });
    let _ = write!(
        out,
        "</tfoot></table><script nonce=\"{nonce}\">{SCRIPT}</script></body></html>"
    );
    out
}

/// One grid cell: verdict, numbers, the result and failure, the run links.
fn cell(out: &mut String, o: &CaseOutcome, links: &[(String, String)]) {
    let mut class = if o.passed {
        "pass"
    } else if o.passes > 0 {
        "partial"
    } else {
        "fail"
    }
    .to_string();
    if o.cell.as_ref().is_some_and(|c| c.cached) {
        class.push_str(" cached");
    }
    let _ = write!(
        out,
        "<td class=\"{class}\" data-rate=\"{}\"><div class=\"verdict\">{}</div>",
        o.pass_rate,
        esc(&cell_text(o))
    );
    if let Some(c) = &o.cell {
        let mut nums = vec![format!("{} tokens", c.input_tokens + c.output_tokens)];
        if let Some(cost) = c.cost {
            nums.push(money(cost));
        }
        if c.cached_rounds > 0 {
            nums.push(format!("{} cached rounds", c.cached_rounds));
        }
        nums.push(format!("{:.2}s", c.latency_ms as f64 / 1000.0));
        let _ = write!(out, "<div class=\"nums\">{}</div>", esc(&nums.join(" · ")));
    }
    let result = o.cell.as_ref().map(|c| c.result.as_str()).unwrap_or("");
    let failure = o.details();
    if !result.is_empty() || !failure.is_empty() || !links.is_empty() {
        out.push_str("<details><summary>result</summary>");
        if !result.is_empty() {
            let _ = write!(out, "<pre class=\"result\">{}</pre>", esc(result));
        }
        if !failure.is_empty() {
            let _ = write!(out, "<pre class=\"failure\">{}</pre>", esc(&failure));
        }
        if !links.is_empty() {
            out.push_str("<ul class=\"runs\">");
            for (href, text) in links {
                let _ = write!(
                    out,
                    "<li><a class=\"trace\" href=\"{}\">{}</a></li>",
                    esc(href),
                    esc(text)
                );
            }
            out.push_str("</ul>");
        }
        out.push_str("</details>");
    }
    out.push_str("</td>");
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_link_part_is_percent_encoded() {
        assert_eq!(href_part("a b#?.html"), "a%20b%23%3F.html");
        assert_eq!(
            traces_dir(Path::new("/x/out.html")),
            PathBuf::from("/x/out.traces")
        );
    }
}
