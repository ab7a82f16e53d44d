"""NeMo AutoModel's loss_fn.fp32_upcast (MaskedCrossEntropy): the loss's bytes per logit with and without the fp32
upcast (cards/memory.yaml fsdp2_automodel), the refusal on a framework whose loss has no such switch, and the reading
of the key from a recipe and a bench row."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from meshplan.adapters.read import import_config
from meshplan.arithmetic.memory_states import memory_card, output_activations, with_precision
from meshplan.core.errors import MeshplanError
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

BASE = dict(model="qwen3-30b-a3b", gpu="h100", num_gpus=8, ep=8, framework="nemo-automodel", seq_length=4096,
            global_batch_size=512, micro_batch_size=4)


def _conv(**fields):
    job, plan = resolve(Request(**BASE | fields))
    return job, with_precision(job, plan)[1]


def test_bf16_loss_keeps_the_same_three_tensors_at_two_bytes():
    card = memory_card().conventions["fsdp2_automodel"]
    # log_softmax, nll_loss's gradient, log_softmax_backward_data's output: 3 x fp32 upcast, 3 x bf16 without
    assert card.logits_bytes_per_element == 3 * 4
    assert card.logits_bytes_without_upcast == 3 * 2
    job, conv = _conv(loss_fp32_upcast=False)
    assert job.loss_fp32_upcast is False
    assert conv.logits_bytes_per_element == 6
    assert _conv()[1].logits_bytes_per_element == 12  # left out: the fp32 default
    assert _conv(loss_fp32_upcast=True)[1].logits_bytes_per_element == 12


def test_output_activations_move_by_the_logits_at_six_bytes():
    tokens, vocab, hidden = 4 * 4096, 151936, 2048
    on, off = _conv()[1], _conv(loss_fp32_upcast=False)[1]
    drop = (output_activations(on, tokens, vocab, 1, hidden, 1, 4)
            - output_activations(off, tokens, vocab, 1, hidden, 1, 4))
    assert drop == (12 - 6) * tokens * vocab


def test_refused_where_the_loss_has_no_switch():
    with pytest.raises(MeshplanError, match="loss_fp32_upcast"):
        resolve(Request(**BASE | {"framework": "megatron-core"}, loss_fp32_upcast=False))
    # true is every convention's own count: nothing to refuse
    assert resolve(Request(**BASE | {"framework": "megatron-core"}, loss_fp32_upcast=True))[0].loss_fp32_upcast


RECIPE = """\
step_scheduler:
  global_batch_size: 512
  local_batch_size: 4
distributed:
  strategy: fsdp2
  ep_size: 8
model:
  config:
    pretrained_model_name_or_path: Qwen/Qwen3-30B-A3B
loss_fn:
  _target_: nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy
  fp32_upcast: false
"""


def test_recipe_key_read():
    result = import_config(RECIPE, "recipe.yaml", framework="nemo-automodel", config_format="yaml")
    assert result.request["loss_fp32_upcast"] is False
    on = import_config(RECIPE.replace("fp32_upcast: false", "fp32_upcast: true"), "recipe.yaml",
                       framework="nemo-automodel", config_format="yaml")
    assert on.request["loss_fp32_upcast"] is True


def test_bench_row_reads_its_notes():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from production_sources import upcast_field

    row = {"outcome": {"other": "config x.yaml; it sets loss_fn.fp32_upcast false (at 36044ad3d)"}}
    assert upcast_field(row) == {"loss_fp32_upcast": False}
    assert upcast_field({"outcome": {"other": "no loss setting named"}}) == {}
