//! The run entry: prepare a parsed prompt, walk it (`walk.rs`), report how it ended.

mod walk;

use std::rc::Rc;
use std::sync::Arc;

use pf_syntax::{Prompt, VersionProblem};
use rand::{RngCore, SeedableRng};

use crate::claims::ClaimIdentity;
use crate::ctx::{RunCtx, RunFixed};
use crate::error::{RunError, RunErrorKind};
use crate::events::{Event, EventLog, Provenance, RunEvent, RunObserver, MAIN_TASK};
use crate::memory::MemoryAccount;
use crate::setup::{Outcome, RunReport, RunSetup};
use crate::text::format_when;

/// The version rules (`pf_syntax::check_version`) as a run error: `Parse`
/// for a file that is not a prompt, `Version` for a major this build does not run.
pub fn check_version(prompt: &Prompt) -> Result<(), RunError> {
    pf_syntax::check_version(prompt).map_err(|problem| {
        let kind = match problem {
            VersionProblem::NotAPrompt => RunErrorKind::Parse,
            VersionProblem::Unsupported(_) => RunErrorKind::Version,
        };
        RunError::new(kind, problem.message())
    })
}

/// The run's execution name and untrusted-envelope nonce, both derived from the seed.
pub fn seeded_names(seed: u64) -> (String, String) {
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(seed);
    let mut exec = [0u8; 8];
    rng.fill_bytes(&mut exec);
    let mut nonce = [0u8; 16];
    rng.fill_bytes(&mut nonce);
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    (format!("run-{}", hex(&exec)), hex(&nonce))
}

const DEFAULT_ROUND_CAP: u32 = 24;
const DEFAULT_LOG_EVENTS: u32 = 1024;
const DEFAULT_MEMORY: usize = 64 * 1024 * 1024;

/// Prepare and run a prompt. Must be polled on a current-thread runtime (Lua is not `Send`).
pub async fn run(prompt: Arc<Prompt>, setup: RunSetup) -> RunReport {
    run_beside(prompt, setup, Vec::new()).await
}

/// TEST-ONLY support: not part of the Engine's interface, and no Host uses it.
///
/// [`run_beside_live_chain`](testing::run_beside_live_chain) runs a prompt as if another chain were live for the whole run, holding the
/// given store claims, so tests can exercise every conflict rule end to end.
#[doc(hidden)]
pub mod testing {
    use std::sync::Arc;

    use pf_syntax::Prompt;

    use crate::run::run_beside;
    use crate::setup::{RunReport, RunSetup};

    /// A Lua state with the sandbox's string and table guards over the standard
    /// libraries (no engine, no cancel), for benchmarks against the bare library.
    pub fn guarded_library_lua() -> mlua::Result<mlua::Lua> {
        crate::vm::sandbox_guards::library_lua()
    }

    pub use crate::claims::ClaimKind;

    /// A store claim held for the whole run by a live chain that is not the
    /// run's own: `ExecId({chain_id})` holds `kind` on `path` (as written).
    #[derive(Debug, Clone)]
    pub struct ForeignClaim {
        pub chain_id: String,
        pub path: String,
        pub kind: ClaimKind,
    }

    /// [`run`](fn@crate::run) with `claims` already held by another live chain.
    pub async fn run_beside_live_chain(
        prompt: Arc<Prompt>,
        setup: RunSetup,
        claims: Vec<ForeignClaim>,
    ) -> RunReport {
        run_beside(prompt, setup, claims).await
    }
}

async fn run_beside(
    prompt: Arc<Prompt>,
    setup: RunSetup,
    foreign_claims: Vec<testing::ForeignClaim>,
) -> RunReport {
    let (execution, nonce) = seeded_names(setup.seed);
    let title = prompt.title.clone();
    let mut log = EventLog::new(setup.observer.clone());
    // The standard runner logs the parse ahead of the run (guide ch. 16 "Parse
    // and compile events"); the prompt reached us parsed, so it is reported here.
    let gate = check_version(&prompt);
    report_parse(
        &mut log,
        &execution,
        &prompt,
        !matches!(&gate, Err(e) if e.kind == RunErrorKind::Parse),
    );
    let failed_early = |log: &mut EventLog, error: RunError, started: bool| {
        if started {
            log.record(&execution, MAIN_TASK, &title, Event::RunFailed);
        }
        RunReport {
            outcome: Outcome::Failed(error),
            execution: execution.clone(),
            checkpoints: Vec::new(),
        }
    };
    if let Err(e) = gate {
        return failed_early(&mut log, e, false);
    }
    log.record(&execution, MAIN_TASK, &title, Event::RunStarted);
    // A store that fails as the run starts fails the run (kind `Store`), rather
    // than letting it run against a throwaway store.
    let store = match pf_store::Store::open(&setup.store_dir) {
        Ok(store) => store,
        Err(e) => {
            tracing::error!("the store cannot be opened: {e}");
            let error = RunError::new(
                RunErrorKind::Store,
                pf_store::messages::STORE_OPERATION_FAILED,
            );
            return failed_early(&mut log, error, true);
        }
    };
    let info = setup.model.as_ref().map(|m| m.info());
    let prepared = crate::namespaces::prepare::prepare(
        &prompt,
        &setup.harness,
        info.as_ref(),
        &setup.store_dir,
        &setup.cancel,
    )
    .await;
    let (bound, active) = match prepared {
        Ok(p) => (p.bound, p.active),
        Err((notice, active)) => {
            for a in active {
                a.shutdown().await;
            }
            let error = RunError::new(RunErrorKind::RequirementsUnmet, notice);
            let mut report = failed_early(&mut log, error, true);
            // A Ctrl-C while a required Plugin was starting stopped its activation:
            // the run was cancelled, its requirements were not found unmet.
            if setup.cancel.is_cancelled() {
                report.outcome = Outcome::Cancelled;
            }
            return report;
        }
    };
    let argv = crate::ctx::args_value(&prompt, &setup.args);
    let run_ctx = Rc::new(RunCtx::new(
        RunFixed {
            prompt: Arc::clone(&prompt),
            args: setup.args.clone(),
            argv,
            execution: execution.clone(),
            when: format_when(setup.start_ms),
            nonce,
            cancel: setup.cancel.clone(),
            services: setup.harness.services.clone(),
            ui: setup.ui.clone(),
            store_dir: setup.store_dir.clone(),
            store,
            bound,
            model: setup.model.clone(),
            catalog: setup.catalog.clone(),
            roles: prompt.frontmatter.models.clone(),
            max_rounds: prompt
                .frontmatter
                .max_tool_iterations
                .unwrap_or(DEFAULT_ROUND_CAP),
            section_count: prompt.sections.len(),
            log_event_quota: DEFAULT_LOG_EVENTS,
            memory: MemoryAccount::new(setup.limits.memory_budget, DEFAULT_MEMORY),
            observer: setup.observer.clone(),
            capture: setup.capture,
        },
        log,
        walk::walk_boxed,
    ));
    for claim in foreign_claims {
        let identity = ClaimIdentity::of_chain(&claim.chain_id);
        if let Err(conflict) = run_ctx.claim_all(&identity, &[claim.path.as_str()], claim.kind) {
            tracing::warn!("test claims conflict among themselves: {conflict:?}");
        }
    }
    // The main walk, then every live task, each time the run is polled: a task
    // runs only while the chains before it are parked.
    let mut main = std::pin::pin!(walk::run_main(Rc::clone(&run_ctx)));
    let outcome = std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(outcome) = std::future::Future::poll(main.as_mut(), cx) {
            return std::task::Poll::Ready(outcome);
        }
        crate::namespaces::tasks::drive(&run_ctx, cx);
        std::task::Poll::Pending
    })
    .await;
    crate::namespaces::tasks::end_run(&run_ctx);
    // The first outcome wins: a failure that ended the run on the spot (set only
    // while no cancel had landed), else a cancel that landed before the end.
    let record = run_ctx.finish();
    let outcome = match (record.fatal, outcome) {
        (Some(error), _) => Outcome::Failed(error),
        (None, Outcome::Failed(_) | Outcome::Completed(_)) if setup.cancel.is_cancelled() => {
            Outcome::Cancelled
        }
        (None, o) => o,
    };
    // The closing event comes after every task's terminal event; a cancelled
    // run closes with `run_failed` too (there is no run-cancelled kind).
    let closing = match outcome {
        Outcome::Completed(_) => Event::RunSucceeded,
        _ => Event::RunFailed,
    };
    run_ctx.report(MAIN_TASK, &title, closing);
    for a in active {
        a.shutdown().await;
    }
    RunReport {
        outcome,
        execution,
        checkpoints: record.checkpoints,
    }
}

/// The parse events of a parsed prompt, on the main walk's count: `parse_started`,
/// one compilation pair per Lua block in file order (under the H1 title for the
/// H1 body, shared library included, else the section's heading), then
/// `parse_succeeded`, or `parse_failed` when the file is not a prompt.
fn report_parse(log: &mut EventLog, execution: &str, prompt: &Prompt, parsed: bool) {
    fn section_blocks<'p>(sections: &'p [pf_syntax::Section], out: &mut Vec<(u32, &'p str)>) {
        for s in sections {
            for b in &s.blocks {
                if let pf_syntax::Block::Lua(lua) = b {
                    out.push((lua.first_line, &s.name));
                }
            }
            section_blocks(&s.children, out);
        }
    }
    let mut blocks: Vec<(u32, &str)> = Vec::new();
    if let Some(shared) = &prompt.shared {
        blocks.push((shared.first_line, &prompt.title));
    }
    for b in &prompt.h1_blocks {
        if let pf_syntax::Block::Lua(lua) = b {
            blocks.push((lua.first_line, &prompt.title));
        }
    }
    section_blocks(&prompt.sections, &mut blocks);
    blocks.sort_by_key(|(line, _)| *line);
    let mut report = |section: &str, kind| {
        log.record(execution, MAIN_TASK, section, kind);
    };
    report(PARSE_SECTION, Event::ParseStarted);
    for (_, section) in blocks {
        report(section, Event::LuaCompilationStarted);
        report(section, Event::LuaCompilationSucceeded);
    }
    let closing = if parsed {
        Event::ParseSucceeded
    } else {
        Event::ParseFailed
    };
    report(PARSE_SECTION, closing);
}

/// The `section` of parse events (guide ch. 16 "The section label").
const PARSE_SECTION: &str = "Prompt";

/// What the standard runner logs for a file whose parse failed, so a Host's
/// run log shows it: `parse_started` then `parse_failed`, on the main walk's
/// count, under `Prompt`. The file never runs, so no prompt reads them.
pub fn report_parse_failure(observer: &dyn RunObserver, execution: &str) {
    for (seq, event) in [(0, Event::ParseStarted), (1, Event::ParseFailed)] {
        let event = RunEvent {
            event,
            section: PARSE_SECTION.to_string(),
            provenance: Provenance {
                task: MAIN_TASK.to_string(),
                seq,
            },
        };
        observer.event(execution, &event);
    }
}
