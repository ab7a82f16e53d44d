"""Counts the LoRA parameters Hugging Face PEFT adds to a transformers model (run in the throwaway venv of
tests/framework_packages.PEFT_VENV; the model is built on the meta device, so nothing is allocated).

Reads {"config": {...}, "rank": r, "target_modules": ...} as JSON on stdin and prints `RESULT {...}` with the trainable
parameters get_peft_model leaves and how many of them sit under a routed-expert module (`.experts.`).
"""

import json
import sys

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM


def main() -> None:
    ask = json.load(sys.stdin)
    config = AutoConfig.for_model(**ask["config"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    peft = get_peft_model(model, LoraConfig(r=ask["rank"], target_modules=ask["target_modules"]))
    trained = [(n, p.numel()) for n, p in peft.named_parameters() if p.requires_grad]
    print("RESULT " + json.dumps({"trainable": sum(c for _, c in trained),
                                  "experts": sum(c for n, c in trained if ".experts." in n)}))


if __name__ == "__main__":
    main()
