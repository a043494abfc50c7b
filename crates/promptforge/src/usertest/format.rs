//! The user test file, typed: `NAME.test.yaml` beside `NAME.md`, or a YAML
//! file in a `tests/` folder naming its prompt. Every struct refuses unknown
//! keys, so a misspelled assertion is an error (exit 2, `file:line: problem`)
//! rather than a silent pass. docs/testing.md is the user's reference.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value as Json;

use super::fixtures::{ExpectedOutcome, McpFixture, Page};

/// One test file: which prompt it tests, and its cases in order.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestFile {
    /// The prompt, relative to the test file; `NAME.test.yaml` defaults to `NAME.md`.
    pub prompt: Option<PathBuf>,
    pub cases: Vec<TestCase>,
}

/// One case: the run's inputs and fixtures, then what to expect.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestCase {
    pub name: String,
    /// The argument string; a map or list is passed as its JSON text (typed `argv`).
    pub args: Option<Json>,
    pub seed: Option<u64>,
    /// The run's start instant (RFC 3339).
    pub start: Option<String>,
    /// Fixed operator answers, in order.
    pub answers: Option<Vec<String>>,
    /// A catalog model id (a live model from the host file), or the scripted
    /// model's settings.
    pub model: Option<ModelChoice>,
    /// Scripted replies, one per model round (the replies-file format).
    pub replies: Option<Vec<Json>>,
    pub web: Option<WebPages>,
    /// MCP servers offered as Plugins, by Plugin id.
    #[serde(default)]
    pub mcp: BTreeMap<String, McpFixture>,
    /// Store files placed before the run, by store path.
    #[serde(default)]
    pub store: BTreeMap<String, String>,
    /// Raw TOML appended to the run's host file.
    pub host_extra: Option<String>,
    #[serde(default)]
    pub expect: Expect,
}

/// `model:`: a catalog id, or the scripted model's catalog entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ModelChoice {
    Catalog(String),
    Scripted(ScriptedModel),
}

/// The scripted model's catalog entry (`replies` are the case's).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedModel {
    pub id: Option<String>,
    pub context: Option<u64>,
    pub thinking: Option<String>,
    pub description: Option<String>,
}

/// `web:`: pages by path (`{{WEB}}` is the server's base URL), and the search answer.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebPages {
    #[serde(default)]
    pub pages: BTreeMap<String, PageSpec>,
    pub search: Option<PageSpec>,
}

/// A page: its HTML body, or the whole answer (`status`, `content_type`, `headers`, `body`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PageSpec {
    Body(String),
    Full(Page),
}

impl PageSpec {
    pub fn to_page(&self) -> Page {
        match self {
            PageSpec::Body(text) => Page {
                status: 200,
                content_type: None,
                headers: BTreeMap::new(),
                body: Json::String(text.clone()),
            },
            PageSpec::Full(page) => page.clone(),
        }
    }
}

/// `expect:`. Without `outcome`, a case expects `completed`, or `failed`
/// when it has `error`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    pub outcome: Option<ExpectedOutcome>,
    pub result: Option<TextMatch>,
    pub error: Option<ErrorExpect>,
    /// Store files after the run: a text match, or `null` for "absent".
    #[serde(default)]
    pub store: BTreeMap<String, Option<TextMatch>>,
    /// Every tool call made, in order.
    pub tool_calls: Option<Vec<ToolCallExpect>>,
    /// What the model was offered in recorded requests.
    pub offered: Option<OneOrMany<Offered>>,
    /// How many events of each kind the run reported.
    pub events: Option<BTreeMap<String, u64>>,
    pub budget: Option<Budget>,
    pub judge: Option<OneOrMany<Judge>>,
}

impl Expect {
    pub fn outcome(&self) -> ExpectedOutcome {
        match (self.outcome, &self.error) {
            (Some(o), _) => o,
            (None, Some(_)) => ExpectedOutcome::Failed,
            (None, None) => ExpectedOutcome::Completed,
        }
    }
}

/// One value or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    pub fn items(&self) -> Vec<&T> {
        match self {
            OneOrMany::One(t) => vec![t],
            OneOrMany::Many(v) => v.iter().collect(),
        }
    }
}

/// A text expectation: a plain scalar is `equals`; a map combines matchers.
#[derive(Debug, Clone, PartialEq)]
pub enum TextMatch {
    Equals(String),
    Matchers(Matchers),
}

/// The matchers of a text expectation; all given must hold.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Matchers {
    #[serde(default, deserialize_with = "scalar_text")]
    pub equals: Option<String>,
    pub contains: Option<OneOrManyText>,
    pub not_contains: Option<OneOrManyText>,
    #[serde(default, deserialize_with = "scalar_text")]
    pub regex: Option<String>,
    /// JSON paths (`$.a.b[0]`) into the text parsed as JSON, and their values.
    pub json_path: Option<BTreeMap<String, Json>>,
}

/// One string or several. A whole number or a boolean is taken as its text;
/// a decimal number is refused with the fix, since YAML has already dropped
/// how it was written (`29.90` reads as 29.9).
#[derive(Debug, Clone, PartialEq)]
pub enum OneOrManyText {
    One(String),
    Many(Vec<String>),
}

impl OneOrManyText {
    pub fn items(&self) -> Vec<&str> {
        match self {
            OneOrManyText::One(s) => vec![s.as_str()],
            OneOrManyText::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

fn scalar_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    ScalarText::deserialize(d).map(|ScalarText(s)| Some(s))
}

/// A text written as a YAML scalar: a string, a whole number or a boolean.
struct ScalarText(String);

/// The refusal of a decimal number where text is expected, with the fix.
fn decimal_refused<E: serde::de::Error>(value: f64) -> E {
    E::custom(format!(
        "a decimal number ({value}) where text is expected: quote it as written, e.g. \"{value}\" \
         (YAML reads 29.90 as 29.9)"
    ))
}

/// The serde visitor shared by [`ScalarText`], [`OneOrManyText`] and
/// [`TextMatch`]: scalars become text here, where the YAML reader still
/// knows the value's line, so a mistake is reported there.
struct TextVisitor<const LISTS: bool, const MAPS: bool>;

/// What [`TextVisitor`] read.
enum TextValue {
    Scalar(String),
    List(Vec<String>),
    Map(Matchers),
}

impl<'de, const LISTS: bool, const MAPS: bool> serde::de::Visitor<'de>
    for TextVisitor<LISTS, MAPS>
{
    type Value = TextValue;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match (LISTS, MAPS) {
            (true, _) => f.write_str("text, or a list of texts"),
            (_, true) => f.write_str(
                "text, or a map of matchers (equals, contains, not_contains, regex, json_path)",
            ),
            _ => f.write_str("text"),
        }
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TextValue, E> {
        Ok(TextValue::Scalar(v.to_string()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<TextValue, E> {
        Ok(TextValue::Scalar(v))
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<TextValue, E> {
        Ok(TextValue::Scalar(v.to_string()))
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<TextValue, E> {
        Ok(TextValue::Scalar(v.to_string()))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<TextValue, E> {
        Err(decimal_refused(v))
    }

    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<TextValue, E> {
        Ok(TextValue::Scalar(v.to_string()))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<TextValue, A::Error> {
        if !LISTS {
            return Err(serde::de::Error::invalid_type(
                serde::de::Unexpected::Seq,
                &self,
            ));
        }
        let mut items = Vec::new();
        while let Some(ScalarText(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(TextValue::List(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<TextValue, A::Error> {
        if !MAPS {
            return Err(serde::de::Error::invalid_type(
                serde::de::Unexpected::Map,
                &self,
            ));
        }
        Matchers::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(TextValue::Map)
    }
}

impl<'de> Deserialize<'de> for ScalarText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match d.deserialize_any(TextVisitor::<false, false>)? {
            TextValue::Scalar(s) => Ok(ScalarText(s)),
            TextValue::List(_) | TextValue::Map(_) => {
                Err(serde::de::Error::custom("expected text"))
            }
        }
    }
}

impl<'de> Deserialize<'de> for OneOrManyText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match d.deserialize_any(TextVisitor::<true, false>)? {
            TextValue::Scalar(s) => Ok(OneOrManyText::One(s)),
            TextValue::List(v) => Ok(OneOrManyText::Many(v)),
            TextValue::Map(_) => Err(serde::de::Error::custom(
                "expected text, or a list of texts",
            )),
        }
    }
}

impl<'de> Deserialize<'de> for TextMatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match d.deserialize_any(TextVisitor::<false, true>)? {
            TextValue::Scalar(s) => Ok(TextMatch::Equals(s)),
            TextValue::Map(m) => Ok(TextMatch::Matchers(m)),
            TextValue::List(_) => Err(serde::de::Error::custom(
                "a text expectation is text or a map of matchers \
                 (equals, contains, not_contains, regex, json_path), not a list",
            )),
        }
    }
}

/// `error:`: the run error kind and its message.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorExpect {
    pub kind: Option<String>,
    pub message: Option<TextMatch>,
}

/// One expected tool call: its alias, and (when given) its exact arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallExpect {
    pub alias: String,
    pub arguments: Option<Json>,
    /// Written as a bare alias (kept that way by `--update`).
    pub bare: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolCallFull {
    alias: String,
    arguments: Option<Json>,
}

impl<'de> Deserialize<'de> for ToolCallExpect {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match Json::deserialize(d)? {
            Json::String(alias) => Ok(ToolCallExpect {
                alias,
                arguments: None,
                bare: true,
            }),
            map @ Json::Object(_) => {
                let full: ToolCallFull = serde_json::from_value(map).map_err(D::Error::custom)?;
                Ok(ToolCallExpect {
                    alias: full.alias,
                    arguments: full.arguments,
                    bare: false,
                })
            }
            other => Err(D::Error::custom(format!(
                "a tool call is an alias or {{alias, arguments}}, not {other}"
            ))),
        }
    }
}

/// `offered:`: what one recorded model request showed the model.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Offered {
    /// Which request (0 is the first); default 0.
    #[serde(default)]
    pub request: usize,
    /// The offered tool names, in order.
    pub tools: Option<Vec<String>>,
    /// Tool descriptions by tool name.
    #[serde(default)]
    pub descriptions: BTreeMap<String, String>,
    /// The request's messages as text: each `ROLE: CONTENT`, blank lines between.
    pub messages: Option<TextMatch>,
}

/// `budget:`: upper bounds, each inclusive.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Model rounds: requests sent to the model.
    pub rounds: Option<u64>,
    /// Total tokens the provider reported (prompt + completion).
    pub tokens: Option<u64>,
    /// Wall time of the whole run, in milliseconds.
    pub wall_ms: Option<u64>,
}

/// `judge:`: ask a catalog model whether the result meets a rubric.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Judge {
    pub model: String,
    pub rubric: String,
}

/// A test file that cannot be used: where, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Malformed {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub problem: String,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file.display(), self.problem),
            None => write!(f, "{}: {}", self.file.display(), self.problem),
        }
    }
}

/// A loaded test file: its path, text, typed content and the prompt it tests.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub file: PathBuf,
    pub text: String,
    pub tests: TestFile,
    pub prompt: PathBuf,
    /// Each case's first line in the file (1-based), in case order.
    pub case_lines: Vec<usize>,
}

/// Read, parse and check one test file.
pub fn load(file: &Path) -> Result<Loaded, Malformed> {
    let bad = |line: Option<usize>, problem: String| Malformed {
        file: file.to_path_buf(),
        line,
        problem,
    };
    let text = std::fs::read_to_string(file).map_err(|e| bad(None, format!("cannot read: {e}")))?;
    let tests: TestFile = serde_norway::from_str(&text).map_err(|e| {
        let line = e.location().map(|l| l.line());
        // The location is given separately; drop serde_norway's " at line N column M".
        let message = e.to_string();
        let message = match message.find(" at line ") {
            Some(at) => message[..at].to_string(),
            None => message,
        };
        bad(line, message)
    })?;
    let spans = super::update::locate_cases(&text).unwrap_or_default();
    let case_lines: Vec<usize> = (0..tests.cases.len())
        .map(|i| spans.get(i).map_or(1, |s| s.line))
        .collect();
    let prompt = match &tests.prompt {
        Some(p) => file.parent().unwrap_or(Path::new(".")).join(p),
        None => default_prompt(file).ok_or_else(|| {
            bad(
                Some(1),
                "no `prompt:` key, and the file is not named NAME.test.yaml beside NAME.md"
                    .to_string(),
            )
        })?,
    };
    if !prompt.is_file() {
        return Err(bad(
            Some(1),
            format!("the prompt {} does not exist", prompt.display()),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, case) in tests.cases.iter().enumerate() {
        let line = Some(case_lines[i]);
        if case.name.trim().is_empty() {
            return Err(bad(line, "a case needs a non-empty `name`".into()));
        }
        if !seen.insert(case.name.as_str()) {
            return Err(bad(line, format!("two cases are named {:?}", case.name)));
        }
        for path in case.store.keys().chain(case.expect.store.keys()) {
            if !is_store_path(path) {
                return Err(bad(
                    line,
                    format!("store path {path:?} must be relative, without `..`"),
                ));
            }
        }
        if let Some(m) = &case.expect.result {
            check_regex(m).map_err(|e| bad(line, e))?;
        }
        if let Some(TextMatch::Matchers(m)) =
            case.expect.error.as_ref().and_then(|e| e.message.as_ref())
        {
            check_regex(&TextMatch::Matchers(m.clone())).map_err(|e| bad(line, e))?;
        }
    }
    Ok(Loaded {
        file: file.to_path_buf(),
        text,
        tests,
        prompt,
        case_lines,
    })
}

fn check_regex(m: &TextMatch) -> Result<(), String> {
    if let TextMatch::Matchers(Matchers {
        regex: Some(re), ..
    }) = m
    {
        regex::Regex::new(re).map_err(|e| format!("bad regex {re:?}: {e}"))?;
    }
    Ok(())
}

/// A store path a test may name: relative, no `..`, no root.
fn is_store_path(path: &str) -> bool {
    let p = Path::new(path);
    !path.is_empty()
        && p.components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
}

/// `NAME.test.yaml` (or `.yml`) tests `NAME.md` beside it.
fn default_prompt(file: &Path) -> Option<PathBuf> {
    let name = file.file_name()?.to_str()?;
    let stem = name
        .strip_suffix(".test.yaml")
        .or_else(|| name.strip_suffix(".test.yml"))?;
    Some(file.with_file_name(format!("{stem}.md")))
}

/// Whether `file` is a test file by its name and place: `*.test.yaml`, or a
/// YAML file in a `tests/` folder with a top-level `prompt:` key.
pub fn is_test_file(file: &Path) -> bool {
    let Some(name) = file.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    if name.ends_with(".test.yaml") || name.ends_with(".test.yml") {
        return true;
    }
    let in_tests = file
        .parent()
        .and_then(|p| p.file_name())
        .is_some_and(|n| n == "tests");
    in_tests
        && (name.ends_with(".yaml") || name.ends_with(".yml"))
        && std::fs::read_to_string(file)
            .map(|t| t.lines().any(|l| l.starts_with("prompt:")))
            .unwrap_or(false)
}
