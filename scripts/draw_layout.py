"""Draw docs/figures/layout_bits.png: where each bit of a 32-value group lives in its planes.

Every cell is one bit of one 32-bit plane word (bit 31 left, bit 0 right), labelled with the
value index it belongs to; the colour is the value's register (value // 2), so the two codes a
mask takes into one register share a colour. The data comes from
kvbits.decode.layout.decode_bit_table alone (2 and 4 bits, 3 bits with two classes).

Usage: PYTHONPATH=. python scripts/draw_layout.py [output.png]
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kvbits.decode.layout import decode_bit_table  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "docs" / "figures" / "layout_bits.png"


def draw(out: Path) -> None:
    bits_list = (2, 3, 4)
    fig, axes = plt.subplots(len(bits_list), 1, figsize=(11, 5.2),
                             gridspec_kw={"height_ratios": list(bits_list)})
    cmap = plt.get_cmap("tab20")
    for ax, bits in zip(axes, bits_list, strict=True):
        table = decode_bit_table(bits)
        for plane in range(bits):
            for pos in range(32):
                value, bit = table[plane * 32 + pos]
                x, y = 31 - pos, bits - 1 - plane
                ax.add_patch(plt.Rectangle((x, y), 1, 1, facecolor=cmap((value // 2) % 20),
                                           edgecolor="white", linewidth=0.8))
                ax.text(x + 0.5, y + 0.5, f"{value}", ha="center", va="center", fontsize=6.5)
        ax.set_xlim(0, 32)
        ax.set_ylim(0, bits)
        ax.set_yticks([bits - 0.5 - p for p in range(bits)], [f"plane {p}" for p in range(bits)], fontsize=7)
        ax.set_xticks([31.5 - p for p in (0, 8, 15, 16, 24, 31)], ["0", "8", "15", "16", "24", "31"], fontsize=7)
        ax.set_title(f"{bits} bits: value index held at each bit of a group's planes (bit 0 right)",
                     fontsize=8, loc="left")
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    draw(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
