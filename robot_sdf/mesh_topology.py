"""Facts of a triangle soup that every build-time analysis shares (numpy, float64): welded
vertices, undirected edge keys, face normals and areas, flat triangles, connected components and
generalised winding numbers.

The numpy helpers here replace calls that hold the GIL for long on million-element arrays
(np.unique's hash-table path, ufunc.at): the node's query threads keep running while a mesh is
analysed (docs/reliability.md). Used by the sign data (mesh_analysis), the auto choice
(mesh_classification) and the orientation repair (mesh_orientation).
"""
from __future__ import annotations

import numpy as np

FLAT_RATIO = 1e-6  # 2 * area / longest edge^2 (= height / longest edge) of a flat triangle
# Elements per np.minimum.at call (scatter_min); the winding-number sums of the classification
# and of the orientation repair go in blocks of about this size too, letting the GIL go between.
GIL_CHUNK = 1 << 16


def weld(vertices: np.ndarray) -> np.ndarray:
    """(V,) index of the first vertex at the same exact position: soups (STL) share no indices,
    but their corners do share bit-identical coordinates."""
    # Rows compared by their float32 bits (+0.0 folds -0.0 into 0.0, as a float comparison
    # would). A stable lexsort instead of np.unique(axis=0): that one sorts a structured dtype
    # while holding the GIL (1.8 s for 500k vertices), which stalls the node's query threads.
    bits = (np.ascontiguousarray(vertices, np.float32).reshape(-1, 3) + np.float32(0.0)).view(np.uint32)
    n = bits.shape[0]
    if n == 0:
        return np.zeros(0, np.int64)
    order = np.lexsort((bits[:, 2], bits[:, 1], bits[:, 0]))
    rows = bits[order]
    starts = np.empty(n, bool)
    starts[0] = True
    starts[1:] = np.any(rows[1:] != rows[:-1], axis=1)
    group = np.cumsum(starts.astype(np.int64)) - 1
    out = np.empty(n, np.int64)
    out[order] = order[starts][group]  # stable sort: the group's first entry is its lowest index
    return out


def sorted_unique(x: np.ndarray, return_index: bool = False, return_inverse: bool = False,
                  return_counts: bool = False):
    """np.unique of a 1-D integer array (sorted values, first indices, inverse, counts) built
    from operations that release the GIL: numpy's own hash-table path and its cumulative sum
    of a bool mask hold it for hundreds of ms on million-element arrays, stalling queries
    answered meanwhile by other threads of the node."""
    x = np.asarray(x).reshape(-1)
    perm = np.argsort(x, kind="stable")
    aux = x[perm]
    starts = np.empty(aux.shape[0], bool)
    starts[:1] = True
    starts[1:] = aux[1:] != aux[:-1]
    out = [aux[starts]]
    if return_index:
        out.append(perm[starts])
    if return_inverse:
        inverse = np.empty(x.shape[0], np.int64)
        inverse[perm] = np.cumsum(starts.astype(np.int64)) - 1
        out.append(inverse)
    if return_counts:
        begin = np.flatnonzero(starts)
        out.append(np.diff(np.append(begin, aux.shape[0])))
    return out[0] if len(out) == 1 else tuple(out)


def face_normals(v64: np.ndarray, tri: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unit normals (T,3) (zero for degenerate triangles) and twice the areas (T,)."""
    a, b, c = v64[tri[:, 0]], v64[tri[:, 1]], v64[tri[:, 2]]
    n = np.cross(b - a, c - a)
    area2 = np.linalg.norm(n, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        unit = np.where(area2[:, None] > 0.0, n / area2[:, None], 0.0)
    return unit, area2


def edge_keys(welded_tri: np.ndarray, n_vertices: int) -> np.ndarray:
    """(T,3) undirected key of edge k (corners k, k+1) of each triangle."""
    lo = np.minimum(welded_tri, np.roll(welded_tri, -1, axis=1))
    hi = np.maximum(welded_tri, np.roll(welded_tri, -1, axis=1))
    return lo * np.int64(n_vertices) + hi


def scatter_min(target: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """target[index] = min(target[index], values), repeated indices included (np.minimum.at in
    chunks: ufunc.at holds the GIL for its whole run, ~100 ms per million elements, while the
    Python loop between chunks lets the node's query threads in)."""
    for start in range(0, index.shape[0], GIL_CHUNK):
        np.minimum.at(target, index[start:start + GIL_CHUNK], values[start:start + GIL_CHUNK])


def connected_components(n_vertices: int, edges: np.ndarray) -> np.ndarray:
    """Connected-component label per vertex (union-find by repeated min-label propagation with
    pointer jumping, vectorised)."""
    label = np.arange(n_vertices, dtype=np.int64)
    if edges.size == 0:
        return label
    u, v = edges[:, 0], edges[:, 1]
    while True:
        lu, lv = label[u], label[v]
        m = np.minimum(lu, lv)
        before = label.copy()
        scatter_min(label, lu, m)
        scatter_min(label, lv, m)
        # Pointer jumping: follow labels to their roots.
        while True:
            jumped = label[label]
            if np.array_equal(jumped, label):
                break
            label = jumped
        if np.array_equal(before, label):
            return label


def surface_facts(v64: np.ndarray, tri: np.ndarray, wt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(flat (T,) bool, twice the areas (T,) float64) of the triangles ``tri`` (T,3) of the
    float64 vertices ``v64``, ``wt`` their welded corners. Flat triangles have no surface (a
    repeated welded corner, or collinear corners up to float32 rounding: height below
    FLAT_RATIO of the longest edge): they neither open nor close a mesh."""
    repeated = (wt[:, 0] == wt[:, 1]) | (wt[:, 1] == wt[:, 2]) | (wt[:, 2] == wt[:, 0])
    _, area2 = face_normals(v64, tri)
    corners = v64[tri]
    longest2 = np.max(((corners - np.roll(corners, 1, axis=1)) ** 2).sum(axis=2), axis=1)
    return repeated | (area2 <= FLAT_RATIO * longest2), area2


def winding_numbers(points: np.ndarray, corners: np.ndarray) -> np.ndarray:
    """Generalised winding number (P,) of the triangles ``corners`` (T,3,3) at ``points`` (P,3)
    (Van Oosterom & Strackee solid angles, float64)."""
    a = corners[None, :, 0, :] - points[:, None, :]
    b = corners[None, :, 1, :] - points[:, None, :]
    c = corners[None, :, 2, :] - points[:, None, :]
    la, lb, lc = (np.linalg.norm(x, axis=2) for x in (a, b, c))
    det = np.einsum("ptk,ptk->pt", a, np.cross(b, c))
    den = (la * lb * lc + np.einsum("ptk,ptk->pt", a, b) * lc + np.einsum("ptk,ptk->pt", b, c) * la
           + np.einsum("ptk,ptk->pt", c, a) * lb)
    return (2.0 * np.arctan2(det, den)).sum(axis=1) / (4.0 * np.pi)

