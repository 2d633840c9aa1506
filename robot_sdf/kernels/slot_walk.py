"""The slots of an environment: which a query visits, their poses and per-slot sign methods.

A query (a sphere, a swept step, a Hessian) visits the slots of its environment whose meshes may
hold a surface or inside point within its reach: through the environment's slot BVH where it has
one (robot_sdf.slot_index), else every slot in use. The loop over them is written once::

    slots = env_slots(env, p, reach, world)
    for i in range(slots.iterations):
        slot, q, p_mesh = slot_at(slots, i, env, p, world)
        if slot < 0:
            continue
        ...  # p_mesh = p in the slot's mesh frame; q rotates world vectors into it

The query kernels take the world as one argument, the World struct below: the world's tensors
and the call's sign selection, built once per set of world tensors on the host
(robot_sdf.world_args). Its fields (flattened from the torch tensors of docs/design.md "Tensor
layouts"):
    mesh_idx     (E, M) int64 Warp mesh ids
    pose_inv     (E, M, 8)    world->mesh x, y, z, qw, qx, qy, qz, cull radius (0 = unknown): no
                              surface and no inside point farther than it from the mesh origin
    mesh_enable  (E, M) uint8
    n_env_mesh   (E,) int32   slots in use per environment
    slot_bvh     (E + 1,) uint64  Warp BVH id over each environment's slot boxes (0 = visit every
                              slot), a placeholder BVH last (robot_sdf.slot_index); any other
                              length: every slot of every environment is visited
    sign_method  int          a SignMethod for every slot, AUTO (each mesh's own, from its sign
                              data), or PER_SLOT: read slot_sign
    slot_sign    (E, M) uint8 per-slot SignMethod, read when sign_method is PER_SLOT
What changes from call to call (the spheres, the environment of each batch row, the outputs)
stays outside it, as the kernels' own arguments.
"""
from __future__ import annotations

import warp as wp

from robot_sdf.kernels.mesh_queries import SLOT_HITS, slot_bvh_hits, slot_hits_t, spheres_per_thread
from robot_sdf.kernels.sign_data import SIGN_PER_SLOT
from robot_sdf.kernels.signed_distance import widened

wp.set_module_options({"enable_backward": False})


@wp.struct
class World:
    """The world as the query kernels read it: its tensors and the call's sign selection (layouts
    in the module docstring)."""

    mesh_idx: wp.array2d(dtype=wp.int64)
    pose_inv: wp.array3d(dtype=wp.float32)
    mesh_enable: wp.array2d(dtype=wp.uint8)
    n_env_mesh: wp.array(dtype=wp.int32)
    sign_method: int
    slot_sign: wp.array2d(dtype=wp.uint8)
    slot_bvh: wp.array(dtype=wp.uint64)


@wp.func
def slot_pose(pose_inv: wp.array3d(dtype=wp.float32), env: int, slot: int):
    """(t, q) of the slot's world->mesh transform: p_mesh = wp.quat_rotate(q, p) + t."""
    t = wp.vec3(pose_inv[env, slot, 0], pose_inv[env, slot, 1], pose_inv[env, slot, 2])
    # wp.quat stores x, y, z, w; the tensor layout is w, x, y, z.
    q = wp.quat(pose_inv[env, slot, 4], pose_inv[env, slot, 5], pose_inv[env, slot, 6], pose_inv[env, slot, 3])
    return t, q


@wp.func
def env_slot_bvh(slot_bvh: wp.array(dtype=wp.uint64), env: int, n_envs: int):
    """(BVH id, 1) of env's slot BVH (robot_sdf.slot_index), or (the never-matching placeholder
    BVH, 0) where the env has none: then its slots are visited one by one.

    slot_bvh is (n_envs + 1,): one id per environment (0 = none) and the placeholder last; any
    other length (the one-element placeholder of calls without a MeshWorld) means no env has one.
    """
    n = slot_bvh.shape[0]
    if n == n_envs + 1:
        bvh = slot_bvh[env]
        if bvh != wp.uint64(0):
            return bvh, 1
    return slot_bvh[n - 1], 0


@wp.struct
class EnvSlots:
    """The slots of one environment that a query around a point visits (env_slots)."""

    hits: slot_hits_t  # the slots, where listed
    listed: int  # 1: iteration i visits slot hits[i]; 0: slot i
    iterations: int
    count: int  # slots in use in the environment
    reach: float  # the query's reach (m), a relative 1e-5 wider (slot_at)


@wp.func
def env_slots(env: int, p: wp.vec3, reach: float, world: World) -> EnvSlots:
    """The slots of env a query at world point p visits: those whose boxes come within ``reach``
    (m) of p when env has a slot BVH and at most SLOT_HITS of them do, else every slot in use. A
    negative reach (a negative max_dist) counts as 0: inside points are within any."""
    reach_0 = wp.max(reach, 0.0)
    slots = EnvSlots()
    slots.reach = widened(reach_0)
    slots.count = wp.min(world.n_env_mesh[env], world.mesh_idx.shape[1])
    slots.iterations = slots.count
    slots.listed = 0
    bvh, use_bvh = env_slot_bvh(world.slot_bvh, env, world.n_env_mesh.shape[0])
    if use_bvh != 0:
        box = wp.vec3(reach_0, reach_0, reach_0)
        hits = slot_bvh_hits(bvh, p - box, p + box)
        if hits[32] <= SLOT_HITS:
            slots.hits = hits
            slots.iterations = hits[32]
            slots.listed = 1
    return slots


@wp.func
def slot_at(slots: EnvSlots, i: int, env: int, p: wp.vec3, world: World):
    """(slot, q, p_mesh) of iteration i of a loop over env_slots: the slot, or -1 where there is
    nothing to evaluate (beyond the env's count, disabled, empty, or its cull sphere farther from
    p than the query's reach); the rotation of its world->mesh transform; world point p in its
    mesh frame."""
    slot = i
    if slots.listed != 0:
        slot = slots.hits[i]
    if slot >= slots.count:
        return -1, wp.quat_identity(), p
    if world.mesh_enable[env, slot] == wp.uint8(0) or world.mesh_idx[env, slot] == wp.int64(0):
        return -1, wp.quat_identity(), p
    t, q = slot_pose(world.pose_inv, env, slot)
    p_mesh = wp.quat_rotate(q, p) + t
    cull_radius = world.pose_inv[env, slot, 7]
    if cull_radius > 0.0 and wp.length(p_mesh) > cull_radius + slots.reach:
        return -1, q, p_mesh
    return slot, q, p_mesh


@wp.func
def slot_sign_method(world: World, env: int, slot: int) -> int:
    """The call's sign method, or the slot's own when the call defers to the world (PER_SLOT)."""
    if world.sign_method == SIGN_PER_SLOT:
        return int(world.slot_sign[env, slot])
    return world.sign_method


@wp.func
def thread_spheres(thread: int, start: int, total: int):
    """(first, end) of the spheres thread ``thread`` of a query kernel handles: spheres_per_thread()
    consecutive ones from start + thread * spheres_per_thread(), none at or beyond ``total``."""
    first = start + thread * spheres_per_thread()
    return first, wp.min(first + spheres_per_thread(), total)


@wp.func
def query_env(
    tid: int, spheres_per_batch: int, use_env_query: int, env_query: wp.array(dtype=wp.int32), n_envs: int
) -> int:
    """Environment of sphere ``tid``: env_query (B,) int32 at its batch row (B = spheres /
    spheres_per_batch) when use_env_query != 0, else 0; -1 outside [0, n_envs) (cost 0)."""
    env = int(0)
    if use_env_query != 0:
        env = env_query[tid / spheres_per_batch]
    if env < 0 or env >= n_envs:
        return -1
    return env


@wp.kernel(module="robot_sdf.kernels")  # the package's one Warp module (see there)
def slot_boxes_kernel(
    pose_inv: wp.array3d(dtype=wp.float32),
    envs: wp.array(dtype=wp.int32),
    lowers: wp.array2d(dtype=wp.vec3),
    uppers: wp.array2d(dtype=wp.vec3),
):
    """World-space box of slot j of environment envs[i] (one launch for every changed env): the
    cube around the mesh origin's world position with half-size the slot's cull radius
    (pose_inv[..., 7]; no surface and no inside point lies beyond it), so a rotation never changes
    its size and a pose change needs a refit only."""
    i, j = wp.tid()
    env = envs[i]
    t, q = slot_pose(pose_inv, env, j)
    # p_mesh = q p + t = 0 at the mesh origin.
    centre = -wp.quat_rotate_inv(q, t)
    r = pose_inv[env, j, 7]
    half = wp.vec3(r, r, r)
    lowers[env, j] = centre - half
    uppers[env, j] = centre + half
