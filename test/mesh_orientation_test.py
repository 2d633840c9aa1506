"""The winding repair at add (mesh_orientation.orient_components): parts restored as built,
cavities kept, and MeshWorld's signs the exact winding number's of the mesh as given."""
import numpy as np

import reference as ref
from robot_sdf import mesh_orientation


def _signed_volume(v, t) -> float:
    a, b, c = (np.asarray(v, np.float64)[np.asarray(t)[:, k]] for k in range(3))
    return float(np.einsum("ij,ij->i", a, np.cross(b, c)).sum() / 6.0)


def _directed_edges_once(t) -> bool:
    """Every directed edge used at most once: consistent winding (a plain set, no numpy)."""
    seen = set()
    for a, b, c in np.asarray(t).tolist():
        for e in ((a, b), (b, c), (c, a)):
            if e in seen:
                return False
            seen.add(e)
    return True


def test_orient_components_restores_every_part():
    """Three separate closed parts (one inverted, one with 40 % of its triangles flipped, one
    clean), a hollow (outer box with an inward cavity, both flipped in part) and an open sheet
    with a minority flipped: each part comes back as built, counted per part."""
    import mesh_corpus as corpus

    rng = np.random.default_rng(9)
    parts = [corpus._moved(ref.icosphere(0.1, 2), (1.0, 0, 0)), corpus._moved(corpus.capsule(), (0, 1.0, 0)),
             corpus._moved(ref.box((0.2, 0.3, 0.1)), (0, 0, 1.0)),
             ref.box((0.4, 0.4, 0.4)), corpus.inside_out(ref.box((0.2, 0.2, 0.2))),
             corpus._moved(ref.sheet(0.3, 6), (-1.0, 0, 0))]
    v, want = corpus._merge(*parts)
    sizes = np.cumsum([0] + [len(p[1]) for p in parts])
    damaged = want.copy()
    damaged[sizes[0]:sizes[1]] = damaged[sizes[0]:sizes[1], ::-1]  # inverted
    for k, share in ((1, 0.4), (3, 0.25), (4, 0.25), (5, 0.2)):
        rows = sizes[k] + rng.choice(sizes[k + 1] - sizes[k], int(share * (sizes[k + 1] - sizes[k])), replace=False)
        damaged[rows] = damaged[rows, ::-1]
    out, rep = mesh_orientation.orient_components(v.astype(np.float32), damaged)
    np.testing.assert_array_equal(out, want)
    assert rep.components == 6 and rep.closed_components == 5 and rep.non_orientable == 0
    assert rep.components_reversed == 1
    assert rep.faces_reversed == int(np.count_nonzero(np.any(damaged != want, axis=1)))
    assert _directed_edges_once(out)
    for k in range(5):
        part = out[sizes[k]:sizes[k + 1]]
        assert (_signed_volume(v, part) > 0) == (k != 4)  # the cavity stays inward
    # already consistent and outward: nothing to do, same array content
    again, rep2 = mesh_orientation.orient_components(v.astype(np.float32), want)
    np.testing.assert_array_equal(again, want)
    assert rep2.faces_reversed == 0 and rep2.components_reversed == 0


def test_cavity_inside_an_open_outer_surface_stays_a_cavity():
    """An inward-wound closed box (a cavity) inside a box whose top face is missing (open, as
    CAD outer surfaces with cracks are): the repair keeps the cavity as given, the winding number
    there stays 5/6 - 1 < 1/2 (outside), and MeshWorld's signs are the exact winding number's of
    the mesh as given. Turned outward (what the repair did before) it would read 5/6 + 1: a
    hollow made solid."""
    import torch

    from robot_sdf import MeshWorld

    outer_v, outer_t = ref.box((1.0, 1.0, 1.0))
    top = np.all(outer_v[outer_t][:, :, 2] > 0.49, axis=1)
    outer_t = outer_t[~top]
    cavity_v, cavity_t = ref.box((0.3, 0.3, 0.3))
    v = np.concatenate([outer_v, cavity_v])
    t = np.concatenate([outer_t, cavity_t[:, ::-1] + len(outer_v)])
    oriented, repair = mesh_orientation.orient_components(v, t)
    np.testing.assert_array_equal(oriented[len(outer_t):], t[len(outer_t):])
    assert repair.components_reversed == 0
    centre = np.zeros((1, 3))
    assert ref.winding_number(centre, v, t)[0] < 0.0
    rng = np.random.default_rng(9)
    pts = np.concatenate([rng.uniform(-0.14, 0.14, (200, 3)), rng.uniform(-0.45, 0.45, (400, 3))])
    w = ref.winding_number(pts, v, t)
    d = ref.unsigned_distance(pts, v, t)
    far = d > 1e-3
    world = MeshWorld(device="cpu", max_distance=2.0)
    world.add_mesh("shell", v, t)
    sd, _ = world.signed_distance(torch.from_numpy(pts.astype(np.float32)), max_distance=2.0)
    sd = sd.numpy()
    assert np.sum(far & (np.abs(pts).max(axis=1) < 0.14)) >= 100  # in the cavity, outside
    np.testing.assert_array_equal(sd[far] < 0, w[far] > 0.5)
