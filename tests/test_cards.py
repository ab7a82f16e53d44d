"""Cards load through their schemas, and a malformed card names the file, the key and the problem."""

import pytest

from meshplan.cards import CardError, ModelCard, card_names, framework_card, validate_card
from meshplan.errors import MeshplanError
from meshplan.hardware import get_gpu, gpu_catalog


def test_every_model_and_framework_card_loads():
    from meshplan.models import catalog_architecture, catalog_keys

    for key in catalog_keys():
        catalog_architecture(key)
    for name in [n.split("/")[1] for n in card_names() if n.startswith("frameworks/")]:
        framework_card(name)


def test_malformed_card_error_names_file_and_key():
    with pytest.raises(CardError) as exc:
        validate_card("models/broken", {"key": "x", "name": "x", "family": "dense", "config": {},
                                         "published": {"text": "t", "source": "s", "total": "lots"},
                                         "sources": []}, ModelCard)
    message = str(exc.value)
    assert "cards/models/broken.yaml" in message and "published.total" in message


def test_hardware_catalog_covers_the_required_parts():
    keys = set(gpu_catalog())
    assert {"a100-40gb", "a100-80gb", "h100", "h100-pcie", "h200", "h800", "h20", "b200", "gb200", "mi300x"} <= keys
    h100 = get_gpu("H100")
    assert h100.name.startswith("NVIDIA H100 SXM") and h100.nvlink_domain == 8
    assert get_gpu("gb200").nvlink_domain == 72
    for gpu in gpu_catalog().values():
        assert gpu.sources, gpu.key


def test_unknown_gpu_suggests():
    with pytest.raises(MeshplanError, match="h100"):
        get_gpu("h1000")
