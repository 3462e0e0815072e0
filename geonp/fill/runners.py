"""Running the blocks of an infill store: one after another, on a local dask cluster, or on a
dask.distributed scheduler. Every block is independent (see :mod:`geonp.tasks.windows`), so the
order and the place it runs in do not change what is written.
"""

from __future__ import annotations

import sys

import numpy as np

from geonp.fill.output import InfillStore
from geonp.fill.plan import Plan
from geonp.interrupt import stop_if_pressed


def block_values(p: Plan, variables: list[str] | tuple[str, ...],
                  region: dict[str, slice]) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """One block's output layers of ``variables`` (each ``[*extra, time, rows, cols]`` over
    ``region``), and its gap cells filled without context per variable.

    A block spans one index of each extra dim (they are chunked one by one, see ``canonical``):
    the field at that index is filled over the block's time, rows and cols.
    """
    values, without = {}, {}
    for name in variables:
        dims = p.cubes[name].dims
        index = {d: region[d].start for d in dims[:-3]}
        r = p.fill(p.field(name, index), tuple(region[d] for d in dims[-3:]))
        lead = (1,) * len(index)
        values.update({name: r.value.reshape(lead + r.value.shape), f"{name}_std": r.std.reshape(lead + r.std.shape),
                       f"{name}_flag": r.flag.reshape(lead + r.flag.shape)})
        without[name] = r.without_context
    return values, without

def sequential(p: Plan, store: InfillStore, todo: list, scheduler: str | None, say) -> None:
    from tqdm import tqdm

    for index, region in tqdm(todo, desc="infill blocks", unit="block", disable=say is None, file=sys.stderr):
        stop_if_pressed()  # a Ctrl-C a library dropped (geonp.interrupt)
        store.write_block(index, region, *block_values(p, store.filled_in(index), region))

def on_local_cluster(p: Plan, store: InfillStore, todo: list, workers: int, say) -> None:
    """Start a LocalCluster of ``workers`` processes, torch's threads shared out among them."""
    import os

    try:
        from dask.distributed import LocalCluster
    except ImportError:
        raise ValueError("--workers needs dask.distributed: pip install distributed") from None
    threads = max(1, (os.cpu_count() or 1) // workers)
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                      env={"OMP_NUM_THREADS": str(threads)}) as cluster:
        if say:
            say(f"local dask cluster: {workers} worker processes, {threads} torch thread(s) each")
        distributed(p, store, todo, cluster.scheduler_address, say)

def distributed(p: Plan, store: InfillStore, todo: list, scheduler: str | None, say) -> None:
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        raise ValueError("--scheduler needs dask.distributed: pip install distributed") from None
    with Client(scheduler) as client:
        plan_future = client.scatter(p, broadcast=True)
        futures = [client.submit(_fill_and_write, plan_future, store, i, r, pure=False) for i, r in todo]
        for n, fut in enumerate(as_completed(futures), 1):
            stop_if_pressed()
            fut.result()
            if say and n % max(1, len(futures) // 10) == 0:
                say(f"{n}/{len(futures)} blocks")

def _fill_and_write(p: Plan, store: InfillStore, index: int, region: dict[str, slice]) -> None:
    store.write_block(index, region, *block_values(p, store.filled_in(index), region))
