"""Every knob a plan uses and its framework's card gives a key for is written by render: SkyRL's card named
MegatronConfig.fp8 while its render left precision=fp8 out, so a plan timed in fp8 ran in bf16. For each framework,
variant and knob below, a request that uses the knob and passes the rules is rendered through the API (rules first),
and the key's own name must appear in the text; where a key is written another way, WRITTEN_ELSEWHERE says how."""

from __future__ import annotations

import re

import pytest

from meshplan import api
from meshplan.core.errors import MeshplanError
from meshplan.knowledge.adapter_knobs import knob_table
from meshplan.knowledge.cards import framework_card
from meshplan.schema.request import Request

MOE = dict(model="qwen3-30b-a3b", num_gpus=64, global_batch_size=512, ep=8)
USES = {  # knob -> request fields that use it
    "fp8": dict(precision="fp8"), "fp8_tensorwise": dict(precision="fp8", fp8_recipe="tensorwise"),
    "fp8_blockwise": dict(precision="fp8", fp8_recipe="blockwise"), "fp8_delayed": dict(precision="fp8",
                                                                                        fp8_recipe="delayed"),
    "fp8_mxfp8": dict(precision="fp8", fp8_recipe="mxfp8", gpu="b200"),
    "optimizer_state_dtype": dict(optimizer_state_dtype="bf16"), "grad_reduce_bf16": dict(grad_reduce_in_fp32=False),
    "cp_comm_type": dict(cp=2, cp_comm_type="a2a"), "sequence_parallel": dict(tp=2, sequence_parallel=True),
    "recompute_selective": dict(recompute="selective"), "recompute_full": dict(recompute="full"),
    "param_offload": dict(param_offload=True), "optimizer_offload": dict(optimizer_offload=True),
    "optimizer_offload_fraction": dict(optimizer_offload_fraction=0.5), "moe_flex_dispatcher":
    dict(moe_token_dispatcher="flex"), "dropout": dict(dropout=True), "uneven_pp": dict(pp=2, first_stage_layers=23,
                                                                                        last_stage_layers=25),
    "vpp": dict(pp=2, vpp=2), "dp_replicate": dict(dp_replicate=2),
    **{f"account_for_{part}": dict(pp=2, account_for_embedding=True, account_for_loss=True)
       for part in ("embedding", "loss")},  # 48 layers + 2 over pp 2
}
WRITTEN_ELSEWHERE = {
    ("megatron-bridge", "run_recipe", "fp8_"): "run_recipe.py names the registered preset (mixed_precision=<preset>)",
    ("skyrl", "rl", "optimizer_offload"): "SkyRL's default is on: render writes offload_after_step=false when off",
    ("skyrl", "fsdp", "optimizer_offload"): "SkyRL's default is on: render writes offload_after_step=false when off",
    ("deepspeed", "config", "recompute_"): "a ds_config turns no recomputation on; render says so in a note",
}
FRAMEWORKS = ("megatron-core", "megatron-bridge", "verl", "skyrl", "torchtitan", "kempnerforge", "deepspeed",
              "nemo-automodel")


def _cases():
    for framework in FRAMEWORKS:
        card = framework_card(framework)
        for variant in card.adapter.variants:
            table = knob_table(card, card.adapter.default_version, variant)
            for knob in USES:
                spec = table.get(knob)
                if spec is None or spec.key is None or spec.key.startswith("("):
                    continue
                if not any(framework == f and variant == v and knob.startswith(k) for f, v, k in WRITTEN_ELSEWHERE):
                    yield framework, variant, knob, spec.key


def _key_name(key: str) -> str:
    """The last part of the key's first name ('a.b.fp8_recipe=blockwise' -> 'fp8_recipe', '--fp8-recipe x' ->
    'fp8_recipe'), as the rendered text spells it in any of its formats."""
    first = re.split(r"[ =+]", key.strip())[0].strip("+[]")
    return first.split(".")[-1].lstrip("-").replace("-", "_")


@pytest.mark.parametrize("framework,variant,knob,key", list(_cases()))
def test_a_used_knob_with_a_key_is_written(framework, variant, knob, key):
    fsdp = variant in ("fsdp", "sft-fsdp") or framework in ("torchtitan", "kempnerforge", "nemo-automodel",
                                                              "deepspeed")
    fields = {**MOE, "framework": framework, "gpu": "h100", "zero_stage": 3 if fsdp else 1, **USES[knob]}
    if variant in ("fsdp", "sft-fsdp", "config") or framework == "deepspeed":  # engines without EP (or TP/PP)
        fields.pop("ep")
    if variant == "rl" or (framework == "verl" and variant == "megatron"):
        fields |= {"job": "rl", "samples_per_prompt": 8, "prompt_length": 512, "response_length": 1024,
                   "rollout_tp": 4}
    try:
        result = api.render_config(framework, Request(**fields), variant=variant)
    except MeshplanError as exc:  # a rule or another knob refuses this combination: nothing written to check
        pytest.skip(f"not rendered: {exc.reason[:120]}")
    text = result.text.replace("-", "_")
    assert _key_name(key) in text, f"{framework} {variant}: {knob} uses {key!r}, not in\n{result.text}"


def test_the_check_has_teeth():
    """The SkyRL fp8 case was rendered before the fix and is checked now; at least one case per framework runs."""
    cases = list(_cases())
    assert ("skyrl", "rl", "fp8", "trainer.policy.megatron_config.fp8") in cases
    assert {c[0] for c in cases} == set(FRAMEWORKS)
