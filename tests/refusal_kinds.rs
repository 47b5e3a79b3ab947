//! The crate files each refusal under a kind that says what went wrong, and what it believes
//! impossible as `Error::Internal`: `Refusal::Other` is left to code outside the crate. The
//! table in docs/design/architecture.md ("Refusals: which operation files which kind") names the
//! kinds each file builds, and stays true.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn walk(dir: &Path, out: &mut Vec<(String, usize, String)>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).expect("a source file");
            // Unit tests may build an `Other` refusal on purpose (error.rs's own tests).
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            for (i, line) in code.lines().enumerate() {
                if line.contains("Refusal::Other") && !line.contains("Refusal::OtherDevice") {
                    out.push((path.display().to_string(), i + 1, line.trim().to_string()));
                }
            }
        }
    }
}

#[test]
fn the_crate_files_no_refusal_as_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    if !src.is_dir() {
        // A test binary carried away from its checkout (the GPU bundle): a source check has
        // nothing to read there; `cargo test` runs it where the sources are.
        println!("no sources at {}: skipped", src.display());
        return;
    }
    let mut found = Vec::new();
    walk(&src, &mut found);
    // The kind's own documentation names it.
    found.retain(|(_, _, line)| !line.starts_with("///") && !line.starts_with("//!"));
    assert!(
        found.is_empty(),
        "Refusal::Other built in the crate (use a kind that says what went wrong, or Error::Internal for what cannot happen): {found:#?}"
    );
}

/// The kinds each source file builds (`Refusal::Kind` outside comments and unit tests).
fn kinds_built(dir: &Path, root: &Path, out: &mut BTreeMap<String, BTreeSet<String>>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            kinds_built(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            let rel = path
                .strip_prefix(root)
                .expect("under the root")
                .display()
                .to_string();
            if rel == "src/error.rs" {
                continue; // defines the kinds
            }
            let text = std::fs::read_to_string(&path).expect("a source file");
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for (i, _) in line.match_indices("Refusal::") {
                    let kind: String = line[i + "Refusal::".len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric())
                        .collect();
                    if kind.starts_with(|c: char| c.is_ascii_uppercase()) {
                        out.entry(rel.clone()).or_default().insert(kind);
                    }
                }
            }
        }
    }
}

/// The table's rows: `| `file` | operations | Kind, Kind |`.
fn table(doc: &str) -> BTreeMap<String, BTreeSet<String>> {
    let section = doc
        .split("## Refusals: which operation files which kind")
        .nth(1)
        .expect("architecture.md has the section on refusals");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut rows = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `src/")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // ["", "`file`", "operations", "kinds", ""]
        assert!(cells.len() >= 5, "a row of three cells: {line}");
        let file = cells[1].trim_matches('`').to_string();
        let kinds = cells[cells.len() - 2]
            .split(',')
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect();
        assert!(
            rows.insert(file.clone(), kinds).is_none(),
            "{file} has two rows"
        );
    }
    rows
}

#[test]
fn the_refusal_table_names_every_kind_each_file_builds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (src, doc) = (root.join("src"), root.join("docs/design/architecture.md"));
    if !src.is_dir() || !doc.is_file() {
        println!("no sources at {}: skipped", src.display());
        return;
    }
    let mut built = BTreeMap::new();
    kinds_built(&src, root, &mut built);
    let listed = table(&std::fs::read_to_string(&doc).expect("architecture.md"));
    let mut wrong = Vec::new();
    for (file, kinds) in &built {
        match listed.get(file) {
            None => wrong.push(format!("{file} builds {kinds:?} and has no row")),
            Some(row) if row != kinds => {
                wrong.push(format!("{file} builds {kinds:?}, its row names {row:?}"))
            }
            Some(_) => {}
        }
    }
    for file in listed.keys().filter(|f| !built.contains_key(*f)) {
        wrong.push(format!("{file} has a row but builds no refusal"));
    }
    assert!(
        wrong.is_empty(),
        "docs/design/architecture.md's table of refusals is out of date:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_table_reader_sees_a_missing_kind() {
    let doc = "## Refusals: which operation files which kind\n\n| file | operations | kinds |\n\
               | --- | --- | --- |\n| `src/a.rs` | `f`, `g` | Size, Order |\n\n## Next\n| `src/b.rs` | x | Size |\n";
    let rows = table(doc);
    assert_eq!(rows.len(), 1, "rows after the section are not read");
    let kinds: Vec<&str> = rows["src/a.rs"].iter().map(String::as_str).collect();
    assert_eq!(kinds, ["Order", "Size"]);
}
