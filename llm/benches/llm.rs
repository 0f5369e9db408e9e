//! Benchmark of the embedded models: prompt and generation throughput, exact-scoring latency, and the
//! effect of prompt-prefix KV reuse on scoring a suite of tasks that share one tool list.
//!
//! Run: `cargo bench -p tooltune-llm --bench llm` (release build). `TOOLTUNE_BENCH_TASKS` sets the suite
//! size (default 40); `TOOLTUNE_BENCH_MODELS` picks models (default `fast,default`).

use serde_json::json;
use std::time::Instant;
use tooltune_core::ToolSpec;
use tooltune_llm::local::{LocalModel, LocalOptions};
use tooltune_llm::{ChatModel, ChatRequest, Message, ModelChoice, ToolChoice};

fn tool(name: &str, description: &str, arg: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema:
            json!({"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]})
                .into(),
    }
}

fn tools() -> Vec<ToolSpec> {
    vec![
        tool(
            "read_file",
            "Read a text file from the workspace and return its contents.",
            "path",
        ),
        tool(
            "write_file",
            "Write text to a file in the workspace, replacing its contents.",
            "path",
        ),
        tool(
            "calculator",
            "Evaluate an arithmetic expression and return the number.",
            "expression",
        ),
        tool(
            "web_search",
            "Search the public web and return the top results with snippets.",
            "query",
        ),
        tool(
            "search_docs",
            "Search the company's internal documentation.",
            "query",
        ),
        tool("send_email", "Send an email to a colleague.", "to"),
        tool(
            "get_weather",
            "Current weather and forecast for a city.",
            "city",
        ),
        tool(
            "run_sql",
            "Run a read-only SQL query against the analytics database.",
            "query",
        ),
    ]
}

const SYSTEM: &str = "You are a careful assistant working in a company's engineering workspace. Use the \
tools when they help, and call exactly one tool at a time.";

fn tasks(n: usize) -> Vec<String> {
    let files = [
        "notes.txt",
        "todo.md",
        "budget.csv",
        "report.txt",
        "log.txt",
    ];
    let cities = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo"];
    let topics = [
        "retry policy of the billing SDK",
        "on-call runbook for the queue",
        "sync_orders endpoint",
    ];
    (0..n)
        .map(|i| match i % 6 {
            0 => format!("Read {} and sum the numbers in it.", files[i % files.len()]),
            1 => format!(
                "What will the weather be in {} tomorrow?",
                cities[i % cities.len()]
            ),
            2 => format!(
                "What does our documentation say about the {}?",
                topics[i % topics.len()]
            ),
            3 => format!(
                "How many orders were placed in week {} of this year?",
                i + 1
            ),
            4 => format!("Compute {} * {} + 17.", 37 + i, 91 + i),
            _ => format!("Who won the latest football World Cup? (question {i})"),
        })
        .collect()
}

fn request(task: &str, tools: Vec<ToolSpec>) -> ChatRequest {
    ChatRequest::new(vec![Message::system(SYSTEM), Message::user(task)], tools)
}

async fn bench(which: ModelChoice, n_tasks: usize) {
    let t = Instant::now();
    let m = LocalModel::load(LocalOptions::for_model(which))
        .await
        .expect("model loads");
    println!("\n== {} ==", m.id());
    println!("load: {:.2} s", t.elapsed().as_secs_f64());
    let names: Vec<String> = tools().iter().map(|t| t.name.clone()).collect();
    let all = tools();

    // Prompt throughput: a cold prompt, one generated token.
    m.set_prefix_reuse(false).await.expect("reuse off");
    let s0 = m.stats();
    let mut r = request(&tasks(1)[0], all.clone());
    r.max_tokens = 1;
    r.tool_choice = ToolChoice::None;
    r.messages[0] = Message::system(format!(
        "{SYSTEM}\n\nTools:\n{}",
        serde_json::to_string_pretty(&all).expect("json")
    ));
    m.chat(&r).await.expect("chat");
    let d = m.stats().since(&s0);
    println!(
        "prompt processing: {} tokens in {:.2} s = {:.1} tok/s",
        d.prompt_tokens_decoded,
        d.prefill_seconds,
        d.prompt_tokens_decoded as f64 / d.prefill_seconds
    );

    // Free generation.
    let s0 = m.stats();
    let mut r = ChatRequest::text(vec![Message::user(
        "Write a short paragraph about the history of the bicycle.",
    )]);
    r.max_tokens = 64;
    m.chat(&r).await.expect("chat");
    let d = m.stats().since(&s0);
    println!(
        "generation: {} tokens in {:.2} s = {:.1} tok/s",
        d.generated_tokens,
        d.generate_seconds,
        d.generated_tokens as f64 / d.generate_seconds
    );

    // Grammar-constrained tool call.
    let s0 = m.stats();
    let mut r = request("Read notes.txt and sum the numbers in it.", all.clone());
    r.tool_choice = ToolChoice::Required;
    let resp = m.chat(&r).await.expect("chat");
    let d = m.stats().since(&s0);
    println!(
        "grammar-constrained tool call: {} tokens in {:.2} s = {:.1} tok/s -> {:?}",
        d.generated_tokens,
        d.generate_seconds,
        d.generated_tokens as f64 / d.generate_seconds,
        resp.tool_calls.first().map(|c| (&c.name, &c.arguments))
    );

    // Scoring latency, cold (whole prompt decoded) and warm (shared prefix cached).
    for k in [2usize, 8] {
        let cands = &names[..k];
        m.set_prefix_reuse(false).await.expect("reuse off");
        let r = request("Read notes.txt and sum the numbers in it.", all.clone());
        let t = Instant::now();
        let p = m
            .score_tool_choice(&r, cands)
            .await
            .expect("score")
            .expect("exact");
        let cold = t.elapsed().as_secs_f64();
        m.set_prefix_reuse(true).await.expect("reuse on");
        m.score_tool_choice(&request("Compute 2 + 2.", all.clone()), cands)
            .await
            .expect("warm-up")
            .expect("exact");
        let t = Instant::now();
        m.score_tool_choice(&r, cands)
            .await
            .expect("score")
            .expect("exact");
        let warm = t.elapsed().as_secs_f64();
        let best = p.iter().copied().fold(0.0, f64::max);
        println!(
            "scoring {k} candidates: cold {cold:.2} s, prefix cached {warm:.2} s (max p {best:.3})"
        );
    }

    // A suite of tasks sharing one tool list, all 8 tools as candidates.
    let suite: Vec<ChatRequest> = tasks(n_tasks)
        .iter()
        .map(|t| request(t, all.clone()))
        .collect();
    let mut results = Vec::new();
    for reuse in [false, true] {
        m.set_prefix_reuse(reuse).await.expect("switch");
        let s0 = m.stats();
        let t = Instant::now();
        let out = m.score_many(&suite, &names).await;
        let secs = t.elapsed().as_secs_f64();
        let d = m.stats().since(&s0);
        let probs: Vec<Vec<f64>> = out
            .into_iter()
            .map(|r| r.expect("score").expect("exact"))
            .collect();
        println!(
            "score {n_tasks} tasks x 8 candidates, prefix reuse {}: {secs:.1} s ({} prompt tokens decoded, {} reused)",
            if reuse { "on " } else { "off" },
            d.prompt_tokens_decoded,
            d.prompt_tokens_reused
        );
        results.push((secs, probs));
    }
    let (off, on) = (&results[0], &results[1]);
    println!(
        "speed-up from prefix reuse: {:.1}x; scores identical: {}",
        off.0 / on.0,
        off.1 == on.1
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let n_tasks = std::env::var("TOOLTUNE_BENCH_TASKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let models = std::env::var("TOOLTUNE_BENCH_MODELS").unwrap_or_else(|_| "fast,default".into());
    for m in models.split(',') {
        let which = ModelChoice::parse(m.trim())
            .expect("TOOLTUNE_BENCH_MODELS lists `fast` and/or `default`");
        bench(which, n_tasks).await;
    }
}
