//! The machine-checkable parts of the docs: every test that docs/invariants.md cites exists
//! (a `Tests:` paragraph per invariant, listing `path::function` items), and every relative
//! link in the repository's Markdown points at a file, and heading, that exists.

use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// Whether `src` defines a function `name` (`fn name(`, `fn name<`, ...; not a longer name).
fn defines_fn(src: &str, name: &str) -> bool {
    let pat = format!("fn {name}");
    src.match_indices(&pat).any(|(i, _)| {
        src[i + pat.len()..]
            .chars()
            .next()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
    })
}

/// The `## ` sections of a Markdown text: (heading, body lines).
fn sections(text: &str) -> Vec<(String, Vec<&str>)> {
    let mut out: Vec<(String, Vec<&str>)> = Vec::new();
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            out.push((h.trim().to_string(), Vec::new()));
        } else if let Some(s) = out.last_mut() {
            s.1.push(line);
        }
    }
    out
}

/// The text between backticks, in order.
fn backticked(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Every problem with the invariants document `text`, cited files read from under `root`:
/// an invariant without exactly one `Tests:` paragraph, a numbered or repeated name, a
/// citation not of the form `path.rs::name`, a cited file that does not exist or does not
/// define that function.
fn check_invariants(text: &str, root: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    let all = sections(text);
    if all.is_empty() {
        errors.push("no invariants (no `## ` sections)".to_string());
    }
    let mut names = std::collections::BTreeSet::new();
    for (name, body) in &all {
        if name.starts_with(|c: char| c.is_ascii_digit()) || !names.insert(name.clone()) {
            errors.push(format!(
                "{name:?}: an invariant needs a unique name, not a number"
            ));
        }
        let starts: Vec<usize> = (0..body.len())
            .filter(|&i| body[i].starts_with("Tests:"))
            .collect();
        if starts.len() != 1 {
            errors.push(format!(
                "{name:?}: {} `Tests:` paragraphs (want one)",
                starts.len()
            ));
            continue;
        }
        let para: Vec<&str> = body[starts[0]..]
            .iter()
            .take_while(|l| !l.trim().is_empty())
            .copied()
            .collect();
        let para = para.join(" ");
        if para.starts_with("Tests: none") {
            continue;
        }
        let items = backticked(&para);
        if items.is_empty() {
            errors.push(format!(
                "{name:?}: `Tests:` cites no test (or say `Tests: none`)"
            ));
        }
        for item in items {
            let Some((path, func)) = item
                .split_once(".rs::")
                .map(|(p, f)| (format!("{p}.rs"), f))
            else {
                errors.push(format!("{name:?}: {item:?} is not `path.rs::function`"));
                continue;
            };
            if func.is_empty() || !func.chars().all(|c| c.is_alphanumeric() || c == '_') {
                errors.push(format!("{name:?}: {item:?} is not `path.rs::function`"));
                continue;
            }
            match fs::read_to_string(root.join(&path)) {
                Ok(src) if defines_fn(&src, func) => {}
                Ok(_) => errors.push(format!("{name:?}: {path} has no `fn {func}`")),
                Err(e) => errors.push(format!("{name:?}: {path}: {e}")),
            }
        }
    }
    errors
}

#[test]
fn every_test_the_invariants_cite_exists() {
    let root = root();
    let text = fs::read_to_string(root.join("docs/invariants.md")).expect("docs/invariants.md");
    let errors = check_invariants(&text, &root);
    assert!(
        errors.is_empty(),
        "docs/invariants.md:\n{}",
        errors.join("\n")
    );
}

#[test]
fn a_citation_of_a_missing_test_is_reported() {
    let root = root();
    let good = "## Named\n\nStatement.\n\nTests: `crates/cli/tests/docs.rs::a_citation_of_a_missing_test_is_reported`\n";
    assert_eq!(check_invariants(good, &root), Vec::<String>::new());
    for bad in [
        // A function that does not exist, one that only prefixes an existing name, a file
        // that does not exist, no citation, a malformed one, a number for a name.
        "## Named\n\nTests: `crates/cli/tests/docs.rs::no_such_test`\n",
        "## Named\n\nTests: `crates/cli/tests/docs.rs::a_citation_of_a_missing`\n",
        "## Named\n\nTests: `crates/cli/tests/nope.rs::root`\n",
        "## Named\n\nStatement only.\n",
        "## Named\n\nTests: `docs.rs`\n",
        "## 3. Numbered\n\nTests: `crates/cli/tests/docs.rs::root`\n",
    ] {
        assert_eq!(check_invariants(bad, &root).len(), 1, "{bad}");
    }
}

/// GitHub's anchor for a heading: lower case, spaces to hyphens, other punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.push(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// Relative link targets of a Markdown text (`[text](target)`, outside code blocks and code
/// spans), without any title.
fn links(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans are odd pieces of a split on backticks.
        for (i, piece) in line.split('`').enumerate() {
            if i % 2 == 1 {
                continue;
            }
            for (at, _) in piece.match_indices("](") {
                let rest = &piece[at + 2..];
                if let Some(end) = rest.find(')') {
                    let target = rest[..end].split_whitespace().next().unwrap_or("");
                    if !target.is_empty()
                        && !target.starts_with("http://")
                        && !target.starts_with("https://")
                        && !target.starts_with("mailto:")
                    {
                        out.push(target.to_string());
                    }
                }
            }
        }
    }
    out
}

fn markdown_files(dir: &Path, recurse: bool, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() && recurse {
            markdown_files(&p, true, out);
        } else if p.extension().is_some_and(|e| e == "md") {
            out.push(p);
        }
    }
}

#[test]
fn relative_links_in_the_docs_resolve() {
    let root = root();
    let mut files = Vec::new();
    markdown_files(&root, false, &mut files);
    markdown_files(&root.join("docs"), true, &mut files);
    let mut errors = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("markdown file");
        for target in links(&text) {
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().expect("parent").join(path)
            };
            let shown = file
                .strip_prefix(&root)
                .unwrap_or(file)
                .display()
                .to_string();
            if !dest.exists() {
                errors.push(format!("{shown}: {target}: no such file"));
                continue;
            }
            if let Some(a) = anchor {
                if dest.extension().is_some_and(|e| e == "md") {
                    let dest_text = fs::read_to_string(&dest).expect("link target");
                    if !anchors(&dest_text).iter().any(|h| h == a) {
                        errors.push(format!("{shown}: {target}: no such heading"));
                    }
                }
            }
        }
    }
    assert!(files.len() > 5, "found only {files:?}");
    assert!(errors.is_empty(), "broken links:\n{}", errors.join("\n"));
}
