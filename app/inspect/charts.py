"""Chart geometry for the inspector, pure (no I/O): the watermark over a session's life and the
tokens per layer, as coordinates that a template draws as inline SVG.

The watermark is rebuilt from what is stored: each turn adds its tokens to the usage, and each
offload event records the ratio it started from and the ratio it left — the sawtooth.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

PointKind = Literal["turn", "trigger", "offload"]


@dataclass(frozen=True)
class OffloadMark:
    at: datetime
    ratio_before: float
    ratio_after: float
    trigger: str
    tokens_freed: int
    turn_first: int
    turn_last: int


@dataclass(frozen=True)
class WatermarkPoint:
    seq: int  # the last turn appended at that moment
    ratio: float
    kind: PointKind


def watermark_series(
    turns: Sequence[tuple[int, datetime, int]],
    offloads: Sequence[OffloadMark],
    *,
    available: int,
    base_tokens: int,
) -> list[WatermarkPoint]:
    """Usage ratio after every turn `(seq, created_at, tokens)`, with a drop at each offload.

    `base_tokens` (system prompt, reply priming) is the part of the usage no turn brings."""
    points: list[WatermarkPoint] = []
    ratio = base_tokens / available
    seq = 0
    pending = list(offloads)

    def apply(mark: OffloadMark) -> None:
        nonlocal ratio
        points.append(WatermarkPoint(seq, round(mark.ratio_before, 4), "trigger"))
        points.append(WatermarkPoint(seq, round(mark.ratio_after, 4), "offload"))
        ratio = mark.ratio_after

    for turn_seq, created_at, tokens in turns:
        while pending and pending[0].at <= created_at:
            apply(pending.pop(0))
        seq = turn_seq
        ratio += tokens / available
        points.append(WatermarkPoint(seq, round(ratio, 4), "turn"))
    for mark in pending:
        apply(mark)
    return points


def thin(points: list[WatermarkPoint], max_turn_points: int) -> list[WatermarkPoint]:
    """Every offload point, and at most about `max_turn_points` turn points (the last kept)."""
    turn_points = sum(1 for p in points if p.kind == "turn")
    step = max(1, -(-turn_points // max_turn_points))
    kept, index = [], 0
    for point in points:
        if point.kind == "turn":
            index += 1
            if index % step and index != turn_points:
                continue
        kept.append(point)
    return kept


@dataclass(frozen=True)
class PlotPoint:
    x: float
    y: float
    point: WatermarkPoint


@dataclass(frozen=True)
class Guide:
    y: float
    ratio: float
    label: str


@dataclass(frozen=True)
class LineChart:
    width: int
    height: int
    left: int
    bottom: int
    points: list[PlotPoint]
    guides: list[Guide]
    x_labels: list[tuple[float, int]]

    @property
    def polyline(self) -> str:
        return " ".join(f"{p.x:.1f},{p.y:.1f}" for p in self.points)


def line_chart(
    points: list[WatermarkPoint],
    guides: dict[str, float],
    *,
    width: int = 760,
    height: int = 240,
) -> LineChart:
    """Place the points: x by turn seq, y by ratio from 0 to at least 1 (so every guide shows)."""
    left, right, top, bottom = 44, 12, 10, 24
    plot_w, plot_h = width - left - right, height - top - bottom
    first = min((p.seq for p in points), default=0)
    last = max((p.seq for p in points), default=1)
    span = max(last - first, 1)
    y_max = max([1.0, *(p.ratio for p in points)])

    def x_of(seq: int) -> float:
        return left + (seq - first) / span * plot_w

    def y_of(ratio: float) -> float:
        return top + (1 - ratio / y_max) * plot_h

    return LineChart(
        width=width,
        height=height,
        left=left,
        bottom=height - bottom,
        points=[PlotPoint(x_of(p.seq), y_of(p.ratio), p) for p in points],
        guides=[Guide(y_of(r), r, name) for name, r in guides.items()],
        x_labels=[(x_of(s), s) for s in sorted({first, last})],
    )


@dataclass(frozen=True)
class Segment:
    layer: str
    tokens: int
    x: float
    width: float


def layer_bar(layers: dict[str, int], limit: int, *, width: int = 760) -> list[Segment]:
    """Consecutive segments, one per layer, scaled so that `limit` (C - r) spans the bar (a
    usage above the limit is scaled down to fit)."""
    scale = width / max(limit, sum(layers.values()), 1)
    segments, x = [], 0.0
    for layer, tokens in layers.items():
        segments.append(Segment(layer, tokens, x, tokens * scale))
        x += tokens * scale
    return segments
