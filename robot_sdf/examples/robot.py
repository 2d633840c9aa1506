"""The demo robot: a holonomic planar base carrying a chain of collision spheres.

State (x, y, yaw) in the world frame [m, m, rad]; control (vx, vy, wz) in the world frame
[m/s, m/s, rad/s]. The spheres ride at a fixed height above the floor, so every sphere centre
stays in the plane z = ``height`` (the plane of the demo's distance slice).
The model is kinematic (velocity control, explicit Euler), written with torch so that the MPC can
back-propagate a collision gradient from the spheres to the controls.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(frozen=True)
class SphereRobot:
    """Geometry and limits of the demo base.

    offsets: (n, 2) sphere centres in the body frame [m] (x forward); radii: (n,) [m];
    height: z of every sphere centre [m]; v_max: bound on |(vx, vy)| [m/s];
    w_max: bound on |wz| [rad/s].
    """

    offsets: tuple[tuple[float, float], ...] = ((0.21, 0.0), (0.07, 0.0), (-0.07, 0.0), (-0.21, 0.0))
    radii: tuple[float, ...] = (0.12, 0.14, 0.14, 0.12)
    height: float = 0.25
    v_max: float = 0.7
    w_max: float = 1.5
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_spheres(self) -> int:
        return len(self.radii)

    def _tensors(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = (like.device, like.dtype)
        if key not in self._cache:
            self._cache[key] = (torch.tensor(self.offsets, dtype=like.dtype, device=like.device),
                                torch.tensor(self.radii, dtype=like.dtype, device=like.device))
        return self._cache[key]

    def clamp_controls(self, u: torch.Tensor) -> torch.Tensor:
        """Controls (..., 3) limited to |(vx, vy)| <= v_max and |wz| <= w_max (differentiable)."""
        speed = torch.linalg.vector_norm(u[..., :2], dim=-1, keepdim=True)
        scale = torch.clamp(self.v_max / torch.clamp(speed, min=1e-9), max=1.0)
        return torch.cat([u[..., :2] * scale, torch.clamp(u[..., 2:3], -self.w_max, self.w_max)], dim=-1)

    def rollout(self, state: torch.Tensor, controls: torch.Tensor, dt: float) -> torch.Tensor:
        """States (b, h, 3) after each of the controls (b, h, 3) applied for dt [s] from state (3,).

        Controls are used as given (clamp them first); explicit Euler, so the executed step of the
        demo (the same formula with h = 1) follows the plan exactly.
        """
        return state.reshape(1, 1, 3) + torch.cumsum(controls * dt, dim=1)

    def spheres(self, states: torch.Tensor) -> torch.Tensor:
        """Sphere tensor (..., n, 4) [x, y, z, r] (world frame) of base states (..., 3)."""
        offsets, radii = self._tensors(states)
        c, s = torch.cos(states[..., 2:3]), torch.sin(states[..., 2:3])  # (..., 1)
        ox, oy = offsets[:, 0], offsets[:, 1]
        x = states[..., 0:1] + c * ox - s * oy
        y = states[..., 1:2] + s * ox + c * oy
        z = torch.full_like(x, self.height)
        r = radii.expand_as(x)
        return torch.stack([x, y, z, r], dim=-1)

    def spheres_np(self, state) -> np.ndarray:
        """(n, 4) float64 spheres of one state (3,), for logging and plots."""
        return self.spheres(torch.as_tensor(np.asarray(state, dtype=np.float64))).numpy()
