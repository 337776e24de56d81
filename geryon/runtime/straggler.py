"""A reproducible straggler: one worker made FACTOR times slower (`--straggler RANK:FACTOR`).

As Ripples does to study slow workers, the chosen worker sleeps after each optimizer step for
(FACTOR - 1) times the compute it just did (from the start of the forward to the end of the step),
so it computes about FACTOR times slower whatever the mode: allreduce, partial or ps. The sleep comes
before anything else hooked on the step (it is hooked first), as a slower GPU would.
"""

from __future__ import annotations

import time


def slow_down(model, optimizer, factor: float) -> None:
    """Hook `model` and `optimizer` so that each step is followed by a sleep of (factor - 1) x the
    time since the forward started."""
    started = {"at": None}

    def before_forward(_module, _args):
        if started["at"] is None:
            started["at"] = time.monotonic()

    def after_step(_optimizer, _args, _kwargs):
        if started["at"] is not None:
            time.sleep((factor - 1) * (time.monotonic() - started["at"]))
        started["at"] = None

    model.register_forward_pre_hook(before_forward)
    optimizer.register_step_post_hook(after_step)
