"""How bench/pairwise_comparisons.py reads a comparison: its sides (each value of each config line, built from the
linked row its label agrees with), what each value measures, the settings a label states and the values a line gives.
The same rules for every comparison of any file of the schema; the method: bench/pairwise_comparisons.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, get_args

from meshplan.schema.choices import RecomputeModule

# --------------------------------------------------------------------------- how each comparison's sides are built


@dataclass(frozen=True)
class Side:
    """One configuration of a comparison: value `pick` of config line `line`, named by `label` (the line's label, and
    on an "A vs B" line the words before that value), built from the linked production row `entry` the label agrees
    with most (label_settings) with the settings the label states applied, or, where the label only takes a degree
    away ("no-CP"), meshplan's best layout with `best_without` fixed to 1 (the source does not give the layout)."""

    line: int
    pick: int = 0
    label: str = ""
    entry: str | None = None
    best_without: str | None = None


MEASURE_WORDS = (("memory", ("gb", "gib", "mem")), ("time", ("ms", "s/step", "step time", "step-time", "seconds")),
                 ("throughput", ("tflop", "tokens", "tok/s", "mfu", "throughput")))
NOT_MEASURED_WORDS = ("feasibility", "recommended")


def _measure_of(text: str) -> str | None:
    low = f" {text.lower()} "
    return next((m for m, words in MEASURE_WORDS if any(w in low for w in words)), None)


def _parts(line: str) -> list[str]:
    """The values part of a config line, one entry per value ("457 ms, 36.62 GB" -> two)."""
    return [p for p in re.split(r",\s*(?![^(]*\))", line.split(": ", 1)[1]) if VALUE.search(p)] if ": " in line else []


def measures(c: dict[str, Any]) -> tuple[str | None, ...]:
    """What each value position of the comparison's lines measures: the unit written beside it on the first line that
    has one ("457 ms" time, "36.62 GB" memory, "TFLOP/s" / "MFU" throughput), else the metric's part at that position
    (split at ';' or ' / '), else the whole metric. () for a comparison whose metric is a feasibility or a
    recommendation (no measured pair)."""
    metric = str(c.get("metric") or "")
    if any(w in metric.lower() for w in NOT_MEASURED_WORDS):
        return ()
    parts = [p for p in re.split(r";| / ", metric) if p.strip()]
    width = max((len(_parts(line)) for line in c["configs"]), default=0)
    out = []
    for p in range(width):
        units = [_measure_of(VALUE.sub(" ", x[p])) for x in map(_parts, c["configs"]) if p < len(x)]
        found = next((u for u in units if u), None)
        out.append(found or (_measure_of(parts[p]) if p < len(parts) else None) or _measure_of(metric))
    return tuple(out)


LAYOUT_WORDS = (("tp", r"\bTP(\d+)"), ("pp", r"\bPP(\d+)"), ("vpp", r"\bVPP?(\d+)"), ("cp", r"\bCP(\d+)"),
                ("ep", r"\bEP(\d+)"), ("dp", r"\bDP(\d+)"), ("fsdp", r"\bFSDP(\d+)"))
NOT_GPU = {"tp", "pp", "vp", "vpp", "cp", "ep", "etp", "dp", "fsdp", "mbs", "gbs", "bs", "bf", "fp", "mxfp", "nvfp",
           "fp8", "bf16"}
PRECISION_WORDS = (("mxfp8", "mxfp8"), ("fp8-cs", "current"), ("fp8cs", "current"), ("bf16", "bf16"), ("fp8", "fp8"))
TOGGLES = (("moe_a2a_overlap", r"\b(ep|a2a|expert|moe)\b"), ("tp_comm_overlap", r"\btp\b"),
           ("torch_compile", r"\bcompile"))


def label_settings(label: str, title: str = "") -> dict[str, Any]:
    """The settings a label states, read the same way for every comparison: layout degrees (TP2, PP4, VP5, CP8,
    EP16, DP32, FSDP64; "no-CP" takes a degree away: `open`), sequence length ("32K", "1M"), GPU count ("(512
    GPUs)", "32K/32", "8 GPUs", a bare number), a GPU name (letters and digits that are no layout or precision word:
    GB300), a precision (MXFP8, FP8-CS, BF16), Megatron recompute modules ("moe_act", "mla_up_proj+mlp", "none") and a
    switch ("overlap on": the knob the label or the comparison's title names)."""
    out: dict[str, Any] = {}
    for key, pattern in LAYOUT_WORDS:
        if m := re.search(pattern, label):
            out[key] = int(m.group(1))
    if m := re.search(r"\bno[- ](TP|PP|CP|EP)\b", label, re.I):
        out[m.group(1).lower()], out["open"] = 1, m.group(1).lower()
    if m := re.match(r"\s*(\d+)([KM])\b", label):
        out["seq_length"] = int(m.group(1)) * (1024 if m.group(2) == "K" else 1024 * 1024)
    if m := (re.search(r"\(?(\d+) GPUs\)?", label) or re.match(r"\s*\d+[KM]/(\d+)\b", label)
             or re.fullmatch(r"\s*(\d+)\s*", label)):
        out["num_gpus"] = int(m.group(1))
    for word in re.findall(r"\b([A-Za-z]+\d+[A-Za-z]?)\b", label):
        if re.match(r"[A-Za-z]+", word).group(0).lower() not in NOT_GPU and word.lower() not in NOT_GPU:
            out["gpu"] = word
    low = label.lower()
    if prec := next((canon for word, canon in PRECISION_WORDS if word in low), None):
        out["precision"] = prec
    names = [n.strip() for n in label.split("+")]
    if names and all(n in (*get_args(RecomputeModule), "none") for n in names):
        out["recompute"] = "none" if names == ["none"] else "selective: " + ", ".join(names)
    if m := re.search(r"\b(on|off)\s*$", low):
        out["switch"] = (next((f for f, words in TOGGLES if re.search(words, f"{low} {title.lower()}")), None),
                         m.group(1) == "on")
    return out


def _agreement(row: dict[str, Any], stated: dict[str, Any]) -> int:
    """How many of the label's settings the row has, less how many it contradicts."""
    p, score = row["parallelism"], 0
    facts = {k: p.get(k) for k, _ in LAYOUT_WORDS} | {"seq_length": row["workload"]["seq_length"],
                                                     "num_gpus": row["hardware"]["num_gpus"]}
    for key, value in stated.items():
        if key in facts:
            score += 1 if facts[key] == value or (facts[key] is None and value == 1) else -1
        elif key == "gpu":
            score += 1 if str(row["hardware"]["gpu_type"]).lower().startswith(value.lower()) else -1
        elif key == "precision":
            score += 1 if value in str(row["precision"]).lower() else -1
    return score


def sides_of(c: dict[str, Any], rows: dict[str, dict[str, Any]]) -> list[Side]:
    """Every side of a comparison: each value of each config line ("A vs B" lines: one side per value, the words
    before it added to the label), built from the linked row that agrees most with its label (the first on a tie)."""
    out = []
    linked = [e for e in c.get("entry_ids") or [] if e in rows]
    above: list[str] = []  # the words of each half of the "A vs B" lines above: a half without words takes them
    for i, line in enumerate(c["configs"]):
        base = line_label(line) if ": " in line else line
        text = line.split(": ", 1)[1] if ": " in line else ""
        halves = re.split(r"\s+vs\.?\s+", text)
        words = [VALUE.sub(" ", h).strip() for h in halves]
        words = [w or (above[k] if k < len(above) else "") for k, w in enumerate(words)]
        above = words if len(halves) > 1 else above
        labels = [f"{base} {w}".strip() for w in words] if len(halves) > 1 \
            else [base] * max(1, len(line_values(line)) if ": " in line else 1)
        for pick, label in enumerate(labels):
            stated = label_settings(label, str(c.get("title") or ""))
            entry = max(linked, key=lambda e: (_agreement(rows[e], stated), -linked.index(e)), default=None)
            out.append(Side(i, pick, label, entry, stated.get("open")))
    return out


# --------------------------------------------------------------------------- measured values

VALUE = re.compile(r"(?<![\w.])(OOM|[~+-]?\d+(?:\.\d+)?%?)(?![\w.])")


def line_values(line: str) -> list[str]:
    """The values after a config line's colon: numbers (with sign, ~ or %), or OOM."""
    if ": " not in line:
        raise ValueError(f"config line without 'label: value': {line!r}")
    return VALUE.findall(line.split(": ", 1)[1])


def line_label(line: str) -> str:
    return line.split(": ", 1)[0].strip()


def measured_value(configs: list[str], side: Side, ref: Side | None) -> float | str:
    """The side's measured value: a number, "OOM", or a "+x%" turned absolute against the reference line."""
    values = line_values(configs[side.line])
    if not values:
        raise ValueError(f"no value on {configs[side.line]!r}")
    if values[0] == "OOM":
        return "OOM"
    raw = values[side.pick] if side.pick < len(values) else values[-1]
    number = float(raw.strip("~+-%")) * (-1 if raw.startswith("-") else 1)
    if values[0][0] in "+-":  # a line of changes against the reference line ("+1.99%, -1.85% mem", "~0 mem")
        if ref is None or ref.line == side.line:
            raise ValueError(f"relative value {raw!r} without a reference line")
        base = measured_value(configs, ref, None)
        assert isinstance(base, float)
        return base * (1 + number / 100)
    return number



def _modules(text: Any) -> frozenset[str] | None:
    """The Megatron recompute modules a recompute text names first ("none" -> {"none"}; its first clause only)."""
    first = re.split(r"[;(]", str(text or "").lower())[0]
    if first.strip().startswith("none"):
        return frozenset({"none"})
    names = set(re.findall(r"[a-z_]+", first.split(":", 1)[-1])) & set(get_args(RecomputeModule))
    return frozenset(names) or None


def _as_stated(side: Side, rows: dict[str, dict[str, Any]]) -> bool:
    """Whether the side's label states only what its linked row states (for rows meshplan cannot map)."""
    row = rows.get(side.entry or "")
    if row is None:
        return False
    stated = {k: v for k, v in label_settings(side.label).items() if k not in ("open", "switch")}
    recompute = stated.pop("recompute", None)
    if recompute is not None and _modules(recompute) != _modules(row["memory"]["recompute"]):
        return False
    return _agreement(row, stated) == len(stated)
