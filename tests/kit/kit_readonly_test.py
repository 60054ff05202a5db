#!/usr/bin/env python3
"""./kit in a read-only checkout: a built one runs its demo and checker as
built; a fresh one says to build elsewhere with TP_BUILD_DIR, not a raw
mkdir error.

    kit_readonly_test.py KIT BUILD_DIR

A read-only checkout is made with a read-only bind mount in a mount
namespace of the test's own (unshare -m), the only way to make a folder
read-only to root, who is the CI's user. Without unshare or root it is
SKIPPED (exit 77), saying why.
"""
import os
import shutil
import subprocess
import sys
import tempfile

KIT, BUILD = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
ROOT = os.path.dirname(KIT)


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def read_only(folders, command):
    """Runs `command` (a shell line) with `folders` mounted read-only."""
    mounts = " && ".join(f"mount --bind {f} {f} && mount -o remount,bind,ro {f}"
                         for f in folders)
    script = f"{mounts} && cd {ROOT} && {command}"
    env = {k: v for k, v in os.environ.items() if k not in ("TP_KIT_LOCKED", "TP_BUILD_DIR")}
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env, timeout=120)


if shutil.which("unshare") is None:
    print("SKIP: no unshare(1) to make a read-only mount")
    sys.exit(77)
probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
if probe.returncode != 0:
    print(f"SKIP: cannot make a mount namespace (needs root): {probe.stderr.strip()}")
    sys.exit(77)

# 1. A checkout that is built, mounted read-only: the demo runs as built.
demo = os.path.join(BUILD, "lessons", "demo_01")
if not os.access(demo, os.X_OK):
    fail(f"{demo} is not built; the test needs it (meson builds it first)")
env_build = f"TP_BUILD_DIR={BUILD} " if BUILD != os.path.join(ROOT, "build") else ""
r = read_only([ROOT, BUILD], f"{env_build}{KIT} demo 01 --world-size 2 --steps 2")
if r.returncode != 0 or "is read-only: running lessons/demo_01 as it was built there" not in \
        r.stdout or "verdict: matches the reference" not in r.stdout:
    fail(f"built read-only checkout: exit {r.returncode}:\n{r.stdout}")
print("a built read-only checkout: ./kit demo 01 runs the demo as built, saying so")
r = read_only([ROOT, BUILD], f"{env_build}{KIT} build")
if r.returncode != 2 or "it is read-only" not in r.stdout or "TP_BUILD_DIR" not in r.stdout:
    fail(f"./kit build in a built read-only checkout: exit {r.returncode}:\n{r.stdout}")
print(f"a built read-only checkout: ./kit build says {r.stdout.strip().splitlines()[-1][:100]}...")

# 2. A fresh checkout (no build folder; only the kit, which is all ./kit
# build reads before it makes one), read-only: a clear error naming
# TP_BUILD_DIR, exit 2, before anything is installed or configured.
with tempfile.TemporaryDirectory(prefix="tp-readonly-") as fresh:
    shutil.copy(KIT, os.path.join(fresh, "kit"))
    r = read_only([fresh], f"{fresh}/kit build")
    if r.returncode != 2 or "cannot create the build folder" not in r.stdout or \
            "Read-only file system" not in r.stdout or "TP_BUILD_DIR" not in r.stdout:
        fail(f"fresh read-only checkout: exit {r.returncode}:\n{r.stdout}")
    print(f"a fresh read-only checkout: {r.stdout.strip().splitlines()[-1][:150]}...")
