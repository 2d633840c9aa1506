"""The sdf_server node's process: run_node (signals, the main executor), the executor threads of
its companion nodes, and the process-wide tuning the console scripts apply.

Shutdown without stray errors. rclpy's Executor.shutdown() destroys the executor's guard
condition at once, while callbacks it has already handed out may still be about to start; each
callback triggers that guard condition when it starts, so one that starts after the shutdown
fails with InvalidHandle ("cannot use Destroyable because destruction was requested"). In
rclpy's MultiThreadedExecutor that failure stays in the callback's Task, which nobody reads any
more, and the Task prints "The following exception was never retrieved: ..." to stderr when it
is collected: that was on every SIGINT of a busy node (under ``ros2 launch``, on the operator's
console). A thread spinning a SingleThreadedExecutor while another thread shuts it down has the
same race, and there the exception ends the spinning thread with a traceback. Hence:

- DrainingExecutor, the node's main executor: multi-threaded like rclpy's MultiThreadedExecutor
  (written on the public Executor API), but its shutdown() first lets the callbacks it handed to
  its threads finish;
- ExecutorThread, for the companion nodes (world updates, transforms): a SingleThreadedExecutor
  on a thread of its own; stop() ends the spin loop and joins the thread before it shuts the
  executor down.
"""
from __future__ import annotations

import faulthandler
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import rclpy
from rclpy.executors import (ExternalShutdownException, Executor, ShutdownException, SingleThreadedExecutor,
                             TimeoutException)
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions
from rclpy.task import Future, Task

from robot_sdf.memory import limit_malloc_arenas
from robot_sdf.ros.parameters import ConfigError

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


class DrainingExecutor(Executor):
    """Runs callbacks on a pool of ``num_threads`` threads, as rclpy's MultiThreadedExecutor does
    (an exception of a callback is raised from a later spin_once); shutdown() waits for the
    callbacks already handed to the pool before rclpy takes the executor apart (module
    docstring). Supports spin_once() and spin()."""

    def __init__(self, num_threads: int, *, context=None) -> None:
        super().__init__(context=context)
        self._pool = ThreadPoolExecutor(num_threads)
        self._handed_out: list[Task] = []

    def spin_once(self, timeout_sec: float | None = None) -> None:
        try:
            handler, _, _ = self.wait_for_ready_callbacks(timeout_sec=timeout_sec)
        except (ExternalShutdownException, ShutdownException, TimeoutException):
            return
        self._pool.submit(handler)
        self._handed_out.append(handler)
        for task in self._handed_out[:]:
            if task.done():
                self._handed_out.remove(task)
                task.result()  # raises the callback's exception, if any

    def shutdown(self, timeout_sec: float | None = None) -> bool:
        self._pool.shutdown(wait=True)
        return super().shutdown(timeout_sec)


class ExecutorThread:
    """``node`` spun by a SingleThreadedExecutor on a daemon thread called ``name`` until stop().

    An exception out of the executor while ``node``'s context is still up goes to ``on_error``
    (default: it ends the thread with its traceback); once the context is shut down (rclpy then
    raises from the wait) the thread ends quietly."""

    def __init__(self, node: Node, name: str, on_error: Callable[[Exception], None] | None = None) -> None:
        self.executor = SingleThreadedExecutor(context=node.context)
        self.executor.add_node(node)
        self._context = node.context
        self._on_error = on_error
        self._stop = Future()
        self._thread = threading.Thread(target=self._spin, name=name, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            self.executor.spin_until_future_complete(self._stop)
        except (ExternalShutdownException, KeyboardInterrupt):
            pass
        except Exception as exc:  # noqa: BLE001 - see the class docstring
            if not self._context.ok():
                return
            if self._on_error is None:
                raise
            self._on_error(exc)

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the spin loop (the callback in progress finishes), join the thread, then shut the
        executor down: no callback of it can start afterwards."""
        if not self._stop.done():
            self._stop.set_result(True)  # its done callback wakes the executor
        self._thread.join(timeout=timeout_s)
        self.executor.shutdown(timeout_sec=2.0)


def run_node(node_class: type[Node], args: list[str] | None, logger_name: str) -> int:
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
    """
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
