"""Packed token blocks: LanceDataModule(pack=...) against LitData's TokensLoader, same tokens.

    python benchmarks/bench_packing.py [--documents 200000] [--block-size 2048]
        [--batch-size 16] [--step-ms 0] [--rounds 3]
        [--s3 [--latency-ms 20] [--store-cores 0] [--moto-ranges]] [--trainer]
        [--json benchmarks/results/bench_packing.json]

LitData is an optional benchmark dependency, installed as for ``bench_litdata.py``:

    pip install --no-deps litdata==0.2.76 && pip install tifffile obstore

The documents (``--documents`` rows of 1 to 20,000 tokens, a heavy tail:
``lightning_stream.lance.synthetic.make_token_table``) are written once as a LanceDB
table and, document for document with its end-of-document token appended, as a LitData
token dataset (``litdata.optimize`` with ``TokensLoader``). The token counts our packing
needs, and our local copy of the tokens, are written once, before the rounds, by one scan
(a cost per table version, not per epoch, as LitData's ``optimize`` is; both are timed).
Each configuration reads two shuffled epochs in a fresh process, the configurations
interleaved, ``--rounds`` rounds; ``--step-ms`` follows every batch with a wait of that many
ms in the consumer (a training step that leaves the cores to the readers, as a step on a
GPU does; default 0: none):

- ``ours``: ``LanceDataModule(pack=TokenPacking(block_size, eos_id, pad_id,
  local_copy=False))`` at its defaults otherwise (32 splits): batches of ``input_ids``,
  ``labels``, ``position_ids``, ``document_ids``, ``cu_seqlens`` and ``max_seqlen``, the
  documents read from the table (what a machine whose disk cannot hold the column reads);
- ``ours-local``: the same with ``local_copy=True``, what the default (``None``) does
  where the copy fits in half the free disk: each block cut from the local copy of the
  token column by positional reads;
- ``litdata``: ``StreamingDataset(item_loader=TokensLoader(block_size), shuffle=True)``
  through ``StreamingDataLoader``: batches of ``input_ids`` only (blocks cut from the
  concatenated tokens; labels, positions and document boundaries are left to the user);
- ``litdata-fields``: the same, with a collate that gives the batch ours has (labels,
  positions, segments and ``cu_seqlens`` found from the end-of-document tokens, by the
  array arithmetic ours uses, ``packed_fields``), in the workers where there are
  some: what a LitData user adds to train as ours trains;
- ``lance-scan`` (0 workers only): the ceiling of any reader of the table through lance
  in one process: a scan of the token column in storage order (lance's cheapest read,
  on its own threads), the tokens counted, no shuffle, no blocks.

``--s3`` uploads the table and LitData's dataset, as written, to a bucket of the test S3
server (``tests/s3_server.py``: moto on 127.0.0.1, every request answered after
``--latency-ms``; ``--store-cores N`` keeps it on the host's last N cores and the readers
on the others; ``--moto-ranges``: moto answers the range reads itself, not the
store's front) and reads them from there, each process with a cache directory of its own
made afresh: a machine that has read nothing yet. So our setup counts (and copies) the
token column from the store, and LitData downloads its chunks as it reads them; the
table's ceiling is not run.

``--trainer`` runs both epochs inside ``Trainer.fit(max_epochs=2)`` of a model that
trains nothing (``benchmarks/lightning_parts.py``: ``TokenModel``), each batch timed as it
reaches ``training_step``: Lightning's loop shares the process (and, at 0 workers, the
GIL) with the reader, as in training; the table's ceiling is not run.

Reported per worker count (0 and 2): tokens/s after the first batch (median and range)
and ours over each LitData configuration paired by round (after the first batch, over
the next epoch in the same process, and from setup: the first epoch's tokens over the
time from the loader's construction, our ``setup`` included, to its last batch, which
with ``--s3`` is a cold start's); the first batch's wait; and ours' peak
resident memory of the process tree (workers included) above what it held once every
reader (the main process, or each worker) had handed out its first batch, against
``read_ahead_bytes``. At 0 workers also the lance scan's tokens/s over LitData raw's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from fresh import hand_back, run_fresh
from measure import PeakRss, add_store_options, cores_for_store, rates, shown, spread, tree_rss_mb
from record import save

ROOT = Path(__file__).resolve().parents[1]
NUM_SPLITS = 32
EOS_ID, PAD_ID = 2**31 - 1, 2**31 - 2
READ_AHEAD_BYTES = 256 * 2**20  # LanceDataModule's default
OURS = ("ours", "ours-local")
LITDATA = ("litdata", "litdata-fields")
CEILING = "lance-scan"  # at 0 workers only
CHUNK_DOCUMENTS = 10_000  # documents per optimize input
S3_TABLE, S3_LITDATA = "s3://bench/db", "s3://bench/litdata"  # with --s3


def documents(spec: tuple[str, int, int]):
    """LitData items: the tokens of documents ``start .. start + count`` of the table
    at ``uri``, each followed by the end-of-document token."""
    import lancedb
    import numpy as np
    import torch

    uri, start, count = spec
    table = lancedb.connect(uri).open_table("documents")
    rows = table.search().offset(start).limit(count).select(["tokens"]).to_arrow()
    for values in rows.column("tokens").to_numpy(zero_copy_only=False):
        yield torch.from_numpy(np.append(values, np.int32(EOS_ID)).astype(np.int32))


def epoch(
    config: str,
    uri: str,
    litdata_dir: str,
    cache: str,
    batch: int,
    block: int,
    step_ms: float,
    endpoint: str | None = None,
    trainer: bool = False,
) -> dict:
    """Two epochs of ``reader:workers`` in this (fresh) process, each batch followed by a
    wait of ``step_ms``. With an S3 ``endpoint``, both datasets are read from its bucket
    ``bench``, each with a cache directory of its own made afresh (a machine that has
    read nothing of them yet). ``trainer``: inside ``Trainer.fit(max_epochs=2)``, the
    batches timed as they reach ``training_step``; otherwise a loop over the loader."""
    sys.path.insert(0, str(ROOT))
    reader, workers = config.split(":")
    workers = int(workers)
    before = tree_rss_mb()
    fresh = tempfile.TemporaryDirectory() if endpoint else None
    import torch  # noqa: F401  (a training process has it: its import is not timed)

    if reader in OURS:
        from lightning_stream import LanceDataModule, TokenPacking
    elif reader in LITDATA:
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader
    if trainer:
        from lightning_parts import TokenModel, quiet_trainer
    built = time.perf_counter()
    if reader == CEILING:
        loader = TokenScan(uri)
    elif reader in OURS:
        options = None
        if endpoint:
            from tests.s3_server import storage_options

            uri, cache, options = S3_TABLE, fresh.name, storage_options(endpoint)
        packing = TokenPacking("tokens", block, EOS_ID, PAD_ID, cache, reader == "ours-local")
        shape = {"num_splits": NUM_SPLITS, "batch_size": batch, "num_workers": workers}
        dm = LanceDataModule(uri, "documents", **shape, pack=packing, storage_options=options)
        if not trainer:
            dm.setup("fit")
            loader = dm.train_dataloader()
    else:
        remote = {}
        if endpoint:
            litdata_dir = S3_LITDATA
            remote = {"storage_options": litdata_options(endpoint), "cache_dir": fresh.name}
        dataset = StreamingDataset(
            litdata_dir, item_loader=TokensLoader(block_size=block), shuffle=True, seed=0, **remote
        )
        collate = {"collate_fn": same_fields} if reader == "litdata-fields" else {}
        loader = StreamingDataLoader(dataset, batch_size=batch, num_workers=workers, **collate)
    if trainer:
        model = TokenModel(max(1, workers), step_ms)
        with PeakRss() as peak:
            fed = {"datamodule": dm} if reader in OURS else {"train_dataloaders": loader}
            quiet_trainer(max_epochs=2).fit(model, **fed)
        (start, again_start), (stamps, again) = model.starts, model.stamps
        first_rss = model.first_rss_mb
    else:
        with PeakRss() as peak:
            start, stamps, first_rss = one_pass(loader, max(1, workers), step_ms)
        again_start, again, _ = one_pass(loader, max(1, workers), step_ms)
        if reader in OURS:
            dm.teardown("fit")
    if fresh:
        fresh.cleanup()
    tokens = sum(n for _, n in stamps)
    return {
        **rates(start, stamps),
        "setup_s": start - built,
        "from_setup": tokens / (stamps[-1][0] - built),
        "first_batch_s": stamps[0][0] - start,
        "tokens": tokens,
        "second_epoch": rates(again_start, again)["after_first"],
        "start_mb": before,
        "first_batch_mb": first_rss,
        "peak_above_first_mb": peak.peak - first_rss,
    }


class TokenScan:
    """Each pass: the token column of the table at ``uri`` scanned in storage order, a
    tensor of each batch of rows' tokens."""

    def __init__(self, uri: str) -> None:
        import lancedb

        self.table = lancedb.connect(uri).open_table("documents")

    def __iter__(self):
        import torch

        for rows in self.table.search().select(["tokens"]).to_batches(8192):
            values = rows.column(0).values.to_numpy(zero_copy_only=False)
            yield torch.from_numpy(values)


def litdata_options(endpoint: str) -> dict:
    """LitData's options for the test S3 server at ``endpoint`` (boto3's client arguments).

    LitData fetches chunks with obstore, whose client refuses a plain-HTTP endpoint
    unless told otherwise, and LitData sets that client's options itself: the test server
    speaks HTTP, a real store HTTPS, so allowing HTTP changes nothing else of its reads."""
    import litdata.streaming.downloader as downloader

    from tests.s3_server import ACCESS_KEY, REGION, SECRET_KEY

    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
    return {
        "endpoint_url": endpoint,
        "aws_access_key_id": ACCESS_KEY,
        "aws_secret_access_key": SECRET_KEY,
        "region_name": REGION,
    }


def same_fields(blocks: list) -> dict:
    """LitData's blocks as ours are served: documents found by their end tokens."""
    import numpy as np
    import torch

    from lightning_stream.packing.blocks import packed_fields
    from lightning_stream.packing.option import IGNORE_INDEX

    input_ids = np.stack([np.asarray(block, dtype=np.int64) for block in blocks])
    count, size = input_ids.shape
    starts = np.zeros((count, size), dtype=bool)
    starts[:, 0] = True
    starts[:, 1:] = input_ids[:, :-1] == EOS_ID
    lengths = np.full(count, size)
    follows = np.full(count, IGNORE_INDEX)
    fields = packed_fields(input_ids, np.flatnonzero(starts), lengths, follows)
    return {name: torch.from_numpy(value) for name, value in fields.items()}


def one_pass(loader, readers: int, step_ms: float) -> tuple[float, list[tuple[float, int]], float]:
    """One epoch: its start, each batch's (arrival, tokens), the RSS once each of the
    ``readers`` handed out its first batch."""
    start = time.perf_counter()
    stamps, first_rss = [], 0.0
    for batch in loader:
        ids = batch["input_ids"] if isinstance(batch, dict) else batch
        stamps.append((time.perf_counter(), ids.numel()))
        if len(stamps) == readers:
            first_rss = tree_rss_mb()
        if step_ms:
            time.sleep(step_ms / 1000)
    return start, stamps, first_rss


def write_data(tmp: Path, count: int) -> tuple[tuple[str, str, str], dict[str, float]]:
    """The documents as a LanceDB table and a LitData token dataset; the token counts
    and our local copy of the tokens written to the cache. Returns the table's uri, the
    LitData directory and the cache directory, and the seconds each preparation took."""
    import litdata
    from litdata import TokensLoader

    from lightning_stream import LanceDataModule, TokenPacking
    from lightning_stream.lance.synthetic import make_token_table

    uri, out, cache = str(tmp / "db"), str(tmp / "litdata"), str(tmp / "cache")
    make_token_table(uri, count)
    specs = [(uri, s, min(CHUNK_DOCUMENTS, count - s)) for s in range(0, count, CHUNK_DOCUMENTS)]
    start = time.perf_counter()
    litdata.optimize(
        fn=documents,
        inputs=specs,
        output_dir=out,
        chunk_size=2**22,
        item_loader=TokensLoader(),
        num_workers=1,
        mode="overwrite",
    )
    litdata_s = time.perf_counter() - start
    start = time.perf_counter()
    packing = TokenPacking("tokens", 16, EOS_ID, PAD_ID, cache, local_copy=True)
    LanceDataModule(uri, "documents", num_splits=1, batch_size=1, pack=packing).setup("fit")
    ours_s = time.perf_counter() - start
    return (uri, out, cache), {"litdata_optimize_s": litdata_s, "ours_scan_and_copy_s": ours_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=200_000)
    parser.add_argument("--block-size", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument(
        "--step-ms", type=float, default=0.0, help="wait after each batch (a training step)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--s3", action="store_true", help="read both datasets from an S3 server, cold caches"
    )
    add_store_options(parser)
    parser.add_argument(
        "--trainer", action="store_true", help="every epoch inside Trainer.fit (default: a loop)"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also keep the figures there")
    args = parser.parse_args()
    configs = [f"{reader}:{w}" for w in (0, 2) for reader in OURS + LITDATA]
    if not (args.s3 or args.trainer or args.step_ms):  # a ceiling of reads alone
        configs.insert(len(OURS + LITDATA), f"{CEILING}:0")
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as serving:
        store_cpus = cores_for_store(args.store_cores) if args.s3 else None
        (uri, litdata_dir, cache), preparation = write_data(Path(tmp), args.documents)
        endpoint = "-"
        if args.s3:
            served = s3_copy(Path(tmp), args.latency_ms, store_cpus, args.moto_ranges)
            endpoint = serving.enter_context(served)
        for round_ in range(args.rounds):
            runs.append({})
            for config in configs:
                arguments = [__file__, "--one", config, uri, litdata_dir, cache]
                arguments += [str(args.batch_size), str(args.block_size), str(args.step_ms)]
                arguments += [endpoint, "trainer" if args.trainer else "loop"]
                runs[-1][config] = run_fresh(arguments, f"round {round_} {config}")
    figures = summary(runs)
    report(figures, preparation)
    if args.json:
        result = {"documents": args.documents, "block_size": args.block_size, **preparation}
        result |= {"batch_size": args.batch_size, "rounds": args.rounds, "step_ms": args.step_ms}
        name = f"{args.documents:,} documents, block {args.block_size}, step {args.step_ms:g} ms"
        if args.trainer:
            result["trainer"] = True
            name += ", inside Trainer.fit"
        if args.s3:
            result |= {"s3_latency_ms": args.latency_ms, "store_cores": args.store_cores}
            result["moto_ranges"] = args.moto_ranges
            name += f", S3 (latency {args.latency_ms:g} ms, store cores {args.store_cores}"
            name += ", ranges by moto)" if args.moto_ranges else ")"
        save(args.json, name, {**result, "runs": runs, "figures": figures})


@contextmanager
def s3_copy(tmp: Path, latency_ms: float, cpus: set[int] | None, moto_ranges: bool):
    """The table and LitData's dataset of ``tmp`` uploaded to a bucket ``bench`` of the
    test S3 server (``tests/s3_server.py``: moto, every request answered after
    ``latency_ms``, on ``cpus``; ``moto_ranges``: range reads answered by moto itself);
    yields its endpoint while it serves."""
    sys.path.insert(0, str(ROOT))
    from tests.s3_server import S3Server

    store = S3Server(tmp / "moto.log", latency_ms=latency_ms, cpus=cpus, moto_ranges=moto_ranges)
    with store as server:
        server.create_bucket("bench")
        server.upload(tmp / "db", S3_TABLE)
        server.upload(tmp / "litdata", S3_LITDATA)
        yield server.endpoint


def summary(runs: list[dict]) -> dict:
    """Per worker count: LitData's figures, and each of ours with its ratios over each
    LitData configuration, paired by round."""
    figures = {}
    for workers in (0, 2):
        figures[f"{workers} workers"] = entry = {"read_ahead_mb": READ_AHEAD_BYTES / 2**20}
        for reader in OURS + LITDATA:
            results = [r[f"{reader}:{workers}"] for r in runs]
            entry[reader] = {
                "tokens_per_s": spread([r["after_first"] for r in results]),
                "first_batch_s": statistics.median(r["first_batch_s"] for r in results),
            }
            if reader in LITDATA:
                continue
            entry[reader]["peak_above_first_mb"] = max(r["peak_above_first_mb"] for r in results)
            for theirs in LITDATA:
                paired = [(r[f"{reader}:{workers}"], r[f"{theirs}:{workers}"]) for r in runs]
                entry[reader][f"over_{theirs}"] = spread(
                    [a["after_first"] / b["after_first"] for a, b in paired]
                )
                entry[reader][f"over_{theirs}_second_epoch"] = spread(
                    [a["second_epoch"] / b["second_epoch"] for a, b in paired]
                )
                entry[reader][f"over_{theirs}_from_setup"] = spread(
                    [a["from_setup"] / b["from_setup"] for a, b in paired]
                )
    if f"{CEILING}:0" not in runs[0]:
        return figures
    scans = [(r[f"{CEILING}:0"], r["litdata:0"]) for r in runs]
    figures["0 workers"][CEILING] = {
        "tokens_per_s": spread([scan["after_first"] for scan, _ in scans]),
        "over_litdata": spread([scan["after_first"] / raw["after_first"] for scan, raw in scans]),
    }
    return figures


def report(figures: dict, preparation: dict) -> None:
    print(
        f"\nprepared once: LitData's optimize {preparation['litdata_optimize_s']:.1f} s, our"
        f" token counts and local copy {preparation['ours_scan_and_copy_s']:.1f} s"
    )
    print(
        f"{'workers':<10} {'reader':<11} {'tokens/s':>12} {'/ LitData':>18} {'epoch 2':>18}"
        f" {'from setup':>18} {'/ +fields':>18} {'epoch 2':>18} {'first batch s':>14}"
        f" {'peak above first MB':>20}"
    )
    for name, entry in figures.items():
        for reader in OURS + LITDATA:
            f = entry[reader]
            ratios = ""
            if reader in OURS:
                ratios = " ".join(
                    f"{shown(f[key]):>18}"
                    for key in (
                        "over_litdata",
                        "over_litdata_second_epoch",
                        "over_litdata_from_setup",
                        "over_litdata-fields",
                        "over_litdata-fields_second_epoch",
                    )
                )
                ratios += f" {f['first_batch_s']:>14.2f}"
                ratios += f" {f['peak_above_first_mb']:>10.0f} of {entry['read_ahead_mb']:.0f}"
            print(f"{name:<10} {reader:<11} {f['tokens_per_s']['median']:>12.0f} {ratios}")
    ceiling = figures["0 workers"].get(CEILING)
    if ceiling is None:
        return
    print(
        f"0 workers  {CEILING} (the table's ceiling through lance, no blocks)"
        f" {ceiling['tokens_per_s']['median']:.0f} tokens/s, {shown(ceiling['over_litdata'])}"
        " LitData raw"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        config, uri, litdata_dir, cache, batch, block, step_ms, endpoint, how = sys.argv[2:11]
        endpoint = None if endpoint == "-" else endpoint
        shape = (int(batch), int(block), float(step_ms))
        hand_back(epoch(config, uri, litdata_dir, cache, *shape, endpoint, how == "trainer"))
    else:
        main()
