"""Integration tests run from the repository root's checkout: make `import benchmarks` work."""

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

# On a GPU the fireclay backend answers first calls in its interpreter while kernels compile in
# the background: these tests compare single calls with eager, so they compile first and check
# the kernels (the background path has its own tests in packages/fireclay/tests).
os.environ.setdefault("FIRECLAY_BACKGROUND_COMPILE", "0")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")


def pytest_sessionstart(session):
    # Convolutions on CUDA run channels-last in compiled programs (fireclay-loops' layout choice,
    # as Inductor's layout optimisation does); under torch's default `cudnn.allow_tf32 = True`
    # cuDNN then picks TF32 kernels where eager's NCHW calls often do not, which moves float32
    # gradients of a BatchNorm network by up to 5e-2 relative at the small sizes used here.
    # That is cuDNN's precision choice, not the compiler's: check the compiled code in float32.
    import torch

    torch.backends.cudnn.allow_tf32 = False
