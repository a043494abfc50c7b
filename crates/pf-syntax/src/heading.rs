//! Heading references (`'## Name'`) name a section by level and name. They are
//! resolved at run time against the caller's visible set; these helpers give
//! the engine the exact rules and messages.

use crate::ast::{Prompt, Section};

/// A parsed heading reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadingRef<'a> {
    /// The number of `#` markers, i.e. the target's heading level.
    pub level: usize,
    /// The name, trimmed.
    pub name: &'a str,
    /// The whole reference, trimmed, as written.
    pub text: &'a str,
}

/// Parses a heading reference, checking in the documented order: markers,
/// then a name, then whitespace after the markers. The error is the message.
pub fn parse_heading_ref(raw: &str) -> Result<HeadingRef<'_>, String> {
    let text = raw.trim();
    let markers = text.bytes().take_while(|b| *b == b'#').count();
    if markers == 0 {
        return Err(format!(
            "section heading must include ### markers, got bare name: {text}"
        ));
    }
    let after = &text[markers..];
    let name = after.trim();
    if name.is_empty() {
        return Err(format!("section heading has no name: {text}"));
    }
    if !after.starts_with(char::is_whitespace) {
        return Err(format!(
            "section heading must have whitespace after the {} markers: {text}",
            &text[..markers]
        ));
    }
    Ok(HeadingRef {
        level: markers,
        name,
        text,
    })
}

/// A section's own heading reference, such as `## Main`.
pub fn heading_of(section: &Section) -> String {
    format!("{} {}", "#".repeat(section.level as usize), section.name)
}

impl Prompt {
    /// The section at an index path (`[2, 0]` is the first child of the third
    /// top-level section). The empty path names no section (it is the H1 body).
    pub fn section(&self, path: &[usize]) -> Option<&Section> {
        let (first, rest) = path.split_first()?;
        let mut section = self.sections.get(*first)?;
        for index in rest {
            section = section.children.get(*index)?;
        }
        Some(section)
    }

    /// The sections a caller at `caller` can address, each with its index
    /// path: its siblings other than itself, then its own direct children.
    /// From the H1 body (the empty path) that is every top-level section.
    pub fn visible_sections(&self, caller: &[usize]) -> Vec<(Vec<usize>, &Section)> {
        let Some((own_index, parent_path)) = caller.split_last() else {
            return self
                .sections
                .iter()
                .enumerate()
                .map(|(i, s)| (vec![i], s))
                .collect();
        };
        let siblings: &[Section] = if parent_path.is_empty() {
            &self.sections
        } else {
            match self.section(parent_path) {
                Some(parent) => &parent.children,
                None => &[],
            }
        };
        let mut visible = Vec::new();
        for (index, sibling) in siblings.iter().enumerate() {
            if index != *own_index {
                let mut path = parent_path.to_vec();
                path.push(index);
                visible.push((path, sibling));
            }
        }
        if let Some(own) = self.section(caller) {
            for (index, child) in own.children.iter().enumerate() {
                let mut path = caller.to_vec();
                path.push(index);
                visible.push((path, child));
            }
        }
        visible
    }
}

/// Resolves a heading reference from a caller (index path; empty for the H1
/// body) to the target's index path and section, or the exact error message.
pub fn resolve_heading<'p>(
    prompt: &'p Prompt,
    caller: &[usize],
    raw: &str,
) -> Result<(Vec<usize>, &'p Section), String> {
    let reference = parse_heading_ref(raw)?;
    let visible = prompt.visible_sections(caller);
    if let Some(found) = visible
        .iter()
        .find(|(_, s)| s.level as usize == reference.level && s.name == reference.name)
    {
        return Ok(found.clone());
    }
    let list: Vec<String> = visible.iter().map(|(_, s)| heading_of(s)).collect();
    Err(format!(
        "section heading `{}` not found; available sections: {}",
        reference.text,
        list.join(", ")
    ))
}
