"""Measured pipeline-schedule gains against meshplan's: published runs that timed two schedules of one job side by
side (1F1B vs interleaved 1F1B, virtual-pipeline sizes; zero-bubble schedules once a source gives them as text).

For each pair, the measured gain of the second side over the first (its throughput / the first's - 1) against the
gain meshplan predicts (meshplan.api.estimate_throughput on each side's request, the same call as
`meshplan throughput --json`), and the error of the gain in percentage points. Beside each side: the micro-batches
per pipeline, the idle share the replayed timeline leaves (arithmetic/pipeline_timeline.py) and the exposed p2p
seconds (more virtual stages, more transfers per micro-batch): where a gain comes from or goes missing.

Data: bench/data/pipeline_schedules.yaml (each pair with its source URL, table, date and what it assumes), and every
two rows of ../shared/validation/production_configs_dev.yaml that differ only in their virtual pipeline (found by
their fields, mapped by bench/production_mapping.py as bench/production_configs.py maps them). Every pair is read
the same way; nothing here names a row.

Run: python bench/pipeline_schedules.py [--json] [--data FILE] [--validation DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bridge_published import recipe_split_fields
from production_mapping import map_row
from production_rows import DATA_NAME, DEFAULT_VALIDATION, load_rows

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.catalog import resolve_model
from meshplan.request.parse import parse_request
from meshplan.schema.request import Request

os.environ["MESHPLAN_CALIBRATION_FILE"] = ""  # the model's own numbers: a stored cluster factor never enters

DATA = Path(__file__).resolve().parent / "data" / "pipeline_schedules.yaml"
SPLIT_FIELDS = ("pipeline_layout", "first_stage_layers", "last_stage_layers", "account_for_embedding",
                "account_for_loss")
# A production row's parts that may differ between the two sides of a schedule pair: who published it, how it
# came out, and the schedule itself (parallelism.vpp, with the layout it implies).
NOT_THE_JOB = ("id", "name", "source", "outcome", "flags", "comparison_ids")
SCHEDULE_FIELDS = ("vpp", "pp_layout")
OUTCOME_METRICS = ("tokens_per_sec_per_gpu", "tflops_per_gpu")  # first one both rows give is the measure


@dataclass
class Side:
    label: str
    measured: float
    request: Request | None = field(default=None, repr=False)
    predicted: float | None = None  # tokens/s per GPU
    microbatches: int | None = None
    bubble_s: float | None = None
    p2p_s: float | None = None  # the exposed pipeline send/receive seconds the estimate adds to the stages
    step_s: float | None = None
    timeline: str = ""  # the throughput report's own words on the schedule and its idle share
    refused: str | None = None

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("request")
        out["plan"] = self.request.model_dump(exclude_none=True) if self.request is not None else None
        return out


@dataclass
class Pair:
    id: str
    title: str
    origin: str  # the data file, or the dev set's rows
    strength: str
    metric: str
    source: dict[str, str]
    assumptions: list[str]
    sides: list[Side]

    @property
    def measured_gain(self) -> float:
        a, b = self.sides
        return b.measured / a.measured - 1

    @property
    def predicted_gain(self) -> float | None:
        a, b = self.sides
        if a.predicted is None or b.predicted is None:
            return None
        return b.predicted / a.predicted - 1

    @property
    def gain_error_pp(self) -> float | None:
        """Predicted minus measured gain, in percentage points."""
        p = self.predicted_gain
        return None if p is None else 100 * (p - self.measured_gain)

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "origin": self.origin, "strength": self.strength,
                "metric": self.metric, "source": self.source, "assumptions": self.assumptions,
                "measured_gain": self.measured_gain, "predicted_gain": self.predicted_gain,
                "gain_error_pp": self.gain_error_pp, "sides": [s.summary() for s in self.sides]}


# --------------------------------------------------------------------------- estimating one side


def _with_recipe_split(req: Request) -> Request:
    """A Megatron-Bridge request that names no split gets the one Bridge's recipes set for its model, pp and vpp."""
    if req.framework != "megatron-bridge" or any(getattr(req, f) is not None for f in SPLIT_FIELDS):
        return req
    split = recipe_split_fields(req.model, req.pp or 1, req.vpp or 1, resolve_model(req.model).num_mtp_layers)
    return req.model_copy(update=split) if split else req


def estimate(side: Side) -> Side:
    """The side's throughput through meshplan.api, or the reason meshplan refuses it."""
    if side.request is None:
        return side
    try:
        report = api.estimate_throughput(side.request)
    except MeshplanError as exc:
        side.refused = str(exc)
        return side
    side.predicted = report.tokens_per_s_per_gpu
    side.microbatches = report.plan.num_microbatches(side.request.global_batch_size) \
        if side.request.global_batch_size else None
    side.bubble_s, side.p2p_s, side.step_s = report.breakdown.bubble_s, report.breakdown.pp_comm_s, report.step_time_s
    side.timeline = next((a for a in report.assumptions + report.warnings if a.startswith("Pipeline schedule")), "")
    return side


# --------------------------------------------------------------------------- the data file


def data_pairs(path: Path = DATA) -> list[Pair]:
    """Every pair of the data file, each side's request parsed as any face parses one."""
    with open(path, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    out = []
    for p in doc["pairs"]:
        sides = []
        for s in p["sides"]:
            side = Side(label=s["label"], measured=float(s["measured"]))
            try:
                side.request = _with_recipe_split(parse_request({**p["request"], **s["request"]}))
            except MeshplanError as exc:
                side.refused = f"the request cannot be parsed: {exc}"
            sides.append(side)
        if len(sides) != 2:
            raise SystemExit(f"{path}: pair {p['id']} has {len(sides)} sides; a pair has two")
        out.append(Pair(p["id"], p["title"], path.name, p["strength"], p["metric"], p["source"],
                        list(p.get("assumptions") or []), sides))
    return out


# --------------------------------------------------------------------------- the dev set's rows


def _job_key(row: dict[str, Any]) -> str:
    """Everything of a row but its schedule and its provenance, as one comparable string."""
    job = {k: v for k, v in row.items() if k not in NOT_THE_JOB}
    job["parallelism"] = {k: v for k, v in (row.get("parallelism") or {}).items() if k not in SCHEDULE_FIELDS}
    return yaml.safe_dump(job, sort_keys=True)


def _measure(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, float, float] | None:
    for name in OUTCOME_METRICS:
        va, vb = (a.get("outcome") or {}).get(name), (b.get("outcome") or {}).get(name)
        if va and vb:
            return name, float(va), float(vb)
    return None


def _vpp_order(vpp: Any) -> int:
    """A vpp as the dev set writes it (a count, or text such as '5 (interleaved 1F1B)'), for ordering a pair."""
    digits = str(vpp).split()[0] if str(vpp).strip() else ""
    return int(digits) if digits.isdigit() else 0


def row_pairs(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any], tuple[str, float, float]]]:
    """Two measured rows of the same job whose virtual pipeline differs, the smaller vpp first."""
    found = []
    for a, b in itertools.combinations(rows, 2):
        va, vb = ((r.get("parallelism") or {}).get("vpp") or 1 for r in (a, b))
        if va == vb or _job_key(a) != _job_key(b) or (m := _measure(a, b)) is None:
            continue
        first, second = (a, b) if _vpp_order(va) <= _vpp_order(vb) else (b, a)
        found.append((first, second, m if first is a else (m[0], m[2], m[1])))
    return found


def shared_pairs(validation: Path) -> list[Pair]:
    """The dev set's schedule pairs, each row mapped to a request by the production bench's own mapping."""
    path = validation / DATA_NAME
    if not path.exists():
        return []
    out = []
    with tempfile.TemporaryDirectory() as workdir:
        for a, b, (metric, ma, mb) in row_pairs(load_rows(path)):
            sides = []
            for row, measured in ((a, ma), (b, mb)):
                mapping = map_row(row, Path(workdir))
                side = Side(label=f"vpp {(row['parallelism'] or {}).get('vpp') or 1}", measured=measured,
                            request=mapping.request, refused=mapping.unmapped)
                sides.append(side)
            source = {"url": str((a.get("source") or {}).get("url")), "table": f"{a['id']} vs {b['id']}",
                      "date": str((a.get("source") or {}).get("version_or_date"))}
            out.append(Pair(f"{a['id']}~{b['id']}", str(a.get("name")), DATA_NAME, "dev-set rows differing only in vpp",
                            metric, source, [], sides))
    return out


# --------------------------------------------------------------------------- output


def run(data: Path = DATA, validation: Path = DEFAULT_VALIDATION) -> list[Pair]:
    pairs = data_pairs(data) + shared_pairs(validation)
    for p in pairs:
        for s in p.sides:
            estimate(s)
    return pairs


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def table(pairs: list[Pair]) -> str:
    lines = [f"{'pair':<52} {'sides':<34} {'measured':>9} {'meshplan':>9} {'error':>8}"]
    for p in pairs:
        a, b = p.sides
        err = "-" if p.gain_error_pp is None else f"{p.gain_error_pp:+.1f}pp"
        lines.append(f"{p.id[:52]:<52} {(a.label + ' -> ' + b.label)[:34]:<34} {_pct(p.measured_gain):>9} "
                     f"{_pct(p.predicted_gain):>9} {err:>8}")
        for s in p.sides:
            if s.refused:
                lines.append(f"    {s.label}: refused: {s.refused[:160]}")
                continue
            idle = (s.bubble_s or 0) / s.step_s if s.step_s else 0.0
            lines.append(f"    {s.label}: measured {s.measured:g}, meshplan {s.predicted:,.1f} {p.metric}; "
                         f"{s.microbatches} micro-batches, bubble {s.bubble_s:.3g} s of {s.step_s:.3g} s "
                         f"({idle:.1%}), exposed p2p {s.p2p_s:.3g} s")
            if s.timeline:
                lines.append(f"      {s.timeline}")
    scored = [abs(p.gain_error_pp) for p in pairs if p.gain_error_pp is not None]
    lines.append(f"{len(scored)} of {len(pairs)} pairs scored; median |error of the gain| "
                 f"{sorted(scored)[len(scored) // 2]:.1f} pp" if scored else "no pair scored")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object: every pair with both sides")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--validation", type=Path, default=DEFAULT_VALIDATION)
    args = ap.parse_args(argv)
    pairs = run(args.data, args.validation)
    if args.json:
        print(json.dumps({"pairs": [p.summary() for p in pairs]}, indent=2, default=str))
    else:
        print(table(pairs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
