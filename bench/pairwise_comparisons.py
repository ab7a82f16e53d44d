"""Does meshplan order measured A/B comparisons the way they measured? (issue 15 item 7)

Data: ../shared/validation/pairwise_comparisons_dev.yaml: measured comparisons between configurations of
production_configs_dev.yaml (which layout won, by how much, how controlled the comparison was). Each comparison
lists its configurations as text lines ("label: value, value") and the production rows it links.

Method (nothing fitted, no per-pair constants):
- Every side of a pair is a production row, or a production row with the fields the config line's label changes
  (SIDES): a recompute list ("moe_act", "mla_up_proj+mlp": memory.recompute becomes "selective: <modules>"), a
  layout or length ("16K CP4 DP8", "TP1 PP4 VP5", "(512 GPUs)": the row's seq, tp/pp/vpp/cp/dp, GPU count; dp
  re-derived when the label leaves it out; the global batch scaled to keep the row's tokens per step), or a GPU
  the row does not name (its hardware entry). The edited row is mapped by bench/production_configs.py's own
  map_row, so a side is the Request a user would pass, with the same knobs counted as that script counts them.
  A side whose layout the source does not give ("the no-CP configs are not specified") is meshplan's own best
  layout with that degree fixed to 1 (api.recommend), as a user would ask for it.
- Measured values are read from the config lines (the numbers after the colon; "+x%" relative to the reference
  line; "OOM"). Pairs: each config against the comparison's reference config (the control the source reports
  against; for a table of A-vs-B lines, each line's two values).
- Predicted: model TFLOP/s per GPU (api.estimate_throughput: model FLOPs per step / step time / GPUs; same model
  and length on both sides makes this the tokens/s ratio, across lengths it is the metric the source reports),
  the step time for step-time pairs, api.estimate_memory's peak for memory pairs.
- Scored: ordered right = meshplan puts the measured winner ahead, over the pairs measured more than 5% apart;
  ratio error = predicted ratio / measured ratio - 1, the ratio oriented winner / loser (negative: meshplan
  understates the winner's margin). Why a pair is wrong: the step-time term (per model FLOP) that charges the
  measured winner most over the loser.
- Counted apart, never dropped: pairs whose sides meshplan maps to the same request (the knob that differs is one
  meshplan lacks: named), pairs with a side that does not map (the reason production_configs gives), and pairs
  scored with the nearest expressible settings (a side carries a knob of production_rows.KNOBS that changes
  the metric: named). Feasibility comparisons (a layout that ran vs "OOM") are checked as fit verdicts.

Run: python bench/pairwise_comparisons.py [--rows] [--validation DIR]
"""

from __future__ import annotations

import argparse
import copy
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import production_mapping as pmap  # bench scripts are not a package
import production_rows as prow

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.schema.request import Request

DATA_NAME = "pairwise_comparisons_dev.yaml"
APART = 0.05  # pairs measured more than this apart are ordered (the threshold)
OFF = 0.20  # a pair ordered right but with a ratio error beyond this also says which term
TERMS = ("compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "dp_comm_s", "pp_comm_s", "bubble_s", "recompute_s",
         "other_s", "offload_s")

# --------------------------------------------------------------------------- how each comparison's sides are built


@dataclass(frozen=True)
class Side:
    """One configuration of a comparison: `line` of its configs (and `pick`, which value on that line), built from
    production row `entry` (by default the comparison's first linked row) with what the line's label changes
    (`edit`: "recompute", "layout"), a hardware entry the row does not have, or meshplan's best layout with
    `best_without` fixed to 1 (the source does not give the layout)."""

    line: int
    pick: int = 0
    entry: str | None = None
    edit: str | None = None
    hardware: tuple[tuple[str, Any], ...] = ()
    best_without: str | None = None


@dataclass(frozen=True)
class Spec:
    """The sides of a comparison, what each value on a line measures (by `pick`: "throughput" higher is better,
    "time" lower is better, "memory" peak bytes), the pairs (side keys, reference first) and the knob meshplan lacks
    when its sides differ only by it."""

    sides: dict[str, Side]
    pairs: tuple[tuple[str, str], ...]
    measures: tuple[str, ...] = ("throughput",)
    lacks: str | None = None
    not_measured: str | None = None  # a comparison with no measured value on both sides: why


def _vs(ref: str, others: list[str]) -> tuple[tuple[str, str], ...]:
    return tuple((ref, o) for o in others)


NEMO_CP = [f"nemo_longseq_llama2_7b_h100_{k}" for k in ("32k", "64k", "128k", "256k", "512k", "1024k")]
MOON = "mbridge_card_moonlight_8_norecompute"
NANO = "mbridge_card_nemotron3_nano_16_moe_recompute"
GB300 = (("gpu_type", "GB300-288GB"), ("gpu_memory_gb", 288))  # the line names GB300; the linked rows are GB200
SPECS: dict[str, Spec] = {
    "CMP-TOUCHNET-1B": Spec(
        {"fsdp8": Side(0, entry="issue_touchnet_llama32_1b_8x3090_fsdp8"),
         "pp2tp2": Side(1, entry="issue_touchnet_llama32_1b_8x3090_pp2_tp2_fsdp2")}, (("fsdp8", "pp2tp2"),)),
    "CMP-NEMO-CP": Spec(
        {**{f"{i}cp": Side(i, 0, entry=e) for i, e in enumerate(NEMO_CP)},
         **{f"{i}nocp": Side(i, 1, entry=e, best_without="cp") for i, e in enumerate(NEMO_CP)}},
        tuple((f"{i}cp", f"{i}nocp") for i in range(len(NEMO_CP)))),
    "CMP-MB-QWEN30B-H100": Spec(
        {"pp2vp12": Side(0, entry="mbridge_h100_qwen3_30b_16_fp8_pp2vp12"),
         "ep16": Side(1, entry="mbridge_h100_qwen3_30b_16_fp8_ep16")}, (("pp2vp12", "ep16"),)),
    "CMP-MB-L70B-GB200": Spec(
        {"gb200-fsdp": Side(0, entry="mbridge_gb200_llama3_70b_64_fp8_fsdp"),
         "gb200-tp2pp4": Side(1, entry="mbridge_gb200_llama3_70b_64_mxfp8_tp2pp4"),
         "gb300-fsdp": Side(2, entry="mbridge_gb200_llama3_70b_64_fp8_fsdp", hardware=GB300),
         "gb300-tp1pp4": Side(3, entry="mbridge_gb200_llama3_70b_64_mxfp8_tp2pp4", edit="layout", hardware=GB300)},
        (("gb200-fsdp", "gb200-tp2pp4"), ("gb300-fsdp", "gb300-tp1pp4"))),
    "CMP-MB-RECOMPUTE-MOONLIGHT": Spec(
        {**{f"t{i}": Side(i, 0, entry=MOON, edit="recompute") for i in range(6)},
         **{f"m{i}": Side(i, 1, entry=MOON, edit="recompute") for i in range(6)}},
        _vs("t0", [f"t{i}" for i in range(1, 6)]) + _vs("m0", [f"m{i}" for i in range(1, 6)]),
        measures=("time", "memory")),
    "CMP-MB-RECOMPUTE-NANO": Spec(
        {**{f"f{i}": Side(i, 0, entry=NANO, edit="recompute") for i in range(6)},
         "m4": Side(4, 1, entry=NANO, edit="recompute"), "m5": Side(5, 1, entry=NANO, edit="recompute")},
        (*_vs("f4", ["f0", "f1", "f2", "f3", "f5"]), ("m4", "m5")), measures=("throughput", "memory")),
    "CMP-QWEN30B-EP-OVERLAP": Spec(
        {"off": Side(0, edit="a2a_overlap"), "on": Side(1, edit="a2a_overlap")}, (("on", "off"),)),
    "CMP-DSV3-LONGCTX": Spec(
        {f"l{i}": Side(i, edit="layout") for i in range(6)}, _vs("l4", ["l0", "l1", "l2", "l3", "l5"])),
    "CMP-VERL-DSV3-SCALE": Spec(
        {}, (), not_measured="recommended layouts per GPU count, no throughput on both sides: the linked layouts' "
                             "fit is checked instead"),
    "CMP-VERL-QWEN30B-SCALE": Spec(
        {f"g{i}": Side(i, entry=e) for i, e in
         enumerate(("verl_qwen3_30b_h20_8", "verl_qwen3_30b_h20_16", "verl_qwen3_30b_h20_32"))},
        _vs("g0", ["g1", "g2"])),
}

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


# --------------------------------------------------------------------------- building a side


def _recompute_text(label: str) -> str:
    """memory.recompute for a recompute label ("none", "moe_act", "mla_up_proj+mlp")."""
    names = [n.strip() for n in label.split("+")]
    return "none" if names == ["none"] else "selective: " + ", ".join(names)


LAYOUT_WORDS = (("tp", r"\bTP(\d+)"), ("pp", r"\bPP(\d+)"), ("vpp", r"\bVPP?(\d+)"), ("cp", r"\bCP(\d+)"),
                ("ep", r"\bEP(\d+)"), ("dp", r"\bDP(\d+)"))


def _layout_edit(row: dict[str, Any], label: str) -> list[str]:
    """The row with the layout and length a label states; dp re-derived when the label leaves it out, the global
    batch scaled to keep the row's tokens per step (the sources scale it so), the GPU count from "(N GPUs)"."""
    p, w, notes = row["parallelism"], row["workload"], []
    for key, pattern in LAYOUT_WORDS:
        if m := re.search(pattern, label):
            p[key] = int(m.group(1))
    if m := re.search(r"\((\d+) GPUs\)", label):
        row["hardware"]["num_gpus"] = int(m.group(1))
    if m := re.match(r"(\d+)K\b", label):
        tokens = w["seq_length"] * w["global_batch_size"]
        w["seq_length"] = int(m.group(1)) * 1024
        w["global_batch_size"] = max(1, tokens // w["seq_length"])
        w["tokens_per_step"] = w["seq_length"] * w["global_batch_size"]
        notes.append(f"global batch {w['global_batch_size']} (tokens per step kept)")
    if not re.search(r"\bDP\d+", label):
        p["dp"] = row["hardware"]["num_gpus"] // (p["tp"] * p["pp"] * (p["cp"] or 1))
    return notes


@dataclass
class Built:
    """A side as a Request (or why not), with what it could not say."""

    request: Request | None = None
    unmapped: str | None = None
    knobs: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    capacity_bytes: int | None = None


def build_side(side: Side, label: str, row: dict[str, Any], workdir: Path) -> Built:
    """The side's Request: the row edited as the label says, mapped by production_mapping.map_row."""
    row = copy.deepcopy(row)
    notes: list[str] = []
    if side.hardware:
        row["hardware"].update(dict(side.hardware))
    if side.edit == "recompute":
        row["memory"]["recompute"] = _recompute_text(label)
    elif side.edit == "layout":
        notes += _layout_edit(row, label)
    row["id"] = f"{row['id']}--{side.line}-{side.pick}"
    m = pmap.map_row(row, workdir)
    if m.request is None:
        return Built(unmapped=m.unmapped)
    request = m.request
    if side.edit == "a2a_overlap":  # "overlap off: 244.0" / "overlap on: 287.3": the plan knob moe_a2a_overlap
        request = request.model_copy(update={"moe_a2a_overlap": label.split(":")[0].strip().endswith(" on")})
    built = Built(request, None, dict(m.knobs), m.notes + notes, m.capacity_bytes)
    if side.best_without:
        return _best_without(built, side.best_without)
    return built


OPEN_FIELDS = ("tp", "pp", "vpp", "cp", "dp", "micro_batch_size", "recompute", "sequence_parallel",
               "first_stage_layers", "last_stage_layers", "pipeline_layout")


def _best_without(built: Built, degree: str) -> Built:
    """meshplan's best layout with `degree` 1, the rest of the layout open (the source does not give it)."""
    req = built.request.model_copy(update={**{f: None for f in OPEN_FIELDS}, degree: 1})
    rec = api.recommend(req, top_k=1)
    if not rec.candidates:
        return Built(unmapped=f"meshplan finds no layout with {degree}=1 that fits", knobs=built.knobs)
    plan = rec.candidates[0].plan
    fixed = {f: getattr(plan, f) for f in ("tp", "pp", "vpp", "cp", "dp", "micro_batch_size", "recompute",
                                          "sequence_parallel")}
    layout = " ".join(f"{k}={v}" for k, v in fixed.items())
    notes = [*built.notes, f"{degree}=1 side: meshplan's best layout ({layout})"]
    return Built(req.model_copy(update=fixed), None, built.knobs, notes, built.capacity_bytes)


# --------------------------------------------------------------------------- estimating and scoring


@dataclass
class Estimate:
    tflops: float | None = None  # model TFLOP/s per GPU
    step_s: float | None = None
    per_flop: dict[str, float] = field(default_factory=dict)  # step-time terms per model FLOP per GPU
    peak_bytes: int | None = None
    fits: bool | None = None
    refused: str | None = None


def estimate(built: Built) -> Estimate:
    out = Estimate()
    try:
        tp = api.estimate_throughput(built.request)
        flops = tp.model_flops_per_step / built.request.num_gpus
        out.step_s, out.tflops = tp.step_time_s, flops / tp.step_time_s / 1e12
        out.per_flop = {t: getattr(tp.breakdown, t) / flops for t in TERMS}
        mem = api.estimate_memory(built.request)
        out.peak_bytes, out.fits = mem.peak_bytes, mem.peak_bytes <= built.capacity_bytes
    except MeshplanError as exc:
        out.refused = str(exc).splitlines()[0]
    return out


@dataclass
class PairScore:
    comparison: str
    a: str  # "label" of each side
    b: str
    about: str  # throughput | time | memory | fits
    status: str = "scored"  # scored | nearest | not expressible
    why_apart: str = ""  # the knob or reason (nearest, not expressible)
    measured: float | None = None  # ratio, oriented measured winner / loser (>= 1)
    predicted: float | None = None  # the same orientation
    winner: str = ""
    fits_right: bool | None = None  # fits pairs: both verdicts right
    driver: str = ""  # why meshplan orders it wrong (the term)
    notes: list[str] = field(default_factory=list)
    searched: bool = False  # a side is meshplan's best layout (the source does not give it)

    @property
    def apart(self) -> bool:
        return self.measured is not None and self.measured > 1 + APART

    @property
    def right(self) -> bool | None:
        if self.about == "fits":
            return self.fits_right
        if self.predicted is None or not self.apart:
            return None
        return self.predicted > 1

    @property
    def ratio_error(self) -> float | None:
        if self.predicted is None or self.measured is None:
            return None
        return self.predicted / self.measured - 1


def _ratio(about: str, x: float, y: float) -> float:
    """How much better x is than y (throughput: x/y; time and memory: lower is better, y/x)."""
    return x / y if about == "throughput" else y / x


def _driver(win: Estimate, lose: Estimate, charge_winner: bool) -> str:
    """The step-time term (per model FLOP, as a share of the loser's step) that charges the measured winner most
    over the loser (a pair ordered wrong, or a winner's margin understated), or the loser most over the winner (a
    margin overstated); every term that moves by more than 0.1% follows."""
    sign = 1 if charge_winner else -1
    total = sum(lose.per_flop.values())
    diff = {t[:-2]: (win.per_flop[t] - lose.per_flop[t]) / total for t in TERMS}
    term = max(diff, key=lambda t: sign * diff[t])
    moved = ", ".join(f"{t} {d:+.1%}" for t, d in diff.items() if abs(d) > 0.001)
    if not moved:
        return "meshplan predicts a tie: no step-time term differs by 0.1% of the step between the sides"
    whom = "winner" if charge_winner else "loser"
    return f"{term} charges the measured {whom} {sign * diff[term]:+.1%} more (winner - loser: {moved})"


def score_pair(cid: str, spec: Spec, configs: list[str], keys: tuple[str, str], built: dict[str, Built],
               est: dict[str, Estimate]) -> PairScore:
    sa, sb = spec.sides[keys[0]], spec.sides[keys[1]]
    about = spec.measures[min(sa.pick, len(spec.measures) - 1)]
    va, vb = measured_value(configs, sa, sa), measured_value(configs, sb, sa)
    la, lb = line_label(configs[sa.line]), line_label(configs[sb.line])
    if sa.best_without:
        la += f" ({sa.best_without}=1)"
    if sb.best_without:
        lb += f" ({sb.best_without}=1)"
    if "OOM" in (va, vb):
        about = "fits"
    out = PairScore(cid, la, lb, about, searched=bool(sa.best_without or sb.best_without))
    ba, bb = built[keys[0]], built[keys[1]]
    for b in (ba, bb):
        out.notes += [n for n in b.notes if n not in out.notes]
    if about != "fits":
        ra = _ratio(about, float(va), float(vb))
        out.measured, out.winner = max(ra, 1 / ra), (la if ra >= 1 else lb)
    unmapped = [b.unmapped for b in (ba, bb) if b.request is None]
    if unmapped:
        out.status, out.why_apart = "not expressible", f"does not map: {unmapped[0]}"
        return out
    if ba.request == bb.request:
        out.status = "not expressible"
        out.why_apart = f"{spec.lacks or 'a setting meshplan lacks'}: both sides are the same request"
        return out
    effect = "memory" if about in ("memory", "fits") else "time"
    knobs = sorted({k for b in (ba, bb) for k in b.knobs if effect in prow.KNOBS[k][0]})
    if knobs:
        out.status, out.why_apart = "nearest", ", ".join(knobs)
    ea, eb = est[keys[0]], est[keys[1]]
    if ea.refused or eb.refused:
        out.status, out.why_apart = "not expressible", f"estimate refused: {ea.refused or eb.refused}"
        return out
    if about == "fits":
        out.fits_right = ea.fits == (va != "OOM") and eb.fits == (vb != "OOM")
        return out
    pa, pb = {"throughput": (ea.tflops, eb.tflops), "time": (ea.step_s, eb.step_s),
              "memory": (ea.peak_bytes, eb.peak_bytes)}[about]
    pred = _ratio(about, float(pa), float(pb))
    a_wins = _ratio(about, float(va), float(vb)) >= 1
    out.predicted = pred if a_wins else 1 / pred
    error = out.ratio_error
    if about != "memory" and (out.right is False or abs(error) > OFF):
        win, lose = (ea, eb) if a_wins else (eb, ea)
        out.driver = _driver(win, lose, charge_winner=out.right is False or error < 0)
    return out


@dataclass
class Result:
    pairs: list[PairScore]
    feasibility: list[tuple[str, str, bool | None, str]]  # (comparison, row, predicted to fit, why not known)
    not_measured: dict[str, str]


def run(validation: Path) -> Result:
    comparisons = yaml.safe_load((validation / DATA_NAME).read_text(encoding="utf-8"))
    rows = {r["id"]: r for r in prow.load_rows(validation / prow.DATA_NAME)}
    unknown = set(SPECS) ^ {c["id"] for c in comparisons}
    if unknown:
        raise SystemExit(f"comparisons without a spec here, or specs without a comparison: {sorted(unknown)}")
    pairs, feasibility, not_measured = [], [], {}
    with tempfile.TemporaryDirectory(prefix="meshplan-pairwise-") as tmp:
        for c in comparisons:
            spec = SPECS[c["id"]]
            if spec.not_measured:
                not_measured[c["id"]] = spec.not_measured
                for e in c["entry_ids"]:
                    m = pmap.map_row(rows[e], Path(tmp))
                    fits = None if m.request is None else estimate(Built(m.request, None, m.knobs, [],
                                                                         m.capacity_bytes)).fits
                    feasibility.append((c["id"], e, fits, m.unmapped or ", ".join(m.knobs)))
                continue
            built = {k: build_side(s, line_label(c["configs"][s.line]), rows[s.entry or c["entry_ids"][0]], Path(tmp))
                     for k, s in spec.sides.items()}
            est = {k: estimate(b) for k, b in built.items() if b.request is not None}
            pairs += [score_pair(c["id"], spec, c["configs"], keys, built, est) for keys in spec.pairs]
    return Result(pairs, feasibility, not_measured)


# --------------------------------------------------------------------------- summary and report


@dataclass
class Tally:
    pairs: int = 0
    apart: int = 0
    right: int = 0
    errors: list[float] = field(default_factory=list)

    def add(self, p: PairScore) -> None:
        self.pairs += 1
        if p.right is not None:
            self.apart += 1
            self.right += p.right
        if p.ratio_error is not None:
            self.errors.append(p.ratio_error)

    def text(self) -> str:
        share = f"{self.right / self.apart:.0%}" if self.apart else "-"
        med = (f"median {statistics.median(self.errors):+.1%}, median |.| "
               f"{statistics.median(map(abs, self.errors)):.1%}") if self.errors else "-"
        return (f"{self.pairs} pairs; ordered right {self.right} of {self.apart} more than 5% apart ({share}); "
                f"ratio error {med}")


def summarise(result: Result) -> dict[str, Tally]:
    tallies = {k: Tally() for k in ("throughput scored", "throughput scored, sides given", "throughput scored+nearest",
                                    "memory scored+nearest", "fits")}
    for p in result.pairs:
        if p.status == "not expressible":
            continue
        if p.about in ("throughput", "time"):
            if p.status == "scored":
                tallies["throughput scored"].add(p)
                if not p.searched:
                    tallies["throughput scored, sides given"].add(p)
            tallies["throughput scored+nearest"].add(p)
        else:
            tallies["memory scored+nearest" if p.about == "memory" else "fits"].add(p)
    return tallies


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.1%}" if pct else f"{x:.3f}"


def print_rows(result: Result) -> None:
    print(f"{'comparison':27s} {'A vs B':44s} {'about':10s} {'meas':>6s} {'pred':>6s} {'error':>7s} ok  status")
    for p in result.pairs:
        ok = {True: "yes", False: "NO", None: "-"}[p.right]
        pair = f"{p.a} vs {p.b}"[:44]
        line = (f"{p.comparison:27s} {pair:44s} {p.about:10s} {_fmt(p.measured):>6s} {_fmt(p.predicted):>6s} "
                f"{_fmt(p.ratio_error, True):>7s} {ok:3s} {p.status}")
        if p.why_apart:
            line += f" ({p.why_apart[:110]})"
        print(line)
        if p.winner:
            print(f"{'':28s}measured winner: {p.winner}")
        if p.driver:
            print(f"{'':28s}{'wrong' if p.right is False else 'off'}: {p.driver}")
        for n in p.notes:
            print(f"{'':28s}note: {n[:150]}")
    for cid, row, fits, why in result.feasibility:
        print(f"{cid:27s} {row:44s} fits       predicted {'fits' if fits else 'not to fit' if fits is False else '-'}"
              f" (it ran){' | ' + why if why else ''}")


def print_summary(result: Result) -> None:
    tallies = summarise(result)
    status = {s: sum(p.status == s for p in result.pairs) for s in ("scored", "nearest", "not expressible")}
    print(f"pairs {len(result.pairs)}: scored {status['scored']}, scored with the nearest expressible settings "
          f"{status['nearest']}, not expressible {status['not expressible']}")
    for name, t in tallies.items():
        print(f"  {name:26s} {t.text()}")
    for p in result.pairs:
        if p.right is False:
            print(f"  wrong: {p.comparison} {p.a} vs {p.b}: {p.driver or 'fit verdicts'}")
    apart: dict[str, int] = {}
    for p in result.pairs:
        if p.status == "not expressible":
            apart[p.why_apart] = apart.get(p.why_apart, 0) + 1
    for why, n in apart.items():
        print(f"  not expressible ({n}): {why}")
    for cid, why in result.not_measured.items():
        fits = [f for c, _, f, _ in result.feasibility if c == cid]
        print(f"  not a measured pair: {cid}: {why}: {sum(f is True for f in fits)} of {len(fits)} predicted to fit")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validation", type=Path, default=prow.DEFAULT_VALIDATION)
    parser.add_argument("--rows", action="store_true", help="print every pair")
    args = parser.parse_args()
    result = run(args.validation)
    if args.rows:
        print_rows(result)
    print_summary(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
