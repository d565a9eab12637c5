"""The schedule verifier catches broken schedules and shows the offending kernel."""

import pytest
from hand import Hand, t

from fireclay_loops import SchedulingError, lower, schedule
from fireclay_loops.verify import verify_schedule


def two_kernels():
    h = Hand()
    x = h.input("x", 4, 8)
    r = h.op("sum.dim_IntList", x, [1], out=t(4))
    f = h.op("flip.default", r, [0], out=t(4))
    return schedule(lower(h.program(h.op("add.Tensor", f, 1.0, out=t(4)))))


def test_a_valid_schedule_passes():
    verify_schedule(two_kernels())


def test_reordered_steps_are_caught():
    s = two_kernels()
    s.steps.reverse()
    with pytest.raises(SchedulingError, match="reads buf0 before any step writes it") as err:
        verify_schedule(s)
    assert "def kernel1(x0 < 4):" in str(err.value)


def test_a_buffer_hidden_in_a_kernel_but_read_elsewhere_is_caught():
    s = two_kernels()
    s.steps[0].internal.add("buf0")
    with pytest.raises(SchedulingError, match="lives only inside kernel0"):
        verify_schedule(s)


def test_live_buffers_sharing_memory_are_caught():
    s = two_kernels()
    s.plan.buffer_allocation["buf1"] = s.plan.buffer_allocation["buf0"]
    with pytest.raises(SchedulingError, match="share mem0 while both are live"):
        verify_schedule(s)


def test_loop_sizes_must_match_the_kernel():
    s = two_kernels()
    s.steps[0].xsizes[0] = s.steps[0].xsizes[0] + 1
    with pytest.raises(SchedulingError, match="runs to 4 but x0 runs to 5"):
        verify_schedule(s)
