"""Do the expert recipes in the decision tables agree with the search? Each must pass check_config, fit, and be
predicted within 15% of the search's top pick for the same job (issue 5), or the card must say why not.

    python bench/recipes_agreement.py

Recipes: every layout cards/strategies.yaml names for a concrete job (moe_by_model recipes, worked examples,
dense_by_size examples). For each: the recipe as written (its micro-batch, recompute and ZeRO stage, at the
global batch the search compares layouts on), the same degrees with the knobs the search would pick for them
(zero stage, recompute, micro-batch searched with tp/pp/vpp/cp/ep/etp pinned), and the search's free pick.
"""

from __future__ import annotations

from meshplan.knowledge import CheckedLayout, strategies_card
from meshplan.memory import estimate_memory
from meshplan.perf import estimate_throughput
from meshplan.request import resolve
from meshplan.rules import check_config
from meshplan.schema import Request
from meshplan.search import recommend

DEGREES = ("tp", "pp", "vpp", "cp", "ep", "etp", "first_stage_layers", "last_stage_layers")


def recipes() -> list[tuple[str, CheckedLayout]]:
    card = strategies_card()
    out = [(f"moe_by_model/{row.id}", row.recipe) for row in card.moe_by_model]
    out += [(f"examples/{row.id}", row.job) for row in card.examples]
    out += [(f"dense_by_size/{row.id}", row.example) for row in card.dense_by_size if row.example is not None]
    return out


def evaluate(name: str, recipe: CheckedLayout) -> dict:
    fields = recipe.request_fields()
    job_fields = {k: v for k, v in fields.items() if k in ("model", "gpu", "num_gpus", "seq_length", "framework",
                                                             "precision", "global_batch_size")}
    free = recommend(Request(**job_fields), top_k=1)
    gbs = free.global_batch_size
    job, plan = resolve(Request(**{**fields, "global_batch_size": gbs}))
    check = check_config(job, plan)
    errors = [f.id for f in check.findings if f.severity == "error"]
    mem = estimate_memory(job, plan)
    row = {"name": name, "job": f"{recipe.model} x{recipe.num_gpus} {recipe.framework}", "layout": plan.short(),
           "valid": not errors, "errors": errors, "fits": mem.fits, "peak_gib": mem.peak_bytes / 2**30}
    as_written = estimate_throughput(job, plan).tokens_per_s_per_gpu if not errors else None
    pinned = {d: fields[d] for d in DEGREES if d in fields}
    best_same = recommend(Request(**job_fields, **pinned), top_k=1)
    top = free.candidates[0].throughput.tokens_per_s_per_gpu if free.candidates else None
    same = best_same.candidates[0].throughput.tokens_per_s_per_gpu if best_same.candidates else None
    row.update(top=top, top_layout=free.candidates[0].plan.short() if free.candidates else "none",
               as_written=as_written, best_knobs=same)
    return row


def pct(value: float | None, top: float | None) -> str:
    if value is None or not top:
        return "-"
    return f"{value / top - 1:+.1%}"


def main() -> None:
    rows = [evaluate(name, recipe) for name, recipe in recipes()]
    print("| recipe | job | layout | valid | fits (peak GiB) | as written vs top | best knobs vs top | search's top |")
    print("|---|---|---|---|---|---|---|---|")
    agree = 0
    for r in rows:
        valid = "yes" if r["valid"] else "no: " + ", ".join(r["errors"])
        gap = r["best_knobs"] / r["top"] - 1 if r["best_knobs"] and r["top"] else None
        agree += gap is not None and gap >= -0.15 and r["valid"] and r["fits"]
        print(f"| {r['name']} | {r['job']} | {r['layout']} | {valid} | {'yes' if r['fits'] else 'NO'} "
              f"({r['peak_gib']:.1f}) | {pct(r['as_written'], r['top'])} | {pct(r['best_knobs'], r['top'])} | "
              f"{r['top_layout']} ({r['top']:,.0f} tok/s/GPU) |" if r["top"] else f"| {r['name']} | no pick |")
    print(f"\n{agree} of {len(rows)} recipes are valid, fit, and (with their best knobs) within 15% of the top pick.")


if __name__ == "__main__":
    main()
