#!/usr/bin/env python3
"""A ./kit command ended by a signal leaves no process and no temporary
directory or file behind.

Each case starts ./kit in a session of its own (as a terminal would start a
job), waits until the work it names is running, signals it, and then asserts
that ./kit died by that signal, that no process of the session is left, and
that the private TMPDIR holds no tensorplay directory (the rendezvous
directory of a job lives there).

  demo, SIGTERM to ./kit          `kill` of the kit: ./kit execs the demo, the
                                  demo ends its ranks and removes the directory
  demo, SIGINT to the whole job   Ctrl-C in a terminal
  configure, SIGTERM to ./kit     the kit passes it to meson setup and removes
                                  the file that holds meson's output
  build, SIGTERM to ./kit         the kit passes the signal to its child (ninja,
                                  compiling a fresh build directory)

Usage: kit_signal_test.py PATH_TO_KIT BUILD_DIR
"""

import os
import signal
import subprocess
import sys
import tempfile
import time


def session_processes(sid):
    """Pids of the live (not zombie) processes whose session is sid."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp session ...": comm may hold spaces.
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry))
    return pids


def command_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def wait_until(what, predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def run_case(name, kit, args, env, tmpdir, ready, sig, to_group):
    kit_proc = subprocess.Popen([kit] + args, env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sid = kit_proc.pid
    try:
        wait_until(f"{name}: the work to start", lambda: ready(sid), 240)
        started = time.monotonic()
        if to_group:
            os.killpg(sid, sig)
        else:
            kit_proc.send_signal(sig)
        try:
            kit_proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name}: ./kit still running 30 s after {sig.name}")
        took = time.monotonic() - started
        if kit_proc.returncode != -sig:
            raise AssertionError(f"{name}: ./kit ended with status {kit_proc.returncode}, "
                                 f"expected death by {sig.name}; its stderr:\n"
                                 f"{kit_proc.stderr.read().decode(errors='replace')[-2000:]}")
        try:
            wait_until(f"{name}: the session's processes to go",
                       lambda: not session_processes(sid), 10)
        except AssertionError:
            left = [f"{pid}: {command_of(pid)}" for pid in session_processes(sid)]
            raise AssertionError(f"{name}: processes left behind after {sig.name}:\n  " +
                                 "\n  ".join(left))
        # tensorplay*: a job's directories; kit.*: the kit's own files.
        leftovers = [e for e in os.listdir(tmpdir) if e.startswith(("tensorplay", "kit."))]
        if leftovers:
            raise AssertionError(f"{name}: left in TMPDIR after {sig.name}: {leftovers}")
        print(f"ok: {name}: {sig.name} -> ./kit gone in {took:.2f} s, no process, "
              "no directory or file left")
    finally:
        for pid in session_processes(sid):  # never leave a stray job behind
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        kit_proc.wait()


def main():
    kit = os.path.abspath(sys.argv[1])
    build = os.path.abspath(sys.argv[2])
    with tempfile.TemporaryDirectory(prefix="tp-kit-signal-") as work:
        tmpdir = os.path.join(work, "tmp")
        os.mkdir(tmpdir)
        env = dict(os.environ, TMPDIR=tmpdir, TP_BUILD_DIR=build)

        def ranks_running(sid):
            # The demo and at least two ranks, and the rendezvous directory.
            rdzv = any(e.startswith("tensorplay-rdzv") for e in os.listdir(tmpdir))
            return rdzv and len(session_processes(sid)) >= 3

        demo = ["demo", "01", "--steps", "100000"]
        run_case("demo, SIGTERM to ./kit", kit, demo, env, tmpdir, ranks_running,
                 signal.SIGTERM, to_group=False)
        run_case("demo, SIGINT to the job (Ctrl-C)", kit, demo, env, tmpdir, ranks_running,
                 signal.SIGINT, to_group=True)

        # Configuring: the kit keeps meson's output in a temporary file.
        unconfigured = dict(env, TP_BUILD_DIR=os.path.join(work, "unconfigured-build"))

        def configuring(sid):
            return any(e.startswith("kit.") for e in os.listdir(tmpdir)) and any(
                "meson" in command_of(pid) and "setup" in command_of(pid)
                for pid in session_processes(sid))

        run_case("configure, SIGTERM to ./kit", kit, ["build"], unconfigured, tmpdir,
                 configuring, signal.SIGTERM, to_group=False)

        fresh = dict(env, TP_BUILD_DIR=os.path.join(work, "fresh-build"))

        def compiling(sid):
            return any("cc1plus" in command_of(pid) for pid in session_processes(sid))

        run_case("build, SIGTERM to ./kit", kit, ["build"], fresh, tmpdir, compiling,
                 signal.SIGTERM, to_group=False)


if __name__ == "__main__":
    try:
        main()
    except AssertionError as error:
        sys.exit(f"FAIL: {error}")
