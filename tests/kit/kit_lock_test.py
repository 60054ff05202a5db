#!/usr/bin/env python3
"""Two ./kit commands on one build directory run one after the other: the
second waits for the first's lock, and says so, before it configures or
builds anything.

The test plays the first kit itself (it holds the lock, flock(2) on
BUILD/.kit-lock, as ./kit does) and starts `./kit build` on a fresh build
directory: the kit must print that it is waiting and must not start Meson;
once the lock is released it must go on (it prints "configuring"), and is
then stopped.

Usage: kit_lock_test.py PATH_TO_KIT
"""

import fcntl
import os
import select
import signal
import subprocess
import sys
import tempfile
import time


def read_until(proc, needle, timeout):
    """Reads the kit's output until needle appears; returns all of it."""
    out = b""
    deadline = time.monotonic() + timeout
    while needle not in out and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            out += chunk
    return out


def main():
    kit = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="tp-kit-lock-") as work:
        build = os.path.join(work, "build")
        env = dict(os.environ, TP_BUILD_DIR=build)
        env.pop("TP_KIT_LOCKED", None)  # as a second kit in another terminal
        os.makedirs(build)
        with open(os.path.join(build, ".kit-lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            proc = subprocess.Popen([kit, "build"], env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                seen = read_until(proc, b"waiting", 60)
                if b"waiting" not in seen:
                    sys.exit(f"FAIL: a second ./kit did not say it waits for the lock:\n"
                             f"{seen.decode(errors='replace')}")
                seen += read_until(proc, b"configuring", 2)
                if b"configuring" in seen or os.path.exists(os.path.join(build, "build.ninja")):
                    sys.exit("FAIL: the second ./kit configured while the lock was held")
                fcntl.flock(lock, fcntl.LOCK_UN)
                after = read_until(proc, b"configuring", 60)
                if b"configuring" not in after:
                    sys.exit(f"FAIL: ./kit did not go on once the lock was free:\n"
                             f"{(seen + after).decode(errors='replace')}")
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
        waiting = [l for l in seen.decode().splitlines() if "waiting" in l][0]
        print(f"ok: a second ./kit waited ('{waiting}') and went on when the lock was free")


if __name__ == "__main__":
    main()
