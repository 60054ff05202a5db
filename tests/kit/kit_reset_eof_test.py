#!/usr/bin/env python3
"""Ctrl-D (end of input) at ./kit reset's prompt says that nothing was
changed, and changes nothing.

The prompt is only shown at a terminal, so ./kit runs on a pseudo-terminal
(pty); the test answers with Ctrl-D and reads what the kit printed. It runs
a copy of the kit in a scratch folder (solutions/ and tools/ linked, exercises/
copied), so a kit that went on to reset could never touch a student's work.

Usage: kit_reset_eof_test.py PATH_TO_KIT
"""

import os
import pty
import select
import shutil
import sys
import tempfile
import time


def digest(folder):
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


def main():
    with tempfile.TemporaryDirectory(prefix="tp-kit-reset-") as scratch:
        run(os.path.abspath(sys.argv[1]), scratch)


def run(real_kit, scratch):
    root = os.path.dirname(real_kit)
    kit = os.path.join(scratch, "kit")
    shutil.copy2(real_kit, kit)
    for name in ("solutions", "tools"):
        os.symlink(os.path.join(root, name), os.path.join(scratch, name))
    shutil.copytree(os.path.join(root, "exercises"), os.path.join(scratch, "exercises"))
    exercise = os.path.join(scratch, "exercises", "01-naive")
    before = digest(exercise)
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(kit, [kit, "reset", "01"])
    output = b""
    deadline = time.monotonic() + 60
    sent = False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the kit closed the terminal (it exited)
                break
            if not chunk:
                break
            output += chunk
        if not sent and b"Type yes" in output:
            os.write(fd, b"\x04")  # Ctrl-D at the start of a line: end of input
            sent = True
    _, status = os.waitpid(pid, 0)
    text = output.decode(errors="replace")
    if not sent:
        sys.exit(f"FAIL: no prompt within 60 s; the kit printed:\n{text}")
    if "nothing changed" not in text:
        sys.exit(f"FAIL: Ctrl-D at the prompt did not say that nothing changed; the kit "
                 f"printed:\n{text}")
    if digest(exercise) != before:
        sys.exit("FAIL: Ctrl-D at the prompt changed exercises/01-naive")
    print(f"ok: Ctrl-D at the reset prompt -> exit {os.waitstatus_to_exitcode(status)}, "
          f"'{text.strip().splitlines()[-1].strip()}', exercises/01-naive unchanged")


if __name__ == "__main__":
    main()
