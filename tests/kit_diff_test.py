#!/usr/bin/env python3
"""./kit diff NN shows stage NN's solution only once exercises/NN-*/ is done.

While the exercise still has a stub that throws tp::NotImplemented, the diff
(stage NN's solution, the answer to it) is not printed: the kit says which
stubs are left and how to see it anyway (--anyway), and exits 1. With
--anyway, or once no stub is left, it prints the diff. Runs a copy of the kit
in a scratch folder (solutions/ and tools/ linked, exercises/ copied), so
that filling in the exercise never touches a student's work.

Usage: kit_diff_test.py PATH_TO_KIT
"""

import os
import shutil
import subprocess
import sys
import tempfile

STAGE, TOPIC = "03", "03-overlap"


def kit(scratch, *args):
    return subprocess.run([os.path.join(scratch, "kit"), "diff", *args],
                          capture_output=True, text=True, timeout=60)


def fail(what, r):
    sys.exit(f"FAIL: {what}\nexit {r.returncode}\nstdout:\n{r.stdout[:2000]}\n"
             f"stderr:\n{r.stderr}")


def main():
    real_kit = os.path.abspath(sys.argv[1])
    root = os.path.dirname(real_kit)
    with tempfile.TemporaryDirectory(prefix="tp-kit-diff-") as scratch:
        shutil.copy2(real_kit, os.path.join(scratch, "kit"))
        for name in ("solutions", "tools"):
            os.symlink(os.path.join(root, name), os.path.join(scratch, name))
        exercises = os.path.join(scratch, "exercises")
        os.mkdir(exercises)
        exercise = os.path.join(exercises, TOPIC)
        # The untouched exercise, as ./kit reset writes it.
        subprocess.run([sys.executable, os.path.join(root, "tools", "gen_exercise.py"),
                        os.path.join(root, "solutions", TOPIC), exercise], check=True,
                       capture_output=True)

        r = kit(scratch, STAGE)
        if r.returncode != 1:
            fail("the untouched exercise did not stop the diff with exit 1", r)
        if r.stdout.strip():
            fail("the untouched exercise still printed the solution", r)
        for phrase in (f"exercises/{TOPIC} is not finished", "tp::NotImplemented",
                       f"exercises/{TOPIC}/ddp.cc:", f"./kit diff {STAGE} --anyway"):
            if phrase not in r.stderr:
                fail(f"the warning does not say '{phrase}'", r)

        r = kit(scratch, STAGE, "--anyway")
        if r.returncode != 0 or f"+++ solutions/{TOPIC}" not in r.stdout:
            fail("--anyway did not print the diff", r)

        # One stub filled in, the others left: still unfinished, naming those.
        with open(os.path.join(exercise, "ddp.cc")) as f:
            text = f.read()
        stubs = text.count("throw tp::NotImplemented(")
        first = text.index("throw tp::NotImplemented(")
        text = text[:first] + "return;  // (filled in)\n  //" + text[first:]
        with open(os.path.join(exercise, "ddp.cc"), "w") as f:
            f.write(text)
        r = kit(scratch, STAGE)
        if r.returncode != 1 or f"{stubs - 1} EXERCISE stub(s)" not in r.stderr:
            fail(f"with {stubs - 1} of {stubs} stubs left the diff was not stopped, naming "
                 f"them", r)

        # Finished: the solution's own files in the exercise's place.
        for name in os.listdir(os.path.join(root, "solutions", TOPIC)):
            shutil.copy(os.path.join(root, "solutions", TOPIC, name), exercise)
        r = kit(scratch, STAGE)
        if r.returncode != 0 or f"+++ solutions/{TOPIC}" not in r.stdout or r.stderr.strip():
            fail("the finished exercise did not get the diff, without a warning", r)
    print(f"ok: ./kit diff {STAGE}: stopped with the stubs named while the exercise has them, "
          f"shown with --anyway and once it is finished")


if __name__ == "__main__":
    main()
