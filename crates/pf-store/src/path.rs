//! Store path rules (guide ch. 09 "Store paths") and the mapping of a valid
//! logical path onto names in the store directory.

use crate::error::{messages, StoreError};

/// The longest store path, in UTF-8 bytes.
pub const MAX_PATH_BYTES: usize = 1024;

/// Why a path was refused. Checked in this order; the first broken rule wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PathRejection {
    Empty,
    TooLong,
    Absolute,
    ControlCharacter,
    Backslash,
    EmptySegment,
    TraversalSegment,
    UnsafeSegmentEnd,
    ReservedDeviceName,
}

impl PathRejection {
    /// The reason text that follows `invalid path "{path}": `.
    pub fn reason(self) -> &'static str {
        match self {
            PathRejection::Empty => "path is empty",
            PathRejection::TooLong => "path is too long",
            PathRejection::Absolute => "path is absolute",
            PathRejection::ControlCharacter => "path contains a control character",
            PathRejection::Backslash => "path contains a backslash",
            PathRejection::EmptySegment => "path contains an empty segment",
            PathRejection::TraversalSegment => "path contains a traversal segment",
            PathRejection::UnsafeSegmentEnd => "path segment ends in an unsafe character",
            PathRejection::ReservedDeviceName => "path contains a reserved device name",
        }
    }
}

const DEVICE_NAMES: [&str; 22] = [
    "CON", "PRN", "AUX", "NUL", "COM1", "COM2", "COM3", "COM4", "COM5", "COM6", "COM7", "COM8",
    "COM9", "LPT1", "LPT2", "LPT3", "LPT4", "LPT5", "LPT6", "LPT7", "LPT8", "LPT9",
];

pub(crate) fn is_control_byte(byte: u8) -> bool {
    byte < 0x20 || byte == 0x7f
}

fn is_device_name(segment: &str) -> bool {
    // Only the base name, the text before the first `.`, counts.
    let base = segment.split('.').next().unwrap_or(segment);
    DEVICE_NAMES
        .iter()
        .any(|device| base.eq_ignore_ascii_case(device))
}

/// Checks `path` against every store path rule and says which one it breaks first.
pub fn check_path(path: &str) -> Result<(), PathRejection> {
    if path.is_empty() {
        return Err(PathRejection::Empty);
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(PathRejection::TooLong);
    }
    if path.starts_with('/') {
        return Err(PathRejection::Absolute);
    }
    if path.bytes().any(is_control_byte) {
        return Err(PathRejection::ControlCharacter);
    }
    if path.contains('\\') {
        return Err(PathRejection::Backslash);
    }
    for segment in path.split('/') {
        if segment.is_empty() {
            return Err(PathRejection::EmptySegment);
        }
        if segment == "." || segment == ".." {
            return Err(PathRejection::TraversalSegment);
        }
        if segment.ends_with('.') || segment.ends_with(' ') {
            return Err(PathRejection::UnsafeSegmentEnd);
        }
        if is_device_name(segment) {
            return Err(PathRejection::ReservedDeviceName);
        }
    }
    Ok(())
}

/// Validates a store path; the error carries the exact `invalid path` message.
pub fn validate_path(path: &str) -> Result<(), StoreError> {
    check_path(path)
        .map_err(|rejection| StoreError::user(messages::invalid_path(path, rejection.reason())))
}

/// The longest name most filesystems (ext4, tmpfs, APFS, NTFS) accept.
const MAX_NAME_BYTES: usize = 255;
/// Room for a chunk plus its continuation mark within `MAX_NAME_BYTES`.
const CHUNK_BYTES: usize = MAX_NAME_BYTES - 1;
/// Ends every continuation directory. No valid store name ends in `.`, so a
/// directory entry ending in `.` is always a continuation, never a user's name.
pub(crate) const CONTINUATION_MARK: char = '.';

/// One name in the store directory standing for (part of) a logical segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PhysicalName {
    pub(crate) name: String,
    /// A directory holding the next chunk of an over-long segment.
    pub(crate) continuation: bool,
}

/// Maps a *valid* logical path to the names it occupies in the store directory.
///
/// A segment of up to 255 bytes is stored under its own name. A longer segment
/// (the guide allows one name to fill all 1024 bytes, more than a filesystem
/// name can hold) is split at character boundaries into chunks of at most 254
/// bytes, each stored as a directory named chunk + `.`, with the last chunk as
/// the real entry.
pub(crate) fn physical_names(path: &str) -> Vec<PhysicalName> {
    let mut names = Vec::new();
    for segment in path.split('/') {
        let mut rest = segment;
        while rest.len() > MAX_NAME_BYTES {
            let mut cut = CHUNK_BYTES;
            while !rest.is_char_boundary(cut) {
                cut -= 1;
            }
            let (head, tail) = rest.split_at(cut);
            names.push(PhysicalName {
                name: format!("{head}{CONTINUATION_MARK}"),
                continuation: true,
            });
            rest = tail;
        }
        names.push(PhysicalName {
            name: rest.to_owned(),
            continuation: false,
        });
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_segments_map_to_themselves() {
        let names = physical_names("a/b c/.config");
        let plain: Vec<&str> = names.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(plain, vec!["a", "b c", ".config"]);
        assert!(names.iter().all(|n| !n.continuation));
    }

    #[test]
    fn long_segment_is_chunked_on_char_boundaries() {
        let segment = "é".repeat(300); // 600 bytes
        let names = physical_names(&segment);
        assert_eq!(names.len(), 3);
        for name in &names {
            assert!(name.name.len() <= MAX_NAME_BYTES);
        }
        let rebuilt: String = names
            .iter()
            .map(|n| {
                if n.continuation {
                    n.name.trim_end_matches(CONTINUATION_MARK).to_owned()
                } else {
                    n.name.clone()
                }
            })
            .collect();
        assert_eq!(rebuilt, segment);
        assert!(names[0].continuation && names[1].continuation && !names[2].continuation);
    }

    #[test]
    fn segment_of_exactly_255_bytes_is_not_chunked() {
        let names = physical_names(&"x".repeat(255));
        assert_eq!(names.len(), 1);
        let names = physical_names(&"x".repeat(256));
        assert_eq!(names.len(), 2);
        assert_eq!(names[0].name.len(), 255);
    }
}
