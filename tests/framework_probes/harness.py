"""Evidence that meshplan's rules are the frameworks' rules: generated layouts, the frameworks' own verdicts, ours.

This module runs in the test (or bench) process. It generates layouts per framework (valid and
invalid, across world sizes, degrees, heads, layers, experts, batches and sequence lengths), sends
them to a probe script that runs INSIDE a throwaway venv holding the real framework code
(tests/framework_probes/<name>_probe.py), and compares each verdict with `meshplan.check.config.check_config`
on the same layout, restricted to the rule ids that model what that framework's validator checks
(`FRAMEWORKS[name].compared`). A disagreement counts as explained only when
cards/validator_agreement.yaml names it (rule id, framework, the condition under which it happens).

The venv: Python 3.11 with CPU torch 2.13.0 (the wheel this machine keeps on disk; any other
torch/Python pair would download a multi-GB CUDA build) plus the small pure-Python dependencies the
validators import; the frameworks themselves are the pinned wheels, unpacked (`wheel_tree`) and put
on PYTHONPATH. The wheels target Python 3.12 only through typing names (`typing.override`,
`typing.TypedDict` for pydantic) that the probes take from typing_extensions.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from meshplan.request.resolve import carry_cards

HERE = Path(__file__).resolve().parent
CARD = HERE.parent.parent / "cards" / "validator_agreement.yaml"

# One venv for every probe; pins chosen so that pip finds them on this machine's disk where it can.
VALIDATOR_REQUIREMENTS = [
    "torch==2.13.0",
    "triton==3.8.0",  # megatron.core imports it at module level (moe/ops/paged_stash.py)
    "numpy",
    "packaging",
    "typing_extensions",
    "hydra-core==1.3.2",
    "omegaconf==2.3.1",
    "codetiming",
    "tensordict==0.10.0",
    "ray==2.58.0",
    "transformers==5.10.4",
    "loguru",
    "cloudpathlib",
    "pandas",
    "aiohttp",
    "orjson",
    "pybase64",
    "tyro",
    "spmd_types==0.2.3",
]
VENV_PYTHON = "3.11"


# --------------------------------------------------------------------------- the card of explained disagreements


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Explanation(_Strict):
    """One known, explained disagreement: when it happens, who says what, and why."""

    rule: str = Field(description="meshplan rule id (or 'none' when meshplan has no rule for it)")
    when: str = Field(description="Python expression over the case fields (and dp) that selects the configs")
    framework_verdict: str
    meshplan_verdict: str
    why: str
    source: str


class FrameworkEvidence(_Strict):
    package: str
    how: str = Field(description="How the real validator runs here, or why it cannot")
    compared_rules: list[str] = []
    not_compared: list[str] = []
    explained: list[Explanation] = []


class AgreementCard(_Strict):
    description: str
    frameworks: dict[str, FrameworkEvidence]


def load_card() -> AgreementCard:
    return AgreementCard.model_validate(yaml.safe_load(CARD.read_text(encoding="utf-8")))


# --------------------------------------------------------------------------- cases


def _mp(case: dict) -> int:
    return case["tp"] * case["pp"] * case["cp"]


def case_dp(case: dict) -> int:
    """The data-parallel size the frameworks derive (floor, as dp_shard=-1 and Megatron do)."""
    return max(1, case["num_gpus"] // _mp(case))


def _model(rng: random.Random, moe: bool) -> dict:
    heads = rng.choice([8, 12, 16, 24, 32, 40, 64])
    kv = rng.choice([k for k in (1, 2, 4, 8, heads) if heads % k == 0])
    experts = rng.choice([8, 16, 60, 64]) if moe else None
    return {
        "num_layers": rng.choice([8, 12, 16, 24, 30, 32, 36, 48]),
        "hidden_size": heads * 64,
        "ffn_hidden_size": heads * 64 * 4,
        "num_attention_heads": heads,
        "num_kv_heads": kv,
        "num_experts": experts,
        "top_k": 2 if moe else 0,
        "add_bias_linear": rng.random() < 0.3,
    }


def _batch(rng: random.Random, case: dict) -> None:
    dp = case_dp(case)
    case["micro_batch_size"] = rng.choice([1, 1, 2, 4])
    if rng.random() < 0.6:
        case["global_batch_size"] = case["micro_batch_size"] * dp * rng.choice([1, 2, 4, 8])
    else:
        case["global_batch_size"] = rng.choice([8, 16, 60, 64, 96, 100, 128, 250, 256])


def megatron_case(rng: random.Random, i: int) -> dict:
    """Every knob free: all of Megatron-Core's layout rules are compared."""
    moe = rng.random() < 0.4
    tp = rng.choice([1, 1, 2, 4, 8, 3])
    pp = rng.choice([1, 1, 2, 3, 4])
    case = {
        "id": f"mc{i}", "num_gpus": rng.choice([1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128]),
        "tp": tp, "pp": pp, "vpp": rng.choice([1, 1, 1, 2, 3]) if pp > 1 or rng.random() < 0.1 else 1,
        "cp": rng.choice([1, 1, 1, 2, 4]),
        "ep": rng.choice([1, 2, 4, 8]) if moe or rng.random() < 0.05 else 1,
        "etp": rng.choice([1, 1, tp, 2]),
        "sequence_parallel": tp > 1 if rng.random() < 0.8 else rng.random() < 0.5,
        "seq_length": rng.choice([2048, 4096, 4096, 4100, 6144, 8192]),
        "model": _model(rng, moe), "first_stage_layers": None, "last_stage_layers": None,
    }
    if pp > 1 and rng.random() < 0.15:
        layers = case["model"]["num_layers"]
        case["first_stage_layers"] = rng.choice([layers // pp - 1, layers // pp + 1, 2])
        if rng.random() < 0.5:
            case["last_stage_layers"] = rng.choice([layers // pp - 1, 1, 3])
    _batch(rng, case)
    return case


def _valid_model(case: dict, rng: random.Random) -> dict:
    """A dense model every head/layer rule accepts for this layout (for frameworks that do not check them)."""
    tp, pp, vpp = case["tp"], case["pp"], case["vpp"]
    heads = 8 * tp
    return {"num_layers": pp * vpp * rng.choice([2, 4, 6]), "hidden_size": heads * 64,
            "ffn_hidden_size": heads * 256, "num_attention_heads": heads, "num_kv_heads": tp,
            "num_experts": None, "top_k": 0, "add_bias_linear": False}


def rl_case(prefix: str) -> Callable[[random.Random, int], dict]:
    """verl / SkyRL: world law and batch rules are compared; heads and layers are left valid."""

    def make(rng: random.Random, i: int) -> dict:
        tp = rng.choice([1, 1, 2, 4, 8, 3])
        pp = rng.choice([1, 1, 2, 4, 3])
        cp = rng.choice([1, 1, 2])
        case = {"id": f"{prefix}{i}", "num_gpus": rng.choice([1, 2, 4, 6, 8, 12, 16, 24, 32, 64]),
                "tp": tp, "pp": pp, "vpp": 1, "cp": cp, "ep": 1, "etp": 1,
                "sequence_parallel": tp > 1 if rng.random() < 0.8 else True,
                "seq_length": 4096 * cp, "first_stage_layers": None, "last_stage_layers": None}
        case["model"] = _valid_model(case, rng)
        _batch(rng, case)
        return case

    return make


def torchtitan_case(rng: random.Random, i: int) -> dict:
    """torchtitan: the mesh product, EP folding into dp_shard*cp*tp, and the missing ETP are compared."""
    tp = rng.choice([1, 2, 4, 8, 3])
    pp = rng.choice([1, 1, 2, 4])
    cp = rng.choice([1, 1, 2])
    world = rng.choice([1, 2, 4, 6, 8, 12, 16, 24, 32, 64])
    case = {"id": f"tt{i}", "num_gpus": world, "tp": tp, "pp": pp, "vpp": 1, "cp": cp,
            "ep": rng.choice([1, 1, 2, 4, 8, 3]), "etp": rng.choice([1, 1, 1, 2]),
            "sequence_parallel": tp > 1, "seq_length": 4096 * cp * 3,
            "first_stage_layers": None, "last_stage_layers": None}
    # an explicit dp that does not multiply out, sometimes
    case["dp"] = rng.choice([None, None, None, max(1, world // (tp * pp * cp)) + 1])
    model = _valid_model(case, rng)
    if case["ep"] > 1:
        model.update(num_experts=case["ep"] * rng.choice([2, 4]), top_k=2)
    case["model"] = model
    dp = case["dp"] or case_dp(case)
    case["micro_batch_size"] = 1
    case["global_batch_size"] = 8 * dp
    return case


@dataclass(frozen=True)
class FrameworkSpec:
    name: str  # meshplan framework name
    probe: str
    wheels: tuple[str, ...]  # dists whose unpacked wheels go on PYTHONPATH (first = package root)
    extra_paths: tuple[str, ...] = ()  # sub-folders of the first wheel to add too
    generate: Callable[[random.Random, int], dict] = megatron_case
    compared: frozenset[str] = field(default_factory=frozenset)
    warning_compared: frozenset[str] = field(default_factory=frozenset)


FRAMEWORKS: dict[str, FrameworkSpec] = {
    "megatron-core": FrameworkSpec(
        "megatron-core", "megatron_probe.py", ("megatron-core",), generate=megatron_case,
        compared=frozenset({"WS001", "WS002", "TP001", "TP002", "CP001", "EP001", "EP002", "EP004",
                            "PP001", "PP002", "PP003", "PP004", "PP007", "BS001"}),
        warning_compared=frozenset({"SP001"}),
    ),
    # Bridge's ConfigContainer.validate() runs the same Megatron-Core checks (see the card); meshplan is
    # asked as megatron-bridge and compared with the megatron-core probe on the same layouts.
    "megatron-bridge": FrameworkSpec(
        "megatron-bridge", "megatron_probe.py", ("megatron-core",), generate=megatron_case,
        compared=frozenset({"WS001", "WS002", "TP001", "TP002", "CP001", "EP001", "EP002", "EP004",
                            "PP001", "PP002", "PP003", "PP004", "PP007", "BS001"}),
    ),
    "verl": FrameworkSpec(
        "verl", "verl_probe.py", ("verl",), generate=rl_case("vl"),
        compared=frozenset({"WS001", "VL001"}), warning_compared=frozenset({"SP001"}),
    ),
    "skyrl": FrameworkSpec(
        "skyrl", "skyrl_probe.py", ("skyrl",), extra_paths=("skyrl-gym",), generate=rl_case("sk"),
        compared=frozenset({"WS001", "SK001"}),
    ),
    "torchtitan": FrameworkSpec(
        "torchtitan", "torchtitan_probe.py", ("torchtitan",), generate=torchtitan_case,
        compared=frozenset({"WS004", "WS005", "TT001"}),
    ),
}


# Frameworks that cannot run here: meshplan is checked against their documented rules (see the card).
FRAMEWORKS_DOCUMENTED: dict[str, frozenset[str]] = {
    "kempnerforge": frozenset({"WS006", "TP001", "TP003", "KF001", "EP001", "EP002"}),
}


def generate(framework: str, count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(f"{framework}-{seed}")
    return [FRAMEWORKS[framework].generate(rng, i) for i in range(count)]


# --------------------------------------------------------------------------- the frameworks' verdicts


def validators_python() -> Path:
    """The cached venv the probes run in (built once per machine, about two minutes)."""
    sys.path.insert(0, str(HERE.parent))
    from framework_packages import venv_python

    return venv_python("validators", VALIDATOR_REQUIREMENTS, python_version=VENV_PYTHON)


def probe_env(spec: FrameworkSpec) -> dict[str, str]:
    sys.path.insert(0, str(HERE.parent))
    from framework_packages import wheel_tree

    roots = [wheel_tree(dist) for dist in spec.wheels]
    paths = [str(r) for r in roots] + [str(roots[0] / sub) for sub in spec.extra_paths]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PYTHONPATH=os.pathsep.join(paths), RAY_DISABLE_IMPORT_WARNING="1", TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", WANDB_MODE="disabled", CUDA_VISIBLE_DEVICES="")
    return env


def framework_verdicts(framework: str, cases: list[dict], timeout: float = 1200) -> list[dict]:
    """Run the framework's own validators (in the venv) over the cases."""
    spec = FRAMEWORKS[framework]
    proc = subprocess.run(
        [str(validators_python()), str(HERE / spec.probe)], input=json.dumps(cases), capture_output=True,
        text=True, env=probe_env(spec), timeout=timeout, cwd=str(HERE),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{spec.probe} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout)


# --------------------------------------------------------------------------- meshplan's verdicts


def job_and_plan(case: dict, framework: str):
    from meshplan.knowledge.hardware import get_gpu
    from meshplan.schema.model import Architecture, MoESpec
    from meshplan.schema.plan import Job, Plan, RLJob

    m = case["model"]
    moe = None
    if m.get("num_experts"):
        moe = MoESpec(num_experts=m["num_experts"], top_k=m["top_k"], expert_ffn_hidden_size=m["ffn_hidden_size"] // 4,
                      moe_layers=list(range(m["num_layers"])), expert_bias=m["add_bias_linear"])
    bias = bool(m["add_bias_linear"])
    arch = Architecture(
        name=f"generated-{case['id']}", model_type="llama", num_layers=m["num_layers"], hidden_size=m["hidden_size"],
        ffn_hidden_size=m["ffn_hidden_size"], num_attention_heads=m["num_attention_heads"],
        num_kv_heads=m["num_kv_heads"], head_dim=m["hidden_size"] // m["num_attention_heads"], vocab_size=32000,
        max_position_embeddings=1 << 20, qkv_bias=bias, o_bias=bias, mlp_bias=bias, moe=moe, origin="generated",
    )
    gpu = get_gpu("h100")
    # verl's probe runs its PPO trainer's validate_config (one step: train_batch_size = the global batch, rollout.n
    # 1), whose batch rule VL001 is an RL job's: a training job is verl's SFT trainer (VL003)
    half = case["seq_length"] // 2
    rl = RLJob(prompts_per_step=case["global_batch_size"], samples_per_prompt=1, prompt_length=half,
               response_length=case["seq_length"] - half) if framework == "verl" else None
    job = carry_cards(Job(model=arch, gpu=gpu, num_gpus=case["num_gpus"], gpus_per_node=gpu.gpus_per_node,
                          seq_length=case["seq_length"], global_batch_size=case["global_batch_size"],
                          framework=framework, rl=rl))
    plan = Plan(tp=case["tp"], pp=case["pp"], vpp=case["vpp"], cp=case["cp"], ep=case["ep"], etp=case["etp"],
                dp=case.get("dp") or case_dp(case), sequence_parallel=case["sequence_parallel"],
                zero_stage=3 if framework in ("torchtitan", "kempnerforge") else 1,
                micro_batch_size=case["micro_batch_size"],
                first_stage_layers=case.get("first_stage_layers"), last_stage_layers=case.get("last_stage_layers"))
    return job, plan


def meshplan_findings(case: dict, framework: str) -> list[Any]:
    from meshplan.check.config import check_config

    job, plan = job_and_plan(case, framework)
    return check_config(job, plan, include_memory=False).findings


# --------------------------------------------------------------------------- comparison


@dataclass
class Row:
    case: dict
    framework_accept: bool | None
    framework_stage: str
    framework_message: str
    framework_warnings: list[str]
    errors: list[str]  # meshplan error ids within the compared set
    other_errors: list[str]  # meshplan error ids outside it (not compared)
    warnings: list[str]
    explained_by: str = ""
    meshplan_crash: str = ""  # check_config raised instead of answering: a defect, never explained

    @property
    def meshplan_accept(self) -> bool | None:
        return None if self.meshplan_crash else not self.errors

    @property
    def agree(self) -> bool:
        return self.framework_accept is self.meshplan_accept

    def describe(self) -> str:
        c = self.case
        layout = (f"W={c['num_gpus']} tp={c['tp']} pp={c['pp']} vpp={c['vpp']} cp={c['cp']} ep={c['ep']} "
                  f"etp={c['etp']} sp={c['sequence_parallel']} dp={c.get('dp') or case_dp(c)} "
                  f"gbs={c['global_batch_size']} mbs={c['micro_batch_size']} seq={c['seq_length']} "
                  f"model={c['model']} first={c.get('first_stage_layers')} last={c.get('last_stage_layers')}")
        fw = "accept" if self.framework_accept else f"reject at {self.framework_stage}: {self.framework_message}"
        ours = f"crashed: {self.meshplan_crash}" if self.meshplan_crash else f"errors={self.errors or 'none'}"
        return f"{c['id']}: {layout}\n  framework: {fw}\n  meshplan: {ours}"


def _matches(expl: Explanation, case: dict) -> bool:
    scope = {**case, **case["model"], "dp": case.get("dp") or case_dp(case), "mp": _mp(case)}
    return bool(eval(expl.when, {"__builtins__": {}}, scope))


def compare(framework: str, cases: list[dict], verdicts: list[dict], card: AgreementCard | None = None) -> list[Row]:
    spec = FRAMEWORKS[framework]
    card = card or load_card()
    explained = card.frameworks[framework].explained if framework in card.frameworks else []
    rows = []
    for case, verdict in zip(cases, verdicts, strict=True):
        assert verdict["id"] == case["id"]
        crash = ""
        try:
            findings = meshplan_findings(case, framework)
        except Exception as exc:  # reported as a defect of meshplan, with the case
            findings, crash = [], f"{type(exc).__name__}: {exc}"
        errors = sorted({f.id for f in findings if f.severity == "error"})
        row = Row(case, verdict["accept"], verdict["stage"], verdict["message"], verdict["warnings"],
                  [e for e in errors if e in spec.compared], [e for e in errors if e not in spec.compared],
                  sorted({f.id for f in findings if f.severity != "error"}), meshplan_crash=crash)
        if not row.agree and not crash:
            for expl in explained:
                if _matches(expl, case):
                    row.explained_by = f"{expl.rule}: {expl.why.split('.')[0]}"
                    break
        rows.append(row)
    return rows


def sp_warning_rows(rows: list[Row]) -> list[Row]:
    """Rows where the framework turned SP off and meshplan's SP001 warning disagrees (or vice versa)."""
    out = []
    for row in rows:
        if row.framework_accept is not True:
            continue
        dropped = any("sequence" in w.lower() and ("disabled" in w or "off" in w) for w in row.framework_warnings)
        if dropped != ("SP001" in row.warnings):
            out.append(row)
    return out


def summary(rows: list[Row]) -> dict[str, Any]:
    agree = sum(r.agree for r in rows)
    explained = sum(1 for r in rows if not r.agree and r.explained_by)
    return {
        "configs": len(rows),
        "framework_rejects": sum(r.framework_accept is False for r in rows),
        "crashes": sum(r.framework_accept is None for r in rows),
        "meshplan_crashes": sum(bool(r.meshplan_crash) for r in rows),
        "agree": agree,
        "agreement": agree / len(rows) if rows else 1.0,
        "explained": explained,
        "unexplained": len(rows) - agree - explained,
    }
