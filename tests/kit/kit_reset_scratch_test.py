#!/usr/bin/env python3
"""./kit reset NN --from-scratch writes the from-scratch track, and
./kit reset NN gives the guided track back.

In a scratch copy of the kit (solutions/ and tools/ linked, exercises/
copied, as kit_reset_eof_test.py does), for one stage: after
`./kit reset 04 --from-scratch --yes`, exercises/04-no-sync/ddp.cc is what
gen_exercise.py --from-scratch writes, every function stage 04 adds or
changes is a stub (forward and the hook among them), and nothing of the
guided track is left (no EXERCISE region's answer, no BEGIN SOLUTION);
`./kit reset 04 --yes` then restores the guided exercise (as gen_exercise.py
writes it, whatever the checkout's exercises/ holds) byte for byte. A bad option is refused by name.

Usage: kit_reset_scratch_test.py PATH_TO_KIT
"""
import os
import shutil
import subprocess
import sys
import tempfile


def read(path):
    with open(path) as f:
        return f.read()


def main():
    real_kit = os.path.abspath(sys.argv[1])
    root = os.path.dirname(real_kit)
    failures = []
    with tempfile.TemporaryDirectory(prefix="tp-kit-scratch-") as scratch:
        kit = os.path.join(scratch, "kit")
        shutil.copy2(real_kit, kit)
        for name in ("solutions", "tools"):
            os.symlink(os.path.join(root, name), os.path.join(scratch, name))
        shutil.copytree(os.path.join(root, "exercises"), os.path.join(scratch, "exercises"))
        ddp = os.path.join(scratch, "exercises", "04-no-sync", "ddp.cc")
        # The guided track as the generator writes it, not as the checkout
        # holds it: a student who took the from-scratch track has their own
        # exercises/04-no-sync/ddp.cc, which is not what reset restores.
        guided = subprocess.run(
            [sys.executable, os.path.join(root, "tools", "gen_exercise.py"), "--one", "ddp.cc",
             os.path.join(root, "solutions", "04-no-sync"), "/dev/stdout"],
            capture_output=True, text=True, timeout=60, check=True).stdout
        env = dict(os.environ, TP_BUILD_DIR=os.path.join(scratch, "build"))

        def kit_run(*args):
            return subprocess.run([kit, *args], capture_output=True, text=True, timeout=60,
                                  stdin=subprocess.DEVNULL, env=env)

        run = kit_run("reset", "04", "--from-scratch", "--yes")
        if run.returncode != 0:
            failures.append(f"./kit reset 04 --from-scratch --yes failed: {run.stdout}{run.stderr}")
        else:
            text = read(ddp)
            expected = subprocess.run(
                [sys.executable, os.path.join(root, "tools", "gen_exercise.py"), "--from-scratch",
                 "--one", "ddp.cc", os.path.join(root, "solutions", "04-no-sync"), "/dev/stdout"],
                capture_output=True, text=True, timeout=60).stdout
            if text != expected:
                failures.append("the from-scratch ddp.cc is not what gen_exercise.py --from-scratch writes")
            for function in ("DistributedDataParallel::forward", "DistributedDataParallel::on_gradient_ready",
                             "NoSyncGuard::NoSyncGuard"):
                if f"stage 04: {function} is not implemented yet" not in text:
                    failures.append(f"from scratch, {function} is not a stub")
            if "BEGIN SOLUTION" in text or "sync_this_backward_ = require_backward_grad_sync_;" in text:
                failures.append("the from-scratch ddp.cc still holds a solution region or its answer")
            if "from-scratch track" not in run.stdout:
                failures.append(f"./kit reset --from-scratch does not say which track it wrote: {run.stdout}")
        run = kit_run("reset", "04", "--yes")
        if run.returncode != 0 or read(ddp) != guided:
            failures.append("./kit reset 04 --yes did not restore the guided exercise")
        run = kit_run("reset", "04", "--from-scrach", "--yes")
        if run.returncode == 0 or "--from-scrach" not in run.stderr:
            failures.append(f"a misspelt option was not refused by name: {run.stderr}")
    for f in failures:
        print(f"FAIL: {f}")
    if failures:
        return 1
    print("ok: ./kit reset 04 --from-scratch writes the from-scratch track; ./kit reset 04 restores the guided one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
