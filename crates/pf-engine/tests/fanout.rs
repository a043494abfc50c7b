//! `fanout` concurrency and cancellation (guide ch. 14 "Concurrency" and "Arm
//! failures"), driven by a model whose replies take real time, so arms really
//! wait on host work at once and finish out of collection order.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use pf_engine::Outcome;
use support::{run, run_cancelled, CancelWhen, SlowModel};

const WORKER: &str = "### Worker\n\n```lua\nreturn models.infer(item)\n```\n";

#[test]
fn arms_waiting_on_slow_host_work_all_complete_in_collection_order() {
    let model = Arc::new(SlowModel::default());
    // `@4`: no round answers before all four have started, so arms run one
    // after another would never end (the runner's hang guard fails the test).
    // Later members answer sooner, so the arms finish in reverse order.
    let body = format!(
        "## Main\n\n```lua\nlocal r = fanout('### Worker', {{'a@4:400', 'b@4:300', 'c@4:200', 'd@4:100'}})\nreturn table.concat(r, ',')\n```\n\n{WORKER}"
    );
    let outcome = run("Fanout", &body, Arc::clone(&model), None);
    assert_eq!(outcome, Outcome::Completed("a!,b!,c!,d!".into()));
    assert_eq!(model.most_in_flight.load(Ordering::SeqCst), 4);
    assert_eq!(
        model.prompts(),
        ["a@4:400", "b@4:300", "c@4:200", "d@4:100"]
    );
}

#[test]
fn no_more_than_eight_arms_are_live_and_the_cap_refills() {
    let model = Arc::new(SlowModel::default());
    // The first arm answers only once all ten rounds have started (`@10`):
    // the ninth and tenth must start beside it, as soon as any other arm
    // finishes. A cap that refilled only when the first arm ended would never
    // end (the runner's hang guard fails the test).
    let body = format!(
        "## Main\n\n```lua\nlocal items = {{'m1@10:0'}}\nfor i = 2, 10 do items[i] = 'm' .. i .. ':50' end\nlocal r = fanout('### Worker', items)\nreturn #r .. ' ' .. r[1].text .. ' ' .. r[10].text\n```\n\n{WORKER}"
    );
    let outcome = run("Fanout", &body, Arc::clone(&model), None);
    assert_eq!(outcome, Outcome::Completed("10 m1! m10!".into()));
    assert_eq!(model.most_in_flight.load(Ordering::SeqCst), 8);
    let prompts = model.prompts();
    assert_eq!(prompts.len(), 10);
    assert_eq!(prompts.first().map(String::as_str), Some("m1@10:0"));
}

#[test]
fn a_host_cancel_ends_the_run_while_arms_wait() {
    let model = Arc::new(SlowModel::default());
    // Prompts without a delay are never answered.
    let body = format!(
        "## Main\n\n```lua\nlocal ok = pcall(fanout, '### Worker', {{'x', 'y', 'z'}})\nreturn 'kept going'\n```\n\n{WORKER}"
    );
    // Only the host cancel can end the run: the outcome proves it came.
    // (Once every arm waits: a fixed delay raced slow builds, issue 44.)
    let outcome = run_cancelled("Fanout", &body, Arc::clone(&model), CancelWhen::Prompts(3));
    assert_eq!(outcome, Outcome::Cancelled);
    assert_eq!(model.prompts(), ["x", "y", "z"]);
    assert_eq!(model.in_flight.load(Ordering::SeqCst), 0);
}

#[test]
fn a_failing_arm_cancels_its_waiting_siblings_and_frees_their_claims() {
    let model = Arc::new(SlowModel::default());
    // `hang` claims a path, then waits on a reply that never comes; `boom`
    // fails after a short wait. The caller goes on at once and may write the
    // hanging arm's path: the cancelled arm's claims went with it.
    let body = "## Main\n\n```lua\nlocal ok, err = pcall(fanout, '### Worker', {'hang', 'boom'})\nstore.write('taken.txt', 'caller')\nreturn tostring(ok) .. ' ' .. err.kind .. ' ' .. store.read('taken.txt')\n```\n\n### Worker\n\n```lua\nif item == 'hang' then\n  store.write('taken.txt', 'arm')\n  return models.infer('hang')\nend\nmodels.infer('boom:50')\nerror({})\n```\n";
    // `hang` never answers by itself: completing at all proves the cancel.
    let outcome = run("Fanout", body, Arc::clone(&model), None);
    assert_eq!(outcome, Outcome::Completed("false lua caller".into()));
    assert_eq!(model.in_flight.load(Ordering::SeqCst), 0);
}
