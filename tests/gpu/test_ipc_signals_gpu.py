"""The signal handshake of ranks that share a GPU (``ficco.execute.cuda_ipc``) on a real GPU,
in one process: two ranks' handles over the same pads, each rank's ops on its own stream
(stream memory waits and writes, as the ``cuda_shared`` backend issues them). A second signal
on a channel waits until the first is consumed, as symmetric memory's does; ranks that each
signal twice before they wait stall, and ``settle`` releases them and raises, naming the
channel, instead of waiting for ever. (The CPU model of the same rules: tests/test_cuda_ipc.py.)
"""

import pytest

torch = pytest.importorskip("torch")

from ficco.execute.cuda_ipc import (  # noqa: E402
    SIGNAL_CHANNELS,
    IpcHandle,
    SignalTimeout,
    settle,
)

pytestmark = pytest.mark.gpus(1, why="stream memory waits and writes on a GPU")


def two_ranks():
    pads = [torch.zeros(SIGNAL_CHANNELS * 2, dtype=torch.int32, device="cuda") for _ in range(2)]
    buffers = [torch.zeros(4, device="cuda") for _ in range(2)]
    handles = [IpcHandle(r, 2, buffers, pads) for r in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    torch.cuda.synchronize()
    return handles, streams


def test_signals_and_waits_meet_in_order():
    (h0, h1), (s0, s1) = two_ranks()
    with torch.cuda.stream(s1):  # the waits are queued first: they stall until signalled
        h1.wait_signal(0, channel=5)
        h1.wait_signal(0, channel=5)
    with torch.cuda.stream(s0):
        h0.put_signal(1, channel=5)
        h0.put_signal(1, channel=5)  # waits for the first's consumption
    settle([("y", h0), ("y@1", h1)], 10.0, 0, streams=(s0, s1))
    assert int(h1.flag_of("wait", 0, 5).item()) == 4  # two landed, two consumed


def test_a_second_signal_before_the_first_is_consumed_stalls_until_settle_names_it():
    (h0, h1), (s0, s1) = two_ranks()
    host = torch.empty(8, dtype=torch.int32, pin_memory=True)  # before anything stalls
    for rank, (h, s) in enumerate(((h0, s0), (h1, s1))):
        with torch.cuda.stream(s):  # each rank signals twice before it waits: a deadlock
            h.put_signal(1 - rank, channel=3)
            h.put_signal(1 - rank, channel=3)
            h.wait_signal(1 - rank, channel=3)
    with pytest.raises(SignalTimeout) as err:
        settle([("y", h0), ("y@1", h1)], 0.5, 0, streams=(s0, s1), host=host)
    text = str(err.value)
    assert "within 0.5 s" in text
    assert "y: signals to rank 1 on channel 3: 2 put, 1 landed, 0 consumed" in text
    assert "y@1: signals to rank 0 on channel 3: 2 put, 1 landed, 0 consumed" in text
    assert "stay stalled" not in text  # released: the streams drained
    assert s0.query() and s1.query()
