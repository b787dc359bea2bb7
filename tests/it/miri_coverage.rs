//! Every file of `src/` with unsafe code has tests that Miri runs.
//!
//! `.ci/miri-coverage` names, for each file holding an `unsafe` block or
//! an `unsafe impl`, the test filters whose tests go through that code
//! under Miri (or `none:` and why Miri cannot run it). This test reads the
//! sources, that file and the skip list of `.ci/verify` (grep-level: the
//! test paths are read off `#[test]` functions, their files and their
//! inline `mod` blocks) and fails when:
//! - a file with unsafe code is not listed (a new unsafe block landed in
//!   a file whose tests Miri may never run);
//! - a listed filter matches no test that Miri runs: every test it
//!   matches is `#[cfg_attr(miri, ignore)]`, skipped by `.ci/verify`, or
//!   gone;
//! - a listed file no longer exists or holds no unsafe code.
//!
//! `.ci/verify` checks the same filters against the names of the tests the
//! Miri runs passed, after they ran. Without `.ci/` (the packaged crate)
//! the test prints a note and checks nothing.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The code of a line: nothing after `//` (a comment, a doc comment, or
/// an example in one).
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}

/// Whether `text` holds an `unsafe` block or an `unsafe impl` outside
/// comments.
fn has_unsafe(text: &str) -> bool {
    text.lines().any(|l| {
        let c = code(l);
        c.contains("unsafe {") || c.contains("unsafe impl")
    })
}

/// The module path of a source file: `src/store/fixed.rs` is
/// `store::fixed`, `tests/it/shared.rs` is `shared`.
fn module_of(path: &Path, base: &Path) -> Vec<String> {
    let rel = path.strip_prefix(base).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// A test function: its path and whether Miri ignores it.
struct Test {
    path: String,
    miri_ignored: bool,
}

/// The `#[test]` functions of a file, with their paths (its module, its
/// inline `mod` blocks as rustfmt lays them out).
fn tests_in(text: &str, module: &[String]) -> Vec<Test> {
    let mut out = Vec::new();
    // Inline modules open: (indentation, name).
    let mut inline: Vec<(usize, String)> = Vec::new();
    let mut pending_test = false;
    let mut ignored = false;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let c = code(line).trim();
        if c == "}" {
            if inline.last().is_some_and(|&(i, _)| i == indent) {
                inline.pop();
            }
            continue;
        }
        if let Some(rest) = c
            .strip_prefix("mod ")
            .or_else(|| c.strip_prefix("pub(crate) mod "))
        {
            if let Some(name) = rest.strip_suffix(" {") {
                inline.push((indent, name.trim().to_string()));
            }
            continue;
        }
        if c == "#[test]" {
            pending_test = true;
            continue;
        }
        if c.starts_with("#[cfg_attr(miri, ignore") {
            ignored = true;
            continue;
        }
        if c.starts_with("#[") {
            continue;
        }
        if let Some(rest) = c
            .strip_prefix("fn ")
            .or_else(|| c.strip_prefix("async fn "))
        {
            if pending_test {
                let name: String = rest
                    .chars()
                    .take_while(|ch| ch.is_alphanumeric() || *ch == '_')
                    .collect();
                let mut path: Vec<&str> = module.iter().map(String::as_str).collect();
                path.extend(inline.iter().map(|(_, n)| n.as_str()));
                path.push(&name);
                out.push(Test {
                    path: path.join("::"),
                    miri_ignored: ignored,
                });
            }
        }
        if !c.is_empty() {
            pending_test = false;
            ignored = false;
        }
    }
    out
}

/// The `--skip` filters of the `miri_skip` list in `.ci/verify`.
fn miri_skips(verify: &str) -> Vec<String> {
    let start = verify
        .find("miri_skip=(")
        .expect(".ci/verify has a miri_skip list");
    let list = &verify[start..start + verify[start..].find("\n)").unwrap()];
    list.lines()
        .filter_map(|l| l.trim().strip_prefix("--skip "))
        .map(|s| s.trim().to_string())
        .collect()
}

#[test]
#[cfg_attr(miri, ignore)] // reads files: blocked by Miri's isolation
fn every_file_with_unsafe_code_has_tests_that_miri_runs() {
    let root = root();
    let (Ok(manifest), Ok(verify)) = (
        fs::read_to_string(root.join(".ci/miri-coverage")),
        fs::read_to_string(root.join(".ci/verify")),
    ) else {
        println!("note: no .ci/ here (a packaged crate): nothing checked");
        return;
    };
    let skips = miri_skips(&verify);
    assert!(
        !skips.is_empty(),
        "the miri_skip list of .ci/verify is read"
    );

    let src = root.join("src");
    let mut tests = Vec::new();
    let mut with_unsafe = Vec::new();
    for f in rust_files(&src) {
        let text = fs::read_to_string(&f).unwrap();
        tests.extend(tests_in(&text, &module_of(&f, &src)));
        if has_unsafe(&text) {
            with_unsafe.push(
                f.strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
            );
        }
    }
    let it = root.join("tests/it");
    for f in rust_files(&it) {
        let text = fs::read_to_string(&f).unwrap();
        tests.extend(tests_in(&text, &module_of(&f, &it)));
    }
    assert!(
        tests.len() > 300,
        "{} tests found: the scan is broken",
        tests.len()
    );
    let runs = |t: &Test| !t.miri_ignored && !skips.iter().any(|s| t.path.contains(s.as_str()));

    let mut listed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (file, rest) = line.split_once(char::is_whitespace).unwrap();
        let rest = rest.trim();
        let filters = if let Some(why) = rest.strip_prefix("none:") {
            assert!(!why.trim().is_empty(), "{file}: `none:` says why");
            Vec::new()
        } else {
            rest.split_whitespace().map(str::to_string).collect()
        };
        assert!(
            listed.insert(file.to_string(), filters).is_none(),
            "{file} is listed twice in .ci/miri-coverage"
        );
    }

    let mut problems = Vec::new();
    for f in &with_unsafe {
        if !listed.contains_key(f) {
            problems.push(format!(
                "{f} holds unsafe code and is not in .ci/miri-coverage: name the Miri \
                 tests that run it (or `none:` and why)"
            ));
        }
    }
    for (file, filters) in &listed {
        if !with_unsafe.contains(file) {
            problems.push(format!(
                "{file} is in .ci/miri-coverage but holds no unsafe code (or is gone)"
            ));
        }
        for filter in filters {
            let matched: Vec<&Test> = tests
                .iter()
                .filter(|t| t.path.contains(filter.as_str()))
                .collect();
            if !matched.iter().any(|t| runs(t)) {
                problems.push(format!(
                    "{file}: the filter `{filter}` matches {} tests, none run under Miri \
                     (ignored under Miri or skipped by .ci/verify)",
                    matched.len()
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The scan reads test paths as libtest names them.
#[test]
fn test_paths_follow_files_and_inline_modules() {
    let text = "\
#[test]
fn top() {}

mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore)] // slow
    fn inner() {
        let x = 1;
    }
}

#[test]
fn after() {}
";
    let module = vec!["store".to_string(), "ring".to_string()];
    let found: Vec<(String, bool)> = tests_in(text, &module)
        .into_iter()
        .map(|t| (t.path, t.miri_ignored))
        .collect();
    assert_eq!(
        found,
        [
            ("store::ring::top".to_string(), false),
            ("store::ring::tests::inner".to_string(), true),
            ("store::ring::after".to_string(), false),
        ]
    );
    assert!(has_unsafe("    let x = unsafe { f() };"));
    assert!(!has_unsafe("    /// unsafe { f() }"));
    assert!(!has_unsafe("    f(); // unsafe { g() }"));
    assert_eq!(
        module_of(Path::new("/r/src/store/fixed/mod.rs"), Path::new("/r/src")),
        ["store", "fixed"]
    );
}
