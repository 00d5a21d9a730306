"""Per-shape GEMM autotuning with a persistent on-disk cache.

`tune(m, n, k, dtype, sm_budget, device)` checks every configuration that `candidate_configs`
keeps for the shape against `torch.matmul` (random inputs, never zeros; a configuration that
computes a wrong result is never chosen), times the correct ones together in interleaved
rounds (`ficco.execute.timing.LaunchTimer`: L2 flushed before every launch, host launch cost
kept out of the events) and returns the fastest. do_bench, the timer before, times launches
back to back from an idle queue: on an H100 a Triton launch's ~130 us of host time sat in
every microsecond kernel's events and ranked configs by noise (1024x3072x4096 picked a
64x128 tile at 0.67x cuBLAS where 128x256 ran at 0.83x on an H200).

The cache is one JSON file, `$FICCO_CACHE_DIR/gemm_tuning.json` (default
`~/.cache/ficco/gemm_tuning.json`):

    {"format": 1, "entries": {"<key>": {"config": {...}, "ms": ..., "timings_ms": {...}, ...}}}

keyed by device name, Triton version, dtype, M, N, K and SM budget (`TuningKey`). Writes go to
a temporary file in the same folder, then `os.replace` (atomic on POSIX), after re-reading and
merging the file so that concurrent ranks lose no one else's entries. A file that does not
parse, or an entry that does not describe a valid config, is reported with a warning and
ignored: a cache must never stop a run.

Measured caches travel inside the package, one folder per card
(`schedules/<card>/gemm_tuning.json`, FP8's `fp8_gemm_tuning.json`: `ficco.shipped`), in the
same format and keys: `shipped_entries` reads them, and a lookup takes a shipped entry where
the user's cache has none (before tuning). The key names the device and Triton version, so
only a card's own entries, measured with this Triton, ever apply.

Tuning cost on an H200 (scripts/bench_gemm.py, profiles/h200/NOTES_gemm.md): compiling is
~1 s per configuration, once per process (shapes share compiled kernels: M, N, K are runtime
values); after that a shape tunes in ~1-3 s over its 18-36 candidates (do_bench, 30 ms each).
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

from ficco.kernels.configs import GemmConfig, candidate_configs, heuristic_config
from ficco.kernels.persistent import (
    INTERPRETER,
    default_sm_budget,
    device_info,
    launch,
    select_path,
)
from ficco.kernels.trials import (
    CHECK_TOLERANCE,
    RoundsTimer,
    Timer,
    check_then_time,
    tuning_record,
)
from ficco.shipped import shipped_dir

CACHE_DIR_ENV = "FICCO_CACHE_DIR"
AUTOTUNE_ENV = "FICCO_GEMM_AUTOTUNE"
CACHE_FILENAME = "gemm_tuning.json"
CACHE_FORMAT = 1
#: Where the measured caches ship: `<card>/<cache file>` under the package's schedules.
SHIPPED_TUNING = shipped_dir("schedules")

# do_bench arguments are milliseconds of warm-up and of timed repeats.
TUNE_WARMUP_MS = 5
TUNE_REP_MS = 30


def cache_path() -> Path:
    """The tuning cache file: `$FICCO_CACHE_DIR/gemm_tuning.json`, default under ~/.cache/ficco."""
    root = os.environ.get(CACHE_DIR_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "ficco")
    return Path(root) / CACHE_FILENAME


def device_name(device: torch.device | str) -> str:
    return device_info(torch.device(device)).name


@dataclass(frozen=True)
class TuningKey:
    """What a tuned configuration is valid for."""

    device_name: str
    triton_version: str
    dtype: str
    m: int
    n: int
    k: int
    sm_budget: int

    def __str__(self) -> str:
        return (
            f"{self.device_name}|triton={self.triton_version}|{self.dtype}"
            f"|m={self.m},n={self.n},k={self.k}|sm={self.sm_budget}"
        )

    @classmethod
    def for_problem(
        cls, m: int, n: int, k: int, dtype: torch.dtype, sm_budget: int, device: torch.device
    ) -> TuningKey:
        return cls(
            device_name(device),
            triton.__version__,
            str(dtype).removeprefix("torch."),
            int(m),
            int(n),
            int(k),
            int(sm_budget),
        )


# ---------------------------------------------------------------------------------------------
# The cache file


def _read_entries(path: Path) -> dict[str, dict]:
    """The file's entries; a missing file is empty, a corrupt one is reported and ignored."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        warnings.warn(f"ignoring unreadable GEMM tuning cache {path}: {exc}", stacklevel=3)
        return {}
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
            raise ValueError(f"expected an object with format {CACHE_FORMAT}")
        entries = data["entries"]
        if not isinstance(entries, dict):
            raise ValueError("'entries' must be an object")
    except (ValueError, KeyError) as exc:
        warnings.warn(f"ignoring corrupt GEMM tuning cache {path}: {exc}", stacklevel=3)
        return {}
    return entries


def _write_entries(path: Path, entries: dict[str, dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"format": CACHE_FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# In-process layer: path -> key -> config, so a hot loop never touches the file system.
_memory: dict[Path, dict[str, GemmConfig]] = {}
# matmul's hot path: (cache dir setting, m, n, k, dtype, budget, device) -> config, so a call
# whose shape was seen before builds no key and touches no file.
_fast: dict[tuple, GemmConfig] = {}


def _config_of(key: str, entry: object, path: Path) -> GemmConfig | None:
    try:
        if not isinstance(entry, dict):
            raise ValueError("entry must be an object")
        return GemmConfig.from_dict(entry["config"])
    except (KeyError, ValueError) as exc:
        warnings.warn(
            f"ignoring bad entry {key!r} in GEMM tuning cache {path}: {exc}", stacklevel=4
        )
        return None


def cached_config(key: TuningKey) -> GemmConfig | None:
    """The cached configuration for `key`, or None."""
    path = cache_path()
    table = _memory.get(path)
    if table is None:
        table = {}
        for k, entry in _read_entries(path).items():
            cfg = _config_of(k, entry, path)
            if cfg is not None:
                table[k] = cfg
        _memory[path] = table
    return table.get(str(key))


def cache_entry(key: TuningKey) -> dict | None:
    """The full cached record for `key` (timings of every candidate, failures, when), or None."""
    entry = _read_entries(cache_path()).get(str(key))
    return entry if isinstance(entry, dict) else None


def store(key: TuningKey, entry: dict) -> None:
    """Record a tuning result: merge into the file (atomic replace) and the in-process layer."""
    GemmConfig.from_dict(entry["config"])  # refuse to write what could not be read back
    path = cache_path()
    entries = _read_entries(path)
    entries[str(key)] = entry
    _write_entries(path, entries)
    _memory.setdefault(path, {})[str(key)] = GemmConfig.from_dict(entry["config"])
    _fast.clear()


@functools.cache
def shipped_entries(filename: str) -> dict[str, GemmConfig]:
    """Tuning key -> configuration, from every shipped `SHIPPED_TUNING/<card>/<filename>`
    (read once per process)."""
    found: dict[str, GemmConfig] = {}
    for path in sorted(SHIPPED_TUNING.glob(f"*/{filename}")):
        for k, entry in _read_entries(path).items():
            cfg = _config_of(k, entry, path)
            if cfg is not None:
                found[k] = cfg
    return found


def known_config(key: TuningKey, shipped_file: str = CACHE_FILENAME) -> GemmConfig | None:
    """The user's cached configuration for `key` (a `TuningKey` or a key whose text extends
    one), else the shipped one from `shipped_file`, else None."""
    hit = cached_config(key)
    return hit if hit is not None else shipped_entries(shipped_file).get(str(key))


def clear_memory() -> None:
    """Forget the in-process layers (the next lookup re-reads the files)."""
    _memory.clear()
    _fast.clear()
    shipped_entries.cache_clear()


# ---------------------------------------------------------------------------------------------
# Tuning


def do_bench_timer(fn: Callable[[], object]) -> float:
    """Median milliseconds from `triton.testing.do_bench` (CUDA events, L2 flushed per run)."""
    return triton.testing.do_bench(fn, warmup=TUNE_WARMUP_MS, rep=TUNE_REP_MS, return_mode="median")


def launch_timer() -> RoundsTimer:
    """The tuners' default on CUDA: this device's `LaunchTimer` (interleaved rounds)."""
    from ficco.execute.timing import launch_timer as device_launch_timer

    return device_launch_timer()


def wall_clock_timer(fn: Callable[[], object], repeats: int = 3) -> float:
    """Median host milliseconds: only for the CPU interpreter, where nothing is asynchronous."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def tune(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype = torch.bfloat16,
    sm_budget: int | None = None,
    device: torch.device | str | None = None,
    *,
    configs: Sequence[GemmConfig] | None = None,
    timer: Timer | RoundsTimer | None = None,
    read_cache: bool = True,
    write_cache: bool = True,
) -> GemmConfig:
    """The fastest correct configuration for `[m, k] @ [k, n]` in `dtype` at `sm_budget`.

    Returns the cached answer when there is one (and `read_cache`); otherwise times
    `configs` (default: `candidate_configs` for the shape) with `timer` (default: `launch_timer`
    on CUDA, host wall clock under the CPU interpreter) on contiguous random inputs,
    and records the result in the cache (when `write_cache`). `read_cache=False` re-tunes.
    Only the user's cache answers here, never a shipped entry: a tuner measures this machine.
    """
    if min(m, n, k) < 1:
        raise ValueError(f"m, n, k must be positive, got {(m, n, k)}")
    if dtype not in CHECK_TOLERANCE:
        raise ValueError(f"dtype must be one of bfloat16, float16, float32, got {dtype}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type != "cuda" and not INTERPRETER:
        raise ValueError(f"device must be CUDA (or CPU with TRITON_INTERPRET=1), got {device}")
    budget = default_sm_budget(device) if sm_budget is None else int(sm_budget)
    if budget < 1:
        raise ValueError(f"sm_budget must be a positive int, got {sm_budget}")
    key = TuningKey.for_problem(m, n, k, dtype, budget, device)
    if read_cache:
        hit = cached_config(key)
        if hit is not None:
            return hit

    elem = torch.empty((), dtype=dtype).element_size()
    if configs is None:
        configs = candidate_configs(
            m,
            n,
            k,
            elem,
            elem,
            sm_budget=budget,
            interpreter=device.type != "cuda",
            shared_memory_bytes=device_info(device).shared_memory_bytes,
        )
    if timer is None:
        timer = launch_timer() if device.type == "cuda" else wall_clock_timer

    t_start = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(m * 1_000_003 + n * 1_009 + k)
    a = torch.randn((m, k), device=device, dtype=torch.float32, generator=gen).to(dtype)
    b = torch.randn((k, n), device=device, dtype=torch.float32, generator=gen).to(dtype)
    out = torch.empty((m, n), device=device, dtype=dtype)
    ref = torch.matmul(a, b)
    path = select_path(a, b, out)

    def build(cfg: GemmConfig) -> Callable[[], object]:
        return lambda: launch(a, b, out, accumulate=False, sm_budget=budget, config=cfg, path=path)

    trials = check_then_time(configs, build, out, ref, timer, lambda: _sync(device))
    if not trials.timings_ms:
        raise RuntimeError(f"no GEMM configuration ran correctly for {key}: {trials.failures}")
    best = trials.configs[trials.best()]
    entry = tuning_record(trials, m, n, k, "decode" if best.decode else path, t_start)
    if write_cache:
        store(key, entry)
    return best


def device_of(device) -> torch.device:
    """``device`` as a ``torch.device`` with its index (a bare 'cuda': the current one)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def resolve_config(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype,
    sm_budget: int,
    device,
    *,
    shipped_file: str,
    heuristic: Callable[[bool], GemmConfig],
    tune_now: Callable[[torch.device], GemmConfig],
) -> GemmConfig:
    """The one lookup every Triton GEMM's configuration goes through: a shape seen before in
    this process reads nothing; else the user's cache, else the shipped ``shipped_file``
    (`known_config`), else ``tune_now(device)`` (unless FICCO_GEMM_AUTOTUNE=0, which takes
    ``heuristic(interpreter)``, the untuned configuration, and remembers nothing)."""
    fast_key = (shipped_file, os.environ.get(CACHE_DIR_ENV), m, n, k, dtype, sm_budget, device)
    hit = _fast.get(fast_key)
    if hit is not None:
        return hit
    device = device_of(device)
    key = TuningKey.for_problem(m, n, k, dtype, sm_budget, device)
    hit = known_config(key, shipped_file)
    if hit is None:
        if os.environ.get(AUTOTUNE_ENV, "1") == "0":
            return heuristic(device.type != "cuda")
        hit = tune_now(device)
    _fast[fast_key] = hit
    return hit


def config_for(
    m: int, n: int, k: int, dtype: torch.dtype, sm_budget: int, device: torch.device
) -> GemmConfig:
    """The configuration `matmul` uses (`resolve_config` over the bf16/fp16/fp32 tuning)."""
    return resolve_config(
        m,
        n,
        k,
        dtype,
        sm_budget,
        device,
        shipped_file=CACHE_FILENAME,
        heuristic=lambda interpreter: heuristic_config(m, n, k, interpreter=interpreter),
        tune_now=lambda dev: tune(m, n, k, dtype, sm_budget, dev),
    )
