"""The watermark series rebuilt from turns and offload events: the sawtooth, exactly."""

from datetime import UTC, datetime, timedelta

from app.inspect.charts import OffloadMark, layer_bar, line_chart, thin, watermark_series

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def at(seconds: int) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_each_turn_adds_its_share_and_each_offload_drops_to_its_recorded_ratio() -> None:
    turns = [(seq, at(seq), 100) for seq in range(1, 7)]
    # the job runs after the append of turn 4 committed
    offload = OffloadMark(at(4) + timedelta(milliseconds=300), 0.82, 0.41, "watermark", 400, 1, 2)
    points = watermark_series(turns, [offload], available=500, base_tokens=10)
    assert [(p.seq, p.ratio, p.kind) for p in points] == [
        (1, 0.22, "turn"),
        (2, 0.42, "turn"),
        (3, 0.62, "turn"),
        (4, 0.82, "turn"),
        (4, 0.82, "trigger"),
        (4, 0.41, "offload"),
        (5, 0.61, "turn"),
        (6, 0.81, "turn"),
    ]


def test_an_offload_after_the_last_turn_still_shows() -> None:
    points = watermark_series(
        [(1, at(1), 450)],
        [OffloadMark(at(9), 0.9, 0.3, "emergency", 300, 1, 1)],
        available=500,
        base_tokens=0,
    )
    assert [(p.ratio, p.kind) for p in points] == [
        (0.9, "turn"),
        (0.9, "trigger"),
        (0.3, "offload"),
    ]


def test_thinning_keeps_every_offload_and_the_last_turn() -> None:
    turns = [(seq, at(seq), 1) for seq in range(1, 1001)]
    marks = [OffloadMark(at(s), 0.8, 0.5, "watermark", 1, 1, 1) for s in (250, 500, 750)]
    points = watermark_series(turns, marks, available=1000, base_tokens=0)
    kept = thin(points, 100)
    assert (
        sum(p.kind == "offload" for p in kept) == 3 and sum(p.kind == "trigger" for p in kept) == 3
    )
    assert 90 <= sum(p.kind == "turn" for p in kept) <= 101
    assert kept[-1] == points[-1]


def test_chart_places_ratios_and_guides_inside_the_plot() -> None:
    points = watermark_series([(s, at(s), 100) for s in (1, 2)], [], available=200, base_tokens=0)
    chart = line_chart(points, {"trigger": 0.8}, width=200, height=100)
    first, last = chart.points
    assert first.x == chart.left and last.x == 200 - 12
    assert last.y == 10  # ratio 1.0 at the top
    assert chart.guides[0].y == 10 + (1 - 0.8) * (100 - 10 - 24)
    assert chart.polyline.split() == [f"{first.x:.1f},{first.y:.1f}", f"{last.x:.1f},{last.y:.1f}"]


def test_layer_bar_scales_to_the_window() -> None:
    segments = layer_bar({"c0": 100, "c1": 300, "c2": 0}, 1000, width=500)
    assert [(s.layer, s.x, s.width) for s in segments] == [
        ("c0", 0.0, 50.0),
        ("c1", 50.0, 150.0),
        ("c2", 200.0, 0.0),
    ]
