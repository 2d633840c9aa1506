"""A robot from its URDF: joint configurations -> world-frame collision spheres, differentiable.

    from robot_sdf.robot import RobotModel
    robot = RobotModel("panda.urdf", "panda_spheres.yaml", device=world.device,
                       locked_joints={"panda_finger_joint1": 0.04})
    q = torch.zeros(b, h, robot.dof, requires_grad=True)      # rad (revolute), m (prismatic)
    spheres = robot.spheres(q, base_pose=None)                 # (b, h, n, 4) x, y, z, r [m]
    world.swept_sphere_cost(spheres).sum().backward()           # -> q.grad

URDF parsing and forward kinematics are pytorch_kinematics' (its URDF parser and its batched
chain with an analytical Jacobian backward); this module only places the spheres of the sphere
file (centre in the link frame, radius) on the link frames and the base pose.

Sphere file (YAML, written by ``fit_spheres``, hand-editable)::

    spheres:                      # link name -> list of spheres in that link's frame
      panda_link1:
        - {centre: [0.0, -0.03, -0.12], radius: 0.062}   # m
        - {centre: [0.0, 0.0, -0.02], radius: 0.06}
      panda_hand: []              # a link may have none; links not listed have none
    # everything else (robot:, urdf:, fit:) is information and ignored when loading

Self-collision: ``RobotModel.self_collision_pairs`` and ``self_collision_cost`` (pure torch).
Mesh and geometry helpers (``link_geometry``) serve the sphere fitting tool and the plots. No
ROS import here: ``package://`` URIs resolve from an explicit map, the URDF's ancestors or
ROS_PACKAGE_PATH / AMENT_PREFIX_PATH.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
import torch
import yaml

from robot_sdf import io

POSE_SIZE = 7  # x, y, z, qw, qx, qy, qz


# ----------------------------------------------------------------------------- sphere files


def _sphere_rows(link: str, entries, where: str) -> np.ndarray:
    if entries is None:
        return np.zeros((0, 4))
    if not isinstance(entries, list):
        raise ValueError(f"{where}: spheres of link {link!r} must be a list, got {type(entries).__name__}")
    rows = []
    for i, e in enumerate(entries):
        what = f"{where}: link {link!r} sphere {i}"
        if isinstance(e, dict):
            unknown = set(e) - {"centre", "center", "radius"}
            if unknown:
                raise ValueError(f"{what}: unknown keys {sorted(unknown)} (expected centre, radius)")
            centre = e.get("centre", e.get("center"))
            radius = e.get("radius")
        elif isinstance(e, (list, tuple)) and len(e) == 4:
            centre, radius = e[:3], e[3]
        else:
            raise ValueError(f"{what}: expected {{centre: [x, y, z], radius: r}}, got {e!r}")
        try:
            c = np.asarray(centre, dtype=np.float64).reshape(-1)
            r = float(radius)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{what}: centre must be three numbers and radius a number ({exc})") from None
        if c.shape != (3,) or not np.isfinite(c).all():
            raise ValueError(f"{what}: centre must be three finite numbers, got {centre!r}")
        if not (np.isfinite(r) and r > 0):
            raise ValueError(f"{what}: radius must be a positive number of metres, got {radius!r}")
        rows.append([*c, r])
    return np.asarray(rows, dtype=np.float64).reshape(-1, 4)


def load_spheres(source: str | Path | Mapping) -> dict[str, np.ndarray]:
    """Link name -> (k, 4) float64 spheres (centre x, y, z in the link frame [m], radius [m]).

    source: a sphere YAML file, or its parsed mapping. Raises ValueError naming the entry that
    is malformed.
    """
    where = "spheres"
    if isinstance(source, Mapping):
        data = source
    else:
        where = str(source)
        try:
            data = yaml.safe_load(Path(source).read_text())
        except OSError as exc:
            raise ValueError(f"cannot read sphere file {source}: {exc}") from None
        except yaml.YAMLError as exc:
            raise ValueError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("spheres"), Mapping):
        raise ValueError(f"{where}: expected a mapping with 'spheres: {{link: [...]}}'")
    return {str(link): _sphere_rows(str(link), entries, where) for link, entries in data["spheres"].items()}


def dump_spheres(spheres: Mapping[str, np.ndarray], header: str = "", info: Mapping | None = None) -> str:
    """The YAML text of a sphere file: one flow-style line per sphere (easy to edit by hand),
    ``header`` as leading comment lines and ``info`` (fit report, provenance) after the spheres."""
    lines = [f"# {h}".rstrip() for h in header.splitlines()]
    lines.append("spheres:")
    for link, rows in spheres.items():
        rows = np.asarray(rows, dtype=np.float64).reshape(-1, 4)
        if len(rows) == 0:
            lines.append(f"  {link}: []")
            continue
        lines.append(f"  {link}:")
        for x, y, z, r in rows:
            lines.append(f"    - {{centre: [{x:.4f}, {y:.4f}, {z:.4f}], radius: {r:.4f}}}")
    text = "\n".join(lines) + "\n"
    if info:
        text += yaml.safe_dump(dict(info), sort_keys=False, default_flow_style=None, width=100)
    return text


# ----------------------------------------------------------------------------- URDF and meshes


def read_urdf(path: str | Path):
    """The parsed URDF (pytorch_kinematics' urdf_parser_py Robot); ValueError when unreadable."""
    from pytorch_kinematics.urdf_parser_py.urdf import URDF

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"URDF file not found: {p}")
    text = p.read_text()
    if "xacro:" in text and p.suffix != ".urdf":
        raise ValueError(f"{p}: looks like a xacro file; expand it to a URDF first (the xacro package)")
    try:
        return URDF.from_xml_string(text.encode() if text.lstrip().startswith("<?xml") else text)
    except Exception as exc:  # the parser raises many types for malformed XML
        raise ValueError(f"{p}: cannot parse URDF: {type(exc).__name__}: {exc}") from None


def _package_roots(name: str, urdf_dir: Path, package_dirs: Mapping[str, str | Path] | None) -> list[Path]:
    """Candidate directories of ROS package ``name``, most specific first."""
    found = []
    if package_dirs and name in package_dirs:
        found.append(Path(package_dirs[name]))
    for parent in [urdf_dir, *urdf_dir.parents]:
        if parent.name == name:
            found.append(parent)
        if (parent / name).is_dir():
            found.append(parent / name)
    for var, sub in (("ROS_PACKAGE_PATH", ""), ("AMENT_PREFIX_PATH", "share")):
        for root in filter(None, os.environ.get(var, "").split(os.pathsep)):
            found.append(Path(root) / sub / name)
    return found


def resolve_uri(uri: str, urdf_path: str | Path, package_dirs: Mapping[str, str | Path] | None = None) -> Path:
    """File of a URDF mesh ``filename``: package://pkg/rel, file:///abs, absolute or relative to the URDF."""
    urdf_dir = Path(urdf_path).resolve().parent
    if uri.startswith("package://"):
        name, _, rel = uri[len("package://"):].partition("/")
        roots = _package_roots(name, urdf_dir, package_dirs)
        for root in roots:
            if (root / rel).is_file():
                return root / rel
        raise ValueError(f"mesh {uri}: package {name!r} not found (give its directory with "
                         f"--package-dir {name}=DIR / package_dirs=; looked in {[str(r) for r in roots]})")
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    p = Path(uri)
    return p if p.is_absolute() else urdf_dir / p


def load_scaled_mesh(path: str | Path, scale) -> tuple[np.ndarray, np.ndarray]:
    """Mesh file with a URDF ``<mesh scale="sx sy sz">`` applied (None = 1): (V, 3) float32,
    (T, 3) int32. io.load_mesh applies it; a mirroring scale (negative determinant) reverses the
    triangles so they stay counter-clockwise seen from outside. ValueError for a zero factor."""
    return io.load_mesh(path, 1.0 if scale is None else scale)


def origin_matrix(origin) -> np.ndarray:
    """4x4 transform of a URDF <origin xyz rpy> (None = identity); rpy: fixed-axis x, y, z."""
    import trimesh

    if origin is None:
        return np.eye(4)
    m = trimesh.transformations.euler_matrix(*[float(a) for a in (origin.rpy or (0, 0, 0))], axes="sxyz")
    m[:3, 3] = [float(a) for a in (origin.xyz or (0, 0, 0))]
    return m


def _element_mesh(element, urdf_path, package_dirs) -> tuple[np.ndarray, np.ndarray]:
    from pytorch_kinematics.urdf_parser_py.urdf import Box, Cylinder, Mesh, Sphere

    g = element.geometry
    if isinstance(g, Mesh):
        v, t = load_scaled_mesh(resolve_uri(g.filename, urdf_path, package_dirs), g.scale)
    elif isinstance(g, Box):
        v, t = io.box_mesh(g.size)
    elif isinstance(g, Cylinder):
        v, t = io.cylinder_mesh(g.radius, g.length)
    elif isinstance(g, Sphere):
        v, t = io.sphere_mesh(g.radius, subdivisions=3)
    else:
        raise ValueError(f"unsupported URDF geometry {type(g).__name__}")
    m = origin_matrix(element.origin)
    v = (v.astype(np.float64) @ m[:3, :3].T + m[:3, 3]).astype(np.float32)
    return v, t


def link_geometry(urdf, urdf_path: str | Path, link: str, kind: str = "collision",
                  package_dirs: Mapping[str, str | Path] | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """All ``kind`` ('collision' or 'visual') geometry of one link merged into one mesh in the
    link frame: (V, 3) float32 m, (T, 3) int32; None when the link has none."""
    if kind not in ("collision", "visual"):
        raise ValueError(f"geometry kind must be collision or visual, got {kind!r}")
    lk = urdf.link_map.get(link)
    if lk is None:
        raise ValueError(f"{urdf_path}: no link {link!r}")
    elements = lk.collisions if kind == "collision" else lk.visuals
    parts = [_element_mesh(e, urdf_path, package_dirs) for e in elements if e.geometry is not None]
    if not parts:
        return None
    vs, ts, offset = [], [], 0
    for v, t in parts:
        vs.append(v)
        ts.append(t + offset)
        offset += len(v)
    return np.concatenate(vs).astype(np.float32), np.concatenate(ts).astype(np.int32)


# ----------------------------------------------------------------------------- the robot model


@dataclass(frozen=True)
class JointInfo:
    """An actuated joint of the model: name, limits [rad or m], velocity limit [rad/s or m/s]."""

    name: str
    lower: float
    upper: float
    velocity: float


class RobotModel:
    """Collision spheres of a URDF robot as a differentiable function of its joints.

    urdf: URDF file; spheres: sphere YAML file (or mapping, see the module doc) whose links must
    exist in the URDF; device, dtype: where the kinematics run (use the world's device);
    locked_joints: joint name -> fixed value (e.g. gripper fingers), not part of q; joints that
    mimic another joint follow it and are not part of q either; exclude_links: links whose spheres
    are left out (e.g. a base link that never moves and rests on its mount).
    Attributes: joints (list of JointInfo, the order of q), dof, link_of_sphere (n,) link names,
    num_spheres, lower / upper / velocity (dof,) tensors.
    """

    def __init__(self, urdf: str | Path, spheres, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, locked_joints: Mapping[str, float] | None = None,
                 exclude_links: tuple[str, ...] = ()) -> None:
        import pytorch_kinematics as pk

        self.urdf_path = Path(urdf)
        self.urdf = read_urdf(self.urdf_path)
        self.device = torch.device(device)
        self.dtype = dtype
        try:
            self.chain = pk.build_chain_from_urdf(self.urdf_path.read_text().encode())
        except Exception as exc:  # noqa: BLE001 - e.g. a URDF without joints
            raise ValueError(f"{self.urdf_path}: cannot build the kinematic chain: {type(exc).__name__}: {exc}") from None
        self.chain = self.chain.to(dtype=dtype, device=self.device)
        chain_joints = self.chain.get_joint_parameter_names()
        jmap = self.urdf.joint_map
        locked = dict(locked_joints or {})
        unknown = sorted(set(locked) - set(chain_joints))
        if unknown:
            raise ValueError(f"locked_joints {unknown} are not movable joints of {self.urdf_path} ({chain_joints})")
        # Each chain joint is driven by: a q entry, a constant, or a * (another joint) + b.
        self.joints: list[JointInfo] = []
        active, const, mimic = [], np.zeros(len(chain_joints)), []
        for i, name in enumerate(chain_joints):
            j = jmap[name]
            if name in locked:
                const[i] = float(locked[name])
            elif j.mimic is not None and j.mimic.joint in chain_joints:
                mimic.append((i, chain_joints.index(j.mimic.joint), float(j.mimic.multiplier or 1.0),
                              float(j.mimic.offset or 0.0)))
            else:
                lim = j.limit
                lo, hi = (-np.pi, np.pi) if lim is None or j.type == "continuous" else (lim.lower, lim.upper)
                vel = float(lim.velocity) if lim is not None and lim.velocity else np.inf
                self.joints.append(JointInfo(name, float(lo), float(hi), vel))
                active.append(i)
        self.dof = len(active)
        self._n_chain = len(chain_joints)
        self._active = torch.tensor(active, dtype=torch.long, device=self.device)
        self._const = torch.tensor(const, dtype=dtype, device=self.device)
        self._mimic = mimic
        # The mimic joints' rows as index tensors made once: one built per FK call would be a
        # host-to-device copy on CUDA every time.
        self._mimic_rows = [(torch.tensor([i], dtype=torch.long, device=self.device), src, a, b)
                            for i, src, a, b in mimic]
        self.lower = torch.tensor([j.lower for j in self.joints], dtype=dtype, device=self.device)
        self.upper = torch.tensor([j.upper for j in self.joints], dtype=dtype, device=self.device)
        self.velocity = torch.tensor([j.velocity for j in self.joints], dtype=dtype, device=self.device)

        table = {link: rows for link, rows in load_spheres(spheres).items() if link not in set(exclude_links)}
        frames = set(self.chain.get_frame_names(exclude_fixed=False))
        missing = sorted(set(table) - frames)
        if missing:
            raise ValueError(f"sphere links {missing} are not links of {self.urdf_path}")
        links, rows = [], []
        for link, r in table.items():
            links += [link] * len(r)
            rows.append(r)
        if not links:
            raise ValueError("the sphere file holds no sphere")
        self.link_of_sphere = links
        self.num_spheres = len(links)
        self.sphere_links = [link for link, r in table.items() if len(r)]
        all_rows = np.concatenate(rows)
        self._local = torch.tensor(all_rows[:, :3], dtype=dtype, device=self.device)  # (n, 3)
        self._radius = torch.tensor(all_rows[:, 3], dtype=dtype, device=self.device)  # (n,)
        frame_of_link = {name: int(self.chain.get_frame_indices(name)[0]) for name in self.sphere_links}
        self._frame = torch.tensor([frame_of_link[link] for link in links], dtype=torch.long, device=self.device)

    # -- joints

    def full_joint_vector(self, q: torch.Tensor) -> torch.Tensor:
        """(B, chain joints) of q (B, dof): locked constants and mimic joints filled in."""
        full = self._const.expand(q.shape[0], self._n_chain).index_copy(1, self._active, q)
        for row, src, a, b in self._mimic_rows:
            full = full.index_copy(1, row, a * full[:, src:src + 1] + b)
        return full

    def clamp(self, q: torch.Tensor) -> torch.Tensor:
        """q (..., dof) within the joint limits."""
        return torch.maximum(torch.minimum(q, self.upper), self.lower)

    # -- kinematics

    def link_transforms(self, q: torch.Tensor, links: list[str] | None = None) -> torch.Tensor:
        """(..., L, 4, 4) link-to-robot-base transforms of q (..., dof) for ``links`` (default: the
        links that carry spheres)."""
        batch = q.shape[:-1]
        flat = q.reshape(-1, self.dof).to(self.dtype)
        t = self.chain.forward_kinematics_tensor(self.full_joint_vector(flat))  # (frames, B, 4, 4)
        names = links if links is not None else self.sphere_links
        idx = torch.as_tensor(self.chain.get_frame_indices(*names), dtype=torch.long, device=self.device).reshape(-1)
        return t[idx].transpose(0, 1).reshape(*batch, len(names), 4, 4)

    def spheres(self, q: torch.Tensor, base_pose: torch.Tensor | None = None) -> torch.Tensor:
        """World-frame spheres (..., n, 4) [x, y, z, r] of joint configurations q (..., dof).

        base_pose: pose of the URDF root link in the world, (7,) or (..., 7) broadcastable to q's
        batch shape, x, y, z [m], qw, qx, qy, qz (normalised here); None = identity. Differentiable
        with respect to q and base_pose (the radius column carries no gradient).
        """
        if q.shape[-1] != self.dof:
            raise ValueError(f"q must have shape (..., {self.dof}), got {tuple(q.shape)}")
        batch = q.shape[:-1]
        flat = q.reshape(-1, self.dof).to(device=self.device, dtype=self.dtype)
        t = self.chain.forward_kinematics_tensor(self.full_joint_vector(flat))  # (frames, B, 4, 4)
        t = t[self._frame]  # (n, B, 4, 4)
        centres = (t[..., :3, :3] @ self._local[:, None, :, None]).squeeze(-1) + t[..., :3, 3]  # (n, B, 3)
        centres = centres.transpose(0, 1).reshape(*batch, self.num_spheres, 3)
        if base_pose is not None:
            centres = apply_pose(base_pose.to(device=self.device, dtype=self.dtype), centres)
        radius = self._radius.expand(*batch, self.num_spheres)
        return torch.cat([centres, radius[..., None]], dim=-1)


    # -- self-collision

    def movable_joints_between(self, a: str, b: str) -> int:
        """Number of joints that move (not fixed, not locked) on the tree path between links a and b."""
        parent = {j.child: j for j in self.urdf.joints}
        names = self.chain.get_joint_parameter_names()
        active = set(self._active.tolist())
        # A mimic joint moves when the joint it follows does (not when that one is locked).
        moving = {names[i] for i in active} | {names[i] for i, src, *_ in self._mimic if src in active}

        def path(link: str) -> list[str]:
            out = [link]
            while out[-1] in parent:
                out.append(parent[out[-1]].parent)
            return out

        pa, pb = path(a), path(b)
        common = next(link for link in pa if link in pb)
        links = pa[:pa.index(common)] + pb[:pb.index(common)]  # each link below the common ancestor
        return sum(parent[link].name in moving for link in links)

    def self_collision_pairs(self, samples: int = 1000, always_fraction: float = 0.95, seed: int = 0) -> torch.Tensor:
        """(P, 2) long sphere index pairs to check for self-collision.

        Left out, as MoveIt's setup assistant does: pairs on one link or on links at most one
        moving joint apart (neighbours always touch at the joint), and pairs that overlap in at
        least ``always_fraction`` of ``samples`` random configurations within the joint limits
        (structural contact the spheres' overshoot creates, not a motion to avoid).
        """
        n = self.num_spheres
        i, j = torch.triu_indices(n, n, offset=1)
        link_pairs = {}
        keep = torch.zeros(i.numel(), dtype=torch.bool)
        for k, (a, b) in enumerate(zip(i.tolist(), j.tolist())):
            la, lb = self.link_of_sphere[a], self.link_of_sphere[b]
            if la != lb:
                key = (la, lb)
                if key not in link_pairs:
                    link_pairs[key] = self.movable_joints_between(la, lb) >= 2
                keep[k] = link_pairs[key]
        i, j = i[keep], j[keep]
        if i.numel() == 0:
            return torch.zeros((0, 2), dtype=torch.long, device=self.device)
        gen = torch.Generator().manual_seed(seed)
        lo, hi = self.lower.cpu().double(), self.upper.cpu().double()
        q = lo + (hi - lo) * torch.rand(samples, self.dof, generator=gen, dtype=torch.float64)
        with torch.no_grad():
            s = self.spheres(q.to(device=self.device, dtype=self.dtype)).double().cpu()
        gap = torch.linalg.vector_norm(s[:, i, :3] - s[:, j, :3], dim=-1) - s[:, i, 3] - s[:, j, 3]
        structural = (gap < 0).double().mean(dim=0) >= always_fraction
        return torch.stack([i[~structural], j[~structural]], dim=1).to(self.device)


def self_collision_cost(spheres: torch.Tensor, pairs: torch.Tensor, activation_distance: float) -> torch.Tensor:
    """Self-collision cost (...,) of spheres (..., n, 4): the penetration cost (docs/design.md "Cost definition") of each pair,
    d = r_i + r_j + eta - |c_i - c_j|, summed over pairs (P, 2); differentiable in the centres."""
    eta = float(activation_distance)
    if eta <= 0:
        raise ValueError(f"activation_distance must be > 0, got {activation_distance}")
    a, b = spheres[..., pairs[:, 0], :], spheres[..., pairs[:, 1], :]
    d = a[..., 3] + b[..., 3] + eta - torch.linalg.vector_norm(a[..., :3] - b[..., :3], dim=-1)
    cost = torch.where(d > eta, d - 0.5 * eta, torch.clamp(d, min=0.0) ** 2 / (2 * eta))
    return cost.sum(dim=-1)


def pose_matrix(pose: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotation (..., 3, 3) and translation (..., 3) of poses (..., 7) x y z qw qx qy qz."""
    from pytorch_kinematics.transforms import quaternion_to_matrix

    quat = pose[..., 3:7] / torch.linalg.vector_norm(pose[..., 3:7], dim=-1, keepdim=True)
    return quaternion_to_matrix(quat), pose[..., :3]


def apply_pose(pose: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """points (..., n, 3) mapped by pose (..., 7) (or (7,)): R p + t, differentiable in both."""
    if pose.shape[-1] != POSE_SIZE:
        raise ValueError(f"base_pose must have shape (..., 7) x y z qw qx qy qz, got {tuple(pose.shape)}")
    rot, trans = pose_matrix(pose)
    return (rot[..., None, :, :] @ points[..., None]).squeeze(-1) + trans[..., None, :]
