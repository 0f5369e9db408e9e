//! `tooltune doctor` and the engine check before a run (issue 45), on the real 0.5B model: the self-test passes on
//! this build, and a model file damaged on purpose is a clear failure, both for the doctor and for `eval`.

use crate::tooltune;
use serde_json::Value;
use std::io::{Seek, SeekFrom, Write};
use tooltune_llm::ModelChoice;

#[test]
fn doctor_passes_on_this_build_and_a_damaged_model_fails_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = format!("sqlite://{}", dir.path().join("t.sqlite").display());
    let fetched = tooltune(&db, dir.path(), &["model", "fetch", "fast"]);
    assert!(fetched.status.success(), "{fetched:?}");

    let ok = tooltune(&db, dir.path(), &["doctor", "--model", "fast", "--json"]);
    let report: Value = serde_json::from_slice(&ok.stdout).expect("doctor --json");
    assert!(ok.status.success(), "{report:#}");
    assert_eq!(report["ok"], true);
    // The build holds none of ggml's AMX kernels, by llama.cpp's own account.
    let kernels = report["build"]["kernels"].as_array().expect("kernels");
    assert!(
        kernels.iter().any(|k| k[1] == "AVX2" && k[2] == "1"),
        "{kernels:?}"
    );
    assert!(
        !kernels
            .iter()
            .any(|k| k[1].as_str().is_some_and(|f| f.starts_with("AMX")) && k[2] != "0"),
        "{kernels:?}"
    );
    let probes = report["self_test"]["probes"].as_array().expect("probes");
    assert_eq!(probes.len(), 3);
    for p in probes {
        assert_eq!(p["pass"], true, "{p}");
        let sum: f64 = p["measured"]
            .as_array()
            .expect("measured")
            .iter()
            .filter_map(Value::as_f64)
            .sum();
        assert!(
            (sum - 1.0).abs() < 1e-6,
            "a distribution over the moves: {p}"
        );
    }

    // The same model with 1 MB of noise written at three places: the hash names the file, and the self-test, which
    // does not know the hash, fails on its own.
    let models = dir.path().join("models");
    std::fs::create_dir_all(&models).expect("mkdir");
    let src =
        tooltune_llm::fetch::model_path(ModelChoice::Fast, &tooltune_llm::default_models_dir());
    let damaged = tooltune_llm::fetch::model_path(ModelChoice::Fast, &models);
    std::fs::copy(&src, &damaged).expect("copy the model");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&damaged)
        .expect("open");
    for at in [150_000_000u64, 250_000_000, 350_000_000] {
        f.seek(SeekFrom::Start(at)).expect("seek");
        let noise: Vec<u8> = (0..1u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        f.write_all(&noise).expect("write");
    }
    drop(f);
    let models_arg = models.to_str().expect("utf-8 path");
    let bad = tooltune(
        &db,
        dir.path(),
        &[
            "doctor",
            "--model",
            "fast",
            "--json",
            "--models-dir",
            models_arg,
        ],
    );
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    let report: Value = serde_json::from_slice(&bad.stdout).expect("doctor --json");
    assert_eq!(report["ok"], false);
    let fast = report["models"]
        .as_array()
        .expect("models")
        .iter()
        .find(|m| m["which"] == "fast")
        .cloned();
    assert_eq!(fast.expect("the fast model")["ok"], false);
    let findings = report["findings"].to_string();
    assert!(
        findings.contains("damaged") && findings.contains("model fetch fast --force"),
        "{findings}"
    );
    let probes = report["self_test"]["probes"].as_array().expect("probes");
    assert!(probes.iter().any(|p| p["pass"] == false), "{probes:?}");

    // A run that loads the damaged model stops before its first task with the engine check's message.
    let suite = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../datasets/suites/week01-tools.toml"
    );
    let eval = std::process::Command::new(env!("CARGO_BIN_EXE_tooltune"))
        .args([
            "--database-url",
            &db,
            "eval",
            "--suite",
            suite,
            "--model",
            "local:fast",
            "--split",
            "test",
        ])
        .env("TOOLTUNE_DATA_DIR", dir.path())
        .env("TOOLTUNE_MODELS_DIR", &models)
        .env_remove("TOOLTUNE_AGENT")
        .env_remove("TOOLTUNE_CONFIG")
        .output()
        .expect("run eval");
    let stderr = String::from_utf8_lossy(&eval.stderr);
    assert!(!eval.status.success(), "{stderr}");
    assert!(
        stderr.contains("self-test") && stderr.contains("tooltune doctor"),
        "{stderr}"
    );
}
