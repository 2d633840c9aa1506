"""Managed (lifecycle) variant of sdf_server: console script ``sdf_server_managed``.

Same node name, parameters, topics and services as ``sdf_server``; a lifecycle manager (or
``ros2 lifecycle set``) drives it through the standard states:

- unconfigured: parameters declared (and settable), nothing else exists;
- configure: validate the parameters, build the world on its device, load the scene, warm up
  (a bad parameter or scene fails the transition with the reason logged; the node stays
  unconfigured);
- activate: open the tf lookup, the mesh and pose subscriptions, markers, slice, diagnostics and
  the three services;
- deactivate: close them again (the world and its meshes stay);
- cleanup: release the world; shutdown: both, from any state.

It reuses SdfServer's steps (configure_server, activate_server, deactivate_server,
cleanup_server); SdfServer's own constructor runs the first two at once.
"""
from __future__ import annotations

import sys
from typing import Any

from rclpy.lifecycle import LifecycleNodeMixin, LifecycleState, TransitionCallbackReturn
from rclpy.node import Node

from robot_sdf.ros.parameters import ConfigError
from robot_sdf.ros.node_process import run_node, usage
from robot_sdf.ros.sdf_server import NODE_NAME, SdfServer


class ManagedSdfServer(LifecycleNodeMixin, SdfServer):
    """sdf_server as an rclpy lifecycle node (LifecycleNodeMixin over SdfServer, the way
    rclpy's LifecycleNode puts the mixin over Node). Raises ConfigError from the constructor only
    for parameters of the wrong type; everything else is checked on configure."""

    def __init__(self, **node_kwargs: Any) -> None:
        # SdfServer.__init__ would configure and activate at once; here the transitions do.
        Node.__init__(self, NODE_NAME, **node_kwargs)
        LifecycleNodeMixin.__init__(self)
        self._init_parameters()
        self.get_logger().info("unconfigured: waiting for the configure transition")

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            self.configure_server()
        except ConfigError as exc:
            self.get_logger().error(f"configure failed: {exc}")
            return TransitionCallbackReturn.FAILURE
        self.get_logger().info(f"configured: device={self.world.device}, {self.world.mesh_count()} scene obstacles")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.activate_server()
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.deactivate_server()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.cleanup_server()
        self.get_logger().info("unconfigured: world released")
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        if self._active:
            self.deactivate_server()
        self.cleanup_server()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        # an exception in a transition: close what is open and return to unconfigured
        if self._active:
            self.deactivate_server()
        self.cleanup_server()
        return TransitionCallbackReturn.SUCCESS


def main(args: list[str] | None = None) -> int:
    """Console script ``sdf_server_managed``: run the managed node until shutdown (SIGINT: 0).

    Exit code 2 when a parameter has the wrong type (other errors fail the configure transition);
    -h or --help prints the usage and the parameters and exits 0 without starting anything.
    """
    what = ("Runs the managed (lifecycle) variant of sdf_server: same name, parameters, topics and\n"
            "services; it starts unconfigured and is driven by a lifecycle manager or\n"
            "`ros2 lifecycle set /sdf_server configure` (then activate, deactivate, cleanup, shutdown).\n"
            "Runs until SIGINT or SIGTERM (exit status 0).")
    return run_node(ManagedSdfServer, args, NODE_NAME, usage("sdf_server_managed", what))


if __name__ == "__main__":
    sys.exit(main())
