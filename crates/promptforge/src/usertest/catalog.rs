//! The model catalog as `promptforge test` sees it: a live model for
//! `--model ID` or a case's `model: ID`, and the judge models.
//!
//! The host file's catalog (`[models.ID]`, or `[model]` as a catalog of one)
//! is read through the Host's own [`HostConfig`](pf_host::HostConfig), so
//! ids mean here what they mean to `run --model`.

use std::path::Path;
use std::sync::Arc;

use pf_models::ProviderSpec;

/// One catalog model: how to call it in-process (the judge) and the host-file
/// table a run's host file gets for it (paths made absolute, no `record`).
#[derive(Debug, Clone)]
pub struct CatalogModel {
    pub id: String,
    pub spec: ProviderSpec,
    pub table: toml::Table,
    pub prices: Prices,
    /// The host file's keys, scrubbed from what the judge hears.
    pub secrets: Arc<pf_secrets::Secrets>,
}

/// A catalog model's `input_price` and `output_price`, per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Prices {
    pub input: Option<f64>,
    pub output: Option<f64>,
}

impl Prices {
    /// What `input` and `output` tokens cost; `None` when the catalog gives
    /// no price for this model (a missing half counts as free).
    pub fn cost(&self, input: u64, output: u64) -> Option<f64> {
        if self.input.is_none() && self.output.is_none() {
            return None;
        }
        let per = |tokens: u64, price: Option<f64>| tokens as f64 * price.unwrap_or(0.0) / 1e6;
        Some(per(input, self.input) + per(output, self.output))
    }
}

impl CatalogModel {
    /// The `[model]` table for a run's host file, recording requests to `record`.
    pub fn host_table(&self, record: &Path) -> String {
        let mut table = self.table.clone();
        table.insert(
            "record".into(),
            toml::Value::String(record.to_string_lossy().into_owned()),
        );
        let mut doc = toml::Table::new();
        doc.insert("model".into(), toml::Value::Table(table));
        toml::to_string(&doc).unwrap_or_default()
    }
}

/// The catalog model `id` of the host file at `host`.
pub fn lookup(host: Option<&Path>, id: &str) -> Result<CatalogModel, String> {
    let Some(host) = host else {
        return Err(format!(
            "model {id:?} needs a host file with that model (--host FILE)"
        ));
    };
    let config = pf_host::HostConfig::load(Some(host))?;
    let text = std::fs::read_to_string(host)
        .map_err(|e| format!("cannot read host file {}: {e}", host.display()))?;
    let doc: toml::Table =
        toml::from_str(&text).map_err(|e| format!("host file {}: {e}", host.display()))?;
    let Some(spec) = config.spec(id).cloned() else {
        let ids: Vec<&str> = config.catalog.iter().map(|m| m.id.as_str()).collect();
        return Err(format!(
            "host file {} has no model {id:?} (its catalog: {})",
            host.display(),
            if ids.is_empty() {
                "empty".to_string()
            } else {
                ids.join(", ")
            }
        ));
    };
    let from_catalog = doc
        .get("models")
        .and_then(|models| models.get(id))
        .or_else(|| doc.get("model"));
    let Some(toml::Value::Table(table)) = from_catalog else {
        return Err(format!(
            "host file {} has no table for model {id:?}",
            host.display()
        ));
    };
    let mut table = table.clone();
    table.remove("record");
    // The host file was checked above, so its prices read back.
    let prices = toml::Value::Table(table.clone())
        .try_into::<pf_host::file::ModelTable>()
        .map(|t| Prices {
            input: t.input_price.map(|p| p.0),
            output: t.output_price.map(|p| p.0),
        })
        .unwrap_or_default();
    let base = host.parent().unwrap_or(Path::new("."));
    if let Some(toml::Value::String(replies)) = table.get("replies") {
        let joined = base.join(replies);
        let absolute = std::path::absolute(&joined).unwrap_or(joined);
        table.insert(
            "replies".into(),
            toml::Value::String(absolute.to_string_lossy().into_owned()),
        );
    }
    // The run's host file is written elsewhere: a spawned server's command
    // given as a path stays the host file's.
    if let Some(toml::Value::Array(words)) = table.get_mut("spawn") {
        if let Some(toml::Value::String(program)) = words.first_mut() {
            if program.contains('/') {
                let joined = base.join(&*program);
                let absolute = std::path::absolute(&joined).unwrap_or(joined);
                *program = absolute.to_string_lossy().into_owned();
            }
        }
    }
    Ok(CatalogModel {
        id: id.to_string(),
        spec: ProviderSpec {
            record: None,
            ..spec
        },
        table,
        prices,
        secrets: Arc::new(config.secrets()),
    })
}
