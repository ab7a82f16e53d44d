"""verl's Hydra configs composed over their `defaults:` lists (meshplan/adapters/read/hydra_compose.py), from verl's own
packaged files under tests/data/real_configs/verl_compose/ (volcengine/verl verl/trainer/config @ b178a3c, copied
whole; README.md there): the composition checked against verl's own record of Hydra's, _generated_*.yaml."""

from pathlib import Path

import pytest

from meshplan import api
from meshplan.adapters.read.hydra_compose import compose_defaults
from meshplan.adapters.read.settings import yaml_settings
from meshplan.core.errors import MeshplanError

TREE = Path(__file__).resolve().parent / "data" / "real_configs" / "verl_compose"
CONFIG = TREE / "verl" / "trainer" / "config"


def _flat(path: Path) -> dict:
    return {s.key: s.value for s in yaml_settings(path.read_text(), str(path), "a Hydra config", "")}


def _same(a: object, b: object) -> bool:
    """Equal, or the one float two YAML spellings give (PyYAML reads 1e-6 as text, the generated file writes 1e-06)."""
    if a == b:
        return True
    try:
        return float(str(a)) == float(str(b))
    except ValueError:
        return False


def test_ppo_megatron_trainer_composes_to_verls_own_generated_config():
    """Every key of _generated_ppo_megatron_trainer.yaml (verl's scripts/generate_trainer_config.sh: Hydra's compose,
    written out) at its value, and no other: the packages (`actor@actor_rollout_ref.actor: megatron_actor`,
    `model@actor_rollout_ref.model: hf_model`), the chained lists (`../engine@megatron: megatron`, `- actor`) and
    _self_'s place as Hydra takes them."""
    path = CONFIG / "ppo_megatron_trainer.yaml"
    text = path.read_text()
    composed = compose_defaults(text, str(path), yaml_settings(text, str(path), "a Hydra config", ""),
                                "a Hydra config", "", None)
    assert composed is not None and not composed.missing and len(composed.files) == 20
    mine = {s.key: s.value for s in composed.settings}
    generated = _flat(CONFIG / "_generated_ppo_megatron_trainer.yaml")
    assert set(mine) == set(generated)
    assert [k for k in mine if not _same(mine[k], generated[k])] == []
    where = {s.key: (Path(s.file or path).relative_to(CONFIG).as_posix(), s.line) for s in composed.settings}
    assert where["actor_rollout_ref.actor.megatron.tensor_model_parallel_size"] == ("engine/megatron.yaml", 14)
    assert where["actor_rollout_ref.model.path"] == ("model/hf_model.yaml", 10)


def test_the_packaged_megatron_config_is_read_as_the_megatron_engine_with_its_groups_keys():
    """Read alone before, ppo_megatron_trainer.yaml was verl's FSDP engine (zero_stage 3) at meshplan's defaults:
    its engine, actor, rollout and data keys live in the group files its defaults list names."""
    imported = api.import_file(str(CONFIG / "ppo_megatron_trainer.yaml"))
    assert imported.variant == "megatron" and imported.request["zero_stage"] == 1
    assert imported.sources["zero_stage"].endswith("engine/megatron.yaml:35 "
                                                   "actor_rollout_ref.actor.megatron.use_distributed_optimizer")
    assert imported.sources["rollout_tp"].endswith("rollout/rollout.yaml:50 "
                                                   "actor_rollout_ref.rollout.tensor_model_parallel_size")
    assert imported.request["prompts_per_step"] == 1024 and "data/legacy_data.yaml:42" in \
        imported.sources["prompts_per_step"]
    assert any("composed as Hydra composes it, from 19 config file(s)" in n for n in imported.notes)


def test_an_example_config_composes_the_packaged_one_over_its_searchpath():
    """examples/sglang_multiturn/config/*_megatron_grpo.yaml: `- ppo_megatron_trainer` found on its hydra.searchpath
    (file://verl/trainer/config, from the repository root: the nearest folder above holding it), its own keys over
    the packaged ones (_self_ last)."""
    path = TREE / "examples" / "sglang_multiturn" / "config" / "gsm8k_multiturn_megatron_grpo.yaml"
    imported = api.import_file(str(path))
    request, sources = imported.request, imported.sources
    assert imported.variant == "megatron" and request["tp"] == 2 and request["model"] == "Qwen/Qwen2.5-3B-Instruct"
    assert sources["tp"].startswith(str(path))  # the example's own value over engine/megatron.yaml's 1
    assert request["rollout_memory_fraction"] == 0.5 and "rollout/rollout.yaml" in sources["rollout_memory_fraction"]
    assert not any("not given" in a for a in imported.assumed)
    alone = api.import_config(path.read_text(), path="<pasted>")  # no folder: the list said, as before
    assert "rollout_memory_fraction" not in alone.request
    assert any("Hydra composes this file over those config files, which are not given" in a for a in alone.assumed)


def test_a_group_file_not_beside_it_is_said_and_a_list_naming_itself_is_refused(tmp_path):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "megatron.yaml").write_text("tensor_model_parallel_size: 4\n")
    main = tmp_path / "trainer.yaml"
    main.write_text("defaults:\n  - engine@actor_rollout_ref.actor.megatron: megatron\n  - rollout@actor_rollout_ref"
                    ".rollout: rollout\n  - _self_\nactor_rollout_ref:\n  actor:\n    strategy: megatron\n"
                    "trainer:\n  nnodes: 1\n  n_gpus_per_node: 8\n")
    imported = api.import_file(str(main))
    assert imported.request["tp"] == 4 and "engine/megatron.yaml:1" in imported.sources["tp"]
    said = next(a for a in imported.assumed if "rollout@actor_rollout_ref.rollout: rollout" in a)
    assert "not given" in said and "rollout/rollout.yaml" in said
    loop = tmp_path / "loop.yaml"
    loop.write_text("defaults:\n  - loop\nactor_rollout_ref:\n  actor:\n    strategy: megatron\n")
    with pytest.raises(MeshplanError) as err:
        api.import_file(str(loop))
    assert "reads more than 64 config files" in str(err.value)
