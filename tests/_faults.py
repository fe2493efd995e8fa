"""Faults injected from the test side: slow, raising and dying trials, in and out of process.

``python -m tests._faults DELAY_S [stitch-nas arguments]`` runs the CLI with every trial made
``DELAY_S`` seconds slower (local trials and Ray workers alike), so a test has time to kill a
driver mid-trial. The library itself carries no test hooks.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from stitch_nas.search import RayExecutor, StitchObjective, TrialWorker

DELAY_ENV = "STITCH_NAS_TEST_DELAY_S"


def _delay() -> None:
    time.sleep(float(os.environ.get(DELAY_ENV, "0")))


class SlowWorker(TrialWorker):
    """A worker whose every trial first sleeps ``$STITCH_NAS_TEST_DELAY_S`` seconds."""

    def evaluate(self, number: int, plan: Any, *rest: Any) -> dict[str, Any]:
        _delay()
        return super().evaluate(number, plan, *rest)


class FaultyWorker(TrialWorker):
    """Dies (as the OOM killer would kill it) on trial 1 and raises on trial 2."""

    def evaluate(self, number: int, plan: Any, *rest: Any) -> dict[str, Any]:
        if number == 1:
            os._exit(17)
        if number == 2:
            raise RuntimeError(f"injected: trial {number} raises")
        return super().evaluate(number, plan, *rest)


class NoReferenceWorker(TrialWorker):
    """A worker whose measuring of a zoo model on its own raises."""

    def reference(self, name: str) -> dict[str, Any]:
        raise RuntimeError(f"injected: {name} cannot be measured")


class NoTrainingWorker(TrialWorker):
    """A worker in which training an SN-Net raises: what it measures was trained elsewhere."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        import stitch_nas.snnet._joint as joint

        def refuse(*_args: Any, **_kwargs: Any) -> Any:
            raise AssertionError("a worker trained the SN-Net")

        joint._train = refuse  # type: ignore[assignment]


def slow_cli(argv: list[str], delay_s: float) -> int:
    """Run ``stitch-nas argv`` with trials ``delay_s`` seconds slower."""
    from stitch_nas.cli import main
    from stitch_nas.pipeline import _executor

    os.environ[DELAY_ENV] = str(delay_s)  # read by Ray workers, which inherit the environment
    evaluate = StitchObjective.evaluate

    def slow_evaluate(self: StitchObjective, plan: Any) -> Any:
        _delay()
        return evaluate(self, plan)

    executor_from_settings = _executor.executor_from_settings

    def slow_executor(settings: Any) -> RayExecutor | None:
        executor = executor_from_settings(settings)
        if executor is not None:
            executor.worker_class = SlowWorker
        return executor

    StitchObjective.evaluate = slow_evaluate  # type: ignore[method-assign]
    _executor.executor_from_settings = slow_executor  # type: ignore[assignment]
    return main(argv)


if __name__ == "__main__":
    sys.exit(slow_cli(sys.argv[2:], float(sys.argv[1])))
