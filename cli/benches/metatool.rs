//! The MetaTool routing benchmark (issue 47): on tools and queries nobody here wrote, does the routing objective's
//! winner route held-out queries better than the published descriptions, and better than what a user would try
//! instead (one rewrite by the reflector; the best of K rewrites on the training split)?
//!
//! Per group (a catalog suite under `datasets/suites/metatool/`, made by `examples/metatool_import.rs`), through the
//! real `tooltune` binary with the embedded models: the published text scored on the test split; `rewrite` once and
//! `--best-of K`; `optimize --objective routing` with every tool editable; `optimize --objective selection` for the
//! group's first tool (does third-party text inflate?); each compared with paired tests (`eval --against`); and the
//! published text, the best baseline and the routing winner re-scored with the 0.5B agent.
//!
//! ```sh
//! cargo bench --bench metatool                          # every group (hours on two cores)
//! cargo bench --bench metatool -- --group metatool-g01  # one group, in minutes
//! cargo bench --bench metatool -- --groups 3 --max-screened 600 --best-of 4 --out target/metatool   # defaults: 400, 3
//! cargo bench --bench metatool -- --suite datasets/suites/catalog/helpdesk.toml   # any catalog suite
//! ```
//!
//! Figures go to stdout as one table, and every command's JSON to `--out` (default `target/metatool`), so a table
//! can be re-read and checked. Every step is kept there and skipped when run again, so an interrupted bench resumes
//! where it stopped. `TOOLTUNE_BENCH_BIN` runs a saved `tooltune` binary instead of the one cargo built: groups
//! measured in several sittings then come from one build.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

struct Opts {
    groups: Option<usize>,
    only: Vec<String>,
    suites: Vec<PathBuf>,
    max_screened: u64,
    best_of: u32,
    out: PathBuf,
    skip_selection: bool,
    skip_fast: bool,
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        groups: None,
        only: Vec::new(),
        suites: Vec::new(),
        max_screened: 400,
        best_of: 3,
        out: PathBuf::from("target/metatool"),
        skip_selection: false,
        skip_fast: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--groups" => {
                o.groups = Some(
                    value("--groups")?
                        .parse()
                        .map_err(|e| format!("--groups: {e}"))?,
                )
            }
            "--group" => o.only.push(value("--group")?),
            // Any catalog suite instead of the MetaTool groups (the README's hand-written one, say).
            "--suite" => o.suites.push(PathBuf::from(value("--suite")?)),
            "--max-screened" => {
                o.max_screened = value("--max-screened")?
                    .parse()
                    .map_err(|e| format!("--max-screened: {e}"))?
            }
            "--best-of" => {
                o.best_of = value("--best-of")?
                    .parse()
                    .map_err(|e| format!("--best-of: {e}"))?
            }
            "--out" => o.out = PathBuf::from(value("--out")?),
            "--no-selection" => o.skip_selection = true,
            "--no-fast" => o.skip_fast = true,
            // cargo bench passes --bench to every bench target.
            "--bench" => {}
            other => {
                return Err(format!(
                    "unknown argument {other} (see the file's first lines)"
                ));
            }
        }
    }
    Ok(o)
}

/// Runs the tooltune binary; returns its stdout parsed as JSON, and the seconds it took.
fn tooltune(args: &[&str], data: &Path) -> Result<(Value, f64), String> {
    let started = Instant::now();
    // TOOLTUNE_BENCH_BIN: a saved binary, so that groups measured across sessions (and builds) share one.
    let bin = std::env::var_os("TOOLTUNE_BENCH_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_tooltune")),
        PathBuf::from,
    );
    let out = Command::new(bin)
        .args(args)
        .env("TOOLTUNE_DATA_DIR", data)
        .output()
        .map_err(|e| format!("tooltune {}: {e}", args.join(" ")))?;
    let secs = started.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(format!(
            "tooltune {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let v = serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "tooltune {}: not JSON ({e}): {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    Ok((v, secs))
}

/// A step's JSON from an earlier run of the bench when it and the files it made are all there, else the step run
/// now and its JSON saved: a bench stopped half-way goes on where it was (each step is minutes on two cores).
fn cached(
    record: &Path,
    made: &[&Path],
    run: impl FnOnce() -> Result<Value, String>,
) -> Result<Value, String> {
    if made.iter().all(|p| p.exists())
        && let Some(v) = std::fs::read_to_string(record)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
    {
        return Ok(v);
    }
    let v = run()?;
    save(record, &v)?;
    Ok(v)
}

fn save(path: &Path, v: &Value) -> Result<(), String> {
    std::fs::write(path, serde_json::to_string_pretty(v).unwrap_or_default())
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Scores a candidate (an overrides file, or none for the published text) on the test split, against `against`.
fn score(
    suite: &Path,
    overrides: Option<&Path>,
    against: Option<&Path>,
    model: &str,
    out: &Path,
    data: &Path,
) -> Result<Value, String> {
    if let Some(v) = std::fs::read_to_string(out)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
    {
        return Ok(v);
    }
    let suite_s = suite.display().to_string();
    let mut args = vec![
        "eval",
        "--suite",
        &suite_s,
        "--split",
        "test",
        "--model",
        model,
        "--no-store",
        "--json",
    ];
    let o = overrides.map(|p| p.display().to_string());
    if let Some(o) = &o {
        args.extend(["--overrides", o]);
    }
    let a = against.map(|p| p.display().to_string());
    if let Some(a) = &a {
        args.extend(["--against", a]);
    }
    let (v, _) = tooltune(&args, data)?;
    save(out, &v)?;
    Ok(v)
}

/// `v` (an `eval --json` output) compared with the evaluation in `baseline` as `eval --against` would, without
/// evaluating again; saved to `out`.
fn against(v: &Value, baseline: &Path, out: &Path) -> Result<Value, String> {
    use tooltune_evaluator::evaluate::SuiteResult;
    let read = |v: &Value, what: &str| -> Result<SuiteResult, String> {
        serde_json::from_value(v["result"].clone()).map_err(|e| format!("{what}: {e}"))
    };
    let text =
        std::fs::read_to_string(baseline).map_err(|e| format!("{}: {e}", baseline.display()))?;
    let base: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", baseline.display()))?;
    let c = tooltune_evaluator::compare::compare(
        &read(&base, &baseline.display().to_string())?,
        &read(v, "candidate")?,
    )
    .map_err(|e| e.to_string())?;
    let mut out_v = v.clone();
    out_v["comparison"] = serde_json::to_value(c).map_err(|e| e.to_string())?;
    save(out, &out_v)?;
    Ok(out_v)
}

fn routing(v: &Value) -> f64 {
    v["result"]["expected_routing"].as_f64().unwrap_or(f64::NAN)
}

/// "+0.071 (p 0.003)" from an `eval --against` comparison.
fn delta(v: &Value) -> String {
    let r = &v["comparison"]["routing"];
    match (
        r["baseline"].as_f64(),
        r["candidate"].as_f64(),
        r["p_value"].as_f64(),
    ) {
        (Some(b), Some(c), Some(p)) => format!("{:+.3} (p {p:.3})", c - b),
        _ => "-".into(),
    }
}

fn p_value(v: &Value) -> f64 {
    v["comparison"]["routing"]["p_value"]
        .as_f64()
        .unwrap_or(1.0)
}

fn gain(v: &Value) -> f64 {
    let r = &v["comparison"]["routing"];
    r["candidate"].as_f64().unwrap_or(0.0) - r["baseline"].as_f64().unwrap_or(0.0)
}

struct Row {
    group: String,
    published: f64,
    rewrite: f64,
    best_of: f64,
    winner: f64,
    vs_published: String,
    vs_best: String,
    win_gain: f64,
    win_p: f64,
    screens: u64,
    optimize_s: f64,
    selection: String,
    fast: String,
}

fn run_group(suite: &Path, o: &Opts) -> Result<Row, String> {
    let group = suite
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let out = o.out.join(&group);
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let data = out.join("data");
    let s = suite.display().to_string();
    let tools: Vec<String> = {
        let text = std::fs::read_to_string(suite).map_err(|e| format!("{s}: {e}"))?;
        let t: toml::Table = text.parse().map_err(|e| format!("{s}: {e}"))?;
        t["tool"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    eprintln!("{group}: {} tools", tools.len());
    let published = out.join("published.json");
    let p = score(suite, None, None, "local", &published, &data)?;

    // The baselines a user would try instead.
    let one = out.join("rewrite.json");
    cached(&out.join("rewrite-made.json"), &[&one], || {
        tooltune(
            &[
                "rewrite",
                "--suite",
                &s,
                "--export",
                &one.display().to_string(),
                "--json",
            ],
            &data,
        )
        .map(|(v, _)| v)
    })?;
    let one_eval = score(
        suite,
        Some(&one),
        Some(&published),
        "local",
        &out.join("rewrite-eval.json"),
        &data,
    )?;
    let best = out.join("best-of.json");
    let k = o.best_of.to_string();
    cached(&out.join("best-of-made.json"), &[&best], || {
        tooltune(
            &[
                "rewrite",
                "--suite",
                &s,
                "--best-of",
                &k,
                "--export",
                &best.display().to_string(),
                "--json",
            ],
            &data,
        )
        .map(|(v, _)| v)
    })?;
    let best_eval = score(
        suite,
        Some(&best),
        Some(&published),
        "local",
        &out.join("best-of-eval.json"),
        &data,
    )?;
    // The best baseline on the held-out split: what the search is compared with last.
    let best_path = if routing(&best_eval) >= routing(&one_eval) {
        &best
    } else {
        &one
    };
    let best_baseline = out.join("best-baseline-eval.json");
    std::fs::copy(
        if best_path == &best {
            out.join("best-of-eval.json")
        } else {
            out.join("rewrite-eval.json")
        },
        &best_baseline,
    )
    .map_err(|e| format!("{}: {e}", best_baseline.display()))?;

    // The search: every tool editable, routing objective, exact screens only.
    let win = out.join("routing-winner.json");
    let budget = o.max_screened.to_string();
    let mut args = vec![
        "optimize",
        "--suite",
        &s,
        "--objective",
        "routing",
        "--max-screened",
        &budget,
        "--export",
    ];
    let win_s = win.display().to_string();
    args.push(&win_s);
    args.push("--json");
    for t in &tools {
        args.extend(["--tool", t.as_str()]);
    }
    let summary = cached(&out.join("routing-run.json"), &[&win], || {
        tooltune(&args, &data).map(|(v, _)| v)
    })?;
    let optimize_s = summary["wall_s"].as_f64().unwrap_or(f64::NAN);
    let screens = summary["screened"].as_u64().unwrap_or(0);
    let w = score(
        suite,
        Some(&win),
        Some(&published),
        "local",
        &out.join("routing-eval.json"),
        &data,
    )?;
    let w_best = against(&w, &best_baseline, &out.join("routing-vs-best.json"))?;

    // Does third-party text inflate under the selection objective? One tool per group: the first.
    let selection = if o.skip_selection {
        "-".to_string()
    } else {
        let sel = out.join("selection-winner.json");
        let sel_s = sel.display().to_string();
        cached(&out.join("selection-run.json"), &[&sel], || {
            tooltune(
                &[
                    "optimize",
                    "--suite",
                    &s,
                    "--objective",
                    "selection",
                    "--tool",
                    &tools[0],
                    "--max-screened",
                    &budget,
                    "--export",
                    &sel_s,
                    "--json",
                ],
                &data,
            )
            .map(|(v, _)| v)
        })?;
        let e = score(
            suite,
            Some(&sel),
            Some(&published),
            "local",
            &out.join("selection-eval.json"),
            &data,
        )?;
        let c = &e["comparison"];
        format!(
            "off-target {:.3}->{:.3}, routing {}",
            c["off_target_selection"]["baseline"]
                .as_f64()
                .unwrap_or(f64::NAN),
            c["off_target_selection"]["candidate"]
                .as_f64()
                .unwrap_or(f64::NAN),
            delta(&e)
        )
    };

    // Does a text tuned with the 1.5B help the 0.5B?
    let fast = if o.skip_fast {
        "-".to_string()
    } else {
        let pf = out.join("published-fast.json");
        score(suite, None, None, "local:fast", &pf, &data)?;
        let bf = score(
            suite,
            Some(best_path),
            Some(&pf),
            "local:fast",
            &out.join("best-baseline-fast.json"),
            &data,
        )?;
        let wf = score(
            suite,
            Some(&win),
            Some(&pf),
            "local:fast",
            &out.join("routing-fast.json"),
            &data,
        )?;
        format!(
            "{:.3}: baseline {}, winner {}",
            routing(&wf) - gain(&wf),
            delta(&bf),
            delta(&wf)
        )
    };
    Ok(Row {
        group,
        published: routing(&p),
        rewrite: routing(&one_eval),
        best_of: routing(&best_eval),
        winner: routing(&w),
        vs_published: delta(&w),
        vs_best: delta(&w_best),
        win_gain: gain(&w),
        win_p: p_value(&w),
        screens,
        optimize_s,
        selection,
        fast,
    })
}

fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/suites/metatool");
    let mut suites: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(d) => d
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect(),
        Err(e) => {
            eprintln!("error: {}: {e}", dir.display());
            std::process::exit(2);
        }
    };
    suites.sort();
    if !o.suites.is_empty() {
        // cargo runs a bench in its package's folder: a relative path is tried there, then from the workspace root.
        suites = o
            .suites
            .iter()
            .map(|p| {
                if p.exists() {
                    p.clone()
                } else {
                    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
                }
            })
            .collect();
    }
    if !o.only.is_empty() {
        suites.retain(|p| {
            p.file_stem()
                .is_some_and(|s| o.only.iter().any(|g| g.as_str() == s.to_string_lossy()))
        });
    }
    if let Some(n) = o.groups {
        suites.truncate(n);
    }
    let started = Instant::now();
    let mut rows = Vec::new();
    for s in &suites {
        match run_group(s, &o) {
            Ok(r) => rows.push(r),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
    println!(
        "MetaTool routing, held-out (test split), exact mean probability of the right first move; agent and \
         reflector Qwen2.5-Coder 1.5B; budget {} screens, best-of-{}",
        o.max_screened, o.best_of
    );
    println!(
        "| group | published | rewrite | best-of-{} | routing winner | winner vs published | winner vs best baseline | \
         screens | optimize s | selection winner (first tool) | 0.5B agent: published, gains |",
        o.best_of
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {} | {} | {} | {:.0} | {} | {} |",
            r.group,
            r.published,
            r.rewrite,
            r.best_of,
            r.winner,
            r.vs_published,
            r.vs_best,
            r.screens,
            r.optimize_s,
            r.selection,
            r.fast
        );
    }
    let mut gains: Vec<f64> = rows.iter().map(|r| r.win_gain).collect();
    gains.sort_by(f64::total_cmp);
    let median = if gains.is_empty() {
        f64::NAN
    } else if gains.len() % 2 == 1 {
        gains[gains.len() / 2]
    } else {
        (gains[gains.len() / 2 - 1] + gains[gains.len() / 2]) / 2.0
    };
    let significant = rows
        .iter()
        .filter(|r| r.win_p < 0.05 && r.win_gain > 0.0)
        .count();
    let worse = rows
        .iter()
        .filter(|r| r.win_p < 0.05 && r.win_gain < 0.0)
        .count();
    println!(
        "\n{} groups: winner better than published with p < 0.05 in {significant}, significantly worse in {worse}; \
         median gain {median:+.3}; whole bench {:.0} s",
        rows.len(),
        started.elapsed().as_secs_f64()
    );
}
