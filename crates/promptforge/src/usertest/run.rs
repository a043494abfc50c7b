//! One run of one case: the case's fixtures become a [`cases::case::Case`]
//! (so the host file, the web server, MCP servers and scripted replies are
//! the language tests' own machinery), the store is seeded, and the real
//! binary runs the prompt in place through [`cases::Runner::invoke`].

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value as Json;

use super::catalog::{self, CatalogModel};
use super::format::{Loaded, ModelChoice, TestCase};
use pf_cases::{self, case, Invocation, Runner, WebServer, WorkDir};
use pf_host::report::RunReport;

/// What `{{WEB}}` stands for when a case has no web fixture (a closed port).
pub const NO_WEB: &str = "http://127.0.0.1:9";

/// How every case of one `promptforge test` runs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub runner: Runner,
    /// The host file: the catalog for live and judge models.
    pub host: Option<PathBuf>,
    /// `--model ID`: every case runs against this model, ignoring its replies.
    pub live: Option<CatalogModel>,
}

/// What one run did, as the assertions see it.
pub struct Observed {
    pub report: RunReport,
    /// Recorded model requests (chat-completions shape), in order.
    pub requests: Vec<Json>,
    /// The run's events as the engine writes them, in order.
    pub events: Vec<Json>,
    /// The tool calls made, model and script, in order.
    pub calls: Vec<super::assert::CallMade>,
    /// The store directory after the run.
    pub store: PathBuf,
    pub wall: Duration,
    /// What `{{WEB}}` stood for in this run.
    pub base: String,
    /// Keeps the scratch folder (and so the store) until the checks are done.
    _work: WorkDir,
}

/// Run `case` of `loaded` once with `seed`.
pub fn run_case(settings: &Settings, loaded: &Loaded, case: &TestCase) -> Result<Observed, String> {
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
    let work = WorkDir::new()?;
    let record = Runner::record_path(&work.0);
    let catalog_model = match (&settings.live, &case.model) {
        (Some(live), _) => Some(live.clone()),
        (None, Some(ModelChoice::Catalog(id))) => {
            Some(catalog::lookup(settings.host.as_deref(), id)?)
        }
        _ => None,
    };
    let mut host_extra = Vec::new();
    let model = match &catalog_model {
        Some(m) => {
            host_extra.push(m.host_table(&record));
            None
        }
        None => scripted(case, &web),
    };
    if let Some(extra) = &case.host_extra {
        host_extra.push(web(extra));
    }
    let fixture = case::Case {
        args: case.args.as_ref().map(|a| web(&args_text(a))),
        seed: case.seed.unwrap_or(7),
        start: case
            .start
            .clone()
            .unwrap_or_else(|| "2026-01-02T03:04:05Z".to_string()),
        model,
        web: server.as_ref().map(|_| case::WebFixture::default()),
        input: case
            .answers
            .as_ref()
            .map(|a| a.iter().map(|s| web(s)).collect()),
        mcp: case
            .mcp
            .iter()
            .map(|(id, m)| {
                let mut m = m.clone();
                m.tools = m.tools.iter().map(|t| substitute(t, &base)).collect();
                (id.clone(), m)
            })
            .collect(),
        host_extra: (!host_extra.is_empty()).then(|| host_extra.join("\n")),
        timeout: None,
        expect: case::Expect::default(),
    };
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
    let prompt_file = std::path::absolute(&loaded.prompt).unwrap_or(loaded.prompt.clone());
    let invoked = settings.runner.invoke(&Invocation {
        prompt_file: &prompt_file,
        case: &fixture,
        work: &work.0,
        seed: fixture.seed,
        base: &base,
        store: &store,
        capture_events: true,
    })?;
    drop(server);
    Ok(Observed {
        report: invoked.report,
        requests: invoked.requests,
        events: pf_cases::parse_events(&invoked.stderr),
        calls: super::assert::calls_made(&invoked.stderr),
        store,
        wall: invoked.elapsed,
        base,
        _work: work,
    })
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
