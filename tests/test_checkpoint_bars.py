"""The committed checkpoints retrieve (issue 20's bars, kvlab.train.bars), checked fast: a few dozen seeded samples in
BF16 through a BF16 kvlab cache, an accuracy meeting its bar when its Wilson 95% interval reaches it. A checkpoint
that does not reach a bar at the CPU budget is listed in SHORT with what it does reach, which is checked instead, so
a regression fails here either way."""
import pytest
import torch

from kvlab.train import bars, checkpoint_dir
from trained import AWAITING_RETRAIN

ALL = ("copy_gain", "copy_accuracy", "heldout_loss", "niah", "second_task", "niah_every_decile")
# bars a checkpoint does not reach at the 2-core budget (training notes: docs/training-notes.md), with the floor its
# fast check must still clear: {bar: floor}
SHORT = {
    "qwen3-tiny": {},
    "deepseek-v3-tiny": {},
    "kvlab-v41-tiny": {},
}


@pytest.fixture(scope="module", params=[
    pytest.param(n, marks=pytest.mark.skip(reason=f"not on today's recipe yet: {AWAITING_RETRAIN[n]}"))
    if n in AWAITING_RETRAIN else n
    for n in SHORT])
def measured(request):
    torch.set_num_threads(1)
    return bars.check(str(checkpoint_dir(request.param)), samples=32, depth_samples=4, copy_strings=12, windows=4)


@pytest.mark.slow
def test_the_committed_checkpoints_meet_their_bars(measured):
    met = measured.meets()
    short = SHORT[measured.model]
    for bar in ALL:
        if bar not in short:
            assert met[bar], f"{measured.model} misses the {bar} bar: {measured.table()}"
    figures = dict(copy_gain=measured.copy_gain, copy_accuracy=measured.copy_accuracy,
                   niah=measured.interval(*measured.tasks[bars.NEEDLE])[1],
                   second_task=max(measured.interval(*measured.tasks[t])[1] for t in bars.SECOND),
                   niah_every_decile=min(measured.interval(*d)[1] for d in measured.depths))
    for bar, floor in short.items():
        assert figures[bar] >= floor, f"{measured.model} fell below what it reached on {bar}: {measured.table()}"


def test_bars_by_hand():
    """Check.meets on made-up figures: an accuracy meets its bar when its Wilson interval reaches it."""
    good = bars.Check("m", 1024, copy_gain=4.4, copy_accuracy=0.97, copy_bytes=1000, heldout_loss=1.1,
                      tasks={"niah": (29, 32), "recall": (31, 32)}, depths=[(3, 4)] * 10)
    assert all(good.meets().values())  # 29 / 32 = 0.906; 3 / 4 reaches 0.9 within its interval
    bad = bars.Check("m", 1024, copy_gain=2.6, copy_accuracy=0.71, copy_bytes=1000, heldout_loss=2.3,
                     tasks={"niah": (8, 32), "recall": (20, 32)}, depths=[(4, 4)] * 9 + [(0, 4)])
    assert not any(bad.meets().values())
    # 27 / 32 = 0.84 still meets 0.9: its interval [0.68, 0.93] reaches it (32 samples cannot tell them apart)
    assert bars.Check("m", 1024, 4.0, 0.9, 10, 2.0, {"recall": (27, 32)}).meets()["second_task"]
    assert good.table()["niah"].startswith("0.906 [")


def test_a_second_retrieval_task_is_any_of_them():
    """niah is required; of recall, MQAR and variable tracking one reaching the bar is enough, none is not."""
    make = lambda **t: bars.Check("m", 1024, 4.4, 0.97, 1000, 1.1, {"niah": (31, 32), **t}, [(4, 4)] * 10)  # noqa: E731
    assert make(recall=(20, 32), mqar=(32, 32), vartrack=(5, 32)).meets()["second_task"]
    assert not make(recall=(20, 32), mqar=(22, 32), vartrack=(5, 32)).meets()["second_task"]
    assert not make(niah=(20, 32), recall=(32, 32)).meets()["niah"]  # a second task does not stand in for niah
