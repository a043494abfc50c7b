//! Tasks (guide ch. 15) with a model whose replies take real time, so tasks
//! really wait on host work beside their owner and end out of spawn order.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use pf_engine::Outcome;
use support::{run, SlowModel};

/// A task section that asks the model for its own argument string.
const JOB: &str = "### Job\n\n```lua\nreturn models.infer(args)\n```\n";

#[test]
fn tasks_wait_on_host_work_at_once_and_the_first_to_end_is_delivered_first() {
    let model = Arc::new(SlowModel::default());
    // `@2`: neither round answers before both have started, so run one after
    // the other they never would (the runner's hang guard fails the test).
    let body = format!(
        "## Main\n\n```lua\nlocal slow = tasks.spawn('### Job', {{ input = 'slow@2:400' }})\nlocal quick = tasks.spawn('### Job', {{ input = 'quick@2:100' }})\nlocal first, ok, r = tasks.when_any({{ slow, quick }})\nlocal _, _, r2 = tasks.when_any({{ slow }})\nreturn first.task .. ' ' .. r .. ' ' .. r2\n```\n\n{JOB}"
    );
    let outcome = run("Tasks", &body, Arc::clone(&model), None);
    assert_eq!(outcome, Outcome::Completed("0.1 quick! slow!".into()));
    assert_eq!(model.most_in_flight.load(Ordering::SeqCst), 2);
    assert_eq!(model.prompts(), ["slow@2:400", "quick@2:100"]);
}

#[test]
fn a_cancelled_task_drops_its_model_round_and_the_owner_goes_on() {
    let model = Arc::new(SlowModel::default());
    // `never` is never answered: only the cancel ends that task.
    let body = format!(
        "## Main\n\n```lua\nlocal t = tasks.spawn('### Job', {{ input = 'never' }})\nlocal quick = tasks.spawn('### Job', {{ input = 'q:50' }})\ntasks.when_any({{ quick }})\ntasks.cancel(t)\nlocal _, ok, err = tasks.when_any({{ t }})\nreturn tostring(ok) .. ' ' .. err.kind .. ' ' .. #tasks.pending()\n```\n\n{JOB}"
    );
    let outcome = run("Tasks", &body, Arc::clone(&model), None);
    assert_eq!(outcome, Outcome::Completed("false cancelled 0".into()));
    assert_eq!(model.in_flight.load(Ordering::SeqCst), 0);
}

#[test]
fn a_host_cancel_ends_the_run_while_the_owner_waits_on_a_task() {
    let model = Arc::new(SlowModel::default());
    let body = format!(
        "## Main\n\n```lua\nlocal t = tasks.spawn('### Job', {{ input = 'never' }})\npcall(tasks.when_all, {{ t }})\nreturn 'kept going'\n```\n\n{JOB}"
    );
    // `never` is never answered: only the host cancel can end the run.
    let outcome = run(
        "Tasks",
        &body,
        Arc::clone(&model),
        Some(Duration::from_millis(150)),
    );
    assert_eq!(outcome, Outcome::Cancelled);
    assert_eq!(model.in_flight.load(Ordering::SeqCst), 0);
}

#[test]
fn a_timed_wait_returns_nil_and_leaves_the_task_running() {
    let model = Arc::new(SlowModel::default());
    let body = format!(
        "## Main\n\n```lua\nlocal t = tasks.spawn('### Job', {{ input = 'late:300' }})\nlocal first = tasks.when_any({{ t }}, {{ timeout = 0.05 }})\nlocal s = tasks.status(t).state\nlocal _, _, r = tasks.when_any({{ t }})\nreturn tostring(first) .. ' ' .. s .. ' ' .. r\n```\n\n{JOB}"
    );
    let outcome = run("Tasks", &body, Arc::clone(&model), None);
    assert_eq!(outcome, Outcome::Completed("nil running late!".into()));
}
