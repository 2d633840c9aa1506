"""reserve_domain_id: processes side by side on one machine never get the same ROS domain id."""
from __future__ import annotations

import subprocess
import sys

from robot_sdf.ros.server_process import DOMAIN_COUNT, reserve_domain_id

_CHILD = "from robot_sdf.ros.server_process import reserve_domain_id as r; import sys; print(r(int(sys.argv[1])))"


def _reserve_in_child(preferred: int) -> int:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(preferred)], capture_output=True, text=True,
                         timeout=60, check=True)
    return int(out.stdout)


def test_a_reserved_id_is_not_given_to_another_process_nor_twice_in_one():
    mine = reserve_domain_id(42)
    assert 1 <= mine <= DOMAIN_COUNT
    again = reserve_domain_id(mine)
    assert again != mine and 1 <= again <= DOMAIN_COUNT
    # a process started later that prefers the same id gets another one while this one holds it
    # (and the child's own lock goes with it when it exits)
    for preferred in (mine, again):
        other = _reserve_in_child(preferred)
        assert other not in (mine, again) and 1 <= other <= DOMAIN_COUNT
