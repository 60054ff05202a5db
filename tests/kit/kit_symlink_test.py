#!/usr/bin/env python3
"""./kit reached through a symlink, from another directory, still finds the
kit: `LINK diff 02 --anyway` shows what stage 02 adds to stage 01 (--anyway: the
exercise of the checkout is untouched, which ./kit diff otherwise refuses).

Usage: kit_symlink_test.py PATH_TO_KIT
"""

import os
import subprocess
import sys
import tempfile


def main():
    kit = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="tp-kit-link-") as tmp:
        link = os.path.join(tmp, "kit")
        os.symlink(kit, link)
        run = subprocess.run([link, "diff", "02", "--anyway"], cwd=tmp, capture_output=True, text=True,
                             timeout=60)
    if run.returncode != 0 or "02-bucketing" not in run.stdout:
        sys.exit(f"kit through a symlink: exit {run.returncode}\n{run.stdout[-2000:]}"
                 f"\n{run.stderr[-2000:]}")
    print("ok: ./kit through a symlink, from another directory, finds its stages")


if __name__ == "__main__":
    main()
