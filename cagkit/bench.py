"""The benchmark harness: what the scripts in benchmarks/ and the server tests share (apart from lab/, the
research harness, which holds the experiments themselves).

    with ServerProcess("--store", store, "--models", "smollm2") as server:  # `cagkit serve` on a free port
        startup_s = server.wait()                                            # seconds until /health answers
        ...  # requests to server.url
    with Timer() as t:
        work()
    t.seconds
    proc, seconds = run_timed([*cagkit_command(), "ingest", ...])          # a fresh process, timed
    write_results("results/x.json", {"rows": rows}, device="cpu")          # + command, date, machine

Standard library only (the server is polled with urllib), so a benchmark that needs no model imports no torch.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path


def cagkit_command() -> list[str]:
    """The `cagkit` command of this interpreter's environment (the package it imports, not a `cagkit` on PATH)."""
    return [sys.executable, "-c", "import sys; from cagkit.cli import main; sys.exit(main())"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerFailed(RuntimeError):
    """A `cagkit serve` process that exited, or did not answer /health in time; the message ends with its log."""


class ServerProcess:
    """A `cagkit serve --port P ARGS` process on a free port, its output in a log file; `url` once `wait` returns.

    `env` is the whole environment of the process (default: this one's)."""

    def __init__(self, *args: str, env: dict | None = None, log_prefix: str = "cagkit-serve"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(Path(tempfile.gettempdir()) / f"{log_prefix}-{self.port}.log", "w+")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([*cagkit_command(), "serve", "--port", str(self.port), *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait(self, timeout: float | None = None) -> float:
        """Seconds from starting the process until /health answers (imports, models and embedder loaded). A
        ServerFailed if the process exits first, or after `timeout` seconds (then the process is stopped)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while deadline is None or time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerFailed(f"cagkit serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as response:
                    if response.status == 200:
                        return time.perf_counter() - self.started
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise ServerFailed(f"cagkit serve did not answer /health in {timeout:g} s; see {self.log.name}")

    def output(self) -> str:
        """What the process has written so far."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self, grace: float = 15) -> None:
        """Terminate the process (killed after `grace` seconds) and close its log."""
        self.proc.terminate()
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Timer:
    """Wall seconds of a `with` block (perf_counter): `seconds` and `ms` once it ends, `elapsed()` meanwhile."""

    def __init__(self):
        self.start = self.end = None

    def __enter__(self) -> Timer:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.end = time.perf_counter()

    def elapsed(self) -> float:
        return (self.end if self.end is not None else time.perf_counter()) - self.start

    @property
    def seconds(self) -> float:
        return self.elapsed()

    @property
    def ms(self) -> float:
        return self.elapsed() * 1e3


def run_timed(cmd: list[str], *, env: dict | None = None, timeout: float | None = None,
              cwd: str | Path | None = None) -> tuple[subprocess.CompletedProcess, float]:
    """Run `cmd` to its end, its output captured as text: the finished process and its wall seconds."""
    with Timer() as t:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=cwd)
    return proc, t.seconds


def side_by_side(run, ways: tuple[str, str], repeats: int) -> tuple[dict, dict]:
    """Two ways of doing the same work timed alternately in one process, so that load on a shared machine falls
    on both: `run(way)` -> (seconds, result). Round 0 runs each way once to warm up and is dropped; each later
    round runs both, the order swapped every round. -> ({"seconds": {way: [per round]}, "median_s": {way: median},
    "ratio": the second way's median over the first's}, {way: its last result})."""
    times: dict[str, list[float]] = {way: [] for way in ways}
    last = {}
    for r in range(repeats + 1):
        for way in (ways if r % 2 else ways[::-1]):
            seconds, last[way] = run(way)
            if r:
                times[way].append(seconds)
    median = {way: statistics.median(t) for way, t in times.items()}
    return {"seconds": {w: [round(s, 4) for s in t] for w, t in times.items()},
            "median_s": {w: round(m, 4) for w, m in median.items()},
            "ratio": round(median[ways[1]] / median[ways[0]], 3)}, last


def summary(values: list[float], digits: int = 3) -> dict:
    """Median, min, max and every run of repeated measurements."""
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits), "runs": [round(v, digits) for v in values]}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine(device=None, **extra) -> dict:
    """The machine a run measures: platform, CPUs, Python, torch and transformers versions, the device the
    models ran on (`device`, else $CAGKIT_DEVICE, else unknown) and the 1-minute load average now (other work on
    the machine slows every figure alike)."""
    return {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "torch": _version("torch"),
            "transformers": _version("transformers"),
            "device": str(device) if device is not None else os.environ.get("CAGKIT_DEVICE"),
            "load_average": round(os.getloadavg()[0], 2), **extra}


def command_line() -> str:
    """This process's command line as one would type it again: `python SCRIPT ARGS`."""
    script = sys.argv[0]
    try:
        script = str(Path(script).resolve().relative_to(Path.cwd()))
    except ValueError:
        pass
    return shlex.join(["python", script, *sys.argv[1:]])


def describe(device=None, **extra) -> dict:
    """The command line, the date (UTC) and the machine of this run."""
    return {"command": command_line(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(device, **extra)}


def write_results(path: str | Path, results: dict, *, device=None) -> Path:
    """Write `results` to `path` as JSON (folders made, replaced atomically, so a stopped run leaves the last
    whole file). The first write adds the run's `command`, `date` and `machine` (`describe`) where `results` has
    none of its own; a script that saves after every measurement keeps those of its start."""
    if not {"command", "date", "machine"} <= results.keys():
        for key, value in describe(device).items():
            results.setdefault(key, value)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(path)
    return path
