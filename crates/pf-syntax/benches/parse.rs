//! Parse throughput on a generated prompt: 1,000 sections, about 1 MB.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;

fn generated_prompt() -> String {
    let mut source = String::from(
        "---\nname: bench\ndescription: A generated prompt for parse throughput\npromptforge: 0\nplugins:\n  - promptforge/web\ntools:\n  fetch: promptforge/web/fetch\nmodels:\n  writer: {}\n---\n\n# Bench\n\n```lua shared\nfunction helper(x) return '<' .. x .. '>' end\n```\n\n",
    );
    let paragraph = "This section explains one step of the pipeline in plain words, \
        with a placeholder {{ var.topic }} and some `inline code` to read. "
        .repeat(6);
    for index in 0..1000 {
        source.push_str(&format!(
            "## Step {index}\n\n```lua\nvar.topic = 'topic {index}'\n```\n\n{paragraph}\n\n---\n\nWrite the answer for step {index}.\n\n```lua\nlocal reply = helper(prose)\nif #reply > {index} then\n  return reply\nend\n```\n\n### Items {index}\n\n- alpha\n- beta\n- gamma\n\n"
        ));
    }
    source
}

fn bench_parse(c: &mut Criterion) {
    let source = generated_prompt();
    assert!(pf_syntax::parse(source.as_bytes()).is_ok());
    let mut group = c.benchmark_group("parse");
    group.throughput(Throughput::Bytes(source.len() as u64));
    group.bench_function(format!("1000 sections, {} bytes", source.len()), |b| {
        b.iter(|| pf_syntax::parse(black_box(source.as_bytes())))
    });
    group.finish();
}

criterion_group!(benches, bench_parse);
criterion_main!(benches);
