#!/usr/bin/env python3
"""Draws the decode benchmark's tokens per second as an SVG bar chart, from the CSV rows that
examples/decode and benches/peers/torch_decode.py print (`decode,<config>,<mode>,<tok/s>,...`).

    python3 scripts/decode-chart.py docs/decode.csv docs/decode.svg "H200, driver 13.0"

No dependencies: the SVG is written by hand. One group of bars per configuration: PyTorch's
modes in grey, then each kernel set of examples/decode (the rows' last column, `kernels`:
`cublas` in blues, `fused` in oranges; rows without it, as the example printed before it had
kernel sets, count as `cublas`), one bar per mode; each bar is labelled with its tokens per
second.
"""

import csv
import html
import sys

# The peer's modes: (mode, colour).
TORCH = [("torch-eager", "#b0b0b0"), ("torch-cuda-graph", "#7a7a7a")]
MODES = ["eager", "capture-per-step", "static-graph", "on-device"]
# Each kernel set's colours, one per mode of MODES.
SETS = {
    "cublas": ["#9ecae1", "#6baed6", "#3182bd", "#08519c"],
    "fused": ["#fdbe85", "#fd8d3c", "#e6550d", "#a63603"],
}


def series_of(row):
    """The bar a row belongs to: (series key, legend label, colour), or None for unknown ones."""
    mode = row[2]
    for m, colour in TORCH:
        if mode == m:
            return (m, m, colour)
    kernels = row[8] if len(row) > 8 and row[8] else "cublas"
    if mode in MODES and kernels in SETS:
        return (f"{kernels}/{mode}", f"{kernels} {mode}", SETS[kernels][MODES.index(mode)])
    return None


def main():
    src, out = sys.argv[1], sys.argv[2]
    subtitle = sys.argv[3] if len(sys.argv) > 3 else ""
    rows = [r for r in csv.reader(open(src)) if r and r[0] == "decode"]
    configs = []
    for r in rows:
        if r[1] not in configs:
            configs.append(r[1])
    value, label, colour = {}, {}, {}
    for r in rows:
        s = series_of(r)
        if s is None:
            continue
        key, lab, col = s
        value[(r[1], key)] = float(r[3])
        label[key], colour[key] = lab, col
    # Bar order: the peer, then each set's modes.
    order = [m for m, _ in TORCH] + [f"{k}/{m}" for k in SETS for m in MODES]
    series = [k for k in order if k in label]
    bar, gap, group_gap, left, top, height = 46, 6, 40, 60, 60, 300
    width = max(left + len(configs) * (len(series) * (bar + gap) + group_gap) + 20, 700)
    legend_rows = (len(series) + 3) // 4
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{top + height + 50 + 20 * legend_rows}" font-family="sans-serif" font-size="11">',
        f'<text x="{left}" y="22" font-size="15" font-weight="bold">Decode throughput, tokens per second '
        "(fp32, batch 1, 16 + 256 tokens)</text>",
        f'<text x="{left}" y="40" fill="#555">{html.escape(subtitle)}; each group scaled to its own best</text>',
    ]
    x = left
    for c in configs:
        best = max(value.get((c, k), 0.0) for k in series) or 1.0
        for k in series:
            v = value.get((c, k))
            if v is None:
                x += bar + gap
                continue
            h = height * v / best
            y = top + height - h
            svg.append(f'<rect x="{x}" y="{y:.1f}" width="{bar}" height="{h:.1f}" fill="{colour[k]}"/>')
            svg.append(f'<text x="{x + bar / 2}" y="{y - 4:.1f}" text-anchor="middle">{v:,.0f}</text>')
            x += bar + gap
        group_w = len(series) * (bar + gap)
        svg.append(
            f'<text x="{x - group_w / 2}" y="{top + height + 18}" text-anchor="middle" '
            f'font-size="13" font-weight="bold">{html.escape(c)}</text>'
        )
        x += group_gap
    svg.append(f'<line x1="{left - 5}" y1="{top + height}" x2="{x}" y2="{top + height}" stroke="#333"/>')
    # The legend: four entries a line (a kernel set's modes share one).
    for n, k in enumerate(series):
        lx = left + (n % 4) * 170
        ly = top + height + 40 + 20 * (n // 4)
        svg.append(f'<rect x="{lx}" y="{ly}" width="12" height="12" fill="{colour[k]}"/>')
        svg.append(f'<text x="{lx + 16}" y="{ly + 10}">{html.escape(label[k])}</text>')
    svg.append("</svg>")
    open(out, "w").write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
