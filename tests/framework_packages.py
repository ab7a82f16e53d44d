"""Real framework packages for the tests, fetched from the package registry inside the test run.

Two ways to use a framework without a GPU:
- `wheel_tree(dist, version)`: download the pinned wheel (no dependencies) and unpack it, to read
  its config dataclasses with `ast` or compose its packaged YAML;
- `venv_python(name, requirements)`: a throwaway virtual environment (Python 3.12 where the
  framework needs it) with the pinned packages installed, to run its own validators.

Both are cached under $MESHPLAN_TEST_CACHE (default ~/.cache/meshplan-tests) keyed by the exact
pins, so a second run costs nothing; a fresh CI machine builds them once. Nothing is installed
into the environment running the tests.

Two test runs may share a machine (and the cache): each entry is built under its own file lock
(`<entry>.lock` beside it, `fcntl.flock`, dropped by the kernel if the builder dies), an unpacked
wheel is filled in a temporary folder beside it and renamed into place whole, and a venv (whose
scripts name their own absolute path, so it cannot be moved) is built in place under the lock with
its `.complete` marker written last. An entry without its marker is never handed out.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PINS = {
    "megatron-core": "0.19.2",
    "megatron-bridge": "0.6.2",
    "verl": "0.9.1",
    "skyrl": "0.4.0",
    "skyrl-train": "0.3.1",
    "torchtitan": "0.3.0",
    "hydra-core": "1.3.2",
    "transformers": "5.9.0",
    "nemo-automodel": "0.7.0",
}

# torch 2.13.0 is the CPU wheel pip takes for Python 3.11 on these machines (any other torch is a multi-GB CUDA
# download); torchtitan 0.3.0 imports triton when it loads a model registry. Direct dependencies are pinned so
# pip does not backtrack (about 4 minutes to build once, then cached). Used by the torchtitan proof tests and by
# the FakeTensorMode activation-memory harness (bench/fake_tensor_memory.py).
TORCHTITAN_VENV = ["torch==2.13.0", f"torchtitan=={PINS['torchtitan']}", "triton==3.9.0", "datasets==4.7.0",
                   "einops==0.8.2", "pillow==13.0.0", "safetensors==0.8.0", "spmd_types==0.2.3",
                   "tensorboard==2.21.0", "tokenizers==0.23.3", "torch_checkpointing==0.1.1", "torchdata==0.11.0",
                   "tyro==1.0.17", "wandb==0.31.0"]
# Hugging Face transformers' model code, as verl's and SkyRL's FSDP engines run it: 5.9.0 is the release verl 0.9.1
# pins in its vllm/sglang/cpu extras (its core range is >=5.5.3,<5.11; SkyRL 0.4.0 takes >=5.6.1,<=5.16.1), on the
# same torch 2.13.0 CPU wheel. Used by the FakeTensorMode harness of HF model code (bench/fake_tensor_hf.py).
HF_VENV = ["torch==2.13.0", f"transformers=={PINS['transformers']}"]
# Hugging Face PEFT beside that transformers: the LoRA verl's and SkyRL's FSDP engines apply (get_peft_model with
# target_modules; 0.18.1 is the release SkyRL pins). Used by the LoRA count test (bench/peft_lora_count_harness.py).
PEFT_VENV = [*HF_VENV, "peft==0.18.1"]
# NeMo AutoModel 0.7.0 with its own dependencies (transformers 5.18.0, torchao, megatron-fsdp, quack-kernels ...) on the
# CPU torch wheel, to load a rendered recipe YAML with its own config loader (which imports every `_target_`). triton
# is held at 3.5.1: under triton 3.9 its LoRA kernel's @triton.autotune(key=[..., "S"]) fails at import
# (components/_peft/lora_kernel.py; newer triton refuses autotune keys that are not kernel arguments). About 3
# minutes and 3 GB to build once, then cached.
AUTOMODEL_VENV = ["torch==2.13.0", f"nemo-automodel=={PINS['nemo-automodel']}", "triton==3.5.1"]


def cache_root() -> Path:
    root = Path(os.environ.get("MESHPLAN_TEST_CACHE", Path.home() / ".cache" / "meshplan-tests"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-2000:]}\n"
                           f"{proc.stderr[-4000:]}")
    return proc


@contextmanager
def entry_lock(entry: Path) -> Iterator[None]:
    """Holds the exclusive lock of one cache entry (`<entry>.lock` beside it): a second run waits here while the
    first builds, then finds the entry whole. The kernel drops the lock if its holder dies."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.parent / f"{entry.name}.lock", "ab") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def cached_dir(entry: Path, fill: Callable[[Path], str]) -> Path:
    """`entry`, built once: `fill(staging)` fills a temporary folder beside it (returning the marker's text), which
    is renamed into place whole, so a reader sees the entry complete or not at all."""
    marker = entry / ".complete"
    if marker.exists():
        return entry
    with entry_lock(entry):
        if marker.exists():
            return entry
        for stale in entry.parent.glob(f".{entry.name}.staging-*"):  # left by a builder that died; none is live
            shutil.rmtree(stale, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.staging-", dir=entry.parent))
        try:
            (staging / ".complete").write_text(fill(staging))
            if entry.exists():  # an unfinished entry of an older cache layout
                shutil.rmtree(entry)
            staging.rename(entry)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return entry


def wheel_tree(dist: str, version: str | None = None, python_version: str = "3.12") -> Path:
    """The unpacked wheel of `dist==version` (pinned in PINS by default)."""
    version = version or PINS[dist]
    name = f"{dist}-{version}-py{python_version}"

    def fill(staging: Path) -> str:
        download = cache_root() / "downloads" / name  # one folder per entry: its lock covers the download too
        download.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
              "--python-version", python_version, "-d", str(download), f"{dist}=={version}"])
        wheels = sorted(download.glob("*.whl"))
        if not wheels:
            raise RuntimeError(f"pip download of {dist}=={version} produced no wheel in {download}")
        with zipfile.ZipFile(wheels[0]) as zf:
            zf.extractall(staging)
        return wheels[0].name

    return cached_dir(cache_root() / "wheels" / name, fill)


def python_executable(version: str) -> str:
    """A python of the given minor version: this interpreter if it matches, else pythonX.Y on PATH."""
    if f"{sys.version_info.major}.{sys.version_info.minor}" == version:
        return sys.executable
    exe = shutil.which(f"python{version}")
    if exe is None:
        raise RuntimeError(f"python{version} is needed to run this framework's own code and is not on PATH")
    return exe


def venv_python(name: str, requirements: list[str], python_version: str = "3.12") -> Path:
    """The python of a cached throwaway venv with `requirements` installed (built in place under the entry's lock,
    its marker written last: a venv's scripts hold its absolute path, so it is not built elsewhere and moved)."""
    digest = hashlib.sha256("\n".join([python_version, *requirements]).encode()).hexdigest()[:12]
    venv = cache_root() / "venvs" / f"{name}-{digest}"
    python = venv / "bin" / "python"
    marker = venv / ".complete"
    if marker.exists() and python.exists():
        return python
    with entry_lock(venv):
        if marker.exists() and python.exists():
            return python
        if venv.exists():  # half-built by a run that died
            shutil.rmtree(venv)
        _run([python_executable(python_version), "-m", "venv", str(venv)])
        if requirements:
            _run([str(python), "-m", "pip", "install", "-q", *requirements])
        marker.write_text("\n".join(requirements))
    return python


def peft_lora_count(ask: dict) -> dict:
    """bench/peft_lora_count_harness.py's answer for `ask` (a config.json, a rank, target/exclude modules), run in
    the PEFT venv: PEFT's and transformers' own count, the ground truth the LoRA tests hold meshplan to."""
    return harness_answer("peft_lora_count_harness.py", ask)


def harness_answer(harness: str, ask: dict) -> dict:
    """A bench/ harness's answer for `ask`, from its server in the PEFT venv (bench/harness_serve.py --serve): one per
    harness and test process (pytest-xdist worker), started at its first ask and closed when the process exits, so
    torch, transformers and PEFT are imported once, not once per ask."""
    return served_answer(Path(__file__).resolve().parents[1] / "bench" / harness, ask,
                         lambda: venv_python("peft", PEFT_VENV, python_version="3.11"))


def served_answer(script: Path, ask: Any, python: Callable[[], Path], cwd: str | None = None, key: str = "") -> Any:
    """`script`'s answer for `ask` from its server (bench/harness_serve.py --serve) in the venv `python()` builds: one
    server per script, `key` and test process (a key: asks that must not share a process, as FakeTensorMode steps
    over fake process groups of different worlds), started at its first ask (in `cwd`), closed when the process
    exits."""
    server = _server(script, python, cwd, key)
    server.stdin.write(json.dumps(ask) + "\n")
    server.stdin.flush()
    while True:
        ready, _, _ = select.select([server.stdout], [], [], 900)
        line = server.stdout.readline() if ready else ""
        if not line:  # ended, or silent for 900 s
            server.kill()
            _SERVERS.pop((script, key), None)
            raise RuntimeError(f"{script.name} stopped answering (ask {json.dumps(ask)[:300]}):\n{_stderr(server)}")
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
        if line.startswith("ERROR "):
            raise RuntimeError(f"{script.name} failed on {json.dumps(ask)[:300]}: {json.loads(line[6:])}")


_SERVERS: dict[tuple[Path, str], subprocess.Popen] = {}  # this process's harness and probe servers, by script, key


def _server(script: Path, python: Callable[[], Path], cwd: str | None, key: str) -> subprocess.Popen:
    server = _SERVERS.get((script, key))
    if server is not None and server.poll() is None:
        return server
    log = tempfile.TemporaryFile(mode="w+")
    server = subprocess.Popen([str(python()), str(script), "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=log, text=True, cwd=cwd)
    server.log = log  # type: ignore[attr-defined]
    _SERVERS[(script, key)] = server
    atexit.register(_close, server)
    return server


def _stderr(server: subprocess.Popen) -> str:
    log = server.log  # type: ignore[attr-defined]
    log.seek(0)
    return log.read()[-4000:]


def _close(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
