#!/usr/bin/env python3
"""When the machine, not the ranks, stops a rendezvous, the message says what
the machine lacks, not "did a rank exit during rendezvous?":

  no loopback interface   the demo in a fresh network namespace (unshare -n),
                          where lo is down: "is the loopback interface up"
  a full TMPDIR           the demo with TMPDIR on a full 64 KiB tmpfs, in a
                          private mount namespace (unshare -m): "the disk
                          holding the rendezvous directory is full"

Both need root (namespaces, mount); without it the test is skipped (exit 77)
and says why, never passed.

Usage: rendezvous_env_test.py DEMO_EXE
"""

import os
import shlex
import subprocess
import sys

SKIP = 77


def run(argv):
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def main():
    demo = os.path.abspath(sys.argv[1])
    if os.geteuid() != 0 or run(["unshare", "-n", "-m", "true"]).returncode != 0:
        print("SKIP: needs root and unshare(1) to take the loopback interface away and to "
              "mount a full tmpfs")
        sys.exit(SKIP)

    cases = []
    no_lo = run(["unshare", "-n", demo, "--steps", "1"])
    cases.append(("no loopback interface", no_lo, "is the loopback interface up"))

    full = ("mnt=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs \"$mnt\" && "
            "{ dd if=/dev/zero of=\"$mnt/fill\" bs=4k 2>/dev/null; "
            f"TMPDIR=\"$mnt\" {shlex.quote(demo)} --steps 1; }}; "
            "rc=$?; umount \"$mnt\"; rmdir \"$mnt\"; exit $rc")
    full_tmp = run(["unshare", "-m", "sh", "-c", full])
    cases.append(("a full TMPDIR", full_tmp, "the disk holding the rendezvous directory is full"))

    failed = False
    for name, result, expected in cases:
        ok = result.returncode != 0 and expected in result.stderr and \
            "did a rank exit" not in result.stderr
        print(f"{'ok' if ok else 'FAIL'}: {name}: exit {result.returncode}: "
              f"{result.stderr.strip()[-400:]}")
        failed = failed or not ok
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
