"""A tiny PNG heatmap writer (stdlib zlib), so ``probe recall --plot`` needs no matplotlib.

Owns turning the recall grid into an image: one cell per (length, depth), green for recalled,
red for missed, grey for errors; context lengths label the columns and depths (in %) the rows,
drawn with a built-in 3×5 pixel font (digits, ``k``, ``M``, ``%``, ``.``, ``-``).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

RGB = tuple[int, int, int]
GREEN: RGB = (46, 160, 67)
RED: RGB = (207, 34, 46)
GREY: RGB = (140, 140, 140)
WHITE: RGB = (255, 255, 255)
BLACK: RGB = (20, 20, 20)

# 3x5 glyphs, rows top to bottom, 3 bits each (MSB = left column).
FONT: dict[str, tuple[int, ...]] = {
    "0": (7, 5, 5, 5, 7), "1": (2, 6, 2, 2, 7), "2": (7, 1, 7, 4, 7), "3": (7, 1, 7, 1, 7),
    "4": (5, 5, 7, 1, 1), "5": (7, 4, 7, 1, 7), "6": (7, 4, 7, 5, 7), "7": (7, 1, 1, 1, 1),
    "8": (7, 5, 7, 5, 7), "9": (7, 5, 7, 1, 7), "k": (4, 5, 6, 5, 5), "M": (5, 7, 7, 5, 5),
    "%": (5, 1, 2, 4, 5), ".": (0, 0, 0, 0, 2), "-": (0, 0, 7, 0, 0), " ": (0, 0, 0, 0, 0),
}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def encode_png(pixels: Sequence[Sequence[RGB]]) -> bytes:
    """RGB 8-bit PNG of a row-major pixel grid."""
    h = len(pixels)
    w = len(pixels[0]) if h else 0
    if not h or not w or any(len(r) != w for r in pixels):
        raise ValueError("pixel grid must be a non-empty rectangle")
    raw = b"".join(b"\x00" + bytes(c for px in row for c in px) for row in pixels)
    return (b"\x89PNG\r\n\x1a\n"
            + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(raw, 9))
            + _chunk(b"IEND", b""))


def short_length(n: int) -> str:
    if n >= 1_000_000 and n % 100_000 == 0:
        return f"{n / 1_000_000:g}M"
    if n >= 1000 and n % 100 == 0:
        return f"{n / 1000:g}k"
    return str(n)


def _text(canvas: list[list[RGB]], x: int, y: int, s: str, scale: int) -> None:
    for i, ch in enumerate(s):
        glyph = FONT.get(ch, FONT[" "])
        for gy, bits in enumerate(glyph):
            for gx in range(3):
                if bits & (4 >> gx):
                    for dy in range(scale):
                        for dx in range(scale):
                            px, py = x + (i * 4 + gx) * scale + dx, y + gy * scale + dy
                            if 0 <= py < len(canvas) and 0 <= px < len(canvas[0]):
                                canvas[py][px] = BLACK


def heatmap(lengths: Sequence[int], depths: Sequence[float],
            value: dict[tuple[int, float], bool | None], *, cell: int = 36,
            scale: int = 2) -> bytes:
    """PNG bytes: columns = lengths, rows = depths; value True/False/None (error)."""
    label_w = 5 * 4 * scale  # room for "100%"
    label_h = 8 * scale
    w = label_w + cell * len(lengths)
    h = label_h + cell * len(depths)
    canvas: list[list[RGB]] = [[WHITE] * w for _ in range(h)]
    for ci, n in enumerate(lengths):
        _text(canvas, label_w + ci * cell + 2, 2, short_length(n), scale)
    for ri, d in enumerate(depths):
        _text(canvas, 1, label_h + ri * cell + cell // 2 - 3 * scale, f"{round(d * 100)}%", scale)
        for ci, n in enumerate(lengths):
            v = value.get((n, d))
            colour = GREY if v is None else (GREEN if v else RED)
            for yy in range(label_h + ri * cell + 1, label_h + (ri + 1) * cell - 1):
                row = canvas[yy]
                for xx in range(label_w + ci * cell + 1, label_w + (ci + 1) * cell - 1):
                    row[xx] = colour
    return encode_png(canvas)
