#!/usr/bin/env python3
"""Draws the decode benchmark's tokens per second as an SVG bar chart, from the CSV rows that
examples/decode and benches/peers/torch_decode.py print (`decode,<config>,<mode>,<tok/s>,...`).

    python3 scripts/decode-chart.py docs/decode.csv docs/decode.svg "H100 80GB HBM3, driver 13.0"

No dependencies: the SVG is written by hand. One group of bars per configuration, one bar per
mode, PyTorch's in grey; each bar is labelled with its tokens per second.
"""

import csv
import html
import sys

COLOURS = {
    "torch-eager": "#b0b0b0",
    "torch-cuda-graph": "#7a7a7a",
    "eager": "#9ecae1",
    "capture-per-step": "#6baed6",
    "static-graph": "#3182bd",
    "on-device": "#08519c",
}


def main():
    src, out = sys.argv[1], sys.argv[2]
    subtitle = sys.argv[3] if len(sys.argv) > 3 else ""
    rows = [r for r in csv.reader(open(src)) if r and r[0] == "decode"]
    configs = []
    for r in rows:
        if r[1] not in configs:
            configs.append(r[1])
    modes = [m for m in COLOURS if any(r[2] == m for r in rows)]
    value = {(r[1], r[2]): float(r[3]) for r in rows}
    bar, gap, group_gap, left, top, height = 46, 6, 40, 60, 60, 300
    width = left + len(configs) * (len(modes) * (bar + gap) + group_gap) + 20
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + height + 90}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="22" font-size="15" font-weight="bold">Decode throughput, tokens per second '
        "(fp32, batch 1, 16 + 256 tokens)</text>",
        f'<text x="{left}" y="40" fill="#555">{html.escape(subtitle)}; each group scaled to its own best</text>',
    ]
    x = left
    for c in configs:
        best = max(value.get((c, m), 0.0) for m in modes) or 1.0
        for m in modes:
            v = value.get((c, m))
            if v is None:
                x += bar + gap
                continue
            h = height * v / best
            y = top + height - h
            svg.append(f'<rect x="{x}" y="{y:.1f}" width="{bar}" height="{h:.1f}" fill="{COLOURS[m]}"/>')
            svg.append(f'<text x="{x + bar / 2}" y="{y - 4:.1f}" text-anchor="middle">{v:,.0f}</text>')
            x += bar + gap
        group_w = len(modes) * (bar + gap)
        svg.append(
            f'<text x="{x - group_w / 2}" y="{top + height + 18}" text-anchor="middle" '
            f'font-size="13" font-weight="bold">{html.escape(c)}</text>'
        )
        x += group_gap
    svg.append(f'<line x1="{left - 5}" y1="{top + height}" x2="{x}" y2="{top + height}" stroke="#333"/>')
    lx = left
    for m in modes:
        svg.append(f'<rect x="{lx}" y="{top + height + 40}" width="12" height="12" fill="{COLOURS[m]}"/>')
        svg.append(f'<text x="{lx + 16}" y="{top + height + 50}">{html.escape(m)}</text>')
        lx += 16 + 7 * len(m) + 18
    svg.append("</svg>")
    open(out, "w").write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
