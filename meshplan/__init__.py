"""meshplan: plans the device mesh of an LLM training job and proves the answer with numbers."""

__version__ = "0.1.0"
