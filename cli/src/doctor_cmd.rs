//! `tooltune doctor`: what this CPU offers, which of llama.cpp's kernels this binary was built with, the embedded
//! models with their hashes, and a self-test of the engine. The first thing to run when something looks wrong.
//!
//! The self-test runs in a child process (this binary, `doctor --self-test-child`), so that an engine that crashes
//! on this CPU (as ggml's AMX kernel did, issue 45) is reported with its signal instead of ending the check.

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tooltune_llm::local::check::{
    self, BuildFacts, CpuFacts, Finding, MOVES, ProbeResult, Severity, TOLERANCE,
};
use tooltune_llm::local::{LocalModel, LocalOptions};
use tooltune_llm::{ModelChoice, default_models_dir, file_sha256};

/// `tooltune doctor`
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The model the self-test runs: `default` (the 1.5B) or `fast` (the 0.5B).
    #[arg(long, default_value = "default", value_parser = ["default", "fast"])]
    model: String,
    /// Where models are kept [default: $TOOLTUNE_MODELS_DIR or the data dir's tooltune/models].
    #[arg(long)]
    models_dir: Option<PathBuf>,
    /// Only the facts and the models' hashes: load no model.
    #[arg(long)]
    no_self_test: bool,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Run the probes in this process and print them as JSON (what the doctor starts itself with).
    #[arg(long, hide = true)]
    self_test_child: bool,
}

/// One embedded model's file.
#[derive(Debug, Serialize)]
struct ModelCheck {
    which: &'static str,
    name: &'static str,
    path: PathBuf,
    present: bool,
    expected_sha256: &'static str,
    sha256: Option<String>,
    ok: bool,
}

/// The self-test's outcome.
#[derive(Debug, Serialize)]
struct SelfTest {
    model: &'static str,
    tolerance: f64,
    seconds: f64,
    probes: Vec<ProbeResult>,
    /// The child's failure, when it did not print its results (a crash names its signal).
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct Report {
    cpu: CpuFacts,
    build: BuildFacts,
    models: Vec<ModelCheck>,
    self_test: Option<SelfTest>,
    findings: Vec<Finding>,
    ok: bool,
}

/// Runs `tooltune doctor`; exit 0 when nothing is wrong, 1 on any error finding.
pub async fn run(args: DoctorArgs) -> Result<ExitCode> {
    let which = ModelChoice::parse(&args.model)?;
    let dir = args.models_dir.clone().unwrap_or_else(default_models_dir);
    if args.self_test_child {
        return child(which, &dir).await;
    }
    let cpu = CpuFacts::detect();
    let build = BuildFacts::detect()?;
    let mut findings = check::static_findings(&cpu, &build);
    let mut models = Vec::new();
    for m in [ModelChoice::Default, ModelChoice::Fast] {
        let info = m.info();
        let path = tooltune_llm::fetch::model_path(m, &dir);
        let present = path.exists();
        let sha256 = if present {
            let p = path.clone();
            Some(tokio::task::spawn_blocking(move || file_sha256(&p)).await??)
        } else {
            None
        };
        let ok = sha256.as_deref() == Some(info.sha256);
        if present && !ok {
            findings.push(Finding {
                severity: Severity::Error,
                message: format!(
                    "the model file {} is damaged or not the published one: sha256 {}, expected {}",
                    path.display(),
                    sha256.as_deref().unwrap_or(""),
                    info.sha256
                ),
                fix: format!(
                    "fetch it again: `tooltune model fetch {} --force{}`",
                    m.as_str(),
                    args.models_dir
                        .as_ref()
                        .map(|d| format!(" --models-dir {}", d.display()))
                        .unwrap_or_default()
                ),
            });
        }
        models.push(ModelCheck {
            which: m.as_str(),
            name: info.name,
            path,
            present,
            expected_sha256: info.sha256,
            sha256,
            ok,
        });
    }
    let self_test = if args.no_self_test {
        None
    } else if !models
        .iter()
        .any(|m| m.which == which.as_str() && m.present)
    {
        findings.push(Finding {
            severity: Severity::Warning,
            message: format!(
                "no self-test: the {} model is not in {}",
                which.as_str(),
                dir.display()
            ),
            fix: format!("`tooltune model fetch {}`", which.as_str()),
        });
        None
    } else {
        let t = self_test(which, &dir, !args.json).await?;
        if let Some(e) = &t.error {
            findings.push(Finding {
                severity: Severity::Error,
                message: format!("the self-test did not finish on this CPU ({}): {e}", cpu.model_name),
                fix: "if it crashed, rebuild for this CPU: `scripts/setup`, then `cargo build --release` \
                      (scripts/cpu-level says which level it picks and why); if the model failed to load, \
                      fetch it again with `tooltune model fetch --force`"
                    .into(),
            });
        }
        for p in t.probes.iter().filter(|p| !p.pass) {
            findings.push(Finding {
                severity: Severity::Error,
                message: format!(
                    "self-test `{}`: first-move probabilities differ from the reference by {:.4} (tolerance \
                     {TOLERANCE}): the model file or the compiled kernels do not compute what they should",
                    p.name, p.max_diff
                ),
                fix: "check the model's hash above; rebuild with `scripts/setup` and `cargo build --release`"
                    .into(),
            });
        }
        Some(t)
    };
    let ok = !findings.iter().any(|f| f.severity == Severity::Error);
    let report = Report {
        cpu,
        build,
        models,
        self_test,
        findings,
        ok,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Starts this binary as the self-test's child and reads its results.
async fn self_test(which: ModelChoice, dir: &std::path::Path, say: bool) -> Result<SelfTest> {
    if say {
        eprintln!(
            "doctor: self-test on the {} model ({} probes)...",
            which.as_str(),
            check::PROBES.len()
        );
    }
    let exe = std::env::current_exe().context("finding this binary to run the self-test")?;
    let start = Instant::now();
    let child = tokio::process::Command::new(exe)
        .args(["doctor", "--self-test-child", "--model", which.as_str()])
        .arg("--models-dir")
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting the self-test")?;
    let out = match tokio::time::timeout(Duration::from_secs(300), child.wait_with_output()).await {
        Ok(r) => r.context("waiting for the self-test")?,
        Err(_) => {
            return Ok(SelfTest {
                model: which.as_str(),
                tolerance: TOLERANCE,
                seconds: start.elapsed().as_secs_f64(),
                probes: vec![],
                error: Some("no answer within 300 s".into()),
            });
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    let error = if out.status.success() {
        None
    } else {
        let tail: Vec<&str> = std::str::from_utf8(&out.stderr)
            .unwrap_or("")
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect();
        let tail = tail[tail.len().saturating_sub(3)..].join(" / ");
        Some(format!(
            "{}{}",
            describe_status(&out.status),
            if tail.is_empty() {
                String::new()
            } else {
                format!(": {tail}")
            }
        ))
    };
    let probes = if error.is_none() {
        serde_json::from_slice(&out.stdout).context("reading the self-test's results")?
    } else {
        vec![]
    };
    Ok(SelfTest {
        model: which.as_str(),
        tolerance: TOLERANCE,
        seconds,
        probes,
        error,
    })
}

/// How a child ended, naming a signal (SIGSEGV, SIGILL) when one killed it.
fn describe_status(status: &std::process::ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            let name = match sig {
                4 => " (SIGILL: an instruction this CPU does not have)",
                6 => " (SIGABRT)",
                7 => " (SIGBUS)",
                11 => " (SIGSEGV: a crash in the engine)",
                _ => "",
            };
            return format!("the engine was killed by signal {sig}{name}");
        }
    }
    format!("the self-test failed ({status})")
}

/// The child: load the model from its file (never fetch), run every probe, print them as JSON.
async fn child(which: ModelChoice, dir: &std::path::Path) -> Result<ExitCode> {
    let mut opts = LocalOptions::for_model(which);
    opts.model_path = Some(tooltune_llm::fetch::model_path(which, dir));
    opts.progress = false;
    let model = LocalModel::load(opts).await?;
    let probes = check::self_test(&model, which, usize::MAX).await?;
    println!("{}", serde_json::to_string(&probes)?);
    Ok(ExitCode::SUCCESS)
}

fn print_text(r: &Report) {
    println!("CPU      {}", r.cpu.model_name);
    let flags: Vec<&str> = r.cpu.flags.iter().map(String::as_str).collect();
    println!("         features: {}", flags.join(" "));
    let amx: Vec<&str> = flags
        .iter()
        .copied()
        .filter(|f| f.starts_with("amx"))
        .collect();
    if !amx.is_empty() {
        println!(
            "         has AMX ({}): tooltune builds never use it",
            amx.join(" ")
        );
    }
    println!(
        "build    {} (code may use: {})",
        r.build.level,
        if r.build.requires.is_empty() {
            "baseline instructions only".to_string()
        } else {
            r.build.requires.join(" ")
        }
    );
    let mut backends: Vec<&str> = r.build.kernels.iter().map(|(b, _, _)| b.as_str()).collect();
    backends.dedup();
    for b in backends {
        let on: Vec<String> = r
            .build
            .kernels
            .iter()
            .filter(|(bb, _, v)| bb == b && v != "0")
            .map(|(_, f, v)| {
                if v == "1" {
                    f.clone()
                } else {
                    format!("{f}={v}")
                }
            })
            .collect();
        println!("         llama.cpp {b} kernels: {}", on.join(" "));
    }
    for m in &r.models {
        let state = match (&m.sha256, m.ok) {
            (None, _) => format!("not fetched (`tooltune model fetch {}`)", m.which),
            (Some(h), true) => format!("sha256 {h} ok"),
            (Some(h), false) => format!("sha256 {h} MISMATCH (expected {})", m.expected_sha256),
        };
        println!(
            "model    {:8} {} {}\n         {state}",
            m.which,
            m.name,
            m.path.display()
        );
    }
    if let Some(t) = &r.self_test {
        println!(
            "self-test on the {} model, tolerance {} (absolute, per move), {:.1} s",
            t.model, t.tolerance, t.seconds
        );
        for p in &t.probes {
            let moves: Vec<String> = MOVES
                .iter()
                .zip(p.measured.iter().zip(&p.expected))
                .map(|(m, (x, e))| format!("{m} {x:.4} (ref {e:.4})"))
                .collect();
            println!(
                "         {:10} {}  max diff {:.4} {}",
                p.name,
                moves.join("  "),
                p.max_diff,
                if p.pass { "ok" } else { "FAIL" }
            );
        }
    }
    for f in &r.findings {
        let tag = match f.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        println!("{tag}: {}\n  what to do: {}", f.message, f.fix);
    }
    println!(
        "{}",
        if r.ok {
            "doctor: ok"
        } else {
            "doctor: FAILED (see the errors above)"
        }
    );
}
