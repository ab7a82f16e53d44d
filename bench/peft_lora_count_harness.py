"""Counts the LoRA parameters Hugging Face PEFT adds to a transformers model (run in the throwaway venv of
tests/framework_packages.PEFT_VENV; the model is built on the meta device, so nothing is allocated).

Reads {"config": {...}, "rank": r, "target_modules": ...} as JSON on stdin and prints `RESULT {...}` with the trainable
parameters get_peft_model leaves and how many of them sit under a routed-expert module (`.experts.`). With
"forward": true the model is built on the CPU instead (a tiny config) and one forward and backward of a few tokens is
run: `runs` says whether it went through, `error` what failed (an adapted module PEFT cannot run, such as Llama 4's
router under all-linear).
"""

import json
import sys

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM


def main() -> None:
    ask = json.load(sys.stdin)
    config = AutoConfig.for_model(**ask["config"])
    forward = bool(ask.get("forward"))
    with torch.device("cpu" if forward else "meta"):
        model = AutoModelForCausalLM.from_config(config)
    peft = get_peft_model(model, LoraConfig(r=ask["rank"], target_modules=ask["target_modules"]))
    trained = [(n, p.numel()) for n, p in peft.named_parameters() if p.requires_grad]
    result = {"trainable": sum(c for _, c in trained), "experts": sum(c for n, c in trained if ".experts." in n)}
    if forward:
        try:
            tokens = torch.randint(0, config.vocab_size, (1, 8))
            peft(input_ids=tokens).logits.float().sum().backward()
            result.update(runs=True, error=None)
        except Exception as error:  # the failure is the answer: which adapted module cannot run
            result.update(runs=False, error=f"{type(error).__name__}: {error}")
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
