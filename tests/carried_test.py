#!/usr/bin/env python3
"""tools/carried.py catches code that drifted between the stages carrying it.

On a scratch copy of solutions/: the kit as committed passes, and so does
the kit with a new stage that copies the last one (markers and all), with
nothing else changed; then, one at a time, a fix made in one stage only (a
changed line in the last stage's copy of a region), a region missing from a
stage between two that have it, a region never closed, and a misspelt marker
must each fail, naming both copies' file:line and showing the changed line
as a diff.

Usage: carried_test.py REPO_ROOT
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile


def run(tool, root):
    return subprocess.run([sys.executable, tool, "--check", root], capture_output=True,
                          text=True, timeout=60)


def fail(message, result):
    sys.exit(f"FAIL: {message}: exit {result.returncode}\n{result.stdout}{result.stderr}")


def edit(path, old, new):
    with open(path) as f:
        text = f.read()
    if old not in text:
        sys.exit(f"FAIL: the test's anchor {old!r} is not in {path}; update carried_test.py")
    with open(path, "w") as f:
        f.write(text.replace(old, new, 1))


def main():
    repo = os.path.abspath(sys.argv[1])
    tool = os.path.join(repo, "tools", "carried.py")
    with tempfile.TemporaryDirectory(prefix="tp-carried-") as tmp:
        pristine = os.path.join(tmp, "pristine")
        shutil.copytree(os.path.join(repo, "solutions"), os.path.join(pristine, "solutions"))
        clean = run(tool, pristine)
        if clean.returncode != 0 or "carried: ok:" not in clean.stdout:
            fail("the kit as committed", clean)
        # The stages and the region the drift is planted in: the first region
        # of the last stage's ddp.cc that the stage before also carries.
        stages = sorted(d for d in os.listdir(os.path.join(pristine, "solutions"))
                        if re.match(r"^\d\d-", d))
        last, before = stages[-1], stages[-2]
        last_cc = os.path.join("solutions", last, "ddp.cc")
        with open(os.path.join(pristine, last_cc)) as f:
            lines = f.read().splitlines()
        opening = next((i for i, l in enumerate(lines)
                        if (m := re.match(r"^\s*// SAME FROM STAGE (\d\d): ", l))
                        and m.group(1) <= before[:2]), None)
        if opening is None:
            sys.exit(f"FAIL: {last_cc} carries no region over from stage {before[:2]}")
        body = next(i for i in range(opening + 1, len(lines)) if lines[i].strip()
                    and not lines[i].strip().startswith("//"))

        def planted(name, change):
            root = os.path.join(tmp, name)
            shutil.copytree(pristine, root)
            change(root)
            return run(tool, root)

        # A new stage, a copy of the last one: nothing else to change.
        def new_stage(root):
            nn = f"{int(last[:2]) + 1:02d}"
            new = os.path.join(root, "solutions", f"{nn}-copy")
            shutil.copytree(os.path.join(root, "solutions", last), new)
            for name in os.listdir(new):
                path = os.path.join(new, name)
                with open(path) as f:
                    text = f.read()
                with open(path, "w") as f:
                    f.write(text.replace(f"stage{last[:2]}", f"stage{nn}"))
        result = planted("new_stage", new_stage)
        if result.returncode != 0:
            fail("a new stage copied from the last one", result)

        # A fix made in the last stage only.
        def drift(root):
            edit(os.path.join(root, last_cc), lines[body] + "\n",
                 lines[body] + "  // fixed here only\n")
        result = planted("drift", drift)
        if result.returncode != 1 or f"{last_cc}:{opening + 1}" not in result.stdout or \
                f"solutions/{before}/ddp.cc:" not in result.stdout or \
                not any(l.startswith("+") and l.endswith("// fixed here only")
                        for l in result.stdout.splitlines()) or \
                "fix: make the change in every copy" not in result.stdout:
            fail("a line changed in the last stage's copy only", result)

        # The region deleted from the stage before (its markers gone).
        marker = lines[opening].strip()
        def missing(root):
            path = os.path.join(root, "solutions", before, "ddp.cc")
            edit(path, marker + "\n", "\n")
            edit(path, marker.replace("// SAME", "// END SAME", 1) + "\n", "\n")
        result = planted("missing", missing)
        if result.returncode != 1 or f"stage(s) {before[:2]} have no region" not in result.stdout:
            fail("a region missing from a stage between two that have it", result)

        def unclosed(root):
            edit(os.path.join(root, last_cc), marker.replace("// SAME", "// END SAME", 1) + "\n", "\n")
        result = planted("unclosed", unclosed)
        if result.returncode != 1 or "is never closed" not in result.stdout:
            fail("a region never closed", result)

        def misspelt(root):
            edit(os.path.join(root, last_cc), marker, marker.replace("FROM STAGE", "FROM STAGES", 1))
        result = planted("misspelt", misspelt)
        if result.returncode != 1 or "is not a marker" not in result.stdout:
            fail("a misspelt marker", result)
    print("ok: the committed stages pass, and a new stage copied from the last; a one-stage fix, "
          "a missing copy, an unclosed region and a misspelt marker each fail, naming both copies")


if __name__ == "__main__":
    main()
