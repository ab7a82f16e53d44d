"""The activations a small transformers model keeps for its backward, trained in full and under Hugging Face PEFT's
LoRA (all-linear, or the target_modules asked), two decoder layers and three, so the difference of the two counts is
one layer's. Not one and two: with the embedding frozen, the first layer's frozen linears before its first adapter
see no gradient and autograd records nothing there, so tensors every layer shares (the RoPE cos/sin tables) would
enter the count at the second layer, not the first.

Runs inside the PEFT venv of tests/framework_packages.py (torch 2.13.0, transformers 5.9.0, peft 0.18.1); meshplan
never imports it, and it never imports meshplan. Reads {"config": {...}, "tokens": t, "rank": r, "targets": [...]}
as JSON on stdin ("targets" optional, default "all-linear"; --serve: one ask per line, bench/harness_serve.py)
and prints
`RESULT {"full": [two layers, three layers], "lora": [...]}`: the bytes of the distinct storages autograd saves in one
forward (torch.autograd.graph.saved_tensors_hooks), parameters and buffers left out. The model is bf16 and the
adapters are cast to bf16 after get_peft_model, as verl's and SkyRL's FSDP engines run them (FSDP2's MixedPrecision
param_dtype bf16; PEFT alone would keep the adapters in fp32 and cast the input up). The CPU's eager attention keeps
its s x s weights, the same in both counts, so it cancels in the difference tests/test_lora_activations.py reads; its
output is a new tensor (transpose + reshape) that only o_proj reads, as it is under sdpa, where under
flash_attention_2 (verl's default) o_proj reads flash's own saved output.
"""

import torch
from harness_serve import serve
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM


def saved_bytes(model: torch.nn.Module, tokens: int) -> int:
    storages: dict[int, int] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        storage = x.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return x

    ids = torch.randint(0, model.config.vocab_size, (1, tokens))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        model(input_ids=ids)
    owned = {p.untyped_storage().data_ptr() for p in model.parameters()}
    owned |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    return sum(n for ptr, n in storages.items() if ptr not in owned)


def answer(ask: dict) -> dict:
    """The saved bytes of one ask, full training and LoRA, two layers and three."""
    torch.manual_seed(0)
    result: dict[str, list[int]] = {"full": [], "lora": []}
    for layers in (2, 3):
        config = AutoConfig.for_model(**{**ask["config"], "num_hidden_layers": layers})
        model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
        result["full"].append(saved_bytes(model, ask["tokens"]))
        targets = ask.get("targets", "all-linear")
        lora = get_peft_model(model, LoraConfig(r=ask["rank"], target_modules=targets)).to(torch.bfloat16)
        result["lora"].append(saved_bytes(lora, ask["tokens"]))
    return result


if __name__ == "__main__":
    serve(answer)
