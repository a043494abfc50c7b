//! The Lua globals a prompt reaches (`var`, `tasks`, `tools`, `store`, `fanout`,
//! `call`/`jump`, `models`, prose substitution), the checks and proofs behind
//! them, and `prepare`, which binds a prompt's tools before its run.

pub(crate) mod fanout;
pub(crate) mod flow;
pub(crate) mod models;
pub(crate) mod models_check;
pub(crate) mod prepare;
pub(crate) mod quiet;
pub(crate) mod storeapi;
pub(crate) mod subst;
pub(crate) mod tasks;
pub(crate) mod tools;
pub(crate) mod var;
