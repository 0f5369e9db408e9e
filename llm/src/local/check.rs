//! Checking the embedded engine before a run: what the CPU offers, which of llama.cpp's kernel families this
//! binary was compiled with, and a self-test whose exact first-move probabilities must match reference values.
//!
//! Why: a binary compiled with `target-cpu=native` on an Intel CPU with AMX built ggml's AMX kernel, which no
//! build of ours was tested with, and the demo died with SIGSEGV at its first model call with no message (issue
//! 45). The build now picks AVX-512 or AVX2 explicitly (`scripts/cpu-level`); this module makes the remaining
//! ways to get a broken engine (a hand-set `RUSTFLAGS`, a binary copied to another CPU, damaged weights, a new
//! llama.cpp whose numerics moved) a clear message before a run instead of a crash or quietly wrong figures.
//!
//! The self-test compares probabilities, not text: AVX2 and AVX-512 round differently, which flips close greedy
//! choices (the lecture's reference task answers 69504 on one and 69500 on the other), while the probabilities of
//! a first move differ between them by far less than [`TOLERANCE`].

use super::LocalModel;
use crate::fetch::ModelChoice;
use crate::{ChatModel, ChatRequest, LlmError, Message};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::Arc;
use tooltune_core::ToolSpec;

/// What the self-test allows between a measured probability and its reference, absolute. Each reference is the
/// midpoint of the AVX-512 build's and the AVX2 build's measurement (2 threads, AMD EPYC, December 2026). The two
/// builds differ most on the 1.5B's `between` probe, a three-way close call: 0.066 on one move, so each is 0.033
/// from its reference; everywhere else they differ by 0.023 or less. A damaged model file moved every probe by
/// more than 0.6 (1 MB of noise written at eight places of the 1.5B); this tolerance leaves room for the other
/// kernel subsets of AVX-512 CPUs and for thread counts, and none for a broken engine.
pub const TOLERANCE: f64 = 0.06;

/// The CPU features that decide which kernels can run, as `/proc/cpuinfo` spells them.
const CPU_FLAGS: &[&str] = &[
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "bmi2",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512dq",
    "avx512cd",
    "avx512_vnni",
    "avx512vbmi",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
];

/// The processor this runs on.
#[derive(Debug, Clone, Serialize)]
pub struct CpuFacts {
    /// The model name the CPU reports (`/proc/cpuinfo`'s `model name`), or the architecture.
    pub model_name: String,
    /// Of [`CPU_FLAGS`], the ones this CPU has.
    pub flags: BTreeSet<String>,
}

impl CpuFacts {
    /// Reads this machine's CPU (`/proc/cpuinfo` on Linux; elsewhere the standard library's feature detection).
    pub fn detect() -> Self {
        let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |name: &str| {
            text.lines()
                .find(|l| l.split(':').next().map(str::trim) == Some(name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        };
        let model_name = field("model name").unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let flags = match field("flags") {
            Some(all) => {
                let all: BTreeSet<&str> = all.split_whitespace().collect();
                CPU_FLAGS
                    .iter()
                    .filter(|f| all.contains(*f))
                    .map(|f| f.to_string())
                    .collect()
            }
            None => detected_flags(),
        };
        CpuFacts { model_name, flags }
    }

    fn has(&self, flag: &str) -> bool {
        self.flags.contains(flag)
    }
}

/// Where there is no `/proc/cpuinfo`: the features the standard library can detect, under cpuinfo's names.
fn detected_flags() -> BTreeSet<String> {
    #[allow(unused_mut)]
    let mut out = BTreeSet::new();
    #[cfg(target_arch = "x86_64")]
    {
        let checks = [
            ("sse4_2", std::arch::is_x86_feature_detected!("sse4.2")),
            ("avx", std::arch::is_x86_feature_detected!("avx")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("f16c", std::arch::is_x86_feature_detected!("f16c")),
            ("bmi2", std::arch::is_x86_feature_detected!("bmi2")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            ("avx512bw", std::arch::is_x86_feature_detected!("avx512bw")),
            ("avx512vl", std::arch::is_x86_feature_detected!("avx512vl")),
            ("avx512dq", std::arch::is_x86_feature_detected!("avx512dq")),
            ("avx512cd", std::arch::is_x86_feature_detected!("avx512cd")),
            (
                "avx512_vnni",
                std::arch::is_x86_feature_detected!("avx512vnni"),
            ),
            (
                "avx512vbmi",
                std::arch::is_x86_feature_detected!("avx512vbmi"),
            ),
            (
                "avx512_bf16",
                std::arch::is_x86_feature_detected!("avx512bf16"),
            ),
        ];
        for (name, on) in checks {
            if on {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// How this binary was compiled: the level its Rust code and llama.cpp were built for.
#[derive(Debug, Clone, Serialize)]
pub struct BuildFacts {
    /// `avx512`, `avx2`, `baseline` (x86-64 without AVX2) or the architecture's name.
    pub level: String,
    /// The CPU features (cpuinfo names) the compiled code may use without checking: a CPU without one of them
    /// stops the process with SIGILL.
    pub requires: Vec<String>,
    /// llama.cpp's own account of the kernels compiled in (`llama_print_system_info`), as `(backend, feature,
    /// value)`.
    pub kernels: Vec<(String, String, String)>,
}

impl BuildFacts {
    /// This binary's build.
    #[allow(unsafe_code)] // One FFI call that llama-cpp-2 does not wrap.
    pub fn detect() -> Result<Self, LlmError> {
        super::backend()?;
        // SAFETY: llama_print_system_info returns a pointer to a static string that stays valid until the next
        // call; it is copied at once, and only this function calls it.
        let info = unsafe {
            let p = llama_cpp_sys_2::llama_print_system_info();
            if p.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Ok(BuildFacts {
            level: compiled_level().to_string(),
            requires: compiled_requirements(),
            kernels: parse_system_info(&info),
        })
    }

    /// Whether llama.cpp reports a kernel family as compiled in (`AMX_INT8`, `AVX512`, ...).
    pub fn kernel(&self, feature: &str) -> bool {
        self.kernels
            .iter()
            .any(|(_, f, v)| f == feature && v != "0" && !v.is_empty())
    }
}

/// `CPU : SSE3 = 1 | AVX2 = 1 | ... | ` (one group per backend) as `(backend, feature, value)`.
pub fn parse_system_info(info: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut backend = String::new();
    for part in info.split('|') {
        let mut part = part.trim();
        // A new backend's group starts with `NAME : ` before its first feature.
        if let Some((name, rest)) = part.split_once(" : ") {
            backend = name.trim().to_string();
            part = rest.trim();
        }
        if let Some((k, v)) = part.split_once('=') {
            out.push((backend.clone(), k.trim().to_string(), v.trim().to_string()));
        }
    }
    out
}

/// The level this binary's code was compiled for (the same flags reached llama.cpp: llama-cpp-sys-2 derives its
/// `-march` and `GGML_*` switches from them).
fn compiled_level() -> &'static str {
    if cfg!(target_feature = "avx512f") {
        "avx512"
    } else if cfg!(target_feature = "avx2") {
        "avx2"
    } else if cfg!(target_arch = "x86_64") {
        "baseline"
    } else {
        std::env::consts::ARCH
    }
}

/// The cpuinfo names of the features compiled code may use unchecked.
fn compiled_requirements() -> Vec<String> {
    let compiled = [
        ("avx2", cfg!(target_feature = "avx2")),
        ("fma", cfg!(target_feature = "fma")),
        ("f16c", cfg!(target_feature = "f16c")),
        ("bmi2", cfg!(target_feature = "bmi2")),
        ("avx512f", cfg!(target_feature = "avx512f")),
        ("avx512bw", cfg!(target_feature = "avx512bw")),
        ("avx512vl", cfg!(target_feature = "avx512vl")),
        ("avx512dq", cfg!(target_feature = "avx512dq")),
        ("avx512cd", cfg!(target_feature = "avx512cd")),
        ("avx512_vnni", cfg!(target_feature = "avx512vnni")),
        ("avx512vbmi", cfg!(target_feature = "avx512vbmi")),
        ("avx512_bf16", cfg!(target_feature = "avx512bf16")),
    ];
    compiled
        .iter()
        .filter(|(_, on)| *on)
        .map(|(n, _)| n.to_string())
        .collect()
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The engine must not run: it would crash or give wrong figures.
    Error,
    /// It runs, but not as it should (slower than this CPU allows, say).
    Warning,
}

/// One thing the check found, with what to do about it.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// Error or warning.
    pub severity: Severity,
    /// What is wrong, naming the CPU.
    pub message: String,
    /// What to do.
    pub fix: String,
}

const REBUILD: &str = "from the checkout, run `scripts/setup` (it writes .cargo/cpu.toml for this CPU), then \
                       `cargo build --release`; see scripts/cpu-level";

/// What the CPU and the build say without running the model: AMX kernels compiled in (they crashed, issue 45),
/// compiled instructions this CPU lacks (SIGILL), or a build slower than the CPU allows.
pub fn static_findings(cpu: &CpuFacts, build: &BuildFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    let amx: Vec<&str> = ["AMX_INT8", "AMX_BF16", "AMX_TILE", "AMX"]
        .into_iter()
        .filter(|f| build.kernel(f))
        .collect();
    if !amx.is_empty() && std::env::var_os("TOOLTUNE_ALLOW_AMX").is_none() {
        out.push(Finding {
            severity: Severity::Error,
            message: format!(
                "this binary was compiled with ggml's AMX kernels ({}), which no build of tooltune is tested with \
                 and which crashed with SIGSEGV on an Intel Xeon with AMX (CPU here: {})",
                amx.join(", "),
                cpu.model_name
            ),
            fix: format!(
                "rebuild without AMX: {REBUILD} (a RUSTFLAGS with target-cpu=native or a CPU name such as \
                 sapphirerapids brings AMX back); TOOLTUNE_ALLOW_AMX=1 runs it anyway"
            ),
        });
    }
    let missing: Vec<&String> = build.requires.iter().filter(|f| !cpu.has(f)).collect();
    if !missing.is_empty() && !cpu.flags.is_empty() {
        out.push(Finding {
            severity: Severity::Error,
            message: format!(
                "this binary was built for {} and uses {}, which this CPU ({}) does not have: the first such \
                 instruction stops the process with SIGILL",
                build.level,
                missing
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                cpu.model_name
            ),
            fix: format!("rebuild for this CPU: {REBUILD}"),
        });
    }
    let cpu_level = if ["avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"]
        .iter()
        .all(|f| cpu.has(f))
    {
        "avx512"
    } else if cpu.has("avx2") && cpu.has("fma") {
        "avx2"
    } else {
        "baseline"
    };
    if build.level == "baseline" && cpu_level != "baseline" {
        out.push(Finding {
            severity: Severity::Warning,
            message: format!(
                "this binary was built for baseline x86-64 (SSE2), which runs the model two to three times slower \
                 than this CPU ({}, {cpu_level}) allows",
                cpu.model_name
            ),
            fix: REBUILD.to_string(),
        });
    } else if build.level == "avx2" && cpu_level == "avx512" {
        out.push(Finding {
            severity: Severity::Warning,
            message: format!(
                "this binary was built for AVX2; this CPU ({}) has AVX-512, about a quarter faster for the model",
                cpu.model_name
            ),
            fix: REBUILD.to_string(),
        });
    }
    out
}

/// One fixed request of the self-test with its reference first-move distribution per model.
#[derive(Debug)]
pub struct Probe {
    /// A short name.
    pub name: &'static str,
    /// The user's message.
    pub user: &'static str,
    /// References for the 1.5B: P(first move) for each tool of [`probe_tools`] in order, then P(no call).
    pub default_model: [f64; 3],
    /// The same for the 0.5B.
    pub fast_model: [f64; 3],
}

/// The self-test's requests: one clear tool, one clear other tool and one between two, so that both the name
/// scores and the call-or-answer split are exercised. The first is the cheap check run before every run.
pub static PROBES: &[Probe] = &[
    Probe {
        name: "arithmetic",
        user: "What is 4817 times 29?",
        default_model: [0.8881, 0.0, 0.1119],
        fast_model: [0.8511, 0.0014, 0.1474],
    },
    Probe {
        name: "file",
        user: "What does the file notes.txt say about the budget?",
        default_model: [0.0007, 0.7273, 0.272],
        fast_model: [0.0018, 0.0987, 0.8996],
    },
    Probe {
        name: "between",
        user: "How many attendees are listed in notes.txt, times three?",
        default_model: [0.3516, 0.3204, 0.3281],
        fast_model: [0.0488, 0.4327, 0.5185],
    },
];

/// The two tools every probe shows (the lecture's lab tools).
pub fn probe_tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "calculator".into(),
            description:
                "Evaluate an arithmetic expression such as 2 * (3 + 4) and return the result."
                    .into(),
            input_schema: Arc::new(serde_json::json!({
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"]
            })),
        },
        ToolSpec {
            name: "read_file".into(),
            description: "Read a text file from the lab folder and return its contents.".into(),
            input_schema: Arc::new(serde_json::json!({
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"]
            })),
        },
    ]
}

/// The names of the moves a probe's distribution lists, in order.
pub const MOVES: [&str; 3] = ["calculator", "read_file", "(no tool)"];

/// One probe's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeResult {
    /// The probe's name.
    pub name: String,
    /// Reference P(first move), in [`MOVES`] order.
    pub expected: Vec<f64>,
    /// Measured P(first move), in the same order; not a number (`null` in JSON) where the engine computed none, as
    /// a damaged model file makes it do.
    #[serde(deserialize_with = "nan_for_null")]
    pub measured: Vec<f64>,
    /// The largest absolute difference; 1 when a measurement is not a number.
    pub max_diff: f64,
    /// Within [`TOLERANCE`].
    pub pass: bool,
}

/// serde_json writes a NaN as `null`; read it back as NaN.
fn nan_for_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    let v: Vec<Option<f64>> = Deserialize::deserialize(d)?;
    Ok(v.into_iter().map(|x| x.unwrap_or(f64::NAN)).collect())
}

/// The probes' request: a system line, the two tools, the user's message.
fn probe_request(p: &Probe) -> ChatRequest {
    ChatRequest {
        messages: vec![
            Message::system(
                "You are a helpful assistant. Use a tool when it helps answer the request.",
            ),
            Message::user(p.user),
        ],
        tools: probe_tools(),
        tool_choice: crate::ToolChoice::Auto,
        max_tokens: 64,
        temperature: 0.0,
        seed: None,
        format: None,
    }
}

/// Runs the first `count` probes (all of them with `usize::MAX`) on a loaded embedded model and compares each
/// with its reference for `which`.
pub async fn self_test(
    model: &LocalModel,
    which: ModelChoice,
    count: usize,
) -> Result<Vec<ProbeResult>, LlmError> {
    let probes: Vec<&Probe> = PROBES.iter().take(count).collect();
    let reqs: Vec<ChatRequest> = probes.iter().map(|p| probe_request(p)).collect();
    let candidates: Vec<String> = probe_tools().into_iter().map(|t| t.name).collect();
    let scored = model.score_first_moves(&reqs, &candidates).await;
    let mut out = Vec::new();
    for (p, r) in probes.iter().zip(scored) {
        let fm = r?.ok_or_else(|| LlmError::Local {
            model: model.id(),
            message: "the self-test got no exact first-move scores".into(),
        })?;
        let measured = vec![fm.p_tool(0), fm.p_tool(1), fm.p_no_call()];
        let expected = match which {
            ModelChoice::Default => p.default_model.to_vec(),
            ModelChoice::Fast => p.fast_model.to_vec(),
        };
        // `f64::max` drops a NaN, so a measurement that is not a number is made the largest difference there is.
        let max_diff = measured
            .iter()
            .zip(&expected)
            .map(|(m, e)| if m.is_finite() { (m - e).abs() } else { 1.0 })
            .fold(0.0, f64::max);
        out.push(ProbeResult {
            name: p.name.to_string(),
            expected,
            measured,
            max_diff,
            pass: max_diff <= TOLERANCE,
        });
    }
    Ok(out)
}

/// The cheap part of the check, for a run about to use the embedded model: the static findings (an error among
/// them fails) and the first probe. Runs once per process and model; later loads reuse the verdict.
pub async fn preflight(model: &LocalModel, which: ModelChoice) -> Result<(), LlmError> {
    use std::sync::Mutex;
    static PASSED: Mutex<Vec<ModelChoice>> = Mutex::new(Vec::new());
    if PASSED.lock().map(|p| p.contains(&which)).unwrap_or(false) {
        return Ok(());
    }
    let cpu = CpuFacts::detect();
    let build = BuildFacts::detect()?;
    let findings = static_findings(&cpu, &build);
    for f in findings.iter().filter(|f| f.severity == Severity::Warning) {
        tracing::warn!("{} ({})", f.message, f.fix);
    }
    if let Some(f) = findings.iter().find(|f| f.severity == Severity::Error) {
        return Err(LlmError::Engine {
            message: f.message.clone(),
            fix: f.fix.clone(),
        });
    }
    let results = self_test(model, which, 1).await?;
    // Leave the model as loading left it, with an empty prefix cache: the probe's prompt is nothing a run shares,
    // and the run then starts from the same state whether or not the check ran in this process.
    model.drop_prefix_cache().await?;
    if let Some(r) = results.iter().find(|r| !r.pass) {
        return Err(LlmError::Engine {
            message: format!(
                "on this CPU ({}) the self-test `{}` gave first-move probabilities {:?} where {:?} were expected \
                 (tolerance {TOLERANCE}): the model file or the compiled kernels do not compute what they should",
                cpu.model_name,
                r.name,
                rounded(&r.measured),
                rounded(&r.expected)
            ),
            fix: "run `tooltune doctor` for the whole check (it verifies the model file's hash)"
                .into(),
        });
    }
    if let Ok(mut p) = PASSED.lock() {
        p.push(which);
    }
    Ok(())
}

fn rounded(v: &[f64]) -> Vec<f64> {
    v.iter()
        .map(|x| (x * 10_000.0).round() / 10_000.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_info_is_read_per_backend() {
        let k = parse_system_info(
            "CPU : SSE3 = 1 | AVX2 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | ",
        );
        assert_eq!(k[0], ("CPU".into(), "SSE3".into(), "1".into()));
        assert_eq!(k.len(), 6);
        let b = BuildFacts {
            level: "avx512".into(),
            requires: vec![],
            kernels: k,
        };
        assert!(b.kernel("AMX_INT8") && !b.kernel("AVX512"));
    }

    fn cpu(flags: &[&str]) -> CpuFacts {
        CpuFacts {
            model_name: "Test CPU".into(),
            flags: flags.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn amx_compiled_in_is_an_error_naming_the_cpu() {
        let b = BuildFacts {
            level: "avx512".into(),
            requires: vec!["avx2".into()],
            kernels: parse_system_info("CPU : AVX2 = 1 | AMX_INT8 = 1 | "),
        };
        let f = static_findings(&cpu(&["avx2", "amx_int8"]), &b);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].severity, Severity::Error);
        assert!(
            f[0].message.contains("AMX_INT8") && f[0].message.contains("Test CPU"),
            "{f:?}"
        );
        assert!(f[0].fix.contains("scripts/setup"), "{f:?}");
    }

    #[test]
    fn compiled_instructions_the_cpu_lacks_are_an_error() {
        let b = BuildFacts {
            level: "avx512".into(),
            requires: vec!["avx2".into(), "avx512f".into()],
            kernels: vec![],
        };
        let f = static_findings(&cpu(&["avx2", "fma"]), &b);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].message.contains("avx512f") && f[0].message.contains("SIGILL"),
            "{f:?}"
        );
        // The same build on a CPU that has them: nothing to say.
        let ok = cpu(&[
            "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd",
        ]);
        assert!(static_findings(&ok, &b).is_empty());
    }

    #[test]
    fn a_probe_that_measured_no_number_reads_back_as_one() {
        let r = ProbeResult {
            name: "p".into(),
            expected: vec![0.5, 0.5, 0.0],
            measured: vec![f64::NAN, 0.5, 0.0],
            max_diff: 1.0,
            pass: false,
        };
        let back: ProbeResult =
            serde_json::from_str(&serde_json::to_string(&r).expect("json")).expect("read back");
        assert!(back.measured[0].is_nan() && back.measured[1] == 0.5);
    }

    #[test]
    fn a_build_below_the_cpu_is_a_warning() {
        let b = BuildFacts {
            level: "baseline".into(),
            requires: vec![],
            kernels: vec![],
        };
        let f = static_findings(&cpu(&["avx2", "fma"]), &b);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].severity, Severity::Warning);
    }
}
