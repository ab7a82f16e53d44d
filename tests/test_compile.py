"""torch_compile: what each framework compiles (its card's compile section) and the bytes it changes
(cards/memory.yaml compile), the exact loss bytes, the framework defaults."""

from __future__ import annotations

from meshplan.arithmetic.memory_states import memory_card, output_activations, with_precision
from meshplan.estimate.memory import estimate_memory
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

L8B = dict(model="llama-3.1-8b", num_gpus=8, seq_length=8192, global_batch_size=16, micro_batch_size=2)


def _conv(**fields):
    job, plan = resolve(Request(**fields))
    return with_precision(job, plan)[1]


def test_compiled_loss_keeps_bf16_logits_and_their_gradient_only():
    """torchtitan compiles the loss with the blocks: 4 B per logit (bf16 logits + bf16 gradient) in place of the
    eager 12 (0.2.x whole sequence, at its backward peak) and 14 (0.3.0 per chunk); compiled blocks fuse SwiGLU."""
    assert memory_card().compile.logits_bytes_per_element == 4
    for version, eager in (("0.2", 12), ("0.3", 14)):
        off = _conv(framework="torchtitan", framework_version=version, **L8B)
        on = _conv(framework="torchtitan", framework_version=version, torch_compile=True, **L8B)
        assert (off.logits_bytes_per_element, on.logits_bytes_per_element) == (eager, 4)
        assert (off.swiglu_unfused, on.swiglu_unfused) == (True, False)
        assert on.loss_chunks == off.loss_chunks  # compiling the loss does not chunk it


def test_kempnerforge_compiles_the_model_not_the_loss_and_by_default():
    off = _conv(framework="kempnerforge", torch_compile=False, **L8B)
    on = _conv(framework="kempnerforge", torch_compile=True, **L8B)
    assert on.logits_bytes_per_element == off.logits_bytes_per_element
    assert (off.swiglu_unfused, on.swiglu_unfused) == (True, False)
    assert resolve(Request(framework="kempnerforge", **L8B))[1].torch_compile  # TrainConfig.compile_model = true
    assert not resolve(Request(framework="torchtitan", **L8B))[1].torch_compile  # CompileConfig.enable = False


def test_estimate_drops_by_the_loss_formula_on_torchtitan_0_2():
    """0.2.x's whole-sequence loss: the last stage's logits term falls by (12 - 4) x tokens x vocab, and with op-SAC
    (SwiGLU intermediates recomputed either way) that is the whole difference before the allocator reserve."""
    fields = dict(framework="torchtitan", framework_version="0.2", recompute="selective", **L8B)
    job, plan = resolve(Request(**fields))
    off = estimate_memory(job, plan).stages[-1]
    job_c, plan_c = resolve(Request(torch_compile=True, **fields))
    on = estimate_memory(job_c, plan_c).stages[-1]
    tokens, vocab, h = 2 * 8192, job.model.vocab_size, job.model.hidden_size
    conv_off, conv_on = with_precision(job, plan)[1], with_precision(job_c, plan_c)[1]
    drop = (output_activations(conv_off, tokens, vocab, 1, h, 1, 2)
            - output_activations(conv_on, tokens, vocab, 1, h, 1, 2))
    assert drop == (12 - 4) * tokens * vocab
    assert off.detail["logits_and_loss"] - on.detail["logits_and_loss"] == drop
    assert on.total_bytes < off.total_bytes


def test_eager_blocks_pay_the_unfused_elementwise_passes():
    """Time: torchtitan with torch_compile off moves eager_elementwise_passes over the activations, compiled (and
    every framework without a compile switch) elementwise_passes; with the two equal the step times agree."""
    from meshplan.estimate.perf import eager_blocks, estimate_throughput
    from meshplan.knowledge.calibration import calibration

    fields = dict(framework="torchtitan", recompute="selective", **L8B)
    eager, compiled = (resolve(Request(torch_compile=c, **fields)) for c in (False, True))
    assert eager_blocks(*eager) and not eager_blocks(*compiled)
    assert not eager_blocks(*resolve(Request(framework="megatron-core", **L8B)))
    assert not eager_blocks(*resolve(Request(framework="kempnerforge", **L8B)))  # compiled by default
    cal = calibration("torchtitan")
    assert cal.eager_elementwise_passes > cal.elementwise_passes
    slow, fast = (estimate_throughput(*jp).step_time_s for jp in (eager, compiled))
    assert slow > fast
    same = cal.with_overrides(eager_elementwise_passes=cal.elementwise_passes)
    assert estimate_throughput(*eager, same).step_time_s == estimate_throughput(*compiled, same).step_time_s
