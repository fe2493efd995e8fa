"""Activation cache: hits, keys, the memory budget, spilling, corruption and weight fingerprints."""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from stitch_nas import errors
from stitch_nas.activations import (
    ActivationCache,
    ActivationKey,
    cache_budgets,
    weights_fingerprint,
)

MB = 2**20
KEY = ActivationKey(
    model="resnet", weights="w0", cut="layer1", split="probe", data="d0", preprocess="spec0"
)


def _key(i: int) -> ActivationKey:
    return dataclasses.replace(KEY, cut=f"layer{i}")


class Counter:
    """A compute function that counts its calls and returns a fixed ~1 MiB tensor per seed."""

    def __init__(self, seed: int = 0, numel: int = MB // 4) -> None:
        self.calls = 0
        self.value = torch.randn(numel, generator=torch.Generator().manual_seed(seed))

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        return self.value.clone()


def test_hit_returns_the_identical_tensor_without_recomputing():
    cache = ActivationCache(memory_gb=0.01)
    compute = Counter()
    first = cache.get_or_compute(KEY, compute)
    second = cache.get_or_compute(KEY, compute)
    assert second is first
    assert compute.calls == 1
    assert KEY in cache
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["entries_in_memory"]) == (1, 1, 1)
    assert cache.memory_bytes == stats["bytes_in_memory"] == MB


@pytest.mark.parametrize("field", ["model", "weights", "cut", "split", "data", "preprocess"])
def test_any_changed_field_changes_the_digest_and_recomputes(field):
    other = dataclasses.replace(KEY, **{field: "changed"})
    assert other.digest() != KEY.digest()
    assert len(KEY.digest()) == 32 and KEY.digest() == dataclasses.replace(KEY).digest()
    cache = ActivationCache(memory_gb=0.01)
    compute = Counter()
    cache.get_or_compute(KEY, compute)
    cache.get_or_compute(other, compute)
    assert compute.calls == 2


def test_cut_none_differs_from_the_string_none():
    assert (
        dataclasses.replace(KEY, cut=None).digest() != dataclasses.replace(KEY, cut="None").digest()
    )


def test_budget_is_respected_and_evicted_entries_come_back_from_disk(tmp_path):
    cache = ActivationCache(memory_gb=2.5 * MB / 2**30, spill_dir=tmp_path)
    computes = [Counter(seed=i) for i in range(3)]
    for _ in range(3):
        for i, compute in enumerate(computes):
            value = cache.get_or_compute(_key(i), compute)
            assert torch.equal(value, compute.value)
            assert cache.memory_bytes <= cache.budget_bytes
    assert [c.calls for c in computes] == [1, 1, 1]
    stats = cache.stats()
    assert stats["disk_hits"] == 6 and stats["misses"] == 3
    assert stats["evictions"] >= 3 and stats["entries_in_memory"] == 2
    assert stats["spilled_files"] == 3
    assert len(list(tmp_path.glob("*.npy"))) == 3 and len(list(tmp_path.glob("*.json"))) == 3
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary files left behind


def test_spilled_entries_are_shared_with_another_cache(tmp_path):
    writer = ActivationCache(memory_gb=0.01, spill_dir=tmp_path)
    compute = Counter()
    writer.get_or_compute(KEY, compute)
    writer.clear_memory(spill=True)
    assert writer.memory_bytes == 0 and KEY in writer
    reader = ActivationCache(memory_gb=0.01, spill_dir=tmp_path)
    value = reader.get_or_compute(KEY, compute)
    assert compute.calls == 1 and torch.equal(value, compute.value)
    value.add_(1.0)  # a copy out of the memory map: writable, and the file is untouched
    fresh = ActivationCache(spill_dir=tmp_path).get_or_compute(KEY, compute)
    assert compute.calls == 1 and torch.equal(fresh, compute.value)


def test_concurrent_writers_of_one_key_share_a_spill_dir_safely(tmp_path, caplog):
    compute = Counter()
    results: list[torch.Tensor] = []

    def worker() -> None:
        cache = ActivationCache(memory_gb=0, spill_dir=tmp_path)  # every call goes to disk
        results.extend(cache.get_or_compute(KEY, compute) for _ in range(5))

    with caplog.at_level(logging.WARNING, logger="stitch_nas.activations"):
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(results) == 20 and all(torch.equal(r, compute.value) for r in results)
    assert not caplog.records and not list(tmp_path.glob(".*.tmp"))
    assert len(list(tmp_path.glob("*.npy"))) == 1


SPILL_ROUNDS = 20


def _spill_every_round(folder: Path, value: float, barrier: Any) -> None:
    """One process of the test below: spill each round's key as soon as the other one does,
    whole (an evicted tensor) in even rounds, streamed (a memory-mapped writer) in odd ones."""
    cache = ActivationCache(memory_gb=0, spill_dir=folder)
    for i in range(SPILL_ROUNDS):
        tensor = torch.full((64, 256), value, dtype=torch.float16)
        barrier.wait()
        if i % 2 == 0:
            cache.get_or_compute(_key(i), lambda t=tensor: t)  # over the budget: spilled whole
        else:
            writer = cache.spill_writer(_key(i), tuple(tensor.shape), tensor.dtype)
            if writer is not None:  # None: the other process's pair is there already
                writer.write(0, tensor.numpy())
                cache.commit_spill(writer)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork")
def test_two_processes_spilling_one_key_at_once_leave_one_valid_pair(tmp_path, caplog):
    # their bytes differ, as a GPU worker's and a CPU worker's last bits may: a later writer
    # must not swap its .npy in under the sidecar the first one wrote
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(2)
    processes = [
        context.Process(target=_spill_every_round, args=(tmp_path, value, barrier))
        for value in (1.0, 2.0)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    assert [p.exitcode for p in processes] == [0, 0]
    reader = ActivationCache(memory_gb=0, spill_dir=tmp_path)
    with caplog.at_level(logging.WARNING, logger="stitch_nas.activations"):
        for i in range(SPILL_ROUNDS):
            value = reader.get_or_compute(_key(i), Counter())  # Counter: a wrong value
            assert value.unique().tolist() in ([1.0], [2.0]), i  # one writer's bytes, whole
    assert reader.stats()["disk_hits"] == SPILL_ROUNDS and not caplog.records
    assert len(list(tmp_path.glob("*.npy"))) == len(list(tmp_path.glob("*.json"))) == SPILL_ROUNDS
    assert not list(tmp_path.glob(".*.tmp"))


def test_tensor_larger_than_the_budget_is_returned_and_spilled(tmp_path):
    cache = ActivationCache(memory_gb=0.5 * MB / 2**30, spill_dir=tmp_path)
    compute = Counter()
    value = cache.get_or_compute(KEY, compute)
    assert torch.equal(value, compute.value)
    assert cache.memory_bytes == 0 and cache.stats()["entries_in_memory"] == 0
    again = cache.get_or_compute(KEY, compute)
    assert compute.calls == 1 and torch.equal(again, compute.value)
    assert cache.stats()["disk_hits"] == 1


def test_zero_budget_without_spill_dir_always_recomputes():
    cache = ActivationCache(memory_gb=0)
    compute = Counter()
    for _ in range(2):
        assert torch.equal(cache.get_or_compute(KEY, compute), compute.value)
    assert compute.calls == 2 and KEY not in cache


def test_eviction_without_spill_dir_recomputes():
    cache = ActivationCache(memory_gb=1.5 * MB / 2**30)
    computes = [Counter(seed=i) for i in range(2)]
    cache.get_or_compute(_key(0), computes[0])
    cache.get_or_compute(_key(1), computes[1])  # evicts key 0
    assert _key(0) not in cache and _key(1) in cache
    assert torch.equal(cache.get_or_compute(_key(0), computes[0]), computes[0].value)
    assert [c.calls for c in computes] == [2, 1]
    assert cache.stats()["evictions"] == 2 and cache.stats()["disk_hits"] == 0


def test_least_recently_used_entry_is_evicted_first():
    cache = ActivationCache(memory_gb=2.5 * MB / 2**30)
    computes = [Counter(seed=i) for i in range(3)]
    cache.get_or_compute(_key(0), computes[0])
    cache.get_or_compute(_key(1), computes[1])
    cache.get_or_compute(_key(0), computes[0])  # key 0 is now the most recently used
    cache.get_or_compute(_key(2), computes[2])
    assert _key(0) in cache and _key(1) not in cache and _key(2) in cache


def _spill_one(tmp_path: Path) -> tuple[ActivationCache, Counter, Path]:
    cache = ActivationCache(memory_gb=0.01, spill_dir=tmp_path)
    compute = Counter()
    cache.get_or_compute(KEY, compute)
    cache.clear_memory(spill=True)
    return cache, compute, tmp_path / f"{KEY.digest()}.npy"


@pytest.mark.parametrize("damage", ["truncate", "flip", "sidecar"])
def test_corrupt_spill_file_is_detected_deleted_and_recomputed(tmp_path, caplog, damage):
    cache, compute, path = _spill_one(tmp_path)
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":
        raw[-100] ^= 0xFF  # inside the data: shape, dtype and size still match
        path.write_bytes(raw)
    else:
        path.with_suffix(".json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="stitch_nas.activations"):
        value = cache.get_or_compute(KEY, compute)
    assert torch.equal(value, compute.value)
    assert compute.calls == 2 and cache.stats()["disk_hits"] == 0
    assert any("corrupt" in r.getMessage() for r in caplog.records)
    assert not path.exists()


def test_spill_files_hold_no_pickle_and_a_matching_sidecar(tmp_path):
    _, compute, path = _spill_one(tmp_path)
    array = np.load(path, allow_pickle=False)
    assert array.dtype == np.float32 and np.array_equal(array, compute.value.numpy())
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["shape"] == [MB // 4] and meta["key"] == dataclasses.asdict(KEY)
    assert meta["size"] == path.stat().st_size


def test_other_dtypes_round_trip_through_disk(tmp_path):
    cache = ActivationCache(memory_gb=0, spill_dir=tmp_path)
    value = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    cache.get_or_compute(KEY, lambda: value)
    back = cache.get_or_compute(KEY, lambda: pytest.fail("recomputed"))
    assert back.dtype == torch.int64 and torch.equal(back, value)


def test_bad_arguments_raise_library_errors(tmp_path):
    with pytest.raises(errors.ConfigError, match="memory_gb"):
        ActivationCache(memory_gb=-1)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(errors.CacheError, match="spill_dir"):
        ActivationCache(spill_dir=blocker / "sub")
    with pytest.raises(TypeError, match="torch.Tensor"):
        ActivationCache().get_or_compute(KEY, lambda: [1.0])


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Linear(8, 4))


def test_weights_fingerprint_tracks_weights_and_buffers():
    net = _net()
    base = weights_fingerprint(net)
    assert base == weights_fingerprint(net) == weights_fingerprint(_net())
    assert len(base) == 64
    with torch.no_grad():
        net[0].weight[0, 0, 0, 0] += 1e-3
    changed_weight = weights_fingerprint(net)
    assert changed_weight != base
    with torch.no_grad():
        net[1].running_mean[3] = 0.5
    assert weights_fingerprint(net) not in (base, changed_weight)


def test_weights_fingerprint_refuses_meta_tensors():
    with torch.device("meta"):
        net = nn.Linear(2, 2)
    with pytest.raises(errors.ConfigError, match="meta"):
        weights_fingerprint(net)


def test_a_full_disk_warns_once_stops_spilling_and_goes_on(tmp_path, caplog, monkeypatch):
    from stitch_nas.activations import _spill

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_spill, "write_spill", full)
    cache = ActivationCache(memory_gb=1.5 * MB / 2**30, spill_dir=tmp_path)
    computes = [Counter(seed=i) for i in range(4)]
    with caplog.at_level(logging.WARNING, logger="stitch_nas.activations"):
        for i, compute in enumerate(computes):  # each insert evicts (and tries to spill) one
            cache.get_or_compute(_key(i), compute)
        assert torch.equal(cache.get_or_compute(_key(0), computes[0]), computes[0].value)
    warnings = [r for r in caplog.records if "stopped spilling" in r.getMessage()]
    assert len(warnings) == 1 and not cache.spilling
    assert computes[0].calls == 2 and not list(tmp_path.glob("*.npy"))
    assert cache.spill_writer(KEY, (2, 3), torch.float16) is None


def test_streamed_spill_files_are_read_back_as_verified_memory_maps(tmp_path, caplog):
    cache = ActivationCache(memory_gb=0, spill_dir=tmp_path, dtype="float16")
    value = torch.randn(10, 3, 4, 4).to(torch.float16)
    writer = cache.spill_writer(KEY, tuple(value.shape), torch.float16)
    assert writer is not None
    for start in range(0, 10, 4):  # batch by batch through the memory map
        writer.write(start, value[start : start + 4].numpy())
    cache.commit_spill(writer)
    mapped = cache.mapped(KEY)
    assert isinstance(mapped, np.memmap) and not mapped.flags.writeable
    assert torch.equal(torch.from_numpy(np.array(mapped[3:7])), value[3:7])
    assert cache.stats()["disk_bytes"] == (tmp_path / f"{KEY.digest()}.npy").stat().st_size
    path = tmp_path / f"{KEY.digest()}.npy"
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0xFF
    path.write_bytes(raw)  # new mtime: hashed again on the next map
    with caplog.at_level(logging.WARNING, logger="stitch_nas.activations"):
        assert cache.mapped(KEY) is None
    assert any("corrupt" in r.getMessage() for r in caplog.records) and not path.exists()


def test_reservations_count_against_the_budget_and_evict_other_splits_first():
    cache = ActivationCache(memory_gb=3.5 * MB / 2**30)
    probe, val = Counter(seed=0), Counter(seed=1)
    cache.get_or_compute(KEY, probe)  # a probe entry
    cache.get_or_compute(dataclasses.replace(KEY, split="val"), val)
    cache.get_or_compute(KEY, probe)  # the probe is now the most recently used...
    assert cache.reserve(2 * MB)  # ...yet the val entry goes, the probe stays
    assert KEY in cache and dataclasses.replace(KEY, split="val") not in cache
    assert cache.memory_bytes == 3 * MB
    assert not cache.reserve(4 * MB)  # larger than the whole budget: nothing evicted
    assert KEY in cache
    assert not cache.reserve(2 * MB)  # the reserved 2 MiB cannot be evicted
    cache.release(2 * MB)
    assert cache.memory_bytes == 0 and cache.stats()["peak_bytes"] == 3 * MB


def test_default_budget_and_storage_dtype():
    from stitch_nas.activations import DEFAULT_MEMORY_FRACTION
    from stitch_nas.machine import memory_limit_bytes

    cache = ActivationCache()
    expected = int(DEFAULT_MEMORY_FRACTION * memory_limit_bytes())
    assert abs(cache.budget_bytes - expected) <= 1 and cache.dtype == torch.float16
    assert cache.device_budget_bytes == 0  # a CPU cache keeps nothing on a device
    assert dataclasses.replace(KEY, dtype="float16").digest() != KEY.digest()
    with pytest.raises(errors.ConfigError, match="bfloat16.*float16"):
        ActivationCache(dtype="bfloat16")


def test_default_budgets_follow_the_memory_limit_and_the_gpus_free_memory(monkeypatch):
    from stitch_nas.activations import _budgets

    monkeypatch.setattr(_budgets, "memory_limit_bytes", lambda: 8 * 2**30)  # a cgroup's 8 GiB
    asked = []
    monkeypatch.setattr(
        torch.cuda, "mem_get_info", lambda device=None: asked.append(device) or (4 * 2**30, 0)
    )
    assert cache_budgets(None, None, "cpu") == (0.05 * 8, 0.0)
    assert asked == []  # the CPU never asks a GPU
    assert cache_budgets(None, None, "cuda") == (0.05 * 8, 0.25 * 4)
    assert cache_budgets(1.5, 2, "cuda:0") == (1.5, 2.0)  # values given are kept
    assert cache_budgets(1.5, 2, "cpu") == (1.5, 0.0)  # nothing lives on the CPU's "device"
    assert len(asked) == 1
    cache = ActivationCache(device="cuda")
    assert (cache.budget_bytes, cache.device_budget_bytes) == (int(0.4 * 2**30), 2**30)
    with pytest.raises(errors.ConfigError, match="device_memory_gb=-1"):
        cache_budgets(None, -1, "cpu")  # checked even where unused


def test_device_entries_count_against_the_device_budget_and_overflow_to_the_host():
    # "meta" tensors stand in for a GPU's: they have sizes, no data
    cache = ActivationCache(
        memory_gb=2.5 * MB / 2**30, device_memory_gb=3 * MB / 2**30, device="meta"
    )
    meta = torch.device("meta")
    assert cache.reserve(2 * MB, meta) == meta  # the device first...
    assert cache.reserve(2 * MB, meta) == torch.device("cpu")  # ...then the host
    assert cache.reserve(2 * MB, meta) is None  # both full
    assert (cache.memory_bytes, cache.device_memory_bytes) == (2 * MB, 2 * MB)
    cache.release(2 * MB, meta)
    cache.release(2 * MB, "cpu")
    cache.put(_key(1), torch.empty(MB // 2, device=meta))  # 2 MiB of float32 each
    cache.put(_key(2), torch.zeros(MB // 2))
    cache.put(_key(3), torch.empty(MB // 2, device=meta))  # the device evicts its own entry
    assert _key(1) not in cache and _key(2) in cache and _key(3) in cache
    stats = cache.stats()
    assert (stats["bytes_in_memory"], stats["device_bytes_in_memory"]) == (2 * MB, 2 * MB)
    assert stats["device_peak_bytes"] == 2 * MB <= stats["device_budget_bytes"]
    cache.put(_key(4), torch.empty(MB, device=meta))  # 4 MiB: above the device budget
    assert _key(4) not in cache and _key(3) in cache  # returned, not kept; nothing evicted
    assert ActivationCache(memory_gb=1.0).reserve(MB, meta) == torch.device("cpu")  # no device part


def test_the_spill_folder_keeps_within_its_size_and_warns_once(tmp_path, caplog):
    size = 2.5 * MB / 2**30  # two 1 MiB entries
    cache = ActivationCache(memory_gb=1.5 * MB / 2**30, spill_dir=tmp_path, disk_gb=size)
    computes = [Counter(seed=i) for i in range(5)]
    with caplog.at_level(logging.WARNING, logger="stitch_nas.activations"):
        for i, compute in enumerate(computes):  # each insert evicts (and tries to spill) one
            cache.get_or_compute(_key(i), compute)
        spilled = sorted(tmp_path.glob("*.npy"))
        assert len(spilled) == 2 and cache.stats()["disk_bytes"] <= 2.5 * MB
        # an entry that found no room is recomputed; one that did is read back
        cache.get_or_compute(_key(0), computes[0])
        cache.get_or_compute(_key(2), computes[2])
    assert computes[0].calls == 1 and computes[2].calls == 2
    warnings = [r for r in caplog.records if "cache_disk_gb" in r.getMessage()]
    assert len(warnings) == 1 and str(tmp_path) in warnings[0].getMessage()
    assert cache.spilling  # a size is no disk failure: a smaller entry may still fit
    assert cache.spill_writer(KEY, (1024, 1024), torch.float32) is None  # 4 MiB: no room


def test_a_spill_folder_takes_half_the_free_disk_unless_told(tmp_path, monkeypatch):
    import shutil

    from stitch_nas.activations import _spill

    usage = shutil.disk_usage(tmp_path)._replace(free=10 * MB)
    monkeypatch.setattr(_spill.shutil, "disk_usage", lambda path: usage)
    (tmp_path / "a.npy").write_bytes(b"x" * MB)  # what the folder holds counts as its own
    assert _spill.SpillFolder(tmp_path, 1).max_bytes == MB + 5 * MB
    assert _spill.SpillFolder(tmp_path, 1, disk_gb=0).max_bytes == 0
    with pytest.raises(errors.ConfigError, match="disk_gb=-1.*spill nothing"):
        ActivationCache(spill_dir=tmp_path, disk_gb=-1)
