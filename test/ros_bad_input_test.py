"""sdf_server against bad input: every bad message is rejected whole, every bad request fails
cleanly, bad parameters stop the node with a clear error, and the node keeps serving.

One node process for the catalogue, one short-lived process for the exit code of a bad
configuration, and in-process node construction for the other configuration errors.
"""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import yaml
from geometry_msgs.msg import Point
from rclpy.parameter import Parameter
from shape_msgs.msg import Mesh, MeshTriangle

import reference as ref
import ros_helpers as rh
from robot_sdf.ros.conversions import float32_array, make_mesh_obstacle, make_obstacle_pose
from robot_sdf.ros.parameters import ConfigError
from robot_sdf.ros.sdf_server import SdfServer
from robot_sdf_interfaces.msg import MeshObstacle, ObstaclePose
from robot_sdf_interfaces.srv import EvaluateSphereCost, EvaluateSweptSphereCost, QuerySignedDistance

DOMAIN = rh.domain_id(23)
BOX_V, BOX_T = ref.box((0.4, 0.4, 0.4))
GOOD_POSE = np.array([0.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0])
PARAMS = dict(device="cpu", num_envs=2, max_distance=0.5, activation_distance=0.05,
              max_spheres_per_request=10_000, max_sweep_steps=8, max_points_per_request=1000,
              marker_rate_hz=0.0, slice_rate_hz=0.0, diagnostics_rate_hz=0.0)


class Harness:
    def __init__(self, tmp) -> None:
        self.ros = rh.RosHarness(DOMAIN, "sdf_bad_input")
        self.node = rh.NodeProcess(PARAMS, tmp, DOMAIN)
        try:
            self._connect()
        except BaseException:  # never leave the node process behind
            self.close()
            raise

    def _connect(self) -> None:
        h = self.ros
        self.mesh_pub = h.publisher(MeshObstacle, "/sdf_server/mesh_obstacles", rh.MESH_QOS)
        self.pose_pub = h.publisher(ObstaclePose, "/sdf_server/obstacle_poses")
        self.sphere = h.client(EvaluateSphereCost, "/sdf_server/evaluate_sphere_cost")
        self.swept = h.client(EvaluateSweptSphereCost, "/sdf_server/evaluate_swept_sphere_cost")
        self.sd = h.client(QuerySignedDistance, "/sdf_server/query_signed_distance")
        rh.wait_for_services(self.node, [self.sphere, self.swept, self.sd])
        self.mesh_pub.publish(make_mesh_obstacle("good", BOX_V, BOX_T, GOOD_POSE))
        self.mesh_pub.publish(make_mesh_obstacle("good1", BOX_V, BOX_T, GOOD_POSE, env=1))
        rh.wait_until(lambda: self.revision() == 2, 60.0, what="both good meshes")
        rh.wait_for_matched(self.pose_pub)

    def revision(self) -> int:
        resp = self.ros.call(self.sd, QuerySignedDistance.Request(points=[100.0, 0.0, 0.0]))
        assert resp.success, resp.message
        return resp.world_revision

    def results(self):
        """(sphere cost+grad, swept cost+grad, revision, distances) of a fixed valid query set."""
        spheres = np.zeros((2, 3, 2, 4), np.float32)
        spheres[..., 0] = np.linspace(-0.1, 0.35, 3)[None, :, None]
        spheres[..., 2] = 0.5
        spheres[..., 3] = 0.05
        req = self.cost_request(EvaluateSphereCost.Request(), spheres, env_index=[0, 1])
        r1 = self.ros.call(self.sphere, req)
        req = self.cost_request(EvaluateSweptSphereCost.Request(), spheres, env_index=[1, 0])
        req.sweep_steps, req.speed_dt, req.enable_speed_metric = 4, 0.1, True
        r2 = self.ros.call(self.swept, req)
        q = QuerySignedDistance.Request(points=float32_array(spheres[..., :3].reshape(-1)), env=1)
        r3 = self.ros.call(self.sd, q)
        assert r1.success and r2.success and r3.success, (r1.message, r2.message, r3.message)
        assert r1.world_revision == r2.world_revision == r3.world_revision
        return (np.concatenate([r1.cost, r1.gradient]), np.concatenate([r2.cost, r2.gradient]),
                r1.world_revision, np.concatenate([r3.distance, r3.gradient]))

    @staticmethod
    def cost_request(req, spheres, env_index=(), gradient=True):
        b, h, n, _ = spheres.shape
        req.batch, req.horizon, req.spheres_per_step = b, h, n
        req.spheres = float32_array(spheres.reshape(-1))
        req.env_index = list(env_index)
        req.compute_gradient = gradient
        return req

    def rejections(self) -> list[str]:
        return [line for line in self.node.log().splitlines() if "rejected " in line]

    def close(self) -> int:
        code = self.node.stop()
        self.ros.close()
        return code


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    h = Harness(tmp_path_factory.mktemp("ros_bad_input"))
    try:
        yield h
    finally:
        code = h.close()
        assert code == 0, f"sdf_server exit code {code} after SIGINT:\n{h.node.log()}"


# ------------------------------------------------------------------ bad topic messages


def _add(**kw) -> MeshObstacle:
    args = dict(id="bad", vertices=BOX_V, triangles=BOX_T, pose=GOOD_POSE)
    args.update(kw)
    return make_mesh_obstacle(args.pop("id"), args.pop("vertices"), args.pop("triangles"), **args)


def _with(msg, **fields):
    for k, v in fields.items():
        setattr(msg, k, v)
    return msg


def _nan_vertices():
    v = BOX_V.copy()
    v[3, 1] = np.nan
    return v


def _inf_vertices():
    v = BOX_V.copy()
    v[0, 0] = np.inf
    return v


def _out_of_range_triangles():
    t = BOX_T.copy()
    t[5, 2] = 8
    return t


def _shape_msgs_bad_index():
    msg = make_mesh_obstacle("bad", None, None, GOOD_POSE)
    msg.mesh = Mesh(vertices=[Point(x=float(a), y=float(b), z=float(c)) for a, b, c in BOX_V],
                    triangles=[MeshTriangle(vertex_indices=np.array([0, 1, 99], np.uint32))])
    return msg


def _move(pose, id="good", env=0, **kw):
    return make_mesh_obstacle(id, None, None, pose, env=env, operation=MeshObstacle.MOVE, **kw)


def _op(op, id="ghost", env=0):
    return make_mesh_obstacle(id, None, None, None, env=env, operation=op)


ZERO_Q = np.array([0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0])
NAN_POSE = np.array([0.0, np.nan, 0.5, 1.0, 0.0, 0.0, 0.0])
LONG_Q = np.array([0.0, 0.0, 0.5, 2.0, 0.0, 0.0, 0.0])
HUGE_POSE = np.array([1e39, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0])

BAD_MESSAGES = [
    ("nan vertex", lambda: _add(vertices=_nan_vertices()), "not finite"),
    ("inf vertex", lambda: _add(vertices=_inf_vertices()), "not finite"),
    ("nan vertex replacing a good mesh", lambda: _add(id="good", vertices=_nan_vertices()), "not finite"),
    ("index out of range", lambda: _add(triangles=_out_of_range_triangles()), "out of range"),
    ("shape_msgs index out of range", _shape_msgs_bad_index, "out of range"),
    ("empty mesh", lambda: _add(vertices=None, triangles=None), "empty mesh"),
    ("vertices without triangles", lambda: _add(triangles=None), "at least one triangle"),
    ("triangles without vertices", lambda: _add(vertices=None), "vertices is empty"),
    ("vertices not a multiple of 3", lambda: _with(_add(), vertices=float32_array(BOX_V.reshape(-1)[:-1])),
     "vertices must have shape (V, 3)"),
    ("triangles not a multiple of 3", lambda: _with(_add(), triangles=BOX_T.reshape(-1)[:-2].tolist()),
     "triangles must have shape (T, 3)"),
    ("shape_msgs mesh without triangles", lambda: _with(_shape_msgs_bad_index(), mesh=Mesh(
        vertices=[Point(x=float(a), y=float(b), z=float(c)) for a, b, c in BOX_V])), "at least one triangle"),
    ("degenerate triangles", lambda: _add(vertices=np.zeros((8, 3))), "non-zero area"),
    ("wrong frame", lambda: _add(frame_id="map"), "header.frame_id 'map'"),
    ("empty frame", lambda: _add(frame_id=""), "header.frame_id ''"),
    ("unknown operation", lambda: _add(operation=7), "unknown operation 7"),
    ("empty id", lambda: _add(id=""), "non-empty string"),
    ("empty id (MOVE)", lambda: _move(GOOD_POSE, id=""), "no mesh '' in env 0"),
    ("env out of range (ADD)", lambda: _add(env=2), "env 2 out of range"),
    ("env out of range (MOVE)", lambda: _move(GOOD_POSE, env=5), "env 5 out of range"),
    ("MOVE unknown id", lambda: _move(GOOD_POSE, id="ghost"), "no mesh 'ghost' in env 0"),
    ("REMOVE unknown id", lambda: _op(MeshObstacle.REMOVE), "no mesh 'ghost' in env 0"),
    ("ENABLE unknown id", lambda: _op(MeshObstacle.ENABLE), "no mesh 'ghost' in env 0"),
    ("DISABLE unknown id", lambda: _op(MeshObstacle.DISABLE), "no mesh 'ghost' in env 0"),
    ("REMOVE id of the other env", lambda: _op(MeshObstacle.REMOVE, id="good1", env=0), "no mesh 'good1' in env 0"),
    ("zero quaternion (ADD)", lambda: _add(pose=ZERO_Q), "unit length"),
    ("zero quaternion (MOVE)", lambda: _move(ZERO_Q), "unit length"),
    ("non-unit quaternion (MOVE)", lambda: _move(LONG_Q), "unit length"),
    ("NaN pose (MOVE)", lambda: _move(NAN_POSE), "not finite"),
    ("pose x = 1e39, inf in float32 (ADD)", lambda: _add(pose=HUGE_POSE), "exceeds 1e+06 m"),
    ("pose x = 1e39 (MOVE)", lambda: _move(HUGE_POSE), "exceeds 1e+06 m"),
]

BAD_POSES = [
    ("ObstaclePose unknown id", lambda: make_obstacle_pose("ghost", GOOD_POSE), "no mesh 'ghost' in env 0"),
    ("ObstaclePose NaN", lambda: make_obstacle_pose("good", NAN_POSE), "not finite"),
    ("ObstaclePose zero quaternion", lambda: make_obstacle_pose("good", ZERO_Q), "unit length"),
    ("ObstaclePose wrong frame", lambda: make_obstacle_pose("good", GOOD_POSE, frame_id="base"),
     "header.frame_id 'base'"),
    ("ObstaclePose env out of range", lambda: make_obstacle_pose("good", GOOD_POSE, env=9), "env 9 out of range"),
]


def test_bad_messages_change_nothing(harness):
    assert len(BAD_MESSAGES) + len(BAD_POSES) >= 20
    baseline = harness.results()
    assert baseline[2] == 2 and np.any(baseline[0] > 0)  # the probes do touch the good meshes
    for label, make, reason in BAD_MESSAGES + BAD_POSES:
        before = len(harness.rejections())
        msg = make()
        pub = harness.mesh_pub if isinstance(msg, MeshObstacle) else harness.pose_pub

        def rejected():
            pub.publish(msg)  # ObstaclePose is best effort: repeat until the node saw it
            time.sleep(0.05)
            return len(harness.rejections()) > before

        rh.wait_until(rejected, 60.0, what=f"rejection of '{label}'")
        new = harness.rejections()[before:]
        assert any(reason in line for line in new), f"{label}: expected '{reason}' in {new}"
        after = harness.results()
        assert after[2] == baseline[2], f"{label}: revision moved"
        for a, b in zip(after, baseline):
            np.testing.assert_array_equal(a, b, err_msg=label)


# ------------------------------------------------------------------ bad requests


def _spheres(b=1, h=2, n=3):
    s = np.zeros((b, h, n, 4), np.float32)
    s[..., 3] = 0.05
    return s


def _sphere_req(spheres=None, **fields):
    req = Harness.cost_request(EvaluateSphereCost.Request(), _spheres() if spheres is None else spheres)
    return _with(req, **fields)


def _swept_req(spheres=None, **fields):
    req = Harness.cost_request(EvaluateSweptSphereCost.Request(), _spheres() if spheres is None else spheres)
    req.sweep_steps, req.speed_dt = 2, 0.1
    return _with(req, **fields)


def _nan_spheres():
    s = _spheres()
    s[0, 1, 2, 0] = np.nan
    return s


def _inf_spheres():
    s = _spheres()
    s[0, 0, 0, 3] = np.inf
    return s


def _huge_radius_spheres(radius=3e38):
    s = _spheres()
    s[0, 0, 0, :3] = GOOD_POSE[:3]  # at the centre of the good box
    s[0, 0, 0, 3] = radius
    return s


def _sd_req(points, **fields):
    return _with(QuerySignedDistance.Request(points=float32_array(np.asarray(points, np.float32).reshape(-1))),
                 **fields)


BAD_REQUESTS = [
    ("spheres length mismatch", "sphere", lambda: _sphere_req(batch=2), "expected batch*horizon*spheres_per_step*4"),
    ("spheres one float short", "sphere",
     lambda: _with(_sphere_req(), spheres=float32_array(_spheres().reshape(-1)[:-1])), "expected"),
    ("batch 0", "sphere", lambda: _sphere_req(batch=0), "must be > 0"),
    ("spheres_per_step 0", "sphere", lambda: _sphere_req(spheres_per_step=0), "must be > 0"),
    ("all sizes 0", "sphere", lambda: _with(_sphere_req(), batch=0, horizon=0, spheres_per_step=0,
                                            spheres=float32_array([])), "must be > 0"),
    ("batch 2**31", "sphere", lambda: _sphere_req(batch=2**31), "exceeds max_spheres_per_request"),
    ("uint32 max sizes", "sphere", lambda: _sphere_req(batch=2**32 - 1, horizon=2**32 - 1, spheres_per_step=2**32 - 1),
     "exceeds max_spheres_per_request"),
    ("env_index wrong length", "sphere", lambda: _sphere_req(env_index=[0, 0, 0]),
     "env_index must have one entry per batch row (1), got 3"),
    ("env_index out of range", "sphere", lambda: _sphere_req(env_index=[2]), "env_index values must be in [0, 2)"),
    ("env_index beyond int32", "sphere", lambda: _sphere_req(env_index=[2**32 - 1]), "env_index values must be in"),
    ("NaN in spheres", "sphere", lambda: _sphere_req(_nan_spheres()), "not finite"),
    ("inf radius", "sphere", lambda: _sphere_req(_inf_spheres()), "not finite"),
    ("radius 3e38", "sphere", lambda: _sphere_req(_huge_radius_spheres()), "radius 3e+38 m exceeds the limit"),
    ("weight overflowing the cost", "sphere", lambda: _sphere_req(_huge_radius_spheres(10.0), weight=3e38),
     "not finite in float32"),
    ("NaN activation distance", "sphere", lambda: _sphere_req(activation_distance=float("nan")), "must be finite"),
    ("inf weight", "sphere", lambda: _sphere_req(weight=float("inf")), "must be finite"),
    ("huge sweep_steps", "swept", lambda: _swept_req(sweep_steps=2**31), "exceeds max_sweep_steps"),
    ("sweep_steps just above the limit", "swept", lambda: _swept_req(sweep_steps=9), "exceeds max_sweep_steps"),
    ("speed_dt 0 with speed metric", "swept", lambda: _swept_req(speed_dt=0.0, enable_speed_metric=True),
     "speed_dt must be > 0"),
    ("negative speed_dt with speed metric", "swept", lambda: _swept_req(speed_dt=-0.1, enable_speed_metric=True),
     "speed_dt must be > 0"),
    ("swept NaN spheres", "swept", lambda: _swept_req(_nan_spheres()), "not finite"),
    ("swept env_index out of range", "swept", lambda: _swept_req(env_index=[7]), "env_index values must be in"),
    ("points not a multiple of 3", "sd", lambda: _sd_req(np.zeros(7)), "not a multiple of 3"),
    ("points empty", "sd", lambda: _sd_req([]), "points is empty"),
    ("points env out of range", "sd", lambda: _sd_req(np.zeros(3), env=2), "env 2 out of range"),
    ("NaN point", "sd", lambda: _sd_req([0.0, np.nan, 0.0]), "not finite"),
    ("too many points", "sd", lambda: _sd_req(np.zeros(3 * 1001)), "exceed max_points_per_request"),
    ("NaN max_distance", "sd", lambda: _sd_req(np.zeros(3), max_distance=float("nan")), "must be finite"),
]


def test_bad_requests_fail_cleanly(harness):
    assert len(BAD_REQUESTS) >= 20
    baseline = harness.results()
    clients = {"sphere": harness.sphere, "swept": harness.swept, "sd": harness.sd}
    for label, service, make, reason in BAD_REQUESTS:
        resp = harness.ros.call(clients[service], make())
        assert not resp.success, label
        assert reason in resp.message, f"{label}: {resp.message!r}"
        for field in ("cost", "gradient", "distance"):
            assert len(getattr(resp, field, ())) == 0, f"{label}: {field} not empty"
    after = harness.results()
    for a, b in zip(after, baseline):
        np.testing.assert_array_equal(a, b)
    # the node logged each refusal, and no internal error
    log = harness.node.log()
    assert log.count("rejected request") >= len(BAD_REQUESTS)
    assert "internal error" not in log


def test_defaults_apply_for_non_positive_scalars(harness):
    s = _spheres()
    s[..., 0] = 0.25  # 0.05 outside the +x face: d = r + eta - 0.05 = 0.05 = eta at the defaults
    s[..., 2] = 0.5
    explicit = harness.ros.call(harness.sphere, _sphere_req(s, activation_distance=0.05, weight=1.0))
    for eta, weight in ((0.0, 0.0), (-1.0, -3.0)):
        resp = harness.ros.call(harness.sphere, _sphere_req(s, activation_distance=eta, weight=weight))
        assert resp.success, resp.message
        np.testing.assert_array_equal(resp.cost, explicit.cost)
    np.testing.assert_allclose(np.asarray(explicit.cost), 0.05**2 / (2 * 0.05), rtol=1e-4)
    resp = harness.ros.call(harness.sd, _sd_req([[2.0, 0.0, 0.5]], max_distance=0.0))
    assert resp.distance[0] == pytest.approx(0.5)  # node default max_distance (true distance 1.8)


# ------------------------------------------------------------------ bad configuration


def test_bad_parameters_exit_with_error(tmp_path):
    params = dict(PARAMS, sign_method="bogus", max_distance=-1.0, device="gpu", weight=2)
    proc = subprocess.run(
        [sys.executable, "-m", "robot_sdf.ros.sdf_server", "--ros-args", "--params-file",
         str(rh.write_params(tmp_path / "bad.yaml", params))],
        cwd=rh.REPO, env=rh.ros_env(DOMAIN), capture_output=True, text=True, timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "invalid configuration" in out
    for name in ("sign_method", "max_distance", "device", "weight"):
        assert f"'{name}'" in out, f"{name} not named in: {out}"
    assert "ready:" not in out


@pytest.fixture(scope="module")
def ros_context(harness):
    return harness.ros.context


@pytest.mark.parametrize("overrides, text", [
    ({"scene_file": "/nonexistent/scene.yaml"}, "cannot load scene_file"),
    ({"slice_env": 3}, "slice_env"),
    ({"num_envs": 0}, "num_envs"),
    ({"slice_size": [1.0]}, "slice_size"),
    ({"slice_resolution": 1e-5, "slice_rate_hz": 1.0}, "max_points_per_request"),
    ({"marker_rate_hz": float("nan")}, "marker_rate_hz"),
    ({"world_frame": " "}, "world_frame"),
])
def test_config_errors_in_process(ros_context, overrides, text):
    params = [Parameter(k, value=v) for k, v in dict(PARAMS, **overrides).items()]
    with pytest.raises(ConfigError, match=text.replace("*", r"\*")):
        SdfServer(context=ros_context, namespace="/config_check", parameter_overrides=params)


def test_bad_scene_files(ros_context, tmp_path):
    cases = {
        "frame": ({"frame": "map", "obstacles": []}, "frame 'map'"),
        "env": ({"obstacles": [{"id": "a", "primitive": {"type": "box", "size": [1, 1, 1]}, "env": 5}]},
                "env 5"),
        "mesh": ({"obstacles": [{"id": "a", "mesh": "missing.stl"}]}, "missing.stl"),
    }
    for name, (scene, text) in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(scene))
        params = [Parameter(k, value=v) for k, v in dict(PARAMS, scene_file=str(path)).items()]
        with pytest.raises(ConfigError, match=text):
            SdfServer(context=ros_context, namespace="/config_check", parameter_overrides=params)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_gpu_is_a_config_error(ros_context):
    params = [Parameter(k, value=v) for k, v in dict(PARAMS, device="cuda:0").items()]
    with pytest.raises(ConfigError, match="CUDA"):
        SdfServer(context=ros_context, namespace="/config_check", parameter_overrides=params)


def test_a_stream_of_identical_bad_poses_is_logged_once_per_second(harness):
    before = len(harness.rejections())
    msg = make_obstacle_pose("stream_ghost", GOOD_POSE)
    n = 50
    t0 = time.monotonic()
    for _ in range(n):
        harness.pose_pub.publish(msg)
    # The node handles one topic's messages in order: once a later, different rejection is in the
    # log, every stream_ghost pose that arrived has been handled.
    end = make_obstacle_pose("stream_end", GOOD_POSE)

    def end_seen():
        harness.pose_pub.publish(end)  # best effort: repeat until the node saw it
        time.sleep(0.05)
        return any("stream_end" in line for line in harness.rejections()[before:])

    rh.wait_until(end_seen, 60.0, what="the rejection after the stream")
    elapsed = time.monotonic() - t0
    lines = [line for line in harness.rejections()[before:] if "stream_ghost" in line]
    # Logged lines of one rejection are at least a second apart (the node's clock), and all of
    # them were logged within the `elapsed` seconds measured here: n rejections, not n lines.
    assert 1 <= len(lines) <= 1 + int(elapsed) and len(lines) < n, (elapsed, lines)
