//! Store claims (guide ch. 09 "Sharing the store across calls and tasks").
//!
//! Every store call takes a claim on its path for the identity of the chain that
//! made it: writers (`write`, `append`, `str_replace`, `delete`) a write claim,
//! readers (`read`, `read_numbered`, `exists`) a read claim, and `glob` a read
//! claim on every file it matched. A claim lasts until its identity is released,
//! which happens when the chain that owns the identity ends.
//!
//! Which identity a call uses: the walk has its own (`ExecId(0)`); a called chain
//! uses its caller's, so the two never conflict and the end of the call releases
//! nothing; the H1 pass has one of its own (`ExecId(h1)`), released when the pass
//! ends, so the walk starts with fresh claims. Each fanout arm (and, later, each
//! task) gets the identity of its own chain id, released when its chain ends.
//!
//! The conflict rules: a write claim conflicts with any claim another identity
//! holds on the path; a read claim conflicts only with another identity's write
//! claim; two reads never conflict; an identity never conflicts with itself.
//! Every claim in the registry belongs to a live chain, because claims are
//! released when their chain ends.

use std::collections::BTreeMap;
use std::fmt;

use pf_store::messages;

/// How a store call uses a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClaimKind {
    Read,
    Write,
}

impl ClaimKind {
    /// `read` or `write`, as the conflict message names it.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimKind::Read => "read",
            ClaimKind::Write => "write",
        }
    }
}

/// The identity a chain claims under, printed as `ExecId(...)`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimIdentity(String);

impl ClaimIdentity {
    /// The identity of the chain with this id (`0` for the walk, `0.1` for a child chain).
    pub fn of_chain(chain_id: &str) -> Self {
        ClaimIdentity(chain_id.to_string())
    }

    /// The H1 pass's own identity: it cannot be any chain's id, so it never
    /// coincides with a task or arm started during the pass.
    pub fn h1_pass() -> Self {
        ClaimIdentity("h1".to_string())
    }
}

impl fmt::Display for ClaimIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ExecId({})", self.0)
    }
}

/// Two live identities claiming one path in conflicting ways.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The claim that lost.
    pub claim: ClaimKind,
    /// The store path as written.
    pub path: String,
    pub identity: ClaimIdentity,
    /// The claim already held, and by whom.
    pub other_claim: ClaimKind,
    pub other_identity: ClaimIdentity,
}

impl Conflict {
    /// The run-ending message for a conflict in block code (run error kind `Determinism`).
    pub fn determinism_message(&self) -> String {
        messages::determinism_violation(
            self.claim.as_str(),
            &self.path,
            &self.identity.to_string(),
            self.other_claim.as_str(),
            &self.other_identity.to_string(),
        )
    }

    /// The message raised at the call while the shared library loads.
    pub fn race_message(&self) -> String {
        messages::write_write_race(&self.path)
    }
}

/// The run's claims: for each path, the strongest claim each live identity holds.
#[derive(Debug, Default)]
pub struct ClaimRegistry {
    by_path: BTreeMap<String, BTreeMap<ClaimIdentity, ClaimKind>>,
}

impl ClaimRegistry {
    /// The first claim another identity holds on `path` that `kind` conflicts
    /// with, in identity order (so the report does not depend on claim order).
    fn conflict_on(
        &self,
        identity: &ClaimIdentity,
        path: &str,
        kind: ClaimKind,
    ) -> Option<Conflict> {
        let holders = self.by_path.get(path)?;
        holders
            .iter()
            .find(|(other, held)| {
                *other != identity && (kind == ClaimKind::Write || **held == ClaimKind::Write)
            })
            .map(|(other, held)| Conflict {
                claim: kind,
                path: path.to_string(),
                identity: identity.clone(),
                other_claim: *held,
                other_identity: other.clone(),
            })
    }

    /// Take a claim on `path`, or say which live claim it conflicts with (then
    /// nothing is recorded). A read after the identity's own write keeps the write.
    #[cfg(test)]
    pub fn claim(
        &mut self,
        identity: &ClaimIdentity,
        path: &str,
        kind: ClaimKind,
    ) -> Result<(), Conflict> {
        self.claim_all(identity, &[path], kind)
    }

    /// Take one kind of claim on every path, all or none: the first conflict
    /// (in `paths` order) refuses the whole call.
    pub fn claim_all(
        &mut self,
        identity: &ClaimIdentity,
        paths: &[&str],
        kind: ClaimKind,
    ) -> Result<(), Conflict> {
        if let Some(conflict) = paths
            .iter()
            .find_map(|path| self.conflict_on(identity, path, kind))
        {
            return Err(conflict);
        }
        for path in paths {
            let held = self
                .by_path
                .entry((*path).to_string())
                .or_default()
                .entry(identity.clone())
                .or_insert(kind);
            *held = (*held).max(kind);
        }
        Ok(())
    }

    /// Release every claim `identity` holds: its chain has ended.
    pub fn release(&mut self, identity: &ClaimIdentity) {
        self.by_path.retain(|_, holders| {
            holders.remove(identity);
            !holders.is_empty()
        });
    }

    /// The claim `identity` holds on `path`, if any.
    #[cfg(test)]
    pub fn held(&self, identity: &ClaimIdentity, path: &str) -> Option<ClaimKind> {
        self.by_path.get(path)?.get(identity).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk() -> ClaimIdentity {
        ClaimIdentity::of_chain("0")
    }
    fn task() -> ClaimIdentity {
        ClaimIdentity::of_chain("0.1")
    }

    #[test]
    fn identities_print_as_exec_ids() {
        assert_eq!(walk().to_string(), "ExecId(0)");
        assert_eq!(task().to_string(), "ExecId(0.1)");
        assert_eq!(ClaimIdentity::h1_pass().to_string(), "ExecId(h1)");
        assert_ne!(ClaimIdentity::h1_pass(), ClaimIdentity::of_chain("0.0"));
    }

    #[test]
    fn a_write_conflicts_with_another_identitys_read() {
        let mut claims = ClaimRegistry::default();
        assert_eq!(claims.claim(&task(), "a.md", ClaimKind::Read), Ok(()));
        let conflict = claims.claim(&walk(), "a.md", ClaimKind::Write);
        assert_eq!(
            conflict,
            Err(Conflict {
                claim: ClaimKind::Write,
                path: "a.md".into(),
                identity: walk(),
                other_claim: ClaimKind::Read,
                other_identity: task(),
            })
        );
        // The losing claim was not recorded.
        assert_eq!(claims.held(&walk(), "a.md"), None);
    }

    #[test]
    fn a_write_conflicts_with_another_identitys_write() {
        let mut claims = ClaimRegistry::default();
        assert_eq!(claims.claim(&task(), "a.md", ClaimKind::Write), Ok(()));
        let conflict = claims.claim(&walk(), "a.md", ClaimKind::Write);
        assert_eq!(
            conflict.map_err(|c| c.determinism_message()),
            Err("store determinism violation: write on /_promptforge/store/a.md by ExecId(0) conflicts with a write claim by ExecId(0.1)".to_string())
        );
    }

    #[test]
    fn a_read_conflicts_only_with_another_identitys_write() {
        let mut claims = ClaimRegistry::default();
        assert_eq!(claims.claim(&task(), "w.md", ClaimKind::Write), Ok(()));
        assert_eq!(claims.claim(&task(), "r.md", ClaimKind::Read), Ok(()));
        assert_eq!(
            claims
                .claim(&walk(), "w.md", ClaimKind::Read)
                .map_err(|c| c.determinism_message()),
            Err("store determinism violation: read on /_promptforge/store/w.md by ExecId(0) conflicts with a write claim by ExecId(0.1)".to_string())
        );
        assert_eq!(claims.claim(&walk(), "r.md", ClaimKind::Read), Ok(()));
        assert_eq!(claims.held(&walk(), "r.md"), Some(ClaimKind::Read));
    }

    #[test]
    fn an_identity_never_conflicts_with_itself() {
        let mut claims = ClaimRegistry::default();
        for kind in [
            ClaimKind::Read,
            ClaimKind::Write,
            ClaimKind::Read,
            ClaimKind::Write,
        ] {
            assert_eq!(claims.claim(&walk(), "mine.md", kind), Ok(()));
        }
        // A read after a write keeps the stronger claim.
        assert_eq!(claims.held(&walk(), "mine.md"), Some(ClaimKind::Write));
    }

    #[test]
    fn a_read_upgraded_to_a_write_conflicts_with_other_readers() {
        let mut claims = ClaimRegistry::default();
        assert_eq!(claims.claim(&walk(), "n.txt", ClaimKind::Read), Ok(()));
        assert_eq!(claims.claim(&task(), "n.txt", ClaimKind::Read), Ok(()));
        assert!(claims.claim(&walk(), "n.txt", ClaimKind::Write).is_err());
        assert_eq!(claims.held(&walk(), "n.txt"), Some(ClaimKind::Read));
    }

    #[test]
    fn releasing_an_identity_frees_its_paths() {
        let mut claims = ClaimRegistry::default();
        let h1 = ClaimIdentity::h1_pass();
        assert_eq!(claims.claim(&h1, "cfg.txt", ClaimKind::Write), Ok(()));
        assert!(claims.claim(&walk(), "cfg.txt", ClaimKind::Write).is_err());
        claims.release(&h1);
        assert_eq!(claims.held(&h1, "cfg.txt"), None);
        assert_eq!(claims.claim(&walk(), "cfg.txt", ClaimKind::Write), Ok(()));
    }

    #[test]
    fn releasing_one_identity_keeps_the_others() {
        let mut claims = ClaimRegistry::default();
        assert_eq!(claims.claim(&walk(), "s.md", ClaimKind::Read), Ok(()));
        assert_eq!(claims.claim(&task(), "s.md", ClaimKind::Read), Ok(()));
        claims.release(&walk());
        assert_eq!(claims.held(&task(), "s.md"), Some(ClaimKind::Read));
        let third = ClaimIdentity::of_chain("0.2");
        assert!(claims.claim(&third, "s.md", ClaimKind::Write).is_err());
    }

    #[test]
    fn claiming_many_paths_is_all_or_none() {
        let mut claims = ClaimRegistry::default();
        assert_eq!(claims.claim(&task(), "arm-2.md", ClaimKind::Write), Ok(()));
        let conflict = claims.claim_all(&walk(), &["arm-1.md", "arm-2.md"], ClaimKind::Read);
        assert_eq!(
            conflict.map_err(|c| c.race_message()),
            Err("write-write race on arm-2.md: another live identity holds a claim on it".into())
        );
        assert_eq!(claims.held(&walk(), "arm-1.md"), None);
        claims.release(&task());
        assert_eq!(
            claims.claim_all(&walk(), &["arm-1.md", "arm-2.md"], ClaimKind::Read),
            Ok(())
        );
        assert_eq!(claims.held(&walk(), "arm-2.md"), Some(ClaimKind::Read));
    }

    #[test]
    fn the_reported_holder_does_not_depend_on_claim_order() {
        let second = ClaimIdentity::of_chain("0.2");
        let mut one = ClaimRegistry::default();
        let mut other = ClaimRegistry::default();
        for (reg, order) in [
            (&mut one, [task(), second.clone()]),
            (&mut other, [second.clone(), task()]),
        ] {
            for id in order {
                assert_eq!(reg.claim(&id, "p", ClaimKind::Read), Ok(()));
            }
        }
        let a = one.claim(&walk(), "p", ClaimKind::Write);
        let b = other.claim(&walk(), "p", ClaimKind::Write);
        assert_eq!(a, b);
        assert_eq!(a.map_err(|c| c.other_identity), Err(task()));
    }
}
