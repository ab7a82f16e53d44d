"""Renders the skill documents' tables from the cards, so what agents read and what the tools compute agree.

A markdown file under skills/ marks each generated block with a pair of HTML comments:

    <!-- meshplan:begin dense-by-size -->
    ...generated, do not edit...
    <!-- meshplan:end dense-by-size -->

`render_all(check=False)` rewrites every block from its card, and the MCP server's published tool list
(meshplan/faces/mcp/tool_schemas.json, from the tools' functions: faces/mcp/tool_list.py); `render_all(check=True)`
writes nothing and returns the files that differ (`meshplan docs --check`, run by a test). Prose
outside the markers is written by hand. Rows that name a model, a GPU count and a layout show the
tool's own predicted memory and throughput, so regenerating after an estimator change is how the
documents follow the tools. Output is deterministic: fixed row order, fixed rounding.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from meshplan.adapters.capabilities import KNOBS
from meshplan.arithmetic import mesh
from meshplan.check.config import check_config
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB
from meshplan.estimate.accuracy import accuracy_card
from meshplan.estimate.memory import estimate_memory
from meshplan.estimate.perf import estimate_throughput
from meshplan.faces.mcp import tool_list
from meshplan.faces.mcp.deferred import SCHEMA_FILE
from meshplan.knowledge.adapter_knobs import adapter_section
from meshplan.knowledge.cards import HardwareCard, framework_card, load_card
from meshplan.knowledge.catalog import describe_architecture, resolve_model
from meshplan.knowledge.hardware import get_gpu
from meshplan.knowledge.tables import CheckedLayout, DiffersFromSearch, pitfalls_card, strategies_card
from meshplan.request.resolve import resolve
from meshplan.rules.engine import rules_card
from meshplan.schema.choices import FRAMEWORKS
from meshplan.schema.plan import Job, Plan
from meshplan.schema.request import Request
from meshplan.search.space import search_card

BLOCK = re.compile(
    r"(<!-- meshplan:begin (?P<name>[a-z0-9:.-]+) -->\n)(?P<body>.*?)(<!-- meshplan:end (?P=name) -->)",
    re.DOTALL,
)
OPEN = re.compile(r"<!-- meshplan:begin ([a-z0-9:.-]+) -->")


def skills_root() -> Path:
    """The skills folder (the repo's skills/ in an editable install)."""
    return Path(str(resources.files("meshplan.skills")))


# --------------------------------------------------------------------------- checked rows


class RowNumbers(BaseModel):
    """What the tools say about one checked row."""

    model_config = ConfigDict(extra="forbid")

    plan: Plan
    dp: int
    expert_dp: int
    total_params: int
    active_params: int
    peak_bytes: int
    peak_stage: int
    capacity_bytes: int
    fits: bool
    tokens_per_s_per_gpu: float
    mfu: float
    ok: bool
    errors: list[str]


def job_and_plan(row: CheckedLayout) -> tuple[Job, Plan]:
    """The Job and Plan a checked row stands for."""
    return resolve(Request(**row.request_fields()))


@cache
def _numbers(row_json: str) -> RowNumbers:
    row = CheckedLayout.model_validate_json(row_json)
    job, plan = job_and_plan(row)
    memory = estimate_memory(job, plan)
    speed = estimate_throughput(job, plan)
    check = check_config(job, plan)
    counts = describe_architecture(job.model)
    return RowNumbers(
        plan=plan, dp=plan.dp, expert_dp=int(mesh.expert_dp(job.num_gpus, plan, job.card.world_size_law)),
        total_params=counts.total_params, active_params=counts.active_params,
        peak_bytes=memory.peak_bytes, peak_stage=memory.peak_stage, capacity_bytes=memory.capacity_bytes,
        fits=memory.fits, tokens_per_s_per_gpu=speed.tokens_per_s_per_gpu, mfu=speed.mfu,
        ok=check.ok, errors=[f"{f.id}: {f.message}" for f in check.findings if f.severity == "error"],
    )


def row_numbers(row: CheckedLayout) -> RowNumbers:
    return _numbers(row.model_dump_json())


def checked_rows() -> list[tuple[str, CheckedLayout]]:
    """Every row of the strategies card that names a model, a GPU count and a layout, by row id."""
    card = strategies_card()
    rows = [(r.id, r.example) for r in card.dense_by_size if r.example is not None]
    rows += [(r.id, r.recipe) for r in card.moe_by_model]
    rows += [(r.id, r.job) for r in card.examples]
    return rows


# --------------------------------------------------------------------------- formatting


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f}"


def _params(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n < 1e12 else f"{n / 1e12:.2f}T"


def _rate(x: float) -> str:
    """Three significant figures, so estimator noise in the last digits does not churn the documents."""
    if x <= 0:
        return "0"
    rounded = float(f"{x:.3g}")
    decimals = max(0, 2 - math.floor(math.log10(rounded)))
    return f"{rounded:,.{decimals}f}"


def _etp_written(row: CheckedLayout) -> bool:
    """Whether a row's etp must be written out: an MoE row whose etp differs from what leaving it out resolves to
    (request.resolve: tp where the framework card's defaults.etp is "tp", as Megatron-Core's, else 1), so that the
    layout typed back in is the row's (ETP1 under TP2 on Megatron)."""
    if not resolve_model(row.model).is_moe:
        return False
    left_out = row.layout.tp if framework_card(row.framework).defaults.etp == "tp" else 1
    return row.layout.etp != left_out


def _layout(row: CheckedLayout, numbers: RowNumbers) -> str:
    """The layout as complete as a reader must type it: the degrees, ETP where it differs from what leaving it out
    gives, the stage sizes, the derived DP (and expert DP) and the recompute."""
    text = row.layout.short()
    if _etp_written(row) and f"ETP{row.layout.etp}" not in text.split():
        head, sep, rest = text.partition(" (")
        text = f"{head} ETP{row.layout.etp}" + (sep + rest if sep else "")
    text += f" DP{numbers.dp}"
    if row.layout.ep > 1:
        text += f" (expert-DP {numbers.expert_dp})"
    if row.layout.recompute != "none":
        text += f", {row.layout.recompute} recompute"
    return text


def _memory(numbers: RowNumbers) -> str:
    return f"{_gib(numbers.peak_bytes)} / {_gib(numbers.capacity_bytes)} (stage {numbers.peak_stage})"


def _sources(rows: list[tuple[str, str]]) -> str:
    return "\n".join(f"- `{rid}`: {_cell(src)}" for rid, src in rows)


def _slower_than_pick() -> str:
    """'more than 15% slower than its top pick', with what that percentage means (meshplan.search.slower_by)."""
    tolerance = search_card().comparison.agreement_tolerance
    return (f"more than {tolerance:.0%} slower than its top pick (at least {tolerance:.0%} fewer tokens/s/GPU: "
            "X% slower = 1 - recipe / pick)")


def _differs(rows: list[tuple[str, DiffersFromSearch | None]]) -> str:
    """Why recommend_parallelism ranks a recipe more than 15% below its top pick (bench/recipes_agreement.py)."""
    items = [f"- {rid}: {_cell(d.text)} ({_cell(d.source)})" for rid, d in rows if d is not None]
    if not items:
        return ""
    return (f"\n\nWhere recommend_parallelism predicts these recipes {_slower_than_pick()}, "
            "and why (what the recipe optimises for; what meshplan's cost model does not capture):\n\n"
            + "\n".join(items))


def _gpu_name(key: str) -> str:
    return get_gpu(key).name


# --------------------------------------------------------------------------- blocks


def block_dense_by_size() -> str:
    card = strategies_card()
    body = []
    for r in card.dense_by_size:
        size = f"{r.min_params_b:g}-{r.max_params_b:g}B" if r.max_params_b < 10000 else f"{r.min_params_b:g}B+"
        if r.example is not None:
            n = row_numbers(r.example)
            ex = f"{r.example.model}, {r.example.num_gpus}x {r.example.gpu}: {_layout(r.example, n)}"
            body.append([size, r.gpus, r.start, ex, _memory(n), _rate(n.tokens_per_s_per_gpu), f"{n.mfu:.0%}"])
        else:
            body.append([size, r.gpus, r.start, "-", "-", "-", "-"])
    table = _table(["Size (total params)", "GPUs", "Start from", "Checked example (seq 4096)",
                    "Peak GiB/GPU (worst stage)", "Tokens/s/GPU", "MFU"], body)
    why = "\n".join(f"- **{r.start}** ({r.id}): {_cell(r.why)}" for r in card.dense_by_size)
    return (f"{table}\n\nWhy:\n\n{why}\n\nSources:\n\n" + _sources([(r.id, r.source) for r in card.dense_by_size])
            + _differs([(r.id, r.differs_from_search) for r in card.dense_by_size]))


def block_moe_by_model() -> str:
    card = strategies_card()
    body = []
    for r in card.moe_by_model:
        n = row_numbers(r.recipe)
        body.append([r.recipe.model, f"{_params(n.total_params)} / {_params(n.active_params)}", r.recipe.num_gpus,
                     _layout(r.recipe, n), _memory(n), _rate(n.tokens_per_s_per_gpu), f"{n.mfu:.0%}", r.notes])
    table = _table(["Model", "Total / active", "GPUs (H100)", "Layout", "Peak GiB/GPU (worst stage)",
                    "Tokens/s/GPU", "MFU", "Notes"], body)
    return (f"{table}\n\nSources:\n\n" + _sources([(r.id, r.source) for r in card.moe_by_model])
            + _differs([(r.id, r.differs_from_search) for r in card.moe_by_model]))


def block_moe_by_size() -> str:
    card = strategies_card()
    body = []
    for r in card.moe_by_size:
        size = f"{r.min_params_b:g}-{r.max_params_b:g}B" if r.max_params_b < 10000 else f"{r.min_params_b:g}B+"
        body.append([size, r.start, r.source])
    return _table(["Total params", "Start from", "Source"], body)


def block_topology() -> str:
    rows = [[r.situation, r.advice, r.source] for r in strategies_card().topology]
    return _table(["Situation", "Advice", "Source"], rows)


def block_sequence_length() -> str:
    body = []
    for r in strategies_card().sequence_length:
        span = f"{r.min_seq:,}-{r.max_seq:,}" if r.max_seq is not None else f"{r.min_seq:,}+"
        cp = f"{r.cp}" + (f" ({r.cp_comm_type})" if r.cp_comm_type else "")
        body.append([span, cp, r.advice, r.source])
    return _table(["Tokens per sequence", "CP to start from", "Advice", "Source"], body)


def _cli(row: CheckedLayout) -> str:
    fields = row.request_fields()
    model = fields.pop("model")
    parts = ["meshplan check", model]
    for key, value in fields.items():
        default = Request.model_fields[key].default
        if default is None and key in Plan.model_fields:  # left out, the plan's default fills it (request.resolve)
            default = Plan.model_fields[key].default
        keeps_etp = key == "etp" and _etp_written(row)  # etp left out means etp = tp on a Megatron MoE
        if not keeps_etp and (value == default or (key in ("vpp", "cp", "ep", "etp", "tp", "pp") and value == 1)):
            continue
        parts.append(f"--{key.replace('_', '-')} {str(value).lower() if isinstance(value, bool) else value}")
    return " ".join(parts)


def block_examples() -> str:
    out = []
    for ex in strategies_card().examples:
        n = row_numbers(ex.job)
        out.append(f"#### {ex.title}\n\n{_cell(ex.description)}\n")
        out.append(_table(
            ["GPUs", "Layout", "Seq", "Peak GiB/GPU (worst stage)", "Tokens/s/GPU", "MFU"],
            [[f"{ex.job.num_gpus}x {_gpu_name(ex.job.gpu)} ({ex.job.framework})", _layout(ex.job, n),
              ex.job.seq_length, _memory(n), _rate(n.tokens_per_s_per_gpu), f"{n.mfu:.0%}"]],
        ))
        out.append(f"\n```bash\n{_cli(ex.job)}\n```\n\nSource: {_cell(ex.source)}\n")
        if ex.differs_from_search is not None:
            d = ex.differs_from_search
            out.append(f"Why recommend_parallelism predicts this {_slower_than_pick()}: {_cell(d.text)} "
                       f"(Sources: {_cell(d.source)})\n")
    return "\n".join(out).rstrip()


def block_tradeoffs() -> str:
    rows = [[t.dimension, t.splits, t.communication, t.saves, t.use_when, t.avoid_when]
            for t in strategies_card().tradeoffs]
    table = _table(["Dimension", "Splits", "Communication", "Saves", "Use when", "Avoid when"], rows)
    return f"{table}\n\nSources:\n\n" + _sources([(t.dimension, t.source) for t in strategies_card().tradeoffs])


def block_workflow() -> str:
    return "\n".join(f"{s.step}. **{_cell(s.action)}** Tool: `{s.tool.split(' (')[0]}`"
                     + (f" ({s.tool.split(' (', 1)[1]}" if " (" in s.tool else "") + f". Read: {_cell(s.read)}"
                     for s in strategies_card().workflow)


def block_corrections() -> str:
    out = []
    for c in strategies_card().corrections:
        out.append(f"- **{c.id}** (seed `{c.seed.split(' ')[0]}`). Claim: \"{_cell(c.claim)}\" "
                   f"Right: {_cell(c.correct)} Why: {_cell(c.why)} Source: {_cell(c.source)}")
    return "\n".join(out)


def _pitfall_rows(area: str | None = None, framework: str | None = None) -> str:
    rows = []
    for p in pitfalls_card().pitfalls:
        if area is not None and p.area != area:
            continue
        if framework is not None and framework not in p.frameworks:
            continue
        fw = ", ".join(p.frameworks) or "all"
        rules = ", ".join(p.rule_ids) or "-"
        rows.append([p.title, p.symptom, p.cause, p.fix, rules, fw, p.source])
    return _table(["Pitfall", "Symptom", "Cause", "Fix", "Rule ids", "Frameworks", "Source"], rows)


def block_pitfalls() -> str:
    return _pitfall_rows()


def block_pitfalls_memory() -> str:
    return _pitfall_rows(area="memory")


def block_oom_ladder() -> str:
    rows = [[s.step, s.action, s.saves, s.costs, s.request_change, s.source] for s in pitfalls_card().oom_ladder]
    return _table(["#", "Try", "Saves", "Costs", "With the tools", "Source"], rows)


def block_rules(framework: str | None = None) -> str:
    rows = []
    for r in rules_card().rules:
        if framework is not None and not ("all" in r.frameworks or framework in r.frameworks):
            continue
        rows.append([f"`{r.id}`", r.severity, r.title, ", ".join(r.frameworks), r.source])
    return _table(["Id", "Severity", "Rule", "Frameworks", "Source"], rows)


def block_framework(name: str) -> str:
    """The facts meshplan assumes about one framework, and its knob -> key table, from its card."""
    if name not in FRAMEWORKS:
        raise MeshplanError(f"No framework card {name!r}.", fix=f"Known: {', '.join(FRAMEWORKS)}.")
    card = framework_card(name)
    fix, search = card.memory_fix, card.search
    highest = "none (keeps the stage)" if fix.highest_zero_stage is None else str(fix.highest_zero_stage)
    if fix.highest_zero_stage_with_pp is not None:
        highest += f" ({fix.highest_zero_stage_with_pp} with pp > 1)"
    searched = ["tp", "pp", "dp", "ZeRO stage", *(k for k in ("vpp", "cp", "ep", "etp") if getattr(search, k)),
                "recompute " + "/".join(search.recompute), *(["flex MoE dispatcher"] if card.flex_dispatcher else [])]
    facts = _table(["Fact", "Value"], [
        ["Version studied", card.version],
        ["World-size law", card.world_size_law],
        ["Memory convention", card.memory_convention],
        ["Engine per ZeRO stage", ", ".join(f"{z}: {e}" for z, e in sorted(card.engine.by_zero_stage.items()))],
        ["ZeRO-3 byte convention", card.engine.zero3_memory_convention or card.memory_convention],
        ["Default ZeRO stage", card.defaults.zero_stage],
        ["SP turned on with TP > 1", card.defaults.sequence_parallel_when_tp],
        ["etp when not given (MoE)", "tp (Megatron-Core's default)" if card.defaults.etp == "tp" else "1"],
        ["Highest ZeRO stage a memory fix offers", highest],
        ["MoE with pp > 1", card.limits.moe_with_pipeline],
        ["recommend searches", ", ".join(searched)],
        ["meshplan renders a config", card.renderable],
        ["Balanced MoE routing (moe_routing_imbalance 1.0)",
         f"`{card.moe_routing.force_balance_key}` forces it (random router logits, benchmarks only); meshplan "
         "does not render it" if card.moe_routing else "none on its card (an estimate input only)"],
    ])
    parts = [facts]
    if card.notes:
        parts.append("Notes:\n\n" + "\n".join(f"- {_cell(n)}" for n in card.notes))
    if card.renderable:
        parts.append(_knob_table(name))
    parts.append("Sources:\n\n" + "\n".join(f"- {_cell(s)}" for s in card.sources))
    return "\n\n".join(parts)


def _knob_table(name: str) -> str:
    section = adapter_section(framework_card(name))
    versions = list(section.versions)
    rows = []
    for knob in KNOBS:
        cells = []
        for v in versions:
            k = section.versions[v].knobs[knob]
            cells.append((f"`{k.key}`" + (f" ({k.instead})" if k.instead else "")) if k.key else f"none: {k.instead}")
        rows.append([f"`{knob}`", *cells])
    header = ["meshplan knob", *(f"{name} {v} ({section.versions[v].format})" for v in versions)]
    variants = "\n".join(f"- `{k}`: {_cell(v)}" for k, v in section.variants.items())
    return (f"Knob to key (what `render_config` emits):\n\n{_table(header, rows)}\n\n"
            f"Variants of `render_config {name}`:\n\n{variants}")


def block_hardware() -> str:
    rows = []
    for g in load_card("hardware", HardwareCard).gpus:
        fp8 = f"{g.fp8_flops / 1e12:,.0f}" if g.fp8_flops else "-"
        rows.append([f"`{g.key}`", g.name, _gib(g.memory_bytes), f"{g.bf16_flops / 1e12:,.0f}", fp8,
                     f"{g.hbm_bandwidth / 1e12:.2f}", f"{g.intra_node_bandwidth / 1e9:,.0f}", g.nvlink_domain,
                     g.gpus_per_node, f"{g.network_bandwidth / 1e9:,.1f}"])
    return _table(["gpu", "Name", "Memory GiB", "BF16 TFLOP/s", "FP8 TFLOP/s", "HBM TB/s", "NVLink GB/s",
                   "NVLink domain", "GPUs/node", "Network GB/s"], rows) + \
        "\n\nSources: cards/hardware.yaml (each GPU's datasheet)."


def block_accuracy() -> str:
    """The error measured per regime and the terms measured runs exercise (cards/accuracy.yaml)."""
    card = accuracy_card()
    out = []
    for kind in ("throughput", "memory"):
        figures = getattr(card, kind)
        rows = []
        for name, r in figures.regimes.items():
            if r.runs:
                rows.append([f"`{name}`", r.label, f"±{r.median_error:.0%}", f"{r.bias:+.0%}", r.runs,
                             "; ".join(f"{s.script} ({s.set}, {s.runs})" for s in r.sources)])
            else:
                rows.append([f"`{name}`", r.label, "unknown", "-", 0, r.unvalidated or ""])
        out.append(f"{kind.capitalize()} (measured {card.measured}):\n\n"
                   + _table(["Regime", "What", "Median error", "Bias", "Runs", "Source"], rows))
        out.append(f"{kind.capitalize()} terms with measured runs: "
                   + ", ".join(f"{t} ({n})" for t, n in figures.terms.items() if n) + ".")
    return "\n\n".join(out) + "\n\nSource: cards/accuracy.yaml (regenerated by bench/accuracy_card.py)."


def _blocks() -> dict[str, Callable[[], str]]:
    blocks: dict[str, Callable[[], str]] = {
        "dense-by-size": block_dense_by_size,
        "moe-by-model": block_moe_by_model,
        "moe-by-size": block_moe_by_size,
        "topology": block_topology,
        "sequence-length": block_sequence_length,
        "examples": block_examples,
        "tradeoffs": block_tradeoffs,
        "workflow": block_workflow,
        "corrections": block_corrections,
        "pitfalls": block_pitfalls,
        "pitfalls-memory": block_pitfalls_memory,
        "oom-ladder": block_oom_ladder,
        "rules": block_rules,
        "hardware": block_hardware,
        "accuracy": block_accuracy,
    }
    for fw in FRAMEWORKS:
        blocks[f"framework:{fw}"] = lambda fw=fw: block_framework(fw)
        blocks[f"rules:{fw}"] = lambda fw=fw: block_rules(fw)
        blocks[f"pitfalls:{fw}"] = lambda fw=fw: _pitfall_rows(framework=fw)
    return blocks


def render_text(text: str, where: str = "<text>") -> str:
    """The text with every marked block regenerated from the cards."""
    blocks = _blocks()
    opened = OPEN.findall(text)
    unknown = sorted(set(opened) - set(blocks))
    if unknown:
        raise MeshplanError(f"{where}: unknown meshplan block(s) {unknown}.", fix=f"Known: {', '.join(blocks)}.")
    closed = [m.group("name") for m in BLOCK.finditer(text)]
    if sorted(closed) != sorted(opened):
        raise MeshplanError(f"{where}: a meshplan:begin marker has no matching meshplan:end marker.")

    def replace(match: re.Match) -> str:
        return f"{match.group(1)}{blocks[match.group('name')]()}\n{match.group(4)}"

    return BLOCK.sub(replace, text)


def skill_pages() -> list[Path]:
    """Every markdown page under skills/, in a fixed order: the pages `render_all` reads."""
    root = skills_root()
    if not root.is_dir():
        raise MeshplanError(f"The skills folder {root} is not a directory on disk; run from a source checkout.")
    return sorted(root.rglob("*.md"))


def tool_schemas_path() -> Path:
    """The MCP server's published tool list, next to the module that builds it."""
    return Path(tool_list.__file__).with_name(SCHEMA_FILE)


def render_all(check: bool = False) -> list[str]:
    """Regenerate every block under skills/ and the MCP tool list (check=True: write nothing); returns the files that
    differ."""
    root = skills_root()
    generated = [(path, render_text(path.read_text(encoding="utf-8"), str(path.relative_to(root))))
                 for path in skill_pages()]
    generated.append((tool_schemas_path(), tool_list.published_text()))
    drift: list[str] = []
    for path, new in generated:
        if not path.is_file() or path.read_text(encoding="utf-8") != new:
            drift.append(str(path.relative_to(root.parent)) if path.is_relative_to(root.parent) else str(path))
            if not check:
                path.write_text(new, encoding="utf-8")
    return drift
