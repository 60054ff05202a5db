#!/usr/bin/env python3
"""Every benchmark command in the lessons builds what it runs.

    lesson_bench_commands_test.py ROOT

`./kit demo` and `./kit check` build only their own program, so a lesson's
`build/bench/bench_X ...` typed after them would find nothing to run. Checked
here, in README.md and every lessons/*/README.md:

1. each `build/bench/bench_X` named is a benchmark bench/meson.build defines
   (an `executable('bench_X', ...)`);
2. each one sits in a command (a `$ ` line of a code block, any line of a
   ```sh block, with its `\\` continuations, or an inline code span, which
   may wrap) where an earlier `&&`-joined part is `./kit build` naming
   `bench/bench_X`;
3. `./kit build TARGET...` does what those commands need, run against a
   stand-in ninja (no compiler runs): it passes the targets to ninja in the
   build folder, explains Google Benchmark's 'built as DEBUG' warning after
   a benchmark, names a target ninja does not know (exit 2), and says when
   the build folder has no benchmarks at all (Google Benchmark missing).
"""
import os
import re
import stat
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(sys.argv[1])
BENCH_PATH = re.compile(r"build/bench/(bench_\w+)")
KIT_BUILD = re.compile(r"^\./kit build((?:\s+\S+)+)$")


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def defined_benchmarks():
    text = open(os.path.join(ROOT, "bench", "meson.build")).read()
    return set(re.findall(r"executable\(\s*'(bench_\w+)'", text))


def commands(text):
    """(start, end) offsets of each command in a Markdown file: the
    `$ ` lines of fenced blocks (with `\\` continuations) and the inline code
    spans elsewhere (a mention outside all of them is not in a command)."""
    found = []
    in_fence = shell = False
    offset = 0
    lines = text.splitlines(keepends=True)
    prose = []  # (offset, line) outside fences
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            # A shell block (```sh) is commands without a `$ ` prompt.
            shell = in_fence and line.strip()[3:] in ("sh", "bash", "shell")
        elif in_fence and (line.lstrip().startswith("$ ") or
                           (shell and line.strip() and not line.lstrip().startswith("#"))):
            start = offset + len(line) - len(line.lstrip())
            start += 2 if line.lstrip().startswith("$ ") else 0
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                offset += len(line)
                line = lines[i]
            found.append((start, offset + len(line)))
        elif not in_fence:
            prose.append((offset, line))
        offset += len(line)
        i += 1
    # Inline code spans: within a paragraph of prose (lines that follow one
    # another, up to a blank one), a span may wrap onto the next line.
    paragraphs, current = [], []
    for off, line in prose:
        if line.strip():
            if current and current[-1][0] + len(current[-1][1]) != off:
                paragraphs.append(current)
                current = []
            current.append((off, line))
        elif current:
            paragraphs.append(current)
            current = []
    if current:
        paragraphs.append(current)
    for para in paragraphs:
        start = para[0][0]
        body = "".join(line for _, line in para)
        for m in re.finditer(r"(`+)(.+?)\1", body, re.S):
            found.append((start + m.start(2), start + m.end(2)))
    return found


def check_docs():
    benchmarks = defined_benchmarks()
    if not benchmarks:
        fail("bench/meson.build defines no executable('bench_...'): has its form changed?")
    files = ["README.md"] + sorted(
        os.path.join("lessons", d, "README.md") for d in os.listdir(os.path.join(ROOT, "lessons"))
        if os.path.isfile(os.path.join(ROOT, "lessons", d, "README.md")))
    checked = 0
    for rel in files:
        text = open(os.path.join(ROOT, rel)).read()
        cmds = commands(text)
        for m in BENCH_PATH.finditer(text):
            where = f"{rel}:{text.count(chr(10), 0, m.start()) + 1}"
            name = m.group(1)
            if name not in benchmarks:
                fail(f"{where}: build/bench/{name} is not a benchmark bench/meson.build defines "
                     f"(it defines {', '.join(sorted(benchmarks))})")
            inside = [c for c in cmds if c[0] <= m.start() < c[1]]
            if not inside:
                fail(f"{where}: build/bench/{name} is named outside a command (a `$ ` line of "
                     "a code block or an inline code span), so nothing here can say it is built")
            start, end = inside[0]
            command = " ".join(text[start:end].replace("\\\n", " ").split())
            before = " ".join(text[start:m.start()].replace("\\\n", " ").split())
            parts = [p.strip().lstrip("$ ").strip() for p in before.split("&&")][:-1]
            built = set()
            for part in parts:
                k = KIT_BUILD.match(part)
                if k:
                    built.update(k.group(1).split())
            if f"bench/{name}" not in built:
                fail(f"{where}: `{command[:120]}` runs build/bench/{name} "
                     f"without building it: ./kit demo and ./kit check do not; start it with "
                     f"`./kit build bench/{name} && `")
            checked += 1
    if checked == 0:
        fail("no build/bench/bench_... command found in README.md or the lessons: "
             "has this test lost its way?")
    print(f"{checked} benchmark commands in README.md and lessons/ each build their program "
          "first with ./kit build")


FAKE_NINJA = """#!/bin/sh
# A stand-in for ninja: logs its arguments; knows the targets in $FAKE_TARGETS.
echo "$*" >> "$FAKE_LOG"
if [ "$3" = "-t" ]; then
  sed 's/$/: phony/' "$FAKE_TARGETS"
  exit 0
fi
shift 2
for t in "$@"; do
  grep -qxF -- "$t" "$FAKE_TARGETS" || { echo "ninja: error: unknown target '$t'" >&2; exit 1; }
done
echo "ninja: no work to do."
"""
FAKE_DPKG_QUERY = "#!/bin/sh\necho 'install ok installed'\n"


def check_kit_build():
    with tempfile.TemporaryDirectory(prefix="tp-kit-build-") as scratch:
        bindir = os.path.join(scratch, "bin")
        build = os.path.join(scratch, "build")
        os.makedirs(bindir)
        os.makedirs(build)
        open(os.path.join(build, "build.ninja"), "w").close()  # configured: no meson run
        for name, body in (("ninja", FAKE_NINJA), ("dpkg-query", FAKE_DPKG_QUERY)):
            path = os.path.join(bindir, name)
            with open(path, "w") as f:
                f.write(body)
            os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        log = os.path.join(scratch, "ninja.log")
        targets = os.path.join(scratch, "targets")
        env = {k: v for k, v in os.environ.items() if k not in ("TP_KIT_LOCKED",)}
        env.update(PATH=bindir + os.pathsep + env.get("PATH", ""), TP_BUILD_DIR=build,
                   FAKE_LOG=log, FAKE_TARGETS=targets)

        def kit_build(*args, known):
            with open(targets, "w") as f:
                f.write("".join(t + "\n" for t in known))
            open(log, "w").close()
            r = subprocess.run([os.path.join(ROOT, "kit"), "build", *args], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=60)
            return r, open(log).read().splitlines()

        known = ["bench/bench_hooks", "bench/bench_sync", "lessons/demo_08", "tests/check_08"]
        r, calls = kit_build("bench/bench_hooks", known=known)
        if r.returncode != 0 or calls != [f"-C {build} bench/bench_hooks"]:
            fail(f"./kit build bench/bench_hooks: exit {r.returncode}, ninja called as {calls} "
                 f"(expected once, as '-C {build} bench/bench_hooks'):\n{r.stdout}")
        if "built as DEBUG" not in r.stdout or "built optimized" not in r.stdout:
            fail(f"./kit build bench/bench_hooks does not explain Google Benchmark's "
                 f"'built as DEBUG' warning:\n{r.stdout}")
        print("./kit build bench/bench_hooks builds only that target and explains the DEBUG warning")

        r, calls = kit_build("lessons/demo_08", known=known)
        if r.returncode != 0 or "DEBUG" in r.stdout:
            fail(f"./kit build lessons/demo_08: exit {r.returncode}, or a benchmark's warning "
                 f"explained for a demo:\n{r.stdout}")

        r, calls = kit_build("bench/bench_nope", known=known)
        if r.returncode != 2 or "no target bench/bench_nope" not in r.stdout or \
                "bench/bench_hooks" not in r.stdout or "compiler" in r.stdout:
            fail(f"./kit build bench/bench_nope: exit {r.returncode}, expected 2 naming the "
                 f"unknown target and the benchmarks there are:\n{r.stdout}")
        print(f"an unknown target: {r.stdout.strip().splitlines()[-1][:140]}...")

        r, calls = kit_build("bench/bench_hooks", known=["lessons/demo_08", "tests/check_08"])
        if r.returncode != 2 or "Google Benchmark" not in r.stdout or \
                "--reconfigure" not in r.stdout:
            fail(f"./kit build bench/bench_hooks where no benchmark is configured: exit "
                 f"{r.returncode}, expected 2 saying Google Benchmark was not found:\n{r.stdout}")
        print("a build folder without benchmarks: ./kit build bench/... says Google Benchmark "
              "was missing at configure time")

        r = subprocess.run([os.path.join(ROOT, "kit"), "help"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=60)
        if "./kit build [TARGET...]" not in r.stdout:
            fail(f"./kit help does not list ./kit build [TARGET...]:\n{r.stdout}")


check_docs()
check_kit_build()
