"""The executor a run's settings name: none (trials in this process) or Ray workers."""

from __future__ import annotations

from stitch_nas.search import RayExecutor
from stitch_nas.settings import SearchSettings

__all__ = ["executor_from_settings"]


def executor_from_settings(search: SearchSettings) -> RayExecutor | None:
    """The executor ``search.executor`` names (checked with the rest of the settings by
    :func:`~stitch_nas.pipeline.check_run`, which also asked whether Ray answers at
    ``search.ray_address``): None runs trials in this process."""
    if search.executor == "local":
        return None
    return RayExecutor(
        workers=search.workers,
        address=search.ray_address,
        cpus_per_worker=search.cpus_per_worker,
        gpus_per_worker=None if search.gpus_per_worker == -1 else search.gpus_per_worker,
        mode=search.ray_mode,
        connect_timeout_s=search.ray_connect_timeout_s,
    )
