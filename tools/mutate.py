#!/usr/bin/env python3
"""Applies a planted-bug mutant to a stage's solution.

    mutate.py MUTANT SOLUTION_DIR OUT_CC OUT_H

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
both files. Each solution text must occur
exactly once in its file; when the solution changes so that it no longer
does, this fails with a message naming the mutant, so mutants cannot
silently stop applying.

OUT_CC and OUT_H receive the patched ddp.cc and ddp.h (unpatched files are
copied). When the header is patched, the .cc includes OUT_H's name instead
of "ddp.h", so the planted-bug pair compiles together.
"""
import os
import sys

FILES = ("ddp.cc", "ddp.h")


def parse(path):
    blocks, mode, target, find, repl = [], None, None, [], []
    for line in open(path).read().splitlines(True):
        tag = line.rstrip("\n")
        if tag.startswith("<<<<<<<"):
            # Exactly these two spellings: Meson looks for the second one to
            # decide whether the checker must be compiled against the mutant.
            if tag not in ("<<<<<<< solution", "<<<<<<< solution ddp.h"):
                sys.exit(f"mutate: {path}: '{tag}': a block opens with '<<<<<<< solution' (ddp.cc) "
                         f"or '<<<<<<< solution ddp.h'")
            target = "ddp.h" if tag.endswith("ddp.h") else "ddp.cc"
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


def main(mutant, solution_dir, out_cc, out_h):
    texts = {name: open(os.path.join(solution_dir, name)).read() for name in FILES}
    patched = set()
    for target, find, repl in parse(mutant):
        count = texts[target].count(find)
        if count != 1:
            sys.exit(f"mutate: {mutant} no longer applies to {solution_dir}/{target}: its solution "
                     f"text occurs {count} times (expected once); update the mutant:\n{find}")
        texts[target] = texts[target].replace(find, repl)
        patched.add(target)
    if "ddp.h" in patched:
        include = '#include "ddp.h"'
        if texts["ddp.cc"].count(include) != 1:
            sys.exit(f"mutate: {solution_dir}/ddp.cc must include \"ddp.h\" once for a header mutant")
        texts["ddp.cc"] = texts["ddp.cc"].replace(include, f'#include "{os.path.basename(out_h)}"')
    banner = f"// PLANTED BUG from {mutant}: do not copy.\n"
    for name, out in (("ddp.cc", out_cc), ("ddp.h", out_h)):
        with open(out, "w") as f:
            f.write(banner + texts[name])


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(*sys.argv[1:])
