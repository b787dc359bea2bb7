//! The built `decaying-pool` binary: help, exit codes, error messages,
//! pickles, sweeps and the recommendation.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_decaying-pool"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn shipped() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("traces/inference.csv")
        .display()
        .to_string()
}

fn shared(name: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/workloads")
        .join(name);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipped: {} is absent", p.display());
        None
    }
}

/// A scratch file holding `text`, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str, text: &str) -> Self {
        let p =
            std::env::temp_dir().join(format!("decaying-pool-cli-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        Scratch(p)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn help_exits_zero_and_documents_every_option_and_the_exit_codes() {
    let o = run(&["--help"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("Exit codes: 0 success (also when the reader"),
        "{}",
        stdout(&o)
    );
    let o = run(&["replay", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    let help = stdout(&o);
    for opt in [
        "--json",
        "--svg",
        "--chrome-trace",
        "--capacity",
        "--repeat",
        "--gap",
        "--reaper",
        "--ttl",
        "--half-life",
        "--slots",
        "--size-class",
        "--gc-threshold",
        "--packing",
        "--spare-ttl",
        "--budget",
        "--costs",
        "--device",
        "--stream",
        "--strict",
        "Exit codes",
    ] {
        assert!(help.contains(opt), "replay --help lacks {opt}:\n{help}");
    }
    let o = run(&["convert", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("--output"));
}

#[test]
fn the_shipped_trace_replays_with_a_recommendation() {
    let o = run(&["replay", &shipped()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("pytorch trace, 1280 allocations, 1280 frees"),
        "{out}"
    );
    assert!(out.contains("Pareto front"), "{out}");
    assert!(
        out.contains("recommendation (peak reserved within 2x peak live"),
        "{out}"
    );
}

#[test]
fn a_sweep_over_ttls_and_capacities_prints_a_recommendation() {
    let o = run(&[
        "replay",
        &shipped(),
        "--ttl",
        "10ms,100ms,1s",
        "--capacity",
        "40M,80M",
        "--budget",
        "1.5x",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    for row in [
        "fixed-time 10ms @ 40.0 MiB",
        "fixed-time 1s @ 80.0 MiB",
        "no-pool @ 40.0 MiB",
    ] {
        assert!(out.contains(row), "no row {row}:\n{out}");
    }
    let rec = out
        .lines()
        .find(|l| l.starts_with("recommendation (peak reserved within 1.5x peak live"))
        .unwrap_or_else(|| panic!("no recommendation:\n{out}"));
    // On 40 MiB the pool trims its cache when the device is full.
    assert!(rec.contains(": keep-all @ 40.0 MiB: "), "{rec}");
}

#[test]
fn a_limit_sweep_adds_limited_rows() {
    let o = run(&["replay", &shipped(), "--ttl", "1s", "--limit", "none,40M"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let row = out
        .lines()
        .find(|l| l.starts_with("fixed-time 1s, limit 40.0 MiB "))
        .unwrap_or_else(|| panic!("no limited row:\n{out}"));
    assert!(row.contains(" 440 "), "{row}");
    assert!(
        out.lines().any(|l| l.starts_with("fixed-time 1s ")),
        "{out}"
    );
}

/// A number field of the JSON object of `policy` in the replay's
/// `--json` output (one flat object per row).
fn json_field(out: &str, policy: &str, field: &str) -> f64 {
    let key = format!("\"policy\":\"{policy}\",");
    let row = out
        .split("},{")
        .find(|o| o.contains(&key))
        .unwrap_or_else(|| panic!("no row {policy}:\n{out}"));
    let at = row
        .find(&format!("\"{field}\":"))
        .unwrap_or_else(|| panic!("no {field} in {row}"))
        + field.len()
        + 3;
    let end = row[at..]
        .find([',', '}', ']'])
        .map_or(row.len(), |e| at + e);
    row[at..end].trim().parse().unwrap()
}

/// `--gc-threshold` on the shipped training trace: below the device's or
/// the limit's fraction, idle blocks go back before the pool grows, so the
/// peak reserved falls and the evictions rise, and nothing fails.
#[test]
fn a_gc_threshold_lowers_the_peak_and_evicts_on_the_training_trace() {
    let training = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("traces/training.csv")
        .display()
        .to_string();
    for (bound, value, fraction) in [("--capacity", "6GiB", "0.8"), ("--limit", "8GiB", "0.7")] {
        let o = run(&[
            "replay",
            &training,
            "--json",
            "--ttl",
            "1s",
            bound,
            value,
            "--gc-threshold",
            &format!("none,{fraction}"),
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let out = stdout(&o);
        let limit = if bound == "--limit" {
            ", limit 8.00 GiB"
        } else {
            ""
        };
        for policy in ["keep-all", "fixed-time 1s"] {
            let base = if policy == "keep-all" {
                // The baseline's keep-all: no limit.
                policy.to_string()
            } else {
                format!("{policy}{limit}")
            };
            let gc = format!("{policy}{limit}, gc {fraction}");
            let f = |name: &str, field| json_field(&out, name, field);
            assert!(
                f(&gc, "peak_reserved_bytes") < f(&base, "peak_reserved_bytes"),
                "{bound} {value}: {gc} against {base}:\n{out}"
            );
            assert!(
                f(&gc, "evictions") > f(&base, "evictions"),
                "{bound} {value}: {gc} against {base}:\n{out}"
            );
            assert_eq!(f(&gc, "failures"), 0.0, "{gc}");
        }
    }
    // Without a limit or a capacity there is nothing to take a fraction
    // of: the rows are the baseline's.
    let o = run(&["replay", &training, "--json", "--gc-threshold", "0.5"]);
    let out = stdout(&o);
    assert_eq!(
        json_field(&out, "keep-all, gc 0.5", "peak_reserved_bytes"),
        json_field(&out, "keep-all", "peak_reserved_bytes")
    );
}

#[test]
fn the_pickle_replays_to_the_rows_of_its_csv_conversion() {
    // The pickle is the project's shared folder's (not shipped); the CSV
    // converted from it is the shipped inference.csv.
    let Some(pickle) = shared("pytorch_cs336_medium_ctx128_inference.pickle") else {
        return;
    };
    let csv = PathBuf::from(shipped());
    let a = run(&["replay", pickle.to_str().unwrap()]);
    let b = run(&["replay", csv.to_str().unwrap()]);
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    // Everything but the first two lines (the file's name and kind).
    let rows = |o: &Output| {
        stdout(o)
            .lines()
            .skip(2)
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(rows(&a), rows(&b));
    assert!(stdout(&a).contains("PyTorch snapshot pickle, 1280 allocations, 1280 frees"));

    // convert writes the native format, which replays the same again.
    let out =
        std::env::temp_dir().join(format!("decaying-pool-cli-{}-conv.csv", std::process::id()));
    let c = run(&[
        "convert",
        pickle.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(c.status.code(), Some(0), "{}", stderr(&c));
    assert!(
        std::fs::read_to_string(&out)
            .unwrap()
            .starts_with("time_ns,action,addr,size\n")
    );
    let n = run(&["replay", out.to_str().unwrap()]);
    let _ = std::fs::remove_file(&out);
    assert_eq!(rows(&n), rows(&b));
}

#[test]
fn a_missing_file_is_named_with_exit_code_2() {
    let o = run(&["replay", "no/such/trace.csv"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.starts_with("decaying-pool: cannot open no/such/trace.csv: "),
        "{e}"
    );
}

#[test]
fn bad_numbers_are_rejected_with_exit_code_2() {
    for (args, want) in [
        (
            vec!["--capacity", "-1GiB"],
            "--capacity: \"-1GiB\" is not a size with a unit",
        ),
        (
            vec!["--capacity", "8 parsecs"],
            "--capacity: \"8 parsecs\" is not a size with a unit",
        ),
        (vec!["--capacity", "nanG"], "is not a size with a unit"),
        (vec!["--limit", "1e30T"], "is not a size with a unit"),
        (
            vec!["--capacity", "0M"],
            "a capacity of 0 bytes holds nothing",
        ),
        (
            vec!["--gap", "NaN"],
            "--gap: \"NaN\" is not a non-negative number of milliseconds",
        ),
        (vec!["--gap", "inf"], "--gap: \"inf\" is not a non-negative"),
        (vec!["--gap", "1e400s"], "`1e400` is not a finite number"),
        (vec!["--reaper", "-5ms"], "is negative"),
        (
            vec!["--ttl", "10ms,abc"],
            "--ttl: \"abc\" is not a non-negative number",
        ),
        (vec!["--ttl", "10 parsecs"], "unknown time unit `parsecs`"),
        (
            vec!["--repeat", "0"],
            "--repeat: \"0\" is not a whole number of passes",
        ),
        (
            vec!["--size-class", "pow3"],
            "expected exact, pow2, pow2/K or xSIZE",
        ),
        (vec!["--packing", "bogus=1"], "unknown packing key `bogus`"),
        (
            vec!["--gc-threshold", "0"],
            "`0` is not a fraction in (0, 1] (such as 0.8) or `none`",
        ),
        (vec!["--gc-threshold", "1.5"], "is not a fraction in (0, 1]"),
        (vec!["--gc-threshold", "NaN"], "is not a fraction in (0, 1]"),
        (vec!["--budget", "-2x"], "is negative"),
        (vec!["--costs", "a100"], "invalid value 'a100' for '--costs"),
        (
            vec!["--costs", "mmap"],
            "[possible values: published, h200, h100, host]",
        ),
    ] {
        let mut a = vec!["replay", "--json"];
        a.extend(&args);
        let o = run(&a);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).is_empty());
    }
}

/// A bare number means no one size in every size option, so each refuses
/// it, with exit code 2 and a message naming the option and the units;
/// with a unit each reads the same bytes.
#[test]
fn every_size_option_refuses_a_bare_number_and_takes_units() {
    for (args, option) in [
        (vec!["--capacity", "3"], "--capacity"),
        (vec!["--capacity", "0"], "--capacity"),
        (vec!["--capacity", "40M,80"], "--capacity"),
        (vec!["--limit", "3"], "--limit"),
        (vec!["--limit", "none,40"], "--limit"),
        (vec!["--budget", "3"], "--budget"),
        (vec!["--size-class", "x512"], "--size-class xSIZE"),
        (vec!["--packing", "medium=128"], "--packing medium"),
        (
            vec!["--packing", "growth=4,granularity=512"],
            "--packing granularity",
        ),
    ] {
        let t = shipped();
        let mut a = vec!["replay", "--json", &t];
        a.extend(&args);
        let o = run(&a);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        let want = format!("{option}: \"");
        assert!(e.contains(&want), "{args:?}: {e}");
        for unit in [
            "is not a size with a unit",
            "KiB, MiB, GiB",
            "a bare number is refused",
        ] {
            assert!(e.contains(unit), "{args:?}: {e}");
        }
        assert!(stdout(&o).is_empty());
    }
    // The same bytes in any unit give the same replay (the value's text,
    // which names a packed row, set aside).
    let output = |extra: &[&str]| {
        let t = shipped();
        let mut v = vec!["replay", "--ttl", "1s", &t];
        v.extend(extra);
        let o = run(&v);
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {}", stderr(&o));
        // Column widths follow the names: compare the words.
        let out = stdout(&o).replace(extra[1], "VALUE");
        out.split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let same = |a: &[&str], b: &[&str]| assert_eq!(output(a), output(b), "{a:?} vs {b:?}");
    same(&["--capacity", "40MiB"], &["--capacity", "40m"]);
    same(&["--capacity", "0.5GiB"], &["--capacity", "512MB"]);
    same(&["--limit", "40MiB"], &["--limit", "41943040B"]);
    same(&["--limit", "40960KiB"], &["--limit", "40 M"]);
    same(&["--budget", "68MiB"], &["--budget", "69632k"]);
    same(&["--size-class", "x2MiB"], &["--size-class", "x2097152B"]);
    same(
        &["--packing", "medium=4MiB"],
        &["--packing", "medium=4096KiB"],
    );
    assert_ne!(
        output(&["--packing", "medium=4MiB"]),
        output(&["--packing", "medium=1MiB"])
    );
    // Units change the figures they should.
    let o = run(&[
        "replay",
        &shipped(),
        "--ttl",
        "1s",
        "--limit",
        "40MiB",
        "--capacity",
        "1TiB",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o)
            .lines()
            .any(|l| l.starts_with("fixed-time 1s, limit 40.0 MiB ")),
        "{}",
        stdout(&o)
    );
    let o = run(&["replay", &shipped(), "--size-class", "x2MiB"]);
    assert!(
        stdout(&o).contains("fixed-time 1s, x2097152 "),
        "{}",
        stdout(&o)
    );
    let o = run(&["replay", &shipped(), "--budget", "40MiB"]);
    assert!(
        stdout(&o).contains("recommendation (peak reserved within 40.0 MiB"),
        "{}",
        stdout(&o)
    );
}

/// `--costs host` charges the host mmap model's measured figures (mmap +
/// first touch, munmap), which differ from the CUDA ones, keeps the
/// counts, and says what it charged.
#[test]
fn costs_host_charges_the_measured_mmap_figures() {
    use decaying_pool::trace::CostModel;
    let t = Scratch::new(
        "host-costs.csv",
        "time_ns,action,addr,size\n0,alloc,0x10,4096\n10,free,0x10,4096\n\
         20,alloc,0x20,1048576\n30,free,0x20,1048576\n40,alloc,0x30,67108864\n50,free,0x30,67108864\n",
    );
    let json = |extra: &[&str]| {
        let mut a = vec!["replay", "--json", t.path()];
        a.extend(extra);
        let o = run(&a);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let out = stdout(&o);
        let i = out.find("\"modelled_backing_seconds\":").unwrap() + 27;
        let first: f64 = out[i..].split([',', '}']).next().unwrap().parse().unwrap();
        let i = out.find("\"backing_allocs\":").unwrap() + 17;
        let allocs: u64 = out[i..].split([',', '}']).next().unwrap().parse().unwrap();
        (first, allocs)
    };
    let charged = |m: CostModel| {
        [4096, 1 << 20, 64 << 20]
            .iter()
            .map(|&s| (m.alloc_cost(s) + m.free_cost(s)).as_secs_f64())
            .sum::<f64>()
    };
    let (host, host_nopool) = json(&["--costs", "host"]);
    let (cuda, cuda_nopool) = json(&[]);
    assert!((host - charged(CostModel::host())).abs() < 1e-9, "{host}");
    assert!((cuda - charged(CostModel::cuda())).abs() < 1e-9, "{cuda}");
    // 64 MiB of pages touched for the first time cost far more than a
    // cudaMalloc of 64 MiB.
    assert!(host > 10.0 * cuda, "{host} vs {cuda}");
    assert_eq!((host_nopool, cuda_nopool), (3, 3));
    let o = run(&["replay", t.path(), "--costs", "host"]);
    let out = stdout(&o);
    assert!(
        out.contains("backing allocator calls (mmap / munmap)"),
        "{out}"
    );
    assert!(out.contains("first touch of every page / munmap"), "{out}");
    let o = run(&["replay", "--help"]);
    assert!(
        stdout(&o).contains("`host` (a host mmap allocator"),
        "{}",
        stdout(&o)
    );
}

/// The repository's root and its documents: the README, then every guide
/// of `docs/` in name order, then `extra`; `None` outside a checkout (the
/// packaged tool crate has no repository around it).
fn documents(extra: &[&str]) -> Option<(std::path::PathBuf, Vec<String>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let Ok(guides) = std::fs::read_dir(root.join("docs")) else {
        eprintln!("skipped: docs/ is absent (not in a checkout)");
        return None;
    };
    let mut guides: Vec<String> = guides
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    guides.sort();
    assert!(guides.len() >= 4, "docs/ holds {guides:?}");
    let mut docs = vec!["README.md".to_owned()];
    docs.extend(guides);
    docs.extend(extra.iter().map(|d| (*d).to_owned()));
    Some((root, docs))
}

/// Every `replay <path>` of the README's and the guides' command lines
/// names a file of the repository, so that the commands run in a fresh
/// clone.
#[test]
fn every_readme_replay_path_exists_in_the_repository() {
    let mut checked = 0;
    // The front page, every guide of `docs/` and the benches' notes.
    let Some((root, docs)) = documents(&["benches/README.md"]) else {
        return;
    };
    for doc in &docs {
        let Ok(text) = std::fs::read_to_string(root.join(doc)) else {
            eprintln!("skipped: {doc} is absent (not in a checkout)");
            return;
        };
        // The lines of the code block so far: a file that an earlier
        // command of the block, not a replay, names (`> serving1.csv`,
        // `--example record_threads -- threads.csv`) is one it writes.
        let mut block: Vec<&str> = Vec::new();
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                block.clear();
            }
            block.push(line);
            let Some(i) = line.find("cargo run") else {
                continue;
            };
            let earlier = &block[..block.len() - 1];
            let words: Vec<&str> = line[i..]
                .split('#')
                .next()
                .unwrap()
                .split_whitespace()
                .map(|w| w.trim_matches(|c| matches!(c, '`' | '(' | ')' | ',' | ';' | '"')))
                .collect();
            let Some(r) = words.iter().position(|&w| w == "replay") else {
                continue;
            };
            let mut rest = words[r + 1..].iter();
            while let Some(&w) = rest.next() {
                if w.starts_with("--") {
                    // An option's value (every replay option but these
                    // flags takes one, as a separate word here).
                    if !["--json", "--strict"].contains(&w) && !w.contains('=') {
                        rest.next();
                    }
                } else if w.ends_with(".csv") || w.ends_with(".pickle") || w.contains('/') {
                    if earlier
                        .iter()
                        .any(|l| l.contains(w) && !l.contains(" replay "))
                    {
                        continue;
                    }
                    assert!(
                        !Path::new(w)
                            .components()
                            .any(|c| c == std::path::Component::ParentDir),
                        "{doc}: `{}` names {w}, outside the repository",
                        line.trim()
                    );
                    assert!(
                        root.join(w).is_file(),
                        "{doc}: `{}` names {w}, absent from the repository",
                        line.trim()
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 8, "only {checked} replay paths found");
}

/// Every file the README and the guides name in backquotes (a path with a
/// directory and a source or data extension) is a file of the
/// repository: the path itself, or the end of one (`group/sse2.rs` where
/// the text is about `src/store/fixed/`).
#[test]
fn the_guides_name_files_that_exist() {
    let Some((root, docs)) = documents(&[]) else {
        return;
    };
    let mut files = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = e.path();
            let name = e.file_name();
            if name == "target" || name == ".git" || name == "corpus" {
                continue;
            }
            if path.is_dir() {
                dirs.push(path);
            } else if let Ok(rel) = path.strip_prefix(&root) {
                files.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let extensions = [".rs", ".py", ".sh", ".csv", ".md", ".toml", ".h", ".patch"];
    let (mut checked, mut missing) = (0, Vec::new());
    for doc in &docs {
        let text = std::fs::read_to_string(root.join(doc)).expect("a guide reads");
        for (n, line) in text.lines().enumerate() {
            for quoted in line.split('`').skip(1).step_by(2) {
                let named = quoted.trim();
                let is_path = named.contains('/')
                    && !named.contains(char::is_whitespace)
                    && !named.starts_with("../")
                    && !named.starts_with('/')
                    && extensions.iter().any(|x| named.ends_with(x));
                if !is_path {
                    continue;
                }
                checked += 1;
                let found = files
                    .iter()
                    .any(|f| f == named || f.ends_with(&format!("/{named}")));
                if !found {
                    missing.push(format!("{doc}:{}: `{named}`", n + 1));
                }
            }
        }
    }
    assert!(missing.is_empty(), "named but absent: {missing:#?}");
    assert!(checked >= 20, "only {checked} file names found");
}

/// Every replay output that the README and the guides show (a ```text
/// block opening with `== `, the tool's first line) is what the replay
/// command before it in the same document prints, line for line: a
/// change to the tool or the pool that changes the figures fails here
/// until the documents show the new ones.
#[test]
fn the_guides_show_what_their_replay_commands_print() {
    let Some((root, docs)) = documents(&[]) else {
        return;
    };
    let mut checked = 0;
    for doc in &docs {
        let Ok(text) = std::fs::read_to_string(root.join(doc)) else {
            eprintln!("skipped: {doc} is absent (not in a checkout)");
            return;
        };
        let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
        let mut command: Option<Vec<String>> = None;
        let mut i = 0;
        while i < lines.len() {
            let line = lines[i];
            if let Some(at) = line.find("-p decaying-pool-cli -- replay ") {
                let args = &line[at + "-p decaying-pool-cli -- ".len()..];
                let args = args.split('#').next().unwrap_or_default();
                command = Some(args.split_whitespace().map(str::to_owned).collect());
            }
            let shows_a_replay =
                line == "```text" && lines.get(i + 1).is_some_and(|l| l.starts_with("== "));
            if !shows_a_replay {
                i += 1;
                continue;
            }
            let end = i
                + 1
                + lines[i + 1..]
                    .iter()
                    .position(|l| l.starts_with("```"))
                    .unwrap_or_else(|| {
                        panic!("{doc}: a ```text block at line {} is not closed", i + 1)
                    });
            let shown = &lines[i + 1..end];
            let args = command
                .as_ref()
                .unwrap_or_else(|| panic!("{doc}: no replay command before line {}", i + 1));
            let o = Command::new(env!("CARGO_BIN_EXE_decaying-pool"))
                .args(args)
                .current_dir(&root)
                .output()
                .expect("the binary runs");
            assert!(o.status.success(), "{doc}: {args:?}: {}", stderr(&o));
            let out = stdout(&o);
            let printed: Vec<&str> = out.lines().map(str::trim_end).collect();
            let printed = &printed[..printed.len() - usize::from(printed.last() == Some(&""))];
            if printed != shown {
                let first = printed
                    .iter()
                    .zip(shown)
                    .position(|(a, b)| a != b)
                    .unwrap_or(printed.len().min(shown.len()));
                panic!(
                    "{doc}, line {}: the block shows what `{}` no longer prints; \
                     first difference at its line {}:\n  shown:   {:?}\n  printed: {:?}\n\
                     the whole output:\n{out}",
                    i + 1,
                    args.join(" "),
                    first + 1,
                    shown.get(first),
                    printed.get(first),
                );
            }
            checked += 1;
            i = end + 1;
        }
    }
    assert!(
        checked >= 3,
        "only {checked} replay outputs found in {docs:?}"
    );
}

/// `--costs h200` and `--costs h100` charge the measured curves,
/// `published` (the default) the published ones; the counts do not depend
/// on the costs.
#[test]
fn costs_choose_the_model_and_keep_the_counts() {
    use decaying_pool::trace::CostModel;
    let t = Scratch::new(
        "costs.csv",
        "time_ns,action,addr,size\n0,alloc,0x10,1000000\n10,free,0x10,1000000\n\
         20,alloc,0x20,64000000\n30,free,0x20,64000000\n",
    );
    // The first configuration's (no pool: every request a backing call).
    let first = |out: &str, key: &str| -> f64 {
        let i = out.find(key).unwrap_or_else(|| panic!("no {key} in {out}")) + key.len();
        out[i..].split([',', '}']).next().unwrap().parse().unwrap()
    };
    let replay = |costs: &[&str]| {
        let mut a = vec!["replay", "--json", t.path()];
        a.extend(costs);
        let o = run(&a);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let out = stdout(&o);
        (
            first(&out, "\"modelled_backing_seconds\":"),
            first(&out, "\"backing_allocs\":"),
            out,
        )
    };
    let charged = |m: CostModel| {
        [1_000_000, 64_000_000]
            .iter()
            .map(|&s| (m.alloc_cost(s) + m.free_cost(s)).as_secs_f64())
            .sum::<f64>()
    };
    let (published, allocs, _) = replay(&[]);
    let (h200, h200_allocs, h200_out) = replay(&["--costs", "h200"]);
    assert!(
        (published - charged(CostModel::cuda())).abs() < 1e-9,
        "{published}"
    );
    assert!((h200 - charged(CostModel::h200())).abs() < 1e-9, "{h200}");
    assert!(h200 * 10.0 < published, "{h200} vs {published}");
    assert_eq!((allocs, h200_allocs), (2.0, 2.0));
    assert_eq!(replay(&["--costs", "published"]).2, replay(&[]).2);
    assert_ne!(h200_out, replay(&[]).2);
    let o = run(&["replay", t.path(), "--costs", "h200"]);
    assert!(
        stdout(&o).contains("measured on an idle H200"),
        "{}",
        stdout(&o)
    );
    let (h100, h100_allocs, h100_out) = replay(&["--costs", "h100"]);
    assert!((h100 - charged(CostModel::h100())).abs() < 1e-9, "{h100}");
    assert!(h100 * 10.0 < published, "{h100} vs {published}");
    assert_ne!(h100, h200);
    assert_eq!(h100_allocs, 2.0);
    assert_ne!(h100_out, h200_out);
    let o = run(&["replay", t.path(), "--costs", "h100"]);
    assert!(
        stdout(&o).contains("measured on an idle H100"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn malformed_rows_name_the_file_and_line() {
    let t = Scratch::new(
        "bad.csv",
        "time_ns,action,addr,size\n0,alloc,0x10,64\n5,alloc,zz,64\n",
    );
    let svg = format!("{}.svg", t.path());
    let o = run(&["replay", t.path(), "--svg", &svg]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.starts_with(&format!("decaying-pool: {}: line 3: ", t.path())),
        "{e}"
    );
    assert!(e.contains("addr"), "{e}");
    // The output opened before the replay is not left behind empty.
    assert!(!Path::new(&svg).exists(), "{svg} was left behind");

    let t = Scratch::new("header.csv", "a,b,c\n");
    let o = run(&["replay", t.path()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(&format!("{}: line 1: unknown header", t.path())),
        "{}",
        stderr(&o)
    );
}

#[test]
fn time_going_backwards_is_reported() {
    let t = Scratch::new(
        "back.csv",
        "time_ns,action,addr,size\n100,alloc,0x10,64\n200,free,0x10,64\n150,alloc,0x20,64\n",
    );
    let o = run(&["replay", t.path()]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o).trim_end(),
        format!(
            "decaying-pool: {}: line 4: time goes backwards: 150 ns after 200 ns",
            t.path()
        )
    );
}

#[test]
fn a_file_that_is_not_a_snapshot_pickle_is_named() {
    // pickle.dumps([1, 2], protocol=2)
    let p = std::env::temp_dir().join(format!(
        "decaying-pool-cli-{}-list.pickle",
        std::process::id()
    ));
    std::fs::write(&p, b"\x80\x02]q\x00(K\x01K\x02e.").unwrap();
    let o = run(&["replay", p.to_str().unwrap()]);
    let _ = std::fs::remove_file(&p);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o).trim_end(),
        format!(
            "decaying-pool: {}: not a PyTorch memory snapshot: the pickle is not a dict",
            p.display()
        )
    );
}

#[test]
fn an_unwritable_output_fails_before_the_replay() {
    for opt in ["--svg", "--chrome-trace"] {
        let o = run(&["replay", &shipped(), opt, "/nonexistent-dir/out.svg"]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(
            stderr(&o).starts_with("decaying-pool: cannot write /nonexistent-dir/out.svg: "),
            "{}",
            stderr(&o)
        );
        assert!(stdout(&o).is_empty(), "the replay ran: {}", stdout(&o));
    }
    let o = run(&["convert", &shipped(), "-o", "/nonexistent-dir/out.csv"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot write /nonexistent-dir/out.csv"));
}

#[test]
fn device_and_stream_select_rows() {
    let t = Scratch::new(
        "devices.csv",
        "device,time_us,action,addr,size,stream\n\
         0,1,alloc,0x10,4096,0\n\
         1,2,alloc,0x20,8192,0\n\
         1,3,alloc,0x30,8192,5\n\
         0,4,free_completed,0x10,4096,0\n\
         1,5,free_completed,0x20,8192,0\n\
         1,6,free_completed,0x30,8192,5\n",
    );
    let allocs = |args: &[&str]| {
        let mut a = vec!["replay", "--json", t.path()];
        a.extend(args);
        let o = run(&a);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let out = stdout(&o);
        let i = out.find("\"allocs\":").expect("an allocs field") + 9;
        out[i..].split(',').next().unwrap().parse::<u64>().unwrap()
    };
    assert_eq!(allocs(&[]), 1); // the first device seen: 0
    assert_eq!(allocs(&["--device", "1"]), 2);
    assert_eq!(allocs(&["--device", "1", "--stream", "5"]), 1);
    // A selection that leaves nothing says so, on the description line
    // and as a warning; one that selects rows does not.
    let o = run(&["replay", t.path(), "--device", "1"]);
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
    let o = run(&["replay", t.path(), "--device", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let why = "no allocation on device 2 (6 rows of other devices skipped";
    assert!(
        stderr(&o).contains(&format!("warning: {}: {why}", t.path())),
        "{}",
        stderr(&o)
    );
    assert!(
        stdout(&o).contains(&format!("0 allocations, 0 frees: {why}")),
        "{}",
        stdout(&o)
    );
    let o = run(&["replay", t.path(), "--stream", "9"]);
    assert!(
        stderr(&o).contains("no allocation on stream 9 (6 rows of other streams skipped)"),
        "{}",
        stderr(&o)
    );
    let out = Scratch::new("devices-converted.csv", "");
    let o = run(&["convert", t.path(), "--device", "2", "-o", out.path()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains(why), "{}", stderr(&o));
    let o = run(&["replay", t.path(), "--stream", "five"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("`five` is not a stream number"),
        "{}",
        stderr(&o)
    );
}

/// A reader that goes away (`| head`) ends the output quietly; a full
/// disk is a failure that says so.
#[test]
fn output_that_cannot_be_written_ends_cleanly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_decaying-pool"))
        .args(["replay", &shipped()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the binary runs");
    // The replay takes a while before it writes: the pipe is closed by
    // then.
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    if cfg!(target_os = "linux") {
        let o = Command::new(env!("CARGO_BIN_EXE_decaying-pool"))
            .args(["replay", "--json", &shipped()])
            .stdout(std::fs::File::create("/dev/full").unwrap())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1));
        assert!(
            stderr(&o).contains("cannot write the results: No space left on device"),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn unknown_options_are_usage_errors() {
    let o = run(&["replay", "--frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--frobnicate"));
}

/// `--spare-ttl` on the mapped row: two passes of the training trace with
/// 3 s between them; with 1s its pages go back in the gap and are made
/// again, with `never` (or the default, 10 s, longer than the gap) none
/// goes back; a bad time is refused.
#[test]
fn spare_ttl_sets_how_long_the_mapped_rows_pages_are_kept() {
    let training = shipped().replace("inference.csv", "training.csv");
    let released = |extra: &[&str]| {
        let mut args = vec![
            "replay", &training, "--json", "--repeat", "2", "--gap", "3s",
        ];
        args.extend_from_slice(extra);
        let o = run(&args);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let out = stdout(&o);
        (
            json_field(&out, "mapped", "pages_created"),
            json_field(&out, "mapped", "pages_released"),
        )
    };
    let (made, gone) = released(&["--spare-ttl", "1s"]);
    assert!(gone > 0.0 && made > gone, "{made} made, {gone} released");
    let (made_never, gone_never) = released(&["--spare-ttl", "never"]);
    assert_eq!(gone_never, 0.0);
    assert_eq!(made_never, made - gone, "the pages of one pass, made once");
    assert_eq!(released(&[]), (made_never, 0.0));
    let o = run(&["replay", &training, "--spare-ttl", "soon"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}
