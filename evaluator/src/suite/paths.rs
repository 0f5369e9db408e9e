//! Where a suite's servers and fixtures are found: the variables a suite may name (`${SUITE_DIR}`,
//! `${TOOLTUNE_THIRD_PARTY}`, `${TOOLTUNE_BIN_DIR}`, `${FIXTURE_DIR}`) and the folders they expand to.

use std::path::{Path, PathBuf};

/// The directory holding tooltune's binaries (and the example servers built beside them):
/// `TOOLTUNE_BIN_DIR` when set, else the running executable's folder (leaving cargo's `deps/`).
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TOOLTUNE_BIN_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    dir
}

/// Where `datasets/setup.sh` installs third-party servers for suites in `suite_dir`:
/// `TOOLTUNE_THIRD_PARTY` when set, else `.third-party` beside the suite folder.
pub fn third_party_dir(suite_dir: &Path) -> PathBuf {
    match std::env::var_os("TOOLTUNE_THIRD_PARTY") {
        Some(d) => PathBuf::from(d),
        None => suite_dir.join("..").join(".third-party"),
    }
}

/// Expands `${SUITE_DIR}`, `${TOOLTUNE_THIRD_PARTY}` and `${TOOLTUNE_BIN_DIR}`; `${FIXTURE_DIR}` stays as it is
/// when `fixture` (it names each rollout's copy, known only then); any other `${...}` is an error, so that a
/// suite cannot quietly read the host's environment.
pub(super) fn expand_vars(s: &str, suite_dir: &Path, fixture: bool) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!("unclosed `${{` in {s:?}"));
        };
        let var = &after[..end];
        let value = match var {
            "SUITE_DIR" => suite_dir.to_path_buf(),
            "TOOLTUNE_THIRD_PARTY" => third_party_dir(suite_dir),
            "TOOLTUNE_BIN_DIR" => bin_dir(),
            "FIXTURE_DIR" if fixture => PathBuf::from(crate::fixture::FIXTURE_VAR),
            "FIXTURE_DIR" => {
                return Err(
                    "`${FIXTURE_DIR}` needs a [fixture] section (the folder copied for each rollout)"
                        .into(),
                );
            }
            other => {
                return Err(format!(
                    "unknown variable `${{{other}}}`; known: ${{SUITE_DIR}}, ${{TOOLTUNE_THIRD_PARTY}}, ${{TOOLTUNE_BIN_DIR}} (use server.pass_env to pass a host variable to the server)"
                ));
            }
        };
        out.push_str(&value.to_string_lossy());
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}
