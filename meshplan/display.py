"""Readable terminal tables for each result (the `--json` form is the structured truth; this is for people)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from meshplan.schema import (
    CheckReport,
    MemoryReport,
    ModelReport,
    ModelSummary,
    Recommendation,
    ThroughputReport,
)

GIB = 1 << 30


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def billions(n: int | float) -> str:
    return f"{n / 1e9:,.3f}B"


def gib(n: int | float) -> str:
    return f"{n / GIB:,.2f} GiB"


def _notes(console: Console, title: str, lines: list[str]) -> None:
    if lines:
        console.print(f"[bold]{title}[/bold]")
        for line in lines:
            console.print(f"  - {line}")


def model_report(report: ModelReport) -> None:
    console = _console()
    arch = report.architecture
    console.print(f"[bold]{report.name}[/bold]  ({report.hf_id or report.origin}, model_type {report.model_type})")
    console.print(
        f"layers {arch.num_layers}, hidden {arch.hidden_size}, heads {arch.num_attention_heads} "
        f"(kv {arch.num_kv_heads}, head_dim {arch.head_dim}), vocab {arch.vocab_size}"
        + (f", {arch.moe.num_experts} experts top-{arch.moe.top_k}" if arch.moe else "")
        + (", MLA" if arch.mla else "")
    )
    table = Table("component", "params", "active", "note")
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
        console.print(f"published: {report.published.get('text')}  [{report.published.get('source', '')[:100]}]")
    _notes(console, "assumptions", report.assumptions)


def model_list(models: list[ModelSummary]) -> None:
    table = Table("key", "hf_id", "type", "total", "active")
    for m in models:
        table.add_row(m.key, m.hf_id or "", m.model_type, billions(m.total_params), billions(m.active_params))
    _console().print(table)


def memory_report(report: MemoryReport) -> None:
    console = _console()
    console.print(f"[bold]{report.model}[/bold] on {report.framework}: {report.plan.short()}")
    # Bare GiB figures keep the columns readable in an 80-column terminal; held = micro-batches in flight.
    table = Table("stage", "layers", "held", "weights", "grads", "optim.", "activ.", "other", "total",
                  title="GiB per GPU", title_justify="left")
    for s in report.stages:
        table.add_row(str(s.stage), str(s.layers), str(s.detail.get("microbatches_in_flight", "")),
                      *(f"{b / GIB:,.2f}" for b in (s.weights_bytes, s.gradients_bytes, s.optimizer_bytes,
                                                     s.activations_bytes, s.other_bytes, s.total_bytes)),
                      style="bold" if s.stage == report.peak_stage else None)
    console.print(table)
    verdict = "fits" if report.fits else "DOES NOT FIT"
    console.print(f"peak {gib(report.peak_bytes)} on stage {report.peak_stage} of {gib(report.capacity_bytes)}: "
                  f"{verdict} (headroom {gib(report.headroom_bytes)})")
    _notes(console, "warnings", report.warnings)
    _notes(console, "assumptions", report.assumptions)


def throughput_report(report: ThroughputReport) -> None:
    console = _console()
    console.print(f"[bold]{report.model}[/bold] on {report.framework}: {report.plan.short()}")
    console.print(f"step {report.step_time_s:.3f} s, {report.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
                  f"MFU {report.mfu:.1%}, {report.model_flops_per_step:.3e} model FLOPs per step")
    table = Table("part", "seconds", "share of step")
    for name, value in report.breakdown.model_dump().items():
        share = value / report.step_time_s if report.step_time_s else 0.0
        table.add_row(name.removesuffix("_s").replace("_", " "), f"{value:.4f}", f"{share:.1%}")
    console.print(table)
    _notes(console, "warnings", report.warnings)
    _notes(console, "assumptions", report.assumptions)


def check_report(report: CheckReport) -> None:
    console = _console()
    console.print(f"[bold]{report.model}[/bold] on {report.framework}: {report.plan.short()}: "
                  + ("ok" if report.ok else "[red]errors found[/red]"))
    if report.findings:
        table = Table("id", "severity", "message", "fix")
        for f in report.findings:
            table.add_row(f.id, f.severity, f.message, f.fix)
        console.print(table)
    if report.memory:
        m = report.memory
        console.print(f"memory: peak {gib(m.peak_bytes)} on stage {m.peak_stage} of {gib(m.capacity_bytes)}"
                      + ("" if m.fits else " (does not fit)"))
    _notes(console, "next steps", report.next_steps)


def recommendation(rec: Recommendation) -> None:
    console = _console()
    console.print(f"[bold]{rec.model}[/bold] on {rec.num_gpus} GPUs ({rec.framework}): "
                  f"{rec.considered} layouts considered")
    if rec.candidates:
        table = Table("#", "layout", "mbs", "zero", "recompute", "peak mem", "tokens/s/GPU", "MFU", "step s")
        for c in rec.candidates:
            table.add_row(str(c.rank), c.plan.short(), str(c.plan.micro_batch_size), str(c.plan.zero_stage),
                          c.plan.recompute, gib(c.memory.peak_bytes), f"{c.throughput.tokens_per_s_per_gpu:,.0f}",
                          f"{c.throughput.mfu:.1%}", f"{c.throughput.step_time_s:.2f}")
        console.print(table)
    elif rec.closest:
        console.print("[red]No layout fits.[/red] Closest misses:")
        table = Table("layout", "mbs", "zero", "recompute", "peak mem", "capacity", "over by")
        for miss in rec.closest:
            table.add_row(miss.plan.short(), str(miss.plan.micro_batch_size), str(miss.plan.zero_stage),
                          miss.plan.recompute, gib(miss.memory.peak_bytes), gib(miss.memory.capacity_bytes),
                          gib(miss.over_bytes))
        console.print(table)
    if rec.min_gpus:
        console.print(f"smallest GPU count that fits: {rec.min_gpus}")
    if rec.rationale:
        console.print(rec.rationale)
    if rec.decision_table:
        console.print(f"decision table: {rec.decision_table}")
    if rec.rejected:
        console.print("rejected: " + ", ".join(f"{k} x{v}" for k, v in sorted(rec.rejected.items())))
    _notes(console, "warnings", rec.warnings)
