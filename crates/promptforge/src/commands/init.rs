//! `promptforge init NAME`: a prompt that runs, a host file with a scripted
//! model so it runs offline, its replies, and a test file. Never overwrites
//! a file unless `--force`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use pf_host::HostError;

use crate::cli::InitArgs;

pub fn run(args: InitArgs) -> Result<ExitCode, HostError> {
    let stem = match args.name.file_name().and_then(|n| n.to_str()) {
        Some(s) if pf_syntax::is_valid_name(s) || valid_file_stem(s) => s.to_string(),
        Some(s) if s.ends_with(".md") && valid_file_stem(&s[..s.len() - 3]) => {
            let bare = args.name.with_file_name(&s[..s.len() - 3]);
            return Err(HostError::Usage(format!(
                "init: give the NAME without `.md` (init writes NAME.md and its companions): \
                 promptforge init {}",
                bare.display()
            )));
        }
        _ => {
            return Err(HostError::Usage(format!(
                "init: {} is not a usable prompt name (letters, digits, `-`, `_`)",
                args.name.display()
            )))
        }
    };
    let dir = args
        .name
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let files = scaffold(&stem);
    for (name, _) in &files {
        let path = dir.join(name);
        if path.exists() && !args.force {
            return Err(HostError::Usage(format!(
                "init: {} exists (use --force to overwrite)",
                path.display()
            )));
        }
    }
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return Err(HostError::Usage(format!(
            "init: cannot create {}: {e}",
            dir.display()
        )));
    }
    for (name, text) in &files {
        let path = dir.join(name);
        if let Err(e) = std::fs::write(&path, text) {
            return Err(HostError::Usage(format!(
                "init: cannot write {}: {e}",
                path.display()
            )));
        }
        crate::ui::print_stdout(&format!("wrote {}\n", path.display()));
    }
    crate::ui::print_stdout(&format!(
        "try: promptforge run {} 'a first request' --host {}\n",
        dir.join(format!("{stem}.md")).display(),
        dir.join(format!("{stem}.host.toml")).display()
    ));
    Ok(ExitCode::SUCCESS)
}

fn valid_file_stem(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The files `init` writes, by name.
pub fn scaffold(stem: &str) -> Vec<(String, String)> {
    // The instruction is the Answer section's prose: `prose` in a block is
    // its own section's prose, so editing the instruction changes the request.
    let prompt = format!(
        "---\nname: {stem}\ndescription: Answers a request in one short paragraph\npromptforge: 0\nmodels:\n  writer:\n    description: writes the answer\n---\n\n# {title}\n\n## Answer\n\nAnswer the request below in one short paragraph.\n\n```lua\nmodels.use('writer')\nreturn models.infer(prose .. '\\n\\nRequest: ' .. args)\n```\n",
        title = title_of(stem)
    );
    let host = format!(
        "# A scripted model, so the prompt runs offline. For a real model use e.g.\n# [model]\n# provider = \"openai\"\n# base_url = \"http://localhost:11434/v1\"\n# model = \"qwen2.5:7b\"\n[model]\nprovider = \"script\"\nreplies = \"{stem}.replies.json\"\n"
    );
    let replies = "[\"Here is a short answer to your request.\"]\n".to_string();
    // The `promptforge test` format (docs/testing.md): the replies are
    // scripted in the case, so the test needs no host file.
    let test = format!(
        "# Tests for {stem}.md: run with `promptforge test {stem}.test.yaml`.\ncases:\n  - name: answers in one paragraph\n    args: a first request\n    replies:\n      - Here is a short answer to your request.\n    expect:\n      outcome: completed\n      result: Here is a short answer to your request.\n      # What the model was sent: the section's instruction, then the request.\n      offered:\n        - request: 0\n          messages:\n            contains: [Answer the request below, \"Request: a first request\"]\n      events:\n        model_turn_completed: 1\n"
    );
    vec![
        (format!("{stem}.md"), prompt),
        (format!("{stem}.host.toml"), host),
        (format!("{stem}.replies.json"), replies),
        (format!("{stem}.test.yaml"), test),
    ]
}

fn title_of(stem: &str) -> String {
    let words: Vec<String> = stem
        .split(['-', '_'])
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut chars = w.chars();
            match chars.next() {
                Some(first) => first.to_uppercase().collect::<String>() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect();
    words.join(" ")
}
