"""Every bad input gives one clear error that names the argument and what to change."""

import pytest

from lightning_stream import LanceDataModule
from lightning_stream.demo import arguments, run


def make(table_dir, **options):
    settings = {"num_splits": 12, "batch_size": 4, **options}
    return LanceDataModule(str(table_dir / "db"), settings.pop("table", "samples"), **settings)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"num_workers": 5},
            r"num_splits=12 is not divisible by world_size \* max\(1, num_workers\)",
        ),
        ({"columns": ["id", "nope"]}, r"columns=\['id', 'nope'\]: \['nope'\] not in table"),
        ({"filter": "id < 0"}, r"filter='id < 0' selects no rows"),
        ({"filter": "no_such_column > 1"}, r"filter='no_such_column > 1' cannot be applied"),
        ({"filter": "id < 5"}, r"has 5 rows \(filter='id < 5'\), fewer than num_splits=12"),
        ({"table": "missing"}, r"table='missing' not found"),
        ({"version": 99}, r"version=99 of table 'samples'"),
        ({"val_filter": "id < 0"}, r"val_filter='id < 0' selects no rows"),
    ],
)
def test_setup_errors(table_dir, options, message):
    with pytest.raises(ValueError, match=message):
        make(table_dir, **options).setup("fit")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"num_splits": -1}, "num_splits must be a positive integer"),
        ({"num_workers": -1}, "num_workers must be 0 or more"),
        ({"val_filter": "id < 9", "val_table": "samples"}, "val_filter or val_table, not both"),
    ],
)
def test_constructor_errors(table_dir, options, message):
    with pytest.raises(ValueError, match=message):
        make(table_dir, **options)


def test_transform_that_drops_rows_is_named(table_dir):
    dm = make(table_dir, transform=drop_first_row)
    dm.setup("fit")
    with pytest.raises(
        TypeError, match="transform returned column 'id' with 3 rows for a batch of 4"
    ):
        next(iter(dm.train_dataloader()))


def drop_first_row(batch):
    return {name: value[1:] for name, value in batch.items()}


def test_validation_rows_are_split_across_ranks_without_repeats(table_dir):
    dm = make(table_dir, filter="id >= 40", val_filter="id < 40")
    dm.setup("fit")
    ids = [i for batch in dm.val_dataloader() for i in batch["id"].tolist()]
    assert sorted(ids) == list(range(40))
    assert ids == sorted(ids), "validation is read in storage order"


def test_empty_table_says_it_is_empty(tmp_path):
    import lancedb
    import pyarrow as pa

    lancedb.connect(str(tmp_path)).create_table("empty", schema=pa.schema([("id", pa.int64())]))
    dm = LanceDataModule(str(tmp_path), "empty", num_splits=2, batch_size=2)
    with pytest.raises(ValueError, match=r"table 'empty' in .* is empty"):
        dm.setup("fit")


def test_missing_uri_is_named_and_nothing_is_created(tmp_path):
    missing = tmp_path / "no-such-db"
    dm = LanceDataModule(str(missing), "samples", num_splits=2, batch_size=2)
    with pytest.raises(ValueError, match=r"uri='.*no-such-db' does not exist"):
        dm.setup("fit")
    assert not missing.exists()


def test_unpicklable_transform_with_workers_is_named_at_setup(table_dir):
    dm = make(table_dir, num_workers=2, transform=lambda batch: batch)
    with pytest.raises(ValueError, match=r"transform=<function .*<lambda>.* cannot be sent"):
        dm.setup("fit")


def test_truncated_checkpoint_is_named(table_dir, tmp_path):
    out = tmp_path / "run"
    argv = ["--uri", str(table_dir / "db"), "--ledger-dir", str(out / "ledger")]
    run(arguments().parse_args([*argv, "--ckpt-dir", str(out / "ckpt"), "--save-at", "4"]))
    ckpt = out / "ckpt" / "step=4.ckpt"
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    args = [*argv, "--ckpt-dir", str(out / "again"), "--ckpt-path", str(ckpt)]
    with pytest.raises(ValueError, match=r"checkpoint '.*step=4.ckpt' cannot be read .* truncated"):
        run(arguments().parse_args(args))


def test_a_table_whose_files_are_gone_at_the_first_batch_names_the_table(tmp_path):
    import shutil

    from lightning_stream.demo import make_table

    make_table(str(tmp_path / "db"), 240)
    dm = LanceDataModule(str(tmp_path / "db"), "samples", num_splits=12, batch_size=4)
    dm.setup("fit")
    shutil.rmtree(tmp_path / "db" / "samples.lance" / "data")  # its data files, deleted
    with pytest.raises(RuntimeError, match=r"reading table 'samples' in .* at version 1 failed"):
        next(iter(dm.train_dataloader()))
    dm.teardown("fit")
