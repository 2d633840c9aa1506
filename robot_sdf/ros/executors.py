"""Executors of the sdf_server node that stop without stray errors.

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

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from rclpy.executors import ExternalShutdownException, Executor, ShutdownException, SingleThreadedExecutor, TimeoutException
from rclpy.node import Node
from rclpy.task import Future, Task


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
