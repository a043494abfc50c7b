//! Failure injection for the atomic-write tests. Compiled to nothing outside
//! this crate's unit tests.

/// A point in the atomic write where a test can make the I/O fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum FaultPoint {
    /// After half the contents reached the temporary file.
    MidWrite,
    /// After the temporary file is complete and synced, before the rename.
    BeforeRename,
}

#[cfg(test)]
thread_local! {
    static ARMED: std::cell::Cell<Option<FaultPoint>> = const { std::cell::Cell::new(None) };
}

/// Makes the next pass through `point` on this thread fail once.
#[cfg(test)]
pub(crate) fn arm(point: FaultPoint) {
    ARMED.with(|armed| armed.set(Some(point)));
}

#[cfg(test)]
pub(crate) fn hit(point: FaultPoint) -> std::io::Result<()> {
    ARMED.with(|armed| {
        if armed.get() == Some(point) {
            armed.set(None);
            Err(std::io::Error::other(format!(
                "injected failure at {point:?}"
            )))
        } else {
            Ok(())
        }
    })
}

#[cfg(not(test))]
#[inline(always)]
pub(crate) fn hit(_point: FaultPoint) -> std::io::Result<()> {
    Ok(())
}
