#!/usr/bin/env bash
# Writes the README's quick start into DIR as a crate of its own, depending on this repository
# by path with the `nvrtc` feature, as a reader's new crate would: `scripts/readme-crate.sh DIR`.
# CI builds it; scripts/gpu-bundle.sh builds it in release and the GPU bundle runs it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="$1"
mkdir -p "$dir/src"
cat > "$dir/Cargo.toml" <<TOML
[package]
name = "readme-quickstart"
version = "0.1.0"
edition = "2021"

[dependencies]
cuda-graph = { path = "$root", features = ["nvrtc"] }

[workspace]
TOML
awk '/^```rust,no_run$/{f=1; next} f && /^```$/{exit} f' "$root/README.md" > "$dir/src/main.rs"
