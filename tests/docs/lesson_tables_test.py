#!/usr/bin/env python3
"""Lesson 10's memory and bytes tables are the ones the demos count today.

Lesson 10's "Memory and bytes, measured" quotes tables that
bench/fsdp_memory.py --markdown prints from the demos of stages 08, 09 and
10 (tensor bytes counted by tp::memory, collective bytes counted by the
process group: counts, the same on any machine). They go stale whenever a
stage's memory or collectives change. This runs the script and checks that
every line it prints stands in the lesson as printed; where one does not,
it fails naming the line and printing the tables to paste.

Usage: lesson_tables_test.py ROOT DEMO_08 DEMO_09 DEMO_10
"""
import os
import subprocess
import sys
import tempfile


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__.split("\n\n")[-1])
    root, demo_08, demo_09, demo_10 = sys.argv[1:]
    lesson = os.path.join(root, "lessons", "10-fsdp", "README.md")
    with tempfile.TemporaryDirectory(prefix="tp-lesson-tables-") as tmp:
        done = subprocess.run(
            [sys.executable, os.path.join(root, "bench", "fsdp_memory.py"), demo_08, demo_09,
             demo_10, "--markdown", "--out", os.path.join(tmp, "fsdp_memory.json")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        print(done.stdout + done.stderr)
        sys.exit(f"lesson_tables: FAIL: bench/fsdp_memory.py exited {done.returncode}")
    with open(lesson) as f:
        text = set(line.rstrip("\n") for line in f)
    stale = [line for line in done.stdout.splitlines() if line.strip() and line not in text]
    if stale:
        print("lesson_tables: FAIL: lines bench/fsdp_memory.py prints that "
              f"{os.path.relpath(lesson, root)} does not hold:")
        for line in stale:
            print(f"  {line}")
        print("\nthe tables as printed today (paste them into the lesson):\n")
        print(done.stdout)
        return 1
    print(f"lesson_tables: every line of the {len(done.stdout.splitlines())} printed stands "
          f"in {os.path.relpath(lesson, root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
