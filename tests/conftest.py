import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
# nbval's tolerant comparison and the skip of trace-only notebook cells: kvlab.nb.nbval_plugin (pyproject addopts).


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one torch thread avoids thread contention on a shared 2-core machine (opt in per module)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def grad_mode_restored():
    """Every test leaves autograd as it found it (on): a leak would break training tests far from its cause."""
    yield
    if not torch.is_grad_enabled():
        torch.set_grad_enabled(True)
        pytest.fail("this test left torch's grad mode off (a no_grad context held across a yield?)")
