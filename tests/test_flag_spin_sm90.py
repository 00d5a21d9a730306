"""The flag waits' spins compiled for sm_90 (offline, no GPU: ``tests/compile_kernels_sm90.py
--flag-waits``) hold no CTA barrier. Each thread reads the flag and the clock itself and
leaves the spin on its own read, so a barrier inside (a scalar ``tl.atomic_cas`` hands its
result to the other threads between two) waits for warps that have gone: on one H200 a fused
launch whose programs gave up on a flag together hung so (profiles/h200/NOTES_gemm.md, call R)."""

from offline_sm90 import offline_compile


def test_no_cta_barrier_inside_a_flag_waits_spin():
    waits = offline_compile("compile_kernels_sm90.py", "--flag-waits")["flag_waits"]
    # the one-program wait kernel: a spin and nothing that needs a barrier
    assert waits["wait_flags"] == {"spin_barriers": 0, "barriers": 0}
    assert waits["fused_ready_runs"]["spin_barriers"] == 0  # None would mean no spin found
