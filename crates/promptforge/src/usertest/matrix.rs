//! The comparison matrix: `--model` × `--prompt` columns, the response cache
//! read from the run log, each cell's logged runs found again, and the
//! column totals every report shows (text table, JSON, HTML page).

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

use super::catalog;
use super::format::Loaded;
use super::run::Variant;
use super::{median, shown, CaseOutcome};

/// The columns `--model` and `--prompt` ask for: each prompt version times
/// each model (one column without either: the cases' own).
pub fn variants(
    args: &crate::cli::TestArgs,
    host: Option<&Path>,
    loaded: &[Loaded],
) -> Result<Vec<Variant>, String> {
    let mut models = Vec::new();
    for id in &args.model {
        models.push(Some(catalog::lookup(host, id)?));
    }
    if models.is_empty() {
        models.push(None);
    }
    let mut prompts = Vec::new();
    for file in &args.prompt {
        if !file.is_file() {
            return Err(format!("--prompt {}: no such file", file.display()));
        }
        prompts.push(Some(file.clone()));
    }
    if prompts.is_empty() {
        prompts.push(None);
    } else {
        // A prompt version replaces one prompt: the tests must be that prompt's.
        let mut tested: Vec<String> = loaded.iter().map(|l| shown(&l.prompt)).collect();
        tested.sort();
        tested.dedup();
        if tested.len() > 1 {
            return Err(format!(
                "--prompt runs one prompt's cases against its versions, but these test files test {} prompts ({}); pass one prompt's test files",
                tested.len(),
                tested.join(", ")
            ));
        }
    }
    let mut variants = Vec::new();
    for prompt in &prompts {
        for model in &models {
            let label = match (prompt, model) {
                (Some(p), Some(m)) => format!("{} @ {}", shown(p), m.id),
                (Some(p), None) => shown(p),
                (None, Some(m)) => m.id.clone(),
                (None, None) => String::new(),
            };
            variants.push(Variant {
                label,
                model: model.clone(),
                prompt: prompt.clone(),
            });
        }
    }
    Ok(variants)
}

/// `--cache`: the good answers the run log holds for the prompts under test
/// (their own and every `--prompt` version) and for judge calls. No log yet
/// is an empty cache.
pub fn cache(
    run_log: &pf_host::data::RunLogTarget,
    loaded: &[Loaded],
    variants: &[Variant],
) -> Result<pf_host::cache::ResponseCache, String> {
    let Some(log) = pf_host::data::open_run_log(run_log)? else {
        return Ok(pf_host::cache::ResponseCache::default());
    };
    let mut paths: Vec<String> = loaded
        .iter()
        .map(|l| pf_host::session::display_path(&l.prompt))
        .chain(
            variants
                .iter()
                .filter_map(|v| v.prompt.as_deref())
                .map(pf_host::session::display_path),
        )
        .collect();
    paths.push(super::judge::JUDGE_LABEL.to_string());
    paths.sort();
    paths.dedup();
    pf_host::cache::ResponseCache::from_log(&log, &paths)
        .map_err(|e| format!("--cache: cannot read the run log: {e}"))
}

/// Fill each cell's `logged` with its runs' places in the log (`#N`), found
/// by the batch id and each run's own store folder.
pub fn find_logged(
    run_log: &pf_host::data::RunLogTarget,
    batch: &str,
    outcomes: &mut [CaseOutcome],
) {
    let Ok(Some(log)) = pf_host::data::open_run_log(run_log) else {
        return;
    };
    let Ok(runs) = log.list_runs(&pf_runlog::RunFilter {
        batch: Some(batch.to_string()),
        ..pf_runlog::RunFilter::default()
    }) else {
        return;
    };
    let mut by_store: HashMap<String, i64> = HashMap::new();
    for run in runs {
        if let Ok(Some(record)) = log.run(run.id) {
            if let Some(store) = record.start.store_dir {
                by_store.insert(store, run.id.0);
            }
        }
    }
    for cell in outcomes.iter_mut().filter_map(|o| o.cell.as_mut()) {
        cell.logged = cell
            .stores
            .iter()
            .filter_map(|store| by_store.get(store))
            .map(|id| format!("#{id}"))
            .collect();
    }
}

/// One column's totals over its cells.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ColumnTotals {
    /// Cells that passed, of all.
    pub passed: usize,
    pub cells: usize,
    /// Runs that passed over all runs.
    pub pass_rate: f64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Paid for, when the catalog prices the model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    pub cached_rounds: u64,
    pub saved_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub saved_cost: Option<f64>,
    /// The median of its cells' latencies.
    pub median_latency_ms: u64,
}

fn add(total: &mut Option<f64>, part: Option<f64>) {
    if let Some(p) = part {
        *total.get_or_insert(0.0) += p;
    }
}

/// Totals per column, in column order.
pub fn totals(outcomes: &[CaseOutcome], columns: usize) -> Vec<ColumnTotals> {
    let mut totals = vec![ColumnTotals::default(); columns.max(1)];
    let mut runs = vec![(0u32, 0u32); columns.max(1)];
    let mut latencies: Vec<Vec<u64>> = vec![Vec::new(); columns.max(1)];
    for o in outcomes {
        let column = o.cell.as_ref().map_or(0, |c| c.column_index);
        let Some(t) = totals.get_mut(column) else {
            continue;
        };
        t.cells += 1;
        t.passed += usize::from(o.passed);
        runs[column].0 += o.passes;
        runs[column].1 += o.runs;
        match &o.cell {
            Some(c) => {
                t.input_tokens += c.input_tokens;
                t.output_tokens += c.output_tokens;
                add(&mut t.cost, c.cost);
                t.cached_rounds += c.cached_rounds;
                t.saved_tokens += c.saved_tokens;
                add(&mut t.saved_cost, c.saved_cost);
                latencies[column].push(c.latency_ms);
            }
            None => latencies[column].push(o.duration_ms / u64::from(o.runs.max(1))),
        }
    }
    for (column, t) in totals.iter_mut().enumerate() {
        let (passes, all) = runs[column];
        t.pass_rate = if all == 0 {
            0.0
        } else {
            f64::from(passes) / f64::from(all)
        };
        latencies[column].sort_unstable();
        t.median_latency_ms = median(&latencies[column]);
    }
    totals
}

/// A cost for people: eval costs are often fractions of a cent, so small
/// amounts keep six decimals, amounts below one four, larger ones two.
pub fn money(cost: f64) -> String {
    if cost == 0.0 {
        "0".to_string()
    } else if cost < 0.01 {
        format!("{cost:.6}")
    } else if cost < 1.0 {
        format!("{cost:.4}")
    } else {
        format!("{cost:.2}")
    }
}

/// A cell in the table: `pass`/`FAIL`, or passes of runs with the rate and
/// its interval under `--repeat`; `*` marks a cell the cache answered.
pub fn cell_text(o: &CaseOutcome) -> String {
    let mut text = if o.runs > 1 {
        let interval = o
            .cell
            .as_ref()
            .and_then(|c| c.interval)
            .map(|[lo, hi]| format!(" [{:.0}-{:.0}%]", lo * 100.0, hi * 100.0))
            .unwrap_or_default();
        format!(
            "{} {}/{} {:.0}%{interval}",
            if o.passed { "ok" } else { "FAIL" },
            o.passes,
            o.runs,
            o.pass_rate * 100.0
        )
    } else if o.passed {
        "pass".to_string()
    } else {
        "FAIL".to_string()
    };
    if o.cell.as_ref().is_some_and(|c| c.cached) {
        text.push_str(" *");
    }
    text
}

/// The summary table: a row per case, a column per model/prompt version,
/// then the totals rows.
pub fn table(outcomes: &[CaseOutcome], labels: &[String], totals: &[ColumnTotals]) -> String {
    let columns = labels.len().max(1);
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut header = vec!["case".to_string()];
    header.extend(labels.iter().cloned());
    rows.push(header);
    for case in outcomes.chunks(columns) {
        let Some(first) = case.first() else { continue };
        let mut row = vec![format!("{}: {}", first.file, first.name)];
        row.extend(case.iter().map(cell_text));
        rows.push(row);
    }
    let footer = |name: &str, f: &dyn Fn(&ColumnTotals) -> String| {
        let mut row = vec![name.to_string()];
        row.extend(totals.iter().map(f));
        row
    };
    rows.push(footer("pass rate", &|t| {
        format!("{:.0}% ({}/{})", t.pass_rate * 100.0, t.passed, t.cells)
    }));
    rows.push(footer("tokens", &|t| {
        (t.input_tokens + t.output_tokens).to_string()
    }));
    rows.push(footer("cost", &|t| t.cost.map_or("-".into(), money)));
    if totals.iter().any(|t| t.cached_rounds > 0) {
        rows.push(footer("saved (cache)", &|t| match t.saved_cost {
            Some(c) => format!("{} tokens, {}", t.saved_tokens, money(c)),
            None => format!("{} tokens", t.saved_tokens),
        }));
    }
    rows.push(footer("median latency", &|t| {
        format!("{:.2}s", t.median_latency_ms as f64 / 1000.0)
    }));
    let widths: Vec<usize> = (0..=columns)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |t| t.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::from("\n");
    for (i, row) in rows.iter().enumerate() {
        if i == rows.len() - footer_rows(totals) {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            out.push_str(rule.join("  ").trim_end());
            out.push('\n');
        }
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(text, w)| format!("{text:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out.push('\n');
    out
}

fn footer_rows(totals: &[ColumnTotals]) -> usize {
    if totals.iter().any(|t| t.cached_rounds > 0) {
        5
    } else {
        4
    }
}

/// One line on what `--cache` answered, when it answered anything.
pub fn cache_note(totals: &[ColumnTotals]) -> Option<String> {
    let rounds: u64 = totals.iter().map(|t| t.cached_rounds).sum();
    if rounds == 0 {
        return None;
    }
    let tokens: u64 = totals.iter().map(|t| t.saved_tokens).sum();
    let mut cost = None;
    for t in totals {
        add(&mut cost, t.saved_cost);
    }
    let cost = cost
        .map(|c| format!(", cost {}", money(c)))
        .unwrap_or_default();
    Some(format!(
        "cache: {rounds} model rounds answered from the run log, saved {tokens} tokens{cost}"
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::super::wilson;

    #[test]
    fn wilson_intervals_match_the_textbook_values() {
        // 4 of 5: the 95% Wilson interval is about [0.376, 0.964].
        let [lo, hi] = wilson(4, 5);
        assert!(
            (lo - 0.3755).abs() < 1e-3 && (hi - 0.9638).abs() < 1e-3,
            "{lo} {hi}"
        );
        let [lo, hi] = wilson(0, 5);
        assert!(lo == 0.0 && (hi - 0.4345).abs() < 1e-3, "{lo} {hi}");
        let [lo, hi] = wilson(5, 5);
        assert!(
            (lo - 0.5655).abs() < 1e-3 && (hi - 1.0).abs() < 1e-9,
            "{lo} {hi}"
        );
    }
}
