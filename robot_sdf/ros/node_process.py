"""The sdf_server node's process: run_node (signals, the main executor) and the process-wide
tuning the console scripts apply.

The executors that stop without stray errors are in robot_sdf.ros.executors.
"""
from __future__ import annotations

import faulthandler
import signal
import sys
import threading

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions

from robot_sdf.memory import limit_malloc_arenas
from robot_sdf.ros.executors import DrainingExecutor
from robot_sdf.ros.parameters import ConfigError, parameter_help

# GIL switch interval of the node's process [s] (Python's default: 0.005). The update worker, the
# service threads and the middleware's Python callbacks share one GIL; a thread waiting for it
# waits up to this long behind a thread running Python code, at every wait. Under the soak
# (two clients at 50 Hz, mesh updates at 30 Hz, poses at 50 Hz) 1 ms gave publish -> applied
# p99 229/182 ms against 443/354 ms at 5 ms (docs/reliability.md).
GIL_SWITCH_INTERVAL_S = 0.001
# glibc malloc arenas of the node's process (see use_node_switch_interval).
NODE_MALLOC_ARENAS = 2
# Longest wait of the node's main executor before it looks at its context again [s].
SPIN_POLL_S = 0.25
# Threads of the node's main executor (service requests and the periodic publishers).
EXECUTOR_THREADS = 4


def use_node_switch_interval() -> None:
    """Set the interpreter's GIL switch interval to GIL_SWITCH_INTERVAL_S and limit glibc to
    NODE_MALLOC_ARENAS arenas (process-wide, before any thread starts; the console scripts call
    it, a process embedding the node decides for itself). The faster thread interleaving made
    glibc spread the heap over more arenas, which kept memory after REMOVEs (robot_sdf.memory)."""
    limit_malloc_arenas(NODE_MALLOC_ARENAS)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


HELP_FLAGS = ("-h", "--help")


def help_requested(argv: list[str]) -> bool:
    """Whether -h or --help is among the program's own arguments: ``argv[1:]`` outside the ROS
    arguments (from --ros-args up to a lone ``--`` or the end)."""
    in_ros_args = False
    for arg in argv[1:]:
        if in_ros_args:
            in_ros_args = arg != "--"
        elif arg == "--ros-args":
            in_ros_args = True
        elif arg in HELP_FLAGS:
            return True
    return False


def usage(program: str, what: str) -> str:
    """A console script's --help: what it runs, how ROS arguments are passed, every parameter."""
    return (f"usage: {program} [-h] [--ros-args [ROS arguments ...] [--]]\n\n{what}\n\n"
            "options:\n  -h, --help  show this help and exit (nothing is started)\n\n"
            "ROS arguments follow --ros-args: parameters (-p name:=value, --params-file FILE), remappings\n"
            "(-r __node:=name, -r __ns:=/namespace, -r topic:=other), --log-level LEVEL. For example:\n"
            f"  {program} --ros-args --params-file config/sdf_server.yaml -p device:=cpu\n"
            f"  ros2 run robot_sdf {program} --ros-args -p scene_file:=config/demo_world.yaml\n\n"
            + parameter_help() + "\n")


def run_node(node_class: type[Node], args: list[str] | None, logger_name: str, help_text: str = "") -> int:
    """Run ``node_class()`` on a DrainingExecutor until SIGINT or SIGTERM (exit code 0).

    Exit code 2 when its constructor raises ConfigError (invalid parameters or scene file),
    logged as ``logger_name``. Shared by the ``sdf_server`` and ``sdf_server_managed`` console
    scripts.

    SIGINT and SIGTERM are handled here, not by rclpy: rclpy's handler shuts every context down
    from its own thread at once, while the node's executors (this one, the world-update and
    transform threads on their own contexts) are still waiting on them; under load that race
    ended the process with a segmentation fault at shutdown (seen twice in stressed test runs,
    the crashing thread a native one). Here a signal only asks the main loop to stop; the
    executors, the node (which stops its own threads and contexts) and the contexts are then
    shut down in that order, from this thread.

    With -h or --help among the program's own arguments (``args``, else sys.argv; help_requested)
    it prints ``help_text`` and returns 0 before anything starts.
    """
    if help_text and help_requested(sys.argv if args is None else args):
        print(help_text, end="", flush=True)
        return 0
    use_node_switch_interval()
    # A crash in native code (rclpy, Warp, torch) then leaves the Python stacks of every thread in
    # the node's log instead of a bare exit status -11.
    faulthandler.enable()
    # SIGUSR1 writes every thread's Python stack to the log and the node runs on: a supervisor
    # (robot_sdf.ros.server_process) asks for it before killing a node that did not stop.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    stop = threading.Event()
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    node: Node | None = None
    executor: DrainingExecutor | None = None
    try:
        node = node_class()
        executor = DrainingExecutor(num_threads=EXECUTOR_THREADS)
        executor.add_node(node)
        # Not executor.spin(): each wait ends after SPIN_POLL_S at the latest, so a stop request
        # (a Python signal handler runs between waits) or a context shut down elsewhere is seen
        # within that.
        while not stop.is_set() and node.context.ok():
            try:
                executor.spin_once(timeout_sec=SPIN_POLL_S)
            except Exception:  # noqa: BLE001 - the context was shut down during the call (rclpy then
                # fails to create the wait's timeout timer: RCLError); anything else with the
                # context still up is a real error
                if node.context.ok():
                    raise
    except ConfigError as exc:
        rclpy.logging.get_logger(logger_name).error(f"invalid configuration: {exc}")
        return 2
    except ExternalShutdownException:
        pass
    finally:
        if executor is not None:
            executor.shutdown()
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
