"""A log-log scatter plot written as a PNG with the standard library only (zlib, struct).

The benchmarks must not pull plotting libraries into the install, so this draws pixels
itself: lines, markers and text in a 3x5 bitmap font (upper case only).
"""

from __future__ import annotations

import math
import struct
import zlib

_FONT = {
    "0": "###/#.#/#.#/#.#/###", "1": ".#./##./.#./.#./###", "2": "###/..#/###/#../###",
    "3": "###/..#/###/..#/###", "4": "#.#/#.#/###/..#/..#", "5": "###/#../###/..#/###",
    "6": "###/#../###/#.#/###", "7": "###/..#/..#/..#/..#", "8": "###/#.#/###/#.#/###",
    "9": "###/#.#/###/..#/###", "A": ".#./#.#/###/#.#/#.#", "B": "##./#.#/##./#.#/##.",
    "C": "###/#../#../#../###", "D": "##./#.#/#.#/#.#/##.", "E": "###/#../##./#../###",
    "F": "###/#../##./#../#..", "G": "###/#../#.#/#.#/###", "H": "#.#/#.#/###/#.#/#.#",
    "I": "###/.#./.#./.#./###", "J": "..#/..#/..#/#.#/###", "K": "#.#/#.#/##./#.#/#.#",
    "L": "#../#../#../#../###", "M": "#.#/###/###/#.#/#.#", "N": "##./#.#/#.#/#.#/#.#",
    "O": "###/#.#/#.#/#.#/###", "P": "###/#.#/###/#../#..", "Q": "###/#.#/#.#/###/..#",
    "R": "##./#.#/##./#.#/#.#", "S": "###/#../###/..#/###", "T": "###/.#./.#./.#./.#.",
    "U": "#.#/#.#/#.#/#.#/###", "V": "#.#/#.#/#.#/#.#/.#.", "W": "#.#/#.#/###/###/#.#",
    "X": "#.#/#.#/.#./#.#/#.#", "Y": "#.#/#.#/.#./.#./.#.", "Z": "###/..#/.#./#../###",
    ".": ".../.../.../.../.#.", "-": ".../.../###/.../...", ":": ".../.#./.../.#./...",
    "/": "..#/..#/.#./#../#..", "=": ".../###/.../###/...", "(": ".#./#../#../#../.#.",
    ")": ".#./..#/..#/..#/.#.", "%": "#.#/..#/.#./#../#.#", ",": ".../.../.../.#./#..",
    "_": ".../.../.../.../###", " ": ".../.../.../.../...",
}
PALETTE = [
    (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
    (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
]
BLACK, GREY, WHITE = (0, 0, 0), (200, 200, 200), (255, 255, 255)


class Canvas:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.pixels = bytearray(WHITE * (width * height))

    def set(self, x: int, y: int, color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = 3 * (y * self.width + x)
            self.pixels[i:i + 3] = bytes(color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color, dashed: bool = False) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for s in range(steps + 1):
            if dashed and (s // 6) % 2:
                continue
            self.set(round(x0 + (x1 - x0) * s / steps), round(y0 + (y1 - y0) * s / steps), color)

    def marker(self, x: int, y: int, shape: str, color, size: int = 4) -> None:
        for dy in range(-size, size + 1):
            for dx in range(-size, size + 1):
                inside = {
                    "square": True,
                    "circle": dx * dx + dy * dy <= size * size,
                    "diamond": abs(dx) + abs(dy) <= size,
                    "triangle": dy >= -size + 2 * abs(dx) - size // 2,
                }[shape]
                edge = {
                    "square": max(abs(dx), abs(dy)) == size,
                    "circle": (size - 1) ** 2 < dx * dx + dy * dy <= size * size,
                    "diamond": abs(dx) + abs(dy) == size,
                    "triangle": dy == size or dy == -size + 2 * abs(dx) - size // 2,
                }[shape]
                if inside:
                    self.set(x + dx, y + dy, BLACK if edge else color)

    def text(self, x: int, y: int, text: str, color=BLACK, scale: int = 2) -> None:
        for k, char in enumerate(text.upper()):
            rows = _FONT.get(char, _FONT[" "]).split("/")
            for r, row in enumerate(rows):
                for c, bit in enumerate(row):
                    if bit == "#":
                        for sy in range(scale):
                            for sx in range(scale):
                                self.set(x + (4 * k + c) * scale + sx, y + r * scale + sy, color)

    def text_width(self, text: str, scale: int = 2) -> int:
        return 4 * len(text) * scale

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.pixels[3 * y * self.width:3 * (y + 1) * self.width]) for y in range(self.height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def scatter_loglog(series: dict[str, list[tuple[float, float, str]]], title: str, xlabel: str, ylabel: str,
                   width: int = 960, height: int = 720) -> bytes:
    """``series``: name -> [(x, y, shape)]; draws y = x dashed, one colour per series."""
    canvas = Canvas(width, height)
    left, right, top, bottom = 90, 220, 50, 70
    values = [v for points in series.values() for x, y, _ in points for v in (x, y) if v > 0 and math.isfinite(v)]
    lo, hi = math.log10(min(values) / 1.3), math.log10(max(values) * 1.3)
    plot_w, plot_h = width - left - right, height - top - bottom

    def px(v: float) -> int:
        return left + round((math.log10(v) - lo) / (hi - lo) * plot_w)

    def py(v: float) -> int:
        return top + plot_h - round((math.log10(v) - lo) / (hi - lo) * plot_h)

    for tick in _ticks(lo, hi):
        label = f"{tick:g}"
        canvas.line(px(tick), top, px(tick), top + plot_h, GREY)
        canvas.line(left, py(tick), left + plot_w, py(tick), GREY)
        canvas.text(px(tick) - canvas.text_width(label) // 2, top + plot_h + 8, label)
        canvas.text(left - canvas.text_width(label) - 8, py(tick) - 5, label)
    canvas.line(left, top, left, top + plot_h, BLACK)
    canvas.line(left, top + plot_h, left + plot_w, top + plot_h, BLACK)
    canvas.line(left + plot_w, top, left + plot_w, top + plot_h, BLACK)
    canvas.line(left, top, left + plot_w, top, BLACK)
    a, b = 10 ** lo, 10 ** hi
    canvas.line(px(a), py(a), px(b), py(b), BLACK, dashed=True)
    for k, (name, points) in enumerate(series.items()):
        color = PALETTE[k % len(PALETTE)]
        for x, y, shape in points:
            if x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y):
                canvas.marker(px(x), py(y), shape, color, 6 if shape == "circle" else 4)
        canvas.marker(width - right + 24, top + 20 + 22 * k, "square", color)
        canvas.text(width - right + 38, top + 15 + 22 * k, name)
    legend_y = top + 40 + 22 * len(series)
    for k, (shape, label) in enumerate((("circle", "auto"), ("triangle", "baseline"), ("diamond", "random"))):
        canvas.marker(width - right + 24, legend_y + 22 * k, shape, GREY, 6 if shape == "circle" else 4)
        canvas.text(width - right + 38, legend_y - 5 + 22 * k, label)
    canvas.text(width - right + 14, legend_y + 70, "- - Y = X")
    canvas.text(left, 15, title)
    canvas.text(left + plot_w // 2 - canvas.text_width(xlabel) // 2, height - 30, xlabel)
    canvas.text(8, top - 25, ylabel)
    return canvas.png()


def _ticks(lo: float, hi: float) -> list[float]:
    ticks = []
    for decade in range(math.floor(lo), math.ceil(hi) + 1):
        for m in (1, 2, 5):
            value = m * 10.0 ** decade
            if lo <= math.log10(value) <= hi:
                ticks.append(value)
    return ticks
