"""What a long run survives: a stop request (SIGTERM or a TPU preemption notice, Ctrl-C, the time limit)
taken at a step every process agrees on; non-finite steps, skipped or stopped at; hangs, ended by a
watchdog that dumps every thread's stack."""
from __future__ import annotations

import faulthandler
import os
import signal
import statistics
import sys
import threading
import time
import traceback

import numpy as np
from etils import epath
from jax.experimental import multihost_utils

HANG_EXIT = 75  # EX_TEMPFAIL: the job may be restarted
REASON_BYTES = 256  # the longest reason for a stop the processes of a run tell each other
TEST_HANG_ENV = "JAXLM_TEST_HANG_AT_STEP"  # a test hook: the step at which the loop sleeps forever


def stop_status(reason: str) -> int:
    """The exit status of a run stopped before its last step with its checkpoint saved, by `StopRequests.reason`:
    never 0, which a scheduler (a Kubernetes Job, a restart loop) reads as a finished run. Ctrl-C 130 and SIGTERM
    143, as any command stopped by them; the time limit EX_TEMPFAIL, as a hang: the same command continues. Every
    process of a run gives the same reason, hence the same status (`agreed_reason`)."""
    if reason == "Ctrl-C":
        return 130
    if reason.startswith("train.time_limit_minutes"):
        return HANG_EXIT
    return 128 + signal.SIGTERM


class StoppedEarly(Exception):
    """A run stopped before its last step with its checkpoint saved (it has said so); `status` is its exit status."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


class TrainingStopped(RuntimeError):
    """The run stopped on a fault it cannot train through; the message says why and what to do."""


class StopRequests:
    """SIGTERM and the first Ctrl-C ask the run to stop; `reached(step)` is true on every process at the
    same step, where the run saves and exits. With several processes the agreement is JAX's preemption
    sync (JAX handles SIGTERM itself; Ctrl-C and the time limit raise a SIGTERM to join it), alone a
    flag. A second Ctrl-C ends the process at once, without a checkpoint."""

    def __init__(self, multiprocess: bool, message=print):
        self.multiprocess, self.message = multiprocess, message
        self.reason: str | None = None
        self._previous: dict = {}

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            if not self.multiprocess:  # JAX's preemption notifier holds SIGTERM in a multi-process run
                self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, lambda *_: self.ask("SIGTERM"))
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_interrupt)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _on_interrupt(self, *_) -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        self.message("interrupted: a checkpoint is saved at the next step every process reaches "
                     "(Ctrl-C again aborts without one)")
        self.ask("Ctrl-C")

    def ask(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            if self.multiprocess:
                os.kill(os.getpid(), signal.SIGTERM)

    def reached(self, step: int) -> bool:
        if not self.multiprocess:
            return self.reason is not None
        if not multihost_utils.reached_preemption_sync_point(step):
            return False
        self.reason = agreed_reason(self.reason)  # every process is here, at this step
        return True


def agreed_reason(own: str | None) -> str:
    """The reason for a stop every process of the run gives, collectively: that of the first process (by index) that
    asked for the stop itself, else a SIGTERM from outside (a preemption notice, which JAX's handler took). JAX's
    preemption sync tells the other processes only that there is a stop: they said SIGTERM, and exited 143 where the
    asking one exited 75 for its time limit, which a scheduler reading each host's status took for two outcomes."""
    text = np.zeros(REASON_BYTES, np.uint8)
    own_bytes = (own or "").encode()[:REASON_BYTES]
    text[:len(own_bytes)] = np.frombuffer(own_bytes, np.uint8)
    every = np.asarray(multihost_utils.process_allgather(text))  # [processes, REASON_BYTES]
    asked = [bytes(row).rstrip(b"\0").decode(errors="replace") for row in every if row.any()]
    return asked[0] if asked else "SIGTERM (a preemption notice)"


def check_step(step: int, metrics: dict, settings, batch_indices, message=print) -> None:
    """After a step (its metrics fetched): nothing if it was finite; else, by `train.nonfinite`, stop
    naming the step and its examples, or note the skip (its update was dropped) and stop after
    `train.max_skipped` in a row. `batch_indices(step)` -> (epoch, example indices) of its batch."""
    in_a_row = int(metrics["nonfinite_in_a_row"])
    if in_a_row == 0:
        return
    epoch, indices = batch_indices(step - 1)
    where = (f"step {step} (loss {float(metrics['loss']):.4g}, gradient norm {float(metrics['grad_norm']):.4g}; "
             f"training examples {', '.join(map(str, indices))} of epoch {epoch})")
    if settings.nonfinite == "stop":
        raise TrainingStopped(f"{where} is not finite; the run stopped without saving it (train.nonfinite=stop). "
                              "Lower optim.peak_lr, raise optim.warmup_steps, or set train.nonfinite=skip, and run "
                              "the same command to resume from the last checkpoint")
    if in_a_row >= settings.max_skipped:
        what = "skipped steps (non-finite or loss spikes)" if "loss_spikes" in metrics else "non-finite steps"
        raise TrainingStopped(f"{in_a_row} {what} in a row, the last {where}; stopped "
                              f"(train.max_skipped={settings.max_skipped}). Lower optim.peak_lr and run the same "
                              "command to resume from the last checkpoint")
    why = "a loss spike (train.spike_sigmas)" if metrics.get("last_step_spiked") else "not finite"
    message(f"skipped {where}: {why}, its update dropped ({int(metrics['skipped_steps'])} skipped in all)")


class Watchdog:
    """A thread that ends a hung run: when no progress is reported (`beat`) for `timeout_s` seconds, it
    writes every thread's stack to stderr and to `dump`, and exits the process with HANG_EXIT. With
    `timeout_s` 0 the limit is `factor` times the median step time once `warmup` steps ran, at least
    `floor_s`; below 0 there is no watchdog."""

    def __init__(self, timeout_s: float, dump: epath.Path, factor: float = 20.0, warmup: int = 10,
                 floor_s: float = 300.0):
        self.fixed, self.dump, self.factor, self.warmup, self.floor = timeout_s, dump, factor, warmup, floor_s
        self.step_times: list[float] = []
        self.last = time.monotonic()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="jaxlm-watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        if self.fixed >= 0:
            self.last = time.monotonic()
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()

    def beat(self, step_done: bool = False) -> None:
        now = time.monotonic()
        if step_done:
            self.step_times = [*self.step_times[-99:], now - self.last]
        self.last = now

    def limit(self) -> float | None:
        if self.fixed > 0:
            return self.fixed
        if len(self.step_times) < self.warmup:
            return None
        return max(self.floor, self.factor * statistics.median(self.step_times))

    def _watch(self) -> None:
        while not self._done.wait(0.5):
            limit = self.limit()
            idle = time.monotonic() - self.last
            if limit is not None and idle > limit:
                self._bite(idle, limit)

    def _bite(self, idle: float, limit: float) -> None:
        text = (f"watchdog: no training progress for {idle:.0f} s (limit {limit:.0f} s, train.hang_timeout_s); "
                f"every thread's stack follows (also in {self.dump}); exiting {HANG_EXIT} so the job is restarted")
        print(text, file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        try:
            self.dump.write_text(f"{text}\n\n{thread_stacks()}")
        except Exception:  # any failure to write the dump: the hung run must still end
            pass
        sys.stderr.flush()
        os._exit(HANG_EXIT)


def thread_stacks() -> str:
    """Every thread's stack as text (faulthandler writes only to a file descriptor, not to cloud storage)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return "\n".join(f"thread {names.get(ident, ident)} (most recent call last):\n"
                     + "".join(traceback.format_stack(frame)) for ident, frame in sys._current_frames().items())


def sleep_if_asked(step: int) -> None:
    """The hang of the watchdog test: with JAXLM_TEST_HANG_AT_STEP=N the loop sleeps at step N."""
    if os.environ.get(TEST_HANG_ENV) == str(step):
        while True:
            time.sleep(60)
