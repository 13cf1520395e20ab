"""Per-frame Parquet rows are read for the episodes a rank serves, when it serves them."""

from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lightning_stream.plan import RankEpochPlan
from lightning_stream.video.source import VideoSource
from lightning_stream.video.spec import VideoSpec
from lightning_stream.video.synthetic import write_dataset

# row groups of over 8 KiB: Arrow's pre-buffering joins the reads of two wanted row groups
# into one when less lies between them (bytes fetched, never decoded as rows)
LENGTHS = [620, 540, 700, 580, 660, 600, 560, 680]
FRONT = "observation.images.front"


class RecordingFiles(pafs.FileSystemHandler):
    """The local file system, noting every byte range read from a Parquet data file."""

    def __init__(self) -> None:
        self.local = pafs.LocalFileSystem()
        self.reads: list[tuple[str, int, int]] = []

    def open_input_file(self, path):
        handle = self.local.open_input_file(path)
        if "/data/chunk-" not in path:
            return handle
        reads = self.reads

        class Recorded:
            closed = False

            def seek(self, offset, whence=0):
                return handle.seek(offset, whence)

            def tell(self):
                return handle.tell()

            def read(self, size=-1):
                at = handle.tell()
                data = handle.read(size)
                reads.append((path, at, len(data)))
                return data

            def size(self):
                return handle.size()

            def close(self):
                handle.close()

        return pa.PythonFile(Recorded(), mode="r")

    def open_input_stream(self, path):
        return self.open_input_file(path)

    def get_type_name(self):
        return "recording"

    def normalize_path(self, path):
        return self.local.normalize_path(path)

    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def create_dir(self, *args):
        raise NotImplementedError

    delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = create_dir
    move = copy_file = open_output_stream = open_append_stream = create_dir


def episodes_read(reads) -> set[int]:
    """The episodes whose row groups (one per episode) the byte ranges ``reads`` touch,
    but for a read of a file's tail: its footer, which in files this small spans the row
    groups too (in a real one, 64 KiB of a file of hundreds of MB)."""
    touched = set()
    for path in {path for path, _, _ in reads}:
        metadata = pq.read_metadata(path)
        end = Path(path).stat().st_size
        reads = [(p, at, size) for p, at, size in reads if at + size < end]
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            chunks = [row_group.column(c) for c in range(row_group.num_columns)]
            low = min(c.dictionary_page_offset or c.data_page_offset for c in chunks)
            high = max(
                (c.dictionary_page_offset or c.data_page_offset) + c.total_compressed_size
                for c in chunks
            )
            episode = chunks[metadata.schema.names.index("episode_index")].statistics.min
            if any(p == path and at < high and at + size > low for p, at, size in reads):
                touched.add(episode)
    return touched


def test_a_rank_reads_rows_only_of_the_episodes_it_serves(tmp_path):
    root = write_dataset(tmp_path / "data", LENGTHS, cameras=(FRONT,), episodes_per_file=2)
    files = RecordingFiles()
    spec = VideoSpec(
        root=str(root),
        episodes=None,
        delta_timestamps={"action": (0.0, 1 / 30)},
        num_splits=4,
        shuffle_seed=3,
        pool_size=2,
        byte_budget_gb=0.01,
        sidecar_dir=str(tmp_path / "sidecars"),
        lock_timeout=60.0,
        filesystem=pafs.PyFileSystem(files),
    )
    source = VideoSource(spec)
    assert files.reads == []  # setup reads no per-frame row
    plan = RankEpochPlan((0,) * 4, source.split_len, 2, 0, 0, 4)
    served = set()
    try:
        for batch in source.engine.serve(0, plan):
            served.update(batch["episode_index"].tolist())
    finally:
        source.stop_workers()
    read = episodes_read(files.reads)
    assert read and read <= served and len(served) < len(LENGTHS)
