//! Engine overhead: a 100-section run, one section VM's life, and the engine's
//! own cost per model round in a 50-round tool loop (scripted model, so the
//! provider answers at once and only engine time is measured).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use pf_engine::{run, Outcome, RunSetup};
use pf_harness::{CancellationToken, Harness, ModelInfo, ModelProvider, ThinkingSupport};
use pf_models::{ScriptProvider, ScriptedReply};

#[path = "support/instant_openai.rs"]
mod instant_openai;

fn setup(store: &std::path::Path, model: Option<Arc<dyn ModelProvider>>) -> RunSetup {
    RunSetup {
        seed: 7,
        start_ms: 0,
        args: String::new(),
        store_dir: store.to_path_buf(),
        harness: Harness::new(),
        model,
        catalog: Vec::new(),
        cancel: CancellationToken::new(),
        ui: None,
        observer: None,
        capture: false,
        limits: Default::default(),
    }
}

fn hundred_sections() -> String {
    let mut s = String::from("---\nname: many\ndescription: a hundred sections\npromptforge: 0\n---\n\n# Many\n\n```lua shared\nfunction bump(n) return n + 1 end\n```\n\n");
    for i in 0..100 {
        s.push_str(&format!("## Section {i}\n\nSome prose for {{{{ var.n }}}}.\n\n```lua\nvar.n = bump(var.n or 0)\nlocal t = {{}}\nfor k = 1, 20 do t[k] = k end\n```\n\n"));
    }
    s.push_str("## End\n\n```lua\nreturn var.n\n```\n");
    s
}

fn one_section() -> String {
    "---\nname: one\ndescription: one section\npromptforge: 0\n---\n\n# One\n\n```lua shared\nfunction helper(x) return x * 2 end\nlocal cache = {}\nfor i = 1, 50 do cache[i] = i end\n```\n\n## Only\n\n```lua\nreturn helper(21)\n```\n".to_string()
}

fn loop_prompt() -> String {
    "---\nname: loop\ndescription: a fifty-round tool loop\npromptforge: 0\nmax_tool_iterations: 60\nmodels:\n  writer: {}\n---\n\n# Loop\n\n## Run\n\n```lua\nmodels.use('writer')\nlocal n = 0\ntools.add_local('tick', 'Count one', { step = 'integer' }, function(a)\n  n = n + a.step\n  return 'ok'\nend)\nlocal msgs = messages.new():user('tick fifty times')\nmodels.loop(msgs)\nreturn n\n```\n".to_string()
}

fn scripted(rounds: usize) -> Arc<dyn ModelProvider> {
    let mut replies: Vec<ScriptedReply> = Vec::new();
    for _ in 0..rounds {
        let r: ScriptedReply = serde_json::from_value(
            serde_json::json!({"tool_calls": [{"name": "tick", "arguments": {"step": 1}}]}),
        )
        .expect("a scripted reply");
        replies.push(r);
    }
    replies.push(serde_json::from_value(serde_json::json!("done")).expect("a scripted reply"));
    Arc::new(ScriptProvider::new(
        replies,
        ModelInfo {
            id: "bench".into(),
            context: 128_000,
            thinking: ThinkingSupport::Never,
            description: String::new(),
        },
    ))
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let store = tempfile::tempdir().expect("tempdir");
    let many = Arc::new(pf_syntax::parse(hundred_sections().as_bytes()).expect("parses"));
    c.bench_function("run of a 100-section prompt", |b| {
        b.iter(|| {
            let r = rt.block_on(run(Arc::clone(&many), setup(store.path(), None)));
            assert_eq!(r.outcome, Outcome::Completed("100".into()));
        })
    });
    let one = Arc::new(pf_syntax::parse(one_section().as_bytes()).expect("parses"));
    c.bench_function(
        "one section VM (create, replay shared, run, tear down)",
        |b| {
            b.iter(|| {
                let r = rt.block_on(run(Arc::clone(&one), setup(store.path(), None)));
                assert_eq!(r.outcome, Outcome::Completed("42".into()));
            })
        },
    );
    let looping = Arc::new(pf_syntax::parse(loop_prompt().as_bytes()).expect("parses"));
    c.bench_function("50-round tool loop, scripted model", |b| {
        b.iter(|| {
            let r = rt.block_on(run(
                Arc::clone(&looping),
                setup(store.path(), Some(scripted(50))),
            ));
            assert_eq!(r.outcome, Outcome::Completed("50".into()));
        })
    });
}

fn bench_openai(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let store = tempfile::tempdir().expect("tempdir");
    let base = instant_openai::instant_openai_server();
    let spec = pf_models::ProviderSpec {
        kind: pf_models::ProviderKind::OpenAi(pf_models::HttpEndpoint {
            base_url: base,
            api_key_env: None,
            receive_timeout: None,
        }),
        id: "bench".into(),
        model: "bench".into(),
        context: pf_models::DEFAULT_CONTEXT,
        thinking: ThinkingSupport::Never,
        description: String::new(),
        record: None,
        retries: 0,
        spawn: None,
        tool_format: pf_models::ToolFormat::Native,
        limits: Default::default(),
    };
    let provider = pf_models::build_provider(&spec).expect("provider");
    let looping = Arc::new(pf_syntax::parse(loop_prompt().as_bytes()).expect("parses"));
    c.bench_function("50-round tool loop, openai provider, local server", |b| {
        b.iter(|| {
            let r = rt.block_on(run(
                Arc::clone(&looping),
                setup(store.path(), Some(Arc::clone(&provider))),
            ));
            assert_eq!(r.outcome, Outcome::Completed("50".into()));
        })
    });
}

criterion_group!(benches, bench, bench_openai);
criterion_main!(benches);
