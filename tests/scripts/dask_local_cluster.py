"""A `distributed.LocalCluster` of 2 process workers in a process of its own, for tests
that SIGKILL its scheduler: prints ``address ADDRESS`` once the workers are up, then
runs until its standard input closes (or it is killed)."""

from __future__ import annotations

import logging
import sys


def main() -> None:
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
        scheduler_port=0, dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR,
    )
    with Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
    print(f"address {cluster.scheduler_address}", flush=True)
    sys.stdin.read()
    cluster.close()


if __name__ == "__main__":  # LocalCluster's process workers re-import __main__
    main()
