"""A child that changes the pool geometry variables after its first Pool (spawn only).

It imports no test framework, so a spawned child starts quickly.
"""

from __future__ import annotations

import os

from orbitive import Fleet
from orbitive.pool import Pool, _layout
from orbitive.pool._layout import ENV_KEY_CAPACITY, ENV_LANE_CAPACITY

from .._processes import Channel


def _geometry(pool: Pool) -> tuple[int, int]:
    layout = pool._table.layout
    return layout.key_capacity, layout.lane_capacity


def geometry_after_environment_change(channel: Channel, fleet_name: str, capacity: int) -> None:
    """Open pools of kinds 247, 201 and 202, changing the variables between them.

    Sends ``(cached_before, [geometry of each pool], env_geometry() at the end)``.
    """
    cached_before = _layout._env
    os.environ[ENV_KEY_CAPACITY], os.environ[ENV_LANE_CAPACITY] = "64", "32"
    seen = []
    with Fleet.join(fleet_name, capacity) as fleet:
        with Pool(fleet) as first:
            seen.append(_geometry(first))
        os.environ[ENV_KEY_CAPACITY], os.environ[ENV_LANE_CAPACITY] = "128", "16"
        with Pool(fleet, kind=201) as second:
            seen.append(_geometry(second))
        os.environ[ENV_KEY_CAPACITY] = "100"  # not a power of two: refused if it were read
        with Pool(fleet, kind=202) as third:
            seen.append(_geometry(third))
    channel.send((cached_before, seen, _layout.env_geometry()))
