"""Readable terminal tables for each result (the `--json` form is the structured truth; this is for people)."""

from __future__ import annotations

import os
import shlex
import sys
import textwrap

from pydantic import ValidationError
from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.segment import Segments
from rich.table import Column, Table
from rich.text import Text

from meshplan.check.headline import layout_text
from meshplan.check.split import layout_cells, split_words
from meshplan.core.errors import MeshplanError
from meshplan.core.units import GIB, percent, plural, si_count
from meshplan.knowledge.adapter_knobs import MissingKnob, default_render, missing_knob
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.gdn_config import split_layers
from meshplan.knowledge.hardware import get_gpu
from meshplan.knowledge.model_config import is_config_text
from meshplan.request.resolve import resolve
from meshplan.rl.engine import ep_words
from meshplan.rl.job import is_rl_request, resolve_rl
from meshplan.schema.measured import RATE_FIGURES, ComparedFigure, RunComparison
from meshplan.schema.model import LAYER_KINDS, ModelReport, ModelSummary
from meshplan.schema.plan import Plan
from meshplan.schema.reports import (
    Candidate,
    CheckReport,
    ErrorBand,
    MemoryReport,
    MemorySummary,
    Recommendation,
    ThroughputReport,
)
from meshplan.schema.request import Request
from meshplan.search import FOLDED_KNOBS, headroom_that_ranks, min_headroom_fraction
from meshplan.search.answer import offload_words

# Piped without COLUMNS, a table is printed at its own width: a file or a grep reads whole rows, and no terminal
# is there to wrap them (rich would otherwise assume 80 columns).
PIPED_WIDTH = 10_000


def _console(width: int | None = None) -> Console:
    """Stdout as rich sees it: the terminal's width; piped, COLUMNS if set, else no width limit (PIPED_WIDTH);
    `width` overrides all three."""
    if width is None and not sys.stdout.isatty() and not os.environ.get("COLUMNS", "").strip().isdigit():
        width = PIPED_WIDTH
    return Console(highlight=False, soft_wrap=True, width=width)


def _col(header: str, *, wrap: bool = False, right: bool = False) -> Column:
    """A column whose header is never cut: cells that are numbers or ids stay whole, text cells may wrap."""
    return Column(header, min_width=len(header), no_wrap=not wrap, overflow="fold" if wrap else "ellipsis",
                  justify="right" if right else "left")


def _table(*columns: Column | str, **options: object) -> Table:
    """A compact table (a rule under the header, no outer frame): nine columns fit in 80 characters."""
    cols = [c if isinstance(c, Column) else _col(c) for c in columns]
    return Table(*cols, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), **options)


def _needed_width(console: Console, table: Table) -> int:
    """The narrowest width that cuts nothing: each unwrapped column at its longest line, the others at their
    longest word, plus the table's own padding and dividers."""
    def longest(column: Column, unit: str) -> int:
        texts = [str(column.header), *(str(cell) for cell in column.cells)]
        pieces = [piece for text in texts for piece in (text.splitlines() if unit == "line" else text.split())]
        return max([column.min_width or 0, *(cell_len(piece) for piece in pieces)])

    natural = sum(longest(c, "line") for c in table.columns)
    frame = Measurement.get(console, console.options.update(width=10**4), table).maximum - natural
    return frame + sum(longest(c, "line" if c.no_wrap else "word") for c in table.columns)


def _print_whole(console: Console, *tables: Table, under: dict[int, list[str]] | None = None) -> None:
    """Print the first table that fits the console with nothing cut; if none does, the last at its own width.

    Text columns wrap to fit; a terminal wraps the over-long lines of the last table, but no id, number
    or header in it is ever cut (piped output is 80 columns wide unless COLUMNS says otherwise).
    `under` maps a row's index to dim lines printed under it across the whole width (a table cell has no span).
    """
    for table in tables:
        need = _needed_width(console, table)
        if need <= console.width:
            _print_rows(console, table, under or {})
            return
    # Console.print(width=) cannot exceed the console's own width
    _print_rows(_console(width=need), tables[-1], under or {})


def _print_rows(console: Console, table: Table, under: dict[int, list[str]]) -> None:
    """Print TABLE, and after the last line of row i the lines `under[i]`. A row starts on the line whose first
    cell is filled (the first column holds a value on every row; wrapped cells continue below it blank)."""
    if not under:
        console.print(table)
        return
    first = table.columns[0]
    width = max(cell_len(str(text)) for text in [first.header, *first.cells])
    lines = console.render_lines(table, console.options, pad=False, new_lines=True)
    starts = [i for i, line in enumerate(lines) if i >= 2 and "".join(s.text for s in line)[:width].strip()]
    ends = [*(s - 1 for s in starts[1:]), len(lines) - 1]
    after = {end: under.get(row, []) for row, end in enumerate(ends)}
    for i, line in enumerate(lines):
        console.print(Segments(line))
        for extra in after.get(i, []):
            console.print(Text(extra, style="dim"))


def _wrap_items(lead: str, items: list[str], width: int) -> list[str]:
    """LEAD then ITEMS joined by ", ", in lines of at most WIDTH that break only between items (continuation
    lines start under the first item); an item too long for any line gets a line of its own, whole."""
    indent = " " * cell_len(lead)
    lines, line = [], lead
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if line != lead and cell_len(line) + 1 + cell_len(piece) > width:
            lines.append(line)
            line = indent + piece
        else:
            line += ("" if line == lead else " ") + piece
    return [*lines, line]


def billions(n: int | float) -> str:
    return f"{n / 1e9:,.3f}B"


def gib_figure(n: int | float) -> str:
    """Bytes as a bare GiB figure to two decimals, for the table columns headed in GiB."""
    return f"{n / GIB:,.2f}"


def gib(n: int | float) -> str:
    return f"{gib_figure(n)} GiB"


def _notes(console: Console, title: str, lines: list[str]) -> None:
    if lines:
        console.print(f"[bold]{title}[/bold]")
        for line in lines:  # text from cards, logs and paths: a '[word ...]' in it is no markup tag
            console.print(f"  - {escape(line)}")


def model_report(report: ModelReport) -> None:
    console = _console()
    arch = report.architecture
    console.print(f"[bold]{report.name}[/bold]  ({report.hf_id or report.origin}, model_type {report.model_type})")
    decoder = split_layers(arch)  # a Gated DeltaNet hybrid's decoder layers, two pattern layers each
    layers = (f"{arch.num_layers} ({decoder} decoder layers, each a mixer and an MoE/MLP layer of the pattern)"
              if decoder != arch.num_layers else f"{arch.num_layers}")
    console.print(
        f"layers {layers}, hidden {arch.hidden_size}, heads {arch.num_attention_heads} "
        f"(kv {arch.num_kv_heads}, head_dim {arch.head_dim}), vocab {arch.vocab_size}"
        + (f", {arch.moe.num_experts} experts top-{arch.moe.top_k}" if arch.moe else "")
        + (", MLA" if arch.mla else "")
    )
    if arch.layer_pattern is not None:  # a hybrid: which kind each layer is, and its Mamba-2 mixer's shape
        m, g = arch.mamba, arch.gdn
        console.print(f"layer pattern {arch.layer_pattern} ({', '.join(f'{k} {v}' for k, v in LAYER_KINDS.items())})"
                      + (f"; Mamba-2 {m.num_heads} heads x {m.head_dim}, state {m.state_size}, {m.n_groups} groups, "
                         f"conv {m.conv_kernel}, chunk {m.chunk_size}" if m else "")
                      + (f"; Gated DeltaNet {g.num_key_heads} key heads x {g.key_head_dim}, {g.num_value_heads} value "
                         f"heads x {g.value_head_dim}, conv {g.conv_kernel}, chunk {g.chunk_size}" if g else ""))
    table = _table("component", _col("params", right=True), _col("active", right=True), _col("note", wrap=True))
    for comp in report.components:
        table.add_row(comp.name, billions(comp.params), billions(comp.active_params), comp.note)
    console.print(table)
    console.print(f"total  {billions(report.total_params)}   active {billions(report.active_params)}")
    console.print(
        f"active without input embedding {billions(report.active_params_excl_input_embedding)}; "
        f"active without embedding and head {billions(report.active_params_non_embedding)}; "
        f"non-embedding total {billions(report.non_embedding_params)}"
    )
    if report.mtp_params:
        console.print(f"MTP blocks (not in total) {billions(report.mtp_params)}")
    if report.published:
        source = escape(f"[{report.published.get('source', '')}]")  # whole, and not read as a markup tag
        console.print(f"published: {escape(str(report.published.get('text')))}  {source}")
    _notes(console, "assumptions", report.assumptions)


def model_list(models: list[ModelSummary]) -> None:
    """Catalog keys and Hugging Face ids are never cut (people copy them): one row per model when the
    terminal is wide enough, else the id under the key and without the config's model_type."""
    def table(with_type: bool, stacked: bool = False) -> Table:
        names = [_col("key / Hugging Face id")] if stacked else [_col("key"), _col("hf_id")]
        out = _table(*names, *([_col("type")] if with_type else []),
                     _col("total", right=True), _col("active", right=True))
        for m in models:
            ids = [f"{m.key}\n  {m.hf_id}" if m.hf_id else m.key] if stacked else [m.key, m.hf_id or ""]
            out.add_row(*ids, *([m.model_type] if with_type else []),
                        billions(m.total_params), billions(m.active_params))
        return out

    _print_whole(_console(), table(with_type=True), table(with_type=False), table(with_type=False, stacked=True))


def _band(console: Console, band: ErrorBand | None, lead: str = "error") -> None:
    """The error measured in the estimate's regime, under its number (meshplan/estimate/accuracy.py)."""
    if band is not None:
        console.print(Text(f"{lead}: {band.text}"))


def peak_line(m: MemoryReport | MemorySummary) -> str:
    """The peak labelled reserved (the caching allocator's reserve included), and with expandable segments the
    allocated peak that then decides the fit (memory.fit_figure)."""
    decided = (f"; the allocated peak {gib(m.fit_bytes)} decides (expandable segments)"
               if m.fit_basis == "allocated" else "")
    return f"peak {gib(m.peak_bytes)} reserved on stage {m.peak_stage} of {gib(m.capacity_bytes)}{decided}"


def allocated_peaks_line(candidates: list[Candidate]) -> str | None:
    """The ranked rows' fit figures where expandable segments make the allocated peak decide (memory.fit_figure): the
    table's 'peak GiB' is the reserved peak, which may sit inside the headroom it was ranked by. None when every row
    is fitted on its reserved peak."""
    allocated = [c for c in candidates if c.memory.fit_basis == "allocated"]
    if not allocated:
        return None
    figures = ", ".join(f"#{c.rank} {gib_figure(c.memory.fit_bytes)}" for c in allocated)
    return ("peak GiB is the reserved peak (the caching allocator's reserve included); with expandable segments the "
            f"allocated peak decides the fit and the headroom: {figures} GiB")


PICK_DEGREES = ("tp", "pp", "vpp", "cp", "ep", "etp", "zero_stage", "micro_batch_size", "recompute")


def pick_fields(req: Request, plan: Plan) -> dict[str, object] | None:
    """The fields that, beside the request's own, make `resolve` build `plan` again: its degrees, stage and knobs
    always (etp among them: a row's 'TP2 EP32' leaves ETP1 unsaid, and --tp 2 --ep 32 alone resolves etp=2,
    Megatron-Core's default), then each other field the resolver fills otherwise (a pipeline_layout, the flex
    dispatcher, a rollout's TP). None where no such set rebuilds it."""
    given = {name: getattr(req, name) for name in req.model_fields_set}
    fields: dict[str, object] = {name: getattr(plan, name) for name in PICK_DEGREES}
    for _ in range(4):  # a field set can change another's default (the flex dispatcher its backend): settle it
        try:
            built = resolve(Request(**{**given, **fields}))[1]
        except (MeshplanError, ValidationError):  # no flag set asks for it: the answer above stands without the line
            return None
        differ = [name for name in Plan.model_fields if name in Request.model_fields
                  and getattr(built, name) != getattr(plan, name)]
        if not differ:
            return fields
        fields.update({name: getattr(plan, name) for name in differ})
    return None


def flag_words(fields: dict[str, object]) -> str:
    """Request fields as the CLI's flags, each value as its flag reads it (true/false, a list's items apart)."""
    words: list[str] = []
    for name, value in fields.items():
        if value is None:
            continue
        words.append("--" + name.replace("_", "-"))
        items = value if isinstance(value, list) else [value]
        words += [shlex.quote(str(v).lower() if isinstance(v, bool) else str(v)) for v in items]
    return " ".join(words)


def pick_command(rec: Recommendation, req: Request) -> str | None:
    """#1 as the `meshplan check` line that asks for exactly it; None for a pasted config.json (no flag text)."""
    if not rec.candidates or is_config_text(req.model):
        return None
    fields = pick_fields(req, rec.candidates[0].plan)
    if fields is None:
        return None
    given = {name: getattr(req, name) for name in Request.model_fields
             if name in req.model_fields_set and name != "model" and name not in fields}
    same = f"the same for memory, throughput and render {rec.framework}"
    if (missing := _unwritten(req, fields)) is not None:  # a setting render's config has no key for (fp8 on torchtitan)
        same = (f"the same for memory and throughput; render {rec.framework} cannot write {missing.setting} - "
                f"{missing.instead.rstrip('.')}")
    return f"#1 as flags ({same}): meshplan check {shlex.quote(req.model)} {flag_words({**given, **fields})}"


def _unwritten(req: Request, fields: dict[str, object]) -> MissingKnob | None:
    """The first setting of the request and pick that the config `render` writes by default cannot express (a knob
    outside the layout's, which the search's rule AD001 leaves to render: precision=fp8 on torchtitan 0.3), or None."""
    try:
        job, plan = resolve(Request(**{**{n: getattr(req, n) for n in req.model_fields_set}, **fields}))
    except (MeshplanError, ValidationError):
        return None
    target = default_render(job.card, job, plan)
    return None if target is None else missing_knob(job.card, *target, job, plan)


def memory_report(report: MemoryReport) -> None:
    console = _console()
    console.print(f"[bold]{report.model}[/bold] on {report.framework}: {report.plan.short()}")
    # Bare GiB figures keep the columns readable in an 80-column terminal; held = micro-batches in flight.
    table = _table(*(_col(h, right=True) for h in ("stage", "layers", "held", "weights", "grads", "optim.",
                                                    "activ.", "other", "total")),
                   title="GiB per GPU", title_justify="left")
    for s in report.stages:
        table.add_row(str(s.stage), str(s.layers), str(s.detail.get("microbatches_in_flight", "")),
                      *(gib_figure(b) for b in (s.weights_bytes, s.gradients_bytes, s.optimizer_bytes,
                                                s.activations_bytes, s.other_bytes, s.total_bytes)),
                      style="bold" if s.stage == report.peak_stage else None)
    console.print(table)
    verdict = "fits" if report.fits else "DOES NOT FIT"
    console.print(f"{peak_line(report)}: {verdict} (headroom {gib(report.headroom_bytes)})")
    _band(console, report.error_band)
    _notes(console, "warnings", report.warnings)
    _notes(console, "assumptions", report.assumptions)


def throughput_report(report: ThroughputReport) -> None:
    console = _console()
    console.print(f"[bold]{report.model}[/bold] on {report.framework}: {report.plan.short()}")
    console.print(f"step {report.step_time_s:.3f} s, {report.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
                  f"MFU {report.mfu:.1%}, {report.model_flops_per_step:.3e} model FLOPs per step")
    _band(console, report.error_band)
    if report.calibration is not None:  # a factor the user stored (meshplan compare --calibrate), never silent
        console.print(Text(report.calibration.words()))
    console.print(_parts_table(report.parts(), report.step_time_s, "step"))
    if report.rl is not None and report.rl.overlap_words():
        console.print(Text(report.rl.overlap_words()))
    if report.rl is not None:  # the breakdown is the actor's training step, which the RL step's update part runs
        update, words = report.breakdown.model_dump(), report.actor_step_words()
        console.print(_parts_table(update, report.actor_step_s(), "actor step" if words else "update"))
        if words:
            console.print(Text(words))
    _notes(console, "warnings", report.warnings)
    _notes(console, "assumptions", report.assumptions)


def _parts_table(parts: dict[str, float], whole: float, of: str):
    """Seconds per part and each part's share of `whole` (the step, or an RL step's update or actor step)."""
    table = _table("part", _col("seconds", right=True), _col(f"share of {of}", right=True))
    for name, value in parts.items():
        share = value / whole if whole else 0.0
        table.add_row(name.removesuffix("_s").replace("_", " "), f"{value:.4f}", f"{share:.1%}")
    return table


def check_report(report: CheckReport) -> None:
    console = _console()
    console.print(f"[bold]{report.model}[/bold] on {report.framework}: {layout_text(report)}: "
                  + ("ok" if report.ok else "[red]errors found[/red]"))
    if report.findings:
        table = _table("id", "severity", _col("message", wrap=True), _col("fix", wrap=True), show_lines=True)
        for f in report.findings:
            table.add_row(f.id, f.severity, f.message, f.fix)
        console.print(table)
    if report.memory:
        m = report.memory
        console.print(f"memory: {peak_line(m)}" + ("" if m.fits else " (does not fit)"))
    if report.config_fixes:  # checked from a file: each fix as that file's own lines (Text: '[section]' is no markup)
        console.print("fixes in your file's own keys (paste one option per finding):")
        for fix in report.config_fixes:
            for n, option in enumerate(fix.options, start=1):
                label = f"  {fix.finding}" + (f" option {n}" if len(fix.options) > 1 else "") + ":"
                console.print(Text("\n".join([label, *(f"      {change.text}" for change in option)])))
    _notes(console, "in your file, meshplan cannot express or could not read (the check does not cover it)",
           report.config_unread)
    _notes(console, "what your file implies but cannot settle, checked as (a flag beside --config changes it)",
           report.config_assumed)
    _notes(console, "next steps", report.next_steps)


def compared_at(rec: Recommendation, req: Request) -> str:
    """The settings every ranked layout was compared at, so a reader can tell which question was answered."""
    gpu = get_gpu(req.gpu)
    headroom = req.headroom if req.headroom is not None else min_headroom_fraction()
    seq = resolve_rl(req, [])[0].seq_length if is_rl_request(req) else req.seq_length  # RL: prompt + response
    parts = [f"sequence length {seq:,}"]
    if rec.global_batch_size:
        tokens = rec.global_batch_size * seq
        parts.append(f"global batch {rec.global_batch_size:,} sequences ({si_count(tokens, 'tokens')})")
    gpus = (f"{rec.num_gpus:,} x {gpu.name} ({gpu.key}; {_rl_pools(rec, rec.trainer_gpus)})"
            if rec.trainer_gpus is not None else  # an RL job's pools apart, else the nodes' split
            f"{rec.num_gpus:,} x {gpu.name} ({gpu.key}){_part_nodes(rec, gpu.gpus_per_node, req.gpus_per_node)}")
    if req.network_gbps_per_node is not None:  # the cluster's network every layout was timed on
        gpus += f", network {req.network_gbps_per_node:,g} Gb/s per node"
    parts += [gpus, rec.framework,
              f"{percent(headroom)} of GPU memory kept free" + (" (MEM002 default)" if req.headroom is None else "")]
    return "compared at: " + ", ".join(parts)


def _rl_pools(rec: Recommendation, trainer: int) -> str:
    """How an RL job placed apart splits its GPUs: the trainer's (the actor layouts' world), the rollout engine's
    (a ranked plan's rollout_gpus) and PPO's critic's, the rest."""
    rollout = rec.candidates[0].plan.rollout_gpus if rec.candidates else None
    if rollout is None:
        return f"the trainer's {trainer:,}, the rest ({rec.num_gpus - trainer:,}) the rollout engine's and critic's"
    critic = rec.num_gpus - trainer - rollout
    return (f"the trainer's {trainer:,}" + (f", PPO's critic's {critic:,}" if critic else "")
            + f" and the rollout engine's {rollout:,}")


def _part_nodes(rec: Recommendation, node: int, given: int | None) -> str:
    """The nodes' split where it is not the GPU's node: the request's gpus_per_node (`given`: its nodes, none of them
    idle), or where the GPU count fills no whole node the launch split request/resolve.launch_gpus_per_node chose."""
    per = rec.gpus_per_node
    if per is None or per >= node or rec.num_gpus <= per:
        return ""
    idle = "" if given is not None else f" ({node - per} of each {node}-GPU node idle)"
    return f" as {rec.num_gpus // per:,} nodes x {per}{idle}"


FOLDED_LABELS = {"zero_stage": "ZeRO", "recompute": "recompute", "sequence_parallel": "SP",
                 "moe_token_dispatcher": "dispatcher"}


def split_cell(plan: Plan) -> str:
    """A plan's pipeline split as request fields, without the comma that separates the folded plans of a line."""
    return split_words(plan).replace(", ", " ")


def _folded(row: Plan, other: Plan) -> str:
    """A plan folded into ROW's line, compactly: its degrees, its micro-batch and any other knob that differs,
    its pipeline split among them (the search folds a split spelt two ways, first/last sizes and a layout)."""
    knobs = [f"{FOLDED_LABELS.get(k, k)} {getattr(other, k)}" for k in FOLDED_KNOBS
             if getattr(other, k) != getattr(row, k)]
    split = [split_cell(other)] if split_words(other) != split_words(row) else []
    return " ".join([other.short(), f"mbs {other.micro_batch_size}", *knobs, *split])


def below_headroom_line(thin: Candidate, headroom: float | None) -> str:
    """The one line naming the fastest layout the headroom keeps out of the ranking, from its report's numbers."""
    p, m = thin.plan, thin.memory
    limit = headroom if headroom is not None else min_headroom_fraction()
    return (f"not ranked, under the {limit:g} headroom: {p.short()} (mbs {p.micro_batch_size}, ZeRO {p.zero_stage}, "
            f"recompute {p.recompute}) at {thin.throughput.tokens_per_s_per_gpu:,.0f} tokens/s/GPU with "
            f"{m.headroom_bytes / GIB:.1f} GiB ({m.headroom_bytes / m.capacity_bytes:.1%}) free; "
            f"--headroom {headroom_that_ranks(m):g} would rank it")


def rollout_words(plan: Plan, moe: bool = True) -> str:
    """An RL plan's rollout engine in one cell: its TP, DP and EP (rl/engine.ep_words: the notes' words)."""
    return f"TP{plan.rollout_tp} DP{plan.rollout_dp}{ep_words(moe, plan)}"


def rl_table(candidates: list[Candidate], moe: bool = True) -> Table:
    """The RL recommend table: the actor's layout and knobs, then what differs between RL steps on one actor layout
    (the rollout engine's TP/DP/EP and memory fraction 'mem', the offloads: param, grad, opt(imizer), act(ivation)),
    the peak over the phases, and the RL step's numbers (the same figures as --json)."""
    table = _table(_col("#", right=True), _col("actor layout", wrap=True), _col("mbs", right=True),
                   _col("ZeRO", right=True), "recompute", _col("rollout", wrap=True), _col("mem", right=True),
                   _col("offload", wrap=True),
                   _col("peak GiB", right=True), _col("tokens/s/GPU", right=True), _col("RL step s", right=True))
    for c in candidates:
        table.add_row(str(c.rank), c.plan.short(), str(c.plan.micro_batch_size), str(c.plan.zero_stage),
                      c.plan.recompute, rollout_words(c.plan, moe),
                      f"{c.plan.rollout_memory_fraction:g}", offload_words(c.plan), gib_figure(c.memory.peak_bytes),
                      f"{c.throughput.tokens_per_s_per_gpu:,.0f}", f"{c.throughput.step_time_s:.2f}")
    return table


def recommendation(rec: Recommendation, req: Request | None = None) -> None:
    console = _console()
    console.print(f"[bold]{rec.model}[/bold] on {plural(rec.num_gpus, 'GPU')} ({rec.framework}): "
                  f"{rec.considered:,} layouts considered")
    if req is not None:
        console.print(compared_at(rec, req))
    # The layout wraps between its factors (TP2 PP4 / EP8 DP4); the other cells and every header stay whole.
    if rec.candidates and rec.candidates[0].plan.rollout_engine is not None:
        _print_whole(console, rl_table(rec.candidates, req is None or resolve_model(req.model).is_moe))
    elif rec.candidates:
        table = _table(_col("#", right=True), _col("layout", wrap=True), _col("mbs", right=True),
                       _col("ZeRO", right=True), "recompute", _col("peak GiB", right=True),
                       _col("tokens/s/GPU", right=True), _col("MFU", right=True), _col("step s", right=True))
        for c, layout in zip(rec.candidates, layout_cells([c.plan for c in rec.candidates]), strict=True):
            table.add_row(str(c.rank), layout, str(c.plan.micro_batch_size), str(c.plan.zero_stage),
                          c.plan.recompute, gib_figure(c.memory.peak_bytes),
                          f"{c.throughput.tokens_per_s_per_gpu:,.0f}", f"{c.throughput.mfu:.1%}",
                          f"{c.throughput.step_time_s:.2f}")
        # Under the layout column: past the rank and the two-space gap between columns.
        lead = " " * (len(str(rec.candidates[-1].rank)) + 2) + "= also: "
        under = {i: _wrap_items(lead, [_folded(c.plan, p) for p in c.equivalents], console.width)
                 for i, c in enumerate(rec.candidates) if c.equivalents}
        _print_whole(console, table, under=under)
    elif rec.closest:
        console.print("[red]No layout fits.[/red] Closest misses:")
        table = _table(_col("layout", wrap=True), _col("mbs", right=True), _col("ZeRO", right=True), "recompute",
                       _col("peak GiB", right=True), _col("capacity GiB", right=True),
                       _col("over by GiB", right=True))
        for miss, layout in zip(rec.closest, layout_cells([m.plan for m in rec.closest]), strict=True):
            table.add_row(layout, str(miss.plan.micro_batch_size), str(miss.plan.zero_stage),
                          miss.plan.recompute, gib_figure(miss.memory.peak_bytes),
                          gib_figure(miss.memory.capacity_bytes), gib_figure(miss.over_bytes))
        _print_whole(console, table)
    if rec.candidates and (line := allocated_peaks_line(rec.candidates)) is not None:
        console.print(Text("\n".join(textwrap.wrap(line, console.width, break_long_words=False,
                                                   break_on_hyphens=False))))
    if rec.best_below_headroom is not None:
        line = below_headroom_line(rec.best_below_headroom, rec.headroom)
        console.print(Text("\n".join(textwrap.wrap(line, console.width, subsequent_indent="  ", break_long_words=False,
                                                   break_on_hyphens=False))))
    if rec.candidates:
        _band(console, rec.candidates[0].throughput.error_band, "error of #1")
        for c in rec.candidates[1:]:  # each row's own unchecked terms (its rationale says how sure, in full)
            band = c.throughput.error_band
            if band is not None and band.unvalidated:
                console.print(Text(f"unvalidated in #{c.rank}: {', '.join(band.unvalidated)}"))
    if rec.min_gpus:
        console.print(f"smallest GPU count that fits: {rec.min_gpus}")
    if rec.rationale:
        console.print(rec.rationale)
    if req is not None and (command := pick_command(rec, req)) is not None:
        console.print(Text(command))
    if rec.decision_table:
        console.print(f"decision table: {rec.decision_table}")
    if rec.rejected:
        console.print("rejected: " + ", ".join(f"{k} x{v}" for k, v in sorted(rec.rejected.items())))
    _notes(console, "warnings", rec.warnings)


def _figure_text(value: float | None, figure: str) -> str:
    if value is None:
        return "-"
    if figure in ("mfu", "logged_mfu"):
        return f"{value:.1%}"
    return f"{value:,.0f}" if figure == "tokens_per_s_per_gpu" else f"{value:.3g}"


def _band_text(f: ComparedFigure) -> str:
    """The band as the figure's own error may range: ±b, or for a rate -b/(1+b) to +b/(1-b) (the step time's ±b)."""
    if f.band is None:
        return "-"
    if f.figure not in RATE_FIGURES:
        return f"±{f.band:.0%}"
    high = f"+{f.band / (1 - f.band):.0%}" if f.band < 1 else "+∞"
    return f"{-f.band / (1 + f.band):.0%}/{high}"


def comparison(report: RunComparison) -> None:
    """`meshplan compare`: predicted beside measured, the band of the regime and whether the run falls inside."""
    console = _console()
    console.print(f"[bold]{report.model}[/bold] on {report.framework}, {plural(report.num_gpus, 'GPU')}: "
                  f"{report.plan.short()}; log {report.measured.path} ({plural(report.measured.steps, 'step line')})")
    calibrated = report.calibration is not None
    table = _table(_col("figure", wrap=True), _col("predicted", right=True), _col("measured", right=True),
                   _col("error", right=True), _col("band", right=True), "inside",
                   *([_col("calibrated", right=True)] if calibrated else []))
    for f in report.figures:
        row = [f.label, _figure_text(f.predicted, f.figure), _figure_text(f.measured, f.figure),
               f"{f.error:+.1%}" if f.error is not None else "-", _band_text(f),
               {True: "yes", False: "NO", None: "-"}[f.inside]]
        table.add_row(*row, *([_figure_text(f.calibrated, f.figure)] if calibrated else []))
    console.print(table)
    for lead, band in (("memory band", report.memory_band), ("step-time band", report.throughput_band)):
        _band(console, band, lead)
    if report.calibration is not None:
        console.print(Text(report.calibration.words() + " (the 'calibrated' column; 'predicted' is the model's own)"))
    if report.stored is not None:
        console.print(Text(f"stored: step time x {report.stored.step_time_factor:.3f} for cluster "
                           f"{report.stored.cluster!r}, {report.stored.gpu}, {report.stored.framework} in "
                           f"{report.stored.path}; every throughput answer on it now applies and states it"))
    _notes(console, "notes", report.notes)
    _notes(console, "how each figure was taken", [f"{f.label}: {f.basis}" for f in report.figures if f.measured]
           + [f"{f.label}: not measured, the log lacks {f.missing}" for f in report.figures if f.missing])
    _notes(console, "log", [f"{k}: {v}" for k, v in report.measured.sources.items()] + report.measured.notes)
    console.print(Text(report.summary))

