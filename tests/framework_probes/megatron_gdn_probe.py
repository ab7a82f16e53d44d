"""Builds what Megatron-Core 0.19.2 makes of a rendered pretrain_gpt.py command line for a Gated DeltaNet hybrid (its
GPTModel path): parse_args and validate_args, the TransformerConfig core_transformer_config_from_args makes (its
__post_init__ checks the GDN fields), each decoder layer's mixer and MLP as the layer spec reads them
(get_linear_attention_pattern, get_moe_layer_pattern) and the decoder layers every pipeline rank and virtual stage
builds (get_transformer_layer_offset, get_num_layers_to_build, or with a pipeline_model_parallel_layout its
get_layer_id_list: how the experimental attention block slices its layer specs). Runs INSIDE the validators venv
(CPU torch).

Input: a JSON list of {"id", "argv" (the flags after pretrain_gpt.py), "num_gpus"}. Output: a JSON list of {"id",
"accept", "stage", "message", "linear", "moe", "chunks"} (chunks: [pp_rank][vp_stage] = [offset, layers]).
"""

from __future__ import annotations

import os
import sys
import traceback
import typing

import typing_extensions
from probe_io import serve

if not hasattr(typing, "override"):
    typing.override = typing_extensions.override


def run(case: dict) -> dict:
    import megatron.training.arguments as arguments
    import torch

    # no GPU here: validate_args asks the generation for TP or CP > 1 and the capability for --moe-grouped-gemm
    arguments.get_device_arch_version = lambda: 9
    torch.cuda.get_device_capability = lambda *_: (9, 0)
    os.environ.update(WORLD_SIZE=str(case["num_gpus"]), RANK="0", LOCAL_RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    out = {"id": case["id"], "accept": True, "stage": "", "message": "", "linear": None, "moe": None, "chunks": None}
    stage = "parse_args"
    try:
        # --no-rope-fusion: the venv has no Transformer Engine, whose fused rope TransformerConfig asks for
        sys.argv = ["pretrain_gpt.py", *case["argv"], "--lr", "1e-4", "--train-iters", "10", "--no-rope-fusion"]
        args = arguments.parse_args()
        stage = "validate_args"
        arguments.validate_args(args)
        stage = "TransformerConfig"
        from megatron.training.arguments import core_transformer_config_from_args

        config = core_transformer_config_from_args(args)
        stage = "layer patterns"
        from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
            get_linear_attention_pattern,
            get_moe_layer_pattern,
        )

        out["linear"] = list(get_linear_attention_pattern(config))
        out["moe"] = list(get_moe_layer_pattern(config)) if config.num_moe_experts else [0] * config.num_layers
        stage = "get_num_layers_to_build"
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

        vpp = config.virtual_pipeline_model_parallel_size
        layout = config.pipeline_model_parallel_layout
        if layout is not None:  # the block slices its layer specs by the layout's ids (get_layer_id_list), which
            # reads the virtual world size from parallel_state (no process group: set as initialize_model_parallel does)
            from megatron.core import parallel_state
            from megatron.core.transformer.enums import LayerType

            parallel_state.set_virtual_pipeline_model_parallel_world_size(vpp)
            out["chunks"] = [[[layout.get_layer_offset(LayerType.decoder, vp_stage=v, pp_rank=r),
                               len(layout.get_layer_id_list(LayerType.decoder, vp_stage=v, pp_rank=r))]
                              for v in (range(vpp) if vpp else [None])]
                             for r in range(config.pipeline_model_parallel_size)]
        else:
            out["chunks"] = [[[get_transformer_layer_offset(config, vp_stage=v, pp_rank=r),
                               get_num_layers_to_build(config, vp_stage=v, pp_rank=r)]
                              for v in (range(vpp) if vpp else [None])]
                             for r in range(config.pipeline_model_parallel_size)]
    except (AssertionError, ValueError, RuntimeError, NotImplementedError) as exc:
        out.update(accept=False, stage=stage, message=f"{type(exc).__name__}: {exc}"[:500])
    except SystemExit as exc:
        out.update(accept=False, stage="parse_args", message=f"SystemExit {exc.code}")
    except Exception:  # a crash is not a verdict
        out.update(accept=None, stage=stage, message=traceback.format_exc()[-1500:])
    return out


if __name__ == "__main__":
    serve(run)
