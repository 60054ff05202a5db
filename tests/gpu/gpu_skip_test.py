#!/usr/bin/env python3
"""Without a GPU, the GPU checks say so and judge nothing: they never pass.

On a machine with no usable CUDA device (or a build without CUDA):
  - tools/gpu_check.py (./kit gpu-check) prints "skipped, nothing was
    checked" with CUDA's reason and exits 77, or, on a build without CUDA,
    says the CUDA tests were not built and exits 1;
  - stage 03's checker with --device cuda prints the same kind of line and
    exits 77 (Meson's "skipped"), before running any case;
  - lesson 03's demo with --device cuda refuses with the reason (exit 2).
None of them may exit 0: a GPU check that passed without a GPU would be a
lie in the summary a reader pastes. On a machine with a GPU this test is
skipped (exit 77): ./kit gpu-check is the check there.

Usage: gpu_skip_test.py BUILD_DIR SOURCE_DIR
"""
import os
import subprocess
import sys


def run(argv, timeout=300):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout


def main():
    build, source = (os.path.abspath(a) for a in sys.argv[1:3])
    probe = os.path.join(build, "tests", "test_cuda_tensor")
    built_with_cuda = os.path.exists(probe)
    if built_with_cuda:
        code, text = run([probe, "--list-test-cases"])
        if code == 0:
            print("SKIP: a GPU is usable here; ./kit gpu-check is the check on this machine")
            return 77
        if code != 77 or "SKIP:" not in text:
            sys.exit(f"FAIL: test_cuda_tensor without a GPU exited {code} (expected 77, with a "
                     f"'SKIP:' line giving the reason):\n{text}")

    code, text = run([sys.executable, os.path.join(source, "tools", "gpu_check.py"), build])
    if built_with_cuda:
        if code != 77 or "nothing was checked" not in text or "CUDA" not in text:
            sys.exit(f"FAIL: gpu_check.py without a GPU exited {code}; expected 77 and "
                     f"'nothing was checked' with CUDA's reason:\n{text}")
    elif code != 1 or "not built" not in text:
        sys.exit(f"FAIL: gpu_check.py on a build without CUDA exited {code}; expected 1 and "
                 f"'not built':\n{text}")
    print(f"gpu_check.py: exit {code}: {text.strip().splitlines()[-1]}")

    code, text = run([os.path.join(build, "tests", "check_03_solution"), "--device", "cuda"])
    if code != 77 or "nothing was checked" not in text or "PASS" in text:
        sys.exit(f"FAIL: check_03_solution --device cuda without a GPU exited {code}; expected "
                 f"77, 'nothing was checked' and no PASS:\n{text}")
    print(f"check_03_solution --device cuda: exit 77: {text.strip()}")

    code, text = run([os.path.join(build, "lessons", "demo_03"), "--device", "cuda"])
    if code != 2 or "device cuda" not in text or "verdict" in text:
        sys.exit(f"FAIL: demo_03 --device cuda without a GPU exited {code}; expected 2 with "
                 f"the reason and no verdict:\n{text}")
    print(f"demo_03 --device cuda: exit 2: {text.strip().splitlines()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
