"""Run a function on G local ranks (processes) joined in a gloo/NCCL process group.

Used by the tests, the demo and the harness's ``inline`` executor. A spawn costs tenths of a
second, the first of a process about 1.5 s more (DESIGN.md 5), so callers still run many cases
inside one ``spawn``.

    results = spawn(fn, world=4, args=(cases,))   # fn(rank, world, *args) on every rank
    results[r]                                     # what rank r returned (picklable)

A rank that raises makes ``spawn`` raise ``SpawnError`` with that rank's traceback; a rank that
dies or hangs past ``timeout_s`` (+30 s for start-up) is killed and reported the same way, never a
silent hang. The ranks' reports come cause first: in the order the ranks raised or (the first
to die) were seen dead, the others' "connection closed" after the cause, then the rest.

Ranks start from Python's fork server with torch already imported (a spawn of 4 ranks: about
0.2 s instead of 2.8-4.2 s, each rank importing torch anew, on 2-core machines:
``scripts/bench_spawn.py``; ``BURST_START_METHOD=spawn`` starts each
rank as a new interpreter). The server starts at a process's first ``spawn`` and imports torch
alone; each rank still imports the caller's module and this project afresh, with the caller's
``sys.path``, working folder, environment and stdout of the moment. So ``fn`` must be defined at
module level and a script must call ``spawn`` under ``if __name__ == "__main__":`` (without it,
each rank runs the script's top level again and exits without a result). ``fn`` and ``args``
reach the ranks pickled, by value, with either start method: a tensor is a copy (a rank's
in-place writes do not reach the caller, as they did through shared memory), and multiprocessing
queues and locks are refused. The ranks take the caller's signals ignored at each spawn, and die
with the caller. From the server, not the caller of the moment: what torch read from the
environment when it was imported, and the environment and stdio under which a rank re-imports
the caller's main module (its top level, which the ``__main__`` guard keeps short).
"""

from __future__ import annotations

import contextlib
import gc
import math
import multiprocessing
import numbers
import operator
import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from multiprocessing import reduction

import torch
import torch.multiprocessing as mp

__all__ = ["SpawnError", "interrupt_on_termination", "spawn"]


class SpawnError(RuntimeError):
    pass


def _terminate(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextlib.contextmanager
def interrupt_on_termination():
    """Inside the block SIGTERM (a timeout, SLURM's end of a job, systemd) and SIGHUP (a dropped
    ssh session) raise KeyboardInterrupt(the signal's name), so a launcher ends as on Ctrl-C:
    its ranks are stopped, what was written stays, and it can say how to resume. One the
    process ignores stays ignored (a driver started under nohup died when its ssh session
    dropped: a review). Handlers can be set from the main thread only: elsewhere the block runs
    unchanged."""
    import threading

    previous = {}
    if threading.current_thread() is threading.main_thread():  # nohup's SIGHUP stays ignored
        previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGHUP)
                    if signal.getsignal(sig) != signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():  # (None: one set from C, not restorable)
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


@contextlib.contextmanager
def held_signals(*, deliver: bool = True, block: bool = False):
    """SIGINT, SIGTERM and SIGHUP held off inside, for a step that must not be cut in two
    (jobs submitted and written down; a table written). With ``deliver`` each one that came is
    acted on at the end, as it would have been at once (in the order they came; blocked ones in
    the kernel's order, by number), until one raises; without, they are dropped.

    ``block``: blocked too (``pthread_sigmask``), and so in the processes started inside, which
    inherit the mask: a Ctrl-C at a terminal reaches the whole foreground process group, and
    sbatch, killed by it, had queued its job array all the same (a review). Without ``block`` a
    process started inside gets SIGINT's default action (exec resets a Python handler), not an
    ignored SIGINT inherited from a driver run in the background. An ignored SIGTERM or SIGHUP
    (``nohup``) stays ignored. Handlers can be set from the main thread only: elsewhere the
    block runs unchanged."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    sigs = [sig for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
            if sig == signal.SIGINT or signal.getsignal(sig) != signal.SIG_IGN]
    came: list[int] = []
    try:
        with contextlib.ExitStack() as restore:  # each one restored, whatever another raises
            for sig in sigs:
                previous = signal.signal(sig, lambda signum, _: came.append(signum))
                restore.callback(signal.signal, sig,  # (None: set from C, not restorable)
                                 signal.SIG_DFL if previous is None else previous)
            if block:  # unblocked first: what is pending then reaches the recorder
                restore.callback(signal.pthread_sigmask, signal.SIG_SETMASK,
                                 signal.pthread_sigmask(signal.SIG_BLOCK, sigs))
            yield
    finally:
        for sig in dict.fromkeys(came) if deliver else ():
            signal.raise_signal(sig)


def _rendezvous(timeout_s: float):
    """The ranks' rendezvous store, served by the launcher on a port the kernel picks and the
    launcher holds until its ranks end. Rank 0 used to serve it, on a port the launcher had
    found free and let go, which any process could take in between (a spawn beside this one:
    another test run, a second sweep)."""
    from burst import comm

    return comm.tcp_store(serve=True, timeout_s=timeout_s)


class _Stdout:
    """The caller's stdout, handed to a rank as it starts: ``src`` is the caller's duplicate of
    its file descriptor 1 (None: 1 was closed), which pickling (while the rank starts) sends
    along."""

    def __init__(self, src: int | None = None, fd=None):
        self.src, self.fd = src, fd

    def __reduce__(self):
        return (_Stdout, (None, None if self.src is None else reduction.DupFd(self.src)))

    def attach(self, env: dict) -> None:
        if self.fd is None:  # as a rank started with 1 closed: print does nothing
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.close(null)
            sys.stdout = None
            return
        fd = self.fd.detach()
        if fd != 1:
            os.dup2(fd, 1)
            os.close(fd)
        if sys.stdout is None:  # (the fork server started with 1 closed)
            sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the rank's, for its life
        # buffered as a new interpreter's would be: by line on a terminal, PYTHONUNBUFFERED
        sys.stdout.reconfigure(line_buffering=os.isatty(1),
                               write_through=bool(env.get("PYTHONUNBUFFERED")))


# a rank's signals: ignored where the caller ignores them (as exec keeps them), else default
_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
                 if hasattr(signal, name))


def _set_signals(ignored: list[int]) -> None:
    for sig in _SIGNALS:
        default = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
        signal.signal(sig, signal.SIG_IGN if sig in ignored else default)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not died (a zombie has, reaped or not; without
    /proc, as on macOS, a zombie counts as running)."""
    if not os.path.exists("/proc/self/stat"):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # (someone else's: it exists)
            pass
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _forget_server() -> None:
    """Drop this process's share of its fork server: its copy of the server's "alive" pipe
    (the server exits when no process holds it: its launcher and every process forked from
    either) and, in a process forked from a launcher, the server it cannot wait for."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # (CPython's)
    if getattr(server, "_forkserver_alive_fd", None) is not None:
        with contextlib.suppress(OSError):
            os.close(server._forkserver_alive_fd)
    for name in ("_forkserver_alive_fd", "_forkserver_pid", "_forkserver_address"):
        if hasattr(server, name):
            setattr(server, name, None)


if hasattr(os, "register_at_fork"):  # a fork of a launcher starts its own server when it spawns
    os.register_at_fork(after_in_child=_forget_server)


def _die_with(launcher: int) -> None:
    """SIGKILL this rank when its launcher dies. torch sets SIGINT for that once a rank has
    started, which a rank started with SIGINT ignored (``cmd &`` in a script) ignores, and not
    before: a launcher killed then left ranks that trained on, writing the run's files.

    A thread waits for the launcher's end (a pidfd; polling where there is none): the
    rank's parent is the fork server, which outlives the launcher while any other process holds
    its pipe (a process the launcher forked or started from the same server). On Linux the rank
    also dies with that parent (PR_SET_PDEATHSIG), the server or, started with "spawn", the
    launcher."""
    import ctypes
    import select
    import threading

    _forget_server()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(1, int(signal.SIGKILL)) != 0:  # PR_SET_PDEATHSIG
                print(f"burst.spawn: rank {os.getpid()} cannot ask to die with its parent "
                      f"(prctl: errno {ctypes.get_errno()})", file=sys.stderr)
    try:
        pidfd = os.pidfd_open(launcher)  # (a zombie's is readable at once)
    except (AttributeError, OSError):  # gone already, or no pidfds (Linux < 5.3, macOS)
        pidfd = None

    def wait() -> None:
        if pidfd is not None:
            select.select([pidfd], [], [])
        else:
            while _running(launcher):
                time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, daemon=True, name="burst-spawn-launcher").start()


def _entry(rank, world, port, out_dir, backend, threads, timeout_s, launcher, env, stdout,
           ignored):
    # what the rank holds now (torch and this project, imported) is never garbage: out of the
    # collector's sight, so comm.destroy's gc.collect scans only what fn made (it scanned all
    # of it, 74 ms a rank: forkserver spawns took twice e850ddc's time, bench_spawn.py)
    gc.freeze()
    _die_with(launcher)
    # a rank from the fork server has the server's environment, stdout and signals: take the
    # caller's
    os.environ.clear()
    os.environ.update(env)
    stdout.attach(env)
    _set_signals(ignored)
    from burst import comm

    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    path = os.path.join(out_dir, f"rank{rank}.pkl")
    # the rank's stderr goes to a file that spawn echoes as its lines come, and quotes
    # for a rank that died without a result: what gloo or CUDA printed before an abort
    # ("Received data size doesn't match ...") was on the console only, not in SpawnError
    err = os.open(os.path.join(out_dir, f"rank{rank}.err"), os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(err, 2)
    os.close(err)
    try:
        device = None
        if backend == "nccl":  # one GPU per rank (spawn checked there are enough), bound at
            device = torch.device("cuda", rank)  # init: NCCL needs it for p2p and barriers
            torch.cuda.set_device(device)
        with open(os.path.join(out_dir, "call.pkl"), "rb") as f:
            fn, args = pickle.load(f)
        comm.init(backend, rank=rank, world_size=world, timeout_s=timeout_s, device_id=device,
                  store=comm.tcp_store(port, serve=False, timeout_s=timeout_s))
        result = ("ok", fn(rank, world, *args))
    except BaseException:  # noqa: BLE001 - reported to the parent with the traceback and
        result = ("error", traceback.format_exc(), time.time())  # when (the first comes first)
    try:
        with open(path + ".tmp", "wb") as f:
            pickle.dump(result, f)
    except Exception as e:  # noqa: BLE001 - the result must cross to the parent: say why not
        with open(path + ".tmp", "wb") as f:
            pickle.dump(("error", f"the function's result on rank {rank} cannot be pickled to "
                         f"return it ({type(e).__name__}: {e})", time.time()), f)
    os.replace(path + ".tmp", path)
    with contextlib.suppress(Exception):
        comm.destroy()


def _any_error(out_dir: str, world: int) -> bool:
    for r in range(world):
        path = os.path.join(out_dir, f"rank{r}.pkl")
        if os.path.exists(path):
            with open(path, "rb") as f:
                if pickle.load(f)[0] == "error":
                    return True
    return False


def _ended_without_result(processes, out_dir: str) -> int | None:
    """The first rank whose process has exited 0 without writing its result, if any."""
    for r, p in enumerate(processes):
        if p.exitcode == 0 and not os.path.exists(os.path.join(out_dir, f"rank{r}.pkl")):
            return r
    return None


def _how_it_ended(code: int | None, stopped: bool, first_dead: int | None) -> str:
    """Why a rank left no result; ``stopped``: spawn (or torch's join, which terminates the
    other ranks when one dies) ended it because another rank had failed."""
    if stopped:
        after = f"rank {first_dead} died" if first_dead is not None else "a rank failed"
        return f"stopped by spawn after {after}"
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:  # a real-time signal has no name
            name = f"signal {-code}"
        hint = " (the signal the kernel's OOM killer sends)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exit code {code}"


STDERR_LINES = 15  # of a rank that died, quoted in SpawnError


class _Stderr:
    """The ranks' stderr files, echoed to this process's stderr as their lines come (a warning
    of a long run is seen when it is given, not when the run ends), whole lines at a time."""

    def __init__(self, out_dir: str, world: int):
        self.paths = [os.path.join(out_dir, f"rank{r}.err") for r in range(world)]
        self.done = [0] * world  # bytes echoed per rank

    def echo(self, final: bool = False) -> None:
        for r, path in enumerate(self.paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self.done[r])
                    new = f.read()
            except OSError:  # the rank has not opened its file yet, or died before
                continue
            if not final:
                new = new[:new.rfind(b"\n") + 1]
            if new:
                text = new.decode(errors="replace")
                sys.stderr.write(text if text.endswith("\n") else text + "\n")
                self.done[r] += len(new)
        sys.stderr.flush()

    def logs(self) -> list[str]:
        """Each rank's whole stderr (echoed or not)."""
        out = []
        for path in self.paths:
            try:
                with open(path, errors="replace") as f:
                    out.append(f.read())
            except OSError:  # the rank died before it opened its file
                out.append("")
        return out


def _kill(processes) -> set[int]:
    """Kill the ranks still alive and reap every one (no rank may still write or hold memory
    once ``spawn`` returns or raises); returns the ranks it killed."""
    killed = set()
    for r, p in enumerate(processes):
        if p.is_alive():
            killed.add(r)
            p.kill()
    for p in processes:
        p.join(timeout=30)
    return killed


def _start_method() -> str:
    method = os.environ.get("BURST_START_METHOD", "forkserver")
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"BURST_START_METHOD={method!r}: use forkserver or spawn")
    if method not in multiprocessing.get_all_start_methods():  # (Windows)
        return "spawn"
    from multiprocessing import forkserver

    if method == "forkserver" and getattr(forkserver._forkserver, "_forkserver_pid", 0) is None:
        # torch once, in the server; nothing of this project (it may be another checkout than
        # the caller's sys.path names by the time a rank starts); and no caller's folder on the
        # server's sys.path (python -c puts it first), whose files would shadow torch's imports
        multiprocessing.get_context("forkserver").set_forkserver_preload(["torch"])
        saved = os.environ.get("PYTHONSAFEPATH")
        os.environ["PYTHONSAFEPATH"] = "1"
        try:
            forkserver.ensure_running()
        finally:
            if saved is None:
                del os.environ["PYTHONSAFEPATH"]
            else:
                os.environ["PYTHONSAFEPATH"] = saved
    return method


def _at_least_one(value, name: str, what: str) -> int:
    """``value`` as an int if it is a whole number >= 1: a Python or numpy integer, not a bool,
    a float or a string."""
    try:
        n = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        n = None
    if n is None or n < 1:
        raise ValueError(f"{name}={value!r}: need a whole number of {what} >= 1")
    return n


def spawn(fn: Callable, world: int, *, args: tuple = (), backend: str = "gloo",
          threads: int = 1, timeout_s: float = 300.0,
          watch: Callable[[], str | None] | None = None) -> list:
    """Run ``fn(rank, world, *args)`` on ``world`` fresh processes; return their results.

    ``watch``: called about every 0.2 s while the ranks run; a message it returns ends them
    (killed from here, so a rank that holds the GIL cannot escape it) and is raised as the
    ``SpawnError``."""
    world = _at_least_one(world, "world", "ranks")
    threads = _at_least_one(threads, "threads", "threads per rank")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) \
            or not math.isfinite(timeout_s) or timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s!r}: need a finite number of seconds > 0")
    if backend == "nccl" and world > torch.cuda.device_count():
        # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), at the first collective
        raise ValueError(f"backend='nccl' needs one GPU per rank: world={world}, "
                         f"{torch.cuda.device_count()} GPU(s) visible; use fewer ranks, or gloo")
    try:  # (first: with 1 closed, the pipes made below could take its number)
        stdout = os.dup(1)
    except OSError:
        stdout = None
    try:
        return _spawn(fn, world, args, backend, threads, timeout_s, _Stdout(stdout), watch)
    finally:
        if stdout is not None:
            os.close(stdout)


def _spawn(fn, world, args, backend, threads, timeout_s, stdout, watch=None):
    store = _rendezvous(timeout_s)  # held (the port with it) until the ranks end
    port = store.port
    method = _start_method()
    ignored = [sig for sig in _SIGNALS if signal.getsignal(sig) == signal.SIG_IGN]
    with tempfile.TemporaryDirectory(prefix="burst-spawn-") as out_dir:
        # fn and args by value, in a file: a fork server takes at most 253 file descriptors
        # per rank, which sharing each tensor's memory (torch's way) would exceed
        with open(os.path.join(out_dir, "call.pkl"), "wb") as f:
            pickle.dump((fn, args), f)
        with contextlib.suppress(AttributeError, OSError):  # (None, or a closed descriptor)
            sys.stdout.flush()  # what the caller printed comes before what the ranks print
        ctx = mp.start_processes(
            _entry, args=(world, port, out_dir, backend, threads, timeout_s, os.getpid(),
                          dict(os.environ), stdout, ignored),
            nprocs=world, join=False, start_method=method)
        stderr = _Stderr(out_dir, world)
        deadline = time.monotonic() + timeout_s + 30
        failed_at, first_dead, stopped = None, None, set()
        # when the first rank that died was last seen alive (time.time(): the clock of the
        # ranks' own raise times), so that the errors its death caused in its peers (a read
        # error, a closed connection: raised as soon as it died, before it was seen dead)
        # come after it
        died_at, alive_at = math.inf, time.time()
        try:
            while True:
                with contextlib.suppress(OSError):  # a closed console must not stop the ranks
                    stderr.echo()
                seen_at = alive_at
                try:
                    if ctx.join(timeout=0.2):
                        break
                    alive_at = time.time()
                except mp.ProcessExitedException as e:
                    failed_at = failed_at or time.monotonic()
                    if first_dead is None:
                        first_dead, died_at = e.error_index, alive_at
                if first_dead is None:  # join takes exit code 0 for success, result or not
                    quiet = _ended_without_result(ctx.processes, out_dir)
                    if quiet is not None:  # (os._exit(0) in a method): the cause, first
                        first_dead, died_at = quiet, seen_at
                        failed_at = failed_at or time.monotonic()
                if failed_at is None and _any_error(out_dir, world):
                    failed_at = time.monotonic()  # the others may now wait forever on that rank
                why = watch() if watch is not None and failed_at is None else None
                if why:
                    _kill(ctx.processes)
                    raise SpawnError(why)
                now = time.monotonic()
                if now > deadline or (failed_at is not None and now - failed_at > 3):
                    stopped = _kill(ctx.processes)
                    if now > deadline and failed_at is None:  # (the except below echoes)
                        raise SpawnError(f"spawned ranks did not finish within {timeout_s:.0f} s"
                                         f" (+30 s); rank(s) {', '.join(map(str, sorted(stopped)))}"
                                         " were still running and were killed")
                    break
        except BaseException:  # KeyboardInterrupt, a signal turned exception: ranks die first
            _kill(ctx.processes)
            with contextlib.suppress(Exception):  # what they said about a hang, if anything
                stderr.echo(final=True)
            raise
        results, errors = [], []  # errors: (order, text); the cause first, its aftermath after
        stderr.echo(final=True)
        logs = stderr.logs()
        for r in range(world):
            path = os.path.join(out_dir, f"rank{r}.pkl")
            if not os.path.exists(path):
                code = ctx.processes[r].exitcode
                # torch's join terminates (SIGTERM) the other ranks when one dies
                signalled_after = first_dead not in (None, r) and code == -signal.SIGTERM
                stopped_here = r in stopped or signalled_after
                tail = "" if stopped_here or not logs[r] else (
                    "; its last stderr lines:\n" + "\n".join(logs[r].splitlines()[-STDERR_LINES:]))
                # the rank that died first, when it was last seen alive (after any rank that
                # raised before: its death may be their aftermath); ranks stopped after it: last
                order = died_at if r == first_dead else math.inf
                errors.append((order, f"rank {r} exited without a result: " + _how_it_ended(
                    code, stopped_here, first_dead) + tail))
                results.append(None)
                continue
            with open(path, "rb") as f:
                status, value, *when = pickle.load(f)
            if status == "error":  # raised ranks in the order they raised
                errors.append((when[0], f"rank {r} raised:\n{value}"))
            results.append(value)
        if errors:
            raise SpawnError("\n".join(text for _, text in sorted(errors, key=lambda e: e[0])))
        return results
