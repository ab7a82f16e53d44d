"""Counts the LoRA parameters Hugging Face PEFT adds to a transformers model (run in the throwaway venv of
tests/framework_packages.PEFT_VENV; the model is built on the meta device, so nothing is allocated).

Reads {"config": {...}, "rank": r, "target_modules": ..., optionally "target_parameters": [...]} as JSON on stdin
and prints `RESULT {...}` with the trainable parameters get_peft_model leaves and how many of them sit under a
routed-expert module (`.experts.`) or a vision tower (`vision_model.`), and the base model's parameters in its
vision tower and projector (`vision_base`: vision_model. and multi_modal_projector.), and the full names of the
model's nn.Linear modules but its output head (`linears`: what all-linear adapts). "auto_class":
"image_text_to_text" builds a multimodal model as verl's and SkyRL's FSDP engines build one whose config has a
vision_config (AutoModelForImageTextToText: verl 0.9.1 utils/model.py get_hf_auto_model_class, SkyRL 0.4.0
workers/model_wrapper.py HFModelWrapper). With "forward": true the model is built on the CPU instead (a tiny config)
and one forward and backward of a few tokens is run: `runs` says whether it went through, `error` what failed (an
adapted module PEFT cannot run, such as Llama 4's router under all-linear), `flops` what torch's FlopCounterMode
counted in it ("experts_implementation": "eager" runs transformers' per-expert loop, whose matmuls it sees, where
the default grouped_mm's it does not).

With --serve, one ask per line (bench/harness_serve.py).
"""


import torch
from harness_serve import serve
from peft import LoraConfig, get_peft_model
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText


def answer(ask: dict) -> dict:
    """The count (and the forward's outcome) of one ask."""
    config = AutoConfig.for_model(**ask["config"])
    if ask.get("experts_implementation"):
        config._experts_implementation = ask["experts_implementation"]
    forward = bool(ask.get("forward"))
    auto = AutoModelForImageTextToText if ask.get("auto_class") == "image_text_to_text" else AutoModelForCausalLM
    with torch.device("cpu" if forward else "meta"):
        model = auto.from_config(config)
    vision_base = sum(p.numel() for n, p in model.named_parameters()
                      if n.startswith(("vision_model.", "model.vision_model.", "multi_modal_projector.",
                                       "model.multi_modal_projector.")))
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
               and m is not model.get_output_embeddings()]
    peft = get_peft_model(model, LoraConfig(r=ask["rank"], target_modules=ask["target_modules"],
                                            target_parameters=ask.get("target_parameters"),
                                            exclude_modules=ask.get("exclude_modules")))
    trained = [(n, p.numel()) for n, p in peft.named_parameters() if p.requires_grad]
    result = {"trainable": sum(c for _, c in trained), "experts": sum(c for n, c in trained if ".experts." in n),
              "vision": sum(c for n, c in trained if "vision_model." in n), "vision_base": vision_base,
              "linears": linears}
    if forward:
        try:
            torch.manual_seed(0)
            tokens = torch.randint(0, config.get_text_config().vocab_size, (1, ask.get("tokens", 8)))
            with FlopCounterMode(display=False) as counted:
                peft(input_ids=tokens).logits.float().sum().backward()
            result.update(runs=True, error=None, flops=counted.get_total_flops())
        except Exception as error:  # the failure is the answer: which adapted module cannot run
            result.update(runs=False, error=f"{type(error).__name__}: {error}")
    return result


if __name__ == "__main__":
    serve(answer)
