"""Defaults in one place: every module and the CLI read them from here. A backend's own
defaults (its rounds, timeout, dtype) are in its spec (``ficco.backends``)."""

from __future__ import annotations

#: The machine kind whose shipped table ``recommend`` reads when none is named.
DEFAULT_MACHINE = "h200x2"

#: Seconds a schedule may run (verification and timing) before it counts as hung.
TIMEOUT_S = 120.0

#: Interleaved timing rounds of a timed run (a backend's spec may set its own).
ROUNDS = 10
#: Rounds of the per-task signature runs.
SIGNATURE_ROUNDS = 3

#: Random inputs and the optuna sampler start from this seed.
SEED = 0

#: SMs per GPU of the machines ficco's tables are built for (H100 and H200 SXM: 132, as
#: measured on the 2xH200 machines). An SM reserve must leave the GEMM at least one of them.
SM_COUNT = 132

#: Most CPU ranks one ``--backend cpu`` run may spawn. Each rank is a full Python process
#: with torch loaded (about 0.26 GB resident, measured) running plans over gloo; the CPU path
#: checks plans for correctness, which 16 ranks cover (every ring and all-peers case, and
#: all-to-alls twice as wide as one 8-GPU host), while a few hundred exhaust a host's memory.
CPU_MAX_WORLD = 16
#: Memory one CPU rank is allowed for when a CPU world is checked against available memory.
CPU_RANK_MEMORY_GB = 0.5

#: Environment variable naming the user directory (tables, reports and exports written
#: where the user named no path); unset: ``$XDG_DATA_HOME/ficco``, else ``~/.local/share/ficco``.
USER_DIR_ENV = "FICCO_HOME"
#: Rounds of ``rounds="auto"``: at least this many, then more until the median's confidence
#: interval is narrow enough, at most ``AUTO_MAX_ROUNDS``.
AUTO_MIN_ROUNDS = 5
AUTO_MAX_ROUNDS = 50
#: ``rounds="auto"`` stops adding rounds for a candidate once the half-width of its median's
#: confidence interval is at most this fraction of the median.
AUTO_TARGET_REL_CI = 0.02
#: Confidence level of that interval.
AUTO_CONFIDENCE = 0.95
#: Untimed runs of each candidate before the timed rounds.
WARMUP = 3
#: Seconds a freshly started rank pool may take before its first report (CUDA, NCCL and
#: symmetric-memory set-up).
STARTUP_S = 180.0

#: Message tags of two-sided transfers (gloo, NCCL point-to-point), laid out in
#: ``ficco.plan.tags``: a plan's transfer (step, chunk) gets ``step * TAG_CHUNK_SLOTS + chunk``;
#: plans run one after another in a rank pool are ``TAG_STEP_SLOTS * TAG_CHUNK_SLOTS + 1`` tags
#: apart (the last slot is the plan's collectives), within 31 bits. Steps: a plan takes up to
#: 2W - 1 of them (gemm_ar's reduce-scatter steps, then its all-gather's), so 128 covers the
#: 64-GPU machines the cost model describes; 4096 chunks; 4096 runs before the offsets wrap.
TAG_CHUNK_SLOTS = 1 << 12
TAG_STEP_SLOTS = 1 << 7

#: Flag slots per rank for fused schedules (``ficco.plan.fused``): one int32 per (source rank,
#: chunk) on the rank that waits, so world x chunks must fit.
FLAG_SLOTS = 1 << 12
#: Seconds a fused GEMM's tile (or an owner's reduction) waits on one chunk's flag before it
#: gives up with a FlagTimeout: well under TIMEOUT_S, so the schedule is recorded ``timeout``
#: by its own error, not by the supervisor killing the ranks.
FLAG_TIMEOUT_S = 30.0
