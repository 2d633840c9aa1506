"""The winding repair of a mesh at add: each edge-connected patch of triangles oriented
consistently, closed patches outward unless they are cavities or nested bodies (numpy, float64).

MeshWorld repairs the private copy it stores, adopt_meshes the twin it builds; the caller's
arrays are never changed (docs/sign_methods.md).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from robot_sdf.mesh_topology import (GIL_CHUNK, connected_components, edge_keys, sorted_unique, surface_facts, weld,
                                     winding_numbers)


@dataclass
class OrientationRepair:
    """What orient_components changed in a mesh's winding (reported by mesh_info "orientation")."""

    components: int              # edge-connected patches of non-flat triangles
    closed_components: int       # of which closed (every edge twice, consistently orientable)
    non_orientable: int          # patches whose triangles cannot all agree (left as they were)
    components_reversed: int     # closed patches turned outward as a whole (inside out before)
    faces_reversed: int          # triangles whose winding was reversed in total
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"components": self.components, "closed_components": self.closed_components,
                "non_orientable": self.non_orientable, "components_reversed": self.components_reversed,
                "faces_reversed": self.faces_reversed, "seconds": self.seconds}


def orient_components(vertices: np.ndarray, triangles: np.ndarray, welded: np.ndarray | None = None,
                      facts: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, OrientationRepair]:
    """Consistent winding per edge-connected patch, closed patches outward.

    ``vertices`` (V,3) m (any frame), ``triangles`` (T,3): returns the (T,3) int32 triangles
    with some rows reversed (a new array; ``triangles`` itself is not changed) and what changed.
    ``facts``: surface_facts of the mesh, when already known (they do not depend on winding).

    Patches: non-flat triangles joined across welded edges that exactly two triangles use. In a
    patch, orientation propagates across those edges (a two-colouring of the triangle graph,
    vectorised as connected components of the graph doubled into "kept"/"reversed" copies of
    each triangle); a patch whose two copies connect cannot be oriented (Moebius-like, or
    conflicting across non-manifold edges) and is left as it was. Then:
    - a closed patch (every edge of it used twice, in opposite directions once oriented) faces
      outward (positive volume), unless another closed patch, or the rest of the mesh as given
      (closed or not), encloses it (the six extreme vertices of its box inside): an enclosed
      patch is a cavity or a nested body, which its winding tells, and keeps the orientation
      of the majority (by area) of its triangles;
    - an open patch keeps the orientation of the majority (by area) of its triangles.
    Flat triangles are left as they are.
    """
    t0 = time.perf_counter()
    v64 = np.asarray(vertices, np.float64).reshape(-1, 3)
    tri = np.asarray(triangles, np.int64).reshape(-1, 3)
    w = weld(vertices) if welded is None else welded
    wt = w[tri]
    flat, area2_all = surface_facts(v64, tri, wt) if facts is None else facts
    good = np.flatnonzero(~flat)
    out = np.array(tri, np.int32, copy=True)
    n_good = good.shape[0]
    if n_good == 0:
        return out, OrientationRepair(0, 0, 0, 0, 0, time.perf_counter() - t0)
    gw = wt[good]
    keys = edge_keys(gw, w.shape[0]).reshape(-1)  # incidence 3 g + k
    forward = (gw < np.roll(gw, -1, axis=1)).reshape(-1)
    perm = np.argsort(keys, kind="stable")
    sk = keys[perm]
    starts = np.empty(sk.shape[0], bool)
    starts[0] = True
    starts[1:] = sk[1:] != sk[:-1]
    begin = np.flatnonzero(starts)
    counts = np.diff(np.append(begin, sk.shape[0]))
    pair = begin[counts == 2]
    i1, i2 = perm[pair], perm[pair + 1]
    f1, f2 = i1 // 3, i2 // 3
    differ = forward[i1] == forward[i2]  # same direction: exactly one of the two must turn
    g = np.int64(n_good)
    links = np.concatenate([
        np.stack([f1, np.where(differ, f2 + g, f2)], axis=1),
        np.stack([f1 + g, np.where(differ, f2, f2 + g)], axis=1)])
    label = connected_components(2 * n_good, links)
    keep_label, turn_label = label[:n_good], label[n_good:]
    orientable = keep_label != turn_label
    patch = np.minimum(keep_label, turn_label)  # the same for both copies of a patch
    patch_ids, patch_of = sorted_unique(patch, return_inverse=True)
    n_patches = patch_ids.shape[0]
    patch_ok = np.bincount(patch_of, weights=(~orientable).astype(np.float64), minlength=n_patches) == 0
    # Relative orientation: reversed against the patch's lowest copy.
    rel = keep_label != patch
    # Closed: every edge of the patch has exactly two triangles, which the patch links and, if
    # it is orientable, winds oppositely once oriented (an edge shared by more triangles opens it).
    edge_count = np.empty(sk.shape[0], np.int64)
    edge_count[perm] = np.repeat(counts, counts)
    bad_face = np.any((edge_count != 2).reshape(-1, 3), axis=1)
    patch_open = np.bincount(patch_of, weights=bad_face.astype(np.float64), minlength=n_patches) > 0
    closed = patch_ok & ~patch_open
    # Volume (relative orientation) and area per orientation, per patch.
    a, b, c = (v64[tri[good, k]] for k in range(3))
    centre = 0.5 * (v64.min(axis=0) + v64.max(axis=0))
    vol = np.einsum("ij,ij->i", a - centre, np.cross(b - centre, c - centre)) / 6.0
    area2 = area2_all[good]
    volume = np.bincount(patch_of, weights=np.where(rel, -vol, vol), minlength=n_patches)
    area_rel = np.bincount(patch_of, weights=np.where(rel, area2, 0.0), minlength=n_patches)
    area_all = np.bincount(patch_of, weights=area2, minlength=n_patches)
    majority_turn = area_rel > 0.5 * area_all  # most of the area is on the reversed side: keep that
    outward_turn = volume < 0.0
    turn_patch = majority_turn.copy()
    candidates = np.flatnonzero(closed & (outward_turn != majority_turn))
    if candidates.size:
        consistent = np.where(rel[:, None], tri[good][:, ::-1], tri[good])  # (G,3) each patch consistent
        by_patch = np.argsort(patch_of, kind="stable")
        first = np.searchsorted(patch_of[by_patch], np.arange(n_patches))
        corner_lo = v64[consistent].min(axis=1)[by_patch]
        corner_hi = v64[consistent].max(axis=1)[by_patch]
        box_lo = np.minimum.reduceat(corner_lo, first, axis=0)
        box_hi = np.maximum.reduceat(corner_hi, first, axis=0)
        for p in candidates:
            holders = np.flatnonzero(closed & np.all(box_lo <= box_lo[p], axis=1) & np.all(box_hi >= box_hi[p], axis=1))
            if not (_enclosed(p, holders[holders != p], patch_of, v64, consistent)
                    or _enclosed_by_the_rest(p, patch_of, v64, tri[good])):
                turn_patch[p] = outward_turn[p]
    flip = np.zeros(tri.shape[0], bool)
    flip[good] = np.where(patch_ok[patch_of], rel != turn_patch[patch_of], False)
    out[flip] = out[flip][:, ::-1]
    reversed_whole = int(np.count_nonzero(closed & (turn_patch != majority_turn)))
    return out, OrientationRepair(int(n_patches), int(np.count_nonzero(closed)), int(np.count_nonzero(~patch_ok)),
                                  reversed_whole, int(np.count_nonzero(flip)), time.perf_counter() - t0)


def _extreme_vertices(p: int, patch_of: np.ndarray, v64: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """The six extreme vertices (6,3) of patch ``p`` (on its convex hull): lowest and highest in x, y, z."""
    mine = v64[triangles[patch_of == p]].reshape(-1, 3)
    return mine[np.concatenate([mine.argmin(axis=0), mine.argmax(axis=0)])]


def _all_inside(points: np.ndarray, corners: np.ndarray) -> bool:
    """Whether the triangles ``corners`` (T,3,3) have |winding number| > 1/2 at every one of ``points``."""
    winding = sum(winding_numbers(points, corners[i:i + GIL_CHUNK]) for i in range(0, corners.shape[0], GIL_CHUNK))
    return bool(np.all(np.abs(winding) > 0.5))


def _enclosed_by_the_rest(p: int, patch_of: np.ndarray, v64: np.ndarray, given: np.ndarray) -> bool:
    """Whether the rest of the mesh as given (every other patch, ``given`` (G,3) the non-flat
    triangles in their given winding), closed or not, encloses patch ``p``: its winding number is
    above 1/2 in magnitude at p's six extreme vertices. A cavity inside an outer surface that is
    not one closed patch (edges used four times, cracks: CAD exports) stays a cavity."""
    others = given[patch_of != p]
    if others.shape[0] == 0:
        return False
    return _all_inside(_extreme_vertices(p, patch_of, v64, given), v64[others])


def _enclosed(p: int, holders: np.ndarray, patch_of: np.ndarray, v64: np.ndarray, consistent: np.ndarray) -> bool:
    """Whether one of the closed patches ``holders`` (whose boxes hold p's box) encloses patch
    ``p``: the six extreme vertices of p (on p's convex hull) inside it (|winding number| > 0.5
    of its consistently wound triangles ``consistent`` (G,3), whatever their orientation)."""
    if holders.size == 0:
        return False
    extremes = _extreme_vertices(p, patch_of, v64, consistent)
    return any(_all_inside(extremes, v64[consistent[patch_of == q]]) for q in holders)
