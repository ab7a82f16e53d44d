"""Does recommend's top pick run at least as fast (as meshplan predicts) as the best published Megatron-Bridge recipe
layout? Issue 23's comparisons: DeepSeek-V3 on 1,024 H100, Kimi-K2 on 256 H100, Qwen3-235B-A22B on 256 H100, all with
Megatron-Bridge at sequence 4,096 and global batch 4,096.

The recipe layouts come from the package (meshplan/knowledge/published_runs.py RECIPE_SPLITS: the Bridge entries for
the model, each a pipeline split at one (pp, vpp), or the embedding and loss counted at any pp/vpp they divide), turned
into request fields by bench/production_sources.split_fields. A recipe fixes its pipeline (pp, vpp and the split);
what the recipe table does not pin (tp, cp, ep, micro-batch, recompute, ZeRO) is the best recommend finds with that
pipeline fixed, so each recipe row is the most meshplan can make of that recipe. The recipes' optimizer and gradient
buffer (published_runs.RECIPE_OPTIMIZERS: Kimi-K2's recipes train with Muon, DeepSeek-V3's with bf16 moments and
grads) are the job's, for the recipe rows and the top pick alike. The top pick is recommend with nothing fixed but the
job. "holds" is top pick >= best recipe (tokens/s/GPU).

    python bench/recommend_vs_recipes.py [--json] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.catalog import resolve_model
from meshplan.knowledge.published_runs import BRIDGE, RECIPE_SPLITS, RecipeSplit, recipe_optimizer
from meshplan.schema.request import Request

sys.path.insert(0, str(Path(__file__).resolve().parent))
from production_sources import split_fields

JOBS = {
    "deepseek-v3 1024 H100": dict(model="deepseek-v3", num_gpus=1024),
    "kimi-k2 256 H100": dict(model="kimi-k2", num_gpus=256),
    "qwen3-235b-a22b 256 H100": dict(model="qwen3-235b-a22b", num_gpus=256),
}
COMMON = dict(framework="megatron-bridge", gpu="h100", seq_length=4096, global_batch_size=4096)


def bridge_splits(model: str) -> list[RecipeSplit]:
    """The model's Megatron-Bridge recipe splits (RECIPE_SPLITS)."""
    return [s for s in RECIPE_SPLITS if s.repo == BRIDGE and s.model == model and not s.section]


def job_fields(model: str) -> dict:
    """The optimizer and gradient-buffer fields every Bridge recipe file of the model agrees on (recipe_optimizer):
    the job both the top pick and the recipe rows run."""
    sets = [recipe_optimizer(s) for s in bridge_splits(model)]
    return {k: v for k, v in sets[0].items() if all(x.get(k) == v for x in sets)} if sets else {}


def recipe_pipelines(model: str) -> list[tuple[str, dict]]:
    """(label, request fields) for every Bridge recipe split of the model: pp, vpp and the split's fields, and its
    recipe file's optimizer fields; an entry for any pp/vpp (embedding and loss counted) at pp in 2..16, every vpp the
    search finds for it."""
    arch = resolve_model(model)
    out = []
    for split in bridge_splits(model):
        fields = split_fields(split, arch.num_mtp_layers)
        if fields is None:
            continue
        fields = {**recipe_optimizer(split), **fields}
        if split.pp is None:
            out += [(f"{split.source} pp{pp}", {"pp": pp, **fields}) for pp in (2, 4, 8, 16)]
        else:
            out.append((f"{split.source} pp{split.pp} vpp{split.vpp}", {"pp": split.pp, "vpp": split.vpp, **fields}))
    return out


def best(req: Request) -> dict:
    """The top candidate of recommend for the request, as a row, or why there is none."""
    try:
        rec = api.recommend(req, top_k=1)
    except MeshplanError as err:
        return {"error": err.reason}
    if not rec.candidates:
        return {"error": "no layout with this pipeline fits: " + ", ".join(f"{k} x{v:,}" for k, v in
                                                                          list(rec.rejected.items())[:3])}
    c = rec.candidates[0]
    p = c.plan
    split = p.pipeline_layout or ("account_for_embedding/loss" if p.account_for_embedding or p.account_for_loss
                                  else f"first/last {p.first_stage_layers}/{p.last_stage_layers}"
                                  if p.first_stage_layers is not None else "even")
    return {"layout": p.short(), "split": split, "tokens_per_s_per_gpu": round(c.throughput.tokens_per_s_per_gpu, 1),
            "evaluated": rec.evaluated}


def compare(name: str) -> dict:
    job = {**JOBS[name], **COMMON}
    job.update(job_fields(job["model"]))
    top = best(Request(**job))
    recipes = []
    for label, fields in recipe_pipelines(job["model"]):
        recipes.append({"recipe": label, **best(Request(**{**job, **fields}))})
    scored = [r for r in recipes if "tokens_per_s_per_gpu" in r]
    best_recipe = max(scored, key=lambda r: r["tokens_per_s_per_gpu"], default=None)
    holds = ("tokens_per_s_per_gpu" in top and best_recipe is not None
             and top["tokens_per_s_per_gpu"] >= best_recipe["tokens_per_s_per_gpu"])
    return {"job": name, "job_fields": {k: v for k, v in job.items() if k not in JOBS[name] and k not in COMMON},
            "top_pick": top, "best_recipe": best_recipe, "recipes": recipes, "holds": holds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--only", choices=list(JOBS))
    args = parser.parse_args()
    rows = [compare(name) for name in JOBS if args.only in (None, name)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| job | top pick | tokens/s/GPU | best recipe | recipe layout | tokens/s/GPU | holds |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        top, rec = r["top_pick"], r["best_recipe"] or {}
        print(f"| {r['job']} | {top.get('layout', '-')} {top.get('split', '')} "
              f"| {top.get('tokens_per_s_per_gpu', top.get('error', '-'))} | {rec.get('recipe', '-')} "
              f"| {rec.get('layout', '-')} | {rec.get('tokens_per_s_per_gpu', '-')} "
              f"| {'yes' if r['holds'] else 'NO'} |")
    for r in rows:
        print(f"\n{r['job']}: every recipe pipeline" + "".join(f", {k}={v}" for k, v in r["job_fields"].items()))
        for x in r["recipes"]:
            print(f"  {x['recipe']}: {x.get('layout', '')} {x.get('tokens_per_s_per_gpu', x.get('error', ''))}")


if __name__ == "__main__":
    main()
