"""What a range GET costs the S3 server, answered by moto's own server or by the test
store's front, by the size of the object it reads.

    python benchmarks/moto_ranges.py [--sizes-mb 4,16,70] [--gets 40]
        [--json benchmarks/results/moto_ranges.json]

For each object size, an object of that size is written to a fresh ``tests/s3_server.py``
(no latency), then read ``--gets`` times in ranges of 256 KiB at spread offsets, once with
the front answering the ranges and once with moto's own server answering them
(``--moto-ranges``); reported: the server's CPU per GET and the wall time per GET. moto
reads the whole object for every range GET, so its cost grows with the object: a table's
data files of 64-70 MB (2M light rows written at once) make every range GET of a reader
cost that much of the store's CPU. ``--json PATH`` also keeps the figures in the results
file ``PATH`` (``benchmarks/record.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from record import save

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="4,16,70")
    parser.add_argument("--gets", type=int, default=40)
    parser.add_argument("--json", type=Path, metavar="PATH", help="also keep the figures there")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import boto3

    from tests.s3_server import ACCESS_KEY, REGION, SECRET_KEY, S3Server, cpu_seconds

    span = 256 * 2**10
    found = []
    for size_mb in map(int, args.sizes_mb.split(",")):
        for moto in (False, True):
            with S3Server(latency_ms=0, moto_ranges=moto) as server:
                server.create_bucket("bench")
                client = boto3.client(
                    "s3",
                    endpoint_url=server.endpoint,
                    aws_access_key_id=ACCESS_KEY,
                    aws_secret_access_key=SECRET_KEY,
                    region_name=REGION,
                )
                size = size_mb * 2**20
                client.put_object(Bucket="bench", Key="object", Body=os.urandom(size))
                cpu, wall = cpu_seconds(server.endpoint), time.perf_counter()
                for get in range(args.gets):
                    start = get * 1_000_003 % (size - span)
                    client.get_object(
                        Bucket="bench", Key="object", Range=f"bytes={start}-{start + span - 1}"
                    )["Body"].read()
                cpu = (cpu_seconds(server.endpoint) - cpu) / args.gets
                wall = (time.perf_counter() - wall) / args.gets
                who = "moto" if moto else "front"
                print(
                    f"object {size_mb:>4} MB, ranges answered by {who:<5}: store CPU"
                    f" {cpu * 1000:6.1f} ms a GET, {wall * 1000:6.1f} ms wall",
                    flush=True,
                )
                found.append(
                    {
                        "object_mb": size_mb,
                        "answered_by": who,
                        "store_cpu_ms_per_get": cpu * 1000,
                        "wall_ms_per_get": wall * 1000,
                    }
                )
    if args.json:
        figures = {"range_kib": span // 2**10, "gets": args.gets, "results": found}
        save(args.json, f"ranges of {span // 2**10} KiB, {args.gets} GETs an object", figures)


if __name__ == "__main__":
    main()
