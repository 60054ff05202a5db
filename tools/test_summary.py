#!/usr/bin/env python3
"""Prints the test suite's closing line, 'N passed, N failed', counting test cases.

Reads Meson's testlog.json. A doctest executable reports its own test cases
("[doctest] test cases: 12 | 11 passed | 1 failed"); any other test (a checker
run, a script) counts as one test case. A test that crashed or timed out after
its test cases passed still counts one failure, so a crash is never green.
A skipped test (exit code 77) is counted as skipped, never as passed, and
listed with its reason (the line it printed that starts with "SKIP:").
Exit status: 0 when nothing failed, 1 otherwise.
"""
import json
import re
import sys

DOCTEST = re.compile(r"\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed")


def main(path):
    passed = failed = skipped = 0
    failing = []
    skips = []
    with open(path) as log:
        for line in log:
            if not line.strip():
                continue
            try:
                test = json.loads(line)
            except json.JSONDecodeError as error:
                print(f"test_summary: {path} has a line that is not JSON ({error}); was "
                      "another meson test writing the same log? ./kit runs one at a time "
                      "per build directory", file=sys.stderr)
                return 1
            if test.get("result") == "SKIP":
                skipped += 1
                reason = next((l[5:].strip() for l in (test.get("stdout") or "").splitlines()
                               if l.startswith("SKIP:")), "no reason given")
                skips.append(f"  {test.get('name')}: {reason}")
                continue
            ok = test.get("result") in ("OK", "EXPECTEDFAIL")
            m = DOCTEST.search(test.get("stdout") or "")
            if m:
                p, f = int(m.group(2)), int(m.group(3))
                if not ok and f == 0:
                    f = 1
            else:
                p, f = (1, 0) if ok else (0, 1)
            passed += p
            failed += f
            if not ok:
                failing.append(f"{test.get('name')} ({test.get('result')})")
    if skips:
        print("skipped:\n" + "\n".join(skips))
    if failing:
        print("failing: " + ", ".join(failing))
    print(f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else ""))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/meson-logs/testlog.json"))
