"""The fused GEMM's tile where chunks land during the launch (`ficco.kernels.fused_arrival`):
the model's list schedule, and the pick it makes from flags-set timings."""

import pytest

from ficco.kernels.configs import GemmConfig
from ficco.kernels.fused_arrival import arrival_ms, arrival_pick, just_in_time

# 512 x 8192 x 4096 as two chunks of 256 rows on 132 SMs (one H200's tuner timings, ms)
ROWS, N, K, SMS = 256, 8192, 4096, 132
WIDE = GemmConfig(128, 256, 64, group_m=4, num_stages=4, num_warps=8)  # 128 tiles: one wave
NARROW = GemmConfig(128, 128, 64, group_m=16, num_stages=5, num_warps=4)  # 256: two waves
WIDE_MS, NARROW_MS = 0.0505, 0.0586


def test_with_every_chunk_ready_the_model_gives_the_flags_set_time():
    for cfg, ms in ((WIDE, WIDE_MS), (NARROW, NARROW_MS)):
        assert arrival_ms(cfg, ms, ROWS, N, K, [0.0, 0.0], SMS) == pytest.approx(ms)


def test_a_late_chunk_of_a_one_wave_tile_starts_its_tiles_when_it_lands():
    # the second chunk's 64 tiles hold their programs until 0.03 ms, then take a whole wave
    assert arrival_ms(WIDE, WIDE_MS, ROWS, N, K, [0.0, 0.03], SMS) == pytest.approx(0.03 + WIDE_MS)
    # in two waves each chunk's tiles fill one: the late chunk's wave starts at 0.03
    assert arrival_ms(NARROW, NARROW_MS, ROWS, N, K, [0.0, 0.03], SMS) == pytest.approx(
        0.03 + NARROW_MS / 2
    )


def test_the_pick_trades_flags_set_speed_for_a_late_chunk_filling_the_programs():
    timings = {WIDE.name: WIDE_MS, NARROW.name: NARROW_MS}
    configs = {WIDE.name: WIDE, NARROW.name: NARROW}
    pick, modelled = arrival_pick(timings, configs, ROWS, N, K, 2, SMS)
    # just in time, the second chunk lands halfway through the fastest flags-set time
    assert just_in_time(WIDE_MS, 2) == [0.0, WIDE_MS / 2]
    assert modelled[WIDE.name]["just_in_time_ms"] == pytest.approx(WIDE_MS / 2 + WIDE_MS)
    assert modelled[NARROW.name]["just_in_time_ms"] == pytest.approx(NARROW_MS)
    assert modelled[WIDE.name]["ready_ms"] == pytest.approx(WIDE_MS)
    # regrets: WIDE 1.29 where the chunk lands just in time, NARROW 1.16 where it is ready
    assert modelled[WIDE.name]["regret"] == pytest.approx((WIDE_MS * 1.5) / NARROW_MS)
    assert modelled[NARROW.name]["regret"] == pytest.approx(NARROW_MS / WIDE_MS)
    assert pick == NARROW.name
    # a narrow tile that costs more with every flag set than it buys: the wide one stays
    slow = {WIDE.name: WIDE_MS, NARROW.name: 0.070}
    assert arrival_pick(slow, configs, ROWS, N, K, 2, SMS)[0] == WIDE.name
    # a name the configs do not know is passed over; none known is an error
    assert arrival_pick({**timings, "gone": 0.001}, configs, ROWS, N, K, 2, SMS)[0] == pick
    with pytest.raises(ValueError, match="no timed configuration"):
        arrival_pick({"gone": 0.001}, configs, ROWS, N, K, 2, SMS)


def test_a_group_of_every_chunk_waits_with_its_last_chunk():
    # grouped chunks interleave: half of the first wave's tiles belong to the late chunk
    grouped = GemmConfig(128, 128, 64, group_m=16, num_stages=5, num_warps=4, chunk_group=2)
    alone = arrival_ms(NARROW, NARROW_MS, ROWS, N, K, [0.0, 0.03], SMS)
    together = arrival_ms(grouped, NARROW_MS, ROWS, N, K, [0.0, 0.03], SMS)
    assert together > alone


def test_a_split_tail_is_modelled_as_its_k_ranges():
    # 200 rows in 64-row tiles: 4 row blocks x 16 = 64 tiles a chunk, 128 in all on 100
    # programs: 28 tail tiles split 3 ways (64 K steps). A tile of 0.5 ms: 1.0 ms whole,
    # 0.5 + 0.5 / 3 split
    split = GemmConfig(64, 256, 64, group_m=8, num_stages=4, num_warps=4, split_tail=True)
    split_ms = 0.5 + 0.5 / 3
    assert arrival_ms(split, split_ms, 200, 4096, 4096, [0.0, 0.0], 100) == pytest.approx(split_ms)
    # the second chunk lands at 0.5: its first 36 tiles (programs 64-99) end at 1.0; its 84
    # K ranges go to the first 64 programs, free at 0.5: two rounds of 1/6 ms, 0.833
    late = arrival_ms(split, split_ms, 200, 4096, 4096, [0.0, 0.5], 100)
    assert late == pytest.approx(1.0)


def test_ready_runs_wait_for_the_whole_chunk_group_and_deal_tiles_by_program():
    # NARROW: 256 tiles on 200 programs (two waves), so the default launch runs ready runs.
    # Grouped, a run's tiles wait for both chunks (`_wait_group`): every tile starts at 0.03,
    # two waves after it; claimed, the first chunk's tiles start at once and free their
    # programs after one wave (0.0293), before the late chunk lands: every tile of it
    # starts at 0.03, one wave before the end
    grouped = GemmConfig(128, 128, 64, group_m=16, num_stages=5, num_warps=4, chunk_group=2)
    runs = arrival_ms(grouped, NARROW_MS, ROWS, N, K, [0.0, 0.03], 200)
    claims = arrival_ms(grouped, NARROW_MS, ROWS, N, K, [0.0, 0.03], 200, ready_runs=False)
    assert runs == pytest.approx(0.03 + NARROW_MS)
    assert claims == pytest.approx(0.03 + NARROW_MS / 2)
    # chunk by chunk, tile i on program i mod 132: the first chunk's 128 tiles and the late
    # chunk's first 4 start on programs 0-131; programs 0-3 run 2 of the late chunk's tiles
    # after their first, 124 programs one each: as the claims' list schedule here
    assert arrival_ms(NARROW, NARROW_MS, ROWS, N, K, [0.0, 0.03], SMS) == pytest.approx(
        arrival_ms(NARROW, NARROW_MS, ROWS, N, K, [0.0, 0.03], SMS, ready_runs=False)
    )
    # one wave (128 tiles on 132 programs): claims, whatever is asked
    assert arrival_ms(WIDE, WIDE_MS, ROWS, N, K, [0.0, 0.03], SMS) == pytest.approx(0.03 + WIDE_MS)
