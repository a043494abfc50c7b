//! Message lists for `models.loop`: reading and checking a Lua list (guide ch. 11,
//! "Checking the list"), composing what the model receives (merge rules), and the
//! precheck's token estimate.

use mlua::{Lua, Table, Value};
use pf_harness::{ChatMessage, History, ToolCall};
use serde_json::{json, Map, Value as Json};

use crate::json::{compact_sorted, lua_to_json_charged, ToJsonError};
use crate::memory::{HostCharge, MEMORY_ERROR};

/// Deeper nesting than this is treated as not JSON-representable (it also stops cycles).
const MAX_DEPTH: usize = 200;

pub(crate) use pf_harness::Role;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Part {
    Text(String),
    Image(String),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CallRecord {
    pub id: String,
    pub name: String,
    /// Always a JSON object.
    pub arguments: Json,
}

/// One record of a message list, with only the fields the model may see.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record {
    pub role: Role,
    pub content: Content,
    pub tool_call_id: Option<String>,
    /// `Some` when the record sets `tool_calls` (possibly empty).
    pub tool_calls: Option<Vec<CallRecord>>,
}

// ---------------------------------------------------------------------------
// Reading a Lua list: the whole-list rules and each record's own fields
// ---------------------------------------------------------------------------

/// Read and check a message list value; the `Err` is the guide's exact message.
/// `models.loop` reads its whole list every round, so this is on the hot path:
/// the whole-list walks run in Lua (the prelude's `list_shape`) and the field
/// names are created once per read.
pub(crate) fn read_list(
    lua: &Lua,
    value: &Value,
    charge: &mut HostCharge,
) -> Result<Vec<Record>, String> {
    let Value::Table(list) = value else {
        return Err(format!(
            "messages must be a table of message tables, got {}",
            lua_type(value)
        ));
    };
    let (is_representable, len) = match list_shape(lua, list) {
        Some(shape) => shape,
        // No helper, or it was interrupted: the same rules, walked from Rust.
        None => {
            let mut path = Vec::new();
            let ok = representable(list, &mut path);
            (ok, if ok { sequence_len(list) } else { None })
        }
    };
    if !is_representable {
        return Err("messages must be a JSON-representable table".into());
    }
    let Some(len) = len else {
        return Err("messages must be an array of message tables".into());
    };
    if len == 0 {
        return Err("messages must not be empty".into());
    }
    let keys = Keys::new(lua).map_err(|e| e.to_string())?;
    let mut records = Vec::with_capacity(len);
    for index in 1..=len {
        let value: Value = list.raw_get(index).unwrap_or(Value::Nil);
        records.push(read_record(&keys, index, &value, charge)?);
    }
    Ok(records)
}

/// `models.loop`'s list, read every round. The prelude's `list_read` proves
/// which records are unchanged since the last read (from snapshots in a table
/// no prompt can reach); only the rest are read again, so a round costs Lua
/// comparisons over the list instead of a Rust read of every record.
#[derive(Default)]
pub(crate) struct ListReader {
    /// The snapshots of `records`, record for record, when they are trusted.
    snaps: Option<Table>,
    records: Vec<Record>,
    /// The prelude's `list_read` and the field names, fetched on the first
    /// read and kept for the loop's life (its VM's): every round used them.
    helper: Option<mlua::Function>,
    keys: Option<Keys>,
    /// The cross-record rules' state over `records`.
    across: AcrossScan,
    /// What each record the engine appended since the last read reads as, in
    /// order, when the engine can vouch for that without Lua.
    appended: Vec<Option<Record>>,
    /// The records the engine appended since the last full read (in a Lua
    /// sequence only Rust holds): those taken without Lua on a trusted read
    /// have no snapshot, and are held here as snapshots hold theirs, so a
    /// weak-valued list cannot lose them before a full read snapshots them.
    held: Option<Table>,
    /// The prelude's `append_round`, fetched on first use.
    append_round: Option<mlua::Function>,
    /// What `records` costs the host, paid for by the loop's VM.
    charge: Option<HostCharge>,
}

impl ListReader {
    /// Read and check the list like [`read_list`]; `Ok` is the number of
    /// leading records that are the records of the last read. `no_prompt_code`:
    /// no prompt Lua ran in this VM since the last read (only the engine
    /// appended to the list), so a record that is the same table is unchanged.
    pub(crate) fn read(
        &mut self,
        lua: &Lua,
        value: &Value,
        no_prompt_code: bool,
    ) -> Result<usize, String> {
        if !crate::settings::fast(crate::settings::FastPath::ListSnapshots) {
            // The reference path: the whole list, read and scanned afresh
            // (the records the engine appended still held by the loop, as
            // snapshots would hold them).
            self.snaps = None;
            self.across = AcrossScan::default();
            self.appended.clear();
            let charge = self.charge(lua);
            charge.set(0).map_err(|_| MEMORY_ERROR.to_string())?;
            self.records = read_list(lua, value, charge)?;
            return Ok(0);
        }
        let result = self.read_changes(lua, value, no_prompt_code);
        if result.is_err() {
            self.reset();
        }
        result
    }

    /// The records of the last successful read.
    pub(crate) fn records(&self) -> &[Record] {
        &self.records
    }

    /// The field names this reader reads with, made on first use.
    pub(crate) fn keys(&mut self, lua: &Lua) -> mlua::Result<Keys> {
        match &self.keys {
            Some(keys) => Ok(keys.clone()),
            None => Ok(self.keys.insert(Keys::new(lua)?).clone()),
        }
    }

    /// [`check_across`] over the records of the last read, of which the first
    /// `unchanged` (its answer) were those of the read before.
    pub(crate) fn check_across(&mut self, unchanged: usize) -> Result<(), String> {
        self.across.check(&self.records, unchanged)
    }

    /// Append a record the engine built to the list (raw, at its length plus
    /// one). `read_as`: what [`read_record`] gives for it, when the engine
    /// knows that (its fields are the engine's own text and data): the next
    /// read, if no prompt code ran before it, takes it without Lua.
    pub(crate) fn append(
        &mut self,
        lua: &Lua,
        list: &Table,
        record: Table,
        read_as: Option<Record>,
    ) -> mlua::Result<()> {
        list.raw_set(list.raw_len() + 1, &record)?;
        let held = self.held(lua)?;
        held.raw_set(held.raw_len() + 1, record)?;
        self.appended.push(read_as);
        Ok(())
    }

    /// Append a tool round's records (the prelude's `append_round`: the
    /// assistant record with `calls`' ids, names and arguments tables, then
    /// one result record per call), which read as `read_as` and one
    /// `{ role = 'tool', content = result, tool_call_id = id }` per call.
    pub(crate) fn append_round(
        &mut self,
        lua: &Lua,
        list: &Table,
        content: &str,
        calls: Vec<(&str, &str, Table, &str)>,
        read_as: Option<Record>,
    ) -> mlua::Result<()> {
        let append = match &self.append_round {
            Some(append) => append.clone(),
            None => {
                let helpers: Table = lua.named_registry_value("pf.helpers")?;
                let append: mlua::Function = helpers.raw_get("append_round")?;
                self.append_round.insert(append).clone()
            }
        };
        let held = self.held(lua)?;
        let mut args = mlua::MultiValue::with_capacity(3 + 4 * calls.len());
        args.push_back(Value::Table(list.clone()));
        args.push_back(Value::Table(held));
        args.push_back(Value::String(lua.create_string(content)?));
        let mut results = Vec::with_capacity(calls.len());
        for (id, name, arguments, result) in calls {
            results.push(built_record(Role::Tool, result, Some(id)));
            args.push_back(Value::String(lua.create_string(id)?));
            args.push_back(Value::String(lua.create_string(name)?));
            args.push_back(Value::Table(arguments));
            args.push_back(Value::String(lua.create_string(result)?));
        }
        append.call::<()>(args)?;
        self.appended.push(read_as);
        self.appended.extend(results.into_iter().map(Some));
        Ok(())
    }

    fn charge(&mut self, lua: &Lua) -> &mut HostCharge {
        self.charge.get_or_insert_with(|| HostCharge::new(lua))
    }

    fn held(&mut self, lua: &Lua) -> mlua::Result<Table> {
        match &self.held {
            Some(held) => Ok(held.clone()),
            None => Ok(self.held.insert(lua.create_table()?).clone()),
        }
    }

    fn reset(&mut self) {
        self.snaps = None;
        self.records.clear();
        if let Some(charge) = &mut self.charge {
            // Shrinking never fails.
            let _ = charge.set(0);
        }
        self.across = AcrossScan::default();
        self.appended.clear();
        self.held = None;
    }

    fn read_changes(
        &mut self,
        lua: &Lua,
        value: &Value,
        no_prompt_code: bool,
    ) -> Result<usize, String> {
        let Value::Table(list) = value else {
            return Err(format!(
                "messages must be a table of message tables, got {}",
                lua_type(value)
            ));
        };
        let appended = std::mem::take(&mut self.appended);
        // No prompt code ran since a read that snapshotted the list: it is the
        // records of that read plus the ones the engine appended since (see
        // the prelude's `list_read`, trusted). Those the engine built are
        // representable and read as it says, so they need no Lua walk and no
        // snapshot; a later untrusted read finds no snapshot for them and reads
        // them in full, as any record it cannot prove unchanged.
        if no_prompt_code
            && self.snaps.is_some()
            && !self.records.is_empty()
            && appended.iter().all(Option::is_some)
        {
            let unchanged = self.records.len();
            let more: usize = appended.iter().flatten().map(record_size).sum();
            self.charge(lua)
                .add(more)
                .map_err(|_| MEMORY_ERROR.to_string())?;
            self.records.extend(appended.into_iter().flatten());
            return Ok(unchanged);
        }
        let partial = no_prompt_code && self.snaps.is_some() && !self.records.is_empty();
        let Some((is_representable, len, first)) = self.list_read(lua, list, no_prompt_code) else {
            // No helper, or it was interrupted: read everything, and snapshot afresh next time.
            self.reset();
            let charge = self.charge(lua);
            charge.set(0).map_err(|_| MEMORY_ERROR.to_string())?;
            self.records = read_list(lua, value, charge)?;
            return Ok(0);
        };
        if !is_representable {
            return Err("messages must be a JSON-representable table".into());
        }
        let Some(len) = len else {
            return Err("messages must be an array of message tables".into());
        };
        if len == 0 {
            return Err("messages must not be empty".into());
        }
        if !partial {
            // Every record now has its snapshot, which holds its tables.
            self.held = None;
        }
        let unchanged = first.saturating_sub(1).min(self.records.len());
        self.records.truncate(unchanged);
        if self.keys.is_none() {
            self.keys = Some(Keys::new(lua).map_err(|e| e.to_string())?);
        }
        // The records kept are what the host holds: the VM pays for them.
        let kept: usize = self.records.iter().map(record_size).sum();
        self.charge(lua)
            .set(kept)
            .map_err(|_| MEMORY_ERROR.to_string())?;
        let (Some(keys), Some(charge)) = (&self.keys, &mut self.charge) else {
            return Err(MEMORY_ERROR.to_string());
        };
        for index in unchanged + 1..=len {
            let value: Value = list.raw_get(index).unwrap_or(Value::Nil);
            self.records.push(read_record(keys, index, &value, charge)?);
        }
        Ok(unchanged)
    }

    /// One call of the prelude's `list_read`: representable, the length when
    /// a sequence, and the first index not proven unchanged.
    fn list_read(
        &mut self,
        lua: &Lua,
        list: &Table,
        trusted: bool,
    ) -> Option<(bool, Option<usize>, usize)> {
        let fetch = || -> Option<mlua::Function> {
            let helpers: Table = lua.named_registry_value("pf.helpers").ok()?;
            helpers.raw_get("list_read").ok()
        };
        let read = match &self.helper {
            Some(read) => read.clone(),
            None => fetch()?,
        };
        let snaps = match &self.snaps {
            Some(snaps) => snaps.clone(),
            None => {
                self.records.clear();
                let snaps = lua.create_table().ok()?;
                self.snaps = Some(snaps.clone());
                snaps
            }
        };
        let known = self.records.len();
        // Bounded by the list and reaching no prompt code: raw accesses,
        // `==` never between two tables, no `__gc` (prompts cannot set one).
        let (ok, len, first): (bool, Option<i64>, i64) =
            read.call((list, MAX_DEPTH, snaps, known, trusted)).ok()?;
        if self.helper.is_none() {
            // The first call loads the prelude's deferred list helpers, which
            // replace the stand-in in `pf.helpers`: keep the real one, so later
            // rounds skip the stand-in's forwarding call.
            self.helper = fetch();
        }
        Some((
            ok,
            len.and_then(|n| usize::try_from(n).ok()),
            usize::try_from(first).unwrap_or(0),
        ))
    }
}

/// What a record the engine builds reads as ([`read_record`]): its text is
/// the engine's own, read back unchanged.
pub(crate) fn built_record(role: Role, content: &str, tool_call_id: Option<&str>) -> Record {
    Record {
        role,
        content: Content::Text(content.to_string()),
        tool_call_id: tool_call_id.map(str::to_string),
        tool_calls: None,
    }
}

/// [`representable`] and [`sequence_len`] in one call of the prelude's
/// `list_shape`; `None` when the helper is missing or raised (a cancel).
fn list_shape(lua: &Lua, list: &Table) -> Option<(bool, Option<usize>)> {
    let helpers: Table = lua.named_registry_value("pf.helpers").ok()?;
    let shape: mlua::Function = helpers.raw_get("list_shape").ok()?;
    let (ok, len): (bool, Option<i64>) = shape.call((list, MAX_DEPTH)).ok()?;
    Some((ok, len.and_then(|n| usize::try_from(n).ok())))
}

/// The record field names (and the roles the loop writes), as Lua strings
/// made once per loop: reading and building records push them as they are.
#[derive(Clone)]
pub(crate) struct Keys {
    pub(crate) role: mlua::String,
    pub(crate) content: mlua::String,
    pub(crate) tool_call_id: mlua::String,
    pub(crate) tool_calls: mlua::String,
    pub(crate) id: mlua::String,
    pub(crate) name: mlua::String,
    pub(crate) arguments: mlua::String,
    pub(crate) user: mlua::String,
    pub(crate) assistant: mlua::String,
}

impl Keys {
    fn new(lua: &Lua) -> mlua::Result<Keys> {
        Ok(Keys {
            role: lua.create_string("role")?,
            content: lua.create_string("content")?,
            tool_call_id: lua.create_string("tool_call_id")?,
            tool_calls: lua.create_string("tool_calls")?,
            id: lua.create_string("id")?,
            name: lua.create_string("name")?,
            arguments: lua.create_string("arguments")?,
            user: lua.create_string(Role::User.as_str())?,
            assistant: lua.create_string(Role::Assistant.as_str())?,
        })
    }
}

fn field(table: &Table, key: &mlua::String) -> Value {
    table.raw_get(key).unwrap_or(Value::Nil)
}

/// `type()` as Lua reports it (the list messages name plain Lua types).
fn lua_type(value: &Value) -> &'static str {
    match value {
        Value::Integer(_) | Value::Number(_) => "number",
        other => crate::text::lua_type_name(other),
    }
}

/// Every key and value is a string, number, boolean or table, with no cycles.
fn representable(table: &Table, path: &mut Vec<*const std::ffi::c_void>) -> bool {
    let ptr = table.to_pointer();
    if path.len() > MAX_DEPTH || path.contains(&ptr) {
        return false;
    }
    path.push(ptr);
    let mut ok = true;
    for pair in table.clone().pairs::<Value, Value>() {
        let Ok((key, value)) = pair else {
            ok = false;
            break;
        };
        let scalar = |v: &Value| {
            matches!(
                v,
                Value::String(_) | Value::Integer(_) | Value::Number(_) | Value::Boolean(_)
            )
        };
        let key_ok = scalar(&key) || matches!(&key, Value::Table(t) if representable(t, path));
        let value_ok =
            scalar(&value) || matches!(&value, Value::Table(t) if representable(t, path));
        if !key_ok || !value_ok {
            ok = false;
            break;
        }
    }
    path.pop();
    ok
}

/// `Some(n)` when the table's keys are exactly the integers `1..=n` (0 for an empty table).
fn sequence_len(table: &Table) -> Option<usize> {
    let mut count = 0usize;
    let mut max = 0i64;
    for pair in table.clone().pairs::<Value, Value>() {
        let Ok((key, _)) = pair else { return None };
        match key {
            Value::Integer(i) if i >= 1 => {
                count += 1;
                max = max.max(i);
            }
            _ => return None,
        }
    }
    (usize::try_from(max).ok() == Some(count)).then_some(count)
}

fn string_field(table: &Table, key: &str) -> Value {
    table.raw_get(key).unwrap_or(Value::Nil)
}

fn text_of(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.to_string_lossy()),
        _ => None,
    }
}

/// What a kept string costs the host: its bytes plus [`json::held_size`]'s node.
const NODE: usize = 32;

/// Charge the copy of `s` the host is about to keep; the memory error's text when the VM cannot pay.
fn charge_text(charge: &mut HostCharge, s: &mlua::String) -> Result<(), String> {
    charge
        .add(NODE + s.as_bytes().len())
        .map_err(|_| MEMORY_ERROR.to_string())
}

/// [`text_of`], charged.
fn charged_text(charge: &mut HostCharge, value: &Value) -> Result<Option<String>, String> {
    match value {
        Value::String(s) => {
            charge_text(charge, s)?;
            Ok(Some(s.to_string_lossy()))
        }
        _ => Ok(None),
    }
}

fn text_size(text: &str) -> usize {
    NODE + text.len()
}

/// What a record read from a list costs the host (as [`read_record`] charged it).
fn record_size(r: &Record) -> usize {
    let content = match &r.content {
        Content::Text(t) => text_size(t),
        Content::Parts(parts) => parts
            .iter()
            .map(|p| match p {
                Part::Text(t) | Part::Image(t) => NODE + text_size(t),
            })
            .sum(),
    };
    let calls = r
        .tool_calls
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|c| text_size(&c.id) + text_size(&c.name) + crate::json::held_size(&c.arguments));
    NODE + content + r.tool_call_id.as_deref().map_or(0, text_size) + calls.sum::<usize>()
}

fn read_record(
    keys: &Keys,
    index: usize,
    value: &Value,
    charge: &mut HostCharge,
) -> Result<Record, String> {
    let Value::Table(rec) = value else {
        return Err(format!("messages[{index}] must be a message table"));
    };
    let role = match field(rec, &keys.role) {
        Value::String(s) => match Role::from_word(&s.to_string_lossy()) {
            Some(role) => role,
            None => {
                let other = s.to_string_lossy();
                return Err(format!(
                    "messages[{index}] role \"{other}\" is unknown; known roles: system, user, assistant, tool"
                ));
            }
        },
        _ => {
            return Err(format!(
                "messages[{index}] role must be a string, one of: system, user, assistant, tool"
            ))
        }
    };
    charge.add(NODE).map_err(|_| MEMORY_ERROR.to_string())?;
    let content = read_content(index, &field(rec, &keys.content), charge)?;
    let tool_call_id = match field(rec, &keys.tool_call_id) {
        Value::Nil => None,
        Value::String(s) => {
            charge_text(charge, &s)?;
            Some(s.to_string_lossy())
        }
        _ => return Err(format!("messages[{index}] tool_call_id must be a string")),
    };
    if role == Role::Tool && tool_call_id.is_none() {
        return Err(format!(
            "messages[{index}] is a tool message and must set a string tool_call_id"
        ));
    }
    let tool_calls = match field(rec, &keys.tool_calls) {
        Value::Nil => None,
        Value::Table(calls) => {
            let Some(len) = sequence_len(&calls) else {
                return Err(format!("messages[{index}] tool_calls must be an array"));
            };
            let mut out = Vec::with_capacity(len);
            for call_index in 1..=len {
                let call: Value = calls.raw_get(call_index).unwrap_or(Value::Nil);
                out.push(read_call(keys, index, call_index, &call, charge)?);
            }
            Some(out)
        }
        _ => return Err(format!("messages[{index}] tool_calls must be an array")),
    };
    Ok(Record {
        role,
        content,
        tool_call_id,
        tool_calls,
    })
}

fn read_content(index: usize, value: &Value, charge: &mut HostCharge) -> Result<Content, String> {
    let bad_content = || {
        format!("messages[{index}] content must be a string or a non-empty array of content parts")
    };
    match value {
        Value::String(s) => {
            charge_text(charge, s)?;
            Ok(Content::Text(s.to_string_lossy()))
        }
        Value::Table(parts) => {
            let len = match sequence_len(parts) {
                Some(n) if n > 0 => n,
                _ => return Err(bad_content()),
            };
            let mut out = Vec::with_capacity(len);
            for part_index in 1..=len {
                let part: Value = parts.raw_get(part_index).unwrap_or(Value::Nil);
                out.push(read_part(index, part_index, &part, charge)?);
            }
            Ok(Content::Parts(out))
        }
        _ => Err(bad_content()),
    }
}

fn read_part(
    index: usize,
    part_index: usize,
    value: &Value,
    charge: &mut HostCharge,
) -> Result<Part, String> {
    let prefix = format!("messages[{index}] content part {part_index}");
    let type_error = || format!("{prefix} must be a table with a string type field");
    let Value::Table(part) = value else {
        return Err(type_error());
    };
    let Some(kind) = text_of(&string_field(part, "type")) else {
        return Err(type_error());
    };
    match kind.as_str() {
        "text" => match charged_text(charge, &string_field(part, "text"))? {
            Some(text) => Ok(Part::Text(text)),
            None => Err(format!(
                "{prefix} is a text part and must set a string text field"
            )),
        },
        "image_url" => {
            let url = match string_field(part, "image_url") {
                Value::Table(image) => charged_text(charge, &string_field(&image, "url"))?,
                _ => None,
            };
            url.map(Part::Image).ok_or_else(|| {
                format!(
                    "{prefix} is an image_url part and must set an image_url table with a string url field"
                )
            })
        }
        other => Err(format!(
            "{prefix} has unknown type \"{other}\"; known types: text, image_url"
        )),
    }
}

fn read_call(
    keys: &Keys,
    index: usize,
    call_index: usize,
    value: &Value,
    charge: &mut HostCharge,
) -> Result<CallRecord, String> {
    let prefix = || format!("messages[{index}] tool_calls[{call_index}]");
    let Value::Table(call) = value else {
        return Err(format!("{} must be a table", prefix()));
    };
    let Some(id) = charged_text(charge, &field(call, &keys.id))? else {
        return Err(format!("{} must set a string id", prefix()));
    };
    let Some(name) = charged_text(charge, &field(call, &keys.name))? else {
        return Err(format!("{} must set a string name", prefix()));
    };
    let arguments = match field(call, &keys.arguments) {
        Value::Nil => Json::Object(Map::new()),
        // A keyed table: no sequence part (an empty table is an empty object).
        Value::Table(t) if t.raw_len() == 0 => {
            match lua_to_json_charged(&Value::Table(t), "arguments", charge) {
                Ok(j @ Json::Object(_)) => j,
                Ok(Json::Array(a)) if a.is_empty() => Json::Object(Map::new()),
                Err(ToJsonError::Memory(_)) => return Err(MEMORY_ERROR.to_string()),
                _ => return Err(format!("{} arguments must be a table", prefix())),
            }
        }
        _ => return Err(format!("{} arguments must be a table", prefix())),
    };
    Ok(CallRecord {
        id,
        name,
        arguments,
    })
}

// ---------------------------------------------------------------------------
// Rules across records
// ---------------------------------------------------------------------------

/// The cross-record rules, in the guide's order; `Err` is the exact message.
#[cfg(test)]
pub(crate) fn check_across(records: &[Record]) -> Result<(), String> {
    AcrossScan::default().check(records, 0)
}

/// The cross-record rules' state after a prefix of a list passed them, kept by
/// [`ListReader`] so a round that only appended records scans only those.
#[derive(Default)]
pub(crate) struct AcrossScan {
    /// Records passed so far (0: nothing kept).
    scanned: usize,
    /// The leading system block's length, fixed once a later record exists.
    leading: usize,
    seen_ids: std::collections::HashSet<String>,
    /// The open batch: the assistant record's position and its calls still unanswered, in call order.
    open: Option<(usize, Vec<String>)>,
}

impl AcrossScan {
    /// Check `records`, whose first `kept` are the records of the last check.
    /// The answer is the full check's: a kept prefix that holds a record past
    /// the leading system block gives the same state, so the scan goes on
    /// from it.
    pub(crate) fn check(&mut self, records: &[Record], kept: usize) -> Result<(), String> {
        let resume = self.scanned > 0 && kept >= self.scanned && self.leading < self.scanned;
        if !resume {
            *self = AcrossScan::default();
            self.leading = leading_system(records);
            if self.leading >= 2 {
                if let Some(i) = records[..self.leading]
                    .iter()
                    .position(|r| matches!(r.content, Content::Parts(_)))
                {
                    return Err(format!(
                        "messages[{}] is a system message with content parts; only plain text system messages can be composed",
                        i + 1
                    ));
                }
            }
        }
        let result = self.scan(records);
        if result.is_err() {
            *self = AcrossScan::default();
        }
        result
    }

    fn scan(&mut self, records: &[Record]) -> Result<(), String> {
        let unanswered = |open: &Option<(usize, Vec<String>)>| -> Result<(), String> {
            match open {
                Some((at, pending)) if !pending.is_empty() => Err(format!(
                    "messages[{at}] tool call \"{}\" has no tool result",
                    pending.first().map(String::as_str).unwrap_or_default()
                )),
                _ => Ok(()),
            }
        };
        let leading = self.leading;
        for (i, rec) in records.iter().enumerate().skip(self.scanned) {
            let n = i + 1;
            if rec.tool_calls.is_some() && rec.role != Role::Assistant {
                return Err(format!(
                    "messages[{n}] sets tool_calls but is not an assistant message"
                ));
            }
            if rec.tool_call_id.is_some() && rec.role != Role::Tool {
                return Err(format!(
                    "messages[{n}] sets a tool_call_id but is not a tool message"
                ));
            }
            match rec.role {
                Role::System => {
                    if i >= leading {
                        return Err(format!(
                            "messages[{n}] is a system message outside the leading system block"
                        ));
                    }
                }
                Role::User => {
                    unanswered(&self.open)?;
                    self.open = None;
                }
                Role::Assistant => {
                    unanswered(&self.open)?;
                    self.open = None;
                    let calls = rec.tool_calls.as_deref().unwrap_or_default();
                    for call in calls {
                        // Looked up once per call: the list grows every round of a long loop.
                        if !self.seen_ids.insert(call.id.clone()) {
                            return Err(format!(
                                "messages[{n}] tool call id \"{}\" duplicates an earlier tool call",
                                call.id
                            ));
                        }
                    }
                    if !calls.is_empty() {
                        self.open = Some((n, calls.iter().map(|c| c.id.clone()).collect()));
                    }
                }
                Role::Tool => {
                    let id = rec.tool_call_id.as_deref().unwrap_or_default();
                    let answered = match self.open.as_mut() {
                        Some((_, pending)) => match pending.iter().position(|p| p == id) {
                            Some(pos) => {
                                pending.remove(pos);
                                true
                            }
                            None => false,
                        },
                        None => false,
                    };
                    if !answered {
                        return Err(format!(
                            "messages[{n}] is an orphan tool record: no pending assistant tool call with id \"{id}\""
                        ));
                    }
                }
            }
            self.scanned = n;
        }
        unanswered(&self.open)
    }
}

// ---------------------------------------------------------------------------
// Composing what the model receives
// ---------------------------------------------------------------------------

fn parts_of(content: Content) -> Vec<Part> {
    match content {
        Content::Text(t) if t.is_empty() => Vec::new(),
        Content::Text(t) => vec![Part::Text(t)],
        Content::Parts(p) => p,
    }
}

/// Join two contents: plain texts join cleanly (an empty side adds nothing); with
/// parts on either side the result is a parts array, the separator its own part.
fn merge(a: Content, b: Content, separator: &str) -> Content {
    match (a, b) {
        (Content::Text(x), Content::Text(y)) => {
            if x.is_empty() {
                Content::Text(y)
            } else if y.is_empty() {
                Content::Text(x)
            } else {
                Content::Text(format!("{x}{separator}{y}"))
            }
        }
        (a, b) => {
            let mut parts = parts_of(a);
            if !separator.is_empty() {
                parts.push(Part::Text(separator.to_string()));
            }
            parts.extend(parts_of(b));
            Content::Parts(parts)
        }
    }
}

fn is_text_only_assistant(r: &Record) -> bool {
    r.role == Role::Assistant && r.tool_calls.as_ref().is_none_or(|c| c.is_empty())
}

/// Apply the merge rules to a checked list (the list itself is never changed).
#[cfg(test)]
pub(crate) fn compose(records: &[Record]) -> Vec<Record> {
    let mut out = Vec::new();
    compose_from(
        records,
        leading_system(records),
        0,
        &mut out,
        &mut Vec::new(),
    );
    out
}

fn leading_system(records: &[Record]) -> usize {
    records
        .iter()
        .take_while(|r| r.role == Role::System)
        .count()
}

/// Compose `records[from..]` onto `out`, the composition of `records[..from]`
/// (whose last record a later one may still join); `starts` gets the index of
/// the first record of each composed record added.
fn compose_from(
    records: &[Record],
    leading: usize,
    from: usize,
    out: &mut Vec<Record>,
    starts: &mut Vec<usize>,
) {
    for (i, rec) in records.iter().enumerate().skip(from) {
        let rec = rec.clone();
        let Some(last) = out.last_mut() else {
            out.push(rec);
            starts.push(i);
            continue;
        };
        let joined = match (last.role, rec.role) {
            (Role::System, Role::System) if i < leading => Some("\n\n"),
            (Role::User, Role::User) => Some("\n\n"),
            (Role::Assistant, Role::Assistant) if is_text_only_assistant(last) => Some(""),
            _ => None,
        };
        match joined {
            Some(separator) => {
                let previous = std::mem::replace(&mut last.content, Content::Text(String::new()));
                last.content = merge(previous, rec.content, separator);
                if rec.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) {
                    last.tool_calls = rec.tool_calls;
                }
            }
            None => {
                out.push(rec);
                starts.push(i);
            }
        }
    }
}

/// What `models.loop` sends, kept from round to round: the composed records,
/// their wire messages and estimate bytes. A round recomposes only from the
/// first composed record that an unchanged list record does not close.
#[derive(Default)]
pub(crate) struct Composition {
    records: Vec<Record>,
    /// The index of the first list record of each composed record.
    starts: Vec<usize>,
    /// Shared with each round's request: truncating and pushing keeps the
    /// unchanged messages (and what they were pushed with) in place.
    wire: History,
    bytes: Vec<usize>,
    leading: usize,
    /// What the composed records and their wire messages cost the host
    /// (two copies of the text), paid for by the loop's VM.
    charge: Option<HostCharge>,
}

impl Composition {
    /// Bring the composition up to date with `records`, of which the first
    /// `unchanged` are the records of the last update.
    pub(crate) fn update(
        &mut self,
        lua: &Lua,
        records: &[Record],
        unchanged: usize,
    ) -> Result<(), String> {
        let leading = leading_system(records);
        // A composed record is final once an unchanged record started the next one.
        let keep = if leading == self.leading {
            self.starts
                .iter()
                .skip(1)
                .take_while(|start| **start < unchanged)
                .count()
        } else {
            0
        };
        let from = self.starts.get(keep).copied().unwrap_or(0);
        // Composing never makes more text than it reads: charge both copies
        // of what is kept and of what is read before they are built.
        let kept: usize = self.records[..keep.min(self.records.len())]
            .iter()
            .map(record_size)
            .sum();
        let more: usize = records.iter().skip(from).map(record_size).sum();
        self.charge
            .get_or_insert_with(|| HostCharge::new(lua))
            .set(2 * (kept + more))
            .map_err(|_| MEMORY_ERROR.to_string())?;
        self.records.truncate(keep);
        self.starts.truncate(keep);
        self.wire.truncate(keep);
        self.bytes.truncate(keep);
        self.leading = leading;
        compose_from(records, leading, from, &mut self.records, &mut self.starts);
        for r in &self.records[keep..] {
            let message = wire_message(r);
            self.bytes.push(estimate_bytes_of(r, &message.tool_calls));
            self.wire.push(message);
        }
        let held: usize = self.records.iter().map(record_size).sum();
        if let Some(charge) = &mut self.charge {
            // No more than was charged above: shrinking never fails.
            let _ = charge.set(2 * held);
        }
        Ok(())
    }

    /// About how many bytes the messages take as one request's JSON text.
    pub(crate) fn wire_bytes(&self) -> usize {
        self.charge.as_ref().map_or(0, |c| c.bytes() / 2)
    }

    /// The messages as the provider receives them.
    pub(crate) fn wire(&self) -> History {
        self.wire.clone()
    }

    /// The precheck's estimate: text and tool-call bytes over 4, plus 4 per composed record.
    pub(crate) fn estimate_tokens(&self) -> u64 {
        let bytes: usize = self.bytes.iter().sum();
        (bytes / 4) as u64 + 4 * self.records.len() as u64
    }
}

fn content_json(content: &Content) -> Json {
    match content {
        Content::Text(t) => Json::String(t.clone()),
        Content::Parts(parts) => Json::Array(
            parts
                .iter()
                .map(|p| match p {
                    Part::Text(t) => json!({"type": "text", "text": t}),
                    Part::Image(url) => json!({"type": "image_url", "image_url": {"url": url}}),
                })
                .collect(),
        ),
    }
}

fn wire_call(call: &CallRecord) -> ToolCall {
    ToolCall {
        id: call.id.clone(),
        name: call.name.clone(),
        arguments: compact_sorted(&call.arguments),
    }
}

fn wire_message(r: &Record) -> ChatMessage {
    ChatMessage {
        role: r.role,
        content: content_json(&r.content),
        tool_calls: r
            .tool_calls
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(wire_call)
            .collect(),
        tool_call_id: r.tool_call_id.clone(),
    }
}

/// The composed records as the provider receives them.
#[cfg(test)]
pub(crate) fn to_wire(records: &[Record]) -> Vec<ChatMessage> {
    records.iter().map(wire_message).collect()
}

/// One composed record's share of the estimate: the UTF-8 bytes of its text
/// and of its serialized tool calls.
#[cfg(test)]
fn estimate_bytes(r: &Record) -> usize {
    let calls: Vec<ToolCall> = r
        .tool_calls
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(wire_call)
        .collect();
    estimate_bytes_of(r, &calls)
}

/// [`estimate_bytes`] with the record's tool calls as its wire message has
/// them (`wire_call` of each), made once for both.
fn estimate_bytes_of(r: &Record, calls: &[ToolCall]) -> usize {
    let mut bytes = match &r.content {
        Content::Text(t) => t.len(),
        Content::Parts(parts) => parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.len(),
                Part::Image(_) => 0,
            })
            .sum(),
    };
    for call in calls {
        bytes += serde_json::to_string(call).map(|s| s.len()).unwrap_or(0);
    }
    bytes
}

/// The precheck's estimate: UTF-8 bytes of all text and serialized tool calls,
/// divided by 4 once over the whole conversation, plus 4 per composed record.
#[cfg(test)]
pub(crate) fn estimate_tokens(composed: &[Record]) -> u64 {
    let bytes: usize = composed.iter().map(estimate_bytes).sum();
    (bytes / 4) as u64 + 4 * composed.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys of `t` in `next` order (which a prompt's `pairs` sees).
    fn next_order(t: &Table) -> Vec<String> {
        t.clone()
            .pairs::<Value, Value>()
            .map(|pair| match pair {
                Ok((Value::String(k), _)) => k.to_string_lossy(),
                Ok((Value::Integer(i), _)) => i.to_string(),
                other => panic!("unexpected pair {other:?}"),
            })
            .collect()
    }

    /// Every table of a record, record first, in a fixed walk.
    fn tables_of(record: &Table) -> Vec<Table> {
        let mut out = vec![record.clone()];
        if let Ok(Value::Table(calls)) = record.raw_get::<Value>("tool_calls") {
            out.push(calls.clone());
            for call in calls.sequence_values::<Table>().flatten() {
                out.push(call);
            }
        }
        out
    }

    /// The prelude's `append_round` builds the tables the engine's Rust
    /// built before it (create, then raw sets in this order), so every
    /// record's `next` order and raw length are the same, whatever the string
    /// hash seed of the state (a fresh one each time).
    #[test]
    fn append_round_builds_the_tables_rust_built() {
        let source = crate::vm::sources::deferred_source(crate::vm::sources::PRELUDE, "loop");
        for seed_round in 0..40 {
            let lua = Lua::new();
            let h = lua.create_table().unwrap();
            for name in [
                "type", "next", "rawequal", "rawlen", "rawget", "rawset", "select",
            ] {
                let f: Value = lua.globals().get(name).unwrap();
                h.set(name, f).unwrap();
            }
            let math_type: Value = lua.load("math.type").eval().unwrap();
            h.set("math_type", math_type).unwrap();
            lua.load(&source).call::<()>(&h).unwrap();
            let append: mlua::Function = h.get("append_round").unwrap();
            let calls = 1 + seed_round % 4;
            let content = ["", "text", &"long ".repeat(20)][seed_round % 3].to_string();
            let make_args = || {
                lua.load("return { b = 1, a = 'x', [1] = nil, deep = { 1, 2 } }")
                    .eval::<Table>()
                    .unwrap()
            };
            // The old way: Rust's sets, in the order the loop made them.
            let old = lua.create_table().unwrap();
            old.raw_set(1, "first").unwrap();
            let rec = lua.create_table().unwrap();
            rec.raw_set("role", "assistant").unwrap();
            rec.raw_set("content", content.as_str()).unwrap();
            let call_list = lua.create_table().unwrap();
            for i in 0..calls {
                let c = lua.create_table().unwrap();
                c.raw_set("id", format!("call_{i}")).unwrap();
                c.raw_set("name", format!("tool{i}")).unwrap();
                c.raw_set("arguments", make_args()).unwrap();
                call_list.raw_set(i + 1, c).unwrap();
            }
            rec.raw_set("tool_calls", call_list).unwrap();
            old.raw_set(old.raw_len() + 1, rec).unwrap();
            for i in 0..calls {
                let r = lua.create_table().unwrap();
                r.raw_set("role", "tool").unwrap();
                r.raw_set("content", format!("result {i}")).unwrap();
                r.raw_set("tool_call_id", format!("call_{i}")).unwrap();
                old.raw_set(old.raw_len() + 1, r).unwrap();
            }
            // The helper's way.
            let new = lua.create_table().unwrap();
            new.raw_set(1, "first").unwrap();
            let held = lua.create_table().unwrap();
            let mut args = mlua::MultiValue::new();
            args.push_back(Value::Table(new.clone()));
            args.push_back(Value::Table(held.clone()));
            args.push_back(Value::String(lua.create_string(&content).unwrap()));
            for i in 0..calls {
                args.push_back(Value::String(
                    lua.create_string(format!("call_{i}")).unwrap(),
                ));
                args.push_back(Value::String(
                    lua.create_string(format!("tool{i}")).unwrap(),
                ));
                args.push_back(Value::Table(make_args()));
                args.push_back(Value::String(
                    lua.create_string(format!("result {i}")).unwrap(),
                ));
            }
            append.call::<()>(args).unwrap();
            assert_eq!(old.raw_len(), new.raw_len());
            assert_eq!(held.raw_len(), 1 + calls);
            for index in 2..=old.raw_len() {
                let a: Table = old.raw_get(index).unwrap();
                let b: Table = new.raw_get(index).unwrap();
                assert!(b
                    .equals(&held.raw_get::<Table>(index - 1).unwrap())
                    .unwrap());
                let (ta, tb) = (tables_of(&a), tables_of(&b));
                assert_eq!(ta.len(), tb.len());
                for (x, y) in ta.iter().zip(&tb) {
                    assert_eq!(next_order(x), next_order(y), "record {index}");
                    assert_eq!(x.raw_len(), y.raw_len());
                }
                let read = |t: &Table| {
                    read_record(
                        &Keys::new(&lua).unwrap(),
                        index,
                        &Value::Table(t.clone()),
                        &mut HostCharge::unaccounted(),
                    )
                };
                assert_eq!(read(&a), read(&b));
            }
        }
    }

    fn text(role: Role, t: &str) -> Record {
        Record {
            role,
            content: Content::Text(t.into()),
            tool_call_id: None,
            tool_calls: None,
        }
    }
    fn calls(ids: &[&str]) -> Record {
        Record {
            role: Role::Assistant,
            content: Content::Text(String::new()),
            tool_call_id: None,
            tool_calls: Some(
                ids.iter()
                    .map(|id| CallRecord {
                        id: id.to_string(),
                        name: "t".into(),
                        arguments: json!({}),
                    })
                    .collect(),
            ),
        }
    }
    fn result(id: &str) -> Record {
        Record {
            role: Role::Tool,
            content: Content::Text("r".into()),
            tool_call_id: Some(id.into()),
            tool_calls: None,
        }
    }

    /// A kept scan answers as a fresh one for every list that extends, or
    /// edits, the one it checked last: lists grown record by record from a
    /// few starts, each step checked with every possible kept prefix.
    #[test]
    fn kept_cross_record_scan_equals_a_fresh_one() {
        let system = |t: &str| text(Role::System, t);
        let parts_system = Record {
            content: Content::Parts(vec![Part::Text("p".into())]),
            ..system("")
        };
        let pool = vec![
            system("s"),
            parts_system,
            text(Role::User, "u"),
            text(Role::Assistant, "a"),
            calls(&["a"]),
            calls(&["b", "c"]),
            result("a"),
            result("b"),
            result("c"),
            result("z"),
            Record {
                tool_calls: Some(Vec::new()),
                ..text(Role::User, "bad")
            },
            Record {
                tool_call_id: Some("a".into()),
                ..text(Role::User, "bad")
            },
        ];
        // Every list of four records from the pool, then each of them
        // extended by one more: the kept state from the shorter list must
        // answer the longer one as a fresh scan does, whatever was kept.
        let mut lists: Vec<Vec<Record>> = vec![Vec::new()];
        for _ in 0..4 {
            let mut next = Vec::new();
            for list in &lists {
                for r in &pool {
                    let mut l = list.clone();
                    l.push(r.clone());
                    next.push(l);
                }
            }
            lists = next;
        }
        let mut checked = 0;
        for list in &lists {
            let mut scan = AcrossScan::default();
            let first = scan.check(list, 0);
            assert_eq!(first, check_across(list));
            for r in &pool {
                let mut longer = list.clone();
                longer.push(r.clone());
                let want = check_across(&longer);
                for kept in 0..=list.len() {
                    let mut again = AcrossScan::default();
                    let _ = again.check(list, 0);
                    assert_eq!(again.check(&longer, kept), want, "{longer:?} kept {kept}");
                    checked += 1;
                }
                // An edit in place of the last record, none of the list kept past it.
                let mut edited = list.clone();
                if let Some(last) = edited.last_mut() {
                    *last = r.clone();
                    let mut again = AcrossScan::default();
                    let _ = again.check(list, 0);
                    assert_eq!(again.check(&edited, list.len() - 1), check_across(&edited));
                }
            }
        }
        assert!(checked > 100_000);
    }

    #[test]
    fn pairing_rules_report_the_guide_messages() {
        let ok = [
            text(Role::User, "q"),
            calls(&["a", "b"]),
            result("b"),
            result("a"),
            text(Role::Assistant, "x"),
        ];
        assert_eq!(check_across(&ok), Ok(()));
        let open = [text(Role::User, "q"), calls(&["a", "b"]), result("b")];
        assert_eq!(
            check_across(&open),
            Err("messages[2] tool call \"a\" has no tool result".into())
        );
        let interrupted = [
            text(Role::User, "q"),
            calls(&["a"]),
            text(Role::User, "more"),
        ];
        assert_eq!(
            check_across(&interrupted),
            Err("messages[2] tool call \"a\" has no tool result".into())
        );
        let orphan = [
            text(Role::User, "q"),
            calls(&["a"]),
            result("a"),
            result("a"),
        ];
        assert_eq!(
            check_across(&orphan),
            Err("messages[4] is an orphan tool record: no pending assistant tool call with id \"a\"".into())
        );
        let dup = [
            text(Role::User, "q"),
            calls(&["a"]),
            result("a"),
            calls(&["a"]),
            result("a"),
        ];
        assert_eq!(
            check_across(&dup),
            Err("messages[4] tool call id \"a\" duplicates an earlier tool call".into())
        );
        let late_system = [text(Role::User, "q"), text(Role::System, "s")];
        assert_eq!(
            check_across(&late_system),
            Err("messages[2] is a system message outside the leading system block".into())
        );
    }

    #[test]
    fn merge_rules_follow_the_guide() {
        let list = [
            text(Role::System, "You are terse."),
            text(Role::System, "Answer in French."),
            text(Role::User, "Hello."),
            text(Role::User, ""),
            text(Role::User, "What time is it?"),
            text(Role::Assistant, "a"),
            text(Role::Assistant, "b"),
            calls(&["c1"]),
            result("c1"),
        ];
        let composed = compose(&list);
        assert_eq!(composed.len(), 4);
        assert_eq!(
            composed[0].content,
            Content::Text("You are terse.\n\nAnswer in French.".into())
        );
        assert_eq!(
            composed[1].content,
            Content::Text("Hello.\n\nWhat time is it?".into())
        );
        assert_eq!(composed[2].content, Content::Text("ab".into()));
        assert_eq!(composed[2].tool_calls.as_ref().map(Vec::len), Some(1));
        assert_eq!(composed[3].role, Role::Tool);
        let parts = merge(
            Content::Text("look".into()),
            Content::Parts(vec![Part::Image("data:x".into())]),
            "\n\n",
        );
        assert_eq!(
            parts,
            Content::Parts(vec![
                Part::Text("look".into()),
                Part::Text("\n\n".into()),
                Part::Image("data:x".into())
            ])
        );
    }

    /// Growing, editing and shrinking lists: the kept composition always equals
    /// composing, encoding and estimating from scratch.
    #[test]
    fn composition_kept_between_rounds_equals_a_fresh_one() {
        let steps: Vec<(Vec<Record>, usize)> = vec![
            (vec![text(Role::System, "s"), text(Role::User, "q")], 0),
            (
                vec![
                    text(Role::System, "s"),
                    text(Role::User, "q"),
                    text(Role::Assistant, "thinking"),
                ],
                2,
            ),
            // A call joins the text-only assistant record before it.
            (
                vec![
                    text(Role::System, "s"),
                    text(Role::User, "q"),
                    text(Role::Assistant, "thinking"),
                    calls(&["a"]),
                    result("a"),
                ],
                3,
            ),
            (
                vec![
                    text(Role::System, "s"),
                    text(Role::User, "q"),
                    text(Role::Assistant, "thinking"),
                    calls(&["a"]),
                    result("a"),
                    text(Role::User, "note"),
                    text(Role::User, "more"),
                ],
                5,
            ),
            // The leading system block grows: everything is composed again.
            (
                vec![
                    text(Role::System, "s"),
                    text(Role::System, "t"),
                    text(Role::User, "q"),
                ],
                1,
            ),
            (vec![text(Role::User, "edited")], 0),
        ];
        let mut kept = Composition::default();
        let lua = Lua::new();
        for (records, unchanged) in steps {
            assert_eq!(kept.update(&lua, &records, unchanged), Ok(()));
            let fresh = compose(&records);
            assert_eq!(kept.wire(), to_wire(&fresh));
            assert_eq!(kept.estimate_tokens(), estimate_tokens(&fresh));
        }
    }

    #[test]
    fn estimate_divides_once_and_adds_four_per_record() {
        let one = [text(Role::User, &"a".repeat(396))];
        assert_eq!(estimate_tokens(&one), 103);
        let two = compose(&[text(Role::User, "abc"), text(Role::User, "de")]);
        // "abc\n\nde" is 7 bytes: 1 token, plus 4 for the one merged record.
        assert_eq!(estimate_tokens(&two), 5);
    }
}
