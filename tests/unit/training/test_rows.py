"""The torch loop's training rows: one epoch order for every placement, each rank reading its own
part of the split, and the planner's choice of where the rows go."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.catalog import GPU_CATALOG
from tasks.core.data.assignment import SplitConfig
from tasks.core.data.prepare import prepare_dataset
from tasks.core.data.splits import read_split
from tasks.core.data.writing import SPLIT_ROW_GROUP_ROWS
from tasks.core.models.plugins import measure_footprint, mlp_spec
from tasks.core.planning.planner import CatalogEntry, PlanError, Workload, plan_training
from tasks.core.training import rows, torch_training
from tasks.core.training.config import TrainConfig
from tasks.core.training.rank_part import RankPart, rank_part
from tasks.core.training.rows import epoch_order, epoch_windows, streamed_rows
from tasks.core.training.torch_training import train
from tests.streaming_splits import small_row_groups

LAYOUTS = [[23] * 12 + [4], [100], [7, 1, 30, 2, 50]]


pytestmark = pytest.mark.usefixtures("single_process")


@pytest.fixture(scope="module")
def row_group_splits(blob_splits, tmp_path_factory):
    return small_row_groups(blob_splits, tmp_path_factory.mktemp("row-groups"))


@pytest.mark.parametrize("blocks", LAYOUTS)
@pytest.mark.parametrize("buffer_rows", [1, 16, 40, 10**6])
def test_the_epoch_order_is_a_deterministic_permutation(blocks, buffer_rows):
    order = epoch_order(blocks, seed=3, epoch=2, buffer_rows=buffer_rows)
    assert sorted(order.tolist()) == list(range(sum(blocks)))
    np.testing.assert_array_equal(order, epoch_order(blocks, seed=3, epoch=2, buffer_rows=buffer_rows))
    if buffer_rows > 1:  # a buffer of one row shuffles blocks alone, and [100] is one block
        assert not np.array_equal(order, epoch_order(blocks, seed=3, epoch=3, buffer_rows=buffer_rows))


def test_a_part_within_the_buffer_is_fully_permuted_as_the_loop_always_did():
    generator = torch.Generator().manual_seed(7 * 1_000 + 1)
    expected = torch.randperm(283, generator=generator).numpy()
    np.testing.assert_array_equal(epoch_order([23] * 12 + [7], seed=7, epoch=1, buffer_rows=283), expected)


def test_a_window_holds_at_most_the_buffer_and_comes_from_consecutive_blocks():
    blocks = LAYOUTS[0]
    windows = list(epoch_windows(blocks, seed=0, epoch=0, buffer_rows=40))
    assert [len(w.order) for w in windows] == [40] * 7  # 280 rows
    assert all(sum(stop - first for _, first, stop in w.pieces) == len(w.order) for w in windows)
    visited = [block for w in windows for block, _, _ in w.pieces]
    assert sorted(set(visited)) == list(range(len(blocks)))  # each block read once, in one run of windows
    assert [b for i, b in enumerate(visited) if i == 0 or visited[i - 1] != b] == list(dict.fromkeys(visited))


@pytest.mark.parametrize("skip", [0, 1, 39, 40, 95, 279])
def test_streamed_rows_are_the_epoch_order_from_any_row_on(skip):
    blocks = LAYOUTS[0]
    starts = np.cumsum([0, *blocks])
    read = []

    def read_block(index: int):
        read.append(index)
        ids = np.arange(starts[index], starts[index + 1])
        return ids.astype(np.float32)[:, None], ids

    windows = epoch_windows(blocks, seed=5, epoch=1, buffer_rows=40)
    streamed = np.concatenate([y for _, y in streamed_rows(windows, read_block, skip)])
    np.testing.assert_array_equal(streamed, epoch_order(blocks, seed=5, epoch=1, buffer_rows=40)[skip:])
    skipped_windows = list(epoch_windows(blocks, seed=5, epoch=1, buffer_rows=40))[: skip // 40]
    untouched = {b for w in skipped_windows for b, _, _ in w.pieces} - {b for b in read}
    assert len(read) == len(set(read)) and (skip < 40 or untouched)  # skipped windows are not read


@pytest.mark.parametrize("world_size", [1, 2, 3, 7])
def test_rank_parts_are_disjoint_equal_and_read_from_their_own_row_groups(row_group_splits, world_size):
    split_rows = rank_part(row_group_splits.train, 0, 1).rows
    parts = [rank_part(row_group_splits.train, rank, world_size) for rank in range(world_size)]
    ids = [part.row_ids() for part in parts]
    assert {len(i) for i in ids} == {-(-split_rows // world_size)}
    assert set().union(*map(set, ids)) == set(range(split_rows))
    for rank in range(world_size):
        own = set(ids[rank])
        assert not own & set().union(*(set(i) for r, i in enumerate(ids) if r != rank))
        assert len(own) >= len(ids[rank]) - 1  # padding repeats one of the rank's own rows at most
        assert np.all(np.diff(ids[rank][: len(own)]) == 1)  # a contiguous range
    features, labels = read_split(row_group_splits.train, row_group_splits.feature_names, "species")
    part = rank_part(row_group_splits.train, world_size - 1, world_size)
    x, y = part.read(part.blocks, row_group_splits.feature_names, "species")
    row_ids = part.row_ids()
    np.testing.assert_array_equal(x, features[row_ids])
    np.testing.assert_array_equal(y, labels[row_ids])


def parameters(outcome) -> list[torch.Tensor]:
    return [p.detach().clone() for p in outcome.model.parameters()]


def test_every_placement_trains_the_same_rows_in_the_same_order(row_group_splits):
    runs = {
        placement: train(
            TrainConfig(epochs=2, batch_size=16, seed=4, data_placement=placement, shuffle_buffer_rows=50),
            row_group_splits,
        )
        for placement in ("device", "host", "stream")
    }
    device = runs.pop("device")
    assert device.run.history[-1].val_accuracy >= 0.9
    for outcome in runs.values():
        assert outcome.run.history == device.run.history
        for a, b in zip(parameters(outcome), parameters(device), strict=True):
            assert torch.equal(a, b)


def test_the_placement_is_one_the_loop_knows():
    assert TrainConfig(data_placement="stream").problems() == {}
    assert "data_placement" in TrainConfig(data_placement="disk").problems()


def digits_workload(rows: int, val_rows: int, placement: str = "auto") -> Workload:
    footprint = measure_footprint(mlp_spec([256, 128], 0.1), 64, 10, "pytorch", precision="bf16")
    return Workload(footprint, 64, 1, rows, val_rows, "pytorch", data_placement=placement)


SMALL_GPU = [CatalogEntry("small", "gpu", "nvidia-l4", "", memory_gib=4, devices=1, price_per_hour=1.0)]


def test_the_planner_keeps_the_embedded_digits_on_the_device():
    plan = plan_training(digits_workload(1257, 270), GPU_CATALOG)
    assert plan.data_placement == "device"
    assert any("on the device" in note for note in plan.notes)


def test_a_table_larger_than_the_device_is_streamed_not_refused():
    huge = digits_workload(200_000_000, 40_000_000)  # about 60 GiB of rows
    plan = plan_training(huge, SMALL_GPU)
    assert plan.data_placement == "stream" and plan.choice.name == "small"
    assert plan.estimate.data == 0 and "streamed" in " ".join(plan.notes)
    assert plan_training(digits_workload(200_000_000, 40_000_000, "host"), SMALL_GPU).data_placement == "host"
    with pytest.raises(PlanError):  # the run asked for the device: the rows must fit there
        plan_training(digits_workload(200_000_000, 40_000_000, "device"), SMALL_GPU)


def test_streamed_reads_are_bounded_by_the_buffer(row_group_splits, monkeypatch):
    """A streamed epoch reads each of its blocks once and never holds more than a window and a block."""
    reads, real = [], RankPart.read_block
    monkeypatch.setattr(
        RankPart, "read_block", lambda self, block, *a: reads.append(block) or real(self, block, *a)
    )
    config = TrainConfig(epochs=1, batch_size=16, seed=1, data_placement="stream", shuffle_buffer_rows=50)
    train(config, row_group_splits)
    part = rank_part(row_group_splits.train, 0, 1)
    train_reads = [block for block in reads if block.file.endswith(".parquet") and "train" in block.file]
    assert sorted(train_reads, key=lambda b: (b.file, b.row_group)) == part.blocks
    assert rows.PREFETCH_STEPS >= 1


def test_the_cpu_family_hands_batches_over_in_order_unchanged():
    from tasks.core.training.devices import CPU

    batches = [(torch.arange(3) + i, torch.ones(2) * i) for i in range(4)]
    handed = list(CPU.copied_ahead(iter(batches), torch.device("cpu")))
    assert len(handed) == 4
    for (x, y), (hx, hy) in zip(batches, handed, strict=True):
        assert torch.equal(x, hx) and torch.equal(y, hy)


def test_a_rank_reads_its_part_straight_from_an_object_store_uri(row_group_splits):
    """What a cluster pod does with a split in the object store: no download of the whole split, the
    rank's row groups read through fsspec (an in-memory filesystem stands in for the bucket)."""
    import fsspec

    memory = fsspec.filesystem("memory")
    memory.put(row_group_splits.train, "/bucket/train", recursive=True)
    local, remote = (
        rank_part(row_group_splits.train, 1, 2),
        rank_part("memory://bucket/train", 1, 2),
    )
    np.testing.assert_array_equal(remote.row_ids(), local.row_ids())
    columns = (row_group_splits.feature_names, "species")
    for got, expected in zip(
        remote.read(remote.blocks, *columns), local.read(local.blocks, *columns), strict=True
    ):
        np.testing.assert_array_equal(got, expected)
    memory.rm("/bucket", recursive=True)


@pytest.mark.parametrize("batches", [None, 3])
def test_rebatching_lays_parts_end_to_end_and_cuts_whole_batches(batches):
    parts = [
        (np.arange(n * 2).reshape(n, 2) + 100 * i, np.arange(n) + 100 * i) for i, n in enumerate([5, 1, 9, 2])
    ]
    cut = list(rows.rebatched(iter(parts), 4, batches))
    whole_x, whole_y = np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])
    expected = len(whole_y) // 4 + 1 if batches is None else batches
    assert [len(y) for _, y in cut] == [4] * (expected - 1) + [4 if batches else len(whole_y) % 4]
    np.testing.assert_array_equal(np.concatenate([x for x, _ in cut]), whole_x[: sum(len(y) for _, y in cut)])
    np.testing.assert_array_equal(np.concatenate([y for _, y in cut]), whole_y[: sum(len(y) for _, y in cut)])


def test_prepared_splits_have_small_row_groups_so_ranks_decode_little_of_each_other(tmp_path):
    """A rank reads its part a row group at a time: the split's groups bound what two neighbours both
    decode (the one group straddling their ranges)."""
    import pyarrow.parquet as pq

    from tests.conftest import blobs_frame

    source = tmp_path / "blobs.parquet"
    blobs_frame(n_rows=2 * SPLIT_ROW_GROUP_ROWS).to_parquet(source, index=False)
    prepared = prepare_dataset(str(source), "species", str(tmp_path / "prepared"), SplitConfig(seed=0))
    metadata = pq.read_metadata(prepared.paths["train"])
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert max(sizes) <= SPLIT_ROW_GROUP_ROWS and len(sizes) >= 2
    for rank in range(2):
        part = rank_part(prepared.paths["train"], rank, 2)
        decoded = sum(sizes[group] for group in {block.row_group for block in part.blocks})
        assert decoded - part.rows <= SPLIT_ROW_GROUP_ROWS  # one straddling group's other rows


def test_an_epoch_order_computed_ahead_is_the_one_computed_on_demand():
    orders = rows.EpochOrders([23] * 12 + [4])
    first = orders.order(seed=3, epoch=0, buffer_rows=40, epochs=3)
    assert orders.ahead is not None  # the next epoch's, on its way
    ahead = orders.order(seed=3, epoch=1, buffer_rows=40, epochs=3)
    np.testing.assert_array_equal(first, epoch_order([23] * 12 + [4], 3, 0, 40))
    np.testing.assert_array_equal(ahead, epoch_order([23] * 12 + [4], 3, 1, 40))
    assert not np.array_equal(first, ahead)
    orders.order(seed=3, epoch=2, buffer_rows=40, epochs=3)
    assert orders.ahead is None  # no epoch after the last


def test_an_order_asked_for_out_of_turn_is_computed_on_demand():
    orders = rows.EpochOrders([100])
    orders.order(seed=1, epoch=0, buffer_rows=10**6, epochs=5)
    np.testing.assert_array_equal(orders.order(1, 3, 10**6, 5), epoch_order([100], 1, 3, 10**6))


def test_the_first_epochs_order_is_computed_from_the_start_and_is_the_one_on_demand():
    orders = rows.EpochOrders([23] * 12 + [4], first=(3, 0, 40))
    assert orders.ahead is not None and orders.ahead[0] == (3, 0, 40)
    orders.ahead[1].result(timeout=30)  # done before the epoch asks for it
    np.testing.assert_array_equal(orders.order(3, 0, 40, 2), epoch_order([23] * 12 + [4], 3, 0, 40))


def test_a_resumed_run_starts_at_a_later_epoch_whose_order_is_computed_on_demand():
    orders = rows.EpochOrders([100], first=(1, 0, 10**6))
    np.testing.assert_array_equal(orders.order(1, 2, 10**6, 5), epoch_order([100], 1, 2, 10**6))


@pytest.mark.parametrize("placement", ["device", "host", "stream"])
def test_the_loop_orders_its_first_epoch_while_reading_its_rows(row_group_splits, placement):
    config = TrainConfig(seed=4, data_placement=placement, shuffle_buffer_rows=50)
    ctx = torch_training.init_distributed(config.collective_timeout_s)
    training_rows = torch_training.load_shards(config, row_group_splits, ctx)
    ahead = training_rows.orders.ahead
    if placement == "stream":  # streamed windows are permuted as they are read
        assert ahead is None
    else:
        assert ahead is not None and ahead[0] == (4, 0, 50)
