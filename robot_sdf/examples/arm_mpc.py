"""Receding-horizon joint-trajectory optimisation for an arm, with collision gradients.

Each control step plans joint velocities V (h, dof) [rad/s] over the horizon; the waypoints are
Q[k] = q0 + dt * (V[0] + ... + V[k]). The plan's cost is

    goal      sum_k w_k |Q[k] - q_goal|^2           (w_k rises towards the end of the horizon)
    smooth    |V|^2 and |V[k] - V[k-1]|^2            (V[-1] = the velocity just executed)
    limits    squared excess beyond the joint limits (less a margin)
    collision collision_weight * sum of the swept sphere cost of the trajectory (q0, Q[0..h-1])
    self      self_collision_weight * the penetration cost of the robot's own sphere pairs
              (robot.self_collision_pairs: links two or more moving joints apart) at each waypoint

where the collision term is ``collision(spheres (b, h+1, n, 4)) -> cost (b, h+1, n)``, a
differentiable function: world.swept_sphere_cost in-process, or the client's remote autograd
Function over ROS. Gradients flow spheres -> robot_sdf.robot's kinematics -> joint angles -> V.

A step: a sampling warm start (the previous plan shifted, a straight run to the goal, and noisy
variants of the previous plan: one batched collision request) picks the best candidate; Adam
then refines it for ``adam_steps`` iterations (one request each, with gradients), keeping the
best plan seen; the first velocity, clamped to the limits, is executed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from robot_sdf.robot import self_collision_cost


@dataclass(frozen=True)
class ArmMpcConfig:
    horizon: int = 10  # waypoints planned
    dt: float = 0.1  # s between waypoints (and control period)
    samples: int = 16  # warm start candidates (one batched request)
    noise: float = 0.4  # rad/s, std of the candidates' velocity perturbation
    adam_steps: int = 5  # gradient refinements per control step
    learning_rate: float = 0.06  # Adam step on V [rad/s]
    speed_fraction: float = 0.4  # of the URDF velocity limits
    goal_weight: float = 4.0
    velocity_weight: float = 0.01
    acceleration_weight: float = 0.05
    limit_weight: float = 100.0
    limit_margin: float = 0.05  # rad
    collision_weight: float = 100
    activation_distance: float = 0.08  # m
    sweep_steps: int = 3
    self_collision_weight: float = 100.0
    self_activation_distance: float = 0.02  # m
    seed: int = 0


@dataclass
class ArmStep:
    """What one control step decided and what it cost."""

    velocity: np.ndarray  # (dof,) executed [rad/s]
    plan: np.ndarray  # (h, dof) waypoints [rad]
    cost: float
    collision_cost: float
    solve_s: float
    requests: int


CollisionFn = Callable[[torch.Tensor], torch.Tensor]


class ArmMpc:
    """The controller. robot: robot_sdf.robot.RobotModel; goal: (dof,) [rad]; collision: see the
    module doc; base_pose: (7,) of the robot in the world or None."""

    def __init__(self, robot, goal, config: ArmMpcConfig, collision: CollisionFn,
                 base_pose: torch.Tensor | None = None) -> None:
        self.robot = robot
        self.config = config
        self.collision = collision
        self.base_pose = base_pose
        dev, dt = robot.device, robot.dtype
        self.goal = torch.as_tensor(goal, dtype=dt, device=dev)
        self.vmax = robot.velocity.clamp(max=10.0) * config.speed_fraction
        self.plan_v = torch.zeros(config.horizon, robot.dof, dtype=dt, device=dev)
        self.last_v = torch.zeros(robot.dof, dtype=dt, device=dev)
        self.gen = torch.Generator(device="cpu").manual_seed(config.seed)
        self.self_pairs = robot.self_collision_pairs()
        w = torch.linspace(0.3, 1.0, config.horizon, dtype=dt, device=dev) ** 2
        self.goal_w = (w / w.sum())[:, None]

    def waypoints(self, q0: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(b, h, dof) waypoints of velocities v (b, h, dof) from q0 (dof,)."""
        return q0 + torch.cumsum(v, dim=-2) * self.config.dt

    def costs(self, q0: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Total (b,) and collision (b,) cost of velocity plans v (b, h, dof)."""
        c = self.config
        q = self.waypoints(q0, v)
        goal = c.goal_weight * (self.goal_w * (q - self.goal) ** 2).sum(dim=(-2, -1))
        prev = torch.cat([self.last_v.expand(v.shape[0], 1, -1), v[:, :-1]], dim=1)
        smooth = c.velocity_weight * (v ** 2).sum(dim=(-2, -1)) * c.dt \
            + c.acceleration_weight * ((v - prev) ** 2).sum(dim=(-2, -1))
        lo, hi = self.robot.lower + c.limit_margin, self.robot.upper - c.limit_margin
        limits = c.limit_weight * (torch.relu(q - hi) ** 2 + torch.relu(lo - q) ** 2).sum(dim=(-2, -1))
        traj = torch.cat([q0.expand(v.shape[0], 1, -1), q], dim=1)  # (b, h+1, dof)
        spheres = self.robot.spheres(traj, self.base_pose)
        coll = c.collision_weight * self.collision(spheres).sum(dim=(-2, -1))
        own = c.self_collision_weight * self_collision_cost(spheres, self.self_pairs,
                                                            c.self_activation_distance).sum(dim=-1)
        return goal + smooth + limits + own + coll, coll

    def _clip(self, v: torch.Tensor) -> torch.Tensor:
        return torch.maximum(torch.minimum(v, self.vmax), -self.vmax)

    def candidates(self, q0: torch.Tensor) -> torch.Tensor:
        """(samples, h, dof) warm start velocity plans."""
        c = self.config
        shifted = torch.cat([self.plan_v[1:], self.plan_v[-1:]], dim=0)
        straight = self._clip(((self.goal - q0) / (c.horizon * c.dt)).expand(c.horizon, -1))
        n_noisy = max(c.samples - 3, 0)
        # Smooth perturbations: random walks along the horizon, so candidates bend rather than jitter.
        noise = torch.randn(n_noisy, c.horizon, self.robot.dof, generator=self.gen, dtype=self.plan_v.dtype)
        noise = torch.cumsum(noise, dim=1) / torch.arange(1, c.horizon + 1, dtype=noise.dtype)[:, None] ** 0.5
        noisy = shifted + c.noise * noise.to(self.plan_v.device)
        cands = torch.cat([shifted[None], straight[None], torch.zeros_like(shifted)[None], noisy])[:c.samples]
        return self._clip(cands)

    def warm_up(self, q0_np: np.ndarray) -> None:
        """One batched and one gradient evaluation of a standing plan, changing no state: the
        first calls load Warp modules and set up autograd, and torch's first optimiser step imports
        its compiler stack (about 1 s), which no control step should time."""
        q0 = torch.as_tensor(q0_np, dtype=self.robot.dtype, device=self.robot.device)
        still = torch.zeros(self.config.samples, self.config.horizon, self.robot.dof, dtype=q0.dtype, device=q0.device)
        with torch.no_grad():
            self.costs(q0, still)
        v = still[:1].clone().requires_grad_(True)
        opt = torch.optim.Adam([v], lr=self.config.learning_rate)
        self.costs(q0, v)[0].sum().backward()
        opt.step()

    def step(self, q0_np: np.ndarray) -> ArmStep:
        """Plan from joint state q0 (dof,) [rad]; returns the velocity to execute for dt."""
        t0 = time.perf_counter()
        q0 = torch.as_tensor(q0_np, dtype=self.robot.dtype, device=self.robot.device)
        with torch.no_grad():
            cands = self.candidates(q0)
            total, _ = self.costs(q0, cands)
        best = int(torch.argmin(total))
        v = cands[best:best + 1].clone().requires_grad_(True)
        best_v, best_cost, best_coll = v.detach().clone(), float(total[best]), None
        opt = torch.optim.Adam([v], lr=self.config.learning_rate)
        requests = 1
        for _ in range(self.config.adam_steps):
            opt.zero_grad()
            cost, coll = self.costs(q0, v)
            cost.sum().backward()
            requests += 1
            if float(cost.detach()) <= best_cost:
                best_v, best_cost, best_coll = v.detach().clone(), float(cost.detach()), float(coll.detach())
            opt.step()
            with torch.no_grad():
                v.copy_(self._clip(v))
        if best_coll is None:  # no refinement beat the warm start: its collision cost
            with torch.no_grad():
                _, coll = self.costs(q0, best_v)
            requests += 1
            best_coll = float(coll)
        self.plan_v = best_v[0]
        self.last_v = self.plan_v[0].clone()
        plan = self.waypoints(q0, best_v)[0]
        return ArmStep(self.plan_v[0].cpu().numpy().astype(np.float64), plan.detach().cpu().numpy(), best_cost,
                       best_coll, time.perf_counter() - t0, requests)
