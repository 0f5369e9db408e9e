//! Confinement of `read_file` and `list_files` to the server's data directory.
//!
//! A path from a model is refused when it is absolute, contains a `..` component, or resolves (after
//! following symlinks) to somewhere outside the data directory. The check is done on the canonical path,
//! so a symlink inside the directory that points out of it is caught too.

use std::path::{Component, Path, PathBuf};

/// Longest text `read_file` returns, as in the lecture's server.
pub const MAX_CHARS: usize = 4_000;
/// Largest file read at all; bigger files are refused rather than loaded to be truncated.
const MAX_BYTES: u64 = 1 << 20;

/// The data directory every path is confined to.
#[derive(Debug, Clone)]
pub struct Jail {
    root: PathBuf,
}

impl Jail {
    /// Opens a jail at `dir`, which must exist.
    pub fn new(dir: &Path) -> std::io::Result<Self> {
        Ok(Jail {
            root: dir.canonicalize()?,
        })
    }

    /// Resolves a relative path inside the jail, or says why it is refused.
    pub fn resolve(&self, requested: &str) -> Result<PathBuf, String> {
        let requested = requested.trim();
        let p = Path::new(requested);
        if requested.is_empty() {
            return Err("path is empty".into());
        }
        for c in p.components() {
            match c {
                Component::RootDir | Component::Prefix(_) => {
                    return Err(format!(
                        "refused: {requested:?} is an absolute path; give a path relative to the server's directory"
                    ));
                }
                Component::ParentDir => {
                    return Err(format!(
                        "refused: {requested:?} contains '..'; only files inside the server's directory can be read"
                    ));
                }
                Component::CurDir | Component::Normal(_) => {}
            }
        }
        let joined = self.root.join(p);
        let canonical = joined
            .canonicalize()
            .map_err(|e| format!("{requested:?}: {}", describe_io(&e)))?;
        if !canonical.starts_with(&self.root) {
            return Err(format!(
                "refused: {requested:?} resolves to a location outside the server's directory"
            ));
        }
        Ok(canonical)
    }

    /// Reads a text file, returning at most [`MAX_CHARS`] characters.
    pub fn read_text(&self, requested: &str) -> Result<String, String> {
        let path = self.resolve(requested)?;
        let meta =
            std::fs::metadata(&path).map_err(|e| format!("{requested:?}: {}", describe_io(&e)))?;
        if meta.is_dir() {
            return Err(format!("{requested:?} is a directory, not a file"));
        }
        if meta.len() > MAX_BYTES {
            return Err(format!(
                "{requested:?} is {} bytes; files over {MAX_BYTES} bytes are not read",
                meta.len()
            ));
        }
        let bytes =
            std::fs::read(&path).map_err(|e| format!("{requested:?}: {}", describe_io(&e)))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| format!("{requested:?} is not a UTF-8 text file"))?;
        let total = text.chars().count();
        if total <= MAX_CHARS {
            return Ok(text);
        }
        let mut cut: String = text.chars().take(MAX_CHARS).collect();
        cut.push_str(&format!(
            "\n[truncated: {} more characters not shown]",
            total - MAX_CHARS
        ));
        Ok(cut)
    }

    /// Lists a directory inside the jail: one entry per line, folders with a trailing `/`, files with
    /// their size. Entries that lead outside the jail (symlinks out) are left out.
    pub fn list(&self, requested: &str) -> Result<String, String> {
        let requested = if requested.trim().is_empty() {
            "."
        } else {
            requested
        };
        let path = self.resolve(requested)?;
        if !path.is_dir() {
            return Err(format!("{requested:?} is a file, not a directory"));
        }
        let mut entries = Vec::new();
        let rd =
            std::fs::read_dir(&path).map_err(|e| format!("{requested:?}: {}", describe_io(&e)))?;
        for entry in rd.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(target) = entry.path().canonicalize() else {
                continue;
            };
            if !target.starts_with(&self.root) {
                continue;
            }
            if target.is_dir() {
                entries.push(format!("{name}/"));
            } else {
                let size = target.metadata().map(|m| m.len()).unwrap_or(0);
                entries.push(format!("{name} ({size} bytes)"));
            }
        }
        entries.sort();
        if entries.is_empty() {
            return Ok(format!("{requested} is empty"));
        }
        Ok(entries.join("\n"))
    }
}

fn describe_io(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, Jail) {
        let outer = tempfile::tempdir().expect("tempdir");
        let data = outer.path().join("data");
        std::fs::create_dir_all(data.join("sub")).expect("mkdir");
        std::fs::write(data.join("notes.txt"), "Attendees: 4\n").expect("write");
        std::fs::write(data.join("sub/inner.txt"), "inner").expect("write");
        std::fs::write(outer.path().join("secret.txt"), "secret").expect("write");
        std::os::unix::fs::symlink(outer.path().join("secret.txt"), data.join("escape.txt"))
            .expect("symlink");
        std::os::unix::fs::symlink(data.join("notes.txt"), data.join("alias.txt"))
            .expect("symlink");
        let jail = Jail::new(&data).expect("jail");
        (outer, jail)
    }

    #[test]
    fn reads_inside_and_refuses_escapes() {
        let (outer, jail) = setup();
        assert_eq!(jail.read_text("notes.txt").expect("read"), "Attendees: 4\n");
        assert_eq!(jail.read_text("./sub/inner.txt").expect("read"), "inner");
        assert_eq!(
            jail.read_text("alias.txt").expect("inside symlink"),
            "Attendees: 4\n"
        );
        assert!(
            jail.read_text("../secret.txt")
                .expect_err("dotdot")
                .contains("'..'")
        );
        assert!(
            jail.read_text("sub/../notes.txt")
                .expect_err("dotdot")
                .contains("'..'")
        );
        let abs = outer.path().join("secret.txt");
        assert!(
            jail.read_text(abs.to_str().expect("utf8"))
                .expect_err("absolute")
                .contains("absolute")
        );
        assert!(
            jail.read_text("escape.txt")
                .expect_err("symlink")
                .contains("outside")
        );
        assert!(
            jail.read_text("missing.txt")
                .expect_err("missing")
                .contains("no such file")
        );
        assert!(
            jail.read_text("sub")
                .expect_err("dir")
                .contains("directory")
        );
    }

    #[test]
    fn truncates_long_files() {
        let (_outer, jail) = setup();
        std::fs::write(jail.root.join("long.txt"), "x".repeat(MAX_CHARS + 10)).expect("write");
        let t = jail.read_text("long.txt").expect("read");
        assert!(
            t.ends_with("[truncated: 10 more characters not shown]"),
            "{t}"
        );
    }

    #[test]
    fn lists_without_leaking_outside_entries() {
        let (_outer, jail) = setup();
        let l = jail.list("").expect("list");
        assert!(l.contains("notes.txt (13 bytes)"), "{l}");
        assert!(l.contains("sub/"), "{l}");
        assert!(!l.contains("escape.txt"), "{l}");
        assert!(jail.list("..").is_err());
    }
}
