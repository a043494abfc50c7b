//! A small YAML node tree built from `saphyr-parser` events, with line and
//! column marks, a nesting cap, and a cap on alias expansion so hostile input
//! (deep nesting, "billion laughs") stays cheap.

use saphyr_parser::{Event, Parser, ScalarStyle, Span};
use std::collections::HashMap;

/// Deepest nesting of sequences and maps the frontmatter may use.
pub const MAX_DEPTH: usize = 64;
/// Most nodes the frontmatter may hold, aliases counted at their expanded size.
pub const MAX_NODES: usize = 100_000;

/// A position in the prompt file: 1-based line, 1-based byte column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub line: u32,
    pub column: u32,
}

#[derive(Debug, Clone)]
pub struct Node {
    pub kind: NodeKind,
    pub mark: Mark,
}

#[derive(Debug, Clone)]
pub enum NodeKind {
    /// A scalar with its source text; `plain` is false for quoted or block
    /// scalars and for `!!str`-tagged ones, which are always strings.
    Scalar {
        text: String,
        plain: bool,
    },
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

/// What a scalar resolves to under the YAML 1.2 core schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalarType {
    Null,
    Bool(bool),
    Int,
    Float,
    Str,
}

impl Node {
    pub fn scalar_type(&self) -> Option<ScalarType> {
        match &self.kind {
            NodeKind::Scalar { text, plain } => Some(if *plain {
                resolve_plain(text)
            } else {
                ScalarType::Str
            }),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        self.scalar_type() == Some(ScalarType::Null)
    }

    /// The source text of a scalar.
    pub fn text(&self) -> Option<&str> {
        match &self.kind {
            NodeKind::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }

    /// A string scalar's text (quoted, or plain resolving to a string).
    pub fn as_str(&self) -> Option<&str> {
        match self.scalar_type() {
            Some(ScalarType::Str) => self.text(),
            _ => None,
        }
    }

    /// The kind of value written, in the wording of serde's "invalid type"
    /// messages, e.g. ``integer `42` `` or `sequence`.
    pub fn describe(&self) -> String {
        match &self.kind {
            NodeKind::Seq(_) => "sequence".to_string(),
            NodeKind::Map(_) => "map".to_string(),
            NodeKind::Scalar { text, .. } => match self.scalar_type() {
                Some(ScalarType::Null) => "unit value".to_string(),
                Some(ScalarType::Bool(b)) => format!("boolean `{b}`"),
                Some(ScalarType::Int) => format!("integer `{text}`"),
                Some(ScalarType::Float) => format!("floating point `{text}`"),
                _ => format!("string \"{text}\""),
            },
        }
    }

    /// Converts to JSON. Bounded by the node cap; numbers that JSON cannot hold
    /// (`.nan`, `.inf`) become strings of their source text.
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match &self.kind {
            NodeKind::Seq(items) => Value::Array(items.iter().map(Node::to_json).collect()),
            NodeKind::Map(entries) => {
                let mut map = serde_json::Map::new();
                for (key, value) in entries {
                    let key_text = match key.text() {
                        Some(text) => text.to_string(),
                        None => key.to_json().to_string(),
                    };
                    map.insert(key_text, value.to_json());
                }
                Value::Object(map)
            }
            NodeKind::Scalar { text, .. } => match self.scalar_type() {
                Some(ScalarType::Null) => Value::Null,
                Some(ScalarType::Bool(b)) => Value::Bool(b),
                Some(ScalarType::Int) => match parse_int(text) {
                    Some(IntValue::Signed(i)) => Value::from(i),
                    Some(IntValue::Unsigned(u)) => Value::from(u),
                    None => Value::String(text.clone()),
                },
                Some(ScalarType::Float) => parse_float(text)
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number)
                    .unwrap_or_else(|| Value::String(text.clone())),
                _ => Value::String(text.clone()),
            },
        }
    }
}

pub enum IntValue {
    Signed(i64),
    Unsigned(u64),
}

/// Parses a core-schema integer (decimal, `0o`, `0x`). `None` when it does
/// not fit 64 bits.
pub fn parse_int(text: &str) -> Option<IntValue> {
    let (negative, body) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let magnitude: u64 = if let Some(hex) = body.strip_prefix("0x") {
        u64::from_str_radix(hex, 16).ok()?
    } else if let Some(oct) = body.strip_prefix("0o") {
        u64::from_str_radix(oct, 8).ok()?
    } else {
        body.parse::<u64>().ok()?
    };
    if negative {
        if magnitude <= i64::MAX as u64 + 1 {
            Some(IntValue::Signed(0i64.wrapping_sub_unsigned(magnitude)))
        } else {
            None
        }
    } else {
        Some(IntValue::Unsigned(magnitude))
    }
}

pub fn parse_float(text: &str) -> Option<f64> {
    match text {
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => Some(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => Some(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => Some(f64::NAN),
        _ => text.parse::<f64>().ok(),
    }
}

fn is_decimal_int(s: &str) -> bool {
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    !body.is_empty() && body.bytes().all(|b| b.is_ascii_digit())
}

fn is_core_float(s: &str) -> bool {
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((int_part, frac)) => {
            (int_part.bytes().all(|b| b.is_ascii_digit())
                && frac.bytes().all(|b| b.is_ascii_digit()))
                && !(int_part.is_empty() && frac.is_empty())
        }
        None => !mantissa.is_empty() && mantissa.bytes().all(|b| b.is_ascii_digit()),
    };
    let exponent_ok = match exponent {
        Some(e) => is_decimal_int(e),
        None => true,
    };
    mantissa_ok && exponent_ok
}

fn resolve_plain(text: &str) -> ScalarType {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => ScalarType::Null,
        "true" | "True" | "TRUE" => ScalarType::Bool(true),
        "false" | "False" | "FALSE" => ScalarType::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" | "-.inf" | "-.Inf" | "-.INF"
        | ".nan" | ".NaN" | ".NAN" => ScalarType::Float,
        _ => {
            let hex = text
                .strip_prefix("0x")
                .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()));
            let oct = text
                .strip_prefix("0o")
                .is_some_and(|o| !o.is_empty() && o.bytes().all(|b| (b'0'..=b'7').contains(&b)));
            if is_decimal_int(text) || hex || oct {
                ScalarType::Int
            } else if is_core_float(text) {
                ScalarType::Float
            } else {
                ScalarType::Str
            }
        }
    }
}

/// A YAML failure: the detail (without the `invalid frontmatter: ` prefix)
/// and where it happened.
#[derive(Debug, Clone)]
pub struct YamlError {
    pub detail: String,
    pub mark: Mark,
}

/// Maps saphyr's marks (YAML-text line, 0-based char column) to file marks.
struct MarkMapper<'a> {
    lines: Vec<&'a str>,
    first_file_line: u32,
}

impl MarkMapper<'_> {
    fn mark(&self, span: &Span) -> Mark {
        let yaml_line = span.start.line().max(1);
        let char_col = span.start.col();
        let byte_col = self
            .lines
            .get(yaml_line - 1)
            .map(|line| {
                line.char_indices()
                    .nth(char_col)
                    .map(|(i, _)| i)
                    .unwrap_or(line.len())
            })
            .unwrap_or(char_col);
        let line = (yaml_line as u64 - 1 + self.first_file_line as u64).min(u32::MAX as u64);
        Mark {
            line: line as u32,
            column: (byte_col as u64 + 1).min(u32::MAX as u64) as u32,
        }
    }
}

enum Frame {
    Seq {
        items: Vec<Node>,
        mark: Mark,
        anchor: usize,
    },
    Map {
        entries: Vec<(Node, Node)>,
        pending_key: Option<Node>,
        mark: Mark,
        anchor: usize,
    },
}

fn node_count(node: &Node) -> usize {
    match &node.kind {
        NodeKind::Scalar { .. } => 1,
        NodeKind::Seq(items) => 1 + items.iter().map(node_count).sum::<usize>(),
        NodeKind::Map(entries) => {
            1 + entries
                .iter()
                .map(|(k, v)| node_count(k) + node_count(v))
                .sum::<usize>()
        }
    }
}

/// Parses `text` (the frontmatter between the delimiters, starting at file line
/// `first_file_line`) into one document node. An empty document is `None`.
pub fn parse_document(text: &str, first_file_line: u32) -> Result<Option<Node>, YamlError> {
    let mapper = MarkMapper {
        lines: text.split('\n').collect(),
        first_file_line,
    };
    let mut parser = Parser::new_from_str(text);
    let mut stack: Vec<Frame> = Vec::new();
    let mut anchors: HashMap<usize, (Node, usize)> = HashMap::new();
    let mut root: Option<Node> = None;
    let mut documents = 0usize;
    let mut total_nodes = 0usize;

    let too_many = |mark: Mark| YamlError {
        detail: format!(
            "the frontmatter holds more than {MAX_NODES} YAML nodes once aliases are expanded"
        ),
        mark,
    };

    while let Some(next) = parser.next_event() {
        let (event, span) = next.map_err(|e| {
            let span = Span::empty(*e.marker());
            YamlError {
                detail: e.info().to_string(),
                mark: mapper.mark(&span),
            }
        })?;
        let mark = mapper.mark(&span);
        // A finished node (scalar, alias, or closed collection) to attach.
        let finished: Option<(Node, usize)> = match event {
            Event::StreamStart | Event::StreamEnd | Event::Nothing | Event::DocumentEnd => None,
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    return Err(YamlError {
                        detail: "the frontmatter must hold a single YAML document".to_string(),
                        mark,
                    });
                }
                None
            }
            Event::Scalar(value, style, anchor, tag) => {
                total_nodes += 1;
                if total_nodes > MAX_NODES {
                    return Err(too_many(mark));
                }
                let forced_string = tag.as_ref().is_some_and(|t| {
                    (t.handle == "tag:yaml.org,2002:" || t.handle == "!!") && t.suffix == "str"
                });
                let plain = style == ScalarStyle::Plain && !forced_string;
                Some((
                    Node {
                        kind: NodeKind::Scalar {
                            text: value.into_owned(),
                            plain,
                        },
                        mark,
                    },
                    anchor,
                ))
            }
            Event::Alias(id) => match anchors.get(&id) {
                Some((node, size)) => {
                    total_nodes += size;
                    if total_nodes > MAX_NODES {
                        return Err(too_many(mark));
                    }
                    let mut copy = node.clone();
                    copy.mark = mark;
                    Some((copy, 0))
                }
                None => {
                    return Err(YamlError {
                        detail: "unknown YAML alias".to_string(),
                        mark,
                    })
                }
            },
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                total_nodes += 1;
                if total_nodes > MAX_NODES {
                    return Err(too_many(mark));
                }
                if stack.len() >= MAX_DEPTH {
                    return Err(YamlError {
                        detail: format!("the frontmatter nests deeper than {MAX_DEPTH} levels"),
                        mark,
                    });
                }
                if matches!(event, Event::SequenceStart(..)) {
                    stack.push(Frame::Seq {
                        items: Vec::new(),
                        mark,
                        anchor,
                    });
                } else {
                    stack.push(Frame::Map {
                        entries: Vec::new(),
                        pending_key: None,
                        mark,
                        anchor,
                    });
                }
                None
            }
            Event::SequenceEnd | Event::MappingEnd => match stack.pop() {
                Some(Frame::Seq {
                    items,
                    mark,
                    anchor,
                }) => Some((
                    Node {
                        kind: NodeKind::Seq(items),
                        mark,
                    },
                    anchor,
                )),
                Some(Frame::Map {
                    entries,
                    mark,
                    anchor,
                    ..
                }) => Some((
                    Node {
                        kind: NodeKind::Map(entries),
                        mark,
                    },
                    anchor,
                )),
                None => None,
            },
        };
        if let Some((node, anchor)) = finished {
            if anchor > 0 {
                let size = node_count(&node);
                anchors.insert(anchor, (node.clone(), size));
            }
            match stack.last_mut() {
                Some(Frame::Seq { items, .. }) => items.push(node),
                Some(Frame::Map {
                    entries,
                    pending_key,
                    ..
                }) => match pending_key.take() {
                    Some(key) => entries.push((key, node)),
                    None => *pending_key = Some(node),
                },
                None => root = Some(node),
            }
        }
    }
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_file_positions() {
        let doc = parse_document("name: x\nplugins:\n  - 42\n", 2)
            .unwrap()
            .unwrap();
        let NodeKind::Map(entries) = &doc.kind else {
            panic!("not a map")
        };
        assert_eq!(entries[0].0.mark, Mark { line: 2, column: 1 });
        let NodeKind::Seq(items) = &entries[1].1.kind else {
            panic!("not a seq")
        };
        assert_eq!(items[0].mark, Mark { line: 4, column: 5 });
        assert_eq!(items[0].describe(), "integer `42`");
    }

    #[test]
    fn scalar_types() {
        assert_eq!(resolve_plain("0"), ScalarType::Int);
        assert_eq!(resolve_plain("-12"), ScalarType::Int);
        assert_eq!(resolve_plain("0x1F"), ScalarType::Int);
        assert_eq!(resolve_plain("1.5"), ScalarType::Float);
        assert_eq!(resolve_plain("1e3"), ScalarType::Float);
        assert_eq!(resolve_plain(".5"), ScalarType::Float);
        assert_eq!(resolve_plain("."), ScalarType::Str);
        assert_eq!(resolve_plain("yes"), ScalarType::Str);
        assert_eq!(resolve_plain("~"), ScalarType::Null);
    }

    #[test]
    fn alias_bomb_is_refused() {
        let mut text = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        let mut previous = 'a';
        for name in ['b', 'c', 'd', 'e', 'f', 'g', 'h', 'i'] {
            text.push_str(&format!(
                "{name}: &{name} [*{previous}, *{previous}, *{previous}, *{previous}, *{previous}, *{previous}, *{previous}, *{previous}, *{previous}, *{previous}]\n"
            ));
            previous = name;
        }
        let err = parse_document(&text, 2).unwrap_err();
        assert!(err.detail.contains("more than 100000"), "{}", err.detail);
    }
}
