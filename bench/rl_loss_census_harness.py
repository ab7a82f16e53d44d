"""The RL actors' loss paths around their log-probs kernel, op by op with the bytes each aten op reads and writes
(bench/step_op_census_harness.py's Census), on small real CPU tensors: what cards/frameworks/verl.yaml and skyrl.yaml
engine.rl_loss count per logit. Runs INSIDE the throwaway venv of bench/fake_tensor_hf.py (torch 2.13.0 CPU); meshplan
never imports it.

The code below is the frameworks' own, copied with their collectives made identities (one TP rank) and cited; the
kernels timed apart are stand-ins that launch nothing (QUIET): Megatron-Core's vocab_parallel_cross_entropy (cards/
memory.yaml megatron_cross_entropy) and flash_attn's Triton cross_entropy_loss (counted from its kernels' source),
each returning a new bf16 gradient as those do. torch.compile'd pieces run eager here (verl's mul_reduce and its FSDP
entropy, counted fused in the cards), and a composite op counts as one (log_softmax: one read, one write; CUDA's
kernel reads its row three times), which bench/rl_loss_census.py says beside each path.

    python rl_loss_census_harness.py < cases.json     # prints one line: RESULT {...}
"""

from __future__ import annotations

import json
import sys

import step_op_census_harness as census_harness
import torch
import torch.nn.functional as F
from step_op_census_harness import Census


class _Quiet(torch.autograd.Function):
    """A loss kernel timed apart (Megatron's cross-entropy, flash_attn's): per-token output, a new bf16 gradient, no
    op counted (its own bytes are its card's)."""

    @staticmethod
    def forward(ctx, logits):
        census_harness.QUIET = True
        try:
            out = logits.float().sum(-1)
        finally:
            census_harness.QUIET = False
        ctx.shape, ctx.dtype = logits.shape, logits.dtype
        return out

    @staticmethod
    def backward(ctx, grad):
        census_harness.QUIET = True
        try:
            return torch.ones(ctx.shape, dtype=ctx.dtype) * 1.0
        finally:
            census_harness.QUIET = False


class VerlVocabParallelEntropy(torch.autograd.Function):
    """volcengine/verl b178a3c verl/utils/megatron/tensor_parallel.py _VocabParallelEntropy, one TP rank (its
    all_reduces identities), mul_reduce eager."""

    @staticmethod
    def forward(ctx, vocab_parallel_logits: torch.Tensor) -> torch.Tensor:
        def mul_reduce(a, b):
            return (a * b).sum(dim=-1, keepdim=True)

        logits_max = vocab_parallel_logits.max(dim=-1, keepdim=True).values
        normalized_vocab_parallel_logits = vocab_parallel_logits - logits_max
        normalized_exp_logits = normalized_vocab_parallel_logits.exp_()
        normalized_sum_exp_logits = normalized_exp_logits.sum(dim=-1, keepdim=True)
        softmax_logits = normalized_exp_logits.div_(normalized_sum_exp_logits)
        sum_softmax_times_logits = mul_reduce(softmax_logits, vocab_parallel_logits)
        entropy = logits_max + normalized_sum_exp_logits.log() - sum_softmax_times_logits
        ctx.save_for_backward(vocab_parallel_logits, softmax_logits, sum_softmax_times_logits)
        return entropy.squeeze(dim=-1)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> torch.Tensor:
        vocab_parallel_logits, softmax_logits, sum_softmax_times_logits = ctx.saved_tensors
        vocab_parallel_logits.sub_(sum_softmax_times_logits)
        softmax_logits.mul_(vocab_parallel_logits)
        softmax_logits.mul_(grad_output.unsqueeze(dim=-1))
        vocab_parallel_logits.add_(sum_softmax_times_logits)
        softmax_logits.mul_(-1)
        return softmax_logits


class SkyrlVocabParallelEntropy(VerlVocabParallelEntropy):
    """SkyRL a956457 model_utils.py _VocabParallelEntropy: verl's forward, a backward that leaves the logits as they
    are (ChunkedDistributedLogprob saves them too)."""

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> torch.Tensor:
        vocab_parallel_logits, softmax_logits, sum_softmax_times_logits = ctx.saved_tensors
        softmax_logits.mul_(sum_softmax_times_logits - vocab_parallel_logits)
        softmax_logits.mul_(grad_output.unsqueeze(dim=-1))
        return softmax_logits


def _distributed_log_softmax(vocab_parallel_logits: torch.Tensor) -> torch.Tensor:
    """NovaSky-AI/SkyRL a956457 skyrl/backends/skyrl_train/distributed/megatron/model_utils.py
    _compute_distributed_log_softmax, one TP rank."""
    logits_max = torch.amax(vocab_parallel_logits, dim=-1, keepdim=True)
    vocab_parallel_logits = vocab_parallel_logits - logits_max
    sum_exp_logits = vocab_parallel_logits.exp().sum(-1, keepdim=True).float()
    return vocab_parallel_logits - sum_exp_logits.log_().to(vocab_parallel_logits.dtype)


class SkyrlChunkedLogprob(torch.autograd.Function):
    """SkyRL a956457 model_utils.py ChunkedDistributedLogprob, one TP rank, every target in the rank's vocabulary."""

    @staticmethod
    def forward(ctx, vocab_parallel_logits, target, chunk_size, inference_only=False):
        seq_size = int(vocab_parallel_logits.shape[1])
        num_chunks = (seq_size + chunk_size - 1) // chunk_size
        all_log_probs = []
        for chunk_idx in range(num_chunks):
            chunk_start, chunk_end = chunk_idx * chunk_size, min(seq_size, (chunk_idx + 1) * chunk_size)
            logits = vocab_parallel_logits[:, chunk_start:chunk_end, :].to(dtype=torch.float32)
            log_probs = _distributed_log_softmax(logits)
            log_probs = torch.gather(log_probs, -1, target[:, chunk_start:chunk_end].unsqueeze(-1)).squeeze(-1)
            all_log_probs.append(log_probs)
        log_probs = torch.cat(all_log_probs, dim=1)
        if not inference_only:
            ctx.save_for_backward(vocab_parallel_logits, target)
            ctx.chunk_size = chunk_size
        return log_probs

    @staticmethod
    def backward(ctx, *grad_outputs):
        grad_output = grad_outputs[0]
        vocab_parallel_logits, target = ctx.saved_tensors
        chunk_size = ctx.chunk_size
        batch_size, seq_size, vocab = vocab_parallel_logits.shape
        num_chunks = (seq_size + chunk_size - 1) // chunk_size
        grad_input = torch.empty((batch_size, seq_size, vocab), dtype=torch.float32)
        for chunk_idx in range(num_chunks):
            chunk_start, chunk_end = chunk_idx * chunk_size, min(seq_size, (chunk_idx + 1) * chunk_size)
            logits = vocab_parallel_logits[:, chunk_start:chunk_end, :].to(dtype=torch.float32)
            softmax_output = _distributed_log_softmax(logits).exp()
            chunk_grad_input = softmax_output.neg_()
            chunk_grad_input.mul_(grad_output[:, chunk_start:chunk_end].unsqueeze(-1))
            flat = (torch.arange(chunk_end - chunk_start) * vocab + target[0, chunk_start:chunk_end])
            chunk_grad_input.view(-1).scatter_add_(0, flat, grad_output[0, chunk_start:chunk_end])
            grad_input[:, chunk_start:chunk_end, :] = chunk_grad_input
        return grad_input, None, None, None


def skyrl_chunked_entropy(logits: torch.Tensor, requires_grad: bool, chunk_size: int) -> torch.Tensor:
    """SkyRL a956457 skyrl/backends/skyrl_train/utils/torch_utils.py chunked_entropy_from_logits (no mask), the
    chunk upcast to fp32 as CUDA autocast does for log_softmax (its fp32 list) under the training step's bf16
    autocast."""
    with torch.set_grad_enabled(requires_grad):
        num_chunks = (logits.size(1) + chunk_size - 1) // chunk_size
        entropy_tensor = torch.zeros((logits.shape[0], logits.shape[1]), dtype=logits.dtype)
        for i in range(num_chunks):
            chunk = logits[:, i * chunk_size:min((i + 1) * chunk_size, logits.size(1))]
            chunk_logprob = F.log_softmax(chunk.float(), dim=-1)
            chunk_probs = chunk_logprob.exp()
            chunk_entropy = -(chunk_probs * chunk_logprob).sum(-1)
            entropy_tensor[:, i * chunk_size:min((i + 1) * chunk_size, logits.size(1))] = chunk_entropy
    return entropy_tensor


def _output(tokens: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The output layer's bf16 result as a non-leaf (its backward, clone's, launches nothing)."""
    base = torch.randn(tokens, 1, vocab).to(torch.bfloat16).requires_grad_()
    return base, base.clone()


def run(path: str, tokens: int, vocab: int, chunk: int) -> dict:
    """Bytes per logit of the path's forward and backward (memory-bound ops; views launch nothing)."""
    torch.manual_seed(0)
    mode = Census()
    _base, out = _output(tokens, vocab)
    target = torch.randint(0, vocab, (1, tokens))
    with mode:
        mode.on = True
        marks = {}
        if path.startswith("verl_megatron"):
            logits = out.transpose(0, 1).contiguous()  # Megatron-Core GPTModel without labels: a view at b = 1
            with torch.no_grad() if path.endswith("old_pass") else torch.enable_grad():
                logits.div_(0.7)
                loss = 0.0
                if path != "verl_megatron_update":
                    logits_bak = logits.clone()
                    loss = VerlVocabParallelEntropy.apply(logits).sum()
                else:
                    logits_bak = logits
                loss = loss + _Quiet.apply(logits_bak).sum()
        elif path.startswith("skyrl_fsdp"):
            logits = out.reshape(1, tokens, vocab)  # HF's [B, S, V] logits, which SkyRL divides themselves
            mode.on = False
            logits = logits.clone()  # the lm_head's own result, not a view (its clone's backward launches nothing)
            mode.on = True
            logits.div_(0.7)
            loss = _Quiet.apply(logits.reshape(-1, vocab)).sum()
            entropy = skyrl_chunked_entropy(logits, path == "skyrl_fsdp_entropy_update", chunk)
            if path == "skyrl_fsdp_entropy_update":
                loss = loss + entropy.sum()
        else:  # skyrl_megatron: temperature 1.0, no division
            logits = out.transpose(0, 1).contiguous()
            inference = path == "skyrl_megatron_forward"
            with torch.no_grad() if inference else torch.enable_grad():
                loss = SkyrlChunkedLogprob.apply(logits, target, chunk, inference).sum()
                if not inference:
                    with torch.set_grad_enabled(path == "skyrl_megatron_entropy_update"):
                        # model_utils.py vocab_parallel_entropy_weighted_sum: one entropy per chunk of tokens
                        entropy = sum(SkyrlVocabParallelEntropy.apply(logits[..., s:s + chunk, :]).sum()
                                      for s in range(0, tokens, chunk))
                    if path == "skyrl_megatron_entropy_update":
                        loss = loss + entropy
        marks["forward"] = sum(r[1] + r[2] for (g, k), r in mode.rows.items() if k == "memory")
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            loss.backward()
        total = sum(r[1] + r[2] for (g, k), r in mode.rows.items() if k == "memory")
    logits_count = tokens * vocab
    ops = sorted(((n, v[1] / logits_count) for (g, n), v in mode.ops.items()), key=lambda kv: -kv[1])
    return {"path": path, "forward": marks["forward"] / logits_count,
            "backward": (total - marks["forward"]) / logits_count,
            "ops": [[n, round(b, 3)] for n, b in ops if b >= 0.05]}


def main() -> None:
    request = json.loads(sys.stdin.read())
    results = []
    for case in request["cases"]:
        try:
            out = run(case["path"], case["tokens"], case["vocab"], case["chunk"]) | {"ok": True}
        except Exception as exc:  # reported per case
            import traceback
            out = {"path": case["path"], "ok": False,
                   "error": f"{type(exc).__name__}: {exc}"[:2000] + traceback.format_exc()[-3000:]}
        results.append(out)
    print("RESULT " + json.dumps({"torch": torch.__version__, "results": results}))


if __name__ == "__main__":
    main()
