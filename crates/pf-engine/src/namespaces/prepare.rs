//! Prepare: Plugin activation, conflicts, tool slots, model roles, the requirements notice.

use std::sync::Arc;

use pf_harness::{
    tool_path_under, ActivationContext, ActivePlugin, Harness, ModelInfo, ThinkingSupport, ToolSpec,
};
use pf_syntax::Prompt;

use crate::ctx::BoundTool;

pub(crate) struct Prepared {
    pub bound: Vec<BoundTool>,
    pub active: Vec<Arc<dyn ActivePlugin>>,
}

pub(crate) const NOTICE_HEADER: &str = "the environment cannot satisfy this prompt:";

/// Run prepare. `Err` carries the requirements notice and the Plugins to shut down.
pub(crate) async fn prepare(
    prompt: &Prompt,
    harness: &Harness,
    model: Option<&ModelInfo>,
    store_dir: &std::path::Path,
    cancel: &pf_harness::CancellationToken,
) -> Result<Prepared, (String, Vec<Arc<dyn ActivePlugin>>)> {
    let decls = &prompt.frontmatter.plugins;
    let mut missing: Vec<String> = Vec::new();
    let mut conflicts: Vec<String> = Vec::new();
    let mut role_lines: Vec<String> = Vec::new();

    // Conflicts between declared Plugins the Harness has, either way round.
    let mut in_conflict = vec![false; decls.len()];
    for i in 0..decls.len() {
        for j in (i + 1)..decls.len() {
            let (Some(a), Some(b)) = (harness.get(&decls[i].id), harness.get(&decls[j].id)) else {
                continue;
            };
            if a.conflicts().iter().any(|c| *c == decls[j].id)
                || b.conflicts().iter().any(|c| *c == decls[i].id)
            {
                conflicts.push(format!(
                    "- conflicting Plugins: {} and {} cannot be activated together; declare one or the other",
                    decls[i].id, decls[j].id
                ));
                in_conflict[i] = true;
                in_conflict[j] = true;
            }
        }
    }

    // Activation: every Plugin starts at once (an MCP server can take seconds
    // to start), and the outcomes are taken in declaration order, so the
    // catalog, the warnings and the notice read as if one followed another.
    // A Plugin the Harness lacks is an outcome too, taken in its place.
    let mut starting: Vec<futures::future::LocalBoxFuture<'_, _>> = Vec::new();
    for (i, d) in decls.iter().enumerate() {
        if in_conflict[i] {
            continue;
        }
        let Some(plugin) = harness.get(&d.id) else {
            starting.push(Box::pin(async move { (d, None) }));
            continue;
        };
        let ctx = ActivationContext {
            store_dir: store_dir.to_path_buf(),
            cancel: cancel.clone(),
            services: harness.services.clone(),
            config: d.config.clone(),
        };
        starting.push(Box::pin(
            async move { (d, Some(plugin.activate(ctx).await)) },
        ));
    }
    let mut active: Vec<(String, Arc<dyn ActivePlugin>)> = Vec::new();
    for (d, activated) in futures::future::join_all(starting).await {
        match activated {
            None => {
                if d.optional {
                    tracing::warn!(plugin = %d.id, "optional Plugin is not registered with the Harness; skipped");
                } else {
                    tracing::warn!(plugin = %d.id, "required Plugin is not registered with the Harness");
                    push_once(&mut missing, &d.id);
                }
            }
            Some(Ok(a)) => active.push((d.id.clone(), a)),
            Some(Err(why)) => {
                if d.optional {
                    tracing::warn!(plugin = %d.id, "optional Plugin failed to activate and was skipped: {why}");
                } else {
                    tracing::warn!(plugin = %d.id, "required Plugin failed to activate: {why}");
                    push_once(&mut missing, &d.id);
                }
            }
        }
    }

    // The run's tool catalog: activated Plugins in declaration order, each in its own order.
    let mut catalog: Vec<(ToolSpec, Arc<dyn ActivePlugin>)> = Vec::new();
    let mut contributed: Vec<String> = Vec::new();
    for (id, a) in &active {
        for t in a.tools() {
            if tool_path_under(&t.path, id) {
                push_once(&mut contributed, id);
                catalog.push((t, Arc::clone(a)));
            } else {
                tracing::warn!(plugin = %id, tool = %t.path, "tool path does not sit under its Plugin's id; not admitted");
            }
        }
    }

    // Tool slots, checked in sorted alias order.
    let mut slots: Vec<&pf_syntax::ToolSlot> = prompt.frontmatter.tools.iter().collect();
    slots.sort_by(|a, b| a.alias.cmp(&b.alias));
    let mut bound_by_alias: Vec<(String, BoundTool)> = Vec::new();
    for slot in slots {
        let pid = slot.plugin_id().to_string();
        if !contributed.contains(&pid) {
            push_once(&mut missing, &pid);
            continue;
        }
        match catalog.iter().find(|(t, _)| t.path == slot.path) {
            Some((t, p)) => {
                if t.structured && !t.trusted {
                    tracing::warn!(
                        alias = %slot.alias,
                        "tool slot `{}` binds {}, a structured tool (it declares an outputSchema) of the untrusted Plugin {pid}: \
                         its output reaches Lua wrapped as untrusted text, so tools.call fails with \"returned invalid JSON\"; \
                         structured output needs a trusted Plugin (`trusted = true` for {pid} in the host file)",
                        slot.alias,
                        t.path
                    );
                }
                bound_by_alias.push((
                    slot.alias.clone(),
                    BoundTool {
                        alias: slot.alias.clone(),
                        path: t.path.clone(),
                        description: t.description.clone(),
                        parameters: Arc::new(t.parameters.clone()),
                        structured: t.structured,
                        trusted: t.trusted,
                        plugin: Arc::clone(p),
                    },
                ));
            }
            None => {
                tracing::warn!(alias = %slot.alias, path = %slot.path, "tool slot stays unbound: its Plugin contributed no tool at that path")
            }
        }
    }
    // Keep bound slots in declaration order.
    let mut bound = Vec::new();
    for slot in &prompt.frontmatter.tools {
        if let Some(pos) = bound_by_alias.iter().position(|(a, _)| *a == slot.alias) {
            bound.push(bound_by_alias.remove(pos).1);
        }
    }

    // Model roles, in sorted label order.
    if let Some(info) = model {
        let mut roles: Vec<&pf_syntax::RoleDecl> = prompt.frontmatter.models.iter().collect();
        roles.sort_by(|a, b| a.label.cmp(&b.label));
        for r in roles {
            if let Some(min) = r.min_context {
                if info.context < min {
                    role_lines.push(format!(
                        "- role '{}': requires a context of at least {} tokens; the current model provides {}",
                        r.label, min, info.context
                    ));
                }
            }
            for k in &r.keywords {
                let unmet = match k.as_str() {
                    "thinking" => info.thinking == ThinkingSupport::Never,
                    "no-thinking" => info.thinking == ThinkingSupport::Always,
                    _ => false,
                };
                if unmet {
                    let cap = match info.thinking {
                        ThinkingSupport::Never => "Never",
                        ThinkingSupport::Always => "Always",
                        ThinkingSupport::Switchable => "Switchable",
                    };
                    role_lines.push(format!(
                        "- role '{}': requires '{}'; the current model's thinking capability is {}",
                        r.label, k, cap
                    ));
                }
            }
        }
    }

    let actives: Vec<Arc<dyn ActivePlugin>> = active.into_iter().map(|(_, a)| a).collect();
    if missing.is_empty() && conflicts.is_empty() && role_lines.is_empty() {
        return Ok(Prepared {
            bound,
            active: actives,
        });
    }
    let mut notice = String::from(NOTICE_HEADER);
    for m in &missing {
        notice.push_str(&format!("\n- missing required Plugin: {m}"));
    }
    for c in conflicts.iter().chain(role_lines.iter()) {
        notice.push('\n');
        notice.push_str(c);
    }
    Err((notice, actives))
}

fn push_once(v: &mut Vec<String>, s: &str) {
    if !v.iter().any(|x| x == s) {
        v.push(s.to_string());
    }
}
