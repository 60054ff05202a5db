#!/usr/bin/env python3
"""Applies a planted-bug mutant to a stage's solution.

    mutate.py MUTANT SOLUTION_DIR OUT_CC OUT_H OUT_STAGE_H [OUT_WORKER_CC]

A mutant file (tests/mutants/NN-topic/*.mutant) reads:

    # what the bug is, in one or two comment lines
    expect: a phrase the checker's report must contain
    expect-first: a phrase the failing case's first finding must contain
    <<<<<<< solution
    exact lines of the solution's ddp.cc
    =======
    the lines that replace them (may be empty)
    >>>>>>> mutant

There may be several `expect:` and `expect-first:` lines (at least one of
either; the checker reads them, see checker.h), and several blocks.
`<<<<<<< solution ddp.h` patches the header instead, so a mutant may patch
both files; `<<<<<<< solution worker.cc` patches the rank's worker of a
stage that has one (stage 01), which is then written to OUT_WORKER_CC (given
exactly when the stage has worker.cc). Each solution text must occur
exactly once in its file; when the solution changes so that it no longer
does, this fails with a message naming the mutant, so mutants cannot
silently stop applying.

OUT_CC and OUT_H receive the patched ddp.cc and ddp.h (unpatched files are
copied), OUT_STAGE_H a copy of stage.h (the stage's StageSpec, which the
checker includes). When the header is patched, the .cc and the stage.h copy
include OUT_H's name instead of "ddp.h", so that the planted-bug header is
the only ddp.h in the checker's program.
"""
import os
import sys

FILES = ("ddp.cc", "ddp.h")
WORKER = "worker.cc"  # only some stages have one
OPENINGS = {"<<<<<<< solution": "ddp.cc", "<<<<<<< solution ddp.h": "ddp.h",
            "<<<<<<< solution worker.cc": WORKER}


def parse(path):
    blocks, mode, target, find, repl = [], None, None, [], []
    for line in open(path).read().splitlines(True):
        tag = line.rstrip("\n")
        if tag.startswith("<<<<<<<"):
            # Exactly these spellings: Meson looks for the ddp.h one to
            # decide whether the checker must be compiled against the mutant.
            if tag not in OPENINGS:
                sys.exit(f"mutate: {path}: '{tag}': a block opens with '<<<<<<< solution' (ddp.cc), "
                         f"'<<<<<<< solution ddp.h' or '<<<<<<< solution worker.cc'")
            target = OPENINGS[tag]
            mode, find, repl = "find", [], []
        elif tag == "=======" and mode == "find":
            mode = "repl"
        elif tag == ">>>>>>> mutant" and mode == "repl":
            blocks.append((target, "".join(find), "".join(repl)))
            mode = None
        elif mode == "find":
            find.append(line)
        elif mode == "repl":
            repl.append(line)
    if mode is not None:
        sys.exit(f"mutate: {path}: a block is not closed with '>>>>>>> mutant'")
    if not blocks:
        sys.exit(f"mutate: {path}: no '<<<<<<< solution' block")
    return blocks


def main(mutant, solution_dir, out_cc, out_h, out_stage_h, out_worker=None):
    outs = {"ddp.cc": out_cc, "ddp.h": out_h, "stage.h": out_stage_h}
    has_worker = os.path.exists(os.path.join(solution_dir, WORKER))
    if has_worker != (out_worker is not None):
        sys.exit(f"mutate: {solution_dir} {'has' if has_worker else 'has no'} {WORKER}: give "
                 f"OUT_WORKER_CC exactly when it does")
    if has_worker:
        outs[WORKER] = out_worker
    texts = {name: open(os.path.join(solution_dir, name)).read() for name in outs}
    patched = set()
    for target, find, repl in parse(mutant):
        if target not in texts:
            sys.exit(f"mutate: {mutant} patches {target}, which {solution_dir} does not have")
        count = texts[target].count(find)
        if count != 1:
            sys.exit(f"mutate: {mutant} no longer applies to {solution_dir}/{target}: its solution "
                     f"text occurs {count} times (expected once); update the mutant:\n{find}")
        texts[target] = texts[target].replace(find, repl)
        patched.add(target)
    if "ddp.h" in patched and has_worker:
        # worker.h includes the solution's ddp.h, and the checker includes
        # worker.h: a patched header would meet the original in one program.
        sys.exit(f"mutate: {mutant} patches ddp.h of a stage with {WORKER}; plant the bug in "
                 f"ddp.cc or {WORKER} instead")
    if "ddp.h" in patched:
        include = '#include "ddp.h"'
        for name in ("ddp.cc", "stage.h"):
            if texts[name].count(include) != 1:
                sys.exit(f"mutate: {solution_dir}/{name} must include \"ddp.h\" once for a "
                         f"header mutant")
            texts[name] = texts[name].replace(include, f'#include "{os.path.basename(out_h)}"')
    banner = f"// PLANTED BUG from {mutant}: do not copy.\n"
    for name, out in outs.items():
        with open(out, "w") as f:
            f.write(banner + texts[name])


if __name__ == "__main__":
    if len(sys.argv) not in (6, 7):
        sys.exit(__doc__)
    main(*sys.argv[1:])
