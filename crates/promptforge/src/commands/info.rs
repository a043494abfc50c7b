//! `promptforge info FILE [--json]`: what a prompt declares, without running
//! it: name, description, args, roles, Plugins, tool slots, input/output
//! files, and the section tree.

use std::fmt::Write as _;
use std::process::ExitCode;

use pf_host::HostError;

use pf_syntax::{Prompt, Section};
use serde_json::{json, Value};

use crate::cli::{InfoArgs, OutputFormat};

pub fn run(args: InfoArgs) -> Result<ExitCode, HostError> {
    let file = args.file.as_path();
    let source = pf_host::prompt_files::read_prompt(file)?;
    let diagnostics = pf_syntax::diagnose(&source);
    let name = file.display().to_string();
    let prompt = match pf_syntax::parse(&source) {
        Ok(p) => p,
        Err(_) => {
            let first = diagnostics.first_error();
            if args.output.format() == OutputFormat::Json {
                let error = first.map(|d| d.to_json(&name)).unwrap_or(Value::Null);
                crate::ui::print_stdout(&format!(
                    "{}\n",
                    json!({"outcome": "failed", "error": error})
                ));
            } else if let Some(d) = first {
                let color = crate::ui::stderr_color();
                eprintln!("{}", pf_syntax::render_diagnostic(&name, &source, d, color));
            }
            return Ok(ExitCode::from(crate::EXIT_FAILED));
        }
    };
    let value = describe(&prompt, &name);
    if args.output.format() == OutputFormat::Json {
        crate::ui::print_stdout(&format!("{value}\n"));
    } else {
        crate::ui::print_stdout(&text(&prompt, &name));
    }
    Ok(ExitCode::SUCCESS)
}

pub use pf_host::prompt_files::arg_type_name;

/// The `--json` object.
pub fn describe(prompt: &Prompt, file: &str) -> Value {
    let fm = &prompt.frontmatter;
    let args = fm.args.as_ref().map(|decls| {
        decls
            .iter()
            .map(|a| {
                json!({
                    "name": a.name,
                    "type": arg_type_name(a.ty),
                    "optional": a.optional,
                    "default": a.default,
                    "description": a.description,
                })
            })
            .collect::<Vec<_>>()
    });
    json!({
        "file": file,
        "name": fm.name,
        "description": fm.description,
        "title": prompt.title,
        "args": args,
        "roles": fm.models.iter().map(|r| json!({
            "label": r.label,
            "keywords": r.keywords,
            "min_context": r.min_context,
            "description": r.description,
        })).collect::<Vec<_>>(),
        "plugins": fm.plugins.iter().map(|p| json!({"id": p.id, "optional": p.optional})).collect::<Vec<_>>(),
        "tools": fm.tools.iter().map(|t| json!({"alias": t.alias, "path": t.path})).collect::<Vec<_>>(),
        "input": fm.input.as_ref().map(|d| json!({"path": d.path, "description": d.description})),
        "output": fm.output.as_ref().map(|d| json!({"path": d.path, "description": d.description})),
        "sections": prompt.sections.iter().map(section_json).collect::<Vec<_>>(),
    })
}

fn section_json(s: &Section) -> Value {
    json!({
        "heading": pf_syntax::heading_of(s),
        "name": s.name,
        "level": s.level,
        "line": s.line,
        "list": s.list_items.is_some(),
        "children": s.children.iter().map(section_json).collect::<Vec<_>>(),
    })
}

/// The text form, for a person.
pub fn text(prompt: &Prompt, file: &str) -> String {
    let fm = &prompt.frontmatter;
    let mut out = String::new();
    let _ = writeln!(out, "{} ({file})", fm.name);
    if !fm.description.is_empty() {
        let _ = writeln!(out, "  {}", fm.description);
    }
    let _ = writeln!(out, "\nargs:");
    match &fm.args {
        None => {
            let _ = writeln!(
                out,
                "  (none declared: ARGS is free text, `args` and `argv.prose` in Lua)"
            );
        }
        Some(decls) if decls.is_empty() => {
            let _ = writeln!(out, "  (none)");
        }
        Some(decls) => {
            let width = decls.iter().map(|a| a.name.len()).max().unwrap_or(0);
            for a in decls {
                let mut facts = vec![arg_type_name(a.ty).to_string()];
                facts.push(if a.optional { "optional" } else { "required" }.to_string());
                if let Some(default) = &a.default {
                    facts.push(format!("default {default}"));
                }
                let _ = write!(out, "  {:width$}  {}", a.name, facts.join(", "));
                if let Some(d) = &a.description {
                    let _ = write!(out, "  — {d}");
                }
                let _ = writeln!(out);
            }
        }
    }
    if !fm.models.is_empty() {
        let _ = writeln!(out, "\nroles:");
        for r in &fm.models {
            let mut facts = r.keywords.clone();
            if let Some(min) = r.min_context {
                facts.push(format!("min_context {min}"));
            }
            let _ = write!(out, "  {}", r.label);
            if !facts.is_empty() {
                let _ = write!(out, "  [{}]", facts.join(", "));
            }
            if let Some(d) = &r.description {
                let _ = write!(out, "  — {d}");
            }
            let _ = writeln!(out);
        }
    }
    if !fm.plugins.is_empty() {
        let _ = writeln!(out, "\nplugins:");
        for p in &fm.plugins {
            let optional = if p.optional { " (optional)" } else { "" };
            let _ = writeln!(out, "  {}{optional}", p.id);
        }
    }
    if !fm.tools.is_empty() {
        let _ = writeln!(out, "\ntools:");
        for t in &fm.tools {
            let _ = writeln!(out, "  {} -> {}", t.alias, t.path);
        }
    }
    for (key, decl) in [("input", &fm.input), ("output", &fm.output)] {
        if let Some(d) = decl {
            let _ = writeln!(out, "\n{key}: {}  — {}", d.path, d.description);
        }
    }
    let _ = writeln!(out, "\nsections:");
    let _ = writeln!(out, "  # {}", prompt.title);
    fn tree(out: &mut String, sections: &[Section], depth: usize) {
        for s in sections {
            let list = if s.list_items.is_some() {
                "  (list)"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  {}{}{list}  line {}",
                "  ".repeat(depth),
                pf_syntax::heading_of(s),
                s.line
            );
            tree(out, &s.children, depth + 1);
        }
    }
    tree(&mut out, &prompt.sections, 1);
    out
}
