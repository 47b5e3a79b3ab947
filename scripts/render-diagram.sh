#!/usr/bin/env bash
# Renders docs/state-machine.dot to SVG (shown inline in the rustdoc of GraphBuilder) and PNG
# (shown in the README). Needs graphviz (`apt-get install graphviz`).
set -euo pipefail
cd "$(dirname "$0")/../docs"
# Inline SVG for rustdoc: drop the XML prolog and comments, scale to the page width.
dot -Tsvg state-machine.dot |
  awk '/^<svg/{on=1} on && !/^<!--/' |
  sed -E '1s/width="[0-9.]+pt" height="[0-9.]+pt"/width="100%"/' > state-machine.svg
dot -Tpng -Gdpi=110 -Gbgcolor=white state-machine.dot -o state-machine.png
ls -l state-machine.svg state-machine.png
# rustdoc: one line of HTML with the SVG as a data URI (inline <svg> markup does not survive
# rustdoc's Markdown pass).
printf '<img alt="The GraphBuilder state machine" width="100%%" src="data:image/svg+xml;base64,%s"/>\n' \
  "$(base64 -w0 state-machine.svg)" > state-machine.rustdoc.html
ls -l state-machine.rustdoc.html
