"""``type: custom``: a user function from ``script_path`` run in a process pool.

The function is called ``fn(variables, row)`` when its signature accepts two positional
arguments, else ``fn(variables)`` (so one-argument functions written for the reference
pipeline keep working). ``variables`` holds
the row's inputs and earlier outputs; ``row`` is the raw source row. Its return value must be
picklable plain data.

Failures (the reference pipeline's rules, which existing configs tune): a call that raises or
runs past ``timeout_ms`` gives a copy of ``fallback_value``, and the counters are per processor
(per shard); a counter reaching ``max_errors`` / ``max_timeouts`` (``>=``), or a worker process
dying, trips the breaker. A tripped breaker does not fail the shard (the rows already computed
are paid for): the remaining rows get ``fallback_value`` without a call. Every such row also
carries an ``error`` saying why, so no fallback is silent.

Timeouts: the worker interrupts its own call with SIGALRM (so the clock starts when the call
does, not when it was queued, and the worker survives). A call that ignores the alarm (stuck in
C code) is caught by the parent's hard deadline, which kills the pool and starts a fresh one, so
a hung worker never hangs the shard.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import importlib.util
import inspect
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import BrokenExecutor, ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmirage.config.errors import ConfigError
from mmirage.core.process.base import OutputRequest, OutputResult, Processor, RunContext
from mmirage.errors import MmirageError

if TYPE_CHECKING:
    from mmirage.config.processors import CustomProcessorConfig

_HARD_GRACE_S = 5.0  # past timeout_ms, before the parent kills a call that ignores the alarm
_WARMUP_TIMEOUT_S = 300.0  # loading the script in the workers (it may import heavy libraries)

# --- worker side: runs in the pool's processes; keep module imports light -----------------

_LOADED: dict[tuple[str, str], tuple[Callable[..., Any], bool]] = {}


class _CallTimeout(BaseException):
    """Raised by the alarm; a BaseException so that ``except Exception`` in user code lets it by."""


def _load(path: str, name: str) -> tuple[Callable[..., Any], bool]:
    """The function and whether it takes the raw row too; loaded once per worker."""
    key = (path, name)
    if key not in _LOADED:
        script = Path(path)
        # A unique module name per script, and its folder on sys.path for sibling imports.
        module_name = "mmirage_custom_" + hashlib.sha1(path.encode()).hexdigest()[:12]
        if str(script.parent) not in sys.path:
            sys.path.insert(0, str(script.parent))
        spec = importlib.util.spec_from_file_location(module_name, script)
        if spec is None or spec.loader is None:
            raise ImportError(f"{path} is not a loadable Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
        fn = getattr(module, name, None)
        if fn is None:
            raise LookupError(f"{path} has no function {name!r}")
        if not callable(fn):
            raise LookupError(f"{name!r} in {path} is not a function")
        _LOADED[key] = (fn, _takes_row(fn))
    return _LOADED[key]


def _takes_row(fn: Callable[..., Any]) -> bool:
    try:
        inspect.signature(fn).bind({}, {})
    except TypeError:
        return False
    except ValueError:  # no signature (some builtins): the one-argument call
        return False
    return True


def _probe(path: str, name: str) -> tuple[str, str] | None:
    """Load the function; None, or the config field to blame and the problem in one sentence."""
    try:
        _load(path, name)
    except LookupError as exc:
        return "function_name", str(exc)
    except BaseException as exc:
        return "script_path", f"{path} could not be loaded: {type(exc).__name__}: {exc}"
    return None


def _alarm(signum: int, frame: Any) -> None:
    raise _CallTimeout


def _call(
    path: str, name: str, variables: dict[str, Any], row: dict[str, Any], timeout_s: float | None
) -> tuple[str, Any]:
    """("ok", value), ("error", sentence) or ("timeout", None); never raises for the user."""
    try:
        fn, takes_row = _load(path, name)
    except BaseException as exc:
        return "error", f"{path} could not be loaded: {type(exc).__name__}: {exc}"
    use_alarm = timeout_s is not None and threading.current_thread() is threading.main_thread()
    if use_alarm:
        assert timeout_s is not None
        previous = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        value = fn(variables, row) if takes_row else fn(variables)
    except _CallTimeout:
        return "timeout", None
    except Exception as exc:
        return "error", f"{type(exc).__name__}: {exc}"
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    return "ok", value


# --- parent side ---------------------------------------------------------------------------


class _PoolKilled(MmirageError):
    """The pool was killed on purpose (another row's hung call): calls caught in it run again."""


class CustomProcessor(Processor):
    @classmethod
    def from_config(cls, config: Any, context: RunContext | None = None) -> CustomProcessor:
        return cls(config)  # a function of the row alone: nothing of the run to know

    def __init__(
        self, config: CustomProcessorConfig, *, hard_grace_s: float = _HARD_GRACE_S
    ) -> None:
        self.config = config
        self.source = f"processor '{config.name or config.type}'"
        script = Path(config.script_path).expanduser()
        self.script = str(script if script.is_absolute() else Path.cwd() / script)
        if not Path(self.script).is_file():
            raise ConfigError(
                self.source, "script_path", f"the script {self.script} does not exist"
            )
        self.timeout_s = config.timeout_ms / 1000 if config.timeout_ms else None
        self.hard_grace_s = hard_grace_s
        self.timeouts = 0
        self.errors = 0
        self.breaker: str | None = None  # why it is open, once it is
        self._pool: ProcessPoolExecutor | None = None
        self._generation = 0  # bumped when a pool is killed on purpose
        self._restarting: asyncio.Future[tuple[str, str] | None] | None = None
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        problem = self._start_pool()
        if problem:
            # Its workers answered and wait idle: stopped in order, so that no management
            # thread or semaphore outlives the error (the resource tracker would warn about it
            # on stderr after the one-sentence error, now and then).
            self._shutdown(kill=False)
            raise ConfigError(self.source, *problem)

    def request_identity(self, output: Any) -> Any:
        # Computed here, paid for by nobody: not stored (an edited script, or a module it
        # imports, must take effect; and its values may be large). A killed shard computes
        # its rows in flight again.
        return None

    # -- pool lifecycle ------------------------------------------------------------------

    def _start_pool(self) -> tuple[str, str] | None:
        """A fresh pool whose workers have loaded the function (so that loading time never
        counts against timeout_ms); the loading problem, if any."""
        import multiprocessing

        context = multiprocessing.get_context(self.config.start_method)
        pool = ProcessPoolExecutor(
            self.config.max_workers, mp_context=context, initializer=_die_with_parent
        )
        self._pool = pool
        name = self.config.function_name
        probes = [pool.submit(_probe, self.script, name) for _ in range(self.config.max_workers)]
        try:
            problems = [p.result(timeout=_WARMUP_TIMEOUT_S) for p in probes]
        except Exception as exc:  # a worker died or hung while importing the script
            self._shutdown(kill=True)
            return "script_path", f"{self.script} could not be loaded: {type(exc).__name__}: {exc}"
        return next((p for p in problems if p), None)

    def _shutdown(self, *, kill: bool) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if kill:
            # Python 3.11 has no public way to stop a busy worker; a hung one must be killed.
            processes = getattr(pool, "_processes", None) or {}
            for process in list(processes.values()):
                process.kill()
        pool.shutdown(wait=not kill, cancel_futures=True)

    async def _kill_pool(self, restart: bool) -> None:
        """Kill the pool under a hung call; the calls caught in it run again in a new one."""
        self._generation += 1
        self._shutdown(kill=True)
        if not restart:
            return
        self._restarting = asyncio.ensure_future(asyncio.to_thread(self._start_pool))
        try:
            problem = await self._restarting
        finally:
            self._restarting = None
        if problem:
            self._open_breaker(f"the worker pool could not restart ({problem[1]})")

    async def aclose(self) -> None:
        await asyncio.to_thread(self._shutdown, kill=False)

    # -- calls -----------------------------------------------------------------------------

    async def process(self, output: Any, requests: Sequence[OutputRequest]) -> list[OutputResult]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    def _semaphore(self) -> asyncio.Semaphore:
        # One per event loop: a semaphore is bound to the loop that first waits on it.
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.config.max_workers))
        return self._slots[1]

    def _fallback(self, error: str, retryable: bool) -> OutputResult:
        return OutputResult(
            value=copy.deepcopy(self.config.fallback_value),
            error=error,
            retryable=retryable,
            fallback=True,
        )

    def _open_breaker(self, reason: str) -> None:
        if self.breaker is None:
            self.breaker = reason

    async def _one(self, request: OutputRequest) -> OutputResult:
        async with self._semaphore():  # at most max_workers in flight: a queued call is not timed
            while True:
                if self._restarting is not None:
                    await asyncio.shield(self._restarting)
                if self.breaker is None and self._pool is None:
                    self._open_breaker("the worker pool is gone")
                if self.breaker is not None:
                    return self._fallback(
                        f"not called: the circuit breaker is open ({self.breaker}); "
                        "fallback_value used",
                        retryable=True,  # the function never ran on this row
                    )
                try:
                    return await self._attempt(request)
                except _PoolKilled:
                    continue

    async def _attempt(self, request: OutputRequest) -> OutputResult:
        assert self._pool is not None
        generation = self._generation
        name = self.config.function_name
        try:
            future = self._pool.submit(
                _call, self.script, name, request.variables, request.row, self.timeout_s
            )
        except BrokenExecutor:
            raise _PoolKilled from None
        hard = None if self.timeout_s is None else self.timeout_s + self.hard_grace_s
        try:
            status, value = await asyncio.wait_for(asyncio.wrap_future(future), hard)
        except TimeoutError:
            # The call ignored the alarm (stuck in C code): only killing its worker stops it.
            result = self._count_timeout()
            if generation == self._generation:
                await self._kill_pool(restart=self.breaker is None)
            return result
        except BrokenExecutor:
            if generation != self._generation:
                raise _PoolKilled from None
            # A worker died (a crash in C code, out of memory, os._exit): trips at once.
            self._open_breaker(f"a worker process died while running '{name}'")
            self._shutdown(kill=True)
            return self._fallback(
                f"a worker process died while running '{name}' (a crash or out of memory); "
                "fallback_value used",
                retryable=False,
            )
        except Exception as exc:  # e.g. the return value could not be pickled
            status, value = "error", f"{type(exc).__name__}: {exc}"
        if status == "ok":
            return OutputResult(value=value)
        if status == "timeout":
            return self._count_timeout()
        self.errors += 1
        if self.errors >= self.config.max_errors:
            self._open_breaker(f"{self.errors} error(s), max_errors is {self.config.max_errors}")
        return self._fallback(f"'{name}' raised {value}; fallback_value used", retryable=False)

    def _count_timeout(self) -> OutputResult:
        self.timeouts += 1
        if self.timeouts >= self.config.max_timeouts:
            self._open_breaker(
                f"{self.timeouts} timeout(s), max_timeouts is {self.config.max_timeouts}"
            )
        return self._fallback(
            f"'{self.config.function_name}' timed out after {self.config.timeout_ms} ms; "
            "fallback_value used",
            retryable=True,
        )


__all__ = ["CustomProcessor"]


def _die_with_parent() -> None:
    """Ask Linux to kill this worker when the shard's process dies (even by kill -9), so that
    no orphaned worker keeps running, or holding memory, after its shard is gone."""
    import signal

    # A terminal's Ctrl-C reaches the workers too: the shard's own process stops them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(1)
