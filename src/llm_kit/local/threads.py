"""How many threads llama.cpp decodes with, and how its idle OpenMP workers wait.

The candidates come from the CPUs this process may use (a container or ``taskset`` can allow
fewer than the machine has): one thread per usable CPU, half as many, and one. Which one is
fastest depends on what else runs on the machine, so :class:`ThreadTuner` times decode steps
and keeps the fastest, again as load changes (figures: ``docs/batching.md``, "The local
model").
OpenMP's wait policy is left at its default (spin briefly, then sleep): a global ``PASSIVE``
cost 2.7x on a quiet machine, and the tuner avoids the case where spinning hurts (more threads
than free cores) by dropping to fewer threads. ``LLM_KIT_LOCAL_THREADS`` or the processor
setting ``local_threads`` fix the count instead; ``OMP_WAIT_POLICY`` set by the user is kept.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from llm_kit.errors import ConfigError

THREADS_ENV = "LLM_KIT_LOCAL_THREADS"
WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
_WAIT_POLICIES = frozenset({"active", "passive"})

logger = logging.getLogger("llm_kit.local")


@dataclass(frozen=True)
class ThreadChoice:
    """The decode threads to choose from, the OpenMP wait policy, and where they came from
    (for the log)."""

    candidates: tuple[int, ...]
    wait_policy: str
    source: str

    @property
    def n_threads(self) -> int:
        """The count a context starts with: the fewest (the tuner tries the others)."""
        return self.candidates[-1]

    def describe(self, usable: int) -> str:
        counts = " or ".join(str(c) for c in self.candidates)
        how = "timed on decode steps" if len(self.candidates) > 1 else "fixed"
        return (
            f"embedded model: {counts} thread(s) ({how}) of {usable} usable CPU(s), "
            f"OpenMP wait policy {self.wait_policy} ({self.source})"
        )


def usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not available on macOS or Windows
        return os.cpu_count() or 1


def _threads_from_env() -> int | None:
    raw = os.environ.get(THREADS_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{THREADS_ENV} must be a whole number >= 1, got {raw!r}")
    return value


def choose_threads(requested: int | None) -> ThreadChoice:
    """The environment variable wins, then the caller's setting, then the tuner's choice."""
    from_env = _threads_from_env()
    candidates: tuple[int, ...]
    if from_env is not None:
        candidates, source = (from_env,), f"from {THREADS_ENV}"
    elif requested is not None:
        candidates, source = (requested,), "from the processor setting local_threads"
    else:
        usable = usable_cpus()
        candidates = tuple(sorted({usable, max(1, usable // 2), 1}, reverse=True))
        source = "the usable CPUs, half of them, or one"
    policy = os.environ.get(WAIT_POLICY_ENV, "").strip().lower()
    if policy in _WAIT_POLICIES:
        source += f"; wait policy from {WAIT_POLICY_ENV}"
    else:
        policy = "default"
    return ThreadChoice(candidates, policy, source)


def log_choice(choice: ThreadChoice) -> None:
    logger.info(choice.describe(usable_cpus()))


class ThreadTuner:
    """Picks the decode thread count by timing decode steps, again as load changes.

    With two or more threads, OpenMP workers wait for each other at every step; when another
    process holds a core, one of them is often descheduled and a step takes up to 100x longer
    (measured: 5 tok/s with 2 threads against 64 with 1 on a loaded 2-core machine, while on a
    quiet one 2 threads are the faster). So the first choice is timed when the model loads
    (:meth:`calibrate`); later the candidates are tried again in turn on a few decode steps
    (interleaved, so that both see the same load and batch) and the fastest is kept.

    A trial costs steps on a slower count, so it comes only when it can pay: at the most
    threads, when steps of one width get ``SLOWER`` times slower than the fastest seen since
    the last trial (another process took a core), or after ``MAX_INTERVAL`` steps; at fewer
    threads, every ``interval`` steps (a quiet machine gives no other sign), an interval that
    doubles while the choice holds. A candidate ``GIVE_UP`` times slower than the best is
    dropped at its first such step.
    """

    ROUNDS = 3  # steps per candidate in one trial
    FIRST_INTERVAL = 32
    MAX_INTERVAL = 2048
    GIVE_UP = 1.5  # a step this many times slower than the best ends that candidate's trial
    SLOWER = 1.5  # a step this many times slower than the fastest of its width is slow...
    SLOW_STEPS = 3  # ...and this many slow steps in a row call a trial

    def __init__(self, candidates: list[int]) -> None:
        self.candidates = candidates
        # The fewest threads first: never the pathological case, and at worst 2x slow.
        self.current = candidates[-1]
        self.trials = 0
        self._interval = self.FIRST_INTERVAL
        self._countdown = 2  # the first steps warm caches up: not measured
        self._plan: list[int] = []
        self._times: dict[int, list[float]] = {}
        self._fastest: dict[int, float] = {}  # width -> fastest step at the current count
        self._slow_steps = 0

    def calibrate(self, step: Callable[[int], float]) -> None:
        """The first choice, before any request: ``step(threads)`` times one small decode.
        A trial as on decode steps; before it, each count above one runs once unmeasured
        (OpenMP starts its threads on first use)."""
        if len(self.candidates) < 2:
            return
        for threads in self.candidates:
            if threads > 1:
                step(threads)
        self._begin_trial()
        while self._plan:
            threads = self._plan[0]
            self._trial_step(threads, step(threads))

    def pick(self, measurable: bool) -> int:
        """The thread count for the next decode step (``measurable``: no prompt in it)."""
        if len(self.candidates) < 2:
            return self.current
        if not self._plan and self._countdown <= 0 and measurable:
            self._begin_trial()
        if self._plan and measurable:
            return self._plan[0]
        return self.current

    def _begin_trial(self) -> None:
        # The current choice first, so that each other candidate's first step is compared
        # with it (and dropped at once when far slower).
        order = [self.current, *(c for c in self.candidates if c != self.current)]
        self._plan = [c for _ in range(self.ROUNDS) for c in order]
        self._times = {c: [] for c in self.candidates}

    def record(self, threads: int, seconds: float, width: int | None) -> None:
        """A step's time; ``width``: its sequences when it decoded one token each, None when
        it held prompt tokens (then its time compares with nothing)."""
        if self._plan and width is not None and self._plan[0] == threads:
            self._trial_step(threads, seconds)
            return
        self._countdown -= 1
        if width is not None and threads == self.current == self.candidates[0]:
            self._watch(width, seconds)

    def _trial_step(self, threads: int, seconds: float) -> None:
        self._plan.pop(0)
        self._times[threads].append(seconds)
        best = min(min(t) for t in self._times.values() if t)
        if seconds > self.GIVE_UP * best:
            self._plan = [c for c in self._plan if c != threads]
        if len(set(self._plan)) < 2 and all(self._times[c] for c in self._plan):
            self._plan = []  # the others are out: the rest would measure nothing new
            self._decide()

    def _watch(self, width: int, seconds: float) -> None:
        """At the most threads: a run of slow steps means a core was taken, so try now."""
        fastest = self._fastest.get(width)
        if fastest is None or seconds < fastest:
            self._fastest[width] = seconds
        if fastest is not None and seconds > self.SLOWER * fastest:
            self._slow_steps += 1
            if self._slow_steps >= self.SLOW_STEPS:
                self._countdown = 0
        else:
            self._slow_steps = 0

    def _decide(self) -> None:
        def median(values: list[float]) -> float:
            return sorted(values)[len(values) // 2] if values else float("inf")

        chosen = min(self.candidates, key=lambda c: median(self._times[c]))
        steps = ", ".join(
            f"{c} thread(s) {median(self._times[c]) * 1000:.0f} ms" for c in self.candidates
        )
        if self.trials == 0:
            logger.info(f"embedded model: decoding with {chosen} thread(s) (a step took {steps})")
        else:
            logger.debug(f"embedded model: {chosen} thread(s) now (a step took {steps})")
        same = chosen == self.current
        self.trials += 1
        self.current = chosen
        self._fastest.clear()
        self._slow_steps = 0
        self._interval = min(self._interval * 2, self.MAX_INTERVAL) if same else self.FIRST_INTERVAL
        most = chosen == self.candidates[0]
        self._countdown = self.MAX_INTERVAL if most else self._interval
