"""``make fuzz``: fuzz every reader, and the CLI end to end, in worker processes.

    PYTHONPATH=tests python -m fuzz [--cases 100000] [--cli-cases 3000] [--seed 0] [--jobs 2]
                                    [--targets graphdef,onnx,...] [--out build/fuzz-failures]

``--cases`` reader cases are split evenly over the targets
(:data:`fuzz.targets.TARGETS`); ``--cli-cases`` more go through the CLI
(:mod:`fuzz.cli_slice`). Case ``i`` of a target is a pure function of
``(--seed, target, i)``, so a run is reproducible and a failure is replayed
by its number. Work is handed out in chunks to ``--jobs`` processes; each
caps its address space (:func:`fuzz.oracle.memory_limit`) after importing
TensorFlow (whose shape inference the GraphDef reader may call) and times
every case (:data:`fuzz.oracle.TIME_LIMIT_S`). A worker that dies (a
crash in native code) or stops making progress is replaced and the case it
was running counted as a failure. A progress line is printed as it goes and
a summary table at the end; every failing input is written to ``--out``
(``<target>/<index>.<ext>`` and a ``.txt`` saying what went wrong, how the
case was made and how to replay it). The exit status is 1 when any case
failed, else 0.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Before anything imports TensorFlow: no log lines over the progress line.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CLI = "cli"
CHUNK = {CLI: 10}  # cases per task; readers take DEFAULT_CHUNK
DEFAULT_CHUNK = 50
# A worker silent this long on one case is stuck in native code (the in-process timer could not fire).
STUCK_S = 120.0
# A worker's status: kind index, its task's start and stop, the case running, when it started (-1: idle).
_STATUS = 5
_IDLE = [-1.0] * _STATUS


def _kinds() -> list[str]:
    from fuzz.targets import TARGETS

    return [*TARGETS, CLI]


def _regenerate(kind: str, run_seed: int, index: int) -> tuple[bytes, str, str]:
    """(input bytes, file suffix, how it was made) of case ``index`` of ``kind``."""
    from fuzz.cli_slice import make_cli_case
    from fuzz.oracle import make_case
    from fuzz.targets import TARGETS

    if kind == CLI:
        cli = make_cli_case(run_seed, index)
        case = cli.case
        how = f"baechi {' '.join(cli.args)} (input: {case.target} from {case.seed}, {case.how})"
    else:
        case = make_case(kind, run_seed, index)
        how = f"{case.how} mutation of {case.seed}, reader options {case.options}"
    return case.data, Path(TARGETS[case.target].filename).suffix, how


def save_failure(out: Path, kind: str, run_seed: int, index: int, failure: str) -> Path:
    """Write case ``index``'s input and a note on it under ``out/<kind>/``; returns the note's path.

    Only the note when the case cannot be made (a bug in the harness's own mutations).
    """
    directory = out / kind
    directory.mkdir(parents=True, exist_ok=True)
    note = directory / f"{index}.txt"
    replay = f"PYTHONPATH=tests python -m fuzz --seed {run_seed} --targets {kind} --replay {index}"
    try:
        data, suffix, how = _regenerate(kind, run_seed, index)
    except Exception as err:
        how = f"the case cannot be made: {type(err).__name__}: {err}"
    else:
        (directory / f"{index}{suffix}").write_bytes(data)
    note.write_text(f"{failure}\n{how}\nreplay: {replay}\n")
    return note


def _run_one(kind: str, run_seed: int, index: int, workdir: Path) -> tuple[str | None, bool]:
    """(failure or None, whether the reader accepted the input) of one case, run here."""
    from fuzz.cli_slice import check_cli, make_cli_case
    from fuzz.oracle import check_case, make_case

    try:
        if kind == CLI:
            return check_cli(make_cli_case(run_seed, index), workdir), False
        verdict = check_case(make_case(kind, run_seed, index), workdir)
    except Exception as err:  # the oracle judges the reader; this is the harness failing
        return f"harness error: {type(err).__name__}: {' '.join(str(err).split())[:200]}", False
    return verdict.failure, verdict.accepted


def warm_up() -> None:
    """Import TensorFlow (if installed) and build every target's seeds, outside the timed cases."""
    from fuzz.targets import TARGETS

    try:
        import tensorflow  # noqa: F401  (the GraphDef reader's shape inference imports it)
    except ImportError:
        pass
    for target in TARGETS.values():
        target.seeds()


def _worker(slot: int, tasks: Any, results: Any, status: Any, run_seed: int, out: str) -> None:
    """Run tasks ``(kind, start, stop)`` until a None; report each as a dict on ``results``."""
    from fuzz.oracle import memory_limit

    kinds = _kinds()
    workdir = Path(tempfile.mkdtemp(prefix="baechi-fuzz-"))
    os.chdir(workdir)  # a mutated --devices string must not name a file of the checkout
    # TensorFlow's and the readers' log lines would garble the progress line; results go by queue.
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    warm_up()
    with memory_limit():
        while True:
            task = tasks.get()
            if task is None:
                return
            kind, start, stop = task
            failures = []
            accepted = 0
            t0 = time.perf_counter()
            for index in range(start, stop):
                status[slot * _STATUS : (slot + 1) * _STATUS] = [
                    kinds.index(kind),
                    start,
                    stop,
                    index,
                    time.time(),
                ]
                failure, ok = _run_one(kind, run_seed, index, workdir)
                accepted += ok
                if failure is not None:
                    save_failure(Path(out), kind, run_seed, index, failure)
                    failures.append((kind, index, failure))
            status[slot * _STATUS : (slot + 1) * _STATUS] = _IDLE
            results.put(
                {"task": task, "cases": stop - start, "accepted": accepted,
                 "seconds": time.perf_counter() - t0, "failures": failures}
            )  # fmt: skip


def _tasks(counts: dict[str, int]) -> list[tuple[str, int, int]]:
    """Chunks of every kind's cases, interleaved so that progress covers all kinds early."""
    per_kind = [
        [
            (kind, i, min(i + CHUNK.get(kind, DEFAULT_CHUNK), n))
            for i in range(0, n, CHUNK.get(kind, DEFAULT_CHUNK))
        ]
        for kind, n in counts.items()
    ]
    tasks = []
    for k in range(max((len(c) for c in per_kind), default=0)):
        tasks += [chunks[k] for chunks in per_kind if k < len(chunks)]
    return tasks


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


class Run:
    """The parent's bookkeeping: workers, outstanding tasks, totals."""

    def __init__(self, counts: dict[str, int], jobs: int, run_seed: int, out: Path) -> None:
        self.counts, self.jobs, self.run_seed, self.out = counts, jobs, run_seed, out
        self.ctx = mp.get_context("fork")  # the parent has imported nothing heavy, and no threads run
        self.tasks = self.ctx.Queue()
        self.results = self.ctx.Queue()
        self.status = self.ctx.Array("d", _IDLE * jobs)
        self.workers: list[Any] = [None] * jobs
        self.outstanding = 0
        self.done = dict.fromkeys(counts, 0)
        self.accepted = dict.fromkeys(counts, 0)
        self.seconds = dict.fromkeys(counts, 0.0)
        self.failures: list[tuple[str, int, str]] = []
        for task in _tasks(counts):
            self.tasks.put(task)
            self.outstanding += 1

    def start(self, slot: int) -> None:
        """Start a worker in ``slot``."""
        self.status[slot * _STATUS : (slot + 1) * _STATUS] = _IDLE
        worker = self.ctx.Process(
            target=_worker, args=(slot, self.tasks, self.results, self.status, self.run_seed, str(self.out))
        )
        worker.start()
        self.workers[slot] = worker

    def _lost(self, slot: int, why: str) -> None:
        """Worker ``slot`` died or hung: its case failed, the cases before it in its task passed (their
        time unknown), the cases after it go back in the queue; a new worker takes the slot."""
        kind_index, start, stop, index, _ = (
            int(x) for x in self.status[slot * _STATUS : (slot + 1) * _STATUS]
        )
        if kind_index >= 0:
            kind = _kinds()[kind_index]
            self.failures.append((kind, index, why))
            save_failure(self.out, kind, self.run_seed, index, why)
            self.done[kind] += index - start + 1
            self.outstanding -= 1
            if index + 1 < stop:
                self.tasks.put((kind, index + 1, stop))
                self.outstanding += 1
        self.start(slot)

    def watch(self) -> None:
        """Replace workers that died or are stuck."""
        for slot, worker in enumerate(self.workers):
            kind_index, *_, since = self.status[slot * _STATUS : (slot + 1) * _STATUS]
            if not worker.is_alive():
                self._lost(slot, f"crash: the worker process died (exit code {worker.exitcode})")
            elif kind_index >= 0 and time.time() - since > STUCK_S:
                worker.kill()
                worker.join()
                self._lost(slot, f"hang: no progress for {STUCK_S:g} s (stuck outside Python)")

    def collect(self, timeout: float) -> None:
        """Take one finished task's results, waiting up to ``timeout`` seconds."""
        try:
            result = self.results.get(timeout=timeout)
        except queue.Empty:
            return
        kind = result["task"][0]
        self.done[kind] += result["cases"]
        self.accepted[kind] += result["accepted"]
        self.seconds[kind] += result["seconds"]
        self.failures += result["failures"]
        self.outstanding -= 1


def _progress(run: Run, total: int, started: float, final: bool = False) -> str:
    done = sum(run.done.values())
    elapsed = time.time() - started
    rate = done / elapsed if elapsed else 0.0
    left = f", ~{_duration((total - done) / rate)} left" if rate and not final else ""
    return (
        f"fuzz: {done:,}/{total:,} cases ({100 * done / max(total, 1):.0f}%), {rate:.0f}/s, "
        f"{len(run.failures)} failures, {_duration(elapsed)} elapsed{left}"
    )


def summary(run: Run, elapsed: float) -> str:
    """The table printed at the end: per kind cases, time, cases/s, accepted inputs and failures."""
    from fuzz.oracle import signature

    lines = [f"{'target':<10} {'cases':>9} {'cpu s':>8} {'cases/s':>8} {'accepted':>9} {'failures':>9}"]
    for kind in run.counts:
        failed = sum(1 for f in run.failures if f[0] == kind)
        rate = run.done[kind] / run.seconds[kind] if run.seconds[kind] else 0.0
        accepted = "-" if kind == CLI else f"{run.accepted[kind]:,}"
        lines.append(
            f"{kind:<10} {run.done[kind]:>9,} {run.seconds[kind]:>8.1f} {rate:>8.0f} {accepted:>9} {failed:>9}"
        )
    distinct = sorted({signature(f) for _, _, f in run.failures})
    lines.append(
        f"total: {sum(run.done.values()):,} cases in {_duration(elapsed)} wall time on {run.jobs} processes, "
        f"{len(run.failures)} failures ({len(distinct)} distinct)"
    )
    for kind, index, failure in sorted(run.failures)[:50]:
        lines.append(f"  {kind} #{index}: {failure}")
    if run.failures:
        lines.append(f"failing inputs: {run.out}/<target>/<index>.*")
    return "\n".join(lines)


def _split(total: int, kinds: Sequence[str]) -> dict[str, int]:
    """``total`` cases split evenly over ``kinds`` (the first ones take the remainder)."""
    base, extra = divmod(total, len(kinds))
    return {kind: base + (i < extra) for i, kind in enumerate(kinds)}


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, fuzz, print the summary; 1 when any case failed."""
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100_000, help="reader cases, split over the targets")
    parser.add_argument("--cli-cases", type=int, default=3_000, help="end-to-end CLI cases")
    parser.add_argument("--seed", type=int, default=0, help="run seed: the same seed gives the same cases")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--targets", help="comma-separated targets (default: all, and cli)")
    parser.add_argument("--out", default="build/fuzz-failures", help="where failing inputs are written")
    parser.add_argument("--replay", type=int, metavar="INDEX", help="run one case of the one --targets here")
    args = parser.parse_args(argv)
    kinds = _kinds()
    chosen = args.targets.split(",") if args.targets else kinds
    unknown = sorted(set(chosen) - set(kinds))
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(kinds)}")
    out = Path(args.out).resolve()
    if args.replay is not None:
        if len(chosen) != 1:
            parser.error("--replay needs exactly one --targets")
        warm_up()
        failure, _ = _run_one(
            chosen[0], args.seed, args.replay, Path(tempfile.mkdtemp(prefix="baechi-fuzz-"))
        )
        print(failure or "ok")
        return 1 if failure else 0

    readers = [k for k in chosen if k != CLI]
    counts = _split(args.cases, readers) if readers else {}
    if CLI in chosen:
        counts[CLI] = args.cli_cases
    total = sum(counts.values())
    run = Run(counts, max(1, args.jobs), args.seed, out)
    started = last = time.time()
    tty = sys.stderr.isatty()
    print(f"fuzz: seed {args.seed}, {total:,} cases ({', '.join(f'{k} {n:,}' for k, n in counts.items())}), "
          f"{run.jobs} processes", file=sys.stderr)  # fmt: skip
    for slot in range(run.jobs):
        run.start(slot)
    try:
        while run.outstanding > 0:
            run.collect(timeout=1.0)
            run.watch()
            if time.time() - last >= (2 if tty else 30):
                last = time.time()
                print(
                    ("\r" if tty else "") + _progress(run, total, started),
                    end="" if tty else "\n",
                    file=sys.stderr,
                )
    finally:
        for _ in run.workers:
            run.tasks.put(None)
        for worker in run.workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
    print(("\r" if tty else "") + _progress(run, total, started, final=True), file=sys.stderr)
    print(summary(run, time.time() - started))
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
