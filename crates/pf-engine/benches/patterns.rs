//! The sandbox's pattern functions (a Rust port of Lua's matcher that polls the
//! cancel) against the C library in a bare Lua state: ordinary calls, as
//! prompts make them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use criterion::{criterion_group, criterion_main, Criterion};
use mlua::{Function, Lua, StdLib};

const CASES: &[(&str, &str)] = &[
    ("find_plain", "return function() for i = 1, 1000 do local a = s:find('needle', 1, true) end end"),
    ("find_pattern", "return function() for i = 1, 1000 do local a = s:find('(%w+)=(%d+)') end end"),
    ("match_short", "return function() for i = 1, 1000 do local a = ('key = value'):match('^%s*(%S+)%s*=%s*(%S+)') end end"),
    ("gsub_text_10k", "return function() local r = big:gsub('%s+', ' ') end"),
    ("gsub_function_10k", "return function() local r = big:gsub('%w+', function(w) return w end) end"),
    ("gmatch_words_10k", "return function() local n = 0 for w in big:gmatch('%a+') do n = n + 1 end end"),
    ("sort_ints_100k", "return function() local t = {} for i = 1, 1e5 do t[i] = (i * 7919) % 100003 end table.sort(t) end"),
    ("sort_strings_20k", "return function() local t = {} for i = 1, 2e4 do t[i] = words[i] end table.sort(t) end"),
];

const SETUP: &str = "s = string.rep('hay ', 50) .. 'k=12 needle' big = string.rep('lorem ipsum  dolor\\tsit amet, ', 350) words = {} for i = 1, 2e4 do words[i] = 'w' .. ((i * 7919) % 20011) end";

fn bare() -> Lua {
    Lua::new_with(
        StdLib::STRING | StdLib::TABLE | StdLib::MATH,
        mlua::LuaOptions::default(),
    )
    .unwrap()
}

fn bench(c: &mut Criterion) {
    for (name, lua) in [
        ("c", bare()),
        (
            "guarded",
            pf_engine::testing::guarded_library_lua().unwrap(),
        ),
    ] {
        lua.load(SETUP).exec().unwrap();
        for (case, code) in CASES {
            let f: Function = lua.load(*code).eval().unwrap();
            c.bench_function(&format!("{case}/{name}"), |b| {
                b.iter(|| f.call::<()>(()).unwrap())
            });
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
