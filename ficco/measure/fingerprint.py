"""Environment fingerprint recorded with every measurement: which machine and software."""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ficco.backends import BackendSpec

#: Fields that identify a machine + software stack; a profile store refuses records whose
#: identity differs from its header. Dates and commits vary run to run and are kept aside.
IDENTITY_FIELDS = (
    "backend",
    "gpu",
    "gpu_count",
    "sm_count",
    "driver",
    "cuda",
    "torch",
    "triton",
    "nccl",
)


def git_commit(path: str | Path | None = None) -> str:
    """The checkout's commit; ``$FICCO_GIT_COMMIT`` where the tree travels without ``.git``
    (a copy sent to a GPU machine)."""
    if os.environ.get("FICCO_GIT_COMMIT"):
        return os.environ["FICCO_GIT_COMMIT"]
    cwd = path or Path(__file__).resolve().parent

    def git(*args: str) -> str:
        run = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5)
        return run.stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return f"{commit}{'-dirty' if dirty else ''}" if commit else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def source_digest(root: str | Path | None = None) -> str:
    """12 hex digits of SHA-256 over the ficco package's Python sources (paths and bytes):
    names the code that measured, also where a copied tree's git metadata is stale."""
    import hashlib

    base = Path(root) if root else Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(base.rglob("*.py")):
        digest.update(path.relative_to(base).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def fingerprint(backend: BackendSpec | str = "cuda") -> dict[str, Any]:
    """Describe this machine as ``backend`` (``ficco.backends``: a spec, or its name) uses it:
    its GPUs where the backend's ranks compute on CUDA devices. Imports torch (and Triton if
    installed) lazily."""
    import torch

    from ficco.backends import backend_spec
    from ficco.version import __version__

    spec = backend_spec(backend)
    info: dict[str, Any] = {
        "backend": spec.name,
        "gpu": None,
        "gpu_count": 0,
        "sm_count": None,
        "driver": None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": None,
        "nccl": None,
        "python": platform.python_version(),
        "host_cpu": platform.processor() or platform.machine(),
        "ficco": __version__,
        "git_commit": git_commit(),
        "source": source_digest(),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        pass
    if spec.device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name,
            gpu_count=torch.cuda.device_count(),
            sm_count=props.multi_processor_count,
        )
        with contextlib.suppress(Exception):  # some builds have no NCCL
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
            )
            info["driver"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
        except (OSError, subprocess.SubprocessError):
            pass
    return info


def identity(fp: dict[str, Any]) -> dict[str, Any]:
    return {k: fp.get(k) for k in IDENTITY_FIELDS}


def fingerprint_id(fp: dict[str, Any]) -> str:
    """Short stable hash of the identity fields."""
    blob = json.dumps(identity(fp), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]
