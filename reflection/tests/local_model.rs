//! Reflection with the real embedded 1.5B model on a contractor-like case: `search_docs` (seed description
//! "Search the company's internal documentation.") lost two internal questions to `web_search`, whose
//! results carried look-alike public facts, and was wrongly taken for a weather question.
//! Both goals are asked with the default options, and each must yield a parsed description within its attempts
//! (the first greedy, retries seeded, so a run is repeatable on one machine); the replies are printed (run with
//! `--nocapture` to read them).

use serde_json::{Value, json};
use tooltune_core::Trajectory;
use tooltune_llm::{BackendSpec, build};
use tooltune_reflection::{
    Goal, Proposal, ReflectionOptions, ReflectionRequest, ReflectiveExample, reflect,
};

const SEED: &str = "Search the company's internal documentation.";

/// One run: the agent made one call, `(tool, query, result)`, then answered.
fn example(
    task: &str,
    owner: &str,
    call: (&str, &str, &str),
    answer: &str,
    success: bool,
    feedback: &str,
) -> ReflectiveExample {
    let trajectory: Trajectory = serde_json::from_value(json!({
        "task": task,
        "tools": [
            {"name": "search_docs", "description": SEED,
             "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}},
            {"name": "web_search", "description": "Search the web.",
             "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}
        ],
        "steps": [
            {"type": "model", "tool_calls": [{"id": "call_1", "name": call.0, "arguments": {"query": call.1}}]},
            {"type": "tool_result", "call_id": "call_1", "name": call.0, "content": call.2},
            {"type": "model", "content": answer}
        ],
        "final_answer": answer,
    }))
    .expect("fixture trajectory parses");
    trajectory.validate().expect("fixture trajectory is valid");
    ReflectiveExample {
        task: task.into(),
        owner: Some(owner.into()),
        trajectory,
        success,
        feedback: feedback.into(),
    }
}

fn examples() -> Vec<ReflectiveExample> {
    vec![
        example(
            "How many times does our internal billing SDK retry a failed request?",
            "search_docs",
            (
                "web_search",
                "billing SDK retry failed request",
                "## Technology news and public documentation\nPayFlow, the open-source billing SDK, retries failed requests 3 times by default; its maintainers recommend keeping retries low for card payments.",
            ),
            "The billing SDK retries a failed request 3 times.",
            false,
            "the answer should contain `7`",
        ),
        example(
            "What is the rate limit of our sync_orders endpoint?",
            "search_docs",
            (
                "web_search",
                "sync_orders endpoint rate limit",
                "## Technology news and public documentation\nShopline's public storefront API documents its sync_orders endpoint with a rate limit of 60 requests per minute and batches of up to 100 orders.",
            ),
            "The sync_orders endpoint allows 60 requests per minute.",
            false,
            "the answer should contain `120`",
        ),
        example(
            "What is the weather forecast for Porto on Saturday?",
            "web_search",
            (
                "search_docs",
                "Porto weather Saturday",
                "No results for \"Porto weather Saturday\".",
            ),
            "I could not find a forecast for Porto.",
            false,
            "the answer should contain `24`",
        ),
        example(
            "Who won the Coastal Cup 2026 final?",
            "web_search",
            (
                "web_search",
                "Coastal Cup 2026 final winner",
                "## Sports results\nCoastal Cup 2026 final: Riverton Rovers beat Lakeside United 3-1 in front of 41,200 spectators.",
            ),
            "Riverton Rovers won the Coastal Cup 2026 final.",
            true,
            "the answer contains `Riverton Rovers`",
        ),
    ]
}

fn request(goal: Goal) -> ReflectionRequest {
    ReflectionRequest {
        target: None,
        tool: "search_docs".into(),
        current_description: SEED.into(),
        input_schema: json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
        goal,
        examples: examples(),
        // Five attempts rather than the default three: which reply the 1.5B writes first is a close call that the
        // build's kernels decide (on the x86-64-v4 build of issue 45 the task-success goal took more than three
        // here); the test is about reflecting at all, within a bounded number of attempts.
        options: ReflectionOptions {
            max_attempts: 5,
            ..ReflectionOptions::default()
        },
    }
}

fn report(p: &Proposal, secs: f64) {
    eprintln!(
        "=== goal {:?}: {} attempt(s), {} prompt + {} completion tokens, {secs:.1} s, shown runs {:?}",
        p.goal,
        p.attempts.len(),
        p.tokens.prompt_tokens,
        p.tokens.completion_tokens,
        p.shown
    );
    for (i, a) in p.attempts.iter().enumerate() {
        eprintln!("--- attempt {} reply ({:?}):\n{}", i + 1, a.error, a.reply);
    }
    eprintln!(
        "--- diagnosis: {:?}\n--- description: {:?}",
        p.diagnosis, p.description
    );
}

#[tokio::test]
async fn the_local_model_reflects_under_both_goals() {
    let spec = BackendSpec::parse("local", None).expect("spec parses");
    let model = build(&spec)
        .await
        .expect("the local model loads (fetched if missing)");
    let first = request(Goal::TaskSuccess).render().expect("renders");
    eprintln!("=== prompt (task success):\n{}\n", first.user);

    for goal in [Goal::TaskSuccess, Goal::Selection] {
        let req = request(goal);
        let t0 = std::time::Instant::now();
        let p = reflect(model.as_ref(), &req)
            .await
            .expect("the reflector answers");
        report(&p, t0.elapsed().as_secs_f64());

        // Whatever the outcome, every attempt is recorded with the model's real reply and token counts.
        assert!(!p.attempts.is_empty());
        assert!(p.attempts.len() <= req.options.max_attempts);
        for a in &p.attempts {
            assert!(!a.reply.trim().is_empty(), "empty reply recorded: {a:?}");
            assert!(
                a.usage.prompt_tokens > 0 && a.usage.completion_tokens > 0,
                "{a:?}"
            );
        }
        assert!(p.attempts[0].prompt.contains(match goal {
            Goal::TaskSuccess => "Goal: the agent should solve as many tasks as possible.",
            Goal::Selection => "Goal: the agent should choose `search_docs` as often as possible.",
            Goal::Routing => "Goal: for every task the agent should first call the right tool",
        }));
        // Reflecting under a goal means a new description comes out of it, within the attempts allowed.
        let Some(d) = &p.description else {
            panic!(
                "goal {goal:?}: no description parsed in {} attempt(s): {:?}",
                p.attempts.len(),
                p.attempts.iter().map(|a| &a.error).collect::<Vec<_>>()
            );
        };
        // Accepted on the last attempt, and only then.
        let last = p.attempts.last().expect("non-empty");
        assert_eq!(last.error, None);
        assert!(
            p.attempts[..p.attempts.len() - 1]
                .iter()
                .all(|a| a.error.is_some())
        );
        assert_ne!(d.trim(), SEED);
        assert!(d.chars().count() <= req.options.max_description_chars);
        assert!(!d.contains("<<<") && !d.contains(">>>"));
        let stored = serde_json::to_value(&p).expect("serialises");
        assert_eq!(
            stored["template_version"],
            Value::from(tooltune_reflection::TEMPLATE_VERSION)
        );
    }
}
