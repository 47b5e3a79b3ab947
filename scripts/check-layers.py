#!/usr/bin/env python3
"""The layer rule of docs/design/architecture.md, checked: no file names an item of a folder above
its own, whether through the folder's path (`crate::definition::…`) or through a name the crate
root re-exports (`crate::GraphNode`, defined in `definition/`). Layers, lowest first:

    error.rs, version.rs, node_type.rs  <  driver/  <  runtime/  <  core/  <  graph/  <  definition/  <  builder/
    <  interop/, nccl/ (front ends over everything)

Each known breach is listed in scripts/layer-exceptions.txt (file, the folder it reaches, and
why); a breach not listed fails the check, and so does a listed one that is gone (the list
shrinks as the code is mended). Prints the import graph between folders (edges and how many
sites) for architecture.md.

    scripts/check-layers.py           # check; exit status 1 on a breach
    scripts/check-layers.py --graph   # also print the folder-level import graph
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "src")
LAYERS = {
    "error": 0, "version": 0, "node_type": 0,
    "driver": 1, "runtime": 2, "core": 3, "graph": 4, "definition": 5, "builder": 6,
    "interop": 7, "nccl": 7,
}


def folder_of(path):
    """The layer folder of a source file (relative to src/), or None for the root files."""
    first = path.split(os.sep)[0]
    name = first[:-3] if first.endswith(".rs") else first
    return name if name in LAYERS else None


def layered_sources():
    """(path relative to src/, layer folder, text) for every source file in a layer folder."""
    for dirpath, _, files in os.walk(SRC):
        for name in sorted(files):
            if not name.endswith(".rs"):
                continue
            path = os.path.relpath(os.path.join(dirpath, name), SRC)
            folder = folder_of(path)
            if folder is not None:
                yield path, folder, open(os.path.join(SRC, path)).read()


def root_exports():
    """Names the crate root re-exports, mapped to the folder that defines them."""
    text = open(os.path.join(SRC, "lib.rs")).read()
    names = {}
    for m in re.finditer(r"pub use (\w+)((?:::\w+)*)::\{([^}]*)\}|pub use (\w+)((?:::\w+)*)::(\w+)\s*;", text):
        if m.group(1):
            folder, items = m.group(1), m.group(3)
            for item in re.split(r"[,\s]+", items):
                item = item.split(" as ")[-1].strip()
                if item and item != "self":
                    names[item] = folder
        else:
            names[m.group(6)] = m.group(4)
    # A name re-exported through another folder (`builder::HostCallback`, defined in `core/`)
    # belongs to the folder that defines it.
    defined = {}
    for _, folder, text in layered_sources():
        for m in re.finditer(r"^\s*pub(?:\([^)]*\))? (?:unsafe )?(?:struct|enum|trait|type|fn|const|static|union) (\w+)", text, re.M):
            defined.setdefault(m.group(1), folder)
    return {n: defined.get(n, f) for n, f in names.items() if defined.get(n, f) in LAYERS}


def strip_comments(text):
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def references(text, exports):
    """(folder, site) for every `crate::…` path in the file's code (comments left out)."""
    code = strip_comments(text)
    out = []
    # `use crate::{a::X, b::{Y, Z}}` groups: expand the first level.
    for m in re.finditer(r"crate::\{([^;]*)\}", code):
        for part in re.split(r",(?![^{]*\})", m.group(1)):
            head = part.strip().split("::")[0].strip()
            if head:
                out.append(head)
    for m in re.finditer(r"crate::(\w+)", code):
        out.append(m.group(1))
    result = []
    for head in out:
        if head in LAYERS:
            result.append((head, head))
        elif head in exports:
            result.append((exports[head], "crate::" + head))
    return result


def main():
    exports = root_exports()
    exceptions = {}
    exc_path = os.path.join(ROOT, "scripts", "layer-exceptions.txt")
    for line in open(exc_path):
        line = line.split("#", 1)[0].strip()
        if line:
            f, target = line.split()[:2]
            exceptions[(f, target)] = False
    edges = {}
    breaches = []
    for path, own, text in layered_sources():
        seen = set()
        for target, site in references(text, exports):
            if target == own:
                continue
            edges[(own, target)] = edges.get((own, target), 0) + 1
            if LAYERS[target] > LAYERS[own] and (path, target) not in seen:
                seen.add((path, target))
                key = ("src/" + path.replace(os.sep, "/"), target)
                if key in exceptions:
                    exceptions[key] = True
                else:
                    breaches.append(f"src/{path}: names {site} ({target}/ is above {own}/)")
    stale = [f"{f} -> {t}" for (f, t), used in exceptions.items() if not used]
    if "--graph" in sys.argv:
        print("folder imports (from -> to: sites):")
        for (a, b), n in sorted(edges.items(), key=lambda e: (-LAYERS[e[0][0]], e[0])):
            up = "  UPWARD" if LAYERS[b] > LAYERS[a] else ""
            print(f"  {a} -> {b}: {n}{up}")
    for b in breaches:
        print("layer rule broken:", b)
    for s in stale:
        print("listed in scripts/layer-exceptions.txt but no longer found (remove it):", s)
    if breaches or stale:
        print("the layer rule: docs/design/architecture.md, \"Layers\"")
        sys.exit(1)
    print(f"layers: ok ({sum(edges.values())} cross-folder sites, {len(exceptions)} listed exceptions)")


if __name__ == "__main__":
    main()
