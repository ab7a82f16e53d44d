"""DeepSpeed's expert parallelism as Megatron-DeepSpeed runs it (cards/frameworks/deepspeed.yaml search.source, with
the source): --moe-expert-parallel-size is rendered and read back, with the MoE flags without which
Megatron-DeepSpeed trains a dense model; ep need not divide dp when experts are whole (DS001: ep divides tp*dp, as
DeepSpeed's _create_expert_and_data_parallel); DeepSpeed-MoE layers refuse ZeRO-3 (DS004). Before: the card searched
ep while the adapter refused it (AD001), so recommend on DeepSpeed threw away every EP layout after enumerating it
and ranked ZeRO-3 layouts that Megatron-DeepSpeed's MoE layers do not run."""

from __future__ import annotations

from meshplan import api
from meshplan.adapters.parse import cli_flags, parse_plan, shell_tokens
from meshplan.request.resolve import resolve
from meshplan.schema.request import Request

MIX = dict(model="mixtral-8x7b", gpu="h100", framework="deepspeed")


def _flags(text: str) -> dict:
    tokens = shell_tokens(text.split("\nDS_CONFIG\n", 1)[1])
    return cli_flags(tokens[tokens.index("pretrain_gpt.py") + 1:])


def test_recommend_ranks_expert_parallel_layouts_that_render_and_read_back():
    rec = api.recommend(Request(**MIX, num_gpus=64), top_k=10)
    assert "AD001" not in rec.rejected and "DS004" in rec.rejected
    assert any(c.plan.ep > 1 for c in rec.candidates)
    for cand in rec.candidates:
        p = cand.plan
        assert p.zero_stage < 3 or max(p.tp, p.pp, p.ep) == 1
        req = Request(**MIX, num_gpus=64, tp=p.tp, pp=p.pp, ep=p.ep, zero_stage=p.zero_stage,
                      micro_batch_size=p.micro_batch_size, recompute=p.recompute)
        out = api.render_config("deepspeed", req)
        job, plan = resolve(req)
        parsed = parse_plan("deepspeed", out.variant, out.text, job.model.num_layers)
        assert parsed["ep"] == plan.ep and parsed["tp"] == plan.tp and parsed["pp"] == plan.pp


def test_render_writes_the_moe_layers_and_import_reads_ep():
    # 32 GPUs: on 16 the step's whole-partition tensors over the backward's reserve do not fit ZeRO-1 (MEM001)
    out = api.render_config("deepspeed", Request(**MIX, num_gpus=32, ep=8, zero_stage=1, recompute="full"))
    assert out.variant == "megatron-deepspeed"  # a plain ds_config cannot say ep
    flags = _flags(out.text)
    assert (flags["--num-experts"], flags["--topk"], flags["--expert-interval"]) == ("8", "2", "1")
    assert flags["--moe-expert-parallel-size"] == "8" and flags["--create-moe-param-group"] is True
    assert flags["--ffn-hidden-size"] == "14336"
    imported = api.import_config(out.text, framework="deepspeed")
    assert imported.sources["ep"].endswith("--moe-expert-parallel-size")
    req = api.request_from_config(imported, {"gpu": "h100", "model": "mixtral-8x7b"})
    assert (req.ep, req.num_gpus, req.zero_stage) == (8, 32, 1)
    assert not [f for f in api.check_config(req, config=imported).findings if f.severity == "error"]


def test_dense_layers_are_one_expert_each_and_what_the_flags_cannot_say_is_noted():
    """DeepSeek-V3's first three layers are dense: --expert-interval 1 with one count per layer (1 = dense MLP)."""
    req = Request(model="deepseek-v3", gpu="h100", framework="deepspeed", num_gpus=1024, tp=8, pp=16, ep=8,
                  global_batch_size=4096, recompute="full")
    out = api.render_config("deepspeed", req, force=True)  # the layout alone, whatever its memory
    counts = _flags(out.text)["--num-experts"]
    assert counts[:4] == ["1", "1", "1", "256"] and len(counts) == 61
    assert any("shared expert" in n and "one --ffn-hidden-size" in n for n in out.notes)


def test_ep_spans_tensor_parallel_ranks_and_zero3_is_refused():
    """Experts whole (etp=1): tp=4, ep=8 on 16 GPUs (dp=4) passes DS001, ep divides tp*dp; ZeRO-3 with a
    Megatron-DeepSpeed MoE layer is DS004; a plain ds_config (tp = pp = ep = 1) at ZeRO-3 is the user's model code."""
    ids = {f.id for f in api.check_config(Request(**MIX, num_gpus=16, tp=4, ep=8)).findings
           if f.severity == "error"}
    assert not ids & {"DS001", "WS002", "AD001"}
    report = api.check_config(Request(**MIX, num_gpus=16, ep=8, zero_stage=3))
    assert any(f.id == "DS004" and "ep=8" in f.message for f in report.findings)
    assert "DS004" not in {f.id for f in api.check_config(Request(**MIX, num_gpus=16, zero_stage=3)).findings}
