//! The OTLP trace request in protobuf's binary encoding, written by hand.
//!
//! Only what an export sends is encoded: `ExportTraceServiceRequest` with one
//! resource, one scope and its spans (ids, names, kinds, times, attributes,
//! span events, status), field numbers as in opentelemetry-proto's
//! `trace/v1/trace.proto`, `common/v1/common.proto` and
//! `collector/trace/v1/trace_service.proto`. Binary protobuf, not OTLP/JSON,
//! because it is the encoding every OTLP/HTTP receiver takes (Arize Phoenix
//! takes no other); a few dozen lines here spare the build a protobuf stack.
//! The tests decode it with the official generated classes.

/// An attribute value (`AnyValue`).
#[derive(Debug, Clone, PartialEq)]
pub enum AnyValue {
    Str(String),
    Bool(bool),
    Int(i64),
    Double(f64),
    Array(Vec<AnyValue>),
}

/// An attribute (`KeyValue`).
#[derive(Debug, Clone, PartialEq)]
pub struct KeyValue {
    pub key: String,
    pub value: AnyValue,
}

impl KeyValue {
    pub fn new(key: &str, value: impl Into<AnyValue>) -> KeyValue {
        KeyValue {
            key: key.to_string(),
            value: value.into(),
        }
    }
}

impl From<&str> for AnyValue {
    fn from(s: &str) -> AnyValue {
        AnyValue::Str(s.to_string())
    }
}

impl From<String> for AnyValue {
    fn from(s: String) -> AnyValue {
        AnyValue::Str(s)
    }
}

impl From<bool> for AnyValue {
    fn from(b: bool) -> AnyValue {
        AnyValue::Bool(b)
    }
}

impl From<i64> for AnyValue {
    fn from(n: i64) -> AnyValue {
        AnyValue::Int(n)
    }
}

impl From<u64> for AnyValue {
    fn from(n: u64) -> AnyValue {
        AnyValue::Int(i64::try_from(n).unwrap_or(i64::MAX))
    }
}

impl From<f64> for AnyValue {
    fn from(n: f64) -> AnyValue {
        AnyValue::Double(n)
    }
}

/// `Span.SpanKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Internal = 1,
    Client = 3,
}

/// `Status.StatusCode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StatusCode {
    #[default]
    Unset = 0,
    Ok = 1,
    Error = 2,
}

/// `Span.Event`.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanEvent {
    pub time_ns: u64,
    pub name: String,
    pub attributes: Vec<KeyValue>,
}

/// One span.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_span_id: Option<[u8; 8]>,
    pub name: String,
    pub kind: SpanKind,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: Vec<KeyValue>,
    pub events: Vec<SpanEvent>,
    pub status: StatusCode,
    pub status_message: String,
}

/// Wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;

#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn key(&mut self, field: u32, wire: u8) {
        self.varint(u64::from(field) << 3 | u64::from(wire));
    }

    fn bytes(&mut self, field: u32, data: &[u8]) {
        self.key(field, LEN);
        self.varint(data.len() as u64);
        self.0.extend_from_slice(data);
    }

    /// A string field; empty ones are left out, as protobuf does.
    fn string(&mut self, field: u32, text: &str) {
        if !text.is_empty() {
            self.bytes(field, text.as_bytes());
        }
    }

    fn uint(&mut self, field: u32, v: u64) {
        if v != 0 {
            self.key(field, VARINT);
            self.varint(v);
        }
    }

    fn fixed64(&mut self, field: u32, v: u64) {
        self.key(field, FIXED64);
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn message(&mut self, field: u32, build: impl FnOnce(&mut Writer)) {
        let mut inner = Writer::default();
        build(&mut inner);
        self.bytes(field, &inner.0);
    }
}

fn any_value(w: &mut Writer, value: &AnyValue) {
    match value {
        AnyValue::Str(s) => w.bytes(1, s.as_bytes()),
        AnyValue::Bool(b) => {
            w.key(2, VARINT);
            w.varint(u64::from(*b));
        }
        AnyValue::Int(n) => {
            w.key(3, VARINT);
            w.varint(*n as u64);
        }
        AnyValue::Double(x) => {
            w.key(4, FIXED64);
            w.0.extend_from_slice(&x.to_le_bytes());
        }
        AnyValue::Array(values) => w.message(5, |array| {
            for v in values {
                array.message(1, |item| any_value(item, v));
            }
        }),
    }
}

fn key_values(w: &mut Writer, field: u32, attributes: &[KeyValue]) {
    for kv in attributes {
        w.message(field, |m| {
            m.string(1, &kv.key);
            m.message(2, |v| any_value(v, &kv.value));
        });
    }
}

fn span(w: &mut Writer, span: &Span) {
    w.bytes(1, &span.trace_id);
    w.bytes(2, &span.span_id);
    if let Some(parent) = &span.parent_span_id {
        w.bytes(4, parent);
    }
    w.string(5, &span.name);
    w.uint(6, span.kind as u64);
    w.fixed64(7, span.start_ns);
    w.fixed64(8, span.end_ns);
    key_values(w, 9, &span.attributes);
    for event in &span.events {
        w.message(11, |e| {
            e.fixed64(1, event.time_ns);
            e.string(2, &event.name);
            key_values(e, 3, &event.attributes);
        });
    }
    if span.status != StatusCode::Unset || !span.status_message.is_empty() {
        w.message(15, |s| {
            s.string(2, &span.status_message);
            s.uint(3, span.status as u64);
        });
    }
}

/// `ExportTraceServiceRequest { resource_spans: [ { resource, scope_spans:
/// [ { scope, spans } ] } ] }`.
pub fn export_request(
    resource: &[KeyValue],
    scope_name: &str,
    scope_version: &str,
    spans: &[Span],
) -> Vec<u8> {
    let mut w = Writer::default();
    w.message(1, |resource_spans| {
        resource_spans.message(1, |r| key_values(r, 1, resource));
        resource_spans.message(2, |scope_spans| {
            scope_spans.message(1, |scope| {
                scope.string(1, scope_name);
                scope.string(2, scope_version);
            });
            for s in spans {
                scope_spans.message(2, |m| span(m, s));
            }
        });
    });
    w.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_fields_follow_the_wire_format() {
        let mut w = Writer::default();
        w.varint(300);
        assert_eq!(w.0, [0xac, 0x02]);
        let mut w = Writer::default();
        w.string(5, "ab");
        w.fixed64(7, 1);
        assert_eq!(w.0, [0x2a, 2, b'a', b'b', 0x39, 1, 0, 0, 0, 0, 0, 0, 0]);
        let mut w = Writer::default();
        any_value(&mut w, &AnyValue::Int(-1));
        assert_eq!(w.0.len(), 11, "a negative int64 takes ten varint bytes");
    }
}
