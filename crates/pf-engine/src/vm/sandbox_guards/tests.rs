#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! The guarded library functions against Lua's own: same results, same
//! messages (positions included), over fixed cases and generated ones.

use std::rc::Rc;

use mlua::{Lua, StdLib};

/// A Lua state with the guards installed over a minimal stand-in for the prelude's helpers.
fn guarded(interrupted: super::Interrupted) -> Lua {
    let lua = bare();
    super::guard_library(&lua, interrupted).unwrap();
    lua
}

fn bare() -> Lua {
    Lua::new_with(
        StdLib::STRING | StdLib::TABLE | StdLib::MATH | StdLib::UTF8,
        mlua::LuaOptions::default(),
    )
    .unwrap()
}

fn never() -> super::Interrupted {
    Rc::new(|| false)
}

/// Runs `script` (which returns one string) in both states, the guarded one
/// with and without the C fast path; the two guarded results must agree.
fn both(script: &str) -> (String, String) {
    let (lua, fast) = both_once(script);
    super::C_FAST_PATH.with(|f| f.set(false));
    let (_, polling) = both_once(script);
    super::C_FAST_PATH.with(|f| f.set(true));
    for (i, (a, b)) in fast.split("\\x01").zip(polling.split("\\x01")).enumerate() {
        assert_eq!(
            a, b,
            "case {i}: the fast path and the polling matcher differ"
        );
    }
    (lua, fast)
}

fn both_once(script: &str) -> (String, String) {
    let run = |lua: Lua| -> String {
        // Bytes, escaped: results may be any bytes, not only UTF-8.
        lua.load(script)
            .set_name("=cases")
            .eval::<mlua::String>()
            .map(|s| s.as_bytes().escape_ascii().to_string())
            .unwrap_or_else(|e| format!("script failed: {e}"))
    };
    (run(bare()), run(guarded(never())))
}

/// A Lua helper that records every result (or error) of a call as one line.
const RECORDER: &str = r#"
local out = {}
local function show(v)
  if type(v) == 'string' then return '"' .. v .. '"' end
  return tostring(v)
end
local function rec(...)
  local r = table.pack(pcall(...))
  local parts = {}
  for i = 1, r.n do parts[i] = show(r[i]) end
  out[#out + 1] = table.concat(parts, ' ')
end
"#;

#[test]
fn fixed_cases_match_lua() {
    let script = format!(
        "{RECORDER}{}",
        r#"
local S = {'hello world', '', 'aaa', 'THE (quick) fox', '  key = value  ', 'a.b.c', '[[x]]', 'f(a(b)c)d', 'x\0y\0z', 'áé ü'}
local P = {'o', 'l+', 'l*', 'l-', 'l?', '^h', 'd$', '^$', '(%a+)', '()(%a+)()', '%((%a+)%)', '%b()', '%f[%w]%w+',
  '[%a_][%w_]*', '[^%s]+', '%s*(%S+)%s*=%s*(%S+)%s*', '(.)%1', '[a-c]+', '[%]]', '.-', '(a*(.)%w(%s*))', '%d',
  '%', '[a', '(', ')', '%1', '%g', '%bx', '%f', '%fx', '[]', '[^]', 'x%z', '\0', '.%-', '^', '(()', '(%w+)%2'}
for _, s in ipairs(S) do
  for _, p in ipairs(P) do
    rec(string.find, s, p)
    rec(string.find, s, p, 3)
    rec(string.find, s, p, -2, true)
    rec(string.match, s, p)
    rec(string.match, s, p, 2)
    rec(string.gsub, s, p, '<%0>')
    rec(string.gsub, s, p, '%1-%%', 2)
    rec(string.gsub, s, p, {a = 'A', hello = false, l = 1})
    rec(string.gsub, s, p, function(a, b) return b and (a .. b) or nil end)
    rec(string.gsub, s, p, function() return {} end)
    rec(function() local t = {} for a, b in string.gmatch(s, p) do t[#t + 1] = tostring(a) .. '/' .. tostring(b) end return table.concat(t, ',') end)
    rec(function() local t = {} for a in s:gmatch(p, 3) do t[#t + 1] = tostring(a) end return table.concat(t, ',') end)
  end
end
-- argument errors, as a function and as a method
rec(string.find)
rec(string.find, nil, 'x')
rec(string.find, 'x', {})
rec(string.find, 'x', 'x', 1.5)
rec(string.find, 'x', 'x', '2')
rec(string.find, 12345, 3)
rec(string.gsub, 'x', 'x')
rec(string.gsub, 'x', 'x', true)
rec(string.gsub, 'x', 'x', 'y', 'z')
rec(string.gsub, 'abc', '%w', '%2')
rec(string.gsub, 'abc', '%w', '%x')
rec(string.gsub, 123, '9', 'x')
rec(string.gmatch, 'x')
-- (not in tail position: a tail call to the Lua shim loses the caller's frame,
-- so there the message has no position; see docs/src security page)
rec(function() local r = ('x'):find({}) return r end)
rec(function() local r = ('x'):rep(2):match('x', {}) return r end)
rec(function() local s = 'abc' local r = s.find(nil, 'x') return r end)
rec(function() local f = string.find local r = f('a') return r end)
rec(function() local r = ('x'):gsub('%', 'y') return r end)
rec(string.match, string.rep('a', 300), string.rep('(a)', 33))
rec(string.match, string.rep('a', 300), string.rep('a?', 250) .. 'b')
-- table.move
local function tm(...)
  local r = table.move(...)
  local parts = {}
  for i = -2, 12 do parts[#parts + 1] = tostring(r[i]) end
  return table.concat(parts, ',')
end
local function src() return {1, 2, 3, 4, 5, 6, 7, 8, 9, 10} end
rec(tm, src(), 1, 10, 3)
rec(tm, src(), 3, 10, 1)
rec(tm, src(), 1, 10, 1, {})
rec(tm, src(), 5, 2, 1)
rec(tm, src(), -1, 3, 2)
rec(table.move, {}, 1, math.maxinteger, 2)
rec(table.move, {}, -1, math.maxinteger, 2)
rec(table.move, {}, 1, 2)
rec(table.move, nil, 1, 2, 3)
rec(table.move, {}, 1, 2, 3, 4)
rec(table.move, {}, 1.5, 2, 3)
local big = {}
for i = 1, 20000 do big[i] = i end
rec(function() local t = table.move(big, 1, 20000, 7) return t[7] .. ',' .. t[20006] .. ',' .. #t end)
rec(function() local t = table.move(big, 3, 20000, 1) return t[1] .. ',' .. t[19998] .. ',' .. t[20000] end)
rec(function() local t = table.move(big, 1, 20000, 1, {}) return #t end)
rec(function() local t = {} for i = 1, 20000 do t[i] = i end table.move(t, 1, 19990, 11) return t[11] .. ',' .. t[20000] .. ',' .. t[1] end)
-- table.sort
local function sorted(t, ...) table.sort(t, ...) return table.concat(t, ',', 1, math.min(#t, 40)) .. '#' .. #t end
local function ints(n) local t = {} for i = 1, n do t[i] = (i * 7919) % 1009 - 500 end return t end
rec(sorted, ints(5000))
rec(sorted, ints(20))
rec(sorted, (function() local t = ints(3000) for i = 1, #t do t[i] = t[i] + 0.5 end return t end)())
rec(sorted, (function() local t = ints(3000) for i = 1, #t do t[i] = 'k' .. t[i] end t[7] = 'a\0b' t[8] = 'a' return t end)())
rec(sorted, ints(3000), function(a, b) return a > b end)
rec(sorted, (function() local t = ints(3000) t[100] = 'x' return t end)())
rec(sorted, (function() local t = ints(3000) t[100] = 0 / 0 return t end)())
rec(sorted, ints(3000), function(a, b) return true end)
rec(function() local ok, e = pcall(table.sort, ints(300), function(a, b) error({ mine = true }) end) return ok, type(e) == 'table' and e.mine end)
rec(table.sort)
rec(table.sort, 'abc')
rec(table.sort, {3, 2, 1}, 5)
rec(table.sort, {1}, 5)
rec(function() local r = table.sort({ 2, 1 }, {}) return r end)
-- string.rep, C's fast path and the Rust half (a count past the fast path's)
for _, n in ipairs({-1, 0, 1, 2, 3, 70000, 100003}) do
  for _, sep in ipairs({false, '', ',', '<->'}) do
    for _, piece in ipairs({'', 'a', 'xy', 'a\0b'}) do
      rec(function()
        local r = sep and string.rep(piece, n, sep) or string.rep(piece, n)
        return #r, r:sub(1, 9), r:sub(-9)
      end)
    end
  end
end
rec(function() local r = string.rep('ab', math.maxinteger) return r end)
rec(function() local r = string.rep() return r end)
rec(function() local r = string.rep('a') return r end)
rec(function() local r = string.rep('a', 1.5) return r end)
rec(function() local r = string.rep('a', 100000, {}) return r end)
rec(function() local r = ('x'):rep(100000, 7) return #r end)
rec(function() local r = string.rep(12, 100000) return #r end)
rec(function() local r = string.rep('a', '100000') return #r end)
-- table.insert / table.remove, plain and over a `__len`
local function dump(t, n) local p = {} for i = 0, n do p[#p + 1] = tostring(rawget(t, i)) end return table.concat(p, ',') end
local function lenof(n) return function() return n end end
local function counted(n) local t = {1, 2, 3, 4, 5} return setmetatable(t, { __len = lenof(n) }) end
for _, len in ipairs({0, 3, 5, 7, 2.0, 'x', 1.5, '4'}) do
  rec(function() local t = counted(len) table.insert(t, 'v') return dump(t, 9) end)
  for _, pos in ipairs({0, 1, 2, 5, 6, 8, -1, 2.0, '3', 'x', 1.5}) do
    rec(function() local t = counted(len) table.insert(t, pos, 'v') return dump(t, 9) end)
    rec(function() local t = counted(len) local r = table.remove(t, pos) return tostring(r) .. ':' .. dump(t, 9) end)
    rec(function() local t = {1, 2, 3} table.insert(t, pos, 'v') return dump(t, 5) end)
    rec(function() local t = {1, 2, 3} local r = table.remove(t, pos) return tostring(r) .. ':' .. dump(t, 5) end)
  end
  rec(function() local t = counted(len) local r = table.remove(t) return tostring(r) .. ':' .. dump(t, 9) end)
  rec(function() local t = counted(len) table.insert(t, 1, 2, 3) return dump(t, 9) end)
  rec(function() local t = counted(len) table.insert(t) return dump(t, 9) end)
end
rec(function() local t = setmetatable({}, { __len = lenof(math.maxinteger) }) table.insert(t, 'v') return dump(t, 3) end)
rec(function() local t = setmetatable({}, { __len = lenof(math.mininteger) }) table.insert(t, 1, 'v') return dump(t, 3) end)
rec(function()
  local log = {}
  local t = setmetatable({}, { __len = lenof(4), __index = function(_, k) return 'i' .. k end,
    __newindex = function(t, k, v) log[#log + 1] = k .. '=' .. tostring(v) rawset(t, k, v) end })
  table.insert(t, 2, 'v')
  local r = table.remove(t, 1)
  return r .. ':' .. table.concat(log, ' ')
end)
rec(table.insert, nil, 1)
rec(table.remove, 'abc')
rec(function() local r = table.insert(counted(3), {}, 'v') return r end)
return table.concat(out, '\1')
"#
    );
    let (lua, ours) = both(&script);
    assert!(!lua.starts_with("script failed"), "{lua}");
    for (i, (a, b)) in lua.split("\\x01").zip(ours.split("\\x01")).enumerate() {
        assert_eq!(a, b, "case {i} differs");
    }
    assert_eq!(lua.split("\\x01").count(), ours.split("\\x01").count());
}

#[test]
fn generated_cases_match_lua() {
    let script = format!(
        "{RECORDER}{}",
        r#"
math.randomseed(12)
local pieces = {'a', 'b', '.', '%a', '%d', '%s', '%w', '[ab]', '[^a]', '[a-c%d]', '*', '+', '-', '?',
  '(', ')', '()', '%1', '^', '$', '%b()', '%f[%a]', '%', '[', ']'}
local chars = {'a', 'b', 'c', '1', ' ', '(', ')', '%'}
for _ = 1, 3000 do
  local p, s = {}, {}
  for i = 1, math.random(1, 6) do p[i] = pieces[math.random(#pieces)] end
  for i = 1, math.random(0, 12) do s[i] = chars[math.random(#chars)] end
  p, s = table.concat(p), table.concat(s)
  rec(string.find, s, p)
  rec(string.match, s, p, math.random(-3, 4))
  rec(string.gsub, s, p, '[%0]')
  rec(string.gsub, s, p, function(...) return select('#', ...) end)
  rec(function() local t = {} for a in string.gmatch(s, p) do t[#t + 1] = tostring(a) end return table.concat(t, ',') end)
end
return table.concat(out, '\1')
"#
    );
    let (lua, ours) = both(&script);
    assert!(!lua.starts_with("script failed"), "{lua}");
    for (i, (a, b)) in lua.split("\\x01").zip(ours.split("\\x01")).enumerate() {
        assert_eq!(a, b, "generated case {i} differs");
    }
    assert_eq!(lua.split("\\x01").count(), ours.split("\\x01").count());
}

#[test]
fn long_calls_stop_when_interrupted() {
    let lua = guarded(Rc::new(|| true));
    for call in [
        r#"return string.rep("a", 30000):find(".-.-.-.-b")"#,
        r#"return string.rep("a", 30000):match(".-.-.-.-b")"#,
        r#"return string.rep("a", 30000):gsub(".-.-.-.-b", "")"#,
        r#"for _ in string.rep("a", 30000):gmatch(".-.-.-.-b") do end"#,
        r#"return string.rep("a", 30000):gsub(".-.-.-.-b", function() end)"#,
        // A long literal run, compared inside one match step.
        r#"local s = string.rep("a", 1e6) return s:find(string.rep("a", 5e5) .. "b?c")"#,
        // Anchored with optional items: 2^20 branches, never handed to C.
        r#"return string.rep("a", 30):match("^" .. string.rep("a?", 20) .. string.rep("a", 30))"#,
        r#"return #string.rep("ab", 1e7)"#,
        r#"return #string.rep("", 1e7, "-")"#,
    ] {
        let err = lua.load(call).exec().unwrap_err().to_string();
        assert!(err.contains("interrupted by Ctrl-C"), "{call}: {err}");
    }
}

/// What C's `string.rep` would loop on for ever (an empty piece, a huge
/// count) returns at once; a short piece repeated many times is built by
/// doubling.
#[test]
fn rep_of_an_empty_piece_returns_at_once() {
    let lua = guarded(never());
    let lengths: Vec<i64> = lua
        .load(
            "return #string.rep('', math.maxinteger), #string.rep('', math.maxinteger, ''),
                    #('').rep('', 2^53), #string.rep('ab', 3e6, ''), #string.rep('', 3e6, 'xyz')",
        )
        .eval::<mlua::MultiValue>()
        .unwrap()
        .into_iter()
        .map(|v| v.as_integer().unwrap())
        .collect();
    assert_eq!(lengths, vec![0, 0, 0, 6_000_000, 8_999_997]);
}

#[test]
fn plain_find_is_linear() {
    let lua = guarded(never());
    let found: Option<i64> = lua
        .load(r#"local s = string.rep("a", 3e6) return (s:find(string.rep("a", 1.5e6) .. "b", 1, true))"#)
        .eval()
        .unwrap();
    assert_eq!(found, None);
}

#[test]
fn gc_metafields_are_refused() {
    let lua = guarded(never());
    let err = lua
        .load("setmetatable({}, { __gc = true })")
        .exec()
        .unwrap_err()
        .to_string();
    assert!(err.contains("__gc metamethods are not allowed"), "{err}");
    // Without `__gc` at setmetatable time, adding one later marks nothing.
    lua.load("local mt = {} setmetatable({}, mt) mt.__gc = function() while true do end end collectgarbage()")
        .exec()
        .unwrap();
}
