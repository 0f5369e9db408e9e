//! How many of the reflector's replies give a usable description, with and without the reply's format held as
//! a grammar (issue 48): the first prompts of stored reflections replayed on the embedded model, greedy, each
//! once as a free reply (the format asked for in words only, the old token limit) and once under the grammar,
//! every reply parsed by the same parser the search uses.
//!
//! ```sh
//! sqlite3 DATA/traces.sqlite "select proposal from run_proposals" > proposals.jsonl
//! cargo bench -p tooltune-reflection --bench proposal_yield -- proposals.jsonl [--limit N] [--model default|fast]
//! ```
//!
//! Each line of the file is a stored proposal or a list of them (a reflection of k proposals); prompts that
//! repeat (the sampled proposals of one reflection share theirs) are replayed once; `--limit N` keeps N spread
//! evenly over the file. The parser is given the
//! tool's current description as the prompt states it, and no echo markers (the prompt's data are not stored):
//! echoes of the runs' data go undetected in both arms alike.

use std::time::Instant;
use tooltune_llm::local::{LocalModel, LocalOptions};
use tooltune_llm::{ChatModel, ChatRequest, Message, ModelChoice};
use tooltune_reflection::{ParseContext, Proposal, ReflectionOptions, parse_reply, reply_format};

struct Prompt {
    tool: String,
    system: String,
    user: String,
    current: String,
}

fn prompts(path: &str, limit: usize) -> Vec<Prompt> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{path}:{}: {e}", n + 1));
        let list = if v.is_array() {
            v
        } else {
            serde_json::Value::Array(vec![v])
        };
        let list: Vec<Proposal> = serde_json::from_value(list)
            .unwrap_or_else(|e| panic!("{path}:{}: not a stored proposal: {e}", n + 1));
        for p in list {
            let Some(first) = p.attempts.first() else {
                continue;
            };
            if !seen.insert(first.prompt.clone()) {
                continue;
            }
            let marker = format!("Current description of {}: «", p.tool);
            let current = first
                .prompt
                .split_once(&marker)
                .and_then(|(_, rest)| rest.split_once('»'))
                .map(|(d, _)| d.to_string())
                .unwrap_or_default();
            out.push(Prompt {
                tool: p.tool.clone(),
                system: p.system.clone(),
                user: first.prompt.clone(),
                current,
            });
        }
    }
    // Spread over the whole file (its reflections come run after run), evenly and deterministically.
    if limit < out.len() {
        let n = out.len();
        let keep: std::collections::BTreeSet<usize> = (0..limit).map(|i| i * n / limit).collect();
        out = out
            .into_iter()
            .enumerate()
            .filter(|(i, _)| keep.contains(i))
            .map(|(_, p)| p)
            .collect();
    }
    out
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let mut file = None;
    let mut limit = usize::MAX;
    let mut which = ModelChoice::Default;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--limit" => limit = args.next().and_then(|v| v.parse().ok()).expect("--limit N"),
            "--model" => {
                which = match args.next().as_deref() {
                    Some("fast") => ModelChoice::Fast,
                    _ => ModelChoice::Default,
                }
            }
            _ => file = Some(a),
        }
    }
    let Some(file) = file else {
        eprintln!("usage: proposal_yield PROPOSALS.jsonl [--limit N] [--model default|fast]");
        std::process::exit(2);
    };
    let prompts = prompts(&file, limit);
    let opts = ReflectionOptions::default();
    let model = LocalModel::load(LocalOptions::for_model(which))
        .await
        .expect("model loads");
    println!(
        "{} distinct reflection prompts from {file}; {}",
        prompts.len(),
        model.id()
    );
    for grammar in [false, true] {
        let reqs: Vec<ChatRequest> = prompts
            .iter()
            .map(|p| {
                let mut r = ChatRequest::text(vec![
                    Message::system(p.system.clone()),
                    Message::user(p.user.clone()),
                ]);
                r.max_tokens = opts.max_tokens;
                if grammar {
                    let f = reply_format(false, opts.max_description_chars);
                    r.max_tokens = r.max_tokens.max(f.max_tokens());
                    r.format = Some(f);
                }
                r
            })
            .collect();
        let t0 = Instant::now();
        let replies = model.chat_many(&reqs).await;
        let secs = t0.elapsed().as_secs_f64();
        let mut usable = 0;
        let mut tokens = 0u64;
        let mut why: std::collections::BTreeMap<String, u32> = Default::default();
        for (p, r) in prompts.iter().zip(&replies) {
            let r = r.as_ref().expect("the model answers");
            tokens += r.usage.completion_tokens;
            let parsed = parse_reply(
                r.content.as_deref().unwrap_or(""),
                &ParseContext {
                    tool: &p.tool,
                    current_description: &p.current,
                    echo_markers: &[],
                    max_chars: opts.max_description_chars,
                },
            );
            match parsed.description {
                Ok(_) => usable += 1,
                Err(e) => *why.entry(e.to_string()).or_default() += 1,
            }
        }
        let n = prompts.len().max(1);
        println!(
            "{}: {usable} of {} usable ({:.0}%), {tokens} tokens generated, {secs:.0} s ({:.1} s per usable reply)",
            if grammar {
                "under the grammar"
            } else {
                "free (format in words)"
            },
            prompts.len(),
            100.0 * usable as f64 / n as f64,
            secs / f64::from(usable.max(1)),
        );
        for (w, c) in why {
            println!("  {c} x {w}");
        }
    }
}
