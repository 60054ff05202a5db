#!/usr/bin/env python3
"""Builds a program against the kit the way README.md tells a student to.

    build_and_run.py BUILD_DIR SOURCE

Asks pkg-config for tensorplay (the uninstalled .pc Meson writes to
BUILD_DIR/meson-uninstalled), compiles SOURCE with g++ in a temporary
directory and runs it; fails if any step fails.
"""
import os
import shlex
import subprocess
import sys
import tempfile


def main(build_dir, source):
    env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(build_dir, "meson-uninstalled"))
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "tensorplay"], env=env,
                           capture_output=True, text=True)
    if flags.returncode != 0:
        sys.exit(f"FAIL: pkg-config does not know tensorplay: {flags.stderr}")
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "hello")
        command = (["g++", "-std=c++20", "-O1", source, "-o", exe] + shlex.split(flags.stdout) +
                   ["-Wl,-rpath," + os.path.join(build_dir, "common")])
        print(" ".join(command))
        built = subprocess.run(command, capture_output=True, text=True)
        if built.returncode != 0:
            sys.exit(f"FAIL: the program does not compile against the .pc:\n{built.stderr}")
        ran = subprocess.run([exe], capture_output=True, text=True, timeout=120)
        print(ran.stdout, ran.stderr)
        if ran.returncode != 0:
            sys.exit(f"FAIL: the program exited with {ran.returncode}")
    print("ok: built with pkg-config and ran")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
