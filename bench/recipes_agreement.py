"""Do the expert recipes in the decision tables agree with the search? Each must pass check_config, fit, and be
predicted within 15% of the search's top pick for the same job (issue 5), or the card must say why not.

    python bench/recipes_agreement.py [--gaps]

Recipes: every layout cards/strategies.yaml names for a concrete job (moe_by_model recipes, worked examples,
dense_by_size examples). For each: the recipe as written (its micro-batch, recompute and ZeRO stage, at the
global batch the search compares layouts on), the same degrees with the knobs the search would pick for them
(zero stage, recompute, micro-batch searched with tp/pp/vpp/cp/ep/etp pinned), and the search's free pick.

Each row is reported as `agree` (valid, fits, best knobs within 15% of the top pick), `explained` (valid and
fits, more than 15% off, and its card row carries `differs_from_search` saying why) or `unexplained`
(invalid, does not fit, or off without an explanation). An `agree` row that still carries an explanation is
flagged as stale, so the card can drop it. `--gaps` prints, for each row off by more than the tolerance, the parts
of the step where the recipe (best knobs) and the pick differ and each side's terms with the measured runs that
exercise them (cards/accuracy.yaml): what a `differs_from_search` explanation is written from.
"""

from __future__ import annotations

import argparse
from datetime import date

from meshplan.check.config import check_config
from meshplan.estimate.memory import estimate_memory
from meshplan.estimate.perf import estimate_throughput
from meshplan.knowledge.tables import CheckedLayout, DiffersFromSearch, RecipeGap, strategies_card
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request
from meshplan.search import recommend

DEGREES = ("tp", "pp", "vpp", "cp", "ep", "etp", "first_stage_layers", "last_stage_layers")
TOLERANCE = 0.15  # issue 5: within 15% of the top pick
GAP_TOLERANCE = 0.05  # a recorded step within 5% still holds: a note's figures are worded to a few percent


def recipes() -> list[tuple[str, CheckedLayout, DiffersFromSearch | None]]:
    card = strategies_card()
    out = [(f"moe_by_model/{row.id}", row.recipe, row.differs_from_search) for row in card.moe_by_model]
    out += [(f"examples/{row.id}", row.job, row.differs_from_search) for row in card.examples]
    out += [(f"dense_by_size/{row.id}", row.example, row.differs_from_search)
            for row in card.dense_by_size if row.example is not None]
    return out


def verdict(row: dict, explained: bool) -> str:
    """agree / explained / unexplained, as issue 5 counts them."""
    gap = row["best_knobs"] / row["top"] - 1 if row["best_knobs"] and row["top"] else None
    if not (row["valid"] and row["fits"]) or gap is None:
        return "unexplained"
    if gap >= -TOLERANCE:
        return "agree"
    return "explained" if explained else "unexplained"


def evaluate(name: str, recipe: CheckedLayout) -> dict:
    fields = recipe.request_fields()
    job_fields = {k: v for k, v in fields.items() if k in ("model", "gpu", "num_gpus", "gpus_per_node", "seq_length",
                                                             "framework", "precision", "global_batch_size")}
    free = recommend(Request(**job_fields), top_k=1)
    gbs = free.global_batch_size
    job, plan = resolve(Request(**{**fields, "global_batch_size": gbs}))
    check = check_config(job, plan)
    errors = [f.id for f in check.findings if f.severity == "error"]
    mem = estimate_memory(job, plan)
    row = {"name": name, "job": f"{recipe.model} x{recipe.num_gpus} {recipe.framework}", "layout": plan.short(),
           "job_fields": job_fields, "gbs": gbs,
           "valid": not errors, "errors": errors, "fits": mem.fits, "peak_gib": mem.peak_bytes / 2**30}
    as_written = estimate_throughput(job, plan).tokens_per_s_per_gpu if not errors else None
    pinned = {d: fields[d] for d in DEGREES if d in fields}
    best_same = recommend(Request(**job_fields, **pinned), top_k=1)
    top = free.candidates[0].throughput.tokens_per_s_per_gpu if free.candidates else None
    same = best_same.candidates[0].throughput.tokens_per_s_per_gpu if best_same.candidates else None
    row.update(top=top, top_layout=free.candidates[0].plan.short() if free.candidates else "none",
               as_written=as_written, best_knobs=same,
               sides=[c for c in (best_same.candidates[:1] + free.candidates[:1])] if same and top else [])
    return row


PARTS = {"compute": "compute_s", "recompute": "recompute_s", "TP": "tp_comm_s", "CP": "cp_comm_s",
         "EP all-to-all": "ep_comm_s", "DP/FSDP": "dp_comm_s", "PP transfers": "pp_comm_s", "bubble": "bubble_s",
         "other": "other_s"}


def knobs(plan) -> str:
    words = [f"mbs {plan.micro_batch_size}", f"ZeRO {plan.zero_stage}", f"recompute {plan.recompute}"]
    if plan.moe_token_dispatcher == "flex":
        words.append("flex")
    if plan.moe_a2a_overlap:
        words.append("EP overlap")
    return ", ".join(words)


def gap_lines(row: dict) -> list[str]:
    """Where the recipe (degrees pinned, best knobs) and the search's pick differ: each part of the step, largest
    difference first, and each side's terms with the measured runs behind them (cards/accuracy.yaml)."""
    from meshplan.estimate.accuracy import accuracy_card, terms

    recipe, pick = row["sides"]
    counts = accuracy_card().throughput.terms
    rb, pb = recipe.throughput.breakdown, pick.throughput.breakdown
    diffs = sorted(((getattr(rb, f) - getattr(pb, f), name, getattr(rb, f), getattr(pb, f))
                    for name, f in PARTS.items()), key=lambda d: -abs(d[0]))
    out = [f"  recipe {recipe.plan.short()} ({knobs(recipe.plan)}) {recipe.throughput.step_time_s:.2f} s vs pick "
           f"{pick.plan.short()} ({knobs(pick.plan)}) {pick.throughput.step_time_s:.2f} s; parts (recipe - pick): "
           + ", ".join(f"{n} {d:+.2f} ({r:.2f}/{p:.2f})" for d, n, r, p in diffs if abs(d) >= 0.05)]
    job_fields = row["job_fields"]
    job, _ = resolve(Request(**job_fields, global_batch_size=row["gbs"]))
    if pick.plan.moe_a2a_overlap:
        plain = estimate_throughput(job, pick.plan.model_copy(update={"moe_a2a_overlap": False})).step_time_s
        out.append(f"  pick without EP overlap: {plain:.2f} s a step (the overlap saves "
                   f"{1 - pick.throughput.step_time_s / plain:.0%}); the recipe's step against that: "
                   f"{recipe.throughput.step_time_s / plain - 1:+.1%}")
    for side, c in (("recipe", recipe), ("pick", pick)):
        named = [t for t in terms(job, c.plan, "throughput") if not t.startswith(("framework ", "GPU "))]
        out.append(f"  {side} terms: " + (", ".join(f"{t} {counts.get(t, 0)}" for t in named) or "none"))
    return out


def gap_of(row: dict, derived: str) -> RecipeGap | None:
    """The figures a row's `differs_from_search.gap` records (its card's RecipeGap): None where the search ranks no
    side."""
    if not row["sides"]:
        return None
    recipe, pick = row["sides"]
    return RecipeGap(derived=derived, recipe_s=round(recipe.throughput.step_time_s, 2), pick=pick.plan.short(),
                     pick_s=round(pick.throughput.step_time_s, 2))


def gap_moved(recorded: RecipeGap, today: RecipeGap | None, tolerance: float = GAP_TOLERANCE) -> str | None:
    """How a row's recorded gap differs from today's evaluation, or None where it still holds: the same pick and each
    step within `tolerance` of the one recorded."""
    if today is None:
        return "the search ranks no recipe or pick today"
    if today.pick != recorded.pick:
        return f"the pick is {today.pick} today, not {recorded.pick}"
    for side, was, now in (("recipe", recorded.recipe_s, today.recipe_s), ("pick", recorded.pick_s, today.pick_s)):
        if abs(now / was - 1) > tolerance:
            return f"the {side} takes {now:.2f} s today, not {was:.2f} s"
    return None


def pct(value: float | None, top: float | None) -> str:
    if value is None or not top:
        return "-"
    return f"{value / top - 1:+.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gaps", action="store_true", help="print where each explained row and the pick differ, "
                        "and each row's `gap:` block for cards/strategies.yaml (its figures as of today)")
    args = parser.parse_args()
    rows = []
    for name, recipe, differs in recipes():
        row = evaluate(name, recipe)
        row["verdict"] = verdict(row, differs is not None)
        row["stale"] = differs is not None and row["verdict"] == "agree"
        row["moved"] = (gap_moved(differs.gap, gap_of(row, "2000-01-01")) if differs is not None and
                        differs.gap is not None else "no gap recorded" if differs is not None else None)
        rows.append(row)
    print("| recipe | job | layout | valid | fits (peak GiB) | as written vs top | best knobs vs top | search's top "
          "| verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        valid = "yes" if r["valid"] else "no: " + ", ".join(r["errors"])
        mark = r["verdict"] + (" (explanation stale)" if r["stale"] else "")
        top = f"{r['top_layout']} ({r['top']:,.0f} tok/s/GPU)" if r["top"] else "no pick"
        print(f"| {r['name']} | {r['job']} | {r['layout']} | {valid} | {'yes' if r['fits'] else 'NO'} "
              f"({r['peak_gib']:.1f}) | {pct(r['as_written'], r['top'])} | {pct(r['best_knobs'], r['top'])} | "
              f"{top} | {mark} |")
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("agree", "explained", "unexplained")}
    print(f"\n{len(rows)} recipes: {counts['agree']} agree (valid, fit, best knobs within {TOLERANCE:.0%} of the "
          f"top pick), {counts['explained']} explained (card row carries differs_from_search), "
          f"{counts['unexplained']} unexplained.")
    stale = [r["name"] for r in rows if r["stale"]]
    if stale:
        print(f"Explanations on rows that now agree (stale, can be dropped): {', '.join(stale)}")
    if args.gaps:
        print("\nWhere each row off by more than the tolerance differs (seconds per step; terms: measured runs):")
        for r in rows:
            if r["verdict"] != "agree" and r["sides"]:
                print(f"- {r['name']} ({pct(r['best_knobs'], r['top'])}):")
                print("\n".join(gap_lines(r)))
                if (gap := gap_of(r, date.today().isoformat())) is not None:
                    print(f"  gap: {{derived: '{gap.derived}', recipe_s: {gap.recipe_s}, pick: '{gap.pick}', "
                          f"pick_s: {gap.pick_s}}}" + (f"   # recorded gap stale: {r['moved']}" if r["moved"] else ""))


if __name__ == "__main__":
    main()
