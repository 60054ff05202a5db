#!/usr/bin/env python3
"""The benchmarks' output files are replaced whole or not at all.

    atomic_output_test.py ROOT

bench/atomic_file.py writes report.py's summary and figures and
torch_ddp.py's results. With a file-size limit standing in for a full disk
(RLIMIT_FSIZE: a write past it fails with EFBIG, no root needed), a write
that cannot finish must raise, leave the previous file as it was and leave
no temporary file in the folder; a write that can must replace the file.
"""
import os
import resource
import signal
import subprocess
import sys
import tempfile

CHILD = """
import resource, signal, sys
sys.path.insert(0, sys.argv[1])
from atomic_file import write_text
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    write_text(sys.argv[2], "x" * 65536)
except OSError as e:
    print("raised:", e)
    sys.exit(0)
sys.exit("wrote 64 KiB past a 4 KiB limit without an error")
"""


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def main(root):
    bench = os.path.join(root, "bench")
    with tempfile.TemporaryDirectory(prefix="tp-atomic-") as folder:
        path = os.path.join(folder, "summary.md")
        with open(path, "w") as f:
            f.write("previous results\n")
        r = subprocess.run([sys.executable, "-c", CHILD, bench, path], capture_output=True,
                           text=True, timeout=60)
        if r.returncode != 0:
            fail(f"the write past the limit: exit {r.returncode}: {r.stdout}{r.stderr}")
        if open(path).read() != "previous results\n":
            fail(f"a failed write changed the previous file: {open(path).read()[:80]!r}")
        if sorted(os.listdir(folder)) != ["summary.md"]:
            fail(f"a failed write left files behind: {sorted(os.listdir(folder))}")
        sys.path.insert(0, bench)
        from atomic_file import write_text
        write_text(path, "new results\n")
        if open(path).read() != "new results\n" or sorted(os.listdir(folder)) != ["summary.md"]:
            fail("a write that fits did not replace the file cleanly")
        if os.stat(path).st_mode & 0o777 != 0o644:
            fail(f"the new file's mode is {oct(os.stat(path).st_mode & 0o777)}, expected 0o644")
    print("ok: a write that cannot finish leaves the previous file whole and nothing behind")


if __name__ == "__main__":
    main(sys.argv[1])
