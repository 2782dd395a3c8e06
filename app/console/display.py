"""What the console's pages draw from op answers: a schema property's type in words, a
block's fill bar, and a namespace's model calls and spend against its budget as an SVG chart.

Pure functions of answers (no op calls, no Redis), registered as template filters; the chart
is drawn server-side, so the page needs no script and no asset from elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.console.blueprint import bp

# How many slices of the budget window the chart draws.
CHART_BUCKETS = 24
CHART_WIDTH, CHART_HEIGHT = 600, 160
_PLOT_TOP, _PLOT_BOTTOM = 8, 140


@bp.app_template_filter("schema_type")
def schema_type(prop: Any) -> str:
    """A JSON Schema property's type as a person reads it: "array of string", "string or
    null", "one of: a, b", "object"."""
    if not isinstance(prop, dict):
        return "any value"
    if "enum" in prop:
        return "one of: " + ", ".join("null" if item is None else str(item)
                                      for item in prop["enum"])
    if "const" in prop:
        return f"exactly {prop['const']}"
    kinds = prop.get("type")
    if kinds is None:
        for keyword in ("anyOf", "oneOf"):
            if isinstance(prop.get(keyword), list):
                return " or ".join(schema_type(branch) for branch in prop[keyword])
        if "$ref" in prop:
            return "a " + str(prop["$ref"]).rsplit("/", 1)[-1]
        return "any value"
    names = kinds if isinstance(kinds, list) else [kinds]
    words = []
    for kind in names:
        if kind == "array":
            items = prop.get("items")
            words.append(f"array of {schema_type(items)}" if items else "array of any value")
        else:
            words.append(str(kind))
    return " or ".join(words)


@bp.app_template_filter("fill_percent")
def fill_percent(block: dict[str, Any]) -> float:
    """How full a block is: its content's length against its char_limit, 0 to 100."""
    limit = block.get("char_limit") or 0
    if limit <= 0:
        return 0.0
    return round(min(100.0, 100.0 * len(block.get("content") or "") / limit), 1)


@dataclass(frozen=True)
class Series:
    """One measure of the chart: per-bucket bars, the running total and the cap line."""

    name: str
    unit: str
    cap: int | None
    spent: int
    bars: list[dict[str, Any]]  # x, y, width, height, amount, start
    running: str  # polyline points of the running total
    cap_y: float | None  # where the cap line is drawn; None: no cap
    top: int  # the value at the plot's top edge


def budget_chart(budget: dict[str, Any]) -> list[Series]:
    """The calls and the tokens of ``budget.get``'s timeline, each against its cap."""
    timeline = budget.get("timeline") or []
    if not timeline:
        return []
    return [
        _series("Model calls", "calls", [b["calls"] for b in timeline],
                [b["start"] for b in timeline], budget.get("calls")),
        _series("Tokens", "tokens", [b["tokens"] for b in timeline],
                [b["start"] for b in timeline], budget.get("tokens")),
    ]


def _series(name: str, unit: str, amounts: list[int], starts: list[str],
            cap: int | None) -> Series:
    running_totals, total = [], 0
    for amount in amounts:
        total += amount
        running_totals.append(total)
    # The plot reaches the cap or the total, whichever is higher, so both show.
    top = max(total, cap or 0, 1)
    height = _PLOT_BOTTOM - _PLOT_TOP

    def y_of(value: float) -> float:
        return round(_PLOT_BOTTOM - height * value / top, 1)

    width = CHART_WIDTH / max(1, len(amounts))
    bars = [
        {"x": round(index * width + 1, 1), "width": round(max(1.0, width - 2), 1),
         "y": y_of(amount), "height": round(_PLOT_BOTTOM - y_of(amount), 1),
         "amount": amount, "start": starts[index]}
        for index, amount in enumerate(amounts)
    ]
    points = " ".join(f"{round((index + 1) * width, 1)},{y_of(value)}"
                      for index, value in enumerate(running_totals))
    return Series(name=name, unit=unit, cap=cap, spent=total, bars=bars,
                  running=f"0,{_PLOT_BOTTOM} {points}", cap_y=None if cap is None else y_of(cap),
                  top=top)
