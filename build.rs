//! Names for the CUDA version features (cudarc's binding sets, forwarded under the same names), so
//! that the source says `#[cfg(cuda_before_12_8)]` once instead of listing every feature below
//! 12.8 at each use. Adding a `cuda-*` feature means adding it to the chain here (a new newest
//! version: a `cuda_before_` alias for the one before it, and `cuda_version_chosen`).
//!
//! It also writes the guides (`docs/*.md`, `docs/design/*.md`) for rustdoc (`src/docs.rs`), with
//! their links between one another (`[text](memory.md)`, right on GitHub) turned into intra-doc
//! links to the modules that render them (`crate::docs::design::memory`): a relative `.md` link
//! names no page in rendered rustdoc. A link to a guide that does not exist becomes a path that
//! does not resolve either, which `cargo doc` with warnings denied (CI) reports.

use cfg_aliases::cfg_aliases;

/// The CUDA versions the crate has bindings for (cudarc's `cuda-*` features, forwarded under the
/// same names), oldest first. A new one is added here, to `Cargo.toml` and to the alias chain in
/// `main`.
const CUDA_VERSIONS: &[&str] = &[
    "12030", "12040", "12050", "12060", "12080", "12090", "13000", "13010", "13020", "13030",
    "13040",
];

/// The CUDA version of the bindings, as cudarc settles it: `CUDARC_CUDA_VERSION` in the
/// environment if set (cudarc reads it before its features), else the one `cuda-*` feature, else
/// with `cuda-version-from-build-system` the toolkit's (`nvcc --version`). Two sources that differ
/// would give cudarc two sets of bindings at once: refused here with one message, as are no
/// choice at all and two `cuda-*` features.
fn cuda_version() -> Result<String, String> {
    println!("cargo:rerun-if-env-changed=CUDARC_CUDA_VERSION");
    println!("cargo:rerun-if-env-changed=PATH");
    let chosen: Vec<&str> = CUDA_VERSIONS
        .iter()
        .copied()
        .filter(|v| std::env::var_os(format!("CARGO_FEATURE_CUDA_{v}")).is_some())
        .collect();
    let from_env = std::env::var("CUDARC_CUDA_VERSION").ok();
    let from_build_system =
        std::env::var_os("CARGO_FEATURE_CUDA_VERSION_FROM_BUILD_SYSTEM").is_some();
    let known = |v: &str| -> Result<String, String> {
        if CUDA_VERSIONS.contains(&v) {
            Ok(v.to_string())
        } else {
            Err(format!(
                "cuda-graph has no bindings for CUDA version {v} (it builds with {}): pick one of those",
                CUDA_VERSIONS.join(", ")
            ))
        }
    };
    match (chosen.as_slice(), from_env) {
        ([_, _, ..], _) => Err(format!(
            "cuda-graph: more than one CUDA version feature is enabled ({}): enable exactly one, the same one as for cudarc if another crate picks cudarc's",
            chosen.iter().map(|v| format!("cuda-{v}")).collect::<Vec<_>>().join(", ")
        )),
        ([v], Some(env)) if env != *v => Err(format!(
            "cuda-graph: the feature cuda-{v} and CUDARC_CUDA_VERSION={env} disagree (cudarc would build both versions' bindings): unset CUDARC_CUDA_VERSION, or set it to {v}, or enable cuda-graph's cuda-{env} instead"
        )),
        ([v], _) => Ok(v.to_string()),
        ([], Some(env)) => known(&env),
        ([], None) if from_build_system => {
            let out = std::process::Command::new("nvcc")
                .arg("--version")
                .output()
                .ok()
                .filter(|o| o.status.success())
                .ok_or("cuda-graph: the feature cuda-version-from-build-system runs `nvcc --version`, which failed: put the CUDA toolkit's bin folder on PATH, or set CUDARC_CUDA_VERSION (13000 for CUDA 13.0), or enable a cuda-* feature instead")?;
            let text = String::from_utf8_lossy(&out.stdout);
            let release = text
                .split("release ")
                .nth(1)
                .and_then(|r| r.split(',').next())
                .ok_or("cuda-graph: `nvcc --version` printed no `release X.Y`: set CUDARC_CUDA_VERSION (13000 for CUDA 13.0) or enable a cuda-* feature")?;
            let (major, minor) = release.trim().split_once('.').unwrap_or((release, "0"));
            known(&format!("{major}0{minor}0"))
        }
        ([], None) => Err(format!(
            "cuda-graph: no CUDA version chosen for the driver bindings. Enable exactly one of the features {} (cuda-12080 is in the defaults), or cuda-version-from-build-system to follow the installed toolkit as cudarc does: the same choice as for cudarc if you depend on it too",
            CUDA_VERSIONS.iter().map(|v| format!("cuda-{v}")).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// The guides and the modules of `src/docs.rs` that render them.
const GUIDES: &[(&str, &str)] = &[
    ("GUIDE.md", "crate::docs::guide"),
    ("DEFINITION.md", "crate::docs::definitions"),
    ("FOREIGN.md", "crate::docs::foreign"),
    ("DESIGN.md", "crate::docs::design"),
    (
        "design/adding-a-node-kind.md",
        "crate::docs::design::adding_a_node_kind",
    ),
    (
        "design/architecture.md",
        "crate::docs::design::architecture",
    ),
    ("design/captures.md", "crate::docs::design::captures"),
    (
        "design/conditionals.md",
        "crate::docs::design::conditionals",
    ),
    ("design/definitions.md", "crate::docs::design::definitions"),
    ("design/destruction.md", "crate::docs::design::destruction"),
    (
        "design/host-callbacks.md",
        "crate::docs::design::host_callbacks",
    ),
    ("design/kernels.md", "crate::docs::design::kernels"),
    ("design/memory.md", "crate::docs::design::memory"),
    ("design/nccl.md", "crate::docs::design::nccl"),
    ("design/ownership.md", "crate::docs::design::ownership"),
    ("design/performance.md", "crate::docs::design::performance"),
];

/// Where a link `target` (ending in `.md`, maybe with `#fragment`) written in guide `from`
/// (a path under `docs/`) points in rustdoc.
fn rustdoc_target(from: &str, target: &str) -> String {
    let (file, fragment) = match target.split_once('#') {
        Some((f, frag)) => (f, Some(frag)),
        None => (target, None),
    };
    // Resolve `file` against `from`'s folder, `..` included.
    let mut parts: Vec<&str> = from.split('/').collect();
    parts.pop();
    for part in file.split('/') {
        match part {
            ".." => {
                parts.pop();
            }
            "." | "" => {}
            p => parts.push(p),
        }
    }
    let path = parts.join("/");
    let module = GUIDES
        .iter()
        .find(|(f, _)| *f == path)
        .map(|(_, m)| m.to_string())
        // No such guide: a path rustdoc cannot resolve, so `cargo doc -D warnings` fails on it.
        .unwrap_or_else(|| {
            format!(
                "crate::docs::no_such_guide::{}",
                path.replace(['/', '-', '.'], "_")
            )
        });
    match fragment {
        Some(f) => format!("{module}#{f}"),
        None => module,
    }
}

/// `text` with each `](x.md...)` link rewritten by [`rustdoc_target`].
fn rustdoc_links(from: &str, text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        out.push_str(&rest[..i + 2]);
        rest = &rest[i + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = &rest[..end];
        let is_guide = !target.contains("://")
            && !target.contains(' ')
            && (target.ends_with(".md") || target.contains(".md#"));
        if is_guide {
            out.push_str(&rustdoc_target(from, target));
        } else {
            out.push_str(target);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

fn write_guides() {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    std::fs::create_dir_all(out.join("docs/design")).expect("OUT_DIR is writable");
    for (file, _) in GUIDES {
        let src = format!("docs/{file}");
        println!("cargo:rerun-if-changed={src}");
        let text = std::fs::read_to_string(&src).unwrap_or_else(|e| panic!("{src}: {e}"));
        std::fs::write(out.join("docs").join(file), rustdoc_links(file, &text))
            .expect("OUT_DIR is writable");
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    write_guides();
    if std::env::var_os("CARGO_FEATURE_DYNAMIC_LOADING").is_none()
        && std::env::var_os("CARGO_FEATURE_DYNAMIC_LINKING").is_none()
    {
        println!("cargo::error=cuda-graph: no way to find libcuda chosen. Enable the feature `dynamic-loading` (open it at run time, in the defaults) or `dynamic-linking` (link it at build time)");
        return;
    }
    match cuda_version() {
        Ok(v) => {
            // The version's feature, for the aliases below, where it came from the environment
            // or the toolkit rather than a feature. Build scripts run single-threaded.
            std::env::set_var(format!("CARGO_FEATURE_CUDA_{v}"), "1");
            println!("cargo:rustc-env=CUDA_GRAPH_BINDINGS_VERSION={v}");
        }
        Err(why) => {
            println!("cargo::error={why}");
            return;
        }
    }
    cfg_aliases! {
        // `cuda_before_X_Y`: the chosen bindings are older than CUDA X.Y. Each version feature is
        // named once, in this chain.
        cuda_before_12_4: { feature = "cuda-12030" },
        cuda_before_12_8: { any(cuda_before_12_4, feature = "cuda-12040", feature = "cuda-12050", feature = "cuda-12060") },
        cuda_before_12_9: { any(cuda_before_12_8, feature = "cuda-12080") },
        cuda_before_13_0: { any(cuda_before_12_9, feature = "cuda-12090") },
        cuda_before_13_1: { any(cuda_before_13_0, feature = "cuda-13000") },
        cuda_before_13_2: { any(cuda_before_13_1, feature = "cuda-13010") },
        cuda_before_13_3: { any(cuda_before_13_2, feature = "cuda-13020") },
        cuda_before_13_4: { any(cuda_before_13_3, feature = "cuda-13030") },
        // The bindings of some CUDA version are chosen (the crate needs exactly one).
        cuda_version_chosen: { any(cuda_before_13_4, feature = "cuda-13040") },
        // The CUDA 13 bindings (any minor version).
        cuda_13: { all(cuda_version_chosen, not(cuda_before_13_0)) },
    }
}
