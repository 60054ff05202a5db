#!/usr/bin/env python3
"""The test "exercises/NN is in sync with the solution" skips, never fails,
when a student has changed the exercise, and says why without suggesting a
reset; with the exercise as committed it still compares, and still fails
when the solution moved on.

Runs tools/gen_exercise.py --check on a scratch git repository holding a
copy of stage 01's solution and exercise.

Usage: exercise_sync_skip_test.py REPO_ROOT
"""

import os
import shutil
import subprocess
import sys
import tempfile


def check(gen, root):
    return subprocess.run([sys.executable, gen, "--check", os.path.join(root, "solutions", "01"),
                           os.path.join(root, "exercises", "01")],
                          capture_output=True, text=True, timeout=60)


def git(root, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                   check=True, capture_output=True, timeout=60)


def main():
    repo = os.path.abspath(sys.argv[1])
    gen = os.path.join(repo, "tools", "gen_exercise.py")
    with tempfile.TemporaryDirectory(prefix="tp-sync-skip-") as root:
        shutil.copytree(os.path.join(repo, "solutions", "01-naive"),
                        os.path.join(root, "solutions", "01"))
        os.makedirs(os.path.join(root, "exercises"))
        subprocess.run([sys.executable, gen, os.path.join(root, "solutions", "01"),
                        os.path.join(root, "exercises", "01")], check=True, timeout=60)
        git(root, "init", "-q")
        git(root, "add", "-A")
        git(root, "commit", "-qm", "clean")

        clean = check(gen, root)
        if clean.returncode != 0:
            sys.exit(f"FAIL: a clean exercise: exit {clean.returncode}\n{clean.stdout}")

        exercise = os.path.join(root, "exercises", "01", "ddp.cc")
        with open(exercise, "a") as f:
            f.write("// the student's work\n")
        with open(exercise) as f:
            work = f.read()
        mine = check(gen, root)
        if mine.returncode != 77 or "your work" not in mine.stdout:
            sys.exit(f"FAIL: a changed exercise: exit {mine.returncode} (want 77, skipped)\n"
                     f"{mine.stdout}{mine.stderr}")
        if "reset" in mine.stdout or "gen_exercise.py" in mine.stdout.replace(gen, ""):
            sys.exit(f"FAIL: the skip message suggests a command that would wipe the work:\n"
                     f"{mine.stdout}")
        with open(exercise) as f:
            if f.read() != work:
                sys.exit("FAIL: the check changed the student's exercise")

        git(root, "checkout", "--", ".")
        with open(os.path.join(root, "solutions", "01", "ddp.cc"), "a") as f:
            f.write("// the solution moved on\n")
        stale = check(gen, root)
        if stale.returncode != 1:
            sys.exit(f"FAIL: a committed exercise behind its solution: exit {stale.returncode} "
                     f"(want 1)\n{stale.stdout}")
    print("ok: a student's changes skip the sync test (exit 77) with the reason; a committed "
          "exercise is still compared, and a stale one still fails")


if __name__ == "__main__":
    main()
