//! One run of one case: the case's fixtures (a web server on 127.0.0.1, MCP
//! fixture servers, scripted replies or a catalog model) become the run's
//! host file, the store is seeded, and the prompt runs in place, in this
//! process ([`super::session`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value as Json;

use super::catalog::{self, CatalogModel};
use super::fixtures::{self as case, CaseDir, ScratchPool};
use super::format::{Loaded, ModelChoice, TestCase};
use super::session;
use super::web::WebServer;
use pf_host::report::RunReport;
use toml::{Table, Value};

/// What `{{WEB}}` stands for when a case has no web fixture (a closed port).
pub const NO_WEB: &str = "http://127.0.0.1:9";

/// How every case of one `promptforge test` runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The MCP fixture server (`mcp:` fixtures), run by `python`.
    pub mcp_fixture: PathBuf,
    pub python: String,
    /// The host file: the catalog for live and judge models.
    pub host: Option<PathBuf>,
    /// Keep every run (and judge call) in the run log, under `batch`.
    pub log: bool,
    /// Where judge calls are logged (runs go where their settings say,
    /// which is the same place).
    pub run_log: pf_host::data::RunLogTarget,
    /// The id this invocation's logged runs share (`runs --batch ID`).
    pub batch: Option<String>,
    /// `--cache`: earlier logged answers, shared by every run.
    pub cache: Option<std::sync::Arc<pf_host::cache::ResponseCache>>,
    /// Where each case's scratch folder comes from.
    pub scratch: std::sync::Arc<ScratchPool>,
}

/// One column of the comparison matrix: the model and the prompt version
/// every case runs against (`None`: the case's own).
#[derive(Debug, Clone, Default)]
pub struct Variant {
    /// The column's name in reports: the model id, the prompt file, or both.
    pub label: String,
    /// `--model ID`: cases run against this model, ignoring their replies.
    pub model: Option<CatalogModel>,
    /// `--prompt FILE`: cases run this edited copy of their prompt.
    pub prompt: Option<PathBuf>,
}

/// What one run did, as the assertions see it.
pub struct Observed {
    pub report: RunReport,
    /// Recorded model requests (chat-completions shape), in order; recorded
    /// only when a check reads them (`offered`, `budget`, `--cache`).
    pub requests: Vec<Json>,
    /// The run's events as the engine writes them, in order.
    pub events: Vec<pf_engine::RunEvent>,
    /// The tool calls made, model and script, in order.
    pub calls: Vec<session::CallMade>,
    /// The store directory after the run.
    pub store: PathBuf,
    pub wall: Duration,
    /// What `{{WEB}}` stood for in this run.
    pub base: String,
    /// The catalog model that answered, when the run had one (its prices).
    pub model: Option<CatalogModel>,
    /// What `--cache` answered: rounds, then input and output tokens.
    pub cached: Option<(u64, (u64, u64))>,
    /// The logged run's end, settled once every cell has run.
    pub logged: Option<pf_host::session::Finished>,
    /// The run's scratch folder (its store inside), as the log names it.
    pub work_dir: PathBuf,
    /// Keeps the scratch folder (and so the store) until the checks are done.
    _work: CaseDir,
}

/// Run `case` of `loaded` once, against `variant`'s model and prompt.
pub async fn run_case(
    settings: &Settings,
    loaded: &Loaded,
    case: &TestCase,
    variant: &Variant,
    cancel: pf_harness::CancellationToken,
) -> Result<Observed, String> {
    let server = match &case.web {
        Some(web) => Some(WebServer::start(case::WebFixture {
            pages: web
                .pages
                .iter()
                .map(|(path, page)| (path.clone(), page.to_page()))
                .collect(),
            search: web.search.as_ref().map(|p| p.to_page()),
        })?),
        None => None,
    };
    let base = server.as_ref().map_or(NO_WEB.to_string(), WebServer::base);
    let web = |s: &str| s.replace("{{WEB}}", &base);
    let work = settings.scratch.take()?;
    // The model's requests are written to a file only for the checks that
    // read them (`offered`, `budget`, the cache's tally): a file per case
    // is most of a one-round case's cost.
    let needs_requests =
        case.expect.offered.is_some() || case.expect.budget.is_some() || settings.cache.is_some();
    let record = needs_requests.then(|| session::record_path(&work.0));
    let catalog_model = match (&variant.model, &case.model) {
        (Some(live), _) => Some(live.clone()),
        (None, Some(ModelChoice::Catalog(id))) => {
            Some(catalog::lookup(settings.host.as_deref(), id)?)
        }
        _ => None,
    };
    let mut host = Table::new();
    match &catalog_model {
        Some(m) => {
            // Under its catalog id, as `run --model ID` runs it: the run
            // queues at the same per-model gate as the judge and every other
            // run of the process, and its logged exchanges (the cache's key)
            // name the catalog entry, not the provider's model name, which
            // two entries (two servers) may share.
            let mut table = m.table.clone();
            if let Some(record) = &record {
                table.insert("record".into(), session::path(record));
            }
            let mut models = Table::new();
            models.insert(m.id.clone(), Value::Table(table));
            host.insert("models".into(), Value::Table(models));
            host.insert("default_model".into(), session::string(m.id.clone()));
        }
        None => {
            if let Some(model) = scripted(case, &web) {
                host.insert(
                    "model".into(),
                    Value::Table(scripted_table(&model, &work.0, record.as_deref())?),
                );
            }
        }
    }
    if let Some(answers) = &case.answers {
        let answers = answers.iter().map(|a| session::string(web(a))).collect();
        let mut input = Table::new();
        input.insert("answers".into(), Value::Array(answers));
        host.insert("input".into(), Value::Table(input));
    }
    if server.is_some() {
        let mut web_table = Table::new();
        web_table.insert("allow_loopback".into(), Value::Boolean(true));
        web_table.insert("search".into(), session::string("gateway"));
        web_table.insert(
            "search_url".into(),
            session::string(format!("{base}/search")),
        );
        host.insert("web".into(), Value::Table(web_table));
    }
    if !case.mcp.is_empty() {
        let mut plugins = Table::new();
        for (id, m) in &case.mcp {
            let tools: Vec<Json> = m.tools.iter().map(|t| substitute(t, &base)).collect();
            let tools_file = work.0.join(format!("mcp-{}.json", id.replace('/', "_")));
            let spec = serde_json::json!({"fail_start": m.fail_start, "tools": tools});
            std::fs::write(&tools_file, spec.to_string())
                .map_err(|e| format!("cannot write {}: {e}", tools_file.display()))?;
            let mut plugin = Table::new();
            plugin.insert(
                "command".into(),
                Value::Array(vec![
                    session::string(settings.python.clone()),
                    session::path(&settings.mcp_fixture),
                    session::path(&tools_file),
                ]),
            );
            plugin.insert("trusted".into(), Value::Boolean(m.trusted));
            plugin.insert(
                "conflicts".into(),
                Value::Array(m.conflicts.iter().map(session::string).collect()),
            );
            plugins.insert(id.clone(), Value::Table(plugin));
        }
        host.insert("plugins".into(), Value::Table(plugins));
    }
    let store = work.0.join("store");
    for (path, text) in &case.store {
        let file = store.join(path);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        std::fs::write(&file, web(text))
            .map_err(|e| format!("cannot write store file {path}: {e}"))?;
    }
    std::fs::create_dir_all(&store).map_err(|e| format!("cannot create the store: {e}"))?;
    let prompt = variant.prompt.as_ref().unwrap_or(&loaded.prompt);
    let prompt_file = std::path::absolute(prompt).unwrap_or(prompt.clone());
    let cache = settings
        .cache
        .as_ref()
        .map(|c| pf_host::cache::CacheUse::new(std::sync::Arc::clone(c)));
    let ran = session::run(session::CaseRun {
        prompt_file: &prompt_file,
        host,
        host_extra: case.host_extra.as_ref().map(|extra| web(extra)),
        host_dir: &work.0,
        args: case.args.as_ref().map(|a| web(&args_text(a))),
        seed: case.seed.unwrap_or(7),
        start: case.start.as_deref().unwrap_or("2026-01-02T03:04:05Z"),
        store: &store,
        log: settings.log,
        batch: settings.batch.clone(),
        cache: cache.clone(),
        cancel,
    })
    .await?;
    drop(server);
    let requests = record
        .and_then(|record| std::fs::read_to_string(record).ok())
        .map(|t| {
            t.lines()
                .filter(|l| !l.trim().is_empty())
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .unwrap_or_default();
    Ok(Observed {
        report: ran.report,
        requests,
        events: ran.events,
        calls: ran.calls,
        store,
        wall: ran.elapsed,
        base,
        model: catalog_model,
        cached: cache.map(|c| (c.tally.rounds(), c.tally.tokens())),
        logged: ran.logged,
        work_dir: work.0.clone(),
        _work: work,
    })
}

/// The `[model]` table of a scripted model: its replies written beside the run.
fn scripted_table(
    model: &case::ModelFixture,
    work: &Path,
    record: Option<&Path>,
) -> Result<Table, String> {
    let replies = work.join("replies.json");
    std::fs::write(&replies, model.replies.to_string())
        .map_err(|e| format!("cannot write {}: {e}", replies.display()))?;
    let mut table = Table::new();
    table.insert(
        "provider".into(),
        session::string(pf_models::ProviderName::Script.word()),
    );
    table.insert("replies".into(), session::path(&replies));
    table.insert("model".into(), session::string(model.id.clone()));
    table.insert(
        "context".into(),
        Value::Integer(i64::try_from(model.context).unwrap_or(i64::MAX)),
    );
    table.insert("thinking".into(), session::string(model.thinking.clone()));
    if let Some(record) = record {
        table.insert("record".into(), session::path(record));
    }
    if let Some(d) = &model.description {
        table.insert("description".into(), session::string(d.clone()));
    }
    Ok(table)
}

/// The scripted model, when the case has replies or scripted settings.
fn scripted(case: &TestCase, web: &dyn Fn(&str) -> String) -> Option<case::ModelFixture> {
    let settings = match &case.model {
        Some(ModelChoice::Scripted(s)) => Some(s.clone()),
        _ => None,
    };
    if case.replies.is_none() && settings.is_none() {
        return None;
    }
    let settings = settings.unwrap_or_default();
    let replies: Vec<Json> = case
        .replies
        .iter()
        .flatten()
        .map(|r| substitute(r, &web("{{WEB}}")))
        .collect();
    Some(case::ModelFixture {
        replies: Json::Array(replies),
        id: settings
            .id
            .unwrap_or_else(|| pf_models::DEFAULT_SCRIPT_MODEL_ID.to_string()),
        context: settings.context.unwrap_or(pf_models::DEFAULT_CONTEXT),
        thinking: settings
            .thinking
            .unwrap_or_else(|| "Switchable".to_string()),
        description: settings.description,
        ..Default::default()
    })
}

/// A string is the argument string; anything else is passed as its JSON text.
pub fn args_text(args: &Json) -> String {
    match args {
        Json::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `v` with `{{WEB}}` replaced by `base` in every string.
fn substitute(v: &Json, base: &str) -> Json {
    match v {
        Json::String(s) => Json::String(s.replace("{{WEB}}", base)),
        Json::Array(a) => Json::Array(a.iter().map(|x| substitute(x, base)).collect()),
        Json::Object(m) => Json::Object(
            m.iter()
                .map(|(k, x)| (k.clone(), substitute(x, base)))
                .collect(),
        ),
        other => other.clone(),
    }
}
