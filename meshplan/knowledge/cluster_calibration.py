"""A user's own step-time factors per cluster, stored by `meshplan compare --calibrate` and applied by every face.

meshplan never fits anything silently: a factor exists only after the user asked `compare --calibrate` to store it,
and every throughput answer that applies one says so (ThroughputReport.calibration, its first assumption). The
factor is measured step time / predicted step time, kept per cluster (MESHPLAN_CLUSTER, default 'default'), GPU
and framework: a factor from one framework's runs says nothing about another's kernels, nor one GPU about another.

The file is JSON: {"version": 1, "factors": {cluster: {"<gpu>/<framework>": {"step_time_factor": 1.08,
"ratios": [...], "sources": [...]}}}}. Its path: $MESHPLAN_CALIBRATION_FILE, else $XDG_CONFIG_HOME/meshplan/
calibration.json, else ~/.config/meshplan/calibration.json. MESHPLAN_CALIBRATION_FILE set to an empty string
turns calibration off (the test suite does, so a developer's own file cannot move its answers).
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from meshplan.core.errors import MeshplanError
from meshplan.schema.measured import ClusterFactor
from meshplan.schema.reports import ThroughputReport

ENV_FILE, ENV_CLUSTER = "MESHPLAN_CALIBRATION_FILE", "MESHPLAN_CLUSTER"
VERSION = 1
MAX_RATIOS = 20  # the factor is the median of the last MAX_RATIOS compared runs
RATIO_BOUNDS = (0.05, 20.0)  # a measured / predicted step time outside this is a mismatched log, not a factor


def calibration_path() -> Path | None:
    """Where factors are kept (None: calibration turned off by an empty MESHPLAN_CALIBRATION_FILE)."""
    given = os.environ.get(ENV_FILE)
    if given is not None:
        return Path(given).expanduser() if given.strip() else None
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "meshplan" / "calibration.json"


def cluster_name() -> str:
    return os.environ.get(ENV_CLUSTER, "").strip() or "default"


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"version": VERSION, "factors": {}}
    except (OSError, ValueError) as exc:
        raise MeshplanError(f"Cannot read the calibration file {path}: {exc}.",
                            fix=f"Fix or delete it (meshplan compare --calibrate writes it), or point {ENV_FILE} "
                                "elsewhere ('' turns calibration off).") from None
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("factors"), dict):
        raise MeshplanError(f"{path} is not a meshplan calibration file (version {VERSION}).",
                            fix=f"Delete it and run meshplan compare --calibrate again, or point {ENV_FILE} elsewhere.")
    return data


def _key(gpu: str, framework: str) -> str:
    return f"{gpu}/{framework}"


def _factor(entry: Any, cluster: str, gpu: str, framework: str, path: Path) -> ClusterFactor:
    try:
        return ClusterFactor(cluster=cluster, gpu=gpu, framework=framework,
                             step_time_factor=float(entry["step_time_factor"]), runs=len(entry["ratios"]),
                             source=", ".join(entry["sources"][-3:]), path=str(path))
    except (KeyError, TypeError, ValueError) as exc:
        raise MeshplanError(f"{path}: the entry {cluster}/{gpu}/{framework} is unreadable ({exc}).",
                            fix="Delete that entry, or the file, and run meshplan compare --calibrate again.") from None


def stored_factor(gpu: str, framework: str) -> ClusterFactor | None:
    """This cluster's factor for a GPU and framework (None: none stored, or calibration off)."""
    path = calibration_path()
    if path is None or not path.exists():
        return None
    entry = _load(path)["factors"].get(cluster_name(), {}).get(_key(gpu, framework))
    return None if entry is None else _factor(entry, cluster_name(), gpu, framework, path)


def store_ratio(gpu: str, framework: str, ratio: float, source: str) -> ClusterFactor:
    """Add one compared run (measured / predicted step time) and store the median of the last runs as the factor."""
    path = calibration_path()
    if path is None:
        raise MeshplanError(f"Calibration is turned off ({ENV_FILE} is empty): nothing can be stored.",
                            fix=f"Set {ENV_FILE} to a file path, or unset it for ~/.config/meshplan/calibration.json.")
    low, high = RATIO_BOUNDS
    if not low <= ratio <= high:
        raise MeshplanError(f"measured / predicted step time is {ratio:.3g}, outside {low:g}-{high:g}: the log and "
                            "the config do not describe the same job; no factor was stored.",
                            fix="Check that the log is this config's run (GPU count, batch, sequence length).")
    data = _load(path)
    entry = data["factors"].setdefault(cluster_name(), {}).setdefault(
        _key(gpu, framework), {"ratios": [], "sources": []})
    entry["ratios"] = [*entry.get("ratios", []), round(ratio, 6)][-MAX_RATIOS:]
    entry["sources"] = [*entry.get("sources", []), source][-MAX_RATIOS:]
    entry["step_time_factor"] = round(statistics.median(entry["ratios"]), 6)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    except OSError as exc:
        raise MeshplanError(f"Cannot write the calibration file {path}: {exc.strerror or exc}.",
                            fix=f"Point {ENV_FILE} at a writable path.") from None
    return _factor(entry, cluster_name(), gpu, framework, path)


def calibrated(report: ThroughputReport, factor: ClusterFactor) -> ThroughputReport:
    """The report with the cluster's step-time factor applied to the step and its parts, and said so."""
    f = factor.step_time_factor
    breakdown = report.breakdown.model_copy(update={k: v * f for k, v in report.breakdown.model_dump().items()})
    return report.model_copy(update={
        "step_time_s": report.step_time_s * f, "tokens_per_s_per_gpu": report.tokens_per_s_per_gpu / f,
        "tokens_per_s": report.tokens_per_s / f, "mfu": report.mfu / f, "breakdown": breakdown,
        "calibration": factor, "assumptions": [factor.words(), *report.assumptions]})
