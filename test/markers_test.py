"""robot_sdf.ros.markers: mesh markers, the bounding-box stand-in for big meshes, sphere colours."""
from __future__ import annotations

import os

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")

import numpy as np  # noqa: E402
from visualization_msgs.msg import Marker  # noqa: E402

import reference as ref  # noqa: E402
from robot_sdf import MeshWorld  # noqa: E402
from robot_sdf.ros.markers import MarkerState, cost_colors  # noqa: E402


def _points(marker: Marker) -> np.ndarray:
    return np.array([[p.x, p.y, p.z] for p in marker.points])


def _signed_volume(tris: np.ndarray) -> float:
    return float(np.einsum("ij,ij->i", tris[:, 0], np.cross(tris[:, 1], tris[:, 2])).sum() / 6.0)


def test_small_mesh_is_drawn_whole_and_big_mesh_as_its_bounding_box():
    world = MeshWorld(device="cpu")
    bv, bt = ref.box((0.2, 0.4, 0.6))
    sv, st = ref.icosphere(0.5, 3)  # 1280 triangles
    world.add_mesh("box", bv, bt, pose=(1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0))
    world.add_mesh("ball", sv, st, pose=(0.0, 2.0, 0.0, 1.0, 0.0, 0.0, 0.0))
    state = MarkerState(world, 1, "world", lambda: (0, None), max_triangles=1000)
    markers = {m.text: m for m in state.update()}

    box = _points(markers["box"])
    np.testing.assert_allclose(box, bv[bt.reshape(-1)], atol=1e-12)  # mesh frame, all triangles
    assert markers["box"].pose.position.x == 1.0

    ball = _points(markers["ball"]).reshape(-1, 3, 3)
    assert ball.shape == (12, 3, 3)
    lo, hi = sv.min(axis=0), sv.max(axis=0)
    corners = {tuple(c) for c in ball.reshape(-1, 3)}
    assert corners == {(x, y, z) for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])}
    # outward winding: the signed volume of the stand-in is the box volume
    assert np.isclose(_signed_volume(ball), float(np.prod(hi - lo)))
    assert markers["ball"].pose.position.y == 2.0


def test_only_changed_meshes_are_resent_and_a_full_update_resends_all():
    world = MeshWorld(device="cpu")
    bv, bt = ref.box((0.2, 0.2, 0.2))
    world.add_mesh("a", bv, bt)
    world.add_mesh("b", bv, bt, pose=(1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0))
    request = [0, None]
    state = MarkerState(world, 1, "world", lambda: tuple(request))
    assert len(state.update()) == 2
    assert state.update() == [] and state.update(full=True) == []  # nothing changed: nothing to send
    world.set_pose("b", (2.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0))
    (moved,) = state.update()
    assert moved.text == "b" and moved.pose.position.x == 2.0
    world.remove_mesh("a")
    (deleted,) = state.update()
    assert deleted.action == Marker.DELETE
    # a full update carries every mesh and the request spheres, not only what changed
    world.add_mesh("c", bv, bt, pose=(0.0, 3.0, 0.0, 1.0, 0.0, 0.0, 0.0))
    request[:] = [1, (np.array([[0.0, 0.0, 0.0, 0.1]]), np.array([0.5]))]
    full = state.update(full=True)
    assert sorted(m.text for m in full if m.type == Marker.TRIANGLE_LIST) == ["b", "c"]
    assert [m.ns for m in full if m.type == Marker.SPHERE_LIST] == ["request_spheres"]
    # redraw() with a lower triangle limit re-sends every mesh, now as bounding boxes
    state.redraw(max_triangles=12)
    world.set_pose("c", (0.0, 4.0, 0.0, 1.0, 0.0, 0.0, 0.0))
    assert sorted(m.text for m in state.update() if m.type == Marker.TRIANGLE_LIST) == ["b", "c"]


def test_cost_colours_run_green_to_red():
    rgba = cost_colors(np.array([0.0, 1.0, 2.0]))
    np.testing.assert_allclose(rgba[:, :3], [[0, 1, 0], [0.5, 0.5, 0], [1, 0, 0]])


def test_a_mesh_with_a_namespace_of_its_own():
    """The perceived mesh's markers (and its DELETE) carry the namespace given for it; the other
    meshes keep env_<n>."""
    world = MeshWorld(device="cpu")
    bv, bt = ref.box((0.2, 0.2, 0.2))
    world.add_mesh("perceived", bv, bt)
    world.add_mesh("box", bv, bt, pose=(1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0))
    state = MarkerState(world, 1, "world", lambda: (0, None), namespaces={(0, "perceived"): "perceived"})
    assert {m.text: m.ns for m in state.update()} == {"perceived": "perceived", "box": "env_0"}
    world.remove_mesh("perceived")
    deleted = [m for m in state.update() if m.action == Marker.DELETE]
    assert [m.ns for m in deleted] == ["perceived"]
