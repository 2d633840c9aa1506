"""MPPI with a gradient polish, for the demo base (robot.SphereRobot).

One control step:
1. sample ``rollouts`` control sequences around the warm-started mean (time-correlated Gaussian
   noise; row 0 is the mean itself), roll them out, and place the robot spheres along each;
2. ask the collision backend for the swept sphere cost of all of them in ONE request
   (spheres (b = rollouts, h = horizon + 1, n, 4); step 0 is the current pose, so the sweep also
   covers the segment from the current pose to the first planned one);
3. add goal, heading and control costs, weight the samples by exp(-cost / lambda), average;
4. optionally take a few gradient steps on the averaged mean: the backend returns d cost / d
   sphere centre, torch carries it back through the kinematics to the controls; a step is kept
   only when the total cost of the mean went down.
The collision backend is a callable, so the same planner runs against the ROS service or an
in-process MeshWorld.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import torch

from robot_sdf.examples.robot import SphereRobot


class CollisionEval(NamedTuple):
    """What a collision backend answers: cost (b,h,n), gradient (b,h,n,3) or None,
    the world revision it used, and the time the request took [s]."""

    cost: torch.Tensor
    gradient: torch.Tensor | None
    world_revision: int
    latency_s: float


CollisionFn = Callable[[torch.Tensor, bool], CollisionEval]


@dataclass
class MpcConfig:
    """Planner settings (SI units). Defaults keep one CPU step at a few tens of ms."""

    dt: float = 0.1  # s per horizon step and per executed control step
    horizon: int = 20  # planned steps (2 s look-ahead)
    rollouts: int = 64  # sampled control sequences per step
    noise_sigma: tuple[float, float, float] = (0.5, 0.5, 0.8)  # std of vx, vy [m/s], wz [rad/s]
    noise_correlation: float = 0.6  # AR(1) coefficient of the noise along the horizon
    temperature: float = 1.0  # lambda of the sample weights exp(-(cost - min cost) / lambda)
    activation_distance: float = 0.15  # m: the cost starts this far from a surface
    collision_weight: float = 1600.0  # per unit of swept sphere cost (a time-average per step)
    sweep_steps: int = 2  # samples per half segment (free-space ones skipped)
    goal_weight: float = 1.0  # per m of distance to the goal, per second of horizon
    terminal_weight: float = 6.0  # per m of distance to the goal at the horizon end
    heading_weight: float = 0.4  # per (m/s)^2 of sideways velocity in the body frame, per s
    control_weight: float = 0.05  # per (unit of control)^2, per s
    smooth_weight: float = 0.5  # per (change of control)^2 between steps
    gradient_steps: int = 1  # gradient steps on the mean per control step (0 = pure MPPI)
    gradient_step_size: float = 0.05  # largest control change of one gradient step [m/s]
    seed: int = 0

    def validate(self) -> None:
        if self.dt <= 0 or self.horizon < 2 or self.rollouts < 2:
            raise ValueError("dt must be > 0, horizon >= 2 and rollouts >= 2")
        if self.temperature <= 0 or self.sweep_steps < 0 or self.gradient_steps < 0:
            raise ValueError("temperature must be > 0, sweep_steps and gradient_steps >= 0")


@dataclass
class StepResult:
    """One planning step: the control to execute (3,), the new mean states (horizon, 3),
    a few sampled rollouts (k, horizon, 3), and timing/bookkeeping of the requests."""

    control: np.ndarray
    plan: np.ndarray
    samples: np.ndarray
    cost_mean: float
    collision_cost_mean: float
    world_revision: int
    latency_s: float  # the big (all rollouts) request
    gradient_latency_s: list[float]
    gradient_accepted: int


class Mppi:
    """Receding-horizon MPPI for a SphereRobot against a CollisionFn."""

    def __init__(self, robot: SphereRobot, goal: np.ndarray, config: MpcConfig,
                 collision: CollisionFn) -> None:
        config.validate()
        self.robot, self.cfg, self.collision = robot, config, collision
        self.goal = torch.as_tensor(np.asarray(goal, dtype=np.float32)[:2])
        self.mean = torch.zeros(config.horizon, 3)
        self.sigma = torch.tensor(config.noise_sigma, dtype=torch.float32)
        self.gen = torch.Generator().manual_seed(int(config.seed))

    # ------------------------------------------------------------------ costs
    def _spheres(self, state: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """Spheres (b, horizon + 1, n, 4) of the current state followed by the rollouts (b, H, 3)."""
        b = states.shape[0]
        full = torch.cat([state.reshape(1, 1, 3).expand(b, 1, 3), states], dim=1)
        return self.robot.spheres(full)

    def _task_cost(self, controls: torch.Tensor, states: torch.Tensor,
                   previous: torch.Tensor) -> torch.Tensor:
        """Goal, heading and control costs (b,) of controls/states (b, H, 3)."""
        c, dt = self.cfg, self.cfg.dt
        dist = torch.linalg.vector_norm(states[..., :2] - self.goal, dim=-1)  # (b, H)
        cost = c.goal_weight * dt * dist.sum(dim=1) + c.terminal_weight * dist[:, -1]
        # Sideways velocity in the body frame: the capsule prefers to drive along its long axis.
        yaw = states[..., 2]
        lateral = -torch.sin(yaw) * controls[..., 0] + torch.cos(yaw) * controls[..., 1]
        cost = cost + c.heading_weight * dt * (lateral ** 2).sum(dim=1)
        cost = cost + c.control_weight * dt * (controls ** 2).sum(dim=(1, 2))
        du = torch.diff(torch.cat([previous.reshape(1, 1, 3).expand(controls.shape[0], 1, 3), controls], dim=1),
                        dim=1)
        return cost + c.smooth_weight * (du ** 2).sum(dim=(1, 2))

    def _collision_cost(self, spheres: torch.Tensor, compute_gradient: bool):
        res = self.collision(spheres.detach(), compute_gradient)
        # Every step's slot counts, step 0 (the current pose) included: its slot reaches half-way
        # to step 1, so it differs between samples, and the backend's gradient is that of the
        # summed cost over all steps.
        per_sample = self.cfg.collision_weight * res.cost.sum(dim=(1, 2))
        return per_sample, res

    # ------------------------------------------------------------------ planning
    def _noise(self) -> torch.Tensor:
        c = self.cfg
        white = torch.randn((c.rollouts, c.horizon, 3), generator=self.gen)
        a, out = c.noise_correlation, torch.empty_like(white)
        out[:, 0] = white[:, 0]
        for t in range(1, c.horizon):
            out[:, t] = a * out[:, t - 1] + math.sqrt(1.0 - a * a) * white[:, t]
        out[0] = 0.0  # sample 0 re-evaluates the warm-started mean
        return out * self.sigma

    def step(self, state_np: np.ndarray, previous_control: np.ndarray) -> StepResult:
        """Plan from state (3,) given the last executed control (3,); returns the StepResult."""
        c = self.cfg
        state = torch.as_tensor(np.asarray(state_np, dtype=np.float32))
        prev = torch.as_tensor(np.asarray(previous_control, dtype=np.float32))
        controls = self.robot.clamp_controls(self.mean[None] + self._noise())
        states = self.robot.rollout(state, controls, c.dt)
        coll, res = self._collision_cost(self._spheres(state, states), compute_gradient=False)
        total = coll + self._task_cost(controls, states, prev)
        w = torch.softmax(-(total - total.min()) / c.temperature, dim=0)
        self.mean = self.robot.clamp_controls((w[:, None, None] * controls).sum(dim=0))

        grad_latency, accepted = self._polish(state, prev)
        plan = self.robot.rollout(state, self.mean[None], c.dt)[0]
        control = self.mean[0].clone()
        # Warm start: shift by one step, repeat the last control.
        self.mean = torch.cat([self.mean[1:], self.mean[-1:]], dim=0)
        order = torch.argsort(w, descending=True)[:8]
        return StepResult(control.numpy().astype(np.float64), plan.numpy().astype(np.float64),
                          states[order].numpy().astype(np.float64), float((w * total).sum()),
                          float((w * coll).sum()), res.world_revision, res.latency_s, grad_latency, accepted)

    def _mean_cost(self, state, prev, mean: torch.Tensor, compute_gradient: bool):
        """Total cost of one control sequence (H,3) and, with compute_gradient, d cost / d mean."""
        u = mean.detach().clone().requires_grad_(compute_gradient)
        uc = self.robot.clamp_controls(u)[None]
        states = self.robot.rollout(state, uc, self.cfg.dt)
        spheres = self._spheres(state, states)
        coll, res = self._collision_cost(spheres, compute_gradient)
        task = self._task_cost(uc, states, prev)
        total = float((coll[0] + task[0]).detach())
        grad = None
        if compute_gradient:
            # Chain rule: the server's d (summed cost) / d centre (1,h,n,3) enters as the upstream
            # gradient of the sphere centres; step 0 (the current pose) does not depend on the
            # controls.
            g = res.gradient.clone()
            g[:, 0] = 0.0
            upstream = torch.cat([self.cfg.collision_weight * g, torch.zeros_like(g[..., :1])], dim=-1)
            torch.autograd.backward([spheres, task[0]], [upstream.to(spheres.dtype), torch.ones(())])
            grad = u.grad.detach()
        return total, grad, res.latency_s

    def _polish(self, state: torch.Tensor, prev: torch.Tensor) -> tuple[list[float], int]:
        """Gradient steps on self.mean; each kept only if it lowers the total cost."""
        latencies, accepted = [], 0
        if self.cfg.gradient_steps == 0:
            return latencies, accepted
        total, grad, lat = self._mean_cost(state, prev, self.mean, True)
        latencies.append(lat)
        for i in range(self.cfg.gradient_steps):
            # Normalised step: the largest control change is gradient_step_size.
            scale = self.cfg.gradient_step_size / max(float(grad.abs().max()), 1e-9)
            candidate = self.robot.clamp_controls(self.mean - scale * grad)
            last = i == self.cfg.gradient_steps - 1
            new_total, new_grad, lat = self._mean_cost(state, prev, candidate, not last)
            latencies.append(lat)
            if not new_total < total:
                break
            self.mean, total, grad, accepted = candidate.detach(), new_total, new_grad, accepted + 1
        return latencies, accepted
