//! [`History`]: a request's messages, shared between the rounds of a loop
//! and whoever records them, so neither copies nor compares the whole
//! conversation each round.

use std::fmt;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ChatMessage;

/// The conversation of a [`ChatRequest`](crate::ChatRequest), oldest first;
/// reads as a `[ChatMessage]`.
///
/// Cloning shares the messages. A loop keeps one history and hands a clone
/// to each round: pushing onto it appends in place once the last round's
/// request is gone (the messages are copied only while a clone still holds
/// them), and a message pushed where an equal one was truncated is kept, not
/// replaced. Each pushed message gets a mark that no other push gets, and no
/// operation changes a message without removing everything after it, so a
/// message's mark stands for it and every message before it: [`mark`] and
/// [`extends`] tell "this history begins with that one" in constant time.
///
/// [`mark`]: History::mark
/// [`extends`]: History::extends
#[derive(Clone, Default)]
pub struct History {
    written: Arc<Written>,
    /// How many of `written`'s messages this history holds.
    len: usize,
}

#[derive(Clone, Default)]
struct Written {
    messages: Vec<ChatMessage>,
    /// Each message's mark, unique to the push that wrote it.
    marks: Vec<u64>,
}

/// A history as it was when [`History::mark`] was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryMark {
    len: usize,
    /// The last message's mark (0 for an empty history).
    last: u64,
}

impl HistoryMark {
    /// How many messages the marked history held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the marked history was empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Marks start at 1: 0 is an empty history's.
static NEXT_MARK: AtomicU64 = AtomicU64::new(1);

impl History {
    /// An empty history.
    pub fn new() -> History {
        History::default()
    }

    /// Append `message`.
    pub fn push(&mut self, message: ChatMessage) {
        let at = self.len;
        // Truncated, then given back unchanged: keep it (and its mark).
        if self.written.messages.get(at) == Some(&message) {
            self.len += 1;
            return;
        }
        let mark = NEXT_MARK.fetch_add(1, Ordering::Relaxed);
        match Arc::get_mut(&mut self.written) {
            Some(written) => {
                written.messages.truncate(at);
                written.marks.truncate(at);
                written.messages.push(message);
                written.marks.push(mark);
            }
            None => {
                // A clone still holds these messages: copy ours (their marks
                // too, as they are the same messages).
                let mut messages = Vec::with_capacity(at + 1);
                messages.extend_from_slice(&self.written.messages[..at]);
                messages.push(message);
                let mut marks = Vec::with_capacity(at + 1);
                marks.extend_from_slice(&self.written.marks[..at]);
                marks.push(mark);
                self.written = Arc::new(Written { messages, marks });
            }
        }
        self.len += 1;
    }

    /// Keep the first `len` messages (all of them if there are fewer).
    pub fn truncate(&mut self, len: usize) {
        // The messages stay written until a different one is pushed in
        // their place, so an equal one given back keeps its mark.
        self.len = self.len.min(len);
    }

    /// This history as it is now, for a later [`extends`](History::extends).
    pub fn mark(&self) -> HistoryMark {
        HistoryMark {
            len: self.len,
            last: self.len.checked_sub(1).map_or(0, |i| self.written.marks[i]),
        }
    }

    /// Whether this history begins with the one `mark` was taken of: true
    /// only if its first `mark.len()` messages are that history's (one
    /// mark comparison; a history built apart from it, even with equal
    /// messages, does not extend it).
    pub fn extends(&self, mark: HistoryMark) -> bool {
        match mark.len.checked_sub(1) {
            None => true,
            Some(last) => last < self.len && self.written.marks[last] == mark.last,
        }
    }
}

impl Deref for History {
    type Target = [ChatMessage];

    fn deref(&self) -> &[ChatMessage] {
        &self.written.messages[..self.len]
    }
}

impl From<Vec<ChatMessage>> for History {
    fn from(messages: Vec<ChatMessage>) -> History {
        let marks = messages
            .iter()
            .map(|_| NEXT_MARK.fetch_add(1, Ordering::Relaxed))
            .collect();
        History {
            len: messages.len(),
            written: Arc::new(Written { messages, marks }),
        }
    }
}

impl From<&[ChatMessage]> for History {
    fn from(messages: &[ChatMessage]) -> History {
        History::from(messages.to_vec())
    }
}

impl FromIterator<ChatMessage> for History {
    fn from_iter<I: IntoIterator<Item = ChatMessage>>(messages: I) -> History {
        History::from(messages.into_iter().collect::<Vec<_>>())
    }
}

impl<'a> IntoIterator for &'a History {
    type Item = &'a ChatMessage;
    type IntoIter = std::slice::Iter<'a, ChatMessage>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl PartialEq for History {
    fn eq(&self, other: &History) -> bool {
        self[..] == other[..]
    }
}

impl PartialEq<Vec<ChatMessage>> for History {
    fn eq(&self, other: &Vec<ChatMessage>) -> bool {
        self[..] == other[..]
    }
}

impl PartialEq<[ChatMessage]> for History {
    fn eq(&self, other: &[ChatMessage]) -> bool {
        self[..] == *other
    }
}

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for History {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self[..].serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for History {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<History, D::Error> {
        Vec::<ChatMessage>::deserialize(deserializer).map(History::from)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn user(text: &str) -> ChatMessage {
        ChatMessage::new(crate::Role::User, json!(text))
    }

    #[test]
    fn a_round_that_appends_extends_the_last_and_shares_its_messages() {
        let mut kept = History::new();
        let empty = kept.mark();
        kept.push(user("a"));
        let first = kept.clone();
        let at_first = first.mark();
        // The first round's request still holds the messages: copied once.
        kept.push(user("b"));
        assert!(kept.extends(at_first) && kept.extends(empty));
        assert_eq!(first.len(), 1);
        assert_eq!(kept, vec![user("a"), user("b")]);
        drop(first);
        // Nobody else holds them: appended in place.
        let before = Arc::as_ptr(&kept.written);
        let at_second = kept.mark();
        kept.push(user("c"));
        assert_eq!(Arc::as_ptr(&kept.written), before);
        assert!(kept.extends(at_second) && kept.extends(at_first));
        assert!(!History::from(vec![user("a"), user("b")]).extends(at_second));
    }

    #[test]
    fn a_changed_message_breaks_every_mark_from_it_on() {
        let mut kept = History::from(vec![user("a"), user("b"), user("c")]);
        let whole = kept.mark();
        let two = {
            let mut h = kept.clone();
            h.truncate(2);
            h.mark()
        };
        // Truncated and given back equal: still the same history.
        kept.truncate(2);
        kept.push(user("c"));
        assert!(kept.extends(whole));
        // Given back different: only the part before it is.
        kept.truncate(1);
        kept.push(user("B"));
        kept.push(user("c"));
        assert!(!kept.extends(whole) && !kept.extends(two));
        assert_eq!(kept, vec![user("a"), user("B"), user("c")]);
        let mut shared = kept.clone();
        shared.truncate(1);
        shared.push(user("x"));
        assert_eq!(kept, vec![user("a"), user("B"), user("c")]);
        assert_eq!(shared, vec![user("a"), user("x")]);
        assert!(!shared.extends(kept.mark()));
        assert_eq!(
            serde_json::to_string(&shared).unwrap(),
            serde_json::to_string(&vec![user("a"), user("x")]).unwrap()
        );
    }
}
