#!/usr/bin/env python3
"""The CUDA build finds the toolkit's libraries wherever `nvcc` on PATH lives.

libtensorplay is linked by g++, which does not know the CUDA toolkit's
library folder the way nvcc does, so meson.build must name libcudart and
libcublas itself. On some machines (this kit's CI among them) the `nvcc` on
PATH is a small wrapper script in /usr/local/bin, not the toolkit's own
bin/nvcc, so "the lib64 next to nvcc's folder" does not exist there: a build
that guessed that way configured fine and then failed to link
("cannot find -lcudart").

This test recreates that machine: a wrapper `nvcc` in a scratch folder
first on PATH, no CUDA_HOME, CUDA_PATH or LIBRARY_PATH. It configures the
kit into a scratch build folder and checks that Meson's summary says CUDA
was found, that libtensorplay's link line names libcudart by a path that
exists, and that cuBLAS, opened on first use rather than linked
(common/src/cuda/cublas_library.h), is looked for in a folder that holds it.
(Configuring only: linking would mean compiling the whole library.)

Skipped (exit 77, with the reason) where no CUDA toolkit is installed, or
nvcc is installed without the runtime and cuBLAS.

Usage: cuda_toolkit_find_test.py SOURCE_DIR
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile


def real_nvcc():
    for candidate in ("/usr/local/cuda/bin/nvcc", shutil.which("nvcc")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def toolkit_has_libraries(nvcc):
    """Whether the folders nvcc's dry run names hold libcudart and libcublas
    (a machine with nvcc alone builds the kit without CUDA: nothing to test)."""
    p = subprocess.run([nvcc, "--dryrun", "-c", "probe.cu"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    dirs = []
    for line in p.stdout.splitlines():
        if line.startswith("#$ TOP="):
            top = line[len("#$ TOP="):].strip()
            dirs += [os.path.join(top, "lib64"), os.path.join(top, "lib")]
        elif line.startswith("#$ LIBRARIES="):
            dirs += re.findall(r'"-L([^"]+)"', line)
    return all(any(os.path.exists(os.path.join(d, f"lib{lib}.so")) for d in dirs)
               for lib in ("cudart", "cublas"))


def link_line(build_ninja):
    """The LINK_ARGS of libtensorplay.so's link edge in build.ninja."""
    text = open(build_ninja).read()
    m = re.search(r"^build common/libtensorplay\.so: .*?\n((?: .*\n)*)", text, re.M)
    if not m:
        sys.exit("FAIL: build.ninja has no link edge for common/libtensorplay.so")
    for line in m.group(1).splitlines():
        line = line.strip()
        if line.startswith("LINK_ARGS = "):
            return line[len("LINK_ARGS = "):]
    sys.exit("FAIL: libtensorplay.so's link edge has no LINK_ARGS")


def main():
    source = os.path.abspath(sys.argv[1])
    nvcc = real_nvcc()
    if nvcc is None:
        print("SKIP: no CUDA toolkit here (no /usr/local/cuda/bin/nvcc, no nvcc on PATH)")
        return 77
    if not toolkit_has_libraries(nvcc):
        print(f"SKIP: {nvcc} is here, but its toolkit has no libcudart and libcublas "
              "(the kit builds without CUDA on this machine)")
        return 77
    with tempfile.TemporaryDirectory(prefix="tp-cuda-find-") as scratch:
        wrapper_dir = os.path.join(scratch, "bin")
        os.mkdir(wrapper_dir)
        wrapper = os.path.join(wrapper_dir, "nvcc")
        with open(wrapper, "w") as f:
            f.write(f'#!/bin/sh\nexec "{nvcc}" "$@"\n')
        os.chmod(wrapper, 0o755)
        env = {
            "HOME": os.environ.get("HOME", scratch),
            "PATH": wrapper_dir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "TMPDIR": scratch,
        }
        build = os.path.join(scratch, "build")
        p = subprocess.run(["meson", "setup", build, source, "-Dtests=disabled",
                            "-Dbenchmarks=disabled", "-Dcuda=enabled"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=240)
        if p.returncode != 0:
            sys.exit(f"FAIL: configuring with nvcc as a wrapper script in {wrapper_dir} "
                     f"failed (exit {p.returncode}):\n{p.stdout[-4000:]}")
        summary = re.search(r"^\s*CUDA\s*:\s*(.*)$", p.stdout, re.M)
        if not summary or not summary.group(1).startswith("CUDA "):
            sys.exit("FAIL: Meson's summary does not say CUDA was found:\n" + p.stdout[-3000:])
        args = link_line(os.path.join(build, "build.ninja"))
        paths = re.findall(r"(/\S*/libcudart\.so)\b", args)
        existing = [x for x in paths if os.path.exists(x)]
        if not existing:
            sys.exit(f"FAIL: libtensorplay's link line does not name libcudart.so by a path "
                     f"that exists (g++ would not find it: 'cannot find -lcudart'):\n{args}")
        print(f"ok: libcudart linked as {existing[0]}")
        if "cublas" in args:
            sys.exit("FAIL: libtensorplay links cuBLAS, which costs every process 0.45 s "
                     f"at start; it is to be opened on first use:\n{args}")
        dirs = re.search(r"-DTP_CUBLAS_DIRS=\\?\"([^\"\\]*)", open(os.path.join(build, "build.ninja")).read())
        if not dirs or not any(glob.glob(os.path.join(d, "libcublas.so.*"))
                               for d in dirs.group(1).split(":") if d):
            sys.exit("FAIL: libtensorplay is not told a folder that holds libcublas.so.N "
                     "(TP_CUBLAS_DIRS): " + (dirs.group(1) if dirs else "no TP_CUBLAS_DIRS"))
        print(f"ok: cuBLAS opened on first use, from {dirs.group(1)}")
        print(f"ok: with nvcc a wrapper in a folder of its own, Meson says "
              f"'{summary.group(1).strip()}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
