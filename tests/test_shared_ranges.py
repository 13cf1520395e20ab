"""Packets both sides of a cut need: each read gets its exact bytes, each byte is fetched
once while the limit allows, and nothing is held once every read is done."""

from concurrent.futures import Future, ThreadPoolExecutor

from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_stream.video.shared import SharedRanges

FILE = bytes(range(256)) * 8  # 2,048 bytes, each position's byte known

ranges_st = st.lists(
    st.tuples(st.integers(0, 2000), st.integers(1, 400)).map(lambda r: (r[0], r[0] + r[1])),
    min_size=1,
    max_size=8,
)


def read_all(shared: SharedRanges, ranges: list[tuple[int, int]], order: list[int]):
    """Read ``ranges`` in ``order``, each one's later sharers named; the bytes fetched."""
    fetched_ranges = []

    def fetch(offset: int, size: int) -> Future[bytes]:
        fetched_ranges.append((offset, offset + size))
        read: Future[bytes] = Future()
        read.set_result(FILE[offset : offset + size])
        return read

    unread = set(order)
    for key in order:
        unread.discard(key)
        start, stop = ranges[key]
        sharers = [(k, *ranges[k]) for k in unread if ranges[k][0] < stop and ranges[k][1] > start]
        data, _ = shared.read("file.mp4", start, stop, key, sharers, fetch)
        assert data.result() == FILE[start:stop]
        assert shared.held_bytes <= shared.limit
    return fetched_ranges


@settings(max_examples=300, deadline=None)
@given(ranges=ranges_st, data=st.data())
def test_each_byte_is_fetched_once_and_nothing_is_left_held(ranges, data):
    order = data.draw(st.permutations(range(len(ranges))))
    shared = SharedRanges(limit=1 << 20)
    fetched = read_all(shared, ranges, order)
    union = set().union(*(range(a, b) for a, b in ranges))
    each = [i for a, b in fetched for i in range(a, b)]
    assert sorted(each) == sorted(union), "every byte needed, fetched once"
    assert shared.held_bytes == 0 and not any(shared.held.values())


@settings(max_examples=300, deadline=None)
@given(ranges=ranges_st, limit=st.integers(0, 300), data=st.data())
def test_a_small_limit_costs_fetches_never_bytes(ranges, limit, data):
    order = data.draw(st.permutations(range(len(ranges))))
    shared = SharedRanges(limit=limit)
    read_all(shared, ranges, order)  # every read's bytes exact, the limit kept
    assert shared.held_bytes == 0


def test_a_failed_fetch_fails_the_reads_that_share_its_bytes():
    shared = SharedRanges(limit=1 << 20)

    def broken(offset: int, size: int) -> Future[bytes]:
        read: Future[bytes] = Future()
        read.set_exception(OSError("connection reset"))
        return read

    first, _ = shared.read("file.mp4", 0, 100, "a", [("b", 50, 150)], broken)
    second, fetched = shared.read("file.mp4", 50, 150, "b", [], broken)
    assert isinstance(first.exception(), OSError) and isinstance(second.exception(), OSError)
    assert fetched == 50, "the held half is not fetched again"


def test_parts_fetched_on_many_threads_join_into_each_read():
    # a read of held and fetched parts completes once all are in, whichever thread
    # finishes last (the video reader fetches on 8 threads)
    with ThreadPoolExecutor(8) as pool:

        def fetch(offset: int, size: int) -> Future[bytes]:
            return pool.submit(lambda: FILE[offset : offset + size])

        for _ in range(200):
            shared = SharedRanges(limit=1 << 20)
            sharers = [(f"later-{i}", 100 * i, 100 * i + 50) for i in range(1, 16)]
            shared.read("file.mp4", 0, 2000, "first", sharers, fetch)
            # 15 held parts and 16 fetched between them
            data, fetched = shared.read("file.mp4", 0, 2048, "wide", [], fetch)
            assert data.result(timeout=10) == FILE and fetched == 2048 - 15 * 50
            for key, start, stop in sharers:
                data, _ = shared.read("file.mp4", start, stop + 10, key, [], fetch)
                assert data.result(timeout=10) == FILE[start : stop + 10]
            assert shared.held_bytes == 0
