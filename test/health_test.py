"""robot_sdf.ros.health: levels and reasons of the diagnostics status over a moving window."""
from __future__ import annotations

from robot_sdf.ros.health import ERROR, OK, WARN, HealthMonitor


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_ok_without_events():
    level, message, counts = HealthMonitor(clock=Clock()).status()
    assert level == OK and message == "" and set(counts.values()) == {0}


def test_rejections_failures_and_slow_requests_warn_with_their_latest_reason():
    clock = Clock()
    h = HealthMonitor(window_s=10.0, slow_request_s=0.5, clock=clock)
    h.rejected("MeshObstacle ADD 'a' env 0", "header.frame_id 'map' unknown")
    h.rejected("MeshObstacle ADD 'b' env 0", "vertex 3 is not finite")
    h.request_done("evaluate_sphere_cost", 0.2)  # fast: not an event
    level, message, counts = h.status()
    assert level == WARN and counts["rejected_messages"] == 2 and counts["slow_requests"] == 0
    assert message == ("2 rejected messages in the last 10 s (latest: MeshObstacle ADD 'b' env 0: "
                       "vertex 3 is not finite)")
    h.request_failed("query_signed_distance", "points is empty")
    h.request_done("evaluate_swept_sphere_cost", 0.75)
    level, message, counts = h.status()
    assert level == WARN and counts["failed_requests"] == 1 and counts["slow_requests"] == 1
    assert "1 failed request in the last 10 s (latest: query_signed_distance: points is empty)" in message
    assert "1 slow request in the last 10 s (latest: evaluate_swept_sphere_cost: 750.0 ms > 500.0 ms)" in message


def test_internal_errors_are_errors_and_everything_expires_after_the_window():
    clock = Clock()
    h = HealthMonitor(window_s=5.0, slow_request_s=0.0, clock=clock)
    h.request_done("evaluate_sphere_cost", 100.0)  # slow_request_s = 0: never slow
    h.rejected("ObstaclePose 'x' env 0", "no mesh 'x' in env 0")
    clock.t += 3.0
    h.internal_error("evaluate_sphere_cost", "RuntimeError: CUDA error: out of memory")
    level, message, _ = h.status()
    assert level == ERROR and message.startswith("1 internal error in the last 5 s (latest: evaluate_sphere_cost: "
                                                 "RuntimeError: CUDA error: out of memory)")
    clock.t += 2.5  # the rejection is 5.5 s old, the error 2.5 s
    level, _, counts = h.status()
    assert level == ERROR and counts["rejected_messages"] == 0 and counts["internal_errors"] == 1
    clock.t += 3.0
    assert h.status()[0] == OK
    h.window_s = 60.0  # a longer window at run time does not bring back pruned events
    assert h.status()[0] == OK
